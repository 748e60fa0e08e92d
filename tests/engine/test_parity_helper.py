"""The parity helper itself (no engine compile): it must report every kind of difference, not
only per-request fields — request counts, the run's shape, overflow on either side, and counters
that disagree with the statuses they count."""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.engine.parity import RequestCounts, count_mismatch, first_divergence, request_counts
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from tests.engine.test_parity import EDGE_ROWS
from tests.reference.conftest import make_resolved, make_workload


def _run():
    # 11 requests on 2 instances; the 1,300 µs deadline of row 5 expires (timed out) and
    # a horizon of 20 ms leaves later requests unfinished.
    resolved = make_resolved(instances=2, horizon_us=20_000)
    return reference(resolved, make_workload(EDGE_ROWS, ("a", "b"), ("g",)))


def test_identical_runs_have_no_divergence():
    run = _run()
    assert first_divergence(run, _run()) is None
    assert count_mismatch(run) is None


def test_request_counts_by_status():
    status = np.array([records.COMPLETED, records.COMPLETED, records.REJECTED, records.TIMED_OUT,
                       records.DROPPED, records.UNFINISHED, records.UNFINISHED], np.int8)
    run = dataclasses.replace(_run(), status=status)
    assert request_counts(run) == RequestCounts(requests=7, completed=2, rejected=1, timed_out=1,
                                                dropped=1, unfinished=2)


def test_overflow_on_either_side_is_a_divergence():
    run = _run()
    flagged = dataclasses.replace(run, overflow={"queue": 2})
    assert first_divergence(run, flagged) == "capacity overflow in the second run: {'queue': 2}"
    assert first_divergence(flagged, run) == "capacity overflow in the first run: {'queue': 2}"


def test_different_request_counts_are_reported_before_fields():
    run = _run()
    shorter = dataclasses.replace(run, **{f: getattr(run, f)[:-1] for f in (
        "status", "instance", "ttft_us", "e2e_us", "scheduling_delay_us", "itl_sum_us",
        "itl_count", "output_tokens_done", "preemptions", "length_capped")})
    assert first_divergence(run, shorter) == "run shape num_requests: 11 vs 10"
    assert first_divergence(run, dataclasses.replace(run, num_instances=3)) == \
        "run shape num_instances: 2 vs 3"
    done = int(np.flatnonzero(run.status == records.COMPLETED)[0])
    one_rejected = run.status.copy()
    one_rejected[done] = records.REJECTED
    want = request_counts(run).completed
    assert first_divergence(run, dataclasses.replace(run, status=one_rejected)) == \
        f"request count completed: {want} vs {want - 1}"


def test_counters_that_disagree_with_statuses_are_caught_on_both_sides():
    run = _run()
    counts = request_counts(run)
    assert counts.completed > 0 and counts.timed_out > 0 and counts.unfinished > 0
    # the same wrong counter on both sides: equal fields, yet not a valid run
    extra = run.completed.copy()
    extra[0] += 1
    wrong = dataclasses.replace(run, completed=extra)
    assert count_mismatch(wrong) == (f"completed counts {counts.completed + 1} requests but "
                                     f"{counts.completed} have that status")
    assert first_divergence(wrong, wrong).startswith(
        "first run's counters disagree with its statuses: completed counts")
    for field, bump in (("timed_out", 1), ("dropped_unservable", 1)):
        changed = getattr(run, field).copy()
        changed[1] += bump
        assert count_mismatch(dataclasses.replace(run, **{field: changed})).startswith(field)
    assert count_mismatch(dataclasses.replace(run, rejected_admission=1)).startswith(
        "rejected_admission + rejected_routing counts 1 requests but 0")
    assert count_mismatch(dataclasses.replace(run, rejected_routing=1)).startswith(
        "rejected_admission + rejected_routing counts 1 requests but 0")
    too_many = run.still_queued.copy()
    too_many[0] = counts.unfinished + 1
    assert "exceed the" in count_mismatch(dataclasses.replace(run, still_queued=too_many))
