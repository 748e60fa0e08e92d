"""The gateway queue (BLIS's flow control, docs/semantics.md §5.12) in both engines: a
population of random policies, each with a random gateway (detector, thresholds, dispatch
order, a small max depth, tick period; some lanes without flow control) on a bursty workload
of mixed SLO classes, each lane equal to its own reference run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import GatewayConfig, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.engine.static_lanes import for_lanes
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from blisjax.workload.types import SLO_CLASSES
from tests.engine.conftest import edge_engine, room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.engine.test_parity_lane_settings import random_settings
from tests.reference.conftest import make_workload


def bursty_rows(seed: int, count: int = 30) -> list[dict]:
    """Bursts of arrivals on a 250 µs grid (equal times common), every SLO class, prompts of
    4–60 tokens, 1–10 outputs, a few deadlines."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        rows.append(dict(arrival=int(rng.integers(0, 40)) * 250, input=int(rng.integers(4, 61)),
                         output=int(rng.integers(1, 11)), tenant=str(rng.choice(["a", "b"])),
                         slo=str(rng.choice(SLO_CLASSES)),
                         deadline=int(rng.integers(20, 60)) * 1000 if rng.random() < 0.15
                         else 0))
    rows.sort(key=lambda r: r["arrival"])
    for r in rows:
        if r["deadline"]:
            r["deadline"] += r["arrival"]
    return rows


def random_gateways(count: int, seed: int) -> list[tuple[GatewayConfig, bool]]:
    """(gateway, blis_quirks) per lane; every fifth lane without flow control."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        gw = GatewayConfig(
            enabled=k % 5 != 4,
            saturation_detector=str(rng.choice(["never", "utilization", "concurrency"],
                                               p=[0.2, 0.4, 0.4])),
            queue_depth_threshold=float(rng.choice([0.5, 1.0, 2.5])),
            kv_cache_util_threshold=float(rng.uniform(0.05, 0.6)),
            max_concurrency=int(rng.integers(1, 4)),
            dispatch_order=str(rng.choice(["fifo", "priority"])),
            max_queue_depth=int(rng.choice([0, 0, 2, 5])),
            dispatch_tick_interval_us=int(rng.choice([250, 1000, 1700])))
        out.append((gw, bool(rng.random() < 0.3)))
    return out


@pytest.fixture(scope="module")
def gateway_population():
    room_for_a_program()
    base = edge_engine(instances=3)
    workload = make_workload(bursty_rows(11), ("a", "b"))
    configs = []
    policies = _random_policy_configs(base.config, workload.tenant_names, 16, seed=19)
    rng = np.random.default_rng(29)
    for k, (cfg, (gw, quirks)) in enumerate(zip(policies, random_gateways(16, seed=23),
                                                strict=True)):
        if k % 2:  # settings of the lane's own: the dispatched requests' routing latency
            cfg = random_settings(cfg, rng)
        configs.append(dataclasses.replace(
            cfg, cluster=dataclasses.replace(cfg.cluster, gateway=gw),
            compat=dataclasses.replace(cfg.compat, blis_quirks=quirks)))
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    # the base has no gateway: a lane's flow control compiles it in (``for_lanes``)
    static = for_lanes(build_static(base, workload).replace(cache_scorers=True),
                       params)
    assert static.features.gateway
    lanes = simulate_population(base, workload, params, static=static, lane_block=8)
    return workload, configs, lanes


def test_gateway_population_lanes_match_reference_runs(gateway_population):
    workload, configs, lanes = gateway_population
    held = rejected = unfinished = 0
    for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
        want = reference(resolve_config(cfg), workload)
        assert first_divergence(want, got, workload.request_id) is None, k
        if want.gateway is not None:
            held += want.gateway.wait_sum_us > 0
            rejected += want.gateway.rejected
            unfinished += want.gateway.queue_depth
        else:
            assert not cfg.cluster.gateway.enabled
    # the scenario reaches what it is for: requests held at the gateway, and refused by a
    # full queue, in several lanes
    assert held >= 4 and rejected > 0, (held, rejected, unfinished)


def test_gateway_lanes_report_counters(gateway_population):
    _, configs, lanes = gateway_population
    for cfg, got in zip(configs, lanes, strict=True):
        assert (got.gateway is not None) == cfg.cluster.gateway.enabled
        if got.gateway is not None:
            n = got.num_requests
            done = int(np.sum(got.status != records.REJECTED)) - got.gateway.queue_depth
            assert got.gateway.dispatched <= n and got.gateway.dispatched >= 0
            assert got.gateway.dispatched <= done
