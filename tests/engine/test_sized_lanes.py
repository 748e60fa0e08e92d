"""``cluster.num_instances`` as a per-lane knob: a lane of k instances in a program of N routes
among the program's first k instances, and its results are those of a k-instance cluster run
by the reference engine (every request, every counter)."""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.config import ConfigError, RoutingConfig, ScorerWeight, resolve_config
from blisjax.engine import evaluate_population, set_knob
from blisjax.engine.parity import first_divergence
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload

ROUTINGS = {
    "rr": RoutingConfig(policy="round-robin"),
    "least": RoutingConfig(policy="least-loaded", tie_break="blis-random"),
    "busiest": RoutingConfig(policy="always-busiest"),
    "weighted": RoutingConfig(policy="weighted", tie_break="blis-random", scorers=(
        ScorerWeight("prefix-affinity", 2.0), ScorerWeight("queue-depth", 1.0),
        ScorerWeight("kv-utilization", 1.0))),
}


def _rows(n: int = 120, seed: int = 3) -> list[dict]:
    """Bursty arrivals with shared prefixes: queues build on small clusters, ties happen."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(4_000, n)).astype(int)
    t[::7] = t[::7] // 1000 * 1000  # some simultaneous arrivals
    t.sort()
    return [{"arrival": int(a), "input": int(rng.integers(60, 200)),
             "output": int(rng.integers(1, 40)), "group": int(rng.integers(0, 2)),
             "prefix": 48} for a in t]


@pytest.fixture(scope="module")
def sized():
    workload = make_workload(_rows(), groups=("g0", "g1"))
    out = {}
    for name, routing in ROUTINGS.items():
        base = make_resolved(instances=4, kv_blocks=120, max_running=4, routing=routing)
        knobs = [{"cluster.num_instances": k} for k in (1, 2, 3, 4)]
        out[name] = (workload, evaluate_population(base, workload, knobs))
    return out


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_each_size_equals_its_own_reference_run(sized, routing):
    workload, pop = sized[routing]
    for k, (cfg, res) in enumerate(zip(pop.configs, pop.results, strict=True), start=1):
        assert cfg.cluster.num_instances == k and res.num_instances == k
        ref = reference(resolve_config(cfg), workload)
        assert first_divergence(ref, res) is None, (routing, k)
        used = set(np.asarray(res.instance)[np.asarray(res.instance) >= 0].tolist())
        assert used <= set(range(k))
        assert pop.metrics[k - 1]["instances"].keys() == {str(i) for i in range(k)}


def test_sizes_change_the_outcome(sized):
    """The knob reaches the program: one instance queues far more than four."""
    _, pop = sized["rr"]
    ttft = [m["ttft_mean_ms"] for m in pop.metrics]
    assert ttft[0] > ttft[1] > ttft[3]


def test_size_knob_bounds_and_features():
    cfg = make_resolved(instances=3).config
    assert set_knob(cfg, "cluster.num_instances", 2).cluster.num_instances == 2
    assert set_knob(cfg, "cluster.num_instances", 2.0).cluster.num_instances == 2
    for bad in (0, 4, 2.5, "two", True):
        with pytest.raises(ConfigError, match=r"cluster.num_instances.*\[1, 3\]"):
            set_knob(cfg, "cluster.num_instances", bad)


def test_one_program_serves_populations_of_any_sizes():
    """A program compiled for a population with a full-size lane runs a later population whose
    lanes are all smaller (a search generation without a full-size candidate) as it is, with
    each lane's results those of its own cluster size. (The program of the populations
    above: 120 request rows, of which this workload's 40 use the first.)"""
    from blisjax.engine import params_from_config, stack_params
    from blisjax.engine.consts import build_consts
    from blisjax.engine.run import compile_lanes, lane_result
    from blisjax.engine.static import build_static

    workload = make_workload(_rows(40), groups=("g0", "g1"))
    base = make_resolved(instances=4, kv_blocks=120, max_running=4, routing=ROUTINGS["rr"])
    st = build_static(base, make_workload(_rows(), groups=("g0", "g1")), sized_lanes=True)
    consts = build_consts(base, workload, st)

    def population(sizes):
        configs = [set_knob(base.config, "cluster.num_instances", k) for k in sizes]
        return configs, stack_params([params_from_config(c, workload.tenant_names)
                                      for c in configs])

    _, first = population((4, 1, 2, 1))
    run = compile_lanes(st, consts, first, lane_block=4)
    configs, later = population((2, 3, 1, 2))
    final = run(consts, later)
    for k, cfg in enumerate(configs):
        res = lane_result(st, consts, final, k)
        ref = reference(resolve_config(cfg), workload)
        assert len(res.status) == workload.num_requests
        assert np.array_equal(res.instance, ref.instance)
        assert np.array_equal(res.ttft_us, ref.ttft_us)
