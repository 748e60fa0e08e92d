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
