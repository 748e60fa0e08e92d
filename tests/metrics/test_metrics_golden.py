"""BLIS golden cases: rebuild a RunResult from BLIS's per-request output and compare metrics.

The golden files give every completed request's TTFT, E2E and token counts, so the TTFT/E2E
means and percentiles, counts and throughputs can be checked; ITL entries and scheduling delays
are not in the files. The comparison is exact: the percentile expression is BLIS's, bit for bit.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from blisjax.metrics.aggregate import aggregate_metrics
from tests.paths import GOLDEN_CASES, GOLDEN_DIR, golden_case

GOLDEN_FILES = [str(golden_case(n)) for n in GOLDEN_CASES]

CHECKED_KEYS = (
    "instance_id",
    "completed_requests",
    "still_queued",
    "still_running",
    "injected_requests",
    "total_input_tokens",
    "total_output_tokens",
    "vllm_estimated_duration_s",
    "responses_per_sec",
    "tokens_per_sec",
    "e2e_mean_ms",
    "e2e_p90_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "ttft_mean_ms",
    "ttft_p90_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "preemption_count",
    "dropped_unservable",
    "length_capped_requests",
    "timed_out_requests",
)


def test_golden_files_present():
    missing = [p for p in GOLDEN_FILES if not os.path.isfile(p)]
    assert not missing, f"BLIS golden cases missing from {GOLDEN_DIR}: {missing}"


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=os.path.basename)
def test_golden_case_metrics(path, make_workload, make_result):
    with open(path) as fh:
        case = json.load(fh)
    want = case["metrics"]
    rows = case["results"]
    n = len(rows)
    # SimEndedTime is an integer number of µs; BLIS printed it divided by 1e6.
    sim_ended_us = round(want["vllm_estimated_duration_s"] * 1e6)
    workload = make_workload(
        n,
        request_id=[r["request_id"] for r in rows],
        input_tokens=[r["input_tokens"] for r in rows],
        output_tokens=[r["output_tokens"] for r in rows],
    )
    result = make_result(
        n,
        ttft_us=[r["ttft_us"] for r in rows],
        e2e_us=[r["e2e_us"] for r in rows],
        scheduling_delay_us=[0] * n,
        output_tokens_done=[r["output_tokens"] for r in rows],
        total_input_tokens=[sum(r["input_tokens"] for r in rows)],
        sim_ended_us=sim_ended_us,
        itl_entries_us=np.array([1], dtype=np.int64),
    )
    got = aggregate_metrics(result, workload)
    mismatches = {k: (got[k], want[k]) for k in CHECKED_KEYS if got[k] != want[k]}
    assert not mismatches, f"{case['case']}: (ours, BLIS) = {mismatches}"
    # Tolerance view of the same check, as the engines' end-to-end tests state it.
    for key in CHECKED_KEYS:
        if isinstance(want[key], float):
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=0.0), key
