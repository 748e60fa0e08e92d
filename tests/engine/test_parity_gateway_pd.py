"""The gateway queue with P/D pools (docs/semantics.md §5.10, §5.12): requests wait at the
gateway, are dispatched to routing in dispatch order (not in row order), and a disaggregated
request's prefill routing follows the routings of its time in that order. Each drawn example is
a population of lanes with their own pools (test_parity_pd's strategies) and their own gateway
(test_parity_gateway's), every lane equal to its own reference run; all examples share one
program. The default tier runs a few examples without ``--blis-quirks``; the slow tier more, in
both modes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.engine.static_lanes import for_lanes
from blisjax.reference import simulate as reference
from tests.engine.test_parity_gateway import random_gateways
from tests.engine.test_parity_pd import _base, _envelope, lanes, workloads

LANES = 8


def _program(base, params):
    """The program every test here runs: the envelope's shapes, each lane's own settings
    (the drawn lanes have settings of their own), what the lanes add (the gateway)."""
    return for_lanes(build_static(base, _envelope(), decode_stretches=True, lane_settings=True),
                     params)


def _check(quirks: bool, data) -> None:
    base = _base(quirks)
    w = data.draw(workloads(), label="workload")
    gateways = random_gateways(LANES, seed=data.draw(st.integers(0, 10_000), label="gateways"))
    configs = []
    for k, (gateway, _) in enumerate(gateways):
        cfg = data.draw(lanes(base.config), label=f"lane {k}")
        configs.append(dataclasses.replace(cfg, cluster=dataclasses.replace(
            cfg.cluster, gateway=gateway)))
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    static = _program(base, params)
    assert static.features.gateway and static.features.pd
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, (k, cfg.cluster.gateway,
                                                            cfg.cluster.pd)
        assert want.gateway == results[k].gateway, k


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=8, **_SETTINGS)
@given(data=st.data())
def test_gateway_with_pools_matches_reference(data):
    _check(False, data)


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
@settings(max_examples=80, **_SETTINGS)
@given(data=st.data())
def test_gateway_with_pools_matches_reference_slow(quirks, data):
    _check(quirks, data)


def test_prefill_routings_follow_the_dispatch_order():
    """Twelve one-token requests at once (eight at 0 µs, four at 1 µs) wait at a FIFO gateway
    whose utilization detector lets a few through per tick; every request is disaggregated.
    Routings, and so prefill routings, come in dispatch order, which here is the rows' order:
    the first tokens come in that order, and the JAX lane equals the reference run."""
    from blisjax.config import GatewayConfig, PDConfig, RoutingConfig
    from tests.reference.conftest import make_workload

    base = _base(False)
    rows = [dict(arrival=0 if k < 8 else 1, input=1, output=0, group=-1, prefix=0)
            for k in range(12)]
    w = make_workload(rows, groups=("g0", "g1"))
    cfg = dataclasses.replace(
        base.config,
        policy=dataclasses.replace(base.config.policy, routing=RoutingConfig("round-robin")),
        cluster=dataclasses.replace(
            base.config.cluster,
            pd=PDConfig(prefill_instances=1, decode_instances=1, decider="always",
                        transfer_bandwidth_gbps=0.5, transfer_base_latency_ms=0.0),
            gateway=GatewayConfig(enabled=True, saturation_detector="utilization",
                                  queue_depth_threshold=0.5, kv_cache_util_threshold=0.2,
                                  max_concurrency=2, dispatch_order="fifo",
                                  dispatch_tick_interval_us=250)))
    # the lane LANES times: the drawn populations' program, shapes and lane block
    params = stack_params([params_from_config(cfg, ("",))] * LANES)
    static = _program(base, params)
    got = simulate_population(base, w, params, static=static)[0]
    want = reference(resolve_config(cfg), w)
    ttft = want.ttft_us.tolist()
    assert ttft == sorted(ttft) and ttft[0] < ttft[-1], ttft
    assert want.gateway.wait_sum_us > 0 and want.gateway.dispatched == 12
    assert first_divergence(want, got) is None
