"""``SimState``: everything that changes during one lane's simulation, as fixed-shape arrays.

Counterpart: the mutable attributes of the reference engine's objects — ``SimRequest`` (per
request), ``ClusterSimulator`` and its ``Router``/``Admission`` (cluster), ``Instance`` and its
``KVCache`` (per instance) — as arrays indexed by request, instance, batch slot or block.

The per-request arrays sit at the top level; everything else is one record per module that
owns it (``cursors`` … ``gw``), plus this module's per-instance counters (``InstanceStats``)
and run control (``RunControl``). Request status codes extend the reference engine's
lifecycle with the pipeline stages the kernel needs to tell apart. The initial state is
``engine.initial.init_state`` (it builds each part with its owner's ``init_*``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from blisjax.engine.pytree import pytree_dataclass
from blisjax.metrics.records import Stage
from blisjax.rules import KV_UTIL_BUCKETS

# Request stages (``SimState.status``): the one enumeration both engines use.
PENDING, ADMITTED, ROUTED, QUEUED, RUNNING, COMPLETED, TIMED_OUT, DROPPED, REJECTED = Stage
# A P/D request's progress (``PDState.phase``, engine.pd): served whole, awaiting its prefill
# routing, in prefill, its transfer pending or in flight, its decode sub-request queued or
# running, or dropped when the decode instance could not reserve its KV.
WHOLE, PREFILL_ROUTING, PREFILL, TRANSFER, DECODE, DROPPED_AT_DECODE = range(6)
NIL = -1
DEFERRED_RELEASES = 8  # completions' releases a lane queues before it runs them itself


@pytree_dataclass
class SimState:
    """One lane's mutable simulation state (stacked over lanes in a population).

    Shapes: N request rows (the workload's first, any others spare: ``WorkloadConsts.rows``;
    +1: row N is a sink that masked writes go to; with P/D pools N more rows follow, the
    prefill sub-requests', ``EngineStatic.request_rows``), I instances, T tenants, B batch
    slots (with P/D pools, reservation slots after them: ``EngineStatic.slot_count``; the
    running order has B positions), MB blocks per request, K KV blocks per instance, R = 2K
    free-list ring keys, Q wait-queue slots, E α-delay window entries, G prefix groups, Jg
    blocks per prefix group, S hash slots (+1 sink), D deferred releases. Times are int64 µs;
    -1 (``NIL``) marks an empty entry. The compiled loops carry the fields in name order
    (``pytree_dataclass``).
    """

    # ---- per request [N + 1] (SimRequest) ----
    status: jax.Array  # int8: lifecycle code (PENDING .. REJECTED above)
    instance: jax.Array  # int32: the instance it was routed to, -1 before routing
    pi: jax.Array  # int32: ProgressIndex — prompt and output tokens processed
    computed: jax.Array  # int32: ComputedTokens — pi plus this step's grant
    num_new: jax.Array  # int32: tokens scheduled this step
    prio: jax.Array  # float64 priority score (stale while running, as in BLIS)
    ttft: jax.Array  # int64 µs: time to first token, -1 until recorded
    itl_sum: jax.Array  # int64 µs: sum of its inter-token latencies
    sched: jax.Array  # int64 µs: scheduling delay (last admission to a batch), -1 until then
    preempt: jax.Array  # int32: times preempted
    enq_seq: jax.Array  # int64: order of enqueue (ties of same-time timeouts)
    tdone: jax.Array  # bool: its deadline was handled (timeout or no-op)
    itl_buf: jax.Array  # int32 µs [max(itl_capacity, 1)]: raw ITL entries, request r's from
    #                      itl_offset[r] on (only filled when itl_capacity > 0)
    # ---- the parts each module owns (one record each; their fields are documented there) ----
    cursors: Any  # engine.cluster_events.Cursors: the event cursors and sequence numbers
    router: Any  # engine.policies.RouterState: in-flight counts, snapshots, random stream,
    #              prefix index, no-hit-lru recency and the cache query's periodic copy
    admission: Any  # engine.policies.AdmissionState: buckets, tenants in flight, rejections
    window: Any  # engine.cluster_events.WindowState: each instance's α-delay window
    batch: Any  # engine.batch.BatchState: each instance's running batch and step clock
    stretch: Any  # engine.stretch.StretchState: each instance's planned decode stretch
    queue: Any  # engine.queues.QueueState: each instance's wait queue
    kv: Any  # engine.kvblocks.KVState: each instance's KV blocks, free list and hash slots
    # ---- CPU tier of the KV cache (engine.kvtier; one-entry placeholders without one) ----
    tier: Any  # engine.kvtier.KVTierState (owned there)
    # ---- P/D pools (engine.pd; one-entry placeholders without them) ----
    pd: Any  # engine.pd.PDState (owned there)
    # ---- instance lifecycles and the autoscaler (engine.lifecycle; placeholders without) ----
    life: Any  # engine.lifecycle.LifecycleState (owned there)
    # ---- recent signals per instance, for routing programs (engine.recent; placeholders) ----
    recent: Any  # engine.recent.RecentState (owned there)
    # ---- closed-loop sessions: follow-ups and the arrival stream (engine.sessions) ----
    sess: Any  # engine.sessions.SessionState (owned there)
    # ---- the gateway queue, BLIS's flow control (engine.gateway; placeholders without) ----
    gw: Any  # engine.gateway.GatewayState (owned there)
    # ---- per-instance counters and run control (this module: InstanceStats, RunControl) ----
    stats: Any  # InstanceStats
    run: Any  # RunControl


@pytree_dataclass
class InstanceStats:
    """Counters per instance, int64 [I] (the reference ``Instance``'s counters). Written by the
    handlers that count: admission and allocation (kvcache, batch), steps (instance),
    completions (completion) and enqueues (queues)."""

    hits: jax.Array  # prefix-cache hits (cached blocks claimed)
    misses: jax.Array  # fresh blocks allocated
    preempt_count: jax.Array  # preemptions
    completed: jax.Array  # completed requests, length-capped ones included
    dropped: jax.Array  # requests dropped as unservable at enqueue
    timed_out: jax.Array  # requests timed out
    capped_count: jax.Array  # requests completed at the max-model-len cap
    alloc_failures: jax.Array  # completions whose final token found no KV block
    input_tokens: jax.Array  # prompt tokens of the requests enqueued (not dropped)
    steps: jax.Array  # steps executed
    busy: jax.Array  # µs: sum of step durations
    qdepth_time: jax.Array  # µs·requests: sum of queue length × step duration
    peak_used: jax.Array  # most KV blocks in use when a step executes
    kv_time: jax.Array  # block·µs: sum of KV blocks in use × step duration
    kv_util: jax.Array  # int64 [I, 101] µs: step durations by whole percent of KV in use


def init_stats(st) -> InstanceStats:
    """Every counter at zero."""
    i = st.shapes.num_instances
    zeros = jnp.zeros(i, jnp.int64)
    return InstanceStats(
        hits=zeros, misses=zeros, preempt_count=zeros, completed=zeros, dropped=zeros,
        timed_out=zeros, capped_count=zeros, alloc_failures=zeros, input_tokens=zeros,
        steps=zeros, busy=zeros, qdepth_time=zeros, peak_used=zeros, kv_time=zeros,
        kv_util=jnp.zeros((i, KV_UTIL_BUCKETS + 1), jnp.int64))


@pytree_dataclass
class RunControl:
    """Run control and capacity overflow (never silently wrong: flagged per lane); scalars."""

    done: jax.Array  # bool: the lane has no event left within the horizon
    iters: jax.Array  # int64: events handled
    stretched: jax.Array  # int64: steps of those advanced inside decode stretches
    ovf_queue: jax.Array  # int32: pushes refused by a full wait queue
    ovf_pending: jax.Array  # int32: routings refused by a full α-delay window
    ovf_blocks: jax.Array  # int32: blocks past a block table's width (max_blocks_per_request)
    ovf_deadline: jax.Array  # int32: events with more same-time deadlines than the window
    ovf_events: jax.Array  # int32: 1 when the lane stopped at ``WorkloadConsts.max_events``
    #                        with events left (a run that would not end: flagged)


def init_run() -> RunControl:
    """Not done, nothing counted."""
    zero = jnp.asarray(0, jnp.int32)
    return RunControl(done=jnp.asarray(False), iters=jnp.asarray(0, jnp.int64),
                      stretched=jnp.asarray(0, jnp.int64), ovf_queue=zero, ovf_pending=zero,
                      ovf_blocks=zero, ovf_deadline=zero, ovf_events=zero)


def prefill_row(st, r):
    """The row of request r's prefill sub-request (P/D: rows N+1 .. 2N)."""
    return r + st.shapes.num_requests + 1


def parent_row(st, row):
    """The request a row belongs to (a prefill sub-request's row is its parent's + N + 1)."""
    return jnp.where(row > st.shapes.num_requests, row - st.shapes.num_requests - 1, row)
