"""The load-shed admission template, computed by hand (docs/semantics.md §5.3)."""

from __future__ import annotations

import pytest

from blisjax.config import AdmissionConfig, ConfigError
from blisjax.metrics.records import COMPLETED, REJECTED
from blisjax.reference import simulate
from tests.reference.conftest import make_resolved, make_workload


def test_a_full_queue_sheds_the_next_request():
    """One running request at a time. r0 (t = 0) runs at once; r1 (100 µs) and r2 (200 µs)
    find 0 and 1 requests queued, below the limit of 2, and wait; r3 (300 µs) finds 2 and is
    rejected. Without a limit all four complete."""
    rows = [dict(arrival=t, input=10, output=5) for t in (0, 100, 200, 300)]
    shed = AdmissionConfig(policy="load-shed", shed_queue_depth=2)
    result = simulate(make_resolved(max_running=1, admission=shed), make_workload(rows))
    assert result.status.tolist() == [COMPLETED, COMPLETED, COMPLETED, REJECTED]
    assert result.rejected_admission == 1
    free = AdmissionConfig(policy="load-shed")
    result = simulate(make_resolved(max_running=1, admission=free), make_workload(rows))
    assert result.status.tolist() == [COMPLETED] * 4


def test_a_full_kv_cache_sheds_until_it_empties():
    """4 KV blocks of 16 tokens. r0's 40-token prompt takes 3 blocks at its first step (t = 0):
    utilization 0.75, not below 0.5, so r1 (100 µs) is rejected; r0 completes with its second
    output token (steps of 1,400 and 1,100 µs) and releases its blocks, so r2 (5,000 µs) is
    admitted."""
    rows = [dict(arrival=0, input=40, output=2), dict(arrival=100, input=8, output=2),
            dict(arrival=5000, input=8, output=2)]
    shed = AdmissionConfig(policy="load-shed", shed_kv_utilization=0.5)
    result = simulate(make_resolved(kv_blocks=4, admission=shed), make_workload(rows))
    assert result.status.tolist() == [COMPLETED, REJECTED, COMPLETED]


@pytest.mark.parametrize(("field", "value"), [("shed_queue_depth", -1),
                                              ("shed_kv_utilization", 1.5)])
def test_limits_out_of_range_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"policy.admission.{field}"):
        AdmissionConfig(policy="load-shed", **{field: value})


def test_each_tenant_spends_its_own_bucket():
    """tenant-bucket, cost = input tokens. Tenant a's bucket holds 100 tokens, b's the default
    30, neither refills. a's 60-token request at 0 leaves it 40, so a's second (60 tokens,
    10 µs) is rejected; b's 30-token requests at 20 and 30 µs: the first empties b's bucket,
    the second is rejected — a's 40 left do not help b."""
    rows = [dict(arrival=0, input=60, tenant="a"), dict(arrival=10, input=60, tenant="a"),
            dict(arrival=20, input=30, tenant="b"), dict(arrival=30, input=30, tenant="b")]
    adm = AdmissionConfig(policy="tenant-bucket", tenant_bucket_capacity={"a": 100},
                          default_tenant_bucket_capacity=30, default_tenant_bucket_refill_rate=0)
    result = simulate(make_resolved(admission=adm), make_workload(rows, tenants=("a", "b")))
    assert result.status.tolist() == [COMPLETED, REJECTED, COMPLETED, REJECTED]


def test_a_tenant_bucket_refills_at_its_own_rate():
    """Tenant a refills 1,000,000 tokens/s (1 per µs) from empty after its 50-token request at
    0: at 30 µs it holds 30 (< 40: rejected), at 100 µs min(50, 100) = 50 (admitted)."""
    rows = [dict(arrival=0, input=50, tenant="a"), dict(arrival=30, input=40, tenant="a"),
            dict(arrival=100, input=40, tenant="a")]
    adm = AdmissionConfig(policy="tenant-bucket", tenant_bucket_capacity={"a": 50},
                          tenant_bucket_refill_rate={"a": 1_000_000})
    result = simulate(make_resolved(admission=adm), make_workload(rows, tenants=("a",)))
    assert result.status.tolist() == [COMPLETED, REJECTED, COMPLETED]
