"""Compare two ``RunResult``s request by request: the engines must agree bit for bit."""

from __future__ import annotations

import numpy as np

#: Per-request fields compared, in reporting order.
REQUEST_FIELDS = ("status", "instance", "scheduling_delay_us", "ttft_us", "e2e_us", "itl_sum_us",
                  "itl_count", "output_tokens_done", "preemptions", "length_capped")
#: Run-level fields compared.
RUN_FIELDS = ("sim_ended_us", "cache_hits", "cache_misses", "preemption_count", "still_queued",
              "still_running", "dropped_unservable", "timed_out", "length_capped_count",
              "completed", "total_input_tokens", "rejected_admission", "busy_time_us",
              "queue_depth_time_us", "step_count", "peak_kv_blocks_used", "itl_entries_us")


def first_divergence(a, b, request_ids=None) -> str | None:
    """None if identical; otherwise a sentence naming the first differing request and field."""
    n = a.num_requests
    for i in range(n):
        for f in REQUEST_FIELDS:
            x, y = getattr(a, f)[i], getattr(b, f)[i]
            if x != y:
                rid = int(request_ids[i]) if request_ids is not None else i
                return f"request {rid} (row {i}): {f} = {x} vs {y}"
    for f in RUN_FIELDS:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        if f == "itl_entries_us":
            x, y = np.sort(x), np.sort(y)  # the engines collect entries in different orders
        if x.shape != y.shape or not np.array_equal(x, y):
            return f"run field {f}: {x.tolist()} vs {y.tolist()}"
    if b.overflow:
        return f"capacity overflow in the second run: {b.overflow}"
    return None
