"""Strategies on analytic functions: convergence, seeded reproducibility, pure ask, state
checkpoints, CMA-ES constants, OpenES ranks, NSGA-II, evosax adapter (evosax is in the ``dev``
extra, so these run wherever the test suite's dependencies are installed)."""

from __future__ import annotations

import numpy as np
import pytest

from search.strategies import (
    CMAES,
    CUBE_STRATEGIES,
    GeneticAlgorithm,
    GridSweep,
    OpenES,
    RandomSearch,
    centered_ranks,
    make_strategy,
    restore_state,
    state_leaves,
)

TARGET = np.array([0.2, 0.8, 0.5, 0.3])


def _template(d: int, value: float = 0.5) -> dict:
    return {f"x{i}": np.asarray(value) for i in range(d)}


def _matrix(pop: dict) -> np.ndarray:
    return np.stack([np.asarray(pop[k]) for k in sorted(pop)], axis=1)


def sphere(pop: dict) -> np.ndarray:
    """Maximised: minus the squared distance to TARGET."""
    x = _matrix(pop)
    return -np.sum((x - TARGET[: x.shape[1]]) ** 2, axis=1)


def rosenbrock(pop: dict) -> np.ndarray:
    """Maximised: minus a 2-D Rosenbrock with b = 10 (optimum at (1, 1))."""
    x = _matrix(pop)
    return -((1 - x[:, 0]) ** 2 + 10 * (x[:, 1] - x[:, 0] ** 2) ** 2)


def run(strategy, fn, generations: int, seed: int = 0):
    state = strategy.init(seed)
    best, best_x, history = -np.inf, None, []
    for _ in range(generations):
        pop, state = strategy.ask(state)
        f = fn(pop)
        history.append(_matrix(pop))
        i = int(np.argmax(f))
        if f[i] > best:
            best, best_x = float(f[i]), _matrix(pop)[i]
        state = strategy.tell(state, pop, f)
    return state, best, best_x, history


def test_cma_constants_match_hand_computed_defaults():
    cma = CMAES(_template(2), 6)
    assert cma.mu == 3
    assert np.allclose(cma.weights, [0.6370426, 0.2845703, 0.0783872], rtol=1e-6)
    assert cma.mu_eff == pytest.approx(2.0286115, rel=1e-6)
    assert cma.c_sigma == pytest.approx(0.4462050, rel=1e-6)
    assert cma.c_c == pytest.approx(0.6245545, rel=1e-6)
    assert cma.c_1 == pytest.approx(0.1548154, rel=1e-6)
    assert cma.c_mu == pytest.approx(0.0578591, rel=1e-6)
    assert cma.d_sigma == pytest.approx(1.4462050, rel=1e-6)
    assert cma.chi_n == pytest.approx(1.2542727, rel=1e-6)


def test_cma_converges_on_sphere_and_rosenbrock():
    state, best, _, _ = run(CMAES(_template(4), 8, sigma=0.3), sphere, 60)
    assert np.linalg.norm(state.mean - TARGET) < 1e-3 and best > -1e-6
    state, best, _, _ = run(CMAES(_template(2, 0.0), 8, sigma=0.5), rosenbrock, 150)
    assert np.allclose(state.mean, [1.0, 1.0], atol=1e-3)


def test_openes_converges_on_sphere():
    es = OpenES(_template(4), 16, sigma=0.05, learning_rate=0.01, sigma_decay=0.98,
                sigma_min=0.002)
    state, _, _, _ = run(es, sphere, 200)
    assert np.linalg.norm(state.mean - TARGET) < 0.01


def test_openes_antithetic_pairs_and_ranks():
    es = OpenES(_template(3), 6, sigma=0.1)
    state = es.init(3)
    pop, _ = es.ask(state)
    x = _matrix(pop)
    assert np.allclose(x[:3] + x[3:], 2 * 0.5)  # mirrored around the mean
    assert centered_ranks(np.array([10.0, -1.0, 3.0])).tolist() == [0.5, -0.5, 0.0]
    # ties share their mean rank: ranks (1.5, 1.5, 0, 3) / 3 - 0.5
    assert centered_ranks(np.array([1.0, 1.0, 0.0, 2.0])).tolist() == [0.0, 0.0, -0.5, 0.5]
    with pytest.raises(ValueError, match="even"):
        OpenES(_template(2), 5)


def test_ga_converges_and_keeps_elites():
    ga = GeneticAlgorithm(_template(4), 16, sigma=0.05)
    state, best, _, _ = run(ga, sphere, 80)
    assert best > -4e-4
    # (mu + lambda): the parents' best never gets worse
    prev = -np.inf
    st = ga.init(1)
    for _ in range(10):
        pop, st = ga.ask(st)
        st = ga.tell(st, pop, sphere(pop))
        assert st.parent_fitness[0, 0] >= prev
        prev = st.parent_fitness[0, 0]


def test_random_search_finds_near_optimum_in_2d():
    _, best, best_x, hist = run(RandomSearch(_template(2), 16), sphere, 30)
    assert np.linalg.norm(best_x - TARGET[:2]) < 0.08
    allx = np.concatenate(hist)
    assert allx.min() >= 0.0 and allx.max() <= 1.0


@pytest.mark.parametrize("name", CUBE_STRATEGIES)
def test_seeded_reproducibility_and_pure_ask(name):
    s = make_strategy(name, _template(3), 6)
    _, _, _, h1 = run(s, sphere, 5, seed=11)
    _, _, _, h2 = run(s, sphere, 5, seed=11)
    _, _, _, h3 = run(s, sphere, 5, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(h1, h2, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(h1, h3, strict=True))
    state = s.init(5)
    a, _ = s.ask(state)
    b, _ = s.ask(state)
    assert np.array_equal(_matrix(a), _matrix(b))


def _assert_restored_runs_alike(strategy, state, restored, generations: int) -> None:
    """A state and its restored copy ask identical populations for ``generations`` rounds."""
    for _ in range(generations):
        p1, state = strategy.ask(state)
        p2, restored = strategy.ask(restored)
        assert np.array_equal(_matrix(p1), _matrix(p2))
        state = strategy.tell(state, p1, sphere(p1))
        restored = strategy.tell(restored, p2, sphere(p2))


@pytest.mark.parametrize("name", CUBE_STRATEGIES)
def test_checkpoint_restore_continues_bit_for_bit(name):
    s = make_strategy(name, _template(3), 6)
    state = s.init(2)
    for _ in range(3):
        pop, state = s.ask(state)
        state = s.tell(state, pop, sphere(pop))
    leaves = [leaf.copy() for leaf in state_leaves(state)]
    _assert_restored_runs_alike(s, state, restore_state(s.init(99), leaves), 3)
    with pytest.raises(ValueError, match="state arrays"):
        restore_state(s.init(0), leaves[:-1])


def test_pytree_structure_is_preserved():
    template = {"w": np.zeros((2, 3)), "b": np.asarray(0.0), "nested": (np.ones(2),)}
    cma = CMAES(template, 5)
    pop, _ = cma.ask(cma.init(0))
    assert pop["w"].shape == (5, 2, 3) and pop["b"].shape == (5,)
    assert pop["nested"][0].shape == (5, 2)
    assert cma.codec.dim == 9


def test_nan_fitness_counts_as_worst():
    cma = CMAES(_template(2), 4)
    state = cma.init(0)
    pop, state = cma.ask(state)
    f = sphere(pop)
    f_nan = f.copy()
    f_nan[int(np.argmax(f))] = np.nan
    f_inf = f.copy()
    f_inf[int(np.argmax(f))] = -np.inf
    a, b = cma.tell(state, pop, f_nan), cma.tell(state, pop, f_inf)
    assert np.array_equal(a.mean, b.mean)


def test_nsga2_ga_spreads_over_the_pareto_set():
    """f1 = -x², f2 = -(x - 1)²: the Pareto set is x in [0, 1]."""
    ga = GeneticAlgorithm({"x": np.asarray(0.0)}, 20, num_objectives=2, sigma=0.2,
                          init_low=-3.0, init_high=3.0)
    state = ga.init(0)
    for _ in range(40):
        pop, state = ga.ask(state)
        x = np.asarray(pop["x"])
        state = ga.tell(state, pop, np.stack([-x ** 2, -(x - 1) ** 2], axis=1))
    xs = state.parents[:, 0]
    assert xs.min() >= -0.01 and xs.max() <= 1.01
    assert xs.min() < 0.1 and xs.max() > 0.9  # spread by crowding distance
    with pytest.raises(ValueError, match="objectives"):
        ga.tell(state, pop, np.zeros((20, 3)))


def test_grid_sweep_chunks():
    points = [{"x0": np.asarray(i / 10)} for i in range(5)]
    g = GridSweep({"x0": np.asarray(0.0)}, points, 2)
    assert g.num_generations == 3
    state = g.init()
    seen = []
    for _ in range(3):
        pop, state = g.ask(state)
        seen.extend(np.asarray(pop["x0"]).tolist())
        state = g.tell(state, pop, np.zeros(len(pop["x0"])))
    assert seen == [0.0, 0.1, 0.2, 0.3, 0.4]
    with pytest.raises(IndexError, match="exhausted"):
        g.ask(state)


def test_fitness_shape_is_checked():
    cma = CMAES(_template(2), 4)
    state = cma.init(0)
    pop, state = cma.ask(state)
    with pytest.raises(ValueError, match="fitness must have shape"):
        cma.tell(state, pop, np.zeros(3))
    with pytest.raises(ValueError, match="seed must be >= 0"):
        cma.init(-1)


def test_jax_keys_are_accepted_as_seeds():
    import jax

    cma = CMAES(_template(2), 4)
    a, _ = cma.ask(cma.init(jax.random.PRNGKey(3)))
    b, _ = cma.ask(cma.init(jax.random.key(3)))
    assert np.array_equal(_matrix(a), _matrix(b))


# ---- evosax (in the dev extra) -------------------------------------------------------------------

def _evosax():
    """``evosax.algorithms``; a missing evosax fails the test rather than skipping it."""
    try:
        import evosax.algorithms
    except ImportError as err:  # pragma: no cover - only without the dev extra
        pytest.fail(f"evosax is not installed ({err}); the test extras install it: "
                    'pip install -e ".[dev]"')
    return evosax.algorithms


def test_evosax_distribution_based_algorithm_unchanged():
    algos = _evosax()
    from search.strategies import EvosaxStrategy

    template = _template(4)
    es = EvosaxStrategy(algos.CMA_ES(population_size=8, solution=template))
    state, best, _, _ = run(es, sphere, 60)
    assert best > -1e-4
    mean = np.asarray(state.algo_state.mean)
    assert np.linalg.norm(mean - TARGET) < 0.01


def test_evosax_population_based_and_checkpoint():
    algos = _evosax()
    import optax

    from search.strategies import EvosaxStrategy

    es = EvosaxStrategy(algos.SimpleGA(population_size=8, solution=_template(2),
                                       std_schedule=optax.constant_schedule(0.05)))
    state = es.init(0)
    first = None
    for _ in range(20):
        pop, state = es.ask(state)
        f = sphere(pop)
        first = f.max() if first is None else first
        state = es.tell(state, pop, f)
    archive_best = -float(state.algo_state.best_fitness)  # evosax minimises -fitness
    assert archive_best > first and archive_best > -1e-3
    restored = restore_state(es.init(5), [leaf.copy() for leaf in state_leaves(state)])
    _assert_restored_runs_alike(es, state, restored, 2)
