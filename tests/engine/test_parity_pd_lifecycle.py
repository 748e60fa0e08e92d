"""P/D pools with instance lifecycles (docs/autoscaling.md "P/D pools"): each pool scaled on
its own into slots of its role, pool routing among the routable instances (a request finding
none rejected, at its decode or its prefill routing), a draining decode instance waiting for
the requests bound for it, prefill sub-requests timing out. Each lane of one JAX population
equals its own reference run, lifecycle counters and timeline included."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import AutoscalerConfig, DelaySpec, LifecycleConfig, resolve_config
from blisjax.config.codes import InstanceState
from blisjax.config.pd import PDConfig
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.metrics.records import COMPLETED, DROPPED, TIMED_OUT
from blisjax.reference import simulate as reference
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, room_for_a_program
from tests.engine.test_parity_gateway import bursty_rows
from tests.engine.test_parity_pd_pools import _config as own_pools_config
from tests.engine.test_parity_pd_pools import _workload as own_pools_workload
from tests.reference.conftest import make_resolved, make_workload

PD = PDConfig(prefill_instances=1, decode_instances=2, decider="always",
              transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)
SCALER = AutoscalerConfig(policy="queue-depth", interval_us=2_000, max_replicas=3,
                          target_queue_depth=1.0, cooldown_us=3_000,
                          actuation_delay=DelaySpec(0.0005))
LIFE = LifecycleConfig(loading_delay=DelaySpec(0.002))


def _config(pd: PDConfig = PD, scaler: AutoscalerConfig = SCALER,
            life: LifecycleConfig = LIFE):
    cfg = make_resolved(instances=pd.pooled_instances, kv_blocks=60, max_running=3,
                        max_tokens=96).config
    return dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, pd=pd, lifecycle=life),
        policy=dataclasses.replace(cfg.policy, autoscaler=scaler))


LANES = [
    _config(),
    # the other split grows into the same six slots: prefill, prefill, decode, then P, D, D
    _config(dataclasses.replace(PD, prefill_instances=2, decode_instances=1,
                                decider="prefix-threshold", prefix_threshold_tokens=16)),
    _config(scaler=dataclasses.replace(SCALER, policy="threshold", scale_up_utilization=0.2,
                                       scale_down_utilization=0.05, min_replicas=1)),
    _config(scaler=dataclasses.replace(SCALER, policy="blis-saturation", kv_cache_threshold=0.5,
                                       saturation_up_threshold=0.6,
                                       saturation_down_boundary=0.2, scale_up_window_us=2_000)),
    # cold instances: requests before 2 ms find no routable decode instance
    _config(scaler=AutoscalerConfig(),
            life=LifecycleConfig(loading_delay=DelaySpec(0.002),
                                 warm_start_initial_instances=False)),
    # the prefill pool drains its only routable instance while its new one loads (6 ms):
    # requests in between are rejected at their prefill routing
    _config(scaler=dataclasses.replace(SCALER, cooldown_us=0, target_queue_depth=0.5,
                                       interval_us=1_000),
            life=LifecycleConfig(loading_delay=DelaySpec(0.006))),
]
#: a request (320 tokens in, deadline 2 ms) bound for decode instance 1, which drains at
#: 0.5 ms; it times out during its prefill and instance 1 terminates then (as
#: tests/reference/test_pd_autoscaling.py's hand case); 39 short ones follow from 50 ms
ABANDONED = _config(scaler=dataclasses.replace(SCALER, interval_us=1_000, cooldown_us=0))
WORKLOADS = {"bursty": make_workload(bursty_rows(2, 40), ("a", "b")),
             "abandoned": make_workload(
                 [dict(arrival=0, input=320, output=3, deadline=2000)]
                 + [dict(arrival=50_000 + 300 * k, input=40, output=4) for k in range(39)],
                 ("a", "b"))}


@pytest.fixture(scope="module")
def static():
    """One program for both workloads (kept between the two tests: lifecycles beside P/D
    pools keep many memory mappings, ``room_for_a_program``)."""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)
    st = build_static_shared(resolve_config(LANES[0]), list(WORKLOADS.values()))
    assert st.features.pd and st.features.lifecycle and st.scaling_groups == 2
    assert st.shapes.num_instances == 6
    return st


def _population(configs, w, static):
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    results = simulate_population(resolve_config(configs[0]), w, params, static=static)
    wants = [reference(resolve_config(cfg), w) for cfg in configs]
    for k, want in enumerate(wants):
        assert first_divergence(want, results[k]) is None, k
    return wants


def test_pd_pools_with_lifecycles_match_reference(static):
    wants = _population(LANES, WORKLOADS["bursty"], static)
    # the lanes exercise what they are for
    assert all(want.lifecycle.scale_ups and want.lifecycle.scale_downs for want in wants[:4])
    assert wants[4].lifecycle.scale_ups == 0 and wants[4].rejected_routing > 0
    assert wants[5].rejected_routing > 0
    assert any((want.status == TIMED_OUT).any() for want in wants)


def test_a_draining_instance_ends_when_its_bound_request_fails(static):
    # the other lanes too: a population of the same size runs the same compiled program
    want = _population([ABANDONED, *LANES[1:]], WORKLOADS["abandoned"], static)[0]
    assert want.status[0] == TIMED_OUT
    life = want.lifecycle
    changes = list(zip(life.timeline_us.tolist(), life.timeline_slot.tolist(),
                       life.timeline_state.tolist(), strict=True))
    assert changes[3:5] == [(500, 1, InstanceState.DRAINING), (2000, 1, InstanceState.TERMINATED)]


def test_pools_of_their_own_settings_with_lifecycles_match_reference():
    """A TP-2 prefill pool (its own KV cache and speed) and an A100-80 decode pool, each of
    one instance growing to two, roofline: blis-saturation reads each slot's own capacity,
    the queue-depth lane scales on load; each lane equals its own reference run, slot by
    slot."""
    scalers = [dataclasses.replace(SCALER, max_replicas=2, policy="blis-saturation",
                                   kv_cache_threshold=0.001, saturation_up_threshold=0.002,
                                   saturation_down_boundary=0.001),
               dataclasses.replace(SCALER, max_replicas=2, target_queue_depth=0.5)]
    configs = []
    for scaler in scalers:
        cfg = own_pools_config(decode_instances=1, shared_instances=0)
        configs.append(dataclasses.replace(
            cfg, policy=dataclasses.replace(cfg.policy, autoscaler=scaler),
            cluster=dataclasses.replace(cfg.cluster, lifecycle=LIFE, num_instances=2)))
    w = own_pools_workload()
    base = resolve_config(configs[0])
    static = build_static(base, w)
    assert static.settings.instance_rows == (1, 2, 1, 2) and static.scaling_groups == 2
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
        assert want.lifecycle.scale_ups > 0, k
    assert list(results[0].kv_total_blocks) == [22059, 508, 22059, 508]


def test_a_completed_prefills_pending_timeout_is_the_last_event():
    """Hand case: 1 prefill and 1 decode instance of 10 blocks of 16 tokens, priced (a
    lifecycle without an autoscaler). Request 0 (100 tokens in, 40 out) decodes on the decode
    instance, holding 7 of its blocks; request 1 (60 tokens, deadline 1 s) completes its
    prefill at 4.6 ms, and its transfer finds 3 free blocks for the 4 its prompt needs: it is
    dropped at the decode side. Its prefill sub-request's timeout stays pending on the prefill
    instance (lazily cancelled) and comes up at 1 s, the run's last event: both instances are
    held 1 s, not until request 0 completes (45.5 ms)."""
    cfg = make_resolved(instances=2, kv_blocks=10, max_running=4, max_tokens=256).config
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, pd=PDConfig(prefill_instances=1, decode_instances=1, decider="always"),
        lifecycle=LifecycleConfig(cost_per_hour=2.0)))
    resolved = resolve_config(cfg)
    w = make_workload([dict(arrival=0, input=100, output=40),
                       dict(arrival=3000, input=60, output=3, deadline=1_000_000)])
    want = reference(resolved, w)
    assert list(want.status) == [COMPLETED, DROPPED] and want.pd.dropped_at_decode_kv == 1
    assert want.sim_ended_us < 50_000
    assert list(want.lifecycle.replica_us) == [1_000_000, 1_000_000]
    got = simulate_population(resolved, w, stack_params([params_from_config(cfg, ("",))]),
                              static=build_static(resolved, w))[0]
    assert first_divergence(want, got) is None
