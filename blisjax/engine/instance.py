"""One instance of one lane: its enqueue and timeout events, its lifecycle and P/D entry
points, and its step.

Counterpart: ``blisjax.reference.instance.Instance`` — ``enqueue`` is ``_enqueue``, ``timeout``
``_timeout``, and ``step`` is ``_step`` statement by statement: ``_form_batch`` as
``batch.phase1`` (continue the running requests, with chunked prefill and preemption) and
``batch.phase2`` (admit from the wait queue), then ``execute`` (``_execute``: the step's
duration and progress) and ``completion.complete`` (``_complete`` and ``_finish``). Behaviour:
docs/semantics.md §2.1–§2.9.

The reference walks the running batch request by request; here work over the running batch is
vectorized over its positions 0 .. width - 1 (``by_width`` picks the width), and loops remain
only where one request's outcome changes the next one's (preemption, admissions, releases).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.config.codes import PriorityPolicy, SchedulerPolicy
from blisjax.engine import (
    batch,
    completion,
    hostlatency,
    kvblocks,
    kvtier,
    kvtiered,
    lifecycle,
    pd,
    physics,
    policies,
    recent,
    roofline,
    sessions,
    stretch,
)
from blisjax.engine import kvcache as kv
from blisjax.engine.consts import otp, physics_of, queue_delay, roofline_of, step_tables
from blisjax.engine.lockstep import add, after_reads, by_width, lane_max, upd
from blisjax.engine.queues import (
    order_remove_at,
    q_offset_of,
    q_push_back,
    q_remove_at,
    running_slots,
)
from blisjax.engine.state import (
    DROPPED,
    NIL,
    QUEUED,
    ROUTED,
    RUNNING,
    TIMED_OUT,
    SimState,
    parent_row,
)
from blisjax.engine.static import max_model_len_of
from blisjax.latency.base import float_to_ticks_array
from blisjax.metrics import records
from blisjax.rules import kv_util_bucket

# ---- arrival, enqueue and timeout -------------------------------------------------------------


def inject_arrival(s: SimState, st, c, i, r, now, active) -> SimState:
    """Routing hands request row r to instance i at ``now`` (``Instance.inject_arrival``): it
    is counted in flight and enters the α-delay window, to be enqueued after its queueing
    delay (computed now: the arrival event's time)."""
    c = lifecycle.instance_consts(s, st, c, i)  # its variant's speed
    e = jnp.argmax(s.window.req[i] == NIL)
    has_room = s.window.req[i, e] == NIL
    ok = active & has_room
    if st.stateful_latency:  # physics α reads the receiving instance's state now
        if st.stretches:  # its virtual steps before now have run (cluster events come first)
            s = end_stretch(s, st, c, i, now, active)
        used = kvblocks.capacity_of(s, st, i) - s.kv.kv_free[i]
        inputs = (s.batch.n_run[i], s.queue.length[i], used, c.input_tokens[r],
                  kv.cached_blocks(s, st, c, i, r).count, s.batch.ema[i])
        delay = (physics.queueing_delay(physics_of(st, c, i), *inputs,
                                        cpu_blocks=s.tier.capacity if st.tiered else None)
                 if st.features.latency is None
                 else hostlatency.queueing_delay(st.features.latency, active, *inputs))
    else:
        delay = queue_delay(st, c, r, i)
    r_or_sink = jnp.where(active, r, st.shapes.num_requests)
    arrival_event = st.features.lifecycle and st.settings.blis_quirks
    if arrival_event:  # the arrival is an event of its own (``arrival``)
        s = s.replace(life=lifecycle.arrival_due(s.life, i, e, now, ok))
    # a drain at this time may cancel the arrival (``_arrivals_cancelled``)
    elif st.features.lifecycle:
        first = active & (s.batch.clock[i] < now)
        s = s.replace(life=lifecycle.clock_before_arrivals(s.life, i, s.batch.clock[i], first))
    return s.replace(
        instance=s.instance.at[r_or_sink].set(i),
        status=s.status.at[r_or_sink].set(ROUTED),
        cursors=s.cursors.replace(route_seq=s.cursors.route_seq + active.astype(jnp.int64)),
        router=s.router.replace(in_flight=add(s.router.in_flight, i, 1, active)),
        window=s.window.replace(req=upd(s.window.req, (i, e), r, ok),
                                time=upd(s.window.time, (i, e), now + delay, ok),
                                seq=upd(s.window.seq, (i, e), s.cursors.route_seq, ok)),
        batch=s.batch.replace(
            clock=s.batch.clock if arrival_event else upd(s.batch.clock, i, now, active)),
        run=s.run.replace(ovf_pending=s.run.ovf_pending + (active & ~has_room).astype(jnp.int32)))


def end_stretch(s: SimState, st, c, i, now, active, inclusive: bool = False) -> SimState:
    """Instance i's virtual steps before ``now`` (or at it, if ``inclusive``) happen, the rest
    of its plan is dropped: its next step runs on its own (``stretch.materialize``)."""
    c = lifecycle.instance_consts(s, st, c, i)  # its variant's speed
    s = stretch.materialize(s, st, c, i, now, active, step_widths(st, PHASE1_PER_OCTAVE),
                            inclusive=inclusive)
    return s.replace(stretch=s.stretch.replace(steps=upd(s.stretch.steps, i, 0, active)))


def _release_slot_of(s: SimState, st, i, r, active):
    """Free the blocks of the batch slot holding request r on instance i, if one does, where
    ``active`` (``KVCache.release``); returns ``(state, that slot)``."""
    holder = s.batch.slot_req[i] == r
    sb = jnp.argmax(holder).astype(jnp.int32)
    held = active & jnp.any(holder)
    s = kv.release(s, st, i, sb, held)
    return s.replace(batch=s.batch.replace(slot_req=upd(s.batch.slot_req, (i, sb), NIL, held))), sb


def _prefill_failed(s: SimState, st, row, now, mask) -> SimState:
    """Where ``mask``: ``row`` left its instance without completing; a P/D prefill
    sub-request's parent is then no longer bound for its decode instance, which may now
    terminate (``PDCluster.prefill_failed``; with instance lifecycles only)."""
    if not (st.features.pd and st.features.lifecycle):
        return s
    decode = s.instance[parent_row(st, row)]
    s = pd.prefill_failed(s, st, row, mask)
    return lifecycle.released(s, st, decode, now, mask & (row > st.shapes.num_requests))


def _finish_in_flight(s: SimState, c, i, r, active) -> SimState:
    """A request left instance i (dropped, timed out): router in-flight counts go down."""
    t = c.tenant[r]
    return s.replace(
        router=s.router.replace(
            in_flight=upd(s.router.in_flight, i, jnp.maximum(s.router.in_flight[i] - 1, 0),
                          active)),
        admission=s.admission.replace(
            tenant_in_flight=upd(s.admission.tenant_in_flight, t,
                                 jnp.maximum(s.admission.tenant_in_flight[t] - 1, 0), active)))


def enqueue(s: SimState, st, c, i, e, now, active) -> SimState:
    """End of the α delay (``Instance._enqueue``): BLIS EnqueueRequest guards, then the wait
    queue (docs/semantics.md §2.1)."""
    r = jnp.where(active, s.window.req[i, e], st.shapes.num_requests)
    s = s.replace(window=s.window.replace(req=upd(s.window.req, (i, e), NIL, active)))
    # the guards count a prefill sub-request's parent's output budget (P/D)
    l_in, out = c.input_tokens[r], c.output_tokens[parent_row(st, r) if st.features.pd else r]
    drop = active & records.unservable(l_in, out, max_model_len_of(st, i),
                                       kvblocks.capacity_of(s, st, i), st.settings.block_size)
    admitted = active & ~drop
    due_us = sessions.deadline_us(s, st, c, r)
    due = admitted & (due_us > 0) & (due_us <= now)
    queued = admitted & ~due
    status = jnp.where(drop, DROPPED, jnp.where(due, TIMED_OUT, QUEUED)).astype(s.status.dtype)
    s = s.replace(
        status=upd(s.status, r, status, active),
        enq_seq=upd(s.enq_seq, r, s.cursors.enq_counter, queued),
        cursors=s.cursors.replace(enq_counter=s.cursors.enq_counter + queued.astype(jnp.int64)),
        stats=s.stats.replace(
            dropped=add(s.stats.dropped, i, 1, drop),
            timed_out=add(s.stats.timed_out, i, 1, due),
            input_tokens=add(s.stats.input_tokens, i, l_in.astype(jnp.int64), admitted)))
    s = _finish_in_flight(s, c, i, r, drop | due)
    s = _prefill_failed(s, st, r, now, drop | due)
    s = q_push_back(s, st, i, r, queued)
    if st.stretches:  # steps from now on may admit it: they are no longer plain
        s = stretch.truncate(s, st, i, now, queued)
    start_step = queued & (s.batch.step_time[i] < 0)
    return s.replace(batch=s.batch.replace(step_time=upd(s.batch.step_time, i, now, start_step)))


def timeout(s: SimState, st, c, i, r, now, active) -> SimState:
    """Client deadline for a queued or running request (``Instance._timeout``;
    docs/semantics.md §2.9)."""
    if st.stretches:  # steps at its time come first (event priority); later ones are cut
        s = end_stretch(s, st, c, i, now, active, inclusive=True)
    r = jnp.where(active, r, st.shapes.num_requests)
    running = active & (s.status[r] == RUNNING)
    queued = active & ~running
    # a queued decode sub-request (P/D) holds its reserved KV in a reservation slot, a queued
    # request whose tiered admission failed (``blis_quirks``) the blocks it claimed
    s, sb = _release_slot_of(s, st, i, r,
                             active if st.features.pd or st.shapes.kv_hold_slots else running)
    pos = jnp.argmax((s.batch.order[i] == sb)
                     & (jnp.arange(st.shapes.batch_slots) < s.batch.n_run[i]))
    s = order_remove_at(s, st, i, pos, running)
    s = q_remove_at(s, st, i, q_offset_of(s, st, i, r, queued), queued)
    s = s.replace(status=upd(s.status, r, TIMED_OUT, active),
                  computed=s.computed.at[r].set(0),
                  stats=s.stats.replace(timed_out=add(s.stats.timed_out, i, 1, active)))
    s = _finish_in_flight(s, c, i, r, active)
    s = _prefill_failed(s, st, r, now, active)
    wake = active & (s.batch.n_run[i] == 0) & (s.queue.length[i] > 0) & (s.batch.step_time[i] < 0)
    return s.replace(batch=s.batch.replace(step_time=upd(s.batch.step_time, i, now, wake)))


# ---- lifecycle (Decision 16) ------------------------------------------------------------------


def reset_instance(s: SimState, st, i, active) -> SimState:
    """A new instance in slot i (``Instance.restart`` and ``Router.forget_instance``): empty
    KV cache, free list in id order, no pending step or virtual steps, no preemption history,
    and the router knows nothing of it; the slot's counters carry on."""
    if st.tiered:  # a new tiered cache; queued requests that held blocks here are gone
        hold = jnp.arange(st.slot_count) >= st.hold_base
        s = s.replace(
            tier=kvtier.reset_instance(s.tier, st, i, active),
            batch=s.batch.replace(
                slot_req=upd(s.batch.slot_req, i, jnp.where(hold, NIL, s.batch.slot_req[i]),
                             active)))
    return s.replace(recent=recent.reset(s.recent, i, active) if st.recent_signals else s.recent,
                     router=policies.forget_instance(s.router, i, active),
                     stretch=s.stretch.replace(steps=upd(s.stretch.steps, i, 0, active)),
                     batch=s.batch.replace(step_time=upd(s.batch.step_time, i, -1, active),
                                           ema=upd(s.batch.ema, i, 0.0, active),
                                           blen=upd(s.batch.blen, i, 0, active)),
                     kv=kvblocks.reset_instance(s.kv, st, i, active))


class HeldRequests(NamedTuple):
    """The requests instance i holds that are not running (``Instance._held_requests``):
    those in their queueing delay in routing order, then the wait queue in queue order."""

    reqs: jax.Array  # int32 [E + Q] (the sink row past ``count``)
    count: jax.Array  # int32


def held_requests(s: SimState, st, i) -> HeldRequests:
    e, q = st.shapes.pending_slots, st.shapes.queue_slots
    waiting = s.window.req[i] >= 0
    order = jnp.argsort(jnp.where(waiting, s.window.seq[i], jnp.iinfo(jnp.int64).max))
    arriving = jnp.where(waiting[order], s.window.req[i, order], st.shapes.num_requests)
    n_arriving = jnp.sum(waiting).astype(jnp.int32)
    k = jnp.arange(q)
    queued = jnp.where(k < s.queue.length[i], s.queue.buf[i, (s.queue.head[i] + k) % q],
                       st.shapes.num_requests)
    # arrivals first, then the queue, packed
    pos = jnp.concatenate([jnp.arange(e), n_arriving + k])
    reqs = jnp.full(e + q + 1, st.shapes.num_requests, jnp.int32).at[
        jnp.where(jnp.concatenate([jnp.arange(e) < n_arriving, k < s.queue.length[i]]), pos, e + q)
    ].set(jnp.concatenate([arriving, queued]).astype(jnp.int32))[:e + q]
    return HeldRequests(reqs, n_arriving + s.queue.length[i])


def take_not_running(s: SimState, st, c, i, now, active) -> tuple[SimState, HeldRequests]:
    """Drain policy ``redirect`` (``Instance.take_not_running``): hand back the requests
    held and not running, leaving no trace of them here. A request preempted here had its own
    prompt blocks cached here; it will never return, so their hash registrations go (the
    reference keeps them in this instance's own cache, where nothing ever looks them up)."""
    held = held_requests(s, st, i)
    on = active & (jnp.arange(held.reqs.shape[0]) < held.count)
    r = jnp.where(on, held.reqs, st.shapes.num_requests)
    j = jnp.arange(max(st.shapes.max_prompt_blocks, 1))[None, :]
    own = on[:, None] & (j >= c.group_blocks[r][:, None]) & (j < c.full_blocks[r][:, None])
    if st.features.sessions:  # a session's blocks stay cached here for its later rounds
        own = own & (j >= c.session_blocks[r][:, None])
    slots = jnp.where(own, kvblocks.hash_slot(st, c, i, r[:, None], j), st.hash_slots)
    block = s.kv.slot_block[slots]
    mine = own & (block >= 0) & (s.kv.kv_slot[i, jnp.maximum(block, 0)] == slots)
    s = s.replace(
        router=s.router.replace(
            in_flight=upd(s.router.in_flight, i,
                          jnp.maximum(s.router.in_flight[i] - held.count, 0), active)),
        window=s.window.replace(
            req=upd(s.window.req, i, NIL, active)),
        queue=s.queue.replace(length=upd(s.queue.length, i, 0, active)),
        kv=s.kv.replace(
            kv_slot=s.kv.kv_slot.at[i, jnp.where(mine, block, st.shapes.kv_blocks)].set(
                NIL, mode="drop"),
            slot_block=s.kv.slot_block.at[jnp.where(mine, slots, st.hash_slots)].set(NIL)))
    return _arrivals_cancelled(s, st, i, now, active), held


def _arrivals_cancelled(s: SimState, st, i, now, active) -> SimState:
    """A drain at ``now`` took every request instance i holds outside its batch: the
    arrivals routed to it at this very time never happen (the reference removes their
    arrival events, which would run after the cluster's events), so its clock is what it was
    before them; with --blis-quirks, where arrivals are events of their own, they go."""
    if st.settings.blis_quirks:
        return s.replace(life=lifecycle.arrivals_cancelled(s.life, i, active))
    back = active & (s.batch.clock[i] == now)
    return s.replace(
        batch=s.batch.replace(clock=upd(s.batch.clock, i, s.life.clock_before[i], back)))


def arrival(s: SimState, st, i, now, active) -> SimState:
    """The arrival event of instance i's earliest α-window entry not yet arrived (BLIS's
    ArrivalEvent, with --blis-quirks and lifecycles): the instance's clock moves to it."""
    t = s.life.arrive_us[i]
    e = jnp.argmin(jnp.where(t == now, s.window.seq[i], jnp.iinfo(jnp.int64).max))
    return s.replace(life=lifecycle.arrival_done(s.life, i, e, active),
                     batch=s.batch.replace(clock=upd(s.batch.clock, i, now, active)))


def drop_everything(s: SimState, st, c, i, now, active) -> tuple[SimState, jax.Array]:
    """Drain policy ``immediate`` (``Instance.drop_everything``): every request held, running
    or not, is dropped. The instance terminates at once, so its KV cache is left as it is
    (a reused slot starts empty, ``reset_instance``); its virtual steps before ``now``
    happened, the rest never will. Returns (state, requests dropped)."""
    if st.stretches:
        s = end_stretch(s, st, c, i, now, active)
    held = held_requests(s, st, i)
    b = st.shapes.batch_slots
    running = jnp.where(active & (jnp.arange(b) < s.batch.n_run[i]),
                        s.batch.slot_req[i, jnp.maximum(s.batch.order[i], 0)],
                        st.shapes.num_requests)
    reqs = jnp.concatenate([jnp.where(active & (jnp.arange(held.reqs.shape[0]) < held.count),
                                      held.reqs, st.shapes.num_requests), running])
    count = jnp.where(active, held.count + s.batch.n_run[i], 0)
    on = reqs < st.shapes.num_requests
    s = s.replace(
        status=s.status.at[reqs].set(jnp.where(on, DROPPED, s.status[reqs]).astype(s.status.dtype)),
        router=s.router.replace(
            in_flight=upd(s.router.in_flight, i, jnp.maximum(s.router.in_flight[i] - count, 0),
                          active)),
        admission=s.admission.replace(tenant_in_flight=completion.tenants_left(s, c, reqs, on)),
        window=s.window.replace(
            req=upd(s.window.req, i, NIL, active)),
        queue=s.queue.replace(length=upd(s.queue.length, i, 0, active)),
        batch=s.batch.replace(
            n_run=upd(s.batch.n_run, i, 0, active),
            order=upd(s.batch.order, i, NIL, active),
            slot_req=upd(s.batch.slot_req, i, NIL, active),
            blen=upd(s.batch.blen, i, 0, active)))
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
    free = s.batch.slot_req[i, st.shapes.batch_slots:st.hold_base] == NIL
    sb = (st.shapes.batch_slots + jnp.argmax(free)).astype(jnp.int32)
    has_room = jnp.any(free)
    l_in = c.input_tokens[r]
    if st.tiered:  # the tiered allocation, which may reload (its evictions happen now)
        s = s.replace(batch=s.batch.replace(clock=upd(s.batch.clock, i, now, active)))
    # the whole prompt's blocks in one pass (a prefill's chunk takes a few at a time): in a
    # lockstep block some lane reserves in almost every pass of the cheap events
    s, ok = kvtiered.allocate_uncached(s, st, c, i, sb, r, start=0, end=l_in, active=active & has_room,
                                 chunk=max(1, st.shapes.max_blocks_per_request))
    # refused after claiming reloaded blocks, the dropped sub-request keeps them (as in the
    # reference and BLIS): its slot stays taken
    held = ok | (s.batch.blen[i, sb] > 0) if st.tiered else ok
    return s.replace(
        pi=s.pi.at[jnp.where(ok, r, st.shapes.num_requests)].set(l_in),
        pd=pd.reserve_overflowed(s.pd, active & ~has_room),
        batch=s.batch.replace(
            slot_req=upd(s.batch.slot_req, (i, sb), r, active & has_room & held))), ok


def enqueue_decode(s: SimState, st, c, i, r, now, active) -> SimState:
    """Request r's KV has arrived on instance i (``Instance.enqueue_decode``): its decode
    sub-request joins the wait queue now (no α delay, its prompt not counted again), or
    times out at once, releasing its reservation, when its deadline has passed."""
    deadline = sessions.deadline_us(s, st, c, r)
    due = active & (deadline > 0) & (deadline <= now)
    queued = active & ~due
    r_or_sink = jnp.where(active, r, st.shapes.num_requests)
    s = s.replace(
        status=s.status.at[r_or_sink].set(jnp.where(due, TIMED_OUT, QUEUED)
                                          .astype(s.status.dtype)),
        enq_seq=s.enq_seq.at[r_or_sink].set(jnp.where(queued, s.cursors.enq_counter, s.enq_seq[r])),
        cursors=s.cursors.replace(enq_counter=s.cursors.enq_counter + queued.astype(jnp.int64)),
        stats=s.stats.replace(timed_out=add(s.stats.timed_out, i, 1, due)))
    if st.stretches:  # its virtual steps before now held the reservation; the next ones not
        s = end_stretch(s, st, c, i, now, due)
    s, _ = _release_slot_of(s, st, i, r, due)
    s = _finish_in_flight(s, c, i, r, due)
    s = q_push_back(s, st, i, r, queued)
    if st.stretches:  # steps from now on may admit it: they are no longer plain
        s = stretch.truncate(s, st, i, now, queued)
    start_step = queued & (s.batch.step_time[i] < 0)
    return s.replace(batch=s.batch.replace(step_time=upd(s.batch.step_time, i, now, start_step)))


# ---- execute (the step's duration and progress) ----------------------------------------------


def step_duration(st, c, i, cm, dc):
    """max(1, trunc(((0 + β0) + β1·cm) + β2·dc)) from host-exact tables (one device add) of
    instance i (its lane's GPU, its pool)."""
    prefill, decode = step_tables(st, c, i)
    return jnp.maximum(1, float_to_ticks_array(prefill[cm] + decode[dc], jnp))


def execute(s: SimState, st, c, i, now, *, n_preempted, active, width: int, factor=None,
            roofline_us=None):
    """Step time from the scheduled requests; then progress, ITL and TTFT
    (``Instance._execute``; docs/semantics.md §2.6). ``factor``: a warming-up instance's
    (``lifecycle.warm_factor``); ``roofline_us``: the roofline model's step time, computed
    once over every batch slot before the width programs (``roofline_step_us``)."""
    run_slots = running_slots(s, st, i, width)
    valid, slots, reqs = run_slots.valid, run_slots.slots, run_slots.reqs
    nn = jnp.where(valid, s.num_new[reqs], 0)
    pi, l_in, out = s.pi[reqs], c.input_tokens[reqs], c.output_tokens[reqs]
    if st.stateful_latency or st.features.latency is not None:
        # physics in the program, or a model through the reference's own code on the host
        cached = jnp.where(valid, s.batch.step_cached[i, slots], 0)
        inputs = physics.StepInputs(nn, pi, l_in, out, cached, s.batch.ema[i], n_preempted,
                                    s.batch.n_run[i])
        d, ema = (physics.step_time(physics_of(st, c, i), inputs) if st.features.latency is None
                  else hostlatency.step_time(st.features.latency, active, inputs))
        s = s.replace(batch=s.batch.replace(ema=upd(s.batch.ema, i, ema, active)))
    # computed once per step by ``step``
    elif _roofline_in_program(st) and not st.settings.row_roofline:
        d = roofline_us
    else:
        cm = jnp.sum(jnp.where((nn > 0) & (pi < l_in), nn, 0))
        dc = jnp.sum(jnp.where((nn > 0) & (pi >= l_in) & (out > 0), nn, 0))
        d = step_duration(st, c, i, cm, dc)
        if st.settings.row_roofline:  # pools of both models: instance i's row's
            d = jnp.where(jnp.asarray(st.settings.row_roofline)[c.instance_row[i]], roofline_us, d)
    if st.tiered:  # reloads of this step's batch formation add their transfer time (§3.8)
        d = jnp.maximum(1, d + s.tier.pending_us[i])
        s = s.replace(tier=kvtier.reload_time_taken(s.tier, i, active))
    d = lifecycle.slowed(d, factor)
    itl = d + otp(st, c, i)
    on = valid & active
    dec = on & (pi >= l_in) & (nn > 0)
    new_pi = jnp.where(pi < l_in, s.computed[reqs], jnp.where(nn > 0, pi + 1, pi))
    # Progress alone says what BLIS keeps flags and counters for: a prefill chunk ends at
    # most at the prompt's end, and each decode step adds one token and one ITL entry, so
    # "TTFT recorded" is pi >= l_in and the ITL count is pi - l_in (both reset on eviction
    # with pi; input lengths are >= 1). No per-request flag or count to gather and scatter.
    first = on & (pi < l_in) & (new_pi == l_in)
    sink = st.shapes.num_requests
    r_or_sink = jnp.where(on, reqs, sink)
    ttft = now + d + otp(st, c, i) - sessions.arrival_us(s, st, c, reqs)
    s = s.replace(
        pi=s.pi.at[r_or_sink].set(new_pi),
        itl_sum=s.itl_sum.at[jnp.where(dec, reqs, sink)].add(itl),
        ttft=s.ttft.at[jnp.where(first, reqs, sink)].set(ttft))
    if st.recent_signals:  # this step's first tokens (routing programs)
        s = recent.record(s, i, now, recent.TTFT, jnp.sum(jnp.where(first, ttft, 0)),
                          jnp.sum(first.astype(jnp.int64)), active)
    if st.shapes.itl_capacity > 0:
        slot = c.itl_offset[reqs] + new_pi - l_in - 1  # this entry's index among r's ITLs
        s = s.replace(itl_buf=s.itl_buf.at[jnp.where(dec, slot, st.shapes.itl_capacity)].set(
            itl.astype(jnp.int32), mode="drop"))
    total = kvblocks.capacity_of(s, st, i)
    used = (total - s.kv.kv_free[i]).astype(jnp.int64)
    s = s.replace(
        stats=s.stats.replace(
            peak_used=upd(s.stats.peak_used, i, jnp.maximum(s.stats.peak_used[i], used), active),
            busy=add(s.stats.busy, i, d, active),
            kv_time=add(s.stats.kv_time, i, used * d, active),
            kv_util=s.stats.kv_util.at[i, kv_util_bucket(used, total)].add(
                      jnp.where(active, d, 0)),
            qdepth_time=add(s.stats.qdepth_time, i, s.queue.length[i].astype(jnp.int64) * d,
                            active)))
    return s, d, completion.Running(valid, slots, reqs, new_pi, l_in, out)


# ---- the step ---------------------------------------------------------------------------------


class Finished(NamedTuple):
    """What the step's execute-and-complete program (``_finish_at``) hands on."""

    state: SimState
    releases: completion.QueuedPlan | None  # with deferred releases: the one-pass plan
    loop: completion.LoopCompletions  # the completions left to the one-at-a-time loop
    outlook: stretch.BatchOutlook | None  # with decode stretches: the batch left running


class Executed(NamedTuple):
    """A step's execution (``execute``) over every batch slot, for completion programs of any
    width: what ``_execute_all`` hands to ``_finish_at``."""

    d: jax.Array  # int64 µs: the step's duration
    running: completion.Running  # [batch slots]; not valid past the width that executed


def _execute_all(s: SimState, st, c, i, now, *, n_preempted, go, widths, need, factor=None,
                 roofline_us=None) -> tuple[SimState, Executed]:
    """Execute at the narrowest of ``widths`` that holds ``need`` (``by_width``), then the
    tier's mirror pass (after execution, before completions leave the batch, §3.8) at the
    width of the blocks the batch holds, outside the step's width programs (tiered programs of
    several widths)."""
    slots = st.shapes.batch_slots
    fill = completion.Running(False, 0, st.shapes.num_requests, 0, 0, 0)

    def padded(run: completion.Running, w: int) -> completion.Running:
        """``run`` of positions 0 .. w - 1 padded to every batch slot (not valid there)."""
        return completion.Running(*(jnp.concatenate([x, jnp.full(slots - w, f, x.dtype)])
                                    for x, f in zip(run, fill, strict=True)))

    def program(carry, go, w):
        s, done = carry
        s, d, run = execute(s, st, c, i, now, n_preempted=n_preempted, active=go, width=w,
                            factor=factor, roofline_us=roofline_us)
        new = Executed(d, padded(run, w))
        return s, jax.tree.map(lambda a, b: jnp.where(go, a, b), new, done)

    empty = completion.Running(jnp.zeros(0, bool), *[jnp.zeros(0, jnp.int32)] * 5)
    s, done = by_width(widths, need, go, program,
                       (s, Executed(jnp.asarray(0, jnp.int64), padded(empty, 0))))
    s = kvtiered.mirror_batch(s, st, i, done.running.slots, done.running.valid, go)
    return s, done


def _finish_at(s: SimState, st, c, i, now, *, n_preempted, go, width: int,
               defer: bool = False, factor=None, roofline_us=None, stalled,
               executed: Executed | None = None) -> Finished:
    """Execute and complete over running positions 0..width-1 (>= n_run); the next step
    (none when ``stalled``: the step admitted nothing with nothing running, Decision 22).
    ``executed``: the execution already done (``_execute_all``); complete only."""
    if executed is None:
        s, d, running = execute(s, st, c, i, now, n_preempted=n_preempted, active=go,
                                width=width, factor=factor, roofline_us=roofline_us)
        if st.tiered:  # after execution, before completions leave the batch (§3.8)
            s = kvtiered.mirror_batch(s, st, i, running.slots, running.valid, go)
    else:
        d, running = executed.d, completion.Running(*(x[:width] for x in executed.running))
    s, releases, todo = completion.complete(s, st, c, i, now, d, go, running, defer)
    more = (s.batch.n_run[i] > 0) | ((s.queue.length[i] > 0) & ~stalled)
    s = s.replace(batch=s.batch.replace(
                      step_time=upd(s.batch.step_time, i, jnp.where(more, now + d, -1), go)))
    ended = records.output_finished(running.pi, running.l_in, running.out) \
        | records.at_length_cap(running.pi, max_model_len_of(st, i))
    if st.features.pd:  # completed prefill sub-requests start their KV transfers
        s = pd.push_transfer_starts(s, st, c, running.reqs, running.valid & go & ended, now,
                                    now + d)
    seen = None
    if st.stretches:
        seen = stretch.outlook(s, st, c, i, running.valid & go & ~ended, running.slots,
                               running.pi, running.l_in, running.out)
    return Finished(s, releases, todo, seen)


def _roofline_in_program(st) -> bool:
    """The roofline model's step time is computed in the program (not physics, not a host
    model)."""
    return (st.settings.latency_model == "roofline" and not st.stateful_latency
            and st.features.latency is None)


def roofline_step_us(s: SimState, st, c, i, *, need, go):
    """The roofline step time (int64 µs) of instance i's batch as formed (after phase 2),
    where ``go``; 1 elsewhere. Positions past the running batch add nothing
    (``roofline.step_seconds``), so the time over any width that holds the batch is the same:
    it is computed at the narrowest of the phase-1 widths that is >= ``need`` (the lanes'
    largest running batch), once per step, before execute's width programs that read it."""
    def at_width(us, go, width: int):
        run_slots = running_slots(s, st, i, width)
        reqs = run_slots.reqs
        nn = jnp.where(run_slots.valid, s.num_new[reqs], 0)
        step_us = roofline.step_time_us(roofline_of(st, c, i), nn, s.pi[reqs],
                                        c.input_tokens[reqs], c.output_tokens[reqs])
        return jnp.where(go, step_us, us)

    return by_width(step_widths(st, PHASE1_PER_OCTAVE), need, go, at_width,
                    jnp.ones((), jnp.int64))


PHASE1_PER_OCTAVE = 1  # widths per doubling of phase 1's and a stretch's programs (64, 128, 256)
FINISH_PER_OCTAVE = 2  # of execute and completions' programs (64, 96, 128, 192, 256)


def step_widths(st, per_octave: int = 1) -> tuple[int, ...]:
    """Vector widths of the step's programs: from ``running_width`` up to the batch slots,
    ``per_octave`` widths per doubling (1: 64, 128, 256; 2: 64, 96, 128, 192, 256); only the
    batch slots without ``narrow_programs``."""
    if not st.tuning.narrow_programs:
        return (st.shapes.batch_slots,)
    widths, w = [], max(1, st.tuning.running_width)
    while w < st.shapes.batch_slots:
        for j in range(per_octave):
            x = w * (per_octave + j) // per_octave
            if x < st.shapes.batch_slots and (not widths or x > widths[-1]):
                widths.append(x)
        w *= 2
    return (*widths, st.shapes.batch_slots)


def waits_when_stalled(st, p):
    """Whether a step that admits nothing with nothing running leaves the instance without a
    pending step (``Instance.waits_when_stalled``; Decision 22): its wait queue's order cannot
    change with time alone (FCFS, or a constant priority), and not ``blis_quirks`` (BLIS steps
    empty until the horizon)."""
    if st.settings.blis_quirks:
        return jnp.asarray(False)
    return (p.scheduler == SchedulerPolicy.FCFS) | (p.priority.policy == PriorityPolicy.CONSTANT)


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
    little under 128 positions); phase 1 keeps doubling widths: only its vectorized passes are
    width programs (its preemption loop is compiled once, ``batch.phase1``), and each copy
    costs compile time for little run time (docs/performance.md, What the engine does for
    speed; Ideas tried and not kept).
    """
    c = lifecycle.instance_consts(s, st, c, i)  # its variant's speed
    if st.stretches:  # the virtual steps before this one happen first
        s = stretch.materialize(s, st, c, i, now, active, step_widths(st, PHASE1_PER_OCTAVE))
    idle = (s.batch.n_run[i] == 0) & (s.queue.length[i] == 0)
    go = active & ~idle
    s = s.replace(batch=s.batch.replace(step_time=upd(s.batch.step_time, i, -1, active & idle)),
                  stats=s.stats.replace(steps=add(s.stats.steps, i, 1, go)))
    preempted_before = s.stats.preempt_count[i]

    s, budget, pre = batch.phase1(s, st, c, p, i, go, step_widths(st, PHASE1_PER_OCTAVE))
    if st.stateful_latency:
        s = s.replace(
            batch=s.batch.replace(
                step_cached=upd(s.batch.step_cached, i, 0, go)))
    s = batch.phase2(s, st, c, p, i, now, budget, pre, go)
    stalled = (s.batch.n_run[i] == 0) & waits_when_stalled(st, p)
    n_preempted = s.stats.preempt_count[i] - preempted_before
    running = lane_max(jnp.where(go, s.batch.n_run[i], 0))
    init = Finished(s, completion.no_plan(s) if defer else None, completion.no_loop(st),
                    stretch.no_outlook(st) if st.stretches else None)
    factor = lifecycle.warm_factor(s, st, p, i)
    roofline_us = (roofline_step_us(s, st, c, i, need=running, go=go)
                   if _roofline_in_program(st) else None)
    completed_before = s.stats.completed[i]
    widths = step_widths(st, FINISH_PER_OCTAVE)
    executed = None
    if st.tiered and len(widths) > 1:
        s, executed = _execute_all(s, st, c, i, now, n_preempted=n_preempted, go=go,
                                   widths=widths, need=running, factor=factor,
                                   roofline_us=roofline_us)
        init = init._replace(state=s)
    out = by_width(widths, running, go,
                   lambda f, go, w: _finish_at(f.state, st, c, i, now, n_preempted=n_preempted,
                                               go=go, width=w, defer=defer, factor=factor,
                                               roofline_us=roofline_us, stalled=stalled,
                                               executed=executed),
                   init)
    releases, todo = out.releases, out.loop
    if st.stretches:  # the outlook read the fills, lengths and block tables that the
        # completions write: its values feed them, so that XLA writes them in place
        seen = jnp.minimum(jnp.min(out.outlook.spare_cum),
                           out.outlook.decoding.astype(jnp.int32))
        todo = todo._replace(count=after_reads(todo.count, seen))
        if defer:
            releases = releases._replace(fast=after_reads(releases.fast, seen))
    # a lane's completions go either one at a time or in the queued pass
    s = completion.run_loop(out.state, st, c, i, todo, defer)
    if defer:
        s = completion.complete_planned(s, st, c, i, releases)
    if not st.stretches:
        return s
    # no prefill tokens, one decode token each; slowed while the instance still warms up
    # after this step's completions
    model_us = (out.outlook.step_us if st.stretch_times_vary
                else step_duration(st, c, i, 0, s.batch.n_run[i]))
    plain_us = lifecycle.slowed(model_us, lifecycle.warm_factor(
        s, st, p, i, (s.stats.completed[i] - completed_before).astype(jnp.int32)))
    return stretch.plan(s, st, c, i, out.outlook, plain_us, go)
