"""What an engine run returns: per-request records plus run-level counters.

Both engines produce a ``RunResult`` with exactly these fields; ``blisjax.metrics.aggregate``
turns it into BLIS-named aggregate metrics. All times are integer microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np


class Outcome(IntEnum):
    """A request's status in ``RunResult.status`` (its label is the per-request row's
    ``status``)."""

    COMPLETED = 0
    REJECTED = 1  # refused by the admission policy, or no routable instance
    TIMED_OUT = 2  # deadline reached before completion (including past-due at enqueue)
    UNFINISHED = 3  # still in the pipeline, queued or running at the horizon
    DROPPED = 4  # dropped as unservable at enqueue (length / KV capacity guards)

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


COMPLETED, REJECTED, TIMED_OUT, UNFINISHED, DROPPED = Outcome
STATUS_NAMES = tuple(o.label for o in Outcome)


class Stage(IntEnum):
    """Where a request is during a run (docs/semantics.md §9, INV-2); both engines use these
    codes. The reference engine keeps admitted and routed requests as ``PENDING`` until they
    reach the wait queue; the JAX engine tells the three apart."""

    PENDING = 0  # not yet arrived or not yet admitted
    ADMITTED = 1  # admitted, waiting for its routing decision
    ROUTED = 2  # routed, inside its instance's queueing (α) delay
    QUEUED = 3  # in an instance's wait queue
    RUNNING = 4  # in an instance's running batch
    COMPLETED = 5
    TIMED_OUT = 6
    DROPPED = 7
    REJECTED = 8


class GatewayCounters(NamedTuple):
    """The gateway queue's counters (``RunResult.gateway``; BLIS's flow control,
    docs/semantics.md §5.12): requests refused by a full queue (status rejected; BLIS's
    ``Gateway Queue Rejected``), still waiting at the end (``Gateway Queue Depth
    (horizon)``), dispatched to routing, and their summed wait, enqueue to dispatch, µs."""

    rejected: int
    queue_depth: int
    dispatched: int
    wait_sum_us: int


#: ``Outcome`` of each ``Stage`` at the end of a run, indexed by stage code.
OUTCOME_OF_STAGE = np.array(
    [UNFINISHED, UNFINISHED, UNFINISHED, UNFINISHED, UNFINISHED, COMPLETED, TIMED_OUT, DROPPED,
     REJECTED], dtype=np.int8)


#: Sentinel for "not recorded" in int64 time fields.
NOT_RECORDED = -1


# A completed request's outcome from its final progress, shared by both engines; each works
# on Python ints (reference engine) and on NumPy arrays (JAX engine's per-lane results).
def output_finished(progress, input_tokens, output_tokens):
    """The request has produced its output (the final token is accounted at completion);
    a request with no output tokens completes after its prompt, like one with a single one."""
    return progress >= input_tokens + output_tokens + (output_tokens < 1) - 1


def unservable(input_tokens, output_tokens, max_model_len: int, kv_blocks: int,
               block_size: int):
    """BLIS's enqueue guards (docs/semantics.md §2.1): the request can never be served, so it is
    dropped instead of queued. ``max_model_len`` (0 = no cap), ``kv_blocks`` and ``block_size``
    are plain ints; the token counts are ints or integer arrays.

    With a cap, a request whose prompt reaches it, or whose prompt plus output budget passes it,
    is unservable (no output budget means "up to the cap"). Without one, prompt plus output must
    still fit in the KV cache: BLIS always derives a cap no larger than the cache, so such a
    request is dropped there too, and admitted it would preempt itself and restart forever.
    A prompt that needs more blocks than the cache has is unservable in any case.
    ``max_model_len`` and ``kv_blocks`` may also be integer arrays (an instance's own, P/D
    pools of their own settings), each element 0 or a cap as above."""
    budget = output_tokens + (output_tokens == 0) * (input_tokens < max_model_len) * (
        max_model_len - input_tokens)
    capped = (input_tokens >= max_model_len) | (
        (budget > 0) & (input_tokens + budget > max_model_len))
    uncapped = input_tokens + output_tokens > kv_blocks * block_size
    if isinstance(max_model_len, (int, np.integer)):
        too_long = capped if max_model_len > 0 else uncapped
    else:
        has_cap = max_model_len > 0
        too_long = (has_cap & capped) | (~has_cap & uncapped)
    return too_long | ((input_tokens + block_size - 1) // block_size > kv_blocks)


def at_length_cap(progress, max_model_len):
    """Progress has reached the max-model-len cap (0: no cap); such a request completes
    length-capped unless it finished its output first."""
    return (max_model_len > 0) & (progress >= max_model_len - 1)


def output_tokens_done(progress, input_tokens, output_tokens):
    """Output tokens produced: tokens past the prompt, plus the final one if it is still
    within the requested output (BLIS counts it when the request completes)."""
    past_prompt = progress - input_tokens
    return past_prompt + (past_prompt < output_tokens)


def e2e_us(ttft_us, itl_sum_us, output_tokens, post_decode_us):
    """End-to-end latency: TTFT, then every inter-token gap, then the post-decode overhead
    for requests with output tokens."""
    return ttft_us + itl_sum_us + post_decode_us * (output_tokens > 0)


class KVTierCounters(NamedTuple):
    """The CPU tier's counters (runs with ``engine.kv_cpu_blocks > 0``; docs/semantics.md
    §3.8). Per instance, int64 [I]: ``reloads`` (blocks reloaded CPU → GPU), ``cpu_misses``
    (allocations that failed without reloading anything), ``mirror_stores`` (blocks copied to
    the CPU tier), ``cpu_evictions`` (blocks the full tier dropped), ``thrash_reloads``
    (reloads of a block whose GPU copy was evicted less than ``metrics.kv_thrash_window_us``
    earlier: Decision 14's thrashing anomaly). Per request, int64 [N]: ``request_reloads``
    (blocks reloaded by its allocations)."""

    reloads: np.ndarray
    cpu_misses: np.ndarray
    mirror_stores: np.ndarray
    cpu_evictions: np.ndarray
    request_reloads: np.ndarray
    thrash_reloads: np.ndarray


class PDCounters(NamedTuple):
    """Prefill/decode disaggregation (runs with P/D pools; docs/semantics.md §5.10).

    Per request, [N]: ``prefill_instance`` (int32, the prefill sub-request's instance, -1 if
    not disaggregated), ``transfer_start_us`` and ``transfer_end_us`` (int64 µs, -1 until the
    KV transfer started / ended; a transfer whose decode-side reservation failed has no end).
    Per instance, int8 [I]: ``role`` (``reference.pd.Role``: 1 prefill, 2 decode, 3 both,
    0 none). Run level: ``prefill_completed`` (prefill sub-requests completed, which the
    instances' ``completed`` include), ``in_transfer`` (parents whose prefill completed and
    whose decode sub-request was neither enqueued nor dropped by the end: still running),
    ``dropped_at_decode_kv`` (decode-side reservations that failed), ``peak_transfers`` and
    ``transfer_depth_sum`` / ``transfer_starts`` (with contention: the most transfers in
    flight, and the in-flight counts at each start, itself included; 0 otherwise);
    ``blis_quirks`` (the run reproduced BLIS's quirks, which its reports follow too)."""

    prefill_instance: np.ndarray
    transfer_start_us: np.ndarray
    transfer_end_us: np.ndarray
    role: np.ndarray
    prefill_completed: int
    in_transfer: int
    dropped_at_decode_kv: int
    peak_transfers: int
    transfer_depth_sum: int
    transfer_starts: int
    blis_quirks: bool


class LifecycleCounters(NamedTuple):
    """Instance lifecycles and autoscaling (runs with an autoscaler, node pools or a
    non-default lifecycle; docs/semantics.md Decision 16).

    Per instance slot, [S]: ``final_state`` (int8 ``config.codes.InstanceState`` at the end),
    ``placements`` (int32, instances the slot has held), ``replica_us`` (int64, time they held
    it, placement to termination or the run's end), ``cost`` (float64, Σ held time × cost per
    hour), ``dropped_at_drain`` (int64, requests an ``immediate`` drain dropped).
    Run level: ``end_us`` (the last executed event, where held instances stop costing),
    ``scale_ups`` / ``scale_downs`` (actuations that added / drained at least one instance),
    ``instances_added`` / ``instances_drained``, ``oscillations`` (actuations against the
    previous one's direction within ``cooldown_us`` of it), ``refused_no_room`` (instances a
    scale-up could not place on the node pools), ``redirected`` (requests a ``redirect`` drain
    routed again). ``timeline_us``, ``timeline_slot``, ``timeline_state``: every state change
    in order (int64, int32, int8 [T])."""

    final_state: np.ndarray
    placements: np.ndarray
    replica_us: np.ndarray
    cost: np.ndarray
    dropped_at_drain: np.ndarray
    end_us: int
    scale_ups: int
    scale_downs: int
    instances_added: int
    instances_drained: int
    oscillations: int
    refused_no_room: int
    redirected: int
    timeline_us: np.ndarray
    timeline_slot: np.ndarray
    timeline_state: np.ndarray


class SessionRecords(NamedTuple):
    """Closed-loop sessions (``blisjax.workload.sessions``), per request [N]:
    ``arrival_us`` (int64: the arrival the run gave each follow-up, the workload's for every
    other row; ``FOLLOW_UP_ARRIVAL_US`` for a follow-up never created) and ``prompt_tokens``
    (int64: the prompt as assembled from the conversation)."""

    arrival_us: np.ndarray
    prompt_tokens: np.ndarray


@dataclass(frozen=True, eq=False)
class RunResult:
    """Outcome of one simulation (one lane), rows indexed like the ``Workload``.

    Per request (length N):
      status: int8 status code (see module constants).
      instance: int32 instance the request was routed to, -1 if never routed.
      ttft_us: int64 BLIS FirstTokenTime (µs after arrival), -1 if never recorded. Kept for
        timed-out / unfinished requests that had recorded one (BLIS TTFT population).
      e2e_us: int64 BLIS E2E (TTFT + ΣITL + post-decode overhead) for completed requests, else -1.
      scheduling_delay_us: int64 last admission step start − arrival, -1 if never scheduled.
      itl_sum_us: int64 sum of the request's ITL entries (completed requests; else 0).
      itl_count: int64 number of ITL entries.
      output_tokens_done: int64 output tokens counted at completion (0 if not completed).
      preemptions: int32 times the request was preempted.
      length_capped: bool, completion forced by max_model_len.

    Run level:
      itl_entries_us: int64, every raw ITL entry of completed requests (BLIS ``AllITLs``).
      sim_ended_us: BLIS SimEndedTime = max over instances of min(last event time, horizon).
      horizon_us: the configured horizon.
      num_instances: instance count.
      cache_hits, cache_misses: int64 per instance (block-level counters, BLIS semantics).
      preemption_count: int64 per instance.
      still_queued, still_running: int64 per instance at the end.
      dropped_unservable, timed_out, length_capped_count, completed: int64 per instance.
      kv_allocation_failures: int64 per instance, completions whose final token found no KV
        block (BLIS's ``KVAllocationFailures``; the request completes all the same).
      total_input_tokens: int64 per instance (counted at enqueue, BLIS semantics).
      rejected_admission: requests refused by admission.
      queue_depth_time_us: int64 per instance, Σ(wait-queue length × step duration) (HOL metric).
      busy_time_us: int64 per instance, Σ step durations.
      step_count: int64 per instance.
      peak_kv_blocks_used: int64 per instance.
      overflow: dict of capacity-overflow counters (JAX engine); empty when nothing overflowed.
      kv_tier: the CPU tier's counters (``KVTierCounters``), None without a CPU tier.
      pd: prefill/decode disaggregation (``PDCounters``), None without P/D pools. With pools the
        per-request fields describe the whole request (its sub-requests' projection,
        ``reference.pd``) and the per-instance ones each instance's own work, sub-requests
        included.
      rejected_routing: requests that found no routable instance (status rejected).
      lifecycle: instance lifecycles and autoscaling (``LifecycleCounters``), None when every
        instance is up throughout. Per-instance fields then have one entry per instance slot
        (``num_instances`` slots; a reused slot sums its instances).
      kv_block_time_us: int64 per instance, Σ(KV blocks in use after a step's allocations ×
        step duration), block·µs (KV utilization over time); None from a producer without it.
      kv_total_blocks: int64 per instance, its GPU KV blocks; None as ``kv_block_time_us``.
      kv_util_time_us: int64 [instances, 101], µs of each instance's steps by the whole
        percent of its KV blocks in use after the step's allocations, rounded up
        (``rules.kv_util_bucket``); None as ``kv_block_time_us``.
      sessions: closed-loop sessions' arrivals and prompts (``SessionRecords``), None without
        follow-ups.
      itl_entry_request: int64, the request (row) of each ``itl_entries_us`` entry; None from a
        producer without it.
      gateway: the gateway queue's counters (``GatewayCounters``), None without flow control.
    """

    status: np.ndarray
    instance: np.ndarray
    ttft_us: np.ndarray
    e2e_us: np.ndarray
    scheduling_delay_us: np.ndarray
    itl_sum_us: np.ndarray
    itl_count: np.ndarray
    output_tokens_done: np.ndarray
    preemptions: np.ndarray
    length_capped: np.ndarray
    itl_entries_us: np.ndarray
    sim_ended_us: int
    horizon_us: int
    num_instances: int
    cache_hits: np.ndarray
    cache_misses: np.ndarray
    preemption_count: np.ndarray
    still_queued: np.ndarray
    still_running: np.ndarray
    dropped_unservable: np.ndarray
    timed_out: np.ndarray
    length_capped_count: np.ndarray
    completed: np.ndarray
    total_input_tokens: np.ndarray
    kv_allocation_failures: np.ndarray
    rejected_admission: int
    queue_depth_time_us: np.ndarray
    busy_time_us: np.ndarray
    step_count: np.ndarray
    peak_kv_blocks_used: np.ndarray
    overflow: dict = field(default_factory=dict)
    kv_tier: KVTierCounters | None = None
    pd: PDCounters | None = None
    rejected_routing: int = 0
    lifecycle: LifecycleCounters | None = None
    sessions: SessionRecords | None = None
    itl_entry_request: np.ndarray | None = None
    kv_block_time_us: np.ndarray | None = None
    kv_total_blocks: np.ndarray | None = None
    kv_util_time_us: np.ndarray | None = None
    gateway: GatewayCounters | None = None

    @property
    def num_requests(self) -> int:
        return int(self.status.shape[0])
