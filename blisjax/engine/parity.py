"""Compare two ``RunResult``s request by request: the engines must agree bit for bit."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blisjax.metrics import records

#: Per-request fields compared, in reporting order.
REQUEST_FIELDS = ("status", "instance", "scheduling_delay_us", "ttft_us", "e2e_us", "itl_sum_us",
                  "itl_count", "output_tokens_done", "preemptions", "length_capped")
#: Run-level fields compared.
RUN_FIELDS = ("sim_ended_us", "cache_hits", "cache_misses", "preemption_count", "still_queued",
              "still_running", "dropped_unservable", "timed_out", "length_capped_count",
              "completed", "total_input_tokens", "kv_allocation_failures", "rejected_admission",
              "busy_time_us",
              "queue_depth_time_us", "step_count", "peak_kv_blocks_used", "itl_entries_us",
              "rejected_routing", "kv_block_time_us", "kv_total_blocks",
              "kv_util_time_us")
#: P/D fields compared (``RunResult.pd``), per request then run level.
PD_FIELDS = ("prefill_instance", "transfer_start_us", "transfer_end_us", "role",
             "prefill_completed", "in_transfer", "dropped_at_decode_kv", "peak_transfers",
             "transfer_depth_sum", "transfer_starts")
#: Lifecycle fields compared (``RunResult.lifecycle``): every one.
LIFECYCLE_FIELDS = records.LifecycleCounters._fields
#: Shape of the run: the same workload and cluster on both sides.
SHAPE_FIELDS = ("num_requests", "num_instances", "horizon_us")


class RequestCounts(NamedTuple):
    """Requests of one run by final status (``requests`` is their sum)."""

    requests: int
    completed: int
    rejected: int
    timed_out: int
    dropped: int
    unfinished: int


def request_counts(result) -> RequestCounts:
    """The run's requests counted by their per-request ``status``."""
    status = np.asarray(result.status)

    def count(code: int) -> int:
        return int(np.sum(status == code))

    return RequestCounts(requests=int(status.shape[0]), completed=count(records.COMPLETED),
                         rejected=count(records.REJECTED), timed_out=count(records.TIMED_OUT),
                         dropped=count(records.DROPPED), unfinished=count(records.UNFINISHED))


def count_mismatch(result) -> str | None:
    """None when the run's counters agree with its per-request statuses; else what disagrees.

    Every request ends in exactly one status, and the counters count the same events: the
    instances' ``completed``, ``timed_out`` and ``dropped_unservable`` sum to the requests of
    that status, ``rejected_admission`` is the rejected requests, and the requests still queued
    or running at the end are among the unfinished ones (the others were still on their way to
    an instance). A capacity that silently dropped or double-counted a request breaks these.
    """
    counts = request_counts(result)
    pd = result.pd
    # With P/D pools the instances count sub-requests: a parent is completed by its decode
    # sub-request (prefill completions are extra) or dropped when its reservation failed.
    # BLIS's rows (``blis_quirks``) for such drops and for decode timeouts look completed, so
    # its counters and rows disagree by design.
    if pd is not None and pd.blis_quirks:
        return None
    extra_completed = pd.prefill_completed if pd is not None else 0
    extra_dropped = pd.dropped_at_decode_kv if pd is not None else 0
    if result.lifecycle is not None:  # an immediate drain drops what the instance held
        extra_dropped += int(np.sum(result.lifecycle.dropped_at_drain))
    pairs = (("completed", int(np.sum(result.completed)) - extra_completed, counts.completed),
             ("timed_out", int(np.sum(result.timed_out)), counts.timed_out),
             ("dropped_unservable", int(np.sum(result.dropped_unservable)) + extra_dropped,
              counts.dropped),
             ("rejected_admission + rejected_routing"
              + (" + gateway rejected" if result.gateway is not None else ""),
              int(result.rejected_admission) + int(result.rejected_routing)
              + (int(result.gateway.rejected) if result.gateway is not None else 0),
              counts.rejected))
    for name, counter, by_status in pairs:
        if counter != by_status:
            return f"{name} counts {counter} requests but {by_status} have that status"
    in_flight = int(np.sum(result.still_queued)) + int(np.sum(result.still_running))
    if in_flight > counts.unfinished:
        return (f"still_queued + still_running = {in_flight} exceed the {counts.unfinished} "
                "unfinished requests")
    return None


def _counters_divergence(label: str, a, b, fields) -> str | None:
    """None if two runs' counters of one feature (None: the feature is off) are identical;
    else which field differs first, and where."""
    if (a is None) != (b is None):
        return f"{label} counters: {a is not None} vs {b is not None}"
    if a is None:
        return None
    for f in fields:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        if x.shape != y.shape or not np.array_equal(x, y):
            where = np.flatnonzero(x != y)[:1].tolist() if x.shape == y.shape else ""
            return f"{label} field {f}{where}: {x.tolist() if x.size < 8 else '...'} vs " \
                   f"{y.tolist() if y.size < 8 else '...'}"
    return None


def first_divergence(a, b, request_ids=None) -> str | None:
    """None if identical; otherwise a sentence naming the first difference.

    Checked in order: a capacity overflow on either side (its numbers are not valid), the run's
    shape, the request counts by status, every request's fields, the run-level counters (each
    feature's too: P/D, lifecycle, sessions, gateway, CPU tier), and each side's counters
    against its own statuses (``count_mismatch``)."""
    for side, result in (("first", a), ("second", b)):
        if result.overflow:
            return f"capacity overflow in the {side} run: {result.overflow}"
    for f in SHAPE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x != y:
            return f"run shape {f}: {x} vs {y}"
    ca, cb = request_counts(a), request_counts(b)
    if ca != cb:
        f = next(name for name in RequestCounts._fields if getattr(ca, name) != getattr(cb, name))
        return f"request count {f}: {getattr(ca, f)} vs {getattr(cb, f)}"
    for i in range(a.num_requests):
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
    if a.itl_entry_request is not None and b.itl_entry_request is not None:
        pairs = []
        for r in (a, b):  # each request's entries, whatever order the engine listed them in
            rows, values = np.asarray(r.itl_entry_request), np.asarray(r.itl_entries_us)
            order = np.lexsort((values, rows))
            pairs.append((rows[order], values[order]))
        if not (np.array_equal(pairs[0][0], pairs[1][0])
                and np.array_equal(pairs[0][1], pairs[1][1])):
            return "run field itl_entry_request: the ITL entries belong to other requests"
    for label, x, y, fields in (("P/D", a.pd, b.pd, PD_FIELDS),
                                ("lifecycle", a.lifecycle, b.lifecycle, LIFECYCLE_FIELDS),
                                ("session", a.sessions, b.sessions,
                                 records.SessionRecords._fields),
                                ("gateway", a.gateway, b.gateway,
                                 records.GatewayCounters._fields),
                                ("CPU tier", a.kv_tier, b.kv_tier,
                                 records.KVTierCounters._fields)):
        found = _counters_divergence(label, x, y, fields)
        if found is not None:
            return found
    for side, result in (("first", a), ("second", b)):
        mismatch = count_mismatch(result)
        if mismatch is not None:
            return f"{side} run's counters disagree with its statuses: {mismatch}"
    return None
