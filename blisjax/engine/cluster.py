"""The per-lane event kernel: pick the next event exactly as the reference's shared-clock loop
would, and run it. Cluster events (admission, routing) precede instance events at equal times;
among instances the lowest index goes first; within an instance (time, priority, sequence).

Counterpart: ``blisjax.reference.cluster.ClusterSimulator`` — ``run``'s loop as
``next_event`` and ``lane_advance``; ``_execute_cluster_event``'s handlers are
``blisjax.engine.cluster_events``', the instances' own events ``blisjax.engine.instance``'s.
Behaviour: docs/semantics.md §1.5, §5.

Events: admission (cursor over requests in arrival order), routing (cursor; rejected requests are
skipped), with P/D pools prefill routing and the starts and ends of KV transfers
(``engine.pd``), a deadline no-op (a deadline whose request is not queued or running), and per
instance enqueue (end of the α delay), step, and timeout. Every handler is masked by ``active`` so all
lanes can run the same program in lockstep; ``lane_advance`` groups a lane's events as "all
cheap events before its next step, then the step" so lockstep runs the step program about once
per real step. Decode-only steps planned as a stretch (``engine.stretch``) are not events here:
an instance's next step is the one after them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine import (
    cluster_events,
    instance,
    lifecycle,
    pd,
    routings,
    sessions,
    stretch,
)
from blisjax.engine.lockstep import lane_once, lane_while, upd
from blisjax.engine.state import (
    COMPLETED,
    QUEUED,
    RUNNING,
    SimState,
    parent_row,
    prefill_row,
)
from blisjax.engine.static import setting
from blisjax.limits import INT64_MAX

# Cluster events in the order they run at equal times (the reference's priorities: a node
# provisioned or a model loaded, admission, routing, prefill routing, transfer start and end,
# the gateway's dispatch tick, the autoscaler's tick and actuation); a deadline no-op changes
# nothing else.
(CL_LIFECYCLE, CL_ADMISSION, CL_ROUTING, CL_PREFILL_ROUTING, CL_TRANSFER, CL_GATEWAY, CL_TICK,
 CL_ACTUATION, CL_NOOP) = range(9)

# ---- next-event selection and dispatch ----------------------------------------------------------


class DeadlineWindow(NamedTuple):
    """The requests whose deadline is the earliest not yet handled (``_deadline_window``):
    up to W of them, in (deadline, index) order, from the deadline cursor on."""

    member: jax.Array  # bool [W]: the entry's deadline is that time and is not yet handled
    on_instance: jax.Array  # bool [W]: a member that is queued or running (its timeout is due)
    requests: jax.Array  # int32 [W]: the entries' requests (N, the sink row, past the end;
    #                      with P/D pools the row on an instance: a prefill sub-request's)
    time_us: jax.Array  # int64: the deadline (INT64_MAX when none is left)
    overflow: jax.Array  # bool: more same-time deadlines than the window holds


def _deadline_window(s: SimState, st, c) -> DeadlineWindow:
    """The requests at the deadline cursor's time."""
    w = st.shapes.deadline_window
    idx = s.cursors.deadline + jnp.arange(w + 1)
    wr = c.deadline_order[jnp.minimum(idx, st.shapes.num_deadlines)]
    valid = (idx < st.shapes.num_deadlines) & (wr >= 0)
    wr_safe = jnp.where(valid, wr, st.shapes.num_requests)
    first = c.deadline_order[jnp.minimum(s.cursors.deadline, st.shapes.num_deadlines)]
    # entries past the workload's own deadlines are -1 padding (shapes shared across workloads)
    t = jnp.where((s.cursors.deadline < st.shapes.num_deadlines) & (first >= 0),
                  c.deadline_us[jnp.maximum(first, 0)], INT64_MAX)
    member = valid & (c.deadline_us[wr_safe] == t) & ~s.tdone[wr_safe]
    live = lambda row: (s.status[row] == QUEUED) | (s.status[row] == RUNNING)  # noqa: E731
    if st.features.pd:  # the deadline is its prefill sub-request's while that is on an instance
        pre = prefill_row(st, wr_safe)
        wr_safe = jnp.where(valid & live(pre), pre, wr_safe)
    on = member & live(wr_safe)
    overflow = member[w]  # more same-time deadlines than the window holds
    return DeadlineWindow(member[:w], on[:w], wr_safe[:w], t, overflow)


class DeadlineEvents(NamedTuple):
    """The lane's deadline event candidates (``_deadline_events``)."""

    noop_t_us: jax.Array  # int64: time of a deadline no-op (INT64_MAX: none)
    timeout_t_us: jax.Array  # int64 [I]: time of each instance's timeout (INT64_MAX: none)
    timeout_req: jax.Array  # int32 [I]: the request each instance's timeout is for
    noop_req: jax.Array  # int32: the request of the no-op
    overflow: jax.Array  # bool: the deadline window overflowed


def _deadline_events(s: SimState, st, c) -> DeadlineEvents:
    """Deadline candidates. A timeout goes to the request enqueued first among those due on
    the instance; a deadline whose request is no longer queued or running is a no-op. When no
    workload of the program has a deadline there are statically none (constants, nothing
    compiled in)."""
    n_inst, none = st.shapes.num_instances, jnp.asarray(INT64_MAX, jnp.int64)
    if st.shapes.num_deadlines == 0:
        sink = jnp.asarray(st.shapes.num_requests, jnp.int32)
        events = DeadlineEvents(none, jnp.full(n_inst, INT64_MAX, jnp.int64),
                                jnp.full(n_inst, sink), sink, jnp.asarray(False))
        return _with_follow_up_timeouts(s, st, c, events) if st.features.sessions else events
    window = _deadline_window(s, st, c)
    member, on, wr, dl_t = window.member, window.on_instance, window.requests, window.time_us
    noop = member & ~on
    to_seq = jnp.where(on[None, :] & (s.instance[wr][None, :] == jnp.arange(n_inst)[:, None]),
                       s.enq_seq[wr][None, :], INT64_MAX)  # [I, W]
    timeout_t = jnp.where(jnp.min(to_seq, axis=1) < INT64_MAX, dl_t, INT64_MAX)
    events = DeadlineEvents(jnp.where(jnp.any(noop), dl_t, none), timeout_t,
                            wr[jnp.argmin(to_seq, axis=1)], wr[jnp.argmax(noop)],
                            window.overflow)
    return _with_follow_up_timeouts(s, st, c, events) if st.features.sessions else events


def _with_follow_up_timeouts(s: SimState, st, c, events: DeadlineEvents) -> DeadlineEvents:
    """Each instance's timeout: the earlier of its workload deadline's and its follow-ups'
    (``engine.sessions.timeouts``); at equal times the request enqueued first."""
    f = sessions.timeouts(s, st, c)
    seq = jnp.where(events.timeout_t_us < INT64_MAX, s.enq_seq[events.timeout_req], INT64_MAX)
    take = (f.t_us < events.timeout_t_us) | ((f.t_us == events.timeout_t_us) & (f.seq < seq))
    events = events._replace(timeout_t_us=jnp.where(take, f.t_us, events.timeout_t_us),
                             timeout_req=jnp.where(take, f.req, events.timeout_req))
    if not st.features.lifecycle:  # a deadline no-op only moves the lifecycles' last event
        return events
    # a completed follow-up's timeout stays pending in the reference (lazily cancelled)
    noop = sessions.stale_timeout(s, st, c)
    earlier = noop.t_us < events.noop_t_us
    return events._replace(noop_t_us=jnp.where(earlier, noop.t_us, events.noop_t_us),
                           noop_req=jnp.where(earlier, noop.req, events.noop_req))


class NextEvent(NamedTuple):
    """The lane's next event as the reference's shared-clock loop would pop it."""
    t_us: jax.Array  # its time (INT64_MAX when there is none)
    live: jax.Array  # it exists, the lane is not done, and it is within the horizon
    cluster_kind: jax.Array  # -1 (instance event), else CL_ADMISSION .. CL_NOOP
    instance: jax.Array  # i*: the instance of an instance event
    kind_arrival: jax.Array  # an arrival event (lifecycles with --blis-quirks only)
    kind_enqueue: jax.Array
    kind_step: jax.Array
    kind_timeout: jax.Array
    pending_entry: jax.Array  # e*: instance i*'s earliest pending enqueue
    timeout_req: jax.Array  # the request of a timeout event
    noop_req: jax.Array  # the request of a deadline no-op
    deadline_overflow: jax.Array
    transfer_slot: jax.Array  # the transfer slot of a transfer event (P/D pools)
    capped: jax.Array  # an event within the horizon, not handled: the lane has handled
    #                    ``WorkloadConsts.max_events`` events (it stops, flagged)


def next_event(s: SimState, st, c) -> NextEvent:
    """Cluster events precede instance events at equal times (in ``CL_*`` order); among
    instances the lowest index; within one, enqueue, step, timeout."""
    n = st.shapes.num_requests
    la, ac = setting(st, c, "admission_latency_us"), s.cursors.admit
    # arrivals merge the workload's rows and the follow-ups (engine.sessions)
    if st.features.sessions:
        nxt = sessions.next_arrival(s, st, c).t_us
        adm_t = jnp.where(nxt < INT64_MAX, nxt + la, INT64_MAX)
    else:
        adm_t = jnp.where(ac < c.rows, c.arrival_us[jnp.minimum(ac, n)] + la, INT64_MAX)
    rt_t = routings.next_routing_us(s, st, c)  # after admissions (dispatches, with the gateway)
    deadlines = _deadline_events(s, st, c)
    noop_t, timeout_t = deadlines.noop_t_us, deadlines.timeout_t_us
    none = jnp.asarray(INT64_MAX, jnp.int64)
    transfer = (pd.next_transfer(s) if st.features.pd
                else pd.NextTransfer(none, jnp.asarray(0, jnp.int32)))
    pf_t = pd.prefill_routing_us(s, st, c) if st.features.pd else none
    kinds = [(CL_ADMISSION, adm_t), (CL_ROUTING, rt_t), (CL_PREFILL_ROUTING, pf_t),
             (CL_TRANSFER, transfer.t_us)]
    if st.features.gateway:  # compiled in only with flow control
        kinds.append((CL_GATEWAY, s.gw.tick_us))
    kinds.append((CL_NOOP, noop_t))
    if st.features.lifecycle:  # compiled in only with lifecycles
        life = s.life
        kinds += [(CL_LIFECYCLE, lifecycle.next_ready(life)[0]), (CL_TICK, life.tick_us),
                  (CL_ACTUATION, lifecycle.next_actuation(life)[0])]
        kinds.sort(key=lambda kind: kind[0])
    cl_times = jnp.stack([t for _, t in kinds])
    first = jnp.argmin(cl_times)  # ties: in CL_* order
    cl_kind = jnp.asarray([k for k, _ in kinds], jnp.int32)[first]
    cl_t = cl_times[first]
    # instance candidates
    pt = jnp.where(s.window.req >= 0, s.window.time, INT64_MAX)  # [I, E]
    pmin = jnp.min(pt, axis=1)
    pseq = jnp.where(pt == pmin[:, None], s.window.seq, INT64_MAX)
    e_star = jnp.argmin(pseq, axis=1)
    # an instance's next step that runs on its own: after its virtual ones (``stretch``)
    step_at = stretch.next_step_us(s, st) if st.stretches else s.batch.step_time
    ts = jnp.where(step_at >= 0, step_at, INT64_MAX)
    inst_t = jnp.minimum(jnp.minimum(pmin, ts), timeout_t)
    if st.features.lifecycle and st.settings.blis_quirks:  # arrival events (priority 0) come first
        amin = jnp.min(s.life.arrive_us, axis=1)
        inst_t = jnp.minimum(inst_t, amin)
    i_star = jnp.argmin(inst_t).astype(jnp.int32)
    best_t = inst_t[i_star]
    use_cluster = cl_t <= best_t
    t_evt = jnp.minimum(cl_t, best_t)
    live = ~s.run.done & (t_evt <= c.horizon_us) & (t_evt < INT64_MAX)
    capped = live & (s.run.iters >= c.max_events)  # every loop is bounded: a lane stops here
    live = live & ~capped
    if st.tiered:  # a lane whose queued request found no holder slot for its blocks stops:
        # its result is refused (``results.lane_result``), and going on could only take time
        live = live & (s.tier.hold_overflow == 0)
    ins = live & ~use_cluster
    kind_arr = ins & (amin[i_star] == best_t) if st.features.lifecycle and st.settings.blis_quirks \
        else jnp.asarray(False)
    ins = ins & ~kind_arr
    kind_enq = ins & (pmin[i_star] == best_t)
    kind_step = ins & ~kind_enq & (ts[i_star] == best_t)
    return NextEvent(
        t_us=t_evt, live=live, cluster_kind=jnp.where(use_cluster, cl_kind, -1),
        instance=i_star, kind_arrival=kind_arr, kind_enqueue=kind_enq, kind_step=kind_step,
        kind_timeout=ins & ~kind_enq & ~kind_step, pending_entry=e_star[i_star],
        timeout_req=deadlines.timeout_req[i_star], noop_req=deadlines.noop_req,
        deadline_overflow=deadlines.overflow, transfer_slot=transfer.slot, capped=capped)


def _begin(s: SimState, st, ev: NextEvent, go):
    """Bookkeeping of every event: a lane with no live event is done; counters; the clock of
    the event's instance. Returns (state, whether the lane handles ``ev``)."""
    live = go & ev.live
    s = s.replace(
        run=s.run.replace(
            done=s.run.done | (go & ~ev.live),
            iters=s.run.iters + live.astype(jnp.int64),
            ovf_events=s.run.ovf_events | (go & ev.capped).astype(jnp.int32),
            ovf_deadline=s.run.ovf_deadline + (live & ev.deadline_overflow).astype(jnp.int32)))
    if st.features.lifecycle:  # held instances cost until the run's last event
        # a deadline no-op is a reference event only as a completed request's (or completed
        # prefill sub-request's) lazily cancelled timeout (a dropped or redirected request's
        # was removed, a request not yet enqueued had none)
        pending = s.status[ev.noop_req] == COMPLETED
        if st.features.pd:  # a completed prefill sub-request's timeout is pending on its instance
            pending = pending | (s.status[prefill_row(st, parent_row(st, ev.noop_req))]
                                 == COMPLETED)
        phantom = (ev.cluster_kind == CL_NOOP) & ~pending
        s = s.replace(life=lifecycle.saw_event(s.life, ev.t_us, live & ~phantom))
    ins = live & (ev.cluster_kind < 0)
    clock = upd(s.batch.clock, ev.instance, ev.t_us, ins)
    return s.replace(batch=s.batch.replace(clock=clock)), live


def _dispatch_cheap(s: SimState, st, c, p, ev: NextEvent, go) -> SimState:
    """Run ``ev`` where ``go``, for every kind but a step (the caller guarantees no lane's
    event is one), and after an admission the same request's routing when that is the lane's
    next event (``_routing_follows``). Each handler is skipped outright when no lane needs it."""
    n = st.shapes.num_requests
    s, live = _begin(s, st, ev, go)
    cl = live & (ev.cluster_kind >= 0)
    i_star, t_evt = ev.instance, ev.t_us
    admit = cl & (ev.cluster_kind == CL_ADMISSION)
    s = lane_once(admit, lambda s, go: cluster_events.admission(s, st, c, p, t_evt, go), s)
    route = cl & (ev.cluster_kind == CL_ROUTING)
    routing_us = setting(st, c, "routing_latency_us")
    if not st.features.gateway and (st.features.lane_settings or routing_us == 0):
        fused = _routing_follows(s, st, c, admit)
        if st.features.lane_settings:  # only where the lane's routing latency is 0
            fused = fused & (routing_us == 0)
        # an event of its own
        s = s.replace(run=s.run.replace(iters=s.run.iters + fused.astype(jnp.int64)))
        route = route | fused
    s = lane_once(route, lambda s, go: cluster_events.routing(s, st, c, p, t_evt, go), s)
    if st.features.gateway:
        s = lane_once(cl & (ev.cluster_kind == CL_GATEWAY),
                      lambda s, go: cluster_events.gateway_tick(s, st, c, p, t_evt, go), s)
    if st.features.pd:
        s = lane_once(cl & (ev.cluster_kind == CL_PREFILL_ROUTING),
                      lambda s, go: cluster_events.prefill_routing(s, st, c, p, t_evt, go), s)
        s = lane_once(cl & (ev.cluster_kind == CL_TRANSFER),
                      lambda s, go: cluster_events.transfer_event(s, st, c, p, ev.transfer_slot, t_evt, go), s)
    if st.features.lifecycle:
        for kind, handler in ((CL_LIFECYCLE, cluster_events.lifecycle_event),
                              (CL_TICK, cluster_events.scaling_tick),
                              (CL_ACTUATION, cluster_events.actuation)):
            s = lane_once(cl & (ev.cluster_kind == kind),
                          lambda s, go, handler=handler: handler(s, st, c, p, t_evt, go), s)
    if st.features.lifecycle and st.settings.blis_quirks:
        arrive = live & ev.kind_arrival
        s = lane_once(arrive, lambda s, go: instance.arrival(s, st, i_star, t_evt, go), s)
        s = _after_instance_event(s, st, i_star, 0, t_evt, arrive)
    s = lane_once(live & ev.kind_enqueue,
             lambda s, go: instance.enqueue(s, st, c, i_star, ev.pending_entry, t_evt, go), s)
    s = _after_instance_event(s, st, i_star, 0, t_evt, live & ev.kind_enqueue)
    # no timeouts or deadline no-ops exist
    if st.shapes.num_deadlines == 0 and not st.features.sessions:
        return s
    to_r = ev.timeout_req
    kind_to = live & ev.kind_timeout
    s = lane_once(kind_to, lambda s, go: instance.timeout(s, st, c, i_star, to_r, t_evt, go), s)
    s = _after_instance_event(s, st, i_star, 0, t_evt, kind_to)
    if st.features.lifecycle and st.settings.blis_quirks:
        # a completed request's timeout is still pending in BLIS (lazily cancelled), an event
        # of its instance after which a draining instance with nothing left terminates
        stale = cl & (ev.cluster_kind == CL_NOOP) & (s.status[ev.noop_req] == COMPLETED)
        s = _after_instance_event(s, st, jnp.maximum(s.instance[ev.noop_req], 0), 0, t_evt,
                                  stale)
    # a handled deadline (timeout or no-op) is marked done; the cursor skips handled entries
    noop = cl & (ev.cluster_kind == CL_NOOP)
    # a completed follow-up's pending timeout came up
    if st.features.sessions and st.features.lifecycle:
        s = sessions.stale_handled(s, st, c, ev.noop_req, noop)
    handled = jnp.where(kind_to, to_r, jnp.where(noop, ev.noop_req, n))
    if st.features.pd:  # the deadline is the request's, whichever of its rows it was for
        handled = parent_row(st, handled)
    s = s.replace(tdone=s.tdone.at[handled].set(True))
    return _advance_deadline_cursor(s, st, c)


def _routing_follows(s: SimState, st, c, admitted):
    """Where a lane has just handled an admission: is the routing of that same request its
    very next event? With no routing latency that routing is due at the admission's own time,
    and cluster events precede instance events at equal times; only an earlier unrouted
    request or another admission at the same time (admissions precede routings) comes first.
    Handling both in one pass of the cheap-event loop saves an iteration — an arrival's
    admission and routing in one iteration, its enqueue in another."""
    n = st.shapes.num_requests
    r = s.cursors.admit - 1
    if st.features.sessions:
        this = s.sess.arrival_us[s.sess.order[jnp.maximum(r, 0)]]
        alone = sessions.next_arrival(s, st, c).t_us > this
        return admitted & (s.cursors.route == r) & alone
    nxt = jnp.minimum(s.cursors.admit, n)
    alone = (s.cursors.admit >= c.rows) | (c.arrival_us[nxt] > c.arrival_us[jnp.maximum(r, 0)])
    return admitted & (s.cursors.route == r) & alone


def _dispatch_step(s: SimState, st, c, p, ev: NextEvent, defer: bool = False) -> SimState:
    """Run ``ev``, which is a step or no event at all (the cheap ones were drained): only the
    step handler is compiled here. A step marks no deadline handled, so the deadline cursor
    stays where it is."""
    s, live = _begin(s, st, ev, jnp.asarray(True))
    before = s.stats.completed[ev.instance]
    s = lane_once(live & ev.kind_step,
                  lambda s, go: instance.step(s, st, c, p, ev.instance, ev.t_us, go, defer), s)
    return _after_instance_event(s, st, ev.instance, s.stats.completed[ev.instance] - before,
                                 ev.t_us, live & ev.kind_step)


def _after_instance_event(s: SimState, st, i, completions, now, go) -> SimState:
    """Lifecycle consequences of instance i's event where ``go`` (``lifecycle.
    after_instance_event``); nothing without lifecycles."""
    if not st.features.lifecycle:
        return s
    return lane_once(go, lambda s, go: lifecycle.after_instance_event(s, st, i, completions,
                                                                      now, go), s)


def lane_advance(s: SimState, ev: NextEvent, st, c, p,
                 defer_releases: bool = False) -> tuple[SimState, NextEvent]:
    """Advance one lane through every event before its next step, then by one more event.
    ``ev`` is ``next_event(s)``; returns the new state and its next event.

    Same events in the same order as one event at a time; the grouping is for lockstep
    populations. There each iteration runs every handler that *any* lane needs, and steps are
    by far the costliest handler while arrivals bring ~3 cheap events per request (admission,
    routing, enqueue). One event per iteration would run the step program (masked) in nearly
    every iteration; draining the cheap events first in an inner loop runs it about once per
    step of the lane. A lane that is not advanced keeps its state, so recomputing its next
    event gives the same value.

    A pass of the inner loop handles the lane's next cheap event and then, if the event after
    it is an enqueue, that one too. The loop runs as many passes as the busiest lane of the
    block needs, and an arrival's events are an admission with its routing, then its enqueue
    about 1 ms later, usually before the next arrival: pairing them nearly halves the passes
    per step (docs/performance.md, What the engine does for speed), and the second half
    of a pass runs only the (cheap) enqueue handler and the next-event selection — what
    ``_dispatch_cheap`` does for an enqueue (an enqueue handles no deadline, so the deadline
    cursor stays).

    ``defer_releases``: the step's completions queue their releases (``kv.defer_release``);
    the caller must run the queue (``lanes.release_queued``) before the lane's next event."""
    def cheap(carry, go):
        s = _dispatch_cheap(carry[0], st, c, p, carry[1], go)
        ev = next_event(s, st, c)
        return lane_once(go & ev.kind_enqueue, enqueue_next, (s, ev))  # implies live

    def enqueue_next(carry, go):
        s, ev = carry
        s, live = _begin(s, st, ev, go)
        s = instance.enqueue(s, st, c, ev.instance, ev.pending_entry, ev.t_us, live)
        s = _after_instance_event(s, st, ev.instance, 0, ev.t_us, live)
        return s, next_event(s, st, c)

    s, ev = lane_while(lambda carry: carry[1].live & ~carry[1].kind_step, cheap, (s, ev))
    s = _dispatch_step(s, st, c, p, ev, defer_releases)
    return s, next_event(s, st, c)


def _advance_deadline_cursor(s: SimState, st, c) -> SimState:
    def cond(cur):
        r = c.deadline_order[jnp.minimum(cur, st.shapes.num_deadlines)]
        return (cur < st.shapes.num_deadlines) & s.tdone[jnp.maximum(r, 0)]

    def body(cur, go):
        return cur + go.astype(cur.dtype)

    return s.replace(
        cursors=s.cursors.replace(deadline=lane_while(cond, body, s.cursors.deadline)))
