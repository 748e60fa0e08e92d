"""load-shed admission in both engines: lanes with different limits (knobs) in one compiled
call, each equal to its reference run (docs/semantics.md §5.3)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np

from blisjax.config import AdmissionConfig
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static_lanes import for_runs
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload

TENANTS = ("a", "b")


def _load_shed_case():
    rng = np.random.default_rng(11)
    rows = [dict(arrival=int(t), input=int(rng.integers(8, 60)), output=int(rng.integers(1, 30)))
            for t in np.sort(rng.integers(0, 20_000, size=40))]
    return (make_resolved(instances=2, kv_blocks=12, max_running=3, refresh_us=700),
            make_workload(rows, tenants=TENANTS))


def _tenant_bucket_case():
    rng = np.random.default_rng(12)
    rows = [dict(arrival=int(t), input=int(rng.integers(8, 60)), output=int(rng.integers(1, 20)),
                 tenant=str(rng.choice(["a", "b"])))
            for t in np.sort(rng.integers(0, 20_000, size=40))]
    return make_resolved(instances=2), make_workload(rows, tenants=TENANTS)


@cache
def _program():
    """Both tests' program: eight lanes, each with its own KV blocks, running cap and snapshot
    refresh interval (``static_lanes.for_runs``)."""
    return for_runs([_load_shed_case(), _tenant_bucket_case()])


def _rejections_per_lane(base, workload, admissions) -> list[int]:
    """One lane per ``AdmissionConfig`` in one compiled call; each lane must equal its
    reference run. Returns each lane's rejected requests."""
    configs = [dataclasses.replace(base.config, policy=dataclasses.replace(
        base.config.policy, admission=adm)) for adm in admissions]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    results = simulate_population(base, workload, params, static=_program())
    rejected = []
    for config, got in zip(configs, results, strict=True):
        want = reference(dataclasses.replace(base, config=config), workload)
        assert first_divergence(want, got) is None, config.policy.admission
        rejected.append(int(np.sum(want.status == records.REJECTED)))
    return rejected


def test_load_shed_lanes_match_reference_runs():
    base, workload = _load_shed_case()
    limits = [(0, 0.0), (1, 0.0), (3, 0.0), (0, 0.3), (0, 0.7), (2, 0.5), (5, 0.9), (1, 0.2)]
    rejected = _rejections_per_lane(base, workload, [
        AdmissionConfig(policy="load-shed", shed_queue_depth=q, shed_kv_utilization=kv)
        for q, kv in limits])
    assert rejected[0] == 0 and max(rejected) > 0 and len(set(rejected)) > 3  # limits bite


def test_tenant_bucket_lanes_match_reference_runs():
    """tenant-bucket with per-lane capacities and refills for two tenants, one compiled call;
    each lane equals its reference run."""
    base, workload = _tenant_bucket_case()
    buckets = [({"a": 200.0}, {"a": 5_000.0}, 100.0, 1_000.0), ({}, {}, 10_000.0, 1_000.0),
               ({"b": 50.0}, {}, 300.0, 20_000.0), ({"a": 0.0}, {"b": 0.0}, 150.0, 0.0),
               ({"b": 400.0}, {"b": 2_000.0}, 60.0, 500.0), ({}, {"a": 50.0}, 1_000.0, 300.0),
               ({"a": 30.0, "b": 3_000.0}, {}, 200.0, 8_000.0), ({}, {}, 40.0, 40_000.0)]
    rejected = _rejections_per_lane(base, workload, [
        AdmissionConfig(policy="tenant-bucket", tenant_bucket_capacity=cap,
                        tenant_bucket_refill_rate=rate, default_tenant_bucket_capacity=dcap,
                        default_tenant_bucket_refill_rate=drate)
        for cap, rate, dcap, drate in buckets])
    assert rejected[1] == 0 and len(set(rejected)) > 2  # the buckets bite, differently
