"""``SimState``: everything that changes during one lane's simulation, as fixed-shape arrays.

Counterpart: the mutable attributes of the reference engine's objects — ``SimRequest`` (per
request), ``ClusterSimulator`` and its ``Router``/``Admission`` (cluster), ``Instance`` and its
``KVCache`` (per instance) — as arrays indexed by request, instance, batch slot or block.

Request status codes extend the reference engine's lifecycle with the pipeline stages the
kernel needs to tell apart.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from blisjax.engine.static import EngineStatic

PENDING, ADMITTED, ROUTED, QUEUED, RUNNING, COMPLETED, TIMED_OUT, DROPPED, REJECTED = range(9)
NIL = -1
DEFERRED_RELEASES = 8  # completions' releases a lane queues before it runs them itself
INT64_MAX = (1 << 63) - 1


@chex.dataclass(frozen=True)
class SimState:
    # ---- per request [N] ----
    status: chex.Array
    instance: chex.Array
    pi: chex.Array  # ProgressIndex
    computed: chex.Array  # ComputedTokens
    num_new: chex.Array  # tokens scheduled this step
    prio: chex.Array  # float64 priority score (stale while running, as in BLIS)
    ttft: chex.Array
    itl_sum: chex.Array
    sched: chex.Array
    preempt: chex.Array
    enq_seq: chex.Array  # order of enqueue (ties of same-time timeouts)
    tdone: chex.Array  # deadline handled
    itl_buf: chex.Array  # raw ITL entries, request r at itl_offset[r] (optional)
    # ---- cluster ----
    adm_cursor: chex.Array
    route_cursor: chex.Array
    dl_cursor: chex.Array
    route_seq: chex.Array
    enq_counter: chex.Array
    in_flight: chex.Array  # [I]
    tenant_in_flight: chex.Array  # [T]
    rr: chex.Array
    bucket: chex.Array  # token / rate-limit bucket level
    bucket_last: chex.Array
    snap_qd: chex.Array  # [I]
    snap_bs: chex.Array
    snap_kv: chex.Array
    snap_last: chex.Array
    rejected: chex.Array
    lru_pos: chex.Array  # [I, G, Jg] position of the last touch, -1 = never
    lru_own_at: chex.Array  # [I, G, Jg] own entries inserted before that touch
    lru_clock: chex.Array  # [I]
    lru_own: chex.Array  # [I]
    # ---- instances ----
    pend_req: chex.Array  # [I, E] request in the α-delay window, -1 = free
    pend_time: chex.Array
    pend_seq: chex.Array
    step_time: chex.Array  # [I] next step, -1 = none pending
    clock: chex.Array  # [I] time of the last executed event
    last_left: chex.Array  # [I]
    q_buf: chex.Array  # [I, Q] ring buffer of request ids
    q_head: chex.Array
    q_len: chex.Array
    order: chex.Array  # [I, B] batch slots in running order
    n_run: chex.Array
    slot_req: chex.Array  # [I, B] request in slot, -1 = free
    bt: chex.Array  # [I, B, MB] block table per slot
    blen: chex.Array  # [I, B]
    step_cached: chex.Array  # [I, B] prefix tokens of the slot's request if admitted this step
    ema: chex.Array  # [I] physics preemption EMA
    kv_ref: chex.Array  # [I, K] refcount (in use iff > 0)
    kv_tok: chex.Array  # [I, K] tokens in the block
    kv_slot: chex.Array  # [I, K] hash slot registered for the block, -1 = none
    fifo: chex.Array  # [I, R] free-list ring of block ids (see kvcache.py), R = 2K
    fkey: chex.Array  # [I, K] ring key of the block's live entry, -1 = in use
    fhead: chex.Array  # [I] key of the free-list head (entries before it are consumed)
    ftail: chex.Array  # [I] next key to append
    kv_free: chex.Array  # [I]
    slot_block: chex.Array  # [S+1] hash slot -> block (-1 = absent); last entry is a sink
    slot_seq: chex.Array  # [S+1] stamp of the last write to the slot (see kv.apply_slot_ops)
    slot_clock: chex.Array  # next stamp
    rel_inst: chex.Array  # instance of the releases queued by this step's completions
    rel_slots: chex.Array  # [D] their batch slots, in completion order (see kv.defer_release)
    rel_count: chex.Array
    # ---- counters [I] ----
    hits: chex.Array
    misses: chex.Array
    preempt_count: chex.Array
    completed: chex.Array
    dropped: chex.Array
    timed_out: chex.Array
    capped_count: chex.Array
    input_tokens: chex.Array
    steps: chex.Array
    busy: chex.Array
    qdepth_time: chex.Array
    peak_used: chex.Array
    # ---- run control and honest limits ----
    done: chex.Array
    iters: chex.Array
    ovf_queue: chex.Array
    ovf_pending: chex.Array
    ovf_blocks: chex.Array
    ovf_deadline: chex.Array


def init_state(st: EngineStatic, tb_capacity, rl_burst, admission_code, rate_limit_code):
    """Initial state of one lane. The bucket starts full (token-bucket or rate-limit size)."""
    n, i, t = st.num_requests + 1, st.num_instances, st.num_tenants  # + sink row
    q, e, b, mb, k = st.queue_slots, st.pending_slots, st.batch_slots, \
        st.max_blocks_per_request, st.kv_blocks
    g, jg = st.num_groups, st.group_blocks_max
    i32, i64, f64 = jnp.int32, jnp.int64, jnp.float64
    zi = lambda *shape: jnp.zeros(shape, i64)  # noqa: E731
    zi32 = lambda *shape: jnp.zeros(shape, i32)  # noqa: E731
    ring = max(2 * k, 1)
    fifo = jnp.broadcast_to(jnp.where(jnp.arange(ring) < k, jnp.arange(ring), NIL).astype(i32),
                            (i, ring))  # blocks 0..K-1 in id order, keys 0..K-1
    bucket = jnp.where(admission_code == rate_limit_code, rl_burst, tb_capacity)
    return SimState(
        status=zi32(n).astype(jnp.int8), instance=jnp.full(n, NIL, i32), pi=zi32(n),
        computed=zi32(n), num_new=zi32(n), prio=jnp.zeros(n, f64),
        ttft=jnp.full(n, -1, i64), itl_sum=zi(n), sched=jnp.full(n, -1, i64), preempt=zi32(n),
        enq_seq=zi(n), tdone=jnp.zeros(n, bool), itl_buf=zi32(max(st.itl_capacity, 1)),
        adm_cursor=jnp.asarray(0, i32), route_cursor=jnp.asarray(0, i32),
        dl_cursor=jnp.asarray(0, i32), route_seq=jnp.asarray(0, i64),
        enq_counter=jnp.asarray(0, i64), in_flight=zi32(i), tenant_in_flight=zi32(t),
        rr=jnp.asarray(0, i32), bucket=jnp.asarray(bucket, f64), bucket_last=jnp.asarray(0, i64),
        snap_qd=zi32(i), snap_bs=zi32(i), snap_kv=jnp.zeros(i, f64), snap_last=jnp.asarray(0, i64),
        rejected=jnp.asarray(0, i32),
        lru_pos=jnp.full((i, g, jg), -1, i64), lru_own_at=zi(i, g, jg), lru_clock=zi(i),
        lru_own=zi(i),
        pend_req=jnp.full((i, e), NIL, i32), pend_time=zi(i, e), pend_seq=zi(i, e),
        step_time=jnp.full(i, -1, i64), clock=zi(i), last_left=zi(i),
        q_buf=jnp.full((i, q), NIL, i32), q_head=zi32(i), q_len=zi32(i),
        order=jnp.full((i, b), NIL, i32), n_run=zi32(i), slot_req=jnp.full((i, b), NIL, i32),
        bt=jnp.full((i, b, mb), NIL, i32), blen=zi32(i, b), step_cached=zi32(i, b),
        ema=jnp.zeros(i, f64),
        kv_ref=zi32(i, k), kv_tok=zi32(i, k), kv_slot=jnp.full((i, k), NIL, i32),
        fifo=fifo, fkey=jnp.broadcast_to(jnp.arange(k, dtype=i32), (i, k)),
        fhead=zi32(i), ftail=jnp.full(i, k, i32), kv_free=jnp.full(i, k, i32),
        slot_block=jnp.full(st.hash_slots + 1, NIL, i32),
        slot_seq=jnp.full(st.hash_slots + 1, -1, i64), slot_clock=jnp.asarray(0, i64),
        rel_inst=jnp.asarray(0, i32), rel_slots=zi32(DEFERRED_RELEASES),
        rel_count=jnp.asarray(0, i32),
        hits=zi(i), misses=zi(i), preempt_count=zi(i), completed=zi(i), dropped=zi(i),
        timed_out=zi(i), capped_count=zi(i), input_tokens=zi(i), steps=zi(i), busy=zi(i),
        qdepth_time=zi(i), peak_used=zi(i),
        done=jnp.asarray(False), iters=jnp.asarray(0, i64),
        ovf_queue=jnp.asarray(0, i32), ovf_pending=jnp.asarray(0, i32),
        ovf_blocks=jnp.asarray(0, i32), ovf_deadline=jnp.asarray(0, i32),
    )
