"""One instance of one lane: its enqueue and timeout events and its step.

Counterpart: ``blisjax.reference.instance.Instance`` — ``enqueue`` is ``_enqueue``, ``timeout``
``_timeout``, and ``step`` is ``_step`` statement by statement: ``_form_batch`` as ``phase1``
(continue the running requests, with chunked prefill and preemption: ``preempt_for_tokens``,
``victim_position``, ``evict``) and ``phase2`` (admit from the wait queue), then ``execute``
(``_execute``: the step's duration and progress) and ``complete`` (``_complete`` and
``_finish``). Behaviour: docs/semantics.md §2.1–§2.9.

The reference walks the running batch request by request; here work over the running batch is
vectorized over its positions 0 .. width - 1 (``by_width`` picks the width), and loops remain
only where one request's outcome changes the next one's (preemption, admissions, releases).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.config.codes import PreemptionPolicy
from blisjax.engine import hostlatency, lifecycle, pd, physics, recent, roofline, stretch
from blisjax.engine import kvcache as kv
from blisjax.engine.lockstep import (
    add,
    after_reads,
    by_width,
    lane_max,
    lane_once,
    lane_while,
    upd,
)
from blisjax.engine.policies import head_offset, priority_score
from blisjax.engine.queues import (
    order_remove_at,
    q_at,
    q_offset_of,
    q_push_back,
    q_push_front,
    q_remove_at,
)
from blisjax.engine.state import (
    COMPLETED,
    DECODE,
    DROPPED,
    NIL,
    QUEUED,
    ROUTED,
    RUNNING,
    TIMED_OUT,
    SimState,
)
from blisjax.engine.vec import prefix_sum
from blisjax.latency.base import float_to_ticks_array
from blisjax.limits import INT64_MAX
from blisjax.metrics import records

F64 = jnp.float64


# ---- arrival, enqueue and timeout -------------------------------------------------------------


def inject_arrival(s: SimState, st, c, i, r, now, active) -> SimState:
    """Routing hands request row r to instance i at ``now`` (``Instance.inject_arrival``): it
    is counted in flight and enters the α-delay window, to be enqueued after its queueing
    delay (computed now: the arrival event's time)."""
    e = jnp.argmax(s.pend_req[i] == NIL)
    has_room = s.pend_req[i, e] == NIL
    ok = active & has_room
    if st.stateful_latency:  # physics α reads the receiving instance's state now
        if st.stretches:  # its virtual steps before now have run (cluster events come first)
            s = end_stretch(s, st, c, i, now, active)
        inputs = (s.n_run[i], s.q_len[i], st.kv_blocks - s.kv_free[i], c.input_tokens[r],
                  kv.cached_blocks(s, st, c, i, r).count, s.ema[i])
        delay = (physics.queueing_delay(c.physics, *inputs) if st.latency is None
                 else hostlatency.queueing_delay(st.latency, active, *inputs))
    else:
        delay = c.queue_delay_us[r]
    r_or_sink = jnp.where(active, r, st.num_requests)
    arrival_event = st.lifecycle and st.blis_quirks
    if arrival_event:  # the arrival is an event of its own (``arrival``)
        life = s.life
        s = s.replace(life=life.replace(arrive_us=upd(life.arrive_us, (i, e), now, ok)))
    elif st.lifecycle:  # a drain at this time may cancel the arrival (``_arrivals_cancelled``)
        life = s.life
        first = active & (s.clock[i] < now)
        s = s.replace(life=life.replace(clock_before=upd(life.clock_before, i, s.clock[i],
                                                         first)))
    return s.replace(
        in_flight=add(s.in_flight, i, 1, active),
        instance=s.instance.at[r_or_sink].set(i),
        status=s.status.at[r_or_sink].set(ROUTED),
        clock=s.clock if arrival_event else upd(s.clock, i, now, active),
        pend_req=upd(s.pend_req, (i, e), r, ok),
        pend_time=upd(s.pend_time, (i, e), now + delay, ok),
        pend_seq=upd(s.pend_seq, (i, e), s.route_seq, ok),
        route_seq=s.route_seq + active.astype(jnp.int64),
        ovf_pending=s.ovf_pending + (active & ~has_room).astype(jnp.int32))


def end_stretch(s: SimState, st, c, i, now, active, inclusive: bool = False) -> SimState:
    """Instance i's virtual steps before ``now`` (or at it, if ``inclusive``) happen, the rest
    of its plan is dropped: its next step runs on its own (``stretch.materialize``)."""
    s = stretch.materialize(s, st, c, i, now, active, step_widths(st, PHASE1_PER_OCTAVE),
                            inclusive=inclusive)
    return s.replace(stretch_steps=upd(s.stretch_steps, i, 0, active))


def _release_slot_of(s: SimState, st, i, r, active):
    """Free the blocks of the batch slot holding request r on instance i, if one does, where
    ``active`` (``KVCache.release``); returns ``(state, that slot)``."""
    holder = s.slot_req[i] == r
    sb = jnp.argmax(holder).astype(jnp.int32)
    held = active & jnp.any(holder)
    s = kv.release(s, st, i, sb, held)
    return s.replace(slot_req=upd(s.slot_req, (i, sb), NIL, held)), sb


def tenants_left(s: SimState, c, reqs, mask):
    """``tenant_in_flight`` after the requests ``reqs`` where ``mask`` left: max(x − 1, 0)
    once per request of the tenant, which is max(x − n, 0) (the reference's loop)."""
    n_tenants = s.tenant_in_flight.shape[0]
    ended = jnp.zeros(n_tenants, jnp.int32).at[jnp.where(mask, c.tenant[reqs], n_tenants)].add(
        1, mode="drop")
    left = s.tenant_in_flight
    return jnp.where(ended > 0, jnp.maximum(left - ended, 0), left)


def _finish_in_flight(s: SimState, c, i, r, active) -> SimState:
    """A request left instance i (dropped, timed out): router in-flight counts go down."""
    t = c.tenant[r]
    return s.replace(
        in_flight=upd(s.in_flight, i, jnp.maximum(s.in_flight[i] - 1, 0), active),
        tenant_in_flight=upd(s.tenant_in_flight, t, jnp.maximum(s.tenant_in_flight[t] - 1, 0),
                             active))


def enqueue(s: SimState, st, c, i, e, now, active) -> SimState:
    """End of the α delay (``Instance._enqueue``): BLIS EnqueueRequest guards, then the wait
    queue (docs/semantics.md §2.1)."""
    r = jnp.where(active, s.pend_req[i, e], st.num_requests)
    s = s.replace(pend_req=upd(s.pend_req, (i, e), NIL, active))
    # the guards count a prefill sub-request's parent's output budget (P/D)
    l_in, out = c.input_tokens[r], c.output_tokens[pd.parent_row(st, r) if st.pd else r]
    drop = active & records.unservable(l_in, out, st.max_model_len, st.kv_blocks, st.block_size)
    admitted = active & ~drop
    due = admitted & (c.deadline_us[r] > 0) & (c.deadline_us[r] <= now)
    queued = admitted & ~due
    status = jnp.where(drop, DROPPED, jnp.where(due, TIMED_OUT, QUEUED)).astype(s.status.dtype)
    s = s.replace(
        status=s.status.at[r].set(jnp.where(active, status, s.status[r])),
        dropped=add(s.dropped, i, 1, drop), timed_out=add(s.timed_out, i, 1, due),
        input_tokens=add(s.input_tokens, i, l_in.astype(jnp.int64), admitted),
        enq_seq=s.enq_seq.at[r].set(jnp.where(queued, s.enq_counter, s.enq_seq[r])),
        enq_counter=s.enq_counter + queued.astype(jnp.int64))
    s = _finish_in_flight(s, c, i, r, drop | due)
    s = q_push_back(s, st, i, r, queued)
    if st.stretches:  # steps from now on may admit it: they are no longer plain
        s = stretch.truncate(s, st, i, now, queued)
    start_step = queued & (s.step_time[i] < 0)
    return s.replace(step_time=upd(s.step_time, i, now, start_step))


def timeout(s: SimState, st, c, i, r, now, active) -> SimState:
    """Client deadline for a queued or running request (``Instance._timeout``;
    docs/semantics.md §2.9)."""
    if st.stretches:  # steps at its time come first (event priority); later ones are cut
        s = end_stretch(s, st, c, i, now, active, inclusive=True)
    r = jnp.where(active, r, st.num_requests)
    running = active & (s.status[r] == RUNNING)
    queued = active & ~running
    # a queued decode sub-request (P/D) holds its reserved KV in a reservation slot, a queued
    # request whose tiered admission failed (``blis_quirks``) the blocks it claimed
    s, sb = _release_slot_of(s, st, i, r, active if st.pd or st.kv_hold_slots else running)
    pos = jnp.argmax((s.order[i] == sb) & (jnp.arange(st.batch_slots) < s.n_run[i]))
    s = order_remove_at(s, st, i, pos, running)
    s = q_remove_at(s, st, i, q_offset_of(s, st, i, r, queued), queued)
    s = s.replace(status=s.status.at[r].set(jnp.where(active, TIMED_OUT, s.status[r])
                                            .astype(s.status.dtype)),
                  timed_out=add(s.timed_out, i, 1, active), computed=s.computed.at[r].set(0))
    s = _finish_in_flight(s, c, i, r, active)
    wake = active & (s.n_run[i] == 0) & (s.q_len[i] > 0) & (s.step_time[i] < 0)
    return s.replace(step_time=upd(s.step_time, i, now, wake))


# ---- lifecycle (Decision 16) ------------------------------------------------------------------


def reset_instance(s: SimState, st, i, active) -> SimState:
    """A new instance in slot i (``Instance.restart`` and ``Router.forget_instance``): empty
    KV cache, free list in id order, no pending step or virtual steps, no preemption history,
    and the router knows nothing of it; the slot's counters carry on."""
    k, ring = st.kv_blocks, kv.ring_size(st)
    g = st.num_groups * st.group_blocks_max
    groups = jnp.arange(st.group_slots) // max(g, 1) == i  # the instance's group hash slots

    def row(arr, value):
        return arr.at[i].set(jnp.where(active, value, arr[i]))

    return s.replace(
        step_time=upd(s.step_time, i, -1, active), stretch_steps=upd(s.stretch_steps, i, 0, active),
        ema=upd(s.ema, i, 0.0, active),
        blen=row(s.blen, 0), kv_ref=row(s.kv_ref, 0), kv_tok=row(s.kv_tok, 0),
        kv_slot=row(s.kv_slot, NIL),
        fifo=row(s.fifo, jnp.where(jnp.arange(ring) < k, jnp.arange(ring), NIL).astype(jnp.int32)),
        fkey=row(s.fkey, jnp.arange(k, dtype=jnp.int32)), fhead=upd(s.fhead, i, 0, active),
        ftail=upd(s.ftail, i, k, active), kv_free=upd(s.kv_free, i, k, active),
        slot_block=s.slot_block.at[:st.group_slots].set(
            jnp.where(active & groups, NIL, s.slot_block[:st.group_slots])),
        lru_pos=row(s.lru_pos, -1), lru_own_at=row(s.lru_own_at, 0),
        lru_clock=upd(s.lru_clock, i, 0, active), lru_own=upd(s.lru_own, i, 0, active),
        cold_stamp=upd(s.cold_stamp, i, -1, active),
        recent=recent.reset(s.recent, i, active) if st.recent_signals else s.recent)


class HeldRequests(NamedTuple):
    """The requests instance i holds that are not running (``Instance._held_requests``):
    those in their queueing delay in routing order, then the wait queue in queue order."""

    reqs: jax.Array  # int32 [E + Q] (the sink row past ``count``)
    count: jax.Array  # int32


def held_requests(s: SimState, st, i) -> HeldRequests:
    e, q = st.pending_slots, st.queue_slots
    waiting = s.pend_req[i] >= 0
    order = jnp.argsort(jnp.where(waiting, s.pend_seq[i], jnp.iinfo(jnp.int64).max))
    arriving = jnp.where(waiting[order], s.pend_req[i, order], st.num_requests)
    n_arriving = jnp.sum(waiting).astype(jnp.int32)
    k = jnp.arange(q)
    queued = jnp.where(k < s.q_len[i], s.q_buf[i, (s.q_head[i] + k) % q], st.num_requests)
    # arrivals first, then the queue, packed
    pos = jnp.concatenate([jnp.arange(e), n_arriving + k])
    reqs = jnp.full(e + q + 1, st.num_requests, jnp.int32).at[
        jnp.where(jnp.concatenate([jnp.arange(e) < n_arriving, k < s.q_len[i]]), pos, e + q)
    ].set(jnp.concatenate([arriving, queued]).astype(jnp.int32))[:e + q]
    return HeldRequests(reqs, n_arriving + s.q_len[i])


def take_not_running(s: SimState, st, c, i, now, active) -> tuple[SimState, HeldRequests]:
    """Drain policy ``redirect`` (``Instance.take_not_running``): hand back the requests
    held and not running, leaving no trace of them here. A request preempted here had its own
    prompt blocks cached here; it will never return, so their hash registrations go (the
    reference keeps them in this instance's own cache, where nothing ever looks them up)."""
    held = held_requests(s, st, i)
    on = active & (jnp.arange(held.reqs.shape[0]) < held.count)
    r = jnp.where(on, held.reqs, st.num_requests)
    j = jnp.arange(max(st.max_prompt_blocks, 1))[None, :]
    own = on[:, None] & (j >= c.group_blocks[r][:, None]) & (j < c.full_blocks[r][:, None])
    slots = jnp.where(own, kv.hash_slot(st, c, i, r[:, None], j), st.hash_slots)
    block = s.slot_block[slots]
    mine = own & (block >= 0) & (s.kv_slot[i, jnp.maximum(block, 0)] == slots)
    s = s.replace(
        kv_slot=s.kv_slot.at[i, jnp.where(mine, block, st.kv_blocks)].set(NIL, mode="drop"),
        slot_block=s.slot_block.at[jnp.where(mine, slots, st.hash_slots)].set(NIL),
        pend_req=s.pend_req.at[i].set(jnp.where(active, NIL, s.pend_req[i])),
        q_len=upd(s.q_len, i, 0, active),
        in_flight=upd(s.in_flight, i, jnp.maximum(s.in_flight[i] - held.count, 0), active))
    return _arrivals_cancelled(s, st, i, now, active), held


def _arrivals_cancelled(s: SimState, st, i, now, active) -> SimState:
    """A drain at ``now`` took every request instance i holds outside its batch: the
    arrivals routed to it at this very time never happen (the reference removes their
    arrival events, which would run after the cluster's events), so its clock is what it was
    before them; with --blis-quirks, where arrivals are events of their own, they go."""
    life = s.life
    if st.blis_quirks:
        return s.replace(life=life.replace(arrive_us=life.arrive_us.at[i].set(
            jnp.where(active, INT64_MAX, life.arrive_us[i]))))
    back = active & (s.clock[i] == now)
    return s.replace(clock=upd(s.clock, i, life.clock_before[i], back))


def arrival(s: SimState, st, i, now, active) -> SimState:
    """The arrival event of instance i's earliest α-window entry not yet arrived (BLIS's
    ArrivalEvent, with --blis-quirks and lifecycles): the instance's clock moves to it."""
    life = s.life
    t = life.arrive_us[i]
    e = jnp.argmin(jnp.where(t == now, s.pend_seq[i], jnp.iinfo(jnp.int64).max))
    return s.replace(clock=upd(s.clock, i, now, active),
                     life=life.replace(arrive_us=upd(life.arrive_us, (i, e), INT64_MAX, active)))


def drop_everything(s: SimState, st, c, i, now, active) -> tuple[SimState, jax.Array]:
    """Drain policy ``immediate`` (``Instance.drop_everything``): every request held, running
    or not, is dropped. The instance terminates at once, so its KV cache is left as it is
    (a reused slot starts empty, ``reset_instance``); its virtual steps before ``now``
    happened, the rest never will. Returns (state, requests dropped)."""
    if st.stretches:
        s = end_stretch(s, st, c, i, now, active)
    held = held_requests(s, st, i)
    b = st.batch_slots
    running = jnp.where(active & (jnp.arange(b) < s.n_run[i]), s.slot_req[i, jnp.maximum(
        s.order[i], 0)], st.num_requests)
    reqs = jnp.concatenate([jnp.where(active & (jnp.arange(held.reqs.shape[0]) < held.count),
                                      held.reqs, st.num_requests), running])
    count = jnp.where(active, held.count + s.n_run[i], 0)
    on = reqs < st.num_requests
    s = s.replace(
        status=s.status.at[reqs].set(jnp.where(on, DROPPED, s.status[reqs]).astype(s.status.dtype)),
        tenant_in_flight=tenants_left(s, c, reqs, on),
        in_flight=upd(s.in_flight, i, jnp.maximum(s.in_flight[i] - count, 0), active),
        pend_req=s.pend_req.at[i].set(jnp.where(active, NIL, s.pend_req[i])),
        q_len=upd(s.q_len, i, 0, active), n_run=upd(s.n_run, i, 0, active),
        order=s.order.at[i].set(jnp.where(active, NIL, s.order[i])),
        slot_req=s.slot_req.at[i].set(jnp.where(active, NIL, s.slot_req[i])),
        blen=s.blen.at[i].set(jnp.where(active, 0, s.blen[i])))
    return _arrivals_cancelled(s, st, i, now, active), count


# ---- P/D decode sub-requests (docs/semantics.md §5.10) ----------------------------------------


def reserve_transferred_kv(s: SimState, st, c, i, r, now, active):
    """Reserve KV on instance i for request r's decode sub-request, whose prompt's KV is about
    to arrive (``Instance.reserve_transferred_kv``): fresh blocks for the whole prompt in a
    reservation slot, every block a miss, full blocks registered; its progress is then its
    prompt. Returns ``(state, reserved)``; nothing changes where it does not fit (or no
    reservation slot is free: flagged)."""
    if st.stretches:  # its virtual steps before now happened; the next ones see the blocks
        s = end_stretch(s, st, c, i, now, active)
    free = s.slot_req[i, st.batch_slots:st.hold_base] == NIL
    sb = (st.batch_slots + jnp.argmax(free)).astype(jnp.int32)
    has_room = jnp.any(free)
    l_in, empty = c.input_tokens[r], jnp.zeros(1, jnp.int32)
    ok = active & has_room & kv.can_allocate(s, st, c, i, sb, r, 0, l_in, empty, 0)
    # the whole prompt's blocks in one pass (a prefill's chunk takes a few at a time): in a
    # lockstep block some lane reserves in almost every pass of the cheap events
    s = kv.allocate(s, st, c, i, sb, r, 0, l_in, empty, 0, ok,
                    chunk=max(1, st.max_blocks_per_request))
    q = s.pd
    return s.replace(
        slot_req=upd(s.slot_req, (i, sb), r, ok),
        pi=s.pi.at[jnp.where(ok, r, st.num_requests)].set(l_in),
        pd=q.replace(ovf_reserve=q.ovf_reserve + (active & ~has_room).astype(jnp.int32))), ok


def enqueue_decode(s: SimState, st, c, i, r, now, active) -> SimState:
    """Request r's KV has arrived on instance i (``Instance.enqueue_decode``): its decode
    sub-request joins the wait queue now (no α delay, its prompt not counted again), or
    times out at once, releasing its reservation, when its deadline has passed."""
    due = active & (c.deadline_us[r] > 0) & (c.deadline_us[r] <= now)
    queued = active & ~due
    r_or_sink = jnp.where(active, r, st.num_requests)
    s = s.replace(
        status=s.status.at[r_or_sink].set(jnp.where(due, TIMED_OUT, QUEUED)
                                          .astype(s.status.dtype)),
        timed_out=add(s.timed_out, i, 1, due),
        enq_seq=s.enq_seq.at[r_or_sink].set(jnp.where(queued, s.enq_counter, s.enq_seq[r])),
        enq_counter=s.enq_counter + queued.astype(jnp.int64))
    s, _ = _release_slot_of(s, st, i, r, due)
    s = _finish_in_flight(s, c, i, r, due)
    s = q_push_back(s, st, i, r, queued)
    if st.stretches:  # steps from now on may admit it: they are no longer plain
        s = stretch.truncate(s, st, i, now, queued)
    start_step = queued & (s.step_time[i] < 0)
    return s.replace(step_time=upd(s.step_time, i, now, start_step))


def _admit_decode(s: SimState, st, c, i, r, sb, active):
    """The first admission of a decode sub-request holding its transferred KV (phase 2's
    branch in ``Instance._form_batch``): one decode token allocated in its reservation slot,
    whose blocks then move to running slot sb. Returns ``(state, ok)``."""
    l_in, empty = c.input_tokens[r], jnp.zeros(1, jnp.int32)
    src = jnp.argmax(s.slot_req[i] == r).astype(jnp.int32)
    ok = active & kv.can_allocate(s, st, c, i, src, r, l_in, l_in + 1, empty, 0)
    s = kv.allocate(s, st, c, i, src, r, l_in, l_in + 1, empty, 0, ok, chunk=1)
    s = _move_blocks(s, i, src, sb, ok)
    return s.replace(slot_req=upd(s.slot_req, (i, src), NIL, ok)), ok


def _move_blocks(s: SimState, i, src, dst, active) -> SimState:
    """Slot dst of instance i takes the blocks of slot src (src != dst where ``active``),
    which is left empty."""
    # one gather and one scatter per array: a second read of the old array after a first
    # write would make XLA copy the whole block table
    pair = jnp.stack([src, dst])
    tables, held = s.bt[i, pair], s.blen[i, pair]
    empty_row = jnp.full_like(tables[0], NIL)
    return s.replace(
        bt=s.bt.at[i, pair].set(jnp.where(active, jnp.stack([empty_row, tables[0]]), tables)),
        blen=s.blen.at[i, pair].set(jnp.where(active, jnp.stack([0, held[0]]), held)))


# ---- batch formation (FormBatch) --------------------------------------------------------------


def clamp_prefill(st, n, start, budget):
    """Chunk size: long-prefill threshold, then token budget, then max-model-len cap."""
    thr = st.long_prefill_threshold
    if thr > 0:
        n = jnp.where(n > thr, thr, n)
    n = jnp.minimum(n, budget)
    if st.max_model_len > 0:
        n = jnp.minimum(n, jnp.maximum(st.max_model_len - 1 - start, 0))
    return n.astype(jnp.int32)


def victim_position(s: SimState, st, c, p, i, width: int):
    """fcfs: the tail; priority: least urgent, latest arrival, tail-most among equals."""
    n = s.n_run[i]
    pos = jnp.arange(width)
    valid = pos < n
    r = jnp.where(valid, s.slot_req[i, jnp.maximum(s.order[i, :width], 0)], st.num_requests)
    neg = -s.prio[r]
    m1 = jnp.max(jnp.where(valid, neg, -jnp.inf))
    cand = valid & (neg == m1)
    m2 = jnp.max(jnp.where(cand, c.arrival_us[r], -1))
    cand = cand & (c.arrival_us[r] == m2)
    by_priority = jnp.max(jnp.where(cand, pos, -1)).astype(jnp.int32)
    return jnp.where(p.preemption == PreemptionPolicy.FCFS, n - 1, by_priority)


def evict(s: SimState, st, c, p, i, vpos, budget, active):
    """Preempt the request at running position vpos: progress lost, KV freed, queue front."""
    sb = s.order[i, jnp.maximum(vpos, 0)]
    sb0 = jnp.maximum(sb, 0)
    r = jnp.where(active, s.slot_req[i, sb0], st.num_requests)
    budget = (budget + jnp.where(active & (s.num_new[r] > 0), s.num_new[r], 0)).astype(jnp.int32)
    s = kv.release(s, st, i, sb0, active)
    # Each write below is tied (``after_reads``) to results of what read its array's old value
    # — the victim's request and grant, then the release and slot writes that used its slot —
    # so XLA updates num_new, slot_req and order in place; otherwise it copies them whole at
    # every eviction (fusion re-reads the slot inside each kernel that uses it). All tie
    # values are >= 0: r, the budget, ftail, a block count, a slot's request + 1.
    tie = jnp.minimum(r, jnp.maximum(budget, 0))
    s = s.replace(
        num_new=s.num_new.at[r].set(after_reads(jnp.int32(0), tie)),
        status=s.status.at[r].set(QUEUED),
        pi=s.pi.at[r].set(0), itl_sum=s.itl_sum.at[r].set(0), computed=s.computed.at[r].set(0),
        preempt=s.preempt.at[r].add(1), preempt_count=add(s.preempt_count, i, 1, active),
        slot_req=upd(s.slot_req, (i, sb0), after_reads(NIL, tie), active))
    done = jnp.minimum(jnp.minimum(tie, s.ftail[i]),
                       jnp.minimum(s.blen[i, sb0], s.slot_req[i, sb0] + 1))
    s = order_remove_at(s, st, i, after_reads(vpos, done), active)
    s = q_push_front(s, st, i, r, active)
    return s, budget, sb


class PreemptOutcome(NamedTuple):
    """What ``preempt_for_tokens`` did besides changing the state."""

    success: jax.Array  # bool: the tokens were allocated (the request was not itself evicted)
    pos: jax.Array  # int32: the cursor, moved back by one per victim evicted before it
    budget: jax.Array  # int32: tokens left, with the victims' grants of this step refunded
    preempted: jax.Array  # bool: some request was evicted


def preempt_for_tokens(s: SimState, st, c, p, i, sb, r, n, pos, budget, active, width: int):
    """Evict victims until n tokens of running request r fit, then allocate them
    (``Instance._preempt_for_tokens``; docs/semantics.md §2.5). Returns
    ``(state, PreemptOutcome)``."""
    empty = jnp.zeros(1, jnp.int32)
    no_prefix = jnp.full(max(st.max_prompt_blocks, 1), NIL, jnp.int32)

    def body(carry, go):
        s, pos, budget, pre, failed, going = carry  # masked by `going` (== go) throughout
        pi = s.pi[r]
        if st.tiered:  # each attempt reloads, then allocates if it can (kv.tiered_allocate)
            s, tried = kv.tiered_allocate(s, st, c, i, sb, r, pi, pi + n, no_prefix, 0,
                                          going)
            ok = tried.ok
        else:
            ok = kv.can_allocate(s, st, c, i, sb, r, pi, pi + n, empty, 0)
        no_one = s.n_run[i] == 0
        do_evict = going & ~ok & ~no_one
        vpos = victim_position(s, st, c, p, i, width)
        s, budget, vslot = evict(s, st, c, p, i, vpos, budget, do_evict)
        self_evicted = do_evict & (vslot == sb)
        pos = jnp.where(do_evict & ~self_evicted & (vpos < pos), pos - 1, pos)
        failed = failed | (going & ~ok & no_one) | self_evicted
        return s, pos, budget, pre | do_evict, failed, going & ~ok & ~failed

    init = (s, pos, budget, jnp.asarray(False), jnp.asarray(False), active)
    s, pos, budget, pre, failed, _ = lane_while(lambda c: c[5], body, init)
    success = active & ~failed
    if not st.tiered:
        pi = s.pi[r]
        s = kv.allocate(s, st, c, i, sb, r, pi, pi + n, empty, 0, success)
    return s, PreemptOutcome(success, pos, budget, pre)


class Wants(NamedTuple):
    """What running requests ask for in phase 1 (``_continue_wants``); shapes of r."""

    needs: jax.Array  # bool: the request is served this step if the budget allows
    tokens: jax.Array  # int32: its prefill chunk, or 1 for a decode token
    prefill: jax.Array  # bool: it is in prefill


def _continue_wants(s: SimState, st, c, r) -> Wants:
    """Tokens each running request r[k] asks for in phase 1, before the token budget: its
    prefill chunk (long-prefill threshold, max-model-len cap) or one decode token; 0 for a
    request that gets nothing (length-capped decode, or no output tokens)."""
    l_in, pi = c.input_tokens[r], s.pi[r]
    prefill = pi < l_in
    decode = ~prefill & (c.output_tokens[r] > 0)
    if st.max_model_len > 0:
        decode = decode & ~(pi + 1 > st.max_model_len - 1)
    chunk = clamp_prefill(st, l_in - pi, pi, jnp.asarray(st.token_budget, jnp.int32))
    return Wants(prefill | decode, jnp.where(prefill, chunk, 1), prefill)


def phase1_fast(s: SimState, st, c, i, active, width: int, start=0, budget=None,
                reset: bool = False):
    """Phase 1 for the running requests from position ``start`` on whose KV fits without
    preemption, all at once; ``budget``: tokens left (default: the whole step budget).
    ``reset``: the step's first pass; every running request's grant is written (0 if not
    served), which is the step's reset of last step's grants in the same scatter.

    Sequentially, request k gets ``min(want_k, budget left)`` tokens while the budget is
    positive, so with prefix sums of the wants: k is served iff the wants before it sum to less
    than the budget. Each pre-check ``fresh_k <= free blocks left`` holds for every k up to
    the first k whose running sum of fresh blocks exceeds the free count; from there on the
    sequential loop (with preemption) takes over. Returns (state, that position, budget left).
    """
    if budget is None:
        budget = jnp.asarray(st.token_budget, jnp.int32)
    run_slots = _running(s, st, i, width)
    valid, slots, reqs = run_slots.valid, run_slots.slots, run_slots.reqs
    valid = valid & (jnp.arange(width) >= start)
    r = jnp.where(valid & active, reqs, st.num_requests)
    wants = _continue_wants(s, st, c, r)
    needs, want, prefill = wants.needs, wants.tokens, wants.prefill
    needs = needs & valid & active
    want = jnp.where(needs, want, 0)
    before = prefix_sum(want) - want
    served = needs & (before < budget)
    n = jnp.where(served, jnp.minimum(want, budget - before), 0).astype(jnp.int32)
    fill = kv.last_block_fill(s, st, i, slots)
    blen, last, filled = fill.blen, fill.last, fill.filled
    fresh = jnp.where(served, kv.blocks_needed(st, blen, filled, n), 0).astype(jnp.int32)
    fresh_through = prefix_sum(fresh)
    short = served & (fresh_through > s.kv_free[i])
    if st.tiered:  # a request holding fewer blocks than its full prompt blocks may reload
        # from the CPU tier (a prefill chunk; a decode token of a request whose whole prompt
        # was cached at admission holds only its decode blocks): the loop allocates it
        short = short | (served & (blen < c.full_blocks[r]))
    stop = jnp.where(jnp.any(short), jnp.argmax(short), width).astype(jnp.int32)
    before_stop = jnp.arange(width) < stop
    ok = served & before_stop
    # the grant's fresh blocks are these up to stop (the same formula), none after it
    through_stop = jnp.where(stop > 0, fresh_through[jnp.maximum(stop - 1, 0)], 0)
    known = kv.KnownGrant(blen, last, filled,
                          jnp.where(before_stop, fresh_through, through_stop))
    s = kv.grant_tokens(s, st, c, i, slots, r, n, s.pi[r], prefill, ok, known=known)
    r_or_sink = jnp.where(ok, r, st.num_requests)
    if reset:
        granted = s.num_new.at[r].set(jnp.where(ok, n, 0))
    else:
        granted = s.num_new.at[r_or_sink].set(n)
    s = s.replace(num_new=granted, computed=s.computed.at[r_or_sink].add(n))
    budget = (budget - jnp.sum(jnp.where(ok, n, 0))).astype(jnp.int32)
    return s, stop, budget


def phase1(s: SimState, st, c, p, i, active, width: int):
    """Continue running requests in batch order: prefill chunks, then one decode token each;
    positions 0..width-1 (>= n_run). Resets last step's grants. Returns (state, budget left,
    whether anything was preempted).

    The vectorized pass (``phase1_fast``) serves every request up to the first one whose KV
    does not fit; the loop below serves that one with preemption, then resumes the vectorized
    pass after it. Its trip count is the number of such shortfalls in the step (usually none),
    not the number of requests after the first one, so one lane's preemption does not keep
    every lane of a lockstep block waiting for a request-by-request loop."""
    s, stop, budget = phase1_fast(s, st, c, i, active, width, reset=True)

    def cond(carry):
        s, pos, budget, pre, halt = carry
        return active & ~halt & (pos < s.n_run[i]) & (budget > 0)

    def body(carry, go):
        s, pos, budget, pre, halt = carry
        sb = s.order[i, jnp.minimum(pos, st.batch_slots - 1)]
        r = jnp.where(go, s.slot_req[i, jnp.maximum(sb, 0)], st.num_requests)
        wants = _continue_wants(s, st, c, r)
        needs, want = wants.needs, wants.tokens
        need = go & needs
        n = jnp.minimum(want, budget).astype(jnp.int32)
        s, outcome = preempt_for_tokens(s, st, c, p, i, jnp.maximum(sb, 0), r, n, pos, budget,
                                        need, width)
        ok, pos, budget, pre_now = outcome.success, outcome.pos, outcome.budget, outcome.preempted
        granted = need & ok
        r_or_sink = jnp.where(granted, r, st.num_requests)
        s = s.replace(num_new=s.num_new.at[r_or_sink].set(n),
                      computed=s.computed.at[r_or_sink].add(n))
        budget = jnp.where(granted, budget - n, budget).astype(jnp.int32)
        halt_now = need & ~ok
        pos = jnp.where(go & ~halt_now, pos + 1, pos)
        more = go & ~halt_now & (budget > 0)
        s, stop, budget = phase1_fast(s, st, c, i, more, width, pos, budget)
        pos = jnp.where(more, stop, pos)
        return s, pos, budget, pre | pre_now, halt | halt_now

    init = (s, stop, budget, jnp.asarray(False), jnp.asarray(False))
    s, _, budget, pre, _ = lane_while(cond, body, init)
    return s, budget, pre


def phase2(s: SimState, st, c, p, i, now, budget, preempted, active):
    """Admit from the wait queue while slots, budget and KV allow; stops at the first misfit."""

    def cond(carry):
        s, budget, stop = carry
        return (active & ~stop & ~preempted & (s.n_run[i] < st.batch_slots) & (s.q_len[i] > 0)
                & (budget > 0))

    def body(carry, go):
        s, budget, stop = carry
        k = head_offset(s, st, c, p, i, now, go)
        r = q_at(s, st, i, k)
        sb = jnp.argmax(s.slot_req[i, :st.batch_slots] == NIL).astype(jnp.int32)
        if st.pd:  # a decode sub-request holding its transferred KV: its first decode token
            held = (s.pd.phase[jnp.minimum(r, st.num_requests)] == DECODE) \
                & (r <= st.num_requests) & (s.pi[r] >= c.input_tokens[r])
            s, decode_ok = _admit_decode(s, st, c, i, r, sb, go & held)
            go_prefill = go & ~held
        else:
            held, go_prefill = jnp.asarray(False), go

        def prefix(carry, go, w):
            """Cached prefix (at width w), chunk, pre-check, and the claim of the cached
            blocks — the part of the allocation that follows the prefix's width."""
            s, start, n, ok = carry
            prefix_found = kv.cached_blocks(s, st, c, i, r, w)
            cached, n_cached = prefix_found.blocks, prefix_found.count
            start_w = n_cached * st.block_size
            n_w = clamp_prefill(st, c.input_tokens[r] - start_w, start_w, budget)
            ok_w = go & kv.can_allocate(s, st, c, i, sb, r, start_w, start_w + n_w, cached,
                                        n_cached)
            claim = ok_w & (n_w > 0) & (s.blen[i, sb] == 0) & (n_cached > 0)
            s = kv.claim_cached(s, st, i, sb, cached, n_cached, claim)
            return (s, jnp.where(go, start_w, start), jnp.where(go, n_w, n), ok | ok_w)

        if st.tiered:
            s, start, n, ok, allocated = _admit_tiered(s, st, c, p, i, sb, r, budget,
                                                       go_prefill)
        else:
            widths = kv.prefix_widths(st)
            need = lane_max(jnp.where(go_prefill, jnp.where(s.preempt[r] > 0, widths[-1],
                                                            widths[0]), 0))
            zero = jnp.asarray(0, jnp.int32)
            s, start, n, ok = by_width(widths, need, go_prefill, prefix,
                                       (s, zero, zero, jnp.zeros_like(go)))
            allocated = jnp.zeros_like(ok)
        if st.pd:
            start = jnp.where(held, c.input_tokens[r], start)
            n = jnp.where(held, 1, n).astype(jnp.int32)
            ok = jnp.where(held, decode_ok, ok)
            allocated = allocated | held
        s, r = q_remove_at(s, st, i, k, ok, through=r)  # r read before the queue moves
        s = kv.allocate(s, st, c, i, sb, r, start, start + n, jnp.zeros(1, jnp.int32), 0,
                        ok & ~allocated)
        r_or_sink = jnp.where(ok, r, st.num_requests)
        if st.stateful_latency:  # physics reads the prefix tokens of this step's admissions
            s = s.replace(step_cached=upd(s.step_cached, (i, sb), start, ok))
        s = s.replace(
            order=upd(s.order, (i, s.n_run[i]), sb, ok), n_run=add(s.n_run, i, 1, ok),
            slot_req=upd(s.slot_req, (i, sb), r, ok), status=s.status.at[r_or_sink].set(RUNNING),
            num_new=s.num_new.at[r_or_sink].set(n),
            computed=s.computed.at[r_or_sink].set(n + start),
            sched=s.sched.at[r_or_sink].set(now - c.arrival_us[r]),
            prio=s.prio.at[r_or_sink].set(priority_score(s, st, p, c, r, now)))
        if st.recent_signals:  # the admission's wait and cache hits (routing programs)
            s = recent.record(s, i, now, recent.WAIT, now - c.arrival_us[r], 1, ok)
            s = recent.record(s, i, now, recent.HIT, start, c.input_tokens[r], ok)
        return s, jnp.where(ok, budget - n, budget).astype(jnp.int32), stop | (go & ~ok)

    s, _, _ = lane_while(cond, body, (s, budget, jnp.asarray(False)))
    return s


def _admit_tiered(s: SimState, st, c, p, i, sb, r, budget, go):
    """The allocation of admitting r with a CPU tier; returns ``(state, start, chunk, ok,
    allocated)``, ``allocated``: the blocks are already granted (else the caller grants
    [start, start + chunk) after the claim made here).

    Decision 12 (default): the reload runs before the chunk is sized, passing over the
    request's own cached-but-free blocks, so what it reloads counts as cached in this step;
    a failure without a reload is a CPU miss. With ``blis_quirks``: BLIS's order — the chunk
    is sized from the GPU's cached prefix, then ``kv.tiered_allocate`` reloads and allocates."""
    bs = st.block_size
    found = kv.cached_blocks(s, st, c, i, r)
    cached, n_cached = found.blocks, found.count
    if st.blis_quirks:
        start = n_cached * bs
        n = clamp_prefill(st, c.input_tokens[r] - start, start, budget)
        if not st.kv_hold_slots:  # a program built without holder slots
            s, tried = kv.tiered_allocate(s, st, c, i, sb, r, start, start + n, cached,
                                          n_cached, go)
            t = s.tier
            refused = go & ~tried.ok & (s.blen[i, sb] > 0)
            s = s.replace(tier=t.replace(hold_overflow=t.hold_overflow
                                         + refused.astype(jnp.int32)))
            return s, start, n, tried.ok, tried.ok
        # a request still holding the blocks of an earlier failed admission allocates there
        holding = s.slot_req[i, st.hold_base:] == r
        held = go & jnp.any(holding)
        src = jnp.where(held, st.hold_base + jnp.argmax(holding), sb).astype(jnp.int32)
        s, tried = kv.tiered_allocate(s, st, c, i, src, r, start, start + n, cached,
                                      n_cached, go)
        s = _settle_held_blocks(s, st, i, r, sb, src, held, tried.ok, go)
        return s, start, n, tried.ok, tried.ok
    keep = kv.keep_mask(s, st, i, cached, n_cached, go)
    s, count = kv.reload_prefix(s, st, c, i, r, n_cached, keep, go)
    found = kv.cached_blocks(s, st, c, i, r)
    cached, n_cached = found.blocks, found.count
    start = n_cached * bs
    n = clamp_prefill(st, c.input_tokens[r] - start, start, budget)
    ok = go & kv.can_allocate(s, st, c, i, sb, r, start, start + n, cached, n_cached)
    claim = ok & (n > 0) & (s.blen[i, sb] == 0) & (n_cached > 0)
    s = kv.claim_cached(s, st, i, sb, cached, n_cached, claim)
    t = s.tier
    s = s.replace(tier=t.replace(cpu_misses=add(t.cpu_misses, i, 1, go & ~ok & (count == 0))))
    return s, start, n, ok, jnp.zeros_like(ok)


def _settle_held_blocks(s: SimState, st, i, r, sb, src, held, ok, go) -> SimState:
    """After a tiered admission of r with ``blis_quirks`` (``_admit_tiered``): admitted, the
    blocks it held move from its holder slot ``src`` to its running slot sb; refused, blocks
    it claimed before failing (``kvcache.tiered_allocate``) stay its own while it waits, in a
    holder slot (none free: flagged, ``KVTierState.hold_overflow``)."""
    s = _move_blocks(s, i, src, sb, held & ok)
    s = s.replace(slot_req=upd(s.slot_req, (i, src), NIL, held & ok))
    keeps = go & ~held & ~ok & (s.blen[i, sb] > 0)
    free = s.slot_req[i, st.hold_base:] == NIL
    room = jnp.any(free)
    h = (st.hold_base + jnp.argmax(free)).astype(jnp.int32)
    s = _move_blocks(s, i, sb, h, keeps & room)
    t = s.tier
    return s.replace(slot_req=upd(s.slot_req, (i, h), r, keeps & room),
                     tier=t.replace(hold_overflow=t.hold_overflow
                                    + (keeps & ~room).astype(jnp.int32)))


# ---- execute (the step's duration and progress) ----------------------------------------------


class RunningSlots(NamedTuple):
    """Running positions 0 .. width - 1 of an instance (``_running``); each [width]."""

    valid: jax.Array  # bool: position < n_run
    slots: jax.Array  # int32: the position's batch slot (0 where not valid)
    reqs: jax.Array  # int32: the slot's request (N, the sink row, where not valid)


class Running(NamedTuple):
    """What ``execute`` read and wrote of running positions 0 .. width - 1, for
    ``complete``; each [width], request fields at N (the sink row) where not valid."""

    valid: jax.Array  # bool: position < n_run
    slots: jax.Array  # int32: batch slot
    reqs: jax.Array  # int32: request
    pi: jax.Array  # int32: progress after the step
    l_in: jax.Array  # int32: input tokens
    out: jax.Array  # int32: output tokens


def _running(s: SimState, st, i, width: int) -> RunningSlots:
    """Valid flags, batch slots and requests of running positions 0..width-1 (width >=
    n_run)."""
    pos = jnp.arange(width)
    valid = pos < s.n_run[i]
    slots = jnp.maximum(s.order[i, :width], 0)
    reqs = jnp.where(valid, s.slot_req[i, slots], st.num_requests)
    return RunningSlots(valid, slots, reqs)


def step_duration(c, cm, dc):
    """max(1, trunc(((0 + β0) + β1·cm) + β2·dc)) from host-exact tables (one device add)."""
    return jnp.maximum(1, float_to_ticks_array(c.step_prefill[cm] + c.step_decode[dc], jnp))


def execute(s: SimState, st, c, i, now, n_preempted, active, width: int, factor=None):
    """Step time from the scheduled requests; then progress, ITL and TTFT
    (``Instance._execute``; docs/semantics.md §2.6). ``factor``: a warming-up instance's
    (``lifecycle.warm_factor``)."""
    run_slots = _running(s, st, i, width)
    valid, slots, reqs = run_slots.valid, run_slots.slots, run_slots.reqs
    nn = jnp.where(valid, s.num_new[reqs], 0)
    pi, l_in, out = s.pi[reqs], c.input_tokens[reqs], c.output_tokens[reqs]
    if st.stateful_latency or st.latency is not None:
        # physics in the program, or a model through the reference's own code on the host
        cached = jnp.where(valid, s.step_cached[i, slots], 0)
        inputs = (nn, pi, l_in, out, cached, s.ema[i], n_preempted, s.n_run[i])
        d, ema = (physics.step_time(c.physics, *inputs) if st.latency is None
                  else hostlatency.step_time(st.latency, active, *inputs))
        s = s.replace(ema=upd(s.ema, i, ema, active))
    elif st.latency_model == "roofline":
        d = roofline.step_time_us(c.roofline, nn, pi, l_in, out)
    else:
        cm = jnp.sum(jnp.where((nn > 0) & (pi < l_in), nn, 0))
        dc = jnp.sum(jnp.where((nn > 0) & (pi >= l_in) & (out > 0), nn, 0))
        d = step_duration(c, cm, dc)
    if st.tiered:  # reloads of this step's batch formation add their transfer time (§3.8)
        d = jnp.maximum(1, d + s.tier.pending_us[i])
        t = s.tier
        s = s.replace(tier=t.replace(pending_us=upd(t.pending_us, i, 0, active)))
    d = lifecycle.slowed(d, factor)
    itl = d + st.otp_us
    on = valid & active
    dec = on & (pi >= l_in) & (nn > 0)
    new_pi = jnp.where(pi < l_in, s.computed[reqs], jnp.where(nn > 0, pi + 1, pi))
    # Progress alone says what BLIS keeps flags and counters for: a prefill chunk ends at
    # most at the prompt's end, and each decode step adds one token and one ITL entry, so
    # "TTFT recorded" is pi >= l_in and the ITL count is pi - l_in (both reset on eviction
    # with pi; input lengths are >= 1). No per-request flag or count to gather and scatter.
    first = on & (pi < l_in) & (new_pi == l_in)
    sink = st.num_requests
    r_or_sink = jnp.where(on, reqs, sink)
    ttft = now + d + st.otp_us - c.arrival_us[reqs]
    s = s.replace(
        pi=s.pi.at[r_or_sink].set(new_pi),
        itl_sum=s.itl_sum.at[jnp.where(dec, reqs, sink)].add(itl),
        ttft=s.ttft.at[jnp.where(first, reqs, sink)].set(ttft))
    if st.recent_signals:  # this step's first tokens (routing programs)
        s = recent.record(s, i, now, recent.TTFT, jnp.sum(jnp.where(first, ttft, 0)),
                          jnp.sum(first.astype(jnp.int64)), active)
    if st.itl_capacity > 0:
        slot = c.itl_offset[reqs] + new_pi - l_in - 1  # this entry's index among r's ITLs
        s = s.replace(itl_buf=s.itl_buf.at[jnp.where(dec, slot, st.itl_capacity)].set(
            itl.astype(jnp.int32), mode="drop"))
    used = (st.kv_blocks - s.kv_free[i]).astype(jnp.int64)
    s = s.replace(peak_used=upd(s.peak_used, i, jnp.maximum(s.peak_used[i], used), active),
                  busy=add(s.busy, i, d, active),
                  qdepth_time=add(s.qdepth_time, i, s.q_len[i].astype(jnp.int64) * d, active))
    return s, d, Running(valid, slots, reqs, new_pi, l_in, out)


# ---- completions ------------------------------------------------------------------------------


def complete(s: SimState, st, c, i, now, d, active, running: Running, defer: bool = False):
    """Completions and length caps, accounted at the step start, in batch order
    (``Instance._complete`` and ``_finish``; docs/semantics.md §2.7).
    ``running``: what ``execute`` read and wrote of the running positions, so it is not read
    again. ``defer``: queue
    the releases (``kv.defer_release``) for the block's pass across lanes instead of running
    them here, and return ``(state, plan)``: the lanes whose completions all go in one pass
    are left to ``complete_planned`` (``_plan_queued``); the others took the loop here."""
    valid, slots, reqs = running.valid, running.slots, running.reqs
    pi, l_in, out = running.pi, running.l_in, running.out
    width = valid.shape[0]
    done = records.output_finished(pi, l_in, out)
    capped = ~done & records.at_length_cap(pi, st.max_model_len)
    fin = valid & active & (done | capped)
    count = jnp.sum(fin.astype(jnp.int32)).astype(jnp.int32)
    if st.recent_signals:  # the completed requests' ITL entries (routing programs)
        s = recent.record(s, i, now, recent.ITL, jnp.sum(jnp.where(fin, s.itl_sum[reqs], 0)),
                          jnp.sum(jnp.where(fin, pi - l_in, 0).astype(jnp.int64)), active)
    fin_through = prefix_sum(fin)  # finishing positions at or before each position
    rank = fin_through - 1  # k-th finishing position has rank k
    empty = jnp.zeros(1, jnp.int32)
    left = now + d

    if defer:
        plan = _plan_queued(s, st, c, i, fin, done, rank, count, running, active)
        fast = plan.fast
    else:
        fast = jnp.asarray(False)
    count_loop = jnp.where(fast, 0, count)  # what the one-at-a-time loop below still does

    def body(carry, go):
        s, k = carry
        pos = jnp.argmax(fin & (rank == k))
        sb, r = slots[pos], jnp.where(go, reqs[pos], st.num_requests)
        p_r, l_r, o_r = pi[pos], l_in[pos], out[pos]  # as execute left them
        final = go & done[pos] & (o_r > 0) & (p_r < l_r + o_r)
        if defer:
            # The releases of earlier completions are queued; the final token's block comes
            # from the free list's head, which they would only reach empty.
            s = lane_once(go & kv.must_flush(s, i, final),
                             lambda s, go: kv.flush_releases(s, st, go), s)
        if st.tiered:  # the tiered allocation (it may reload, see phase1_fast)
            no_prefix = jnp.full(max(st.max_prompt_blocks, 1), NIL, jnp.int32)
            s, got = kv.tiered_allocate(s, st, c, i, sb, r, p_r, p_r + 1, no_prefix, 0, final,
                                        chunk=1)
            ok = got.ok
        else:
            ok = final & kv.can_allocate(s, st, c, i, sb, r, p_r, p_r + 1, empty, 0)
            s = kv.allocate(s, st, c, i, sb, r, p_r, p_r + 1, empty, 0, ok, chunk=1)
        # a final token that finds no block is counted; the request completes all the same
        s = s.replace(alloc_failures=add(s.alloc_failures, i, 1, final & ~ok))
        s = kv.defer_release(s, st, i, sb, go) if defer else kv.release(s, st, i, sb, go)
        t = c.tenant[r]
        # E2E, output tokens done and the length-cap flag are functions of progress, TTFT
        # and ITL sum, which no longer change: ``run.lane_result`` derives them.
        s = s.replace(
            status=s.status.at[r].set(COMPLETED),
            slot_req=upd(s.slot_req, (i, sb), NIL, go),
            tenant_in_flight=upd(s.tenant_in_flight, t,
                                 jnp.maximum(s.tenant_in_flight[t] - 1, 0), go))
        return s, k + go.astype(k.dtype)

    s, _ = lane_while(lambda cr: cr[1] < count_loop, body, (s, jnp.asarray(0, jnp.int32)))
    keep = valid & ~fin
    # valid positions are 0 .. n_run - 1, so the kept ones up to position k number
    # k + 1 - fin_through[k]
    dest = jnp.where(keep, jnp.arange(width) - fin_through, width)
    row = jnp.full(width + 1, NIL, jnp.int32).at[dest].set(s.order[i, :width])[:-1]
    s = s.replace(
        order=s.order.at[i, :width].set(jnp.where(active, row, s.order[i, :width])),
        n_run=add(s.n_run, i, -count, active),
        completed=add(s.completed, i, count.astype(jnp.int64), active),  # capped ones too
        capped_count=add(s.capped_count, i, jnp.sum((fin & capped).astype(jnp.int64)), active),
        in_flight=s.in_flight.at[i].set(jnp.maximum(s.in_flight[i] - count, 0)),
        last_left=upd(s.last_left, i, jnp.maximum(s.last_left[i], left),
                      active & (count > 0) & (left <= st.horizon_us)))
    return (s, plan) if defer else s


class QueuedPlan(NamedTuple):
    """A step's completions to run in one pass (``_plan_queued``), over the release queue's
    positions k (``state.DEFERRED_RELEASES``): the k-th finishing request, its batch slot, the
    block fill of its slot, whether its final token is allocated and needs a fresh block."""

    fast: jax.Array  # the lane's completions all go in the pass
    count: jax.Array  # completions; they sit at queue positions k < count
    sb: jax.Array
    r: jax.Array
    pos: jax.Array  # the final token's position (the request's progress)
    prefill: jax.Array
    final: jax.Array
    blen: jax.Array
    last: jax.Array
    filled: jax.Array
    fresh: jax.Array
    general: jax.Array  # some final token takes a fresh block or registers its top-up


def no_plan(s: SimState) -> QueuedPlan:
    """A plan that does nothing (the carry's start value before the width programs)."""
    depth = s.rel_slots.shape[0]
    zeros, false = jnp.zeros(depth, jnp.int32), jnp.zeros(depth, bool)
    return QueuedPlan(jnp.asarray(False), jnp.asarray(0, jnp.int32), zeros, zeros, zeros,
                      false, false, zeros, zeros, zeros, zeros, jnp.asarray(False))


def _plan_queued(s: SimState, st, c, i, fin, done, rank, count, running: Running,
                 active) -> QueuedPlan:
    """Whether all of a step's completions can go in one pass, their releases queued
    (``kv.defer_release``), and what that pass needs; ``fast`` False where the lane must take
    the one-at-a-time loop instead.

    Exact where the release queue holds them all and the free list holds every final-token
    block at the step's start: a completion's final token then tops up its own last block or
    takes the block at the free list's head, which the earlier completions' releases (appended
    at the tail) would not have reached, and its pre-check passes with or without them. So the
    final tokens are one ``grant_tokens`` call in batch order, and the per-completion updates
    are scatters. Inside ``vmap`` the loop runs as many trips as the block's busiest lane has
    completions, each costing all lanes; the pass runs once, over the queue's few positions.
    The plan is made inside the step's width programs (it reads their running positions) and
    run once after them (``complete_planned``): it needs none of their width, and nothing in
    between writes what it reads."""
    slots, reqs = running.slots, running.reqs
    pi, l_in, out = running.pi, running.l_in, running.out
    depth = s.rel_slots.shape[0]
    k = jnp.arange(depth, dtype=jnp.int32)
    width = fin.shape[0]
    # the k-th finishing position, for k < count (count <= depth where it is used)
    pos = jnp.zeros(depth, jnp.int32).at[jnp.where(fin & (rank < depth), rank, depth)].set(
        jnp.arange(width, dtype=jnp.int32), mode="drop")
    on = k < count
    sb, r = slots[pos], jnp.where(on, reqs[pos], st.num_requests)
    p_r, l_r, o_r = pi[pos], l_in[pos], out[pos]
    final = on & done[pos] & (o_r > 0) & (p_r < l_r + o_r)
    fill = kv.last_block_fill(s, st, i, sb)
    blen, last, filled = fill.blen, fill.last, fill.filled
    fresh = jnp.where(final, kv.blocks_needed(st, blen, filled, 1), 0).astype(jnp.int32)
    room = (count <= depth - s.rel_count) & ((s.rel_count == 0) | (s.rel_inst == i))
    fast = active & (count > 0) & room & (jnp.sum(fresh) <= s.kv_free[i])
    if st.tiered:  # a final token that may reload takes the loop (kv.tiered_allocate)
        fast = fast & ~jnp.any(final & (blen < c.full_blocks[r]))
    # Most final tokens only top up their last block; fresh blocks (or a top-up that would
    # register a prompt block, which a decode token never completes) take ``grant_tokens``.
    top_reg = (filled + 1 == st.block_size) & (blen - 1 < c.full_blocks[r])
    general = jnp.any(final & ((fresh > 0) | top_reg))
    return QueuedPlan(fast, count, sb, r, p_r, p_r < l_r, final, blen, last, filled, fresh,
                      general)


def complete_planned(s: SimState, st, c, i, plan: QueuedPlan) -> SimState:
    """Run ``plan`` (``_plan_queued``) where its ``fast`` holds: the final tokens, then status,
    slot, tenant in-flight and release-queue updates as scatters over the queue's positions."""
    depth = s.rel_slots.shape[0]
    k = jnp.arange(depth, dtype=jnp.int32)
    sb, r, final, fresh, general = plan.sb, plan.r, plan.final, plan.fresh, plan.general
    on = k < plan.count

    def grant(s, go):
        return kv.grant_tokens(s, st, c, i, sb, r, jnp.ones(depth, jnp.int32), plan.pos,
                               plan.prefill,
                               final & go, chunk=depth,
                               known=kv.KnownGrant(plan.blen, plan.last, plan.filled,
                                                   prefix_sum(jnp.where(go, fresh, 0))))

    def queued(s, go):
        m = on & go
        s = lane_once(go & general, grant, s)
        top = final & go & ~general  # every final token of the lane tops up
        s = s.replace(kv_tok=s.kv_tok.at[i, jnp.where(top, plan.last, st.kv_blocks)].add(
            1, mode="drop"))
        if st.tiered:  # a block the final token fills gets its hash (kv.grant_tokens)
            filled = top & (plan.filled + 1 == st.block_size)
            s, _ = kv.register_keys(s, st, c, i, r, plan.blen - 1,
                                    s.bt[i, sb, jnp.maximum(plan.blen - 2, 0)], plan.last,
                                    filled, plan.pos - plan.filled)
        return s.replace(
            status=s.status.at[jnp.where(m, r, st.num_requests)].set(COMPLETED, mode="drop"),
            slot_req=s.slot_req.at[i, jnp.where(m, sb, st.slot_count)].set(NIL, mode="drop"),
            tenant_in_flight=tenants_left(s, c, r, m),
            rel_slots=s.rel_slots.at[jnp.where(m, s.rel_count + k, depth)].set(sb, mode="drop"),
            rel_inst=jnp.where(go, jnp.asarray(i, jnp.int32), s.rel_inst),
            rel_count=s.rel_count + jnp.where(go, plan.count, 0))

    return lane_once(plan.fast, queued, s)


# ---- the step ---------------------------------------------------------------------------------


class Finished(NamedTuple):
    """What the step's execute-and-complete program (``_finish_at``) hands on."""

    state: SimState
    releases: QueuedPlan | None  # with deferred releases: the completions' one-pass plan
    outlook: stretch.BatchOutlook | None  # with decode stretches: the batch left running


def _finish_at(s: SimState, st, c, i, now, n_preempted, go, width: int,
               defer: bool = False, factor=None) -> Finished:
    """Execute and complete over running positions 0..width-1 (>= n_run); the next step."""
    s, d, running = execute(s, st, c, i, now, n_preempted, go, width, factor)
    if st.tiered:  # after execution, before completions leave the batch (§3.8)
        s = kv.mirror_batch(s, st, i, running.slots, running.valid, go)
    done = complete(s, st, c, i, now, d, go, running, defer)
    s, releases = done if defer else (done, None)
    more = (s.n_run[i] > 0) | (s.q_len[i] > 0)
    s = s.replace(step_time=upd(s.step_time, i, jnp.where(more, now + d, -1), go))
    ended = records.output_finished(running.pi, running.l_in, running.out) \
        | records.at_length_cap(running.pi, st.max_model_len)
    if st.pd:  # completed prefill sub-requests start their KV transfers
        s = pd.push_transfer_starts(s, st, c, running.reqs, running.valid & go & ended, now,
                                    now + d)
    seen = None
    if st.stretches:
        seen = stretch.outlook(s, st, c, i, running.valid & go & ~ended, running.slots,
                               running.pi, running.l_in, running.out)
    return Finished(s, releases, seen)


PHASE1_PER_OCTAVE = 1  # widths per doubling of phase 1's programs (64, 128, 256)
FINISH_PER_OCTAVE = 2  # of execute and completions' programs (64, 96, 128, 192, 256)


def step_widths(st, per_octave: int = 1) -> tuple[int, ...]:
    """Vector widths of the step's programs: from ``running_width`` up to the batch slots,
    ``per_octave`` widths per doubling (1: 64, 128, 256; 2: 64, 96, 128, 192, 256); only the
    batch slots without ``narrow_programs``."""
    if not st.narrow_programs:
        return (st.batch_slots,)
    widths, w = [], max(1, st.running_width)
    while w < st.batch_slots:
        for j in range(per_octave):
            x = w * (per_octave + j) // per_octave
            if x < st.batch_slots and (not widths or x > widths[-1]):
                widths.append(x)
        w *= 2
    return (*widths, st.batch_slots)


def step(s: SimState, st, c, p, i, now, active, defer: bool = False):
    """The instance's StepEvent at ``now``.

    Work over the running batch is vectorized over positions, so its cost follows the vector
    width. Each width-dependent part runs as one of a few programs of fixed width
    (``by_width``): phase 1 at the narrowest that holds the block's largest running batch,
    execute and completions at the narrowest that holds it after admissions; admissions
    (phase 2) do not depend on the width and are compiled once. All widths give identical
    results.

    Sizing each part by the running batch alone, rather than the whole step by running +
    queued requests, matters when queues are long (preemption, queues of hundreds). Execute and
    completions get finer widths (``FINISH_PER_OCTAVE``: most of scenario S's steps need a
    little under 128 positions); phase 1 keeps doubling widths because each of its copies
    carries the preemption loop and costs compile time for little run time
    (docs/performance.md, What the engine does for speed; Ideas tried and not kept).
    """
    if st.stretches:  # the virtual steps before this one happen first
        s = stretch.materialize(s, st, c, i, now, active, step_widths(st, PHASE1_PER_OCTAVE))
    idle = (s.n_run[i] == 0) & (s.q_len[i] == 0)
    go = active & ~idle
    s = s.replace(step_time=upd(s.step_time, i, -1, active & idle),
                  steps=add(s.steps, i, 1, go))
    preempted_before = s.preempt_count[i]

    def phase1_program(carry, go, w):
        s, budget, pre = carry
        s, budget_w, pre_w = phase1(s, st, c, p, i, go, w)
        return s, jnp.where(go, budget_w, budget), pre | (go & pre_w)

    init = (s, jnp.asarray(st.token_budget, jnp.int32), jnp.asarray(False))
    running = lane_max(jnp.where(go, s.n_run[i], 0))
    s, budget, pre = by_width(step_widths(st, PHASE1_PER_OCTAVE), running, go,
                                 phase1_program, init)
    if st.stateful_latency:
        s = s.replace(step_cached=s.step_cached.at[i].set(jnp.where(go, 0, s.step_cached[i])))
    s = phase2(s, st, c, p, i, now, budget, pre, go)
    n_preempted = s.preempt_count[i] - preempted_before
    running = lane_max(jnp.where(go, s.n_run[i], 0))
    init = Finished(s, no_plan(s) if defer else None,
                    stretch.no_outlook(st) if st.stretches else None)
    factor = lifecycle.warm_factor(s, st, p, i)
    completed_before = s.completed[i]
    out = by_width(step_widths(st, FINISH_PER_OCTAVE), running, go,
                   lambda f, go, w: _finish_at(f.state, st, c, i, now, n_preempted, go, w,
                                               defer, factor), init)
    if defer:
        releases = out.releases
        if st.stretches:  # the outlook read the fills, lengths and block tables the plan
            # writes: its values feed the plan, so that XLA writes them in place (after_reads)
            seen = jnp.minimum(jnp.min(out.outlook.spare_cum),
                               out.outlook.decoding.astype(jnp.int32))
            releases = releases._replace(fast=after_reads(releases.fast, seen))
        s = complete_planned(out.state, st, c, i, releases)
    else:
        s = out.state
    if not st.stretches:
        return s
    # no prefill tokens, one decode token each; slowed while the instance still warms up
    # after this step's completions
    model_us = (out.outlook.step_us if st.stretch_times_vary
                else step_duration(c, 0, s.n_run[i]))
    plain_us = lifecycle.slowed(model_us, lifecycle.warm_factor(
        s, st, p, i, (s.completed[i] - completed_before).astype(jnp.int32)))
    return stretch.plan(s, st, i, out.outlook, plain_us, go)
