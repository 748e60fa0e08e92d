"""The per-lane event kernel: pick the next event exactly as the reference's shared-clock loop
would, and run it. Cluster events (admission, routing) precede instance events at equal times;
among instances the lowest index goes first; within an instance (time, priority, sequence).

Counterpart: ``blisjax.reference.cluster.ClusterSimulator`` — ``run``'s loop as
``next_event`` and ``lane_advance``, ``_execute_cluster_event`` as ``admission`` and
``routing``, ``_snapshots`` as ``refresh_snapshots``; the instances' own events are
``blisjax.engine.instance``'s. Behaviour: docs/semantics.md §1.5, §5.

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

from blisjax.engine import instance, pd, policies, stretch
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.params import POOL_PREFILL
from blisjax.engine.state import (
    ADMITTED,
    INT64_MAX,
    QUEUED,
    REJECTED,
    RUNNING,
    SimState,
)

# Cluster events in the order they run at equal times (the reference's priorities: admission,
# routing, prefill routing, transfer start and end); a deadline no-op changes nothing else.
CL_ADMISSION, CL_ROUTING, CL_PREFILL_ROUTING, CL_TRANSFER, CL_NOOP = range(5)

F64 = jnp.float64


# ---- cluster events: admission and routing -----------------------------------------------------


def refresh_snapshots(s: SimState, st, c, now, active) -> SimState:
    """Router snapshots of queue depth, batch size and KV utilisation, refreshed at every
    decision (interval 0) or when the refresh interval has passed, and the cache query's
    periodic copy of the hash slots when the cache signal delay has passed (docs/semantics.md
    §5.4; ``ClusterSimulator._snapshots``)."""
    due = active & ((st.refresh_interval_us == 0) | (now - s.snap_last >= st.refresh_interval_us))
    # virtual decode steps before `now` have taken blocks (``stretch.kv_used_at``)
    used = stretch.kv_used_at(s, st, now) if st.stretches else st.kv_blocks - s.kv_free
    kv_util = ieee_divide(used.astype(F64), c.kv_blocks_f)  # not x·(1/blocks): exactfloat
    s = s.replace(snap_qd=jnp.where(due, s.q_len, s.snap_qd),
                  snap_bs=jnp.where(due, s.n_run, s.snap_bs),
                  snap_kv=jnp.where(due, kv_util, s.snap_kv),
                  snap_last=jnp.where(due, now, s.snap_last))
    if not st.cache_copy_on:
        return s
    copy_due = active & (now - s.cache_copy_last >= st.cache_signal_delay_us)

    def copy(s, go):  # run only when some lane's copy is due
        # prefix-group slots only: a request's own blocks are never registered before it is
        # first routed, so the query never finds them (``policies.cache_query``); the copy's
        # size and cost do not grow with the request count
        registered = s.slot_block[:st.group_slots] >= 0
        return s.replace(cache_copy=jnp.where(go, registered, s.cache_copy),
                         cache_copy_last=jnp.where(go, now, s.cache_copy_last))

    return lane_once(copy_due, copy, s)


def admission(s: SimState, st, c, p, now, active) -> SimState:
    """Admission event of the request at the admission cursor
    (``ClusterSimulator._execute_cluster_event``): refresh stale snapshots, then admit or
    reject it (docs/semantics.md §5.3)."""
    r = jnp.where(active, s.adm_cursor, st.num_requests)
    s = refresh_snapshots(s, st, c, now, active)
    decision = policies.admit(s, c, p, r, now, active)
    admitted = decision.admitted
    return s.replace(
        bucket=decision.bucket, bucket_last=decision.bucket_last,
        status=s.status.at[r].set(jnp.where(admitted, ADMITTED, REJECTED).astype(s.status.dtype)),
        rejected=s.rejected + (active & ~admitted).astype(jnp.int32),
        tenant_in_flight=add(s.tenant_in_flight, c.tenant[r], 1, active & admitted),
        adm_cursor=s.adm_cursor + active.astype(jnp.int32))


def routing(s: SimState, st, c, p, now, active) -> SimState:
    """Routing event of the request at the routing cursor, if it was admitted: the router
    picks an instance (``policies.route``; with P/D pools ``pd.route_request``, which may
    disaggregate it) and the request enters that instance's α-delay window
    (``instance.inject_arrival``)."""
    r = jnp.where(active, s.route_cursor, st.num_requests)
    go = active & (s.status[r] == ADMITTED)
    s = refresh_snapshots(s, st, c, now, go)
    if st.pd:
        s, target, whole = pd.route_request(s, st, c, p, r, go)
    else:
        (s, target), whole = policies.route(s, st, c, p, r, go), go
    s = instance.inject_arrival(s, st, c, target, r, now, whole)
    return s.replace(route_cursor=s.route_cursor + active.astype(jnp.int32))


def prefill_routing(s: SimState, st, c, p, now, active) -> SimState:
    """A disaggregated request's prefill routing (``ClusterSimulator._route_prefill``): the
    prefill pool's router picks an instance and the prefill sub-request enters its α-delay
    window."""
    r = jnp.where(active, s.pd.pf_next, st.num_requests)
    s = refresh_snapshots(s, st, c, now, active)
    s, target = pd.route_pool(s, st, c, p, r, POOL_PREFILL, active)
    s = instance.inject_arrival(s, st, c, target, pd.prefill_row(st, r), now, active)
    return pd.prefill_routed(s, st, r, target, active)


def transfer_event(s: SimState, st, c, p, k, now, active) -> SimState:
    """The start or the end of the KV transfer in slot k (``ClusterSimulator.
    _start_transfer``, ``_end_transfer``): a start reserves the KV on the decode instance
    (dropping the request when it does not fit); at its end the decode sub-request joins the
    decode instance's wait queue, counted in flight again."""
    r = s.pd.x_req[k]
    d = s.instance[jnp.maximum(r, 0)]
    ending = active & s.pd.x_done[k]

    def start(s, go):
        s, reserved = instance.reserve_transferred_kv(s, st, c, d, r, now, go)
        return pd.transfer_started(s, st, c, p, k, r, now, reserved, go)

    def end(s, go):
        s = pd.transfer_ended(s, st, p, k, r, now, go)
        s = s.replace(in_flight=add(s.in_flight, d, 1, go),
                      tenant_in_flight=add(s.tenant_in_flight, c.tenant[r], 1, go))
        return instance.enqueue_decode(s, st, c, d, r, now, go)

    s = lane_once(active & ~ending, start, s)
    return lane_once(ending, end, s)


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
    w = st.deadline_window
    idx = s.dl_cursor + jnp.arange(w + 1)
    wr = c.deadline_order[jnp.minimum(idx, st.num_deadlines)]
    valid = (idx < st.num_deadlines) & (wr >= 0)
    wr_safe = jnp.where(valid, wr, st.num_requests)
    first = c.deadline_order[jnp.minimum(s.dl_cursor, st.num_deadlines)]
    # entries past the workload's own deadlines are -1 padding (shapes shared across workloads)
    t = jnp.where((s.dl_cursor < st.num_deadlines) & (first >= 0),
                  c.deadline_us[jnp.maximum(first, 0)], INT64_MAX)
    member = valid & (c.deadline_us[wr_safe] == t) & ~s.tdone[wr_safe]
    live = lambda row: (s.status[row] == QUEUED) | (s.status[row] == RUNNING)  # noqa: E731
    if st.pd:  # the deadline is its prefill sub-request's while that is on an instance
        pre = pd.prefill_row(st, wr_safe)
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
    n_inst, none = st.num_instances, jnp.asarray(INT64_MAX, jnp.int64)
    if st.num_deadlines == 0:
        sink = jnp.asarray(st.num_requests, jnp.int32)
        return DeadlineEvents(none, jnp.full(n_inst, INT64_MAX, jnp.int64),
                              jnp.full(n_inst, sink), sink, jnp.asarray(False))
    window = _deadline_window(s, st, c)
    member, on, wr, dl_t = window.member, window.on_instance, window.requests, window.time_us
    noop = member & ~on
    to_seq = jnp.where(on[None, :] & (s.instance[wr][None, :] == jnp.arange(n_inst)[:, None]),
                       s.enq_seq[wr][None, :], INT64_MAX)  # [I, W]
    timeout_t = jnp.where(jnp.min(to_seq, axis=1) < INT64_MAX, dl_t, INT64_MAX)
    return DeadlineEvents(jnp.where(jnp.any(noop), dl_t, none), timeout_t,
                          wr[jnp.argmin(to_seq, axis=1)], wr[jnp.argmax(noop)], window.overflow)


class NextEvent(NamedTuple):
    """The lane's next event as the reference's shared-clock loop would pop it."""
    t_us: jax.Array  # its time (INT64_MAX when there is none)
    live: jax.Array  # it exists, the lane is not done, and it is within the horizon
    cluster_kind: jax.Array  # -1 (instance event), else CL_ADMISSION .. CL_NOOP
    instance: jax.Array  # i*: the instance of an instance event
    kind_enqueue: jax.Array
    kind_step: jax.Array
    kind_timeout: jax.Array
    pending_entry: jax.Array  # e*: instance i*'s earliest pending enqueue
    timeout_req: jax.Array  # the request of a timeout event
    noop_req: jax.Array  # the request of a deadline no-op
    deadline_overflow: jax.Array
    transfer_slot: jax.Array  # the transfer slot of a transfer event (P/D pools)


def next_event(s: SimState, st, c) -> NextEvent:
    """Cluster events precede instance events at equal times (in ``CL_*`` order); among
    instances the lowest index; within one, enqueue, step, timeout."""
    n = st.num_requests
    la, lr = st.admission_latency_us, st.routing_latency_us
    ac, rc = s.adm_cursor, s.route_cursor
    adm_t = jnp.where(ac < n, c.arrival_us[jnp.minimum(ac, n)] + la, INT64_MAX)
    rt_t = jnp.where(rc < ac, c.arrival_us[jnp.minimum(rc, n)] + la + lr, INT64_MAX)
    deadlines = _deadline_events(s, st, c)
    noop_t, timeout_t = deadlines.noop_t_us, deadlines.timeout_t_us
    none = jnp.asarray(INT64_MAX, jnp.int64)
    transfer = pd.next_transfer(s) if st.pd else pd.NextTransfer(none, jnp.asarray(0, jnp.int32))
    pf_t = pd.prefill_routing_us(s, st, c) if st.pd else none
    cl_times = jnp.stack([adm_t, rt_t, pf_t, transfer.t_us, noop_t])
    cl_kind = jnp.argmin(cl_times)  # ties: in CL_* order
    cl_t = cl_times[cl_kind]
    # instance candidates
    pt = jnp.where(s.pend_req >= 0, s.pend_time, INT64_MAX)  # [I, E]
    pmin = jnp.min(pt, axis=1)
    pseq = jnp.where(pt == pmin[:, None], s.pend_seq, INT64_MAX)
    e_star = jnp.argmin(pseq, axis=1)
    # an instance's next step that runs on its own: after its virtual ones (``stretch``)
    step_at = stretch.next_step_us(s) if st.stretches else s.step_time
    ts = jnp.where(step_at >= 0, step_at, INT64_MAX)
    inst_t = jnp.minimum(jnp.minimum(pmin, ts), timeout_t)
    i_star = jnp.argmin(inst_t).astype(jnp.int32)
    best_t = inst_t[i_star]
    use_cluster = cl_t <= best_t
    t_evt = jnp.minimum(cl_t, best_t)
    live = ~s.done & (t_evt <= st.horizon_us) & (t_evt < INT64_MAX)
    ins = live & ~use_cluster
    kind_enq = ins & (pmin[i_star] == best_t)
    kind_step = ins & ~kind_enq & (ts[i_star] == best_t)
    return NextEvent(
        t_us=t_evt, live=live, cluster_kind=jnp.where(use_cluster, cl_kind, -1),
        instance=i_star, kind_enqueue=kind_enq, kind_step=kind_step,
        kind_timeout=ins & ~kind_enq & ~kind_step, pending_entry=e_star[i_star],
        timeout_req=deadlines.timeout_req[i_star], noop_req=deadlines.noop_req,
        deadline_overflow=deadlines.overflow, transfer_slot=transfer.slot)


def _begin(s: SimState, ev: NextEvent, go):
    """Bookkeeping of every event: a lane with no live event is done; counters; the clock of
    the event's instance. Returns (state, whether the lane handles ``ev``)."""
    live = go & ev.live
    s = s.replace(done=s.done | (go & ~ev.live), iters=s.iters + live.astype(jnp.int64),
                  ovf_deadline=s.ovf_deadline + (live & ev.deadline_overflow).astype(jnp.int32))
    ins = live & (ev.cluster_kind < 0)
    return s.replace(clock=upd(s.clock, ev.instance, ev.t_us, ins)), live


def _dispatch_cheap(s: SimState, st, c, p, ev: NextEvent, go) -> SimState:
    """Run ``ev`` where ``go``, for every kind but a step (the caller guarantees no lane's
    event is one), and after an admission the same request's routing when that is the lane's
    next event (``_routing_follows``). Each handler is skipped outright when no lane needs it."""
    n = st.num_requests
    s, live = _begin(s, ev, go)
    cl = live & (ev.cluster_kind >= 0)
    i_star, t_evt = ev.instance, ev.t_us
    admit = cl & (ev.cluster_kind == CL_ADMISSION)
    s = lane_once(admit, lambda s, go: admission(s, st, c, p, t_evt, go), s)
    route = cl & (ev.cluster_kind == CL_ROUTING)
    if st.routing_latency_us == 0:
        fused = _routing_follows(s, st, c, admit)
        s = s.replace(iters=s.iters + fused.astype(jnp.int64))  # an event of its own
        route = route | fused
    s = lane_once(route, lambda s, go: routing(s, st, c, p, t_evt, go), s)
    if st.pd:
        s = lane_once(cl & (ev.cluster_kind == CL_PREFILL_ROUTING),
                      lambda s, go: prefill_routing(s, st, c, p, t_evt, go), s)
        s = lane_once(cl & (ev.cluster_kind == CL_TRANSFER),
                      lambda s, go: transfer_event(s, st, c, p, ev.transfer_slot, t_evt, go), s)
    s = lane_once(live & ev.kind_enqueue,
             lambda s, go: instance.enqueue(s, st, c, i_star, ev.pending_entry, t_evt, go), s)
    if st.num_deadlines == 0:  # no timeouts or deadline no-ops exist (see ``next_event``)
        return s
    to_r = ev.timeout_req
    kind_to = live & ev.kind_timeout
    s = lane_once(kind_to, lambda s, go: instance.timeout(s, st, c, i_star, to_r, t_evt, go), s)
    # a handled deadline (timeout or no-op) is marked done; the cursor skips handled entries
    handled = jnp.where(kind_to, to_r, jnp.where(cl & (ev.cluster_kind == CL_NOOP),
                                                 ev.noop_req, n))
    if st.pd:  # the deadline is the request's, whichever of its rows it was for
        handled = pd.parent_row(st, handled)
    s = s.replace(tdone=s.tdone.at[handled].set(True))
    return _advance_deadline_cursor(s, st, c)


def _routing_follows(s: SimState, st, c, admitted):
    """Where a lane has just handled an admission: is the routing of that same request its
    very next event? With no routing latency that routing is due at the admission's own time,
    and cluster events precede instance events at equal times; only an earlier unrouted
    request or another admission at the same time (admissions precede routings) comes first.
    Handling both in one pass of the cheap-event loop saves an iteration — an arrival's
    admission and routing in one iteration, its enqueue in another."""
    n = st.num_requests
    r = s.adm_cursor - 1
    nxt = jnp.minimum(s.adm_cursor, n)
    alone = (s.adm_cursor >= n) | (c.arrival_us[nxt] > c.arrival_us[jnp.maximum(r, 0)])
    return admitted & (s.route_cursor == r) & alone


def _dispatch_step(s: SimState, st, c, p, ev: NextEvent, defer: bool = False) -> SimState:
    """Run ``ev``, which is a step or no event at all (the cheap ones were drained): only the
    step handler is compiled here. A step marks no deadline handled, so the deadline cursor
    stays where it is."""
    s, live = _begin(s, ev, jnp.asarray(True))
    return lane_once(live & ev.kind_step,
                        lambda s, go: instance.step(s, st, c, p, ev.instance, ev.t_us, go,
                                                 defer), s)


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
    about 1 ms later, usually before the next arrival: on scenario S (64 lanes) pairing them
    takes the passes per step from 6.7 to 3.7 (a lane's own mean is 2.2), and the second half
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
        s, live = _begin(s, ev, go)
        s = instance.enqueue(s, st, c, ev.instance, ev.pending_entry, ev.t_us, live)
        return s, next_event(s, st, c)

    s, ev = lane_while(lambda carry: carry[1].live & ~carry[1].kind_step, cheap, (s, ev))
    s = _dispatch_step(s, st, c, p, ev, defer_releases)
    return s, next_event(s, st, c)


def _advance_deadline_cursor(s: SimState, st, c) -> SimState:
    def cond(cur):
        r = c.deadline_order[jnp.minimum(cur, st.num_deadlines)]
        return (cur < st.num_deadlines) & s.tdone[jnp.maximum(r, 0)]

    def body(cur, go):
        return cur + go.astype(cur.dtype)

    return s.replace(dl_cursor=lane_while(cond, body, s.dl_cursor))
