"""The population API: knobs → configs → one compiled call; each lane equals a separate run."""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.config import ConfigError, resolve_config
from blisjax.engine import (
    grid,
    params_from_config,
    random_knobs,
    set_knob,
    simulate_population,
    stack_params,
)
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.engine.test_parity import EDGE_ROWS, _random_policy_configs
from tests.reference.conftest import make_resolved, make_workload


def test_set_knob_validates_and_targets_the_right_field():
    cfg = make_resolved().config
    assert set_knob(cfg, "admission.token_bucket_capacity", 77.0).policy.admission \
        .token_bucket_capacity == 77.0
    routed = set_knob(set_knob(cfg, "routing.policy", "weighted"), "routing.scorers.queue-depth",
                      5.0)
    assert [(s.name, s.weight) for s in routed.policy.routing.scorers][1] == ("queue-depth", 5.0)
    with pytest.raises(ConfigError, match="not a per-lane"):
        set_knob(cfg, "engine.block_size_tokens", 4)
    # the GPU cache: up to the base's blocks, which size the program's arrays
    assert set_knob(cfg, "engine.total_kv_blocks", 4).engine.total_kv_blocks == 4
    with pytest.raises(ConfigError, match=r"engine\.total_kv_blocks.*integer >= 1"):
        set_knob(cfg, "engine.total_kv_blocks", 0)
    with pytest.raises(ConfigError, match=r"engine\.total_kv_blocks.*got None"):
        set_knob(cfg, "engine.total_kv_blocks", None)
    assert set_knob(cfg, "engine.max_num_running_reqs", 4).engine.max_num_running_reqs == 4
    with pytest.raises(ConfigError, match="admission"):
        set_knob(cfg, "admission.policy", "no-such-policy")
    assert set_knob(cfg, "engine.kv_cpu_blocks", 64).engine.kv_cpu_blocks == 64
    with pytest.raises(ConfigError, match="engine.kv_cpu_blocks"):
        set_knob(cfg, "engine.kv_cpu_blocks", -1)
    with pytest.raises(ConfigError, match="engine.kv_transfer_bandwidth"):
        set_knob(cfg, "engine.kv_transfer_bandwidth", 0.0)


def test_grid_and_random_builders():
    g = grid(**{"routing.policy": ["round-robin", "least-loaded"], "scheduler.policy": ["fcfs",
                                                                                      "sjf"]})
    assert len(g) == 4 and g[3] == {"routing.policy": "least-loaded", "scheduler.policy": "sjf"}
    r = random_knobs({"admission.token_bucket_capacity": (10.0, 20.0), "priority.policy":
                      ["constant", "slo-class"]}, 5, seed=1)
    assert len(r) == 5 and all(10.0 <= x["admission.token_bucket_capacity"] <= 20.0 for x in r)
    assert r == random_knobs({"admission.token_bucket_capacity": (10.0, 20.0), "priority.policy":
                              ["constant", "slo-class"]}, 5, seed=1)


def test_evaluate_population_matches_separate_reference_runs(edge_population):
    # A routing × admission grid of 16 knob sets, a fitness configured; run on the program of
    # test_parity.py's population test (tests/engine/conftest.py).
    pop = edge_population.evaluated
    w = edge_population.workloads[0]
    assert pop.knobs == edge_population.knobs
    assert len(pop.results) == 16 and np.all(np.isfinite(pop.fitness))
    for cfg, res in zip(pop.configs, pop.results, strict=True):
        assert first_divergence(reference(resolve_config(cfg), w), res) is None


def test_workloads_share_one_program_with_raised_capacities(edge_population):
    # Two workloads of the same size but different lengths, prefixes and deadlines run with one
    # EngineStatic whose capacities cover both (deadline list padded, more own hash slots, ...);
    # every lane still equals its own reference run. (16 random policies: the program of
    # test_parity.py's population test, tests/engine/conftest.py.)
    pop = edge_population
    wa, wb = pop.workloads
    shared = build_static_shared(pop.base, [wa, wb], decode_stretches=True)
    assert pop.static == shared.replace(cache_scorers=True)
    own_b = build_static(pop.base, wb, decode_stretches=True)
    assert shared.shapes.num_deadlines > own_b.shapes.num_deadlines
    assert shared.shapes.own_slots > own_b.shapes.own_slots
    for w, lanes in zip((wa, wb), pop.lanes, strict=True):
        for k, cfg in enumerate(pop.configs):
            assert first_divergence(reference(resolve_config(cfg), w), lanes[k]) is None, (k,)


def _lane_block_case():
    base = make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=4, max_tokens=64)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    configs = _random_policy_configs(base.config, w.tenant_names, 5, seed=11)
    return base, w, configs, stack_params([params_from_config(c, w.tenant_names)
                                           for c in configs])


@pytest.mark.slow  # the default tier runs lane blocks in the population parity test
def test_lane_blocks_match_independent_reference_runs():
    # 5 lanes in blocks of at most 2: three consecutive lockstep loops (one padded lane whose
    # result is dropped); every lane still equals its own reference run.
    base, w, configs, params = _lane_block_case()
    lanes = simulate_population(base, w, params, lane_block=2)
    assert len(lanes) == 5
    for k, cfg in enumerate(configs):
        assert first_divergence(reference(resolve_config(cfg), w), lanes[k]) is None, (k,)


def test_lane_block_below_one_is_refused():
    base, w, _, params = _lane_block_case()
    with pytest.raises(ValueError, match="lane_block"):
        simulate_population(base, w, params, lane_block=0)


def test_capacities_below_one_are_refused_with_their_name():
    base = make_resolved(instances=2)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    for name, bad in (("queue_slots", 0), ("queue_slots", -1), ("pending_slots", -3),
                      ("deadline_window", 0), ("running_width", 2.5),
                      ("queue_slots", "many")):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
            build_static(base, w, **{name: bad})
    for bad in (1, "no", None):
        with pytest.raises(ValueError, match="narrow_programs must be True or False"):
            build_static(base, w, narrow_programs=bad)
    st = build_static(base, w, queue_slots=3, pending_slots=2)
    assert (st.shapes.queue_slots, st.shapes.pending_slots) == (3, 2)
    assert build_static(base, w).shapes.queue_slots == w.num_requests  # the default: every request


def test_lane_block_sizes_cover_lanes_with_little_padding():
    from blisjax.engine.run import _lane_blocks

    for block in (1, 2, 7, 64):
        for lanes in range(1, 300):
            count, size = _lane_blocks(lanes, block)
            assert size <= block and count * size >= lanes
            assert count == -(-lanes // block)  # as few blocks as the block size allows
            assert count * size - lanes < count  # padding under one lane per block
