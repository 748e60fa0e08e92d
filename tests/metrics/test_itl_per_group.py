"""Each SLO class's and tenant's own ITL distribution, from the requests of its ITL entries
(``RunResult.itl_entry_request``), computed by hand."""

from __future__ import annotations

import numpy as np

from blisjax.metrics import aggregate_metrics
from blisjax.reference import simulate
from tests.reference.conftest import make_resolved, make_workload


def test_itl_percentiles_per_class_come_from_the_class_s_own_entries():
    """Step = 1000 + 10·prefill + 100·decode µs. Both prompts (10 tokens) prefill together
    (1,200 µs), then both decode: 1,200 µs a step while both run. The critical request (3
    outputs) finishes after two decode steps: entries [1200, 1200]. The standard one (5
    outputs) decodes twice more alone, 1,100 µs each: [1200, 1200, 1100, 1100], whose p50 is
    1,150 µs and p90 1,200 µs (BLIS's linear interpolation)."""
    w = make_workload([dict(arrival=0, input=10, output=3, slo="critical"),
                       dict(arrival=0, input=10, output=5, slo="standard")])
    result = simulate(make_resolved(), w)
    entries = zip(result.itl_entry_request.tolist(), result.itl_entries_us.tolist(), strict=True)
    assert sorted(entries) == [(0, 1200), (0, 1200), (1, 1100), (1, 1100), (1, 1200), (1, 1200)]
    groups = aggregate_metrics(result, w)["per_slo_class"]
    assert groups["critical"]["itl_p50_ms"] == 1.2
    assert groups["critical"]["itl_p99_p50_ratio"] == 1.0
    assert np.isclose(groups["standard"]["itl_p50_ms"], 1.15)
    assert np.isclose(groups["standard"]["itl_p90_ms"], 1.2)
    assert np.isclose(groups["standard"]["itl_p99_p50_ratio"], 1200 / 1150)
