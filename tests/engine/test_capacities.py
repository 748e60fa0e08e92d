"""Each fixed capacity of the JAX engine, when exceeded, is flagged in ``RunResult.overflow``
(and the run's counters stay non-negative), never silently wrong.

All four workloads below have the same size, so with the same lowered capacities they share one
compiled program; each exceeds exactly one capacity. Blackbox model with step time
1000 + 10·prefill + 100·decode µs and no α delay (routing and enqueue at the same
microsecond, routing first).
"""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import count_mismatch
from blisjax.engine.static import build_static, build_static_shared
from tests.reference.conftest import make_resolved, make_workload

REQUESTS = 6
# The lowered capacities: 3 wait-queue slots, 2 pending slots, 2 requests per deadline
# microsecond, 3 blocks of 4 tokens per request (prompt + output + 1 <= 12 tokens).
LOW = dict(queue_slots=3, pending_slots=2, deadline_window=2, max_blocks_per_request=3)
LATE = 1_000_000  # arrivals after the earlier requests have finished (nothing queued)


def _rows_queue():
    # one running slot, arrivals 1 µs apart: r0 runs, r1..r5 wait -> 5 > 3 queue slots
    return [dict(arrival=k, input=6, output=2) for k in range(REQUESTS)]


def _rows_pending():
    # three arrivals in the same microsecond are all routed before any is enqueued -> 3 > 2
    return [dict(arrival=0, input=6, output=2) for _ in range(3)] + \
        [dict(arrival=LATE * (k + 1), input=6, output=2) for k in range(REQUESTS - 3)]


def _rows_deadline():
    # three requests share the deadline 5,000 µs -> 3 > 2 in one deadline microsecond
    return [dict(arrival=k, input=6, output=2, deadline=5_000) for k in range(3)] + \
        [dict(arrival=LATE * (k + 1), input=6, output=2) for k in range(REQUESTS - 3)]


def _rows_blocks():
    # a 20-token prompt needs 5 blocks of 4 tokens -> 5 > 3 block-table entries
    return [dict(arrival=0, input=20, output=2)] + \
        [dict(arrival=LATE * (k + 1), input=6, output=2) for k in range(REQUESTS - 1)]


# Overflows counted by hand: the queue turns away r4 and r5; the pending window the third
# simultaneous arrival. (The deadline window counts the events at which it overflowed, the
# block table every block it could not record.)
EXACT = {"queue": 2, "pending": 1}
WORKLOADS = {"queue": _rows_queue, "pending": _rows_pending, "deadline": _rows_deadline,
             "blocks": _rows_blocks}


@pytest.fixture(scope="module")
def lowered():
    resolved = make_resolved(block_size=4, kv_blocks=64, max_running=1)
    workloads = {name: make_workload(rows()) for name, rows in WORKLOADS.items()}
    static = build_static_shared(resolved, list(workloads.values())).replace(**LOW)
    params = stack_params([params_from_config(resolved.config, ("",))])
    return {name: simulate_population(resolved, w, params, static=static)[0]
            for name, w in workloads.items()}


@pytest.mark.parametrize("capacity", sorted(WORKLOADS))
def test_each_capacity_is_flagged_when_exceeded(lowered, capacity):
    result = lowered[capacity]
    assert set(result.overflow) == {capacity} and result.overflow[capacity] > 0
    assert result.overflow[capacity] == EXACT.get(capacity, result.overflow[capacity])
    assert count_mismatch(result) is None  # the counters still count the statuses
    for field in ("completed", "still_queued", "still_running", "timed_out", "cache_hits",
                  "cache_misses", "peak_kv_blocks_used", "step_count"):
        assert np.all(np.asarray(getattr(result, field)) >= 0), field


def test_default_capacities_hold_the_workloads():
    # The defaults are upper bounds for the queue, pending window and block table; the
    # deadline window (8) holds the three requests sharing a deadline.
    resolved = make_resolved(block_size=4, kv_blocks=64, max_running=1)
    for name, rows in WORKLOADS.items():
        st = build_static(resolved, make_workload(rows()))
        assert st.shapes.queue_slots == REQUESTS and st.shapes.deadline_window == 8, name
    assert build_static(resolved, make_workload(_rows_pending())).shapes.pending_slots >= 3
    assert build_static(resolved, make_workload(_rows_blocks())).shapes.max_blocks_per_request == 6
    assert build_static(resolved, make_workload(_rows_blocks()),
                        max_blocks_per_request=9).shapes.max_blocks_per_request == 9
    with pytest.raises(ValueError, match="max_blocks_per_request must be an integer >= 1"):
        build_static(resolved, make_workload(_rows_blocks()), max_blocks_per_request=0)
