"""Instance lifecycles and autoscaling: every lane of a JAX population equals its own reference
run, request by request, with the lifecycle counters and timeline (docs/semantics.md
Decision 16).

All examples of a test share one compiled program: two initial instances, up to four slots,
a small KV cache and batch (queues form, instances preempt), decode stretches compiled in.
Each lane draws its autoscaler (any template, its thresholds, windows, cooldown, replica
bounds and step limits, its actuation delay and drain policy) and its lifecycle (loading
delay, warm start, warm-up), so ticks, actuations, loads, drains, terminations and reused
slots interleave with arrivals, steps and timeouts. The default tier runs a few examples
without ``--blis-quirks``; the slow tier runs more, and both modes with node pools.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import (
    AutoscalerConfig,
    DelaySpec,
    LatencyConfig,
    LifecycleConfig,
    NodePool,
    resolve_config,
)
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.engine.conftest import room_for_a_program
from tests.reference.conftest import make_resolved, make_workload

REQUESTS, LANES, INITIAL, SLOTS = 16, 4, 2, 4
MAX_INPUT, MAX_OUTPUT = 90, 60
ENGINE = dict(instances=INITIAL, block_size=16, kv_blocks=40, max_running=3, max_tokens=128)
BASE_AUTOSCALER = AutoscalerConfig(policy="threshold", max_replicas=SLOTS, interval_us=10_000)
POOLS = (NodePool(name="a", gpu_type="H100", gpus_per_node=2, initial_nodes=1, max_nodes=2,
                  provisioning_delay=DelaySpec(0.004), cost_per_hour=3.0),
         NodePool(name="b", gpu_type="A100", gpus_per_node=1, initial_nodes=0, max_nodes=1,
                  provisioning_delay=DelaySpec(0.002), cost_per_hour=1.0))


def _envelope():
    rows = [dict(arrival=0, input=MAX_INPUT, output=MAX_OUTPUT, deadline=1 + k)
            for k in range(REQUESTS)]
    return make_workload(rows)


@st.composite
def workloads(draw):
    """Bursts separated by quiet spells, so instances scale up and down."""
    rows, t = [], 0
    for _ in range(REQUESTS):
        t += draw(st.sampled_from([0, 0, 500, 2_000, 30_000, 120_000]))
        rows.append(dict(arrival=t, input=draw(st.integers(8, MAX_INPUT)),
                         output=draw(st.integers(1, MAX_OUTPUT)),
                         deadline=draw(st.one_of(st.just(0), st.integers(t + 1, t + 80_000)))))
    return make_workload(rows)


@st.composite
def autoscalers(draw, max_replicas: int) -> AutoscalerConfig:
    policy = draw(st.sampled_from(["none", "threshold", "target-utilization", "queue-depth",
                                   "blis-saturation"]))
    up = draw(st.sampled_from([0.1, 0.3, 0.6]))
    sat_up = draw(st.sampled_from([0.4, 0.9]))
    return AutoscalerConfig(
        policy=policy, interval_us=draw(st.sampled_from([3_000, 10_000, 40_000])),
        min_replicas=draw(st.integers(0, 2)),
        max_replicas=draw(st.integers(INITIAL, max_replicas)),
        max_scale_up_step=draw(st.integers(0, 2)), max_scale_down_step=draw(st.integers(0, 2)),
        cooldown_us=draw(st.sampled_from([0, 15_000, 100_000])),
        actuation_delay=DelaySpec(draw(st.sampled_from([0.0, 0.002]))),
        drain_policy=draw(st.sampled_from(["wait", "immediate", "redirect"])),
        scale_up_utilization=up, scale_down_utilization=draw(st.sampled_from([0.0, 0.05])),
        target_utilization=draw(st.sampled_from([0.15, 0.4])),
        utilization_tolerance=draw(st.sampled_from([0.0, 0.1])),
        target_queue_depth=draw(st.sampled_from([1.0, 2.5])),
        kv_cache_threshold=draw(st.sampled_from([0.5, 0.8])), saturation_up_threshold=sat_up,
        saturation_down_boundary=draw(st.sampled_from([0.1, 0.3])),
        avg_input_tokens=draw(st.sampled_from([16.0, 100.0])),
        scale_up_window_us=draw(st.sampled_from([0, 8_000])),
        scale_down_window_us=draw(st.sampled_from([0, 20_000])))


@st.composite
def lifecycles(draw) -> LifecycleConfig:
    return LifecycleConfig(
        loading_delay=DelaySpec(draw(st.sampled_from([0.0, 0.005, 0.02]))),
        warm_start_initial_instances=draw(st.sampled_from([True, True, False])),
        warm_up_requests=draw(st.sampled_from([0, 0, 2])),
        warm_up_factor=draw(st.sampled_from([1.0, 1.5])),
        cost_per_hour=draw(st.sampled_from([1.0, 2.5])))


def _base(quirks: bool, pools: bool, latency: str = "blackbox"):
    resolved = make_resolved(quirks=quirks, **ENGINE)
    cfg = dataclasses.replace(resolved.config, latency=LatencyConfig(model="roofline")) \
        if latency == "roofline" else resolved.config
    autoscaler = dataclasses.replace(BASE_AUTOSCALER, max_replicas=0 if pools else SLOTS)
    cluster = dataclasses.replace(cfg.cluster, node_pools=POOLS if pools else ())
    return resolve_config(dataclasses.replace(
        cfg, cluster=cluster, policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler)))


def _lane(base, autoscaler, life):
    cfg = base.config
    return dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler),
        cluster=dataclasses.replace(cfg.cluster, lifecycle=life))


def _check(quirks: bool, pools: bool, data, latency: str = "blackbox") -> None:
    base = _base(quirks, pools, latency)
    # one program for every example: the lanes' own settings compiled in whatever they draw
    static = build_static(base, _envelope(), decode_stretches=True).replace(lane_settings=True)
    assert static.features.lifecycle and static.shapes.num_instances == (5 if pools else SLOTS)
    w = data.draw(workloads(), label="workload")
    assert build_static_shared(base, [_envelope(), w], decode_stretches=True).replace(
        lane_settings=True) == static
    top = static.shapes.num_instances
    configs = []
    for k in range(LANES):
        auto = data.draw(autoscalers(top), label=f"autoscaler {k}")
        if pools:
            auto = dataclasses.replace(auto, max_replicas=0 if k % 2 else auto.max_replicas)
        cfg = _lane(base, auto, data.draw(lifecycles(), label=f"lifecycle {k}"))
        if k % 2:  # settings of the lane's own (admissions and routings to warming instances,
            # a smaller GPU cache in new instances and the saturation autoscaler's supply)
            cfg = dataclasses.replace(cfg, engine=dataclasses.replace(
                cfg.engine, total_kv_blocks=data.draw(st.integers(20, 40))))
            cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(
                cfg.cluster, admission_latency_us=data.draw(st.integers(0, 1500)),
                routing_latency_us=data.draw(st.integers(0, 1500)),
                snapshot_refresh_interval_us=data.draw(st.integers(0, 4000))))
        configs.append(cfg)
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        if want.overflow:  # --blis-quirks ran out of fresh slots: both engines say so
            assert results[k].overflow == want.overflow, k
            continue
        assert first_divergence(want, results[k]) is None, (k, cfg.policy.autoscaler,
                                                             cfg.cluster.lifecycle)


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def room():
    """Room for the drawn examples' program before the first (``room_for_a_program``): the
    mapping guard then never drops it between two examples."""
    room_for_a_program()


@settings(max_examples=8, **_SETTINGS)
@given(data=st.data())
def test_drawn_autoscalers_match_reference(room, data):
    _check(False, False, data)


@pytest.mark.slow
@pytest.mark.parametrize(("quirks", "pools"), [(False, False), (True, False), (False, True),
                                               (True, True)])
@settings(max_examples=80, **_SETTINGS)
@given(data=st.data())
def test_drawn_autoscalers_match_reference_slow(quirks, pools, data):
    _check(quirks, pools, data)


@pytest.mark.slow
@settings(max_examples=30, **_SETTINGS)
@given(data=st.data())
def test_drawn_autoscalers_match_reference_roofline(data):
    """Roofline decode stretches whose step times vary, slowed while instances warm up."""
    _check(False, False, data, "roofline")
