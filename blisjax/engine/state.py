"""``SimState``: everything that changes during one lane's simulation, as fixed-shape arrays.

Counterpart: the mutable attributes of the reference engine's objects — ``SimRequest`` (per
request), ``ClusterSimulator`` and its ``Router``/``Admission`` (cluster), ``Instance`` and its
``KVCache`` (per instance) — as arrays indexed by request, instance, batch slot or block.

Request status codes extend the reference engine's lifecycle with the pipeline stages the
kernel needs to tell apart. The initial state is ``engine.initial.init_state`` (it builds the
feature modules' parts, which import this module).
"""

from __future__ import annotations

from typing import Any

import jax

from blisjax.engine.pytree import pytree_dataclass
from blisjax.metrics.records import Stage

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

    Shapes: N requests (+1: row N is a sink that masked writes go to; with P/D pools N more
    rows follow, the prefill sub-requests', ``EngineStatic.request_rows``), I instances,
    T tenants, B batch slots (with P/D pools, reservation slots after them:
    ``EngineStatic.slot_count``; the running order has B positions), MB blocks per request, K KV blocks per instance, R = 2K free-list ring keys,
    Q wait-queue slots, E α-delay window entries, G prefix groups, Jg blocks per prefix group,
    S hash slots (+1 sink), D deferred releases. Times are int64 µs; -1 (``NIL``) marks an
    empty entry. The compiled loops carry the fields in name order (``pytree_dataclass``).
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
    # ---- cluster: event cursors and sequence numbers (ClusterSimulator) ----
    adm_cursor: jax.Array  # int32: next request to admit (requests are in arrival order)
    route_cursor: jax.Array  # int32: next request to route
    dl_cursor: jax.Array  # int32: first entry of c.deadline_order not known to be handled
    route_seq: jax.Array  # int64: routings so far (orders same-time enqueues, pend_seq)
    enq_counter: jax.Array  # int64: enqueues so far (source of enq_seq)
    # ---- cluster: router and admission state (Router, Admission) ----
    in_flight: jax.Array  # int32 [I]: routed requests not yet finished, per instance
    tenant_in_flight: jax.Array  # int32 [T]: admitted requests not yet finished, per tenant
    rr: jax.Array  # int32: round-robin counter
    bucket: jax.Array  # float64: token-bucket / rate-limit bucket level
    bucket_last: jax.Array  # int64 µs: time of the bucket's last refill
    tenant_bucket: jax.Array  # float64 [T]: tenant-bucket's per-tenant bucket levels
    tenant_bucket_last: jax.Array  # int64 µs [T]: time of each one's last refill
    snap_qd: jax.Array  # int32 [I]: router snapshot of queue depths
    snap_bs: jax.Array  # int32 [I]: router snapshot of batch sizes
    snap_kv: jax.Array  # float64 [I]: router snapshot of KV utilisation
    snap_last: jax.Array  # int64 µs: time of the last snapshot refresh
    rejected: jax.Array  # int32: requests rejected by admission
    # BLIS's "router" random stream (Router.rng; engine.gorand): ties draw from it
    rng_words: jax.Array  # int64 [607]: Go source state
    rng_tap: jax.Array  # int32
    rng_feed: jax.Array  # int32
    # no-hit-lru scorer (Router.cold_recency): when each instance last took a cold request
    cold_stamp: jax.Array  # int64 [I]: stamp of its last cold request, -1 = never
    cold_clock: jax.Array  # int64: next stamp
    # the cache query's periodic copy (ClusterSimulator._cache_copy; only with a positive
    # cache signal delay, ``EngineStatic.cache_copy_on``, else one unused entry)
    cache_copy: jax.Array  # bool [I·G·Jg]: the prefix-group hash slot was registered at the
    #                        last refresh
    cache_copy_last: jax.Array  # int64 µs: time of the last refresh
    # ---- router-side prefix index per instance (PrefixIndex; see policies.prefix_match) ----
    lru_pos: jax.Array  # int64 [I, G, Jg]: position of the group block's last touch, -1 = never
    lru_own_at: jax.Array  # int64 [I, G, Jg]: own entries inserted before that touch
    lru_clock: jax.Array  # int64 [I]: next touch position
    lru_own: jax.Array  # int64 [I]: own (not prefix-group) entries inserted so far
    # ---- instance: α-delay window, between routing and enqueue ----
    pend_req: jax.Array  # int32 [I, E]: request in the window, -1 = free entry
    pend_time: jax.Array  # int64 µs [I, E]: its enqueue time (routing time + α delay)
    pend_seq: jax.Array  # int64 [I, E]: its route_seq (ties of same-time enqueues)
    # ---- instance: event times ----
    step_time: jax.Array  # int64 µs [I]: next step, -1 = none pending
    # planned plain decode steps from step_time on, applied lazily (see stretch.py)
    stretch_steps: jax.Array  # int32 [I]: virtual steps before the next real one
    stretch_d: jax.Array  # int64 µs [I]: duration of each of them (blackbox)
    stretch_offset: jax.Array  # int64 µs [I, S + 1]: with step times that vary (roofline),
    #                            start of virtual step k = 0 .. S after step_time's (entry 0
    #                            is 0; S = static.VARYING_PLAN); [I, 0] otherwise
    stretch_ema: jax.Array  # float64 [I, S + 1]: physics, the EMA after k = 0 .. S virtual
    #                         steps (entry 0: the current EMA); [I, 0] otherwise
    stretch_cum: jax.Array  # int32 [I, block size]: running requests with <= v free
    #                          positions in their last block, at step_time
    clock: jax.Array  # int64 µs [I]: time of the last executed event
    last_left: jax.Array  # int64 µs [I]: latest completion time within the horizon
    # ---- instance: wait queue (Instance.wait_queue; see queues.py) ----
    q_buf: jax.Array  # int32 [I, Q]: ring buffer of request ids
    q_head: jax.Array  # int32 [I]: ring index of the queue's head
    q_len: jax.Array  # int32 [I]: queued requests
    # ---- instance: running batch (Instance.running) ----
    order: jax.Array  # int32 [I, B]: batch slots in running order; the first n_run are valid
    n_run: jax.Array  # int32 [I]: running requests
    slot_req: jax.Array  # int32 [I, B]: request in the slot, -1 = free
    bt: jax.Array  # int32 [I, B, MB]: block table per slot (the request's blocks, in order)
    blen: jax.Array  # int32 [I, B]: blocks the slot holds
    step_cached: jax.Array  # int32 [I, B]: prefix tokens of the slot's request if admitted
    #                          this step (physics latency only)
    ema: jax.Array  # float64 [I]: physics preemption EMA
    # ---- instance: KV cache (KVCache; see kvcache.py) ----
    kv_ref: jax.Array  # int32 [I, K]: refcount (in use iff > 0)
    kv_tok: jax.Array  # int32 [I, K]: tokens in the block
    kv_slot: jax.Array  # int32 [I, K]: hash slot registered for the block, -1 = none
    fifo: jax.Array  # int32 [I, R]: free-list ring of block ids (see kvblocks.py), R = 2K
    fkey: jax.Array  # int32 [I, K]: ring key of the block's live entry, -1 = in use
    fhead: jax.Array  # int32 [I]: key of the free-list head (entries before it are consumed)
    ftail: jax.Array  # int32 [I]: next key to append
    kv_free: jax.Array  # int32 [I]: free blocks
    # ---- KV hash slots of all instances (KVCache.hash_to_block; see kvblocks.py) ----
    slot_block: jax.Array  # int32 [S+1]: hash slot -> block (-1 = absent); last entry a sink
    slot_seq: jax.Array  # int64 [S+1]: stamp of the last write to the slot (apply_slot_ops)
    slot_clock: jax.Array  # int64: next stamp
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
    # ---- releases queued by this step's completions (kvcache.defer_release) ----
    rel_inst: jax.Array  # int32: their instance
    rel_slots: jax.Array  # int32 [D]: their batch slots, in completion order
    rel_count: jax.Array  # int32: releases queued
    # ---- counters per instance, int64 [I] (Instance's counters) ----
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
    # ---- run control and capacity overflow (never silently wrong: flagged per lane) ----
    done: jax.Array  # bool: the lane has no event left within the horizon
    iters: jax.Array  # int64: events handled
    stretched: jax.Array  # int64: steps of those advanced inside decode stretches
    ovf_queue: jax.Array  # int32: pushes refused by a full wait queue
    ovf_pending: jax.Array  # int32: routings refused by a full α-delay window
    ovf_blocks: jax.Array  # int32: blocks past a block table's width (max_blocks_per_request)
    ovf_deadline: jax.Array  # int32: events with more same-time deadlines than the window
