"""Genetic programming over policy programs (search.strategies.gp): tree operators by hand,
validity and the size limit over many seeds, determinism, checkpoints and resume, convergence
on a synthetic fitness (a plain-Python evaluator of the tree on a fixed table), the space's
program section and its errors, and one end-to-end `blisjax search --strategy gp` run."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from blisjax.cli import main
from blisjax.config import ConfigError
from blisjax.program import Node, compile_program
from blisjax.program.language import names_in, parse, size, to_text, tree_text
from blisjax.program.observables import visible_at
from search.expr import compile_expression
from search.io import load_checkpoint, save_checkpoint
from search.objectives import Scoring, score_candidate
from search.runner import run_search
from search.space import SearchSpace, get_knob, space_from_mapping
from search.strategies import GeneticProgramming, make_strategy, restore_state, state_leaves
from search.strategies.gp import (
    OPERATOR_ARITY,
    Grammar,
    constant_perturbation,
    point_mutation,
    random_tree,
    replace_at,
    round_constant,
    subtree_crossover,
    subtree_mutation,
    subtrees,
)
from tests.search.conftest import TINY_CONFIG

OBS = ("queue_depth", "kv_utilization", "cached_blocks")
ARITHMETIC = ("add", "sub", "mul", "div", "min", "max")
#: (queue_depth, kv_utilization, cached_blocks) of the synthetic fitness.
TABLE = ((0, 0.0, 0), (1, 0.25, 3), (2, 0.5, 1), (3, 0.1, 7), (5, 0.9, 2), (8, 0.4, 0),
         (13, 0.75, 5), (21, 0.3, 4))
BIG = 1e300


def _truth(x: bool) -> float:
    return 1.0 if x else 0.0


def evaluate(node: Node, v: dict[str, float]) -> float:
    """The program's value by the language's arithmetic (x / 0 = 0, comparisons and logic give
    1.0 or 0.0), results kept within ±BIG."""
    op, a = node.op, node.args
    if op == "const":
        return node.value
    if op == "name":
        return v[node.name]
    if op == "if":
        return evaluate(a[1], v) if evaluate(a[0], v) != 0.0 else evaluate(a[2], v)
    x = [evaluate(arg, v) for arg in a]
    if op == "div":
        out = 0.0 if x[1] == 0.0 else x[0] / x[1]
    elif op == "log1p":
        out = float(np.log1p(x[0])) if x[0] > -1.0 else -BIG
    else:
        out = {"add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1],
               "mul": lambda: x[0] * x[1], "neg": lambda: -x[0], "abs": lambda: abs(x[0]),
               "min": lambda: min(x), "max": lambda: max(x),
               "clip": lambda: min(max(x[0], x[1]), x[2]),
               "lt": lambda: _truth(x[0] < x[1]), "le": lambda: _truth(x[0] <= x[1]),
               "gt": lambda: _truth(x[0] > x[1]), "ge": lambda: _truth(x[0] >= x[1]),
               "eq": lambda: _truth(x[0] == x[1]), "ne": lambda: _truth(x[0] != x[1]),
               "and": lambda: _truth(x[0] != 0.0 and x[1] != 0.0),
               "or": lambda: _truth(x[0] != 0.0 or x[1] != 0.0),
               "not": lambda: _truth(x[0] == 0.0)}[op]()
    return min(max(out, -BIG), BIG)


def mse(text: str, target, params: dict[str, float] | None = None) -> float:
    """Mean squared difference between the program and ``target(q, u, c)`` on TABLE."""
    node = parse(text, path="test")
    errors = []
    for q, u, c in TABLE:
        values = {"queue_depth": float(q), "kv_utilization": u, "cached_blocks": float(c),
                  **(params or {})}
        errors.append(min((evaluate(node, values) - target(q, u, c)) ** 2, BIG))
    return float(np.mean(errors))


def twice_queue_plus_kv(q: float, u: float, c: float) -> float:
    return 2 * q + u


def _fitness(population: dict, target=twice_queue_plus_kv) -> np.ndarray:
    return np.array([-mse(t, target, {"w": 1.0}) for t in population["routing.program"]])


def _gp(population: int = 16, **kw) -> GeneticProgramming:
    kw.setdefault("observables", OBS)
    return GeneticProgramming("routing", population, **kw)


# ---- tree operators, by hand ------------------------------------------------------------------


def test_subtrees_and_replace_at():
    tree = parse("queue_depth + kv_utilization * 2", path="t")
    points = subtrees(tree)
    assert [p for p, _ in points] == [(), (0,), (1,), (1, 0), (1, 1)]
    assert [n.op for _, n in points] == ["add", "name", "mul", "name", "const"]
    three = Node("const", value=3.0)
    assert to_text(replace_at(tree, (1, 1), three)) == "queue_depth + kv_utilization * 3"
    assert to_text(replace_at(tree, (0,), three)) == "3 + kv_utilization * 2"
    assert replace_at(tree, (), three) == three


def test_round_constant():
    assert round_constant(2.123456) == 2.123
    assert round_constant(-1234567.0) == -1235000.0
    assert round_constant(5e12) == 1e9 and round_constant(-5e12) == -1e9
    zero = round_constant(-0.0)
    assert zero == 0.0 and np.copysign(1.0, zero) == 1.0


def test_point_mutation_changes_one_node_of_the_same_arity():
    grammar = Grammar(OBS, ARITHMETIC)
    tree = parse("min(queue_depth, kv_utilization) * 2 - cached_blocks", path="t")
    before = [n.op if n.args else "leaf" for _, n in subtrees(tree)]
    for seed in range(50):
        child = point_mutation(np.random.default_rng(seed), tree, grammar)
        after = [n.op if n.args else "leaf" for _, n in subtrees(child)]
        assert len(after) == len(before)
        changed = [k for k, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
        assert len(changed) <= 1
        for k in changed:
            assert OPERATOR_ARITY[before[k]] == OPERATOR_ARITY[after[k]]


def test_constant_perturbation_moves_one_constant():
    tree = parse("queue_depth * 2 + 10", path="t")
    for seed in range(20):
        child = constant_perturbation(np.random.default_rng(seed), tree, 0.2)
        consts = [n.value for _, n in subtrees(child) if n.op == "const"]
        assert len(consts) == 2 and (consts[0] == 2.0) + (consts[1] == 10.0) >= 1
        assert [n.op for _, n in subtrees(child)] == [n.op for _, n in subtrees(tree)]
    assert constant_perturbation(np.random.default_rng(0), parse("queue_depth", path="t"),
                                 0.2) is None


def test_crossover_respects_the_size_limit():
    grammar = Grammar(OBS, tuple(OPERATOR_ARITY))
    for seed in range(200):
        rng = np.random.default_rng(seed)
        a, b = (random_tree(rng, grammar, 3, seed % 2 == 0) for _ in range(2))
        limit = max(size(a), 7)
        child = subtree_crossover(rng, a, b, limit)
        assert size(child) <= limit
        mutated = subtree_mutation(rng, a, grammar)
        assert set(names_in(mutated)) <= set(OBS)


def test_random_trees_are_bounded_by_depth():
    grammar = Grammar(OBS, ARITHMETIC)
    for seed in range(50):
        full = random_tree(np.random.default_rng(seed), grammar, 3, True)
        assert size(full) == 15  # every operator binary: 1 + 2 + 4 + 8
        grow = random_tree(np.random.default_rng(seed), grammar, 3, False)
        assert size(grow) <= 15


# ---- the strategy -----------------------------------------------------------------------------


def _assert_valid(gp: GeneticProgramming, population: dict) -> None:
    texts = list(population["routing.program"])
    assert len(texts) == gp.population_size
    allowed = set(visible_at("routing")) | set(gp.params)
    for text in texts:
        node = parse(text, path="t")
        assert to_text(node) == text
        assert size(node) <= gp.max_nodes
        assert names_in(node) <= allowed
        compile_program("routing", node=node, params={p: 1.0 for p in gp.params})


@pytest.mark.parametrize("max_nodes", [1, 5, 9, 31, 64])
def test_every_individual_is_valid_and_within_the_size_limit(max_nodes):
    gp = _gp(12, max_nodes=max_nodes, operators=None)
    for seed in range(8):
        state = gp.init(seed)
        rng = np.random.default_rng(seed)
        for _ in range(4):
            pop, state = gp.ask(state)
            _assert_valid(gp, pop)
            state = gp.tell(state, pop, rng.standard_normal(12))


def test_children_are_new_programs():
    gp = _gp(16, operators=ARITHMETIC)
    state = gp.init(3)
    for _ in range(5):
        pop, state = gp.ask(state)
        texts = list(pop["routing.program"])
        assert len(set(texts)) == len(texts)
        if bool(state.has_parents):
            assert not set(texts) & set(state.programs)
        state = gp.tell(state, pop, _fitness(pop))


def test_seeds_open_the_first_generation():
    gp = _gp(6, seeds=["score_queue_depth", "queue_depth+1", "queue_depth + 1"])
    pop, _ = gp.ask(gp.init(0))
    texts = list(pop["routing.program"])
    assert texts[:2] == ["score_queue_depth", "queue_depth + 1"]
    assert len(set(texts)) == 6


def test_same_seed_same_populations():
    def history(seed):
        gp = _gp(10, template={"routing.params.w": np.asarray(0.5)})
        state, out = gp.init(seed), []
        for _ in range(5):
            pop, state = gp.ask(state)
            out.append((list(pop["routing.program"]), pop["routing.params.w"].tolist()))
            state = gp.tell(state, pop, _fitness(pop))
        return out

    assert history(4) == history(4)
    assert history(4) != history(5)
    gp = _gp(10)
    state = gp.init(1)
    assert list(gp.ask(state)[0]["routing.program"]) == list(gp.ask(state)[0]["routing.program"])


def test_survival_is_elitist_with_parsimony():
    gp = _gp(4)
    state = gp.init(0)
    pop = {"routing.program": np.array(["queue_depth + 0", "queue_depth", "kv_utilization",
                                        "cached_blocks"])}
    state = gp.tell(state, pop, np.array([1.0, 1.0, 0.5, np.nan]))
    assert list(state.programs) == ["queue_depth", "queue_depth + 0", "kv_utilization",
                                    "cached_blocks"]
    assert state.fitness[:, 0].tolist() == [1.0, 1.0, 0.5, -np.inf]
    worse = {"routing.program": np.array(["1", "2", "3", "4"])}
    state = gp.tell(state, worse, np.array([0.0, 0.6, 0.0, 0.0]))
    assert list(state.programs) == ["queue_depth", "queue_depth + 0", "2", "kv_utilization"]


def test_checkpoint_restore_continues_bit_for_bit(tmp_path):
    gp = _gp(8, template={"routing.params.w": np.asarray(0.5)})
    state = gp.init(2)
    for _ in range(3):
        pop, state = gp.ask(state)
        state = gp.tell(state, pop, _fitness(pop))
    save_checkpoint(tmp_path / "c.npz", state_leaves(state), {})
    leaves, _ = load_checkpoint(tmp_path / "c.npz")
    restored = restore_state(gp.init(99), leaves)
    for _ in range(3):
        p1, state = gp.ask(state)
        p2, restored = gp.ask(restored)
        assert list(p1["routing.program"]) == list(p2["routing.program"])
        assert np.array_equal(p1["routing.params.w"], p2["routing.params.w"])
        state = gp.tell(state, p1, _fitness(p1))
        restored = gp.tell(restored, p2, _fitness(p2))
    with pytest.raises(ValueError, match="state array 0"):
        restore_state(gp.init(0), [leaves[0][:3], *leaves[1:]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_the_structure_of_a_target(seed):
    gp = _gp(32, operators=ARITHMETIC)
    state = gp.init(seed)
    first = None
    for _ in range(30):
        pop, state = gp.ask(state)
        state = gp.tell(state, pop, _fitness(pop))
        first = state.fitness[0, 0] if first is None else first
        if state.fitness[0, 0] > -1e-9:
            break
    assert first < state.fitness[0, 0]  # the first generation's best is improved on
    assert -state.fitness[0, 0] < 1e-9
    assert mse(str(state.programs[0]), twice_queue_plus_kv) < 1e-9


def test_tunes_the_parameters_of_a_seeded_program():
    space = space_from_mapping({
        "program": {"site": "routing", "observables": list(OBS), "operators": list(ARITHMETIC),
                    "seeds": ["queue_depth * w + kv_utilization"]},
        "knobs": {"routing.params.w": {"low": 0, "high": 10}}})
    gp = make_strategy("gp", space.template(), 16, program=space.program)

    def target(q, u, c):
        return 3.7 * q + u

    def fitness(pop):
        return np.array([-mse(k["routing.program"], target, {"w": k["routing.params.w"]})
                         for k in space.decode(pop)])

    state = gp.init(1)
    pop, state = gp.ask(state)
    seeded = space.decode(pop)[0]
    assert seeded == {"routing.program": "queue_depth * w + kv_utilization",
                      "routing.params.w": 5.0, "routing.policy": "program"}
    start = -fitness(pop)[0]  # (5 - 3.7)^2 * mean(q^2) = 1.69 * 713 / 8
    assert start == pytest.approx(150.62125, rel=1e-9)
    state = gp.tell(state, pop, fitness(pop))
    for _ in range(24):
        pop, state = gp.ask(state)
        state = gp.tell(state, pop, fitness(pop))
    assert -state.fitness[0, 0] < start / 100


def test_multi_objective_ranks_by_nsga2():
    gp = _gp(4, num_objectives=2)
    state = gp.init(0)
    pop = {"routing.program": np.array(["1", "2", "3", "4"])}
    f = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    state = gp.tell(state, pop, f)
    assert str(state.programs[-1]) == "1"  # the only dominated one
    with pytest.raises(ValueError, match="objectives"):
        gp.tell(state, pop, np.zeros(4))


@pytest.mark.parametrize("kwargs, match", [
    ({"site": "router"}, "site"),
    ({"population_size": 1}, "population_size"),
    ({"max_nodes": 65}, "max_nodes"),
    ({"observables": ["age_ms", "nope"]}, "'nope' is not an observable"),
    ({"operators": ["pow"]}, "'pow' is not an operator"),
    ({"constants": (1.0, 0.0)}, "constants"),
    ({"variation_weights": (0, 0, 0, 0)}, "variation_weights"),
    ({"seeds": ["queue_depth"] * 5}, "5 programs for a population of 4"),
])
def test_bad_arguments(kwargs, match):
    args = {"site": "routing", "population_size": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        GeneticProgramming(args.pop("site"), args.pop("population_size"), **args)


def test_make_strategy_gp_needs_a_program_section():
    with pytest.raises(ValueError, match="program section"):
        make_strategy("gp", {}, 4)


# ---- the space's program section --------------------------------------------------------------


def test_program_section_round_trip_and_decode():
    space = space_from_mapping({"program": {"site": "admission", "max_nodes": 9,
                                            "seeds": ["tenant_in_flight<w"]},
                                "knobs": {"admission.params.w": {"low": 0, "high": 8}}})
    assert space.names == ("admission.program", "admission.params.w")
    assert space.program.observables == visible_at("admission")
    assert space.program.seeds == ("tenant_in_flight < w",)
    assert space.param_names() == ("w",)
    assert space_from_mapping(space.to_mapping()) == space
    knobs = space.decode({"admission.program": np.array(["age_ms > 1", "1"]),
                          "admission.params.w": np.array([0.25, 1.5])})
    assert knobs == [{"admission.program": "age_ms > 1", "admission.params.w": 2.0,
                      "admission.policy": "program"},
                     {"admission.program": "1", "admission.params.w": 4.0,
                      "admission.policy": "program"}]
    only = space_from_mapping({"program": {"site": "priority"}})
    assert only.names == ("priority.program",) and only.dim == 0


def test_declared_parameters_let_candidates_set_program_and_params():
    from blisjax.config import load_config
    from blisjax.engine.population import apply_knobs

    space = space_from_mapping({"program": {"site": "routing"},
                                "knobs": {"routing.params.w": {"low": 0, "high": 8}}})
    base = load_config(TINY_CONFIG)
    declared = space.declare_params(base)
    assert declared.policy.routing.policy == "weighted"
    assert get_knob(base, "routing.params.w") is None
    assert get_knob(declared, "routing.params.w") == 0.0
    space.validate_against(declared)
    cfg = apply_knobs(declared, space.decode({"routing.program": np.array(["queue_depth * w"]),
                                              "routing.params.w": np.array([0.5])})[0])
    assert cfg.policy.routing.policy == "program"
    assert cfg.policy.routing.program == "queue_depth * w"
    assert dict(cfg.policy.routing.params) == {"w": 4.0}


@pytest.mark.parametrize("program, field, match", [
    ({"site": "router"}, "space.program.site", "must be one of routing, admission, priority"),
    ({}, "space.program.site", "must be one of"),
    ({"site": "routing", "observables": ["queue_depth", "nope"]}, "space.program.observables",
     "'nope' is not an observable of the routing program"),
    ({"site": "priority", "observables": ["queue_depth"]}, "space.program.observables",
     "'queue_depth' is not an observable of the priority program"),
    ({"site": "routing", "observables": []}, "space.program.observables", "non-empty list"),
    ({"site": "routing", "max_nodes": 0}, "space.program.max_nodes", r"integer in \[1, 64\]"),
    ({"site": "routing", "max_nodes": 65}, "space.program.max_nodes", r"integer in \[1, 64\]"),
    ({"site": "routing", "max_nodes": "31"}, "space.program.max_nodes", "got '31'"),
    ({"site": "routing", "max_nodes": True}, "space.program.max_nodes", "got True"),
    ({"site": "routing", "operators": ["add", "pow"]}, "space.program.operators",
     "'pow' is not an operator"),
    ({"site": "routing", "constants": [1, 0]}, "space.program.constants", "low must be <="),
    ({"site": "routing", "constants": [0]}, "space.program.constants", r"\[low, high\]"),
    ({"site": "routing", "seeds": ["queue_depth +"]}, "space.program.seeds[0]", "does not parse"),
    ({"site": "routing", "seeds": ["1", "w"]}, "space.program.seeds[1]", "'w' is neither"),
    ({"site": "routing", "max_nodes": 3, "seeds": ["queue_depth + 1 + 2"]},
     "space.program.seeds[0]", "has 5 nodes, more than max_nodes"),
    ({"site": "routing", "depth": 3}, "space.program.depth", "unknown key"),
])
def test_program_section_errors_name_the_field(program, field, match):
    with pytest.raises(ConfigError, match=match) as err:
        space_from_mapping({"program": program})
    assert str(err.value).startswith(f"{field}:") or err.value.path.startswith(field)


def test_program_section_refuses_the_knobs_it_sets():
    with pytest.raises(ConfigError, match="set by the program section"):
        space_from_mapping({"program": {"site": "routing"},
                            "knobs": {"routing.policy": {"choices": ["weighted", "program"]}}})
    with pytest.raises(ConfigError, match="at least one knob"):
        SearchSpace(())


def _write_space(tmp_path, data) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("data, strategy, extra, message", [
    ({"knobs": {"routing.scorers.load-balance": {"low": 0.1, "high": 1}}}, "gp", [],
     "--space: --strategy gp searches over a policy program"),
    ({"program": {"site": "routing"}}, "cma", [], "--strategy: the space has a program section"),
    ({"program": {"site": "routing", "seeds": ["1", "2", "3"]}}, "gp", [],
     r"--population: must be at least the number of seed programs"),
    ({"program": {"site": "routing", "observables": ["nope"]}}, "gp", [],
     "space.program.observables: 'nope' is not an observable"),
])
def test_search_cli_refuses_bad_program_settings(tmp_path, capsys, data, strategy, extra,
                                                 message):
    out = tmp_path / "out"
    code = main(["search", str(TINY_CONFIG), "--space", _write_space(tmp_path, data),
                 "--strategy", strategy, "--population", "2", "--generations", "1",
                 "--out", str(out), "--quiet", "--engine", "reference", *extra])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


# ---- the runner -------------------------------------------------------------------------------

SPACE = space_from_mapping({"program": {"site": "routing", "observables": list(OBS),
                                        "operators": list(ARITHMETIC), "max_nodes": 15},
                            "knobs": {"routing.params.w": {"low": 0, "high": 4}}})
SCORING = Scoring((compile_expression("-err"),))


def _evaluate(knob_sets):
    return [score_candidate(SCORING, k, [{"err": mse(k["routing.program"], twice_queue_plus_kv,
                                                     {"w": k["routing.params.w"]})}])
            for k in knob_sets]


class Kill(Exception):
    pass


def _run(out, gens=5, resume=False, callback=None):
    strategy = make_strategy("gp", SPACE.template(), 6, program=SPACE.program)
    return run_search(SPACE, strategy, _evaluate, SCORING, generations=gens, seed=3,
                      out_dir=out, resume=resume, fingerprint={"space": SPACE.to_mapping()},
                      progress=False, callback=callback)


def test_runner_resume_after_kill_equals_uninterrupted_run(tmp_path):
    full = _run(tmp_path / "full")

    def kill_after_two(report):
        if report.generation == 1:
            raise Kill

    with pytest.raises(Kill):
        _run(tmp_path / "killed", callback=kill_after_two)
    resumed = _run(tmp_path / "killed", resume=True)
    assert resumed.resumed_from == 2
    assert resumed.records == full.records
    assert (tmp_path / "full" / "history.csv").read_bytes() == \
        (tmp_path / "killed" / "history.csv").read_bytes()
    a, _ = load_checkpoint(tmp_path / "full" / "checkpoint.npz")
    b, _ = load_checkpoint(tmp_path / "killed" / "checkpoint.npz")
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    header = (tmp_path / "full" / "history.csv").read_text().splitlines()[0]
    assert header.startswith("generation,candidate,routing.program,routing.params.w,fitness")
    assert all(r.knobs["routing.policy"] == "program" for r in full.records)


# ---- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_search_cli_gp_end_to_end(tmp_path, capsys):
    space = _write_space(tmp_path, {
        "program": {"site": "routing", "max_nodes": 15,
                    "observables": ["queue_depth", "kv_utilization", "cached_blocks",
                                    "score_prefix_affinity", "score_queue_depth"],
                    "seeds": ["score_queue_depth", "score_prefix_affinity * w + in_flight"]},
        "knobs": {"routing.params.w": {"low": 0, "high": 10}}})

    def search(out, gens, *extra):
        code = main(["search", str(TINY_CONFIG), "--space", space, "--strategy", "gp",
                     "--population", "4", "--generations", str(gens), "--engine", "reference",
                     "--out", str(out), "--quiet", *extra])
        stdout, stderr = capsys.readouterr()
        assert code == 0, stderr
        return json.loads(stdout), stderr

    summary, stderr = search(tmp_path / "a", 2)
    best = summary["best"]
    text = best["knobs"]["routing.program"]
    assert best["knobs"]["routing.policy"] == "program"
    assert best["program"] == {"site": "routing", "text": text,
                               "nodes": size(parse(text, path="t")),
                               "tree": tree_text(parse(text, path="t")).splitlines()}
    assert f"best routing program ({best['program']['nodes']} nodes)" in stderr
    assert summary["baseline"]["knobs"] == {"routing.program": None, "routing.params.w": None,
                                            "routing.policy": "weighted"}
    assert summary["files"]["best_program"] == "best_program.txt"
    assert text in (tmp_path / "a" / "best_program.txt").read_text()
    rows = (tmp_path / "a" / "history.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 4 and "score_queue_depth" in rows[1]
    # determinism, and resume equals an uninterrupted run
    search(tmp_path / "b", 1)
    search(tmp_path / "b", 2, "--resume")
    for name in ("history.csv", "summary.json", "best_program.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
