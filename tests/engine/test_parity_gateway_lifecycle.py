"""The gateway queue with instance lifecycles (docs/semantics.md §5.12, Decision 16): requests
held at the gateway count as awaiting routing for the autoscaler's stop rule, the saturation
detectors read the routable instances only, and dispatch ticks interleave with scaling ticks
and actuations (cluster events in the reference's priority order). Each lane of one JAX
population equals its own reference run."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from blisjax.config import (
    AutoscalerConfig,
    DelaySpec,
    GatewayConfig,
    LifecycleConfig,
    resolve_config,
)
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.reference import simulate as reference
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, room_for_a_program
from tests.engine.test_parity_gateway import bursty_rows
from tests.reference.conftest import make_resolved, make_workload

SCALER = AutoscalerConfig(policy="threshold", interval_us=2_000, max_replicas=4,
                          scale_up_utilization=0.2, scale_down_utilization=0.05,
                          drain_policy="redirect", actuation_delay=DelaySpec(0.001))
LIFE = LifecycleConfig(loading_delay=DelaySpec(0.003), warm_start_initial_instances=True)


def _config(gateway: GatewayConfig, scaler: AutoscalerConfig = SCALER, quirks: bool = False):
    cfg = make_resolved(instances=2, quirks=quirks, kv_blocks=60, max_running=3,
                        max_tokens=96).config
    return dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, gateway=gateway, lifecycle=LIFE),
        policy=dataclasses.replace(cfg.policy, autoscaler=scaler))


LANES = [
    _config(GatewayConfig(enabled=True, saturation_detector="utilization",
                          queue_depth_threshold=2.0, kv_cache_util_threshold=0.5,
                          dispatch_tick_interval_us=700)),
    _config(GatewayConfig(enabled=True, saturation_detector="concurrency", max_concurrency=2,
                          dispatch_order="priority", max_queue_depth=6,
                          dispatch_tick_interval_us=1_300),
            dataclasses.replace(SCALER, policy="queue-depth", target_queue_depth=1.0,
                                drain_policy="immediate")),
    _config(GatewayConfig(enabled=True, saturation_detector="never")),
    _config(GatewayConfig(), dataclasses.replace(SCALER, policy="target-utilization",
                                                 target_utilization=0.3)),
]


WORKLOADS = {seed: make_workload(bursty_rows(seed, 40), ("a", "b")) for seed in (3, 11)}


@cache
def _program():
    """One program for both workloads, with room made for it once."""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)
    return build_static_shared(resolve_config(LANES[0]), list(WORKLOADS.values()))


@pytest.mark.parametrize("seed", sorted(WORKLOADS))
def test_gateway_with_lifecycles_matches_reference(seed):
    w = WORKLOADS[seed]
    base = resolve_config(LANES[0])
    static = _program()
    assert static.features.gateway and static.features.lifecycle
    params = stack_params([params_from_config(c, w.tenant_names) for c in LANES])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(LANES):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
        assert results[k].gateway == want.gateway, k
    assert any(r.lifecycle.scale_ups for r in results)
    assert any(r.gateway.dispatched for r in results if r.gateway is not None)
