"""The cluster's settings that are per-lane knobs (``params.LaneSettings``: running requests,
token budget, long-prefill threshold, admission and routing latency, snapshot refresh
interval): lanes of one program that differ in them each equal their own reference run,
request by request; a lane may not exceed the program's running requests or token budget;
lanes that keep the base configuration's settings run the program without per-lane
settings."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import ConfigError, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.population import set_knob
from blisjax.engine.static import build_static
from blisjax.engine.static_lanes import for_lanes
from blisjax.reference import simulate as reference
from search.space import get_knob, space_from_mapping
from tests.engine.conftest import PHYSICS, edge_engine, edge_rows_twice
from tests.reference.conftest import make_workload

# each lane: knobs on the edge scenario (64-token budget chunking prefills past 32 tokens,
# admission 300 µs, routing 700 µs, snapshots every 1.5 ms)
LANES = [
    {},
    {"engine.max_num_scheduled_tokens": 24, "engine.long_prefill_token_threshold": 8},
    {"engine.max_num_running_reqs": 2},
    {"engine.long_prefill_token_threshold": 0},
    {"cluster.admission_latency_us": 0, "cluster.routing_latency_us": 0},
    {"cluster.routing_latency_us": 0, "cluster.admission_latency_us": 2500},
    {"cluster.snapshot_refresh_interval_us": 0},
    {"cluster.snapshot_refresh_interval_us": 9000, "cluster.routing_latency_us": 40},
    {"engine.max_num_running_reqs": 1, "engine.max_num_scheduled_tokens": 12,
     "engine.long_prefill_token_threshold": 12,
     "cluster.admission_latency_us": 0, "cluster.routing_latency_us": 0,
     "cluster.snapshot_refresh_interval_us": 0},
    # a smaller GPU cache (40 blocks in the base): KV use, preemptions and evictions differ
    {"engine.total_kv_blocks": 24},
    {"engine.total_kv_blocks": 12, "cluster.snapshot_refresh_interval_us": 0},
]


def random_settings(cfg, rng):
    """``cfg`` with the settings that are per-lane knobs drawn by ``rng`` (a numpy
    ``Generator``): running requests, a token budget and GPU KV blocks (where ``cfg`` gives
    them) up to its own, a long-prefill threshold, admission and routing latencies and a
    snapshot refresh interval (0 among the choices)."""
    most = cfg.engine.max_num_scheduled_tokens
    budget = int(rng.integers(max(most // 4, 1), most + 1))
    running = int(rng.integers(1, cfg.engine.max_num_running_reqs + 1))
    blocks = cfg.engine.total_kv_blocks
    if blocks is not None:
        blocks = int(rng.choice([blocks, max(blocks // 2, 1)]))
    engine = dataclasses.replace(cfg.engine, max_num_running_reqs=running, total_kv_blocks=blocks,
                                 max_num_scheduled_tokens=budget,
                                 long_prefill_token_threshold=int(rng.choice(
                                     [0, max(budget // 2, 1), budget])))
    cluster = dataclasses.replace(
        cfg.cluster, admission_latency_us=int(rng.choice([0, 250, 1200])),
        routing_latency_us=int(rng.choice([0, 400, 2000])),
        snapshot_refresh_interval_us=int(rng.choice([0, 1000, 5000])))
    return dataclasses.replace(cfg, engine=engine, cluster=cluster)


def _base():
    """The edge scenario on two instances, routed by the snapshots' queue depth and KV use
    (so the refresh interval matters)."""
    cfg = edge_engine(2).config
    for name, value in (("routing.policy", "weighted"), ("routing.scorers.queue-depth", 2.0),
                        ("routing.scorers.kv-utilization", 2.0)):
        cfg = set_knob(cfg, name, value)
    return resolve_config(cfg)


def _lane(base, knobs: dict):
    cfg = base.config
    for name, value in knobs.items():
        cfg = set_knob(cfg, name, value)
    return cfg


def test_lanes_of_their_own_settings_match_the_reference():
    base = _base()
    w = make_workload(edge_rows_twice(), ("a", "b"), ("g",))
    configs = [_lane(base, knobs) for knobs in LANES]
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    assert for_lanes(build_static(base, w), params).features.lane_settings
    lanes = simulate_population(base, w, params, lane_block=8)
    wants = [reference(resolve_config(c), w) for c in configs]
    for k, (want, got) in enumerate(zip(wants, lanes, strict=True)):
        assert first_divergence(want, got) is None, (k, LANES[k])
    # each knob changes its lane's run (the lanes are not the base configuration's run again)
    for k in range(1, len(LANES)):
        assert (wants[k].ttft_us != wants[0].ttft_us).any() \
            or (wants[k].instance != wants[0].instance).any(), LANES[k]


def test_lanes_of_the_base_settings_keep_the_programs_own():
    base = _base()
    w = make_workload(edge_rows_twice(), ("a", "b"), ("g",))
    params = stack_params([params_from_config(base.config, w.tenant_names)] * 2)
    assert not for_lanes(build_static(base, w), params).features.lane_settings


@pytest.mark.parametrize(("field", "most"), [("max_num_scheduled_tokens", 64),
                                             ("max_num_running_reqs", 4),
                                             ("total_kv_blocks", 40)])
def test_a_lane_above_the_programs_budget_or_batch_slots_is_refused(field, most):
    """The program's step tables hold its token budget, its arrays its batch slots and KV
    blocks."""
    base = _base()
    with pytest.raises(ConfigError, match=rf"engine\.{field}.*at most {most}"):
        set_knob(base.config, f"engine.{field}", most + 1)
    w = make_workload(edge_rows_twice(), ("a", "b"), ("g",))
    bigger = dataclasses.replace(base.config, engine=dataclasses.replace(
        base.config.engine, **{field: 2 * most}))
    params = stack_params([params_from_config(bigger, w.tenant_names)])
    with pytest.raises(ConfigError, match=rf"engine\.{field}.*{2 * most} exceeds the "
                                          rf"program's {most}"):
        for_lanes(build_static(base, w), params)


def test_a_lane_above_batch_slots_that_hold_every_request_runs_as_the_slots():
    """Two requests: the program has two batch slots, and a lane capped at 4 or 3 running
    requests runs as one capped at 2 (no more can run at once); a cap of 1 is a lane's own."""
    base = _base()
    w = make_workload(edge_rows_twice()[:2], ("a", "b"), ("g",))
    st = build_static(base, w)
    assert st.shapes.batch_slots == 2 and st.every_row_runs
    configs = [set_knob(base.config, "engine.max_num_running_reqs", v) for v in (4, 3, 2)]
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    assert not for_lanes(st, params).features.lane_settings
    one = set_knob(base.config, "engine.max_num_running_reqs", 1)
    params = stack_params([params_from_config(c, w.tenant_names) for c in [*configs, one]])
    assert for_lanes(st, params).features.lane_settings


@pytest.mark.parametrize(("name", "value"), [
    ("engine.max_num_running_reqs", 3), ("engine.max_num_scheduled_tokens", 32),
    ("engine.long_prefill_token_threshold", 8),
    ("cluster.admission_latency_us", 900), ("cluster.routing_latency_us", 0),
    ("cluster.snapshot_refresh_interval_us", 0), ("engine.total_kv_blocks", 30)])
def test_each_setting_knob_reads_back_as_set(name, value):
    base = _base().config
    assert get_knob(base, name) != value
    assert get_knob(set_knob(base, name, value), name) == value


def test_a_search_space_past_the_programs_token_budget_is_refused():
    space = space_from_mapping({"knobs": {"engine.max_num_scheduled_tokens":
                                          {"low": 16, "high": 128, "type": "int"}}})
    with pytest.raises(ConfigError, match=r"space\.knobs\.engine\.max_num_scheduled_tokens: "
                                          r"value 128 .*at most 64"):
        space.validate_against(_base().config)


def test_running_requests_and_budget_are_not_knobs_under_the_physics_model():
    # the physics model's constants read vLLM's max_num_seqs and max_num_batched_tokens
    physics = dataclasses.replace(_base().config, latency=PHYSICS)
    with pytest.raises(ConfigError, match=r"knob 'engine\.max_num_scheduled_tokens'.*physics"):
        set_knob(physics, "engine.max_num_scheduled_tokens", 32)
    # ... and the GPU's KV blocks
    with pytest.raises(ConfigError, match=r"knob 'engine\.total_kv_blocks'.*physics"):
        set_knob(physics, "engine.total_kv_blocks", 20)
    assert set_knob(physics, "cluster.routing_latency_us", 0).cluster.routing_latency_us == 0
    w = make_workload(edge_rows_twice(), ("a", "b"), ("g",))
    lane = dataclasses.replace(physics, engine=dataclasses.replace(physics.engine,
                                                                   max_num_running_reqs=2))
    params = stack_params([params_from_config(lane, w.tenant_names)])
    with pytest.raises(ConfigError, match=r"engine\.max_num_running_reqs: is not a per-lane "
                                          r"knob with the physics"):
        for_lanes(build_static(resolve_config(physics), w), params)
