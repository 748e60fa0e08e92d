"""Builders for small, hand-checkable reference-engine scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.config import (
    AdmissionConfig,
    ClusterConfig,
    CompatConfig,
    EngineConfig,
    GatewayConfig,
    LatencyConfig,
    MetricsConfig,
    PolicyConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
    SimConfig,
    resolve_config,
)
from blisjax.reference import ClusterSimulator
from blisjax.workload.types import SLO_CLASS_CODE, Workload

# Easy-to-add-up blackbox model: step = 1000 + 10·prefill tokens + 100·decode tokens (µs).
BETA = (1000.0, 10.0, 100.0)
ALPHA0 = (0.0, 0.0, 0.0)


def make_resolved(*, instances=1, alpha=ALPHA0, beta=BETA, kv_blocks=10_000, block_size=16,
                  max_running=256, max_tokens=2048, threshold=0, max_model_len=0,
                  admission=None, priority=None, routing=None, scheduler="fcfs",
                  preemption="fcfs", refresh_us=0, horizon_us=2**63 - 1, prefix_caching=True,
                  admission_latency_us=0, routing_latency_us=0, cache_delay_us=0,
                  cpu_blocks=0, transfer_bandwidth=100.0, transfer_base_us=0, quirks=False,
                  thrash_window_us=1_000_000, gateway=None):
    cfg = SimConfig(
        engine=EngineConfig(
            max_num_running_reqs=max_running, max_num_scheduled_tokens=max_tokens,
            block_size_tokens=block_size, total_kv_blocks=kv_blocks,
            long_prefill_token_threshold=threshold, max_model_len=max_model_len,
            enable_prefix_caching=prefix_caching, preemption_policy=preemption,
            kv_cpu_blocks=cpu_blocks, kv_transfer_bandwidth=transfer_bandwidth,
            kv_transfer_base_latency_us=transfer_base_us),
        latency=LatencyConfig(model="blackbox", alpha_coeffs=tuple(alpha), beta_coeffs=tuple(beta)),
        cluster=ClusterConfig(num_instances=instances, snapshot_refresh_interval_us=refresh_us,
                              admission_latency_us=admission_latency_us,
                              routing_latency_us=routing_latency_us,
                              cache_signal_delay_us=cache_delay_us,
                              gateway=gateway or GatewayConfig()),
        policy=PolicyConfig(admission=admission or AdmissionConfig(),
                            priority=priority or PriorityConfig(),
                            routing=routing or RoutingConfig(),
                            scheduler=SchedulerConfig(policy=scheduler)),
        horizon_us=horizon_us,
        compat=CompatConfig(blis_quirks=quirks),
        metrics=MetricsConfig(kv_thrash_window_us=thrash_window_us),
    )
    return resolve_config(cfg)


def make_workload(rows: list[dict], tenants=("",), groups=()) -> Workload:
    """rows: dicts with arrival, input, output and optional group, prefix, tenant, slo, deadline."""
    def col(key, default):
        return np.array([r.get(key, default) for r in rows], dtype=np.int64)

    return Workload(
        request_id=np.arange(len(rows)),
        arrival_us=col("arrival", 0),
        input_tokens=col("input", 1),
        output_tokens=col("output", 1),
        prefix_group=col("group", -1),
        prefix_length=col("prefix", 0),
        tenant=np.array([tenants.index(r.get("tenant", tenants[0])) for r in rows]),
        client=np.zeros(len(rows)),
        slo_class=np.array([SLO_CLASS_CODE[r.get("slo", "")] for r in rows]),
        deadline_us=col("deadline", 0),
        tenant_names=tuple(tenants),
        prefix_group_names=tuple(groups),
    )


def run(rows, *, tenants=("",), groups=(), check=True, **cfg):
    sim = ClusterSimulator(make_resolved(**cfg), make_workload(rows, tenants, groups),
                           check_invariants=check)
    return sim.run(), sim


@pytest.fixture
def scenario():
    return run
