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

from blisjax.config.codes import DrainPolicy
from blisjax.engine import (
    gateway,
    instance,
    kvblocks,
    lifecycle,
    pd,
    policies,
    sessions,
    stretch,
)
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.params import POOL_DECODE, POOL_PREFILL
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import (
    ADMITTED,
    COMPLETED,
    NIL,
    QUEUED,
    REJECTED,
    RUNNING,
    SimState,
)
from blisjax.limits import INT64_MAX

# Cluster events in the order they run at equal times (the reference's priorities: a node
# provisioned or a model loaded, admission, routing, prefill routing, transfer start and end,
# the gateway's dispatch tick, the autoscaler's tick and actuation); a deadline no-op changes
# nothing else.
(CL_LIFECYCLE, CL_ADMISSION, CL_ROUTING, CL_PREFILL_ROUTING, CL_TRANSFER, CL_GATEWAY, CL_TICK,
 CL_ACTUATION, CL_NOOP) = range(9)

F64 = jnp.float64


# ---- cluster events: admission and routing -----------------------------------------------------


@pytree_dataclass
class Cursors:
    """Where the cluster's event streams stand (``ClusterSimulator``'s counters); scalars."""

    admit: jax.Array  # int32: next request to admit (requests are in arrival order)
    route: jax.Array  # int32: next request to route
    deadline: jax.Array  # int32: first entry of c.deadline_order not known to be handled
    route_seq: jax.Array  # int64: routings so far (orders same-time enqueues, window.seq)
    enq_counter: jax.Array  # int64: enqueues so far (source of SimState.enq_seq)


def init_cursors() -> Cursors:
    """Nothing admitted, routed or enqueued."""
    zero32, zero64 = jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int64)
    return Cursors(admit=zero32, route=zero32, deadline=zero32, route_seq=zero64,
                   enq_counter=zero64)


@pytree_dataclass
class WindowState:
    """Each instance's α-delay window: routed requests waiting for their enqueue; [I, E]."""

    req: jax.Array  # int32: request in the window, -1 = free entry
    time: jax.Array  # int64 µs: its enqueue time (routing time + α delay)
    seq: jax.Array  # int64: its Cursors.route_seq (ties of same-time enqueues)


def init_window(st) -> WindowState:
    """Every entry free."""
    shape = (st.num_instances, st.pending_slots)
    return WindowState(req=jnp.full(shape, NIL, jnp.int32), time=jnp.zeros(shape, jnp.int64),
                       seq=jnp.zeros(shape, jnp.int64))


def refresh_snapshots(s: SimState, st, c, now, active) -> SimState:
    """Router snapshots of queue depth, batch size and KV utilisation, refreshed at every
    decision (interval 0) or when the refresh interval has passed, and the cache query's
    periodic copy of the hash slots when the cache signal delay has passed (docs/semantics.md
    §5.4; ``ClusterSimulator._snapshots``)."""
    due = active & ((st.refresh_interval_us == 0)
                    | (now - s.router.snap_last >= st.refresh_interval_us))
    # virtual decode steps before `now` have taken blocks (``stretch.kv_used_at``)
    used = stretch.kv_used_at(s, st, now) if st.stretches \
        else kvblocks.capacity(st) - s.kv.kv_free
    kv_util = ieee_divide(used.astype(F64), c.kv_blocks_f)  # not x·(1/blocks): exactfloat
    s = s.replace(router=s.router.replace(snap_qd=jnp.where(due, s.queue.length, s.router.snap_qd),
                                          snap_bs=jnp.where(due, s.batch.n_run, s.router.snap_bs),
                                          snap_kv=jnp.where(due, kv_util, s.router.snap_kv),
                                          snap_last=jnp.where(due, now, s.router.snap_last)))
    if st.lifecycle:  # the autoscaler reads the blocks in use
        s = s.replace(life=lifecycle.snapshot_used(s.life, used, due))
    if not st.cache_copy_on:
        return s
    copy_due = active & (now - s.router.cache_copy_last >= st.cache_signal_delay_us)

    def copy(s, go):  # run only when some lane's copy is due
        # prefix-group slots only: a request's own blocks are never registered before it is
        # first routed, so the query never finds them (``policies.cache_query``); the copy's
        # size and cost do not grow with the request count
        registered = s.kv.slot_block[:st.group_slots + st.session_slots] >= 0
        return s.replace(router=s.router.replace(
                             cache_copy=jnp.where(go, registered, s.router.cache_copy),
                             cache_copy_last=jnp.where(go, now, s.router.cache_copy_last)))

    return lane_once(copy_due, copy, s)


def admission(s: SimState, st, c, p, now, active) -> SimState:
    """Admission event of the request at the admission cursor
    (``ClusterSimulator._execute_cluster_event``): refresh stale snapshots, then admit or
    reject it (docs/semantics.md §5.3)."""
    if st.sessions:  # the earliest arrival not yet admitted, a follow-up's or not
        s, r = sessions.admit_next(s, st, c, active)
    else:
        r = jnp.where(active, s.cursors.admit, st.num_requests)
    s = refresh_snapshots(s, st, c, now, active)
    decision = policies.admit(s, st, c, p, r, now, active, router_members(s, st, p))
    admitted = decision.admitted
    if st.gateway:  # admitted requests wait at the gateway (flow-control lanes)
        g = s.gw
        refused = active & admitted & p.gateway.on & gateway.full(g, p)
        waits = active & admitted & p.gateway.on & ~refused
        g = gateway.enqueue(g, st, c, p, r, now, waits)
        g = gateway.to_routing(g, st, r, now, active & admitted & ~p.gateway.on)
        s = s.replace(gw=gateway.turned_away(g, refused))
        admitted = admitted & ~refused
    s = s.replace(
        status=s.status.at[r].set(jnp.where(admitted, ADMITTED, REJECTED).astype(s.status.dtype)),
        cursors=s.cursors.replace(admit=s.cursors.admit + active.astype(jnp.int32)),
        admission=s.admission.replace(
            bucket=decision.bucket,
            bucket_last=decision.bucket_last,
            tenant_bucket=decision.tenant_bucket,
            tenant_bucket_last=decision.tenant_bucket_last,
            rejected=s.admission.rejected + (active & ~decision.admitted).astype(jnp.int32),
            tenant_in_flight=add(s.admission.tenant_in_flight, c.tenant[r], 1, active & admitted)))
    if st.lifecycle:
        s = s.replace(life=lifecycle.admitted(s.life, active & admitted))
    if st.gateway:
        s = lane_once(waits, lambda s, go: gateway_dispatch(s, st, c, p, now, go), s)
    return s


def gateway_dispatch(s: SimState, st, c, p, now, go) -> SimState:
    """One dispatch attempt of the gateway queue where ``go``
    (``ClusterSimulator._try_dispatch``): with requests waiting, start the dispatch ticks if
    none is pending; on snapshots refreshed as a routing decision's, send the next request to
    routing unless the cluster is saturated."""
    g = s.gw
    go = go & (g.count > 0)
    start = go & (g.tick_us == INT64_MAX)
    s = s.replace(gw=gateway.tick_at(g, now + p.gateway.tick_us, start))
    s = refresh_snapshots(s, st, c, now, go)
    send = go & (gateway.saturation(s, st, p, router_members(s, st, p)) < 1.0)
    g, r = gateway.pop(s.gw, st, p, now, send)
    return s.replace(gw=gateway.to_routing(g, st, r, now, send))


def gateway_tick(s: SimState, st, c, p, now, active) -> SimState:
    """A dispatch tick (``ClusterSimulator._gateway_tick``): one attempt, and the next tick
    while requests wait."""
    s = gateway_dispatch(s, st, c, p, now, active)
    after = jnp.where(s.gw.count > 0, now + p.gateway.tick_us, INT64_MAX)
    return s.replace(gw=gateway.tick_at(s.gw, after, active))


def routing(s: SimState, st, c, p, now, active) -> SimState:
    """Routing event of the request at the routing cursor, if it was admitted: the router
    picks an instance (``policies.route``; with P/D pools ``pd.route_request``, which may
    disaggregate it) and the request enters that instance's α-delay window
    (``instance.inject_arrival``)."""
    if st.gateway:  # in dispatch order
        cursor = gateway.next_routing(s.gw, s.cursors.route, st.num_requests)[1]
    else:
        cursor = s.sess.order[s.cursors.route] if st.sessions else s.cursors.route
    r = jnp.where(active, cursor, st.num_requests)
    go = active & (s.status[r] == ADMITTED)
    s = refresh_snapshots(s, st, c, now, go)
    if st.pd and st.lifecycle:  # the decode pool's routable instances; none: rejected
        members = lifecycle.routable(s.life)
        none = go & ~jnp.any(pd.pool_members(p, POOL_DECODE, members))
        s, target, whole = pd.route_request(s, st, c, p, r, now, go & ~none, members)
        s = instance.inject_arrival(s, st, c, target, r, now, whole)
        s = _reject_routing(s, st, c, r, none)
        s = s.replace(life=lifecycle.routed(s.life, st, p, r, target, go & ~none, none))
    elif st.pd:
        s, target, whole = pd.route_request(s, st, c, p, r, now, go)
        s = instance.inject_arrival(s, st, c, target, r, now, whole)
    else:
        s = route_to_instance(s, st, c, p, r, now, go)
    return s.replace(cursors=s.cursors.replace(route=s.cursors.route + active.astype(jnp.int32)))


def router_members(s: SimState, st, p):
    """The instances a router could pick now, bool [I] (``Lifecycle.routable``): with
    lifecycles the routable ones, with sized lanes the lane's own, else every instance."""
    if st.lifecycle:
        return lifecycle.routable(s.life)
    if st.sized_lanes:
        return jnp.arange(st.num_instances) < p.active_instances
    return jnp.ones(st.num_instances, bool)


def route_to_instance(s: SimState, st, c, p, r, now, go) -> SimState:
    """The router's decision for request r and its arrival at the chosen instance; with
    lifecycles among the routable instances, and rejected when there is none
    (``ClusterSimulator._route``)."""
    if not st.lifecycle:
        # with sized lanes, the lane's own instances are the program's first ones
        spec = policies.lane_spec(p)._replace(
            candidates=jnp.arange(st.num_instances) < p.active_instances) \
            if st.sized_lanes else None
        s, target = policies.route(s, st, c, p, r, now, go, spec)
        return instance.inject_arrival(s, st, c, target, r, now, go)
    life = s.life
    candidates = lifecycle.routable(life)
    none = go & ~jnp.any(candidates)
    routed = go & ~none
    s, target = policies.route(s, st, c, p, r, now, routed,
                               policies.lane_spec(p)._replace(candidates=candidates))
    s = instance.inject_arrival(s, st, c, target, r, now, routed)
    s = _reject_routing(s, st, c, r, none)
    return s.replace(life=lifecycle.routed(s.life, st, p, r, target, routed, none))


def _reject_routing(s: SimState, st, c, r, none) -> SimState:
    """Where ``none``: no instance request r may go to is routable; it is rejected
    (``ClusterSimulator._reject_routing``; the lifecycle counts it, ``lifecycle.routed``)."""
    t = c.tenant[r]
    return s.replace(
        status=s.status.at[jnp.where(none, r, st.num_requests)].set(REJECTED),
        instance=s.instance.at[jnp.where(none, r, st.num_requests)].set(NIL),  # redirected
        admission=s.admission.replace(tenant_in_flight=upd(
            s.admission.tenant_in_flight, t, jnp.maximum(s.admission.tenant_in_flight[t] - 1, 0),
            none)))


def prefill_routing(s: SimState, st, c, p, now, active) -> SimState:
    """A disaggregated request's prefill routing (``reference.pd.PDCluster.route_prefill``): the
    prefill pool's router picks an instance and the prefill sub-request enters its α-delay
    window."""
    r = jnp.where(active, s.pd.pf_next, st.num_requests)
    if not st.lifecycle:
        s = refresh_snapshots(s, st, c, now, active)
        s, target = pd.route_pool(s, st, c, p, r, now, POOL_PREFILL, active)
        s = instance.inject_arrival(s, st, c, target, pd.prefill_row(st, r), now, active)
        return pd.prefill_routed(s, st, r, target, active)
    # with instance lifecycles among the routable instances; none: r is rejected and no
    # longer bound for its decode instance
    members = lifecycle.routable(s.life)
    none = active & ~jnp.any(pd.pool_members(p, POOL_PREFILL, members))
    routed = active & ~none
    s = refresh_snapshots(s, st, c, now, routed)
    s, target = pd.route_pool(s, st, c, p, r, now, POOL_PREFILL, routed, members)
    s = instance.inject_arrival(s, st, c, target, pd.prefill_row(st, r), now, routed)
    decode = s.instance[r]
    s = pd.prefill_routed(s, st, r, target, active, rejected=none)
    s = _reject_routing(s, st, c, r, none)
    s = s.replace(life=lifecycle.rejected(s.life, none))
    return lifecycle.released(s, st, decode, now, none)


def transfer_event(s: SimState, st, c, p, k, now, active) -> SimState:
    """The start or the end of the KV transfer in slot k (``reference.pd.PDCluster.
    start_transfer``, ``end_transfer``): a start reserves the KV on the decode instance
    (dropping the request when it does not fit); at its end the decode sub-request joins the
    decode instance's wait queue, counted in flight again."""
    r = s.pd.x_req[k]
    d = s.instance[jnp.maximum(r, 0)]
    ending = active & s.pd.x_done[k]

    def start(s, go):
        s, reserved = instance.reserve_transferred_kv(s, st, c, d, r, now, go)
        s = pd.transfer_started(s, st, c, p, k, r, now, reserved, go)
        return lifecycle.released(s, st, d, now, go & ~reserved)

    def end(s, go):
        s = pd.transfer_ended(s, st, p, k, r, now, go)
        s = s.replace(router=s.router.replace(in_flight=add(s.router.in_flight, d, 1, go)),
                      admission=s.admission.replace(
                          tenant_in_flight=add(s.admission.tenant_in_flight, c.tenant[r], 1, go)))
        s = instance.enqueue_decode(s, st, c, d, r, now, go)
        return lifecycle.released(s, st, d, now, go)  # one whose deadline has passed

    s = lane_once(active & ~ending, start, s)
    return lane_once(ending, end, s)


# ---- cluster events: instance lifecycles and the autoscaler -------------------------------------


def lifecycle_event(s: SimState, st, c, p, now, active) -> SimState:
    """A node provisioned or a model loaded (``reference.lifecycle.Lifecycle.start_loading``,
    ``ready``)."""
    return s.replace(life=lifecycle.ready_event(s.life, st, p, now, active))


def scaling_tick(s: SimState, st, c, p, now, active) -> SimState:
    """The autoscaler's tick, on snapshots refreshed as a routing decision would
    (``reference.lifecycle.Lifecycle.tick``)."""
    s = refresh_snapshots(s, st, c, now, active)
    return lifecycle.tick(s, st, c, p, now, active)


def actuation(s: SimState, st, c, p, now, active) -> SimState:
    """The next scale actuation (``reference.lifecycle.Lifecycle.actuate``): within the bounds as they
    stand, place new instances or drain the oldest Active ones."""
    life = s.life
    _, a = lifecycle.next_actuation(life)
    g = life.act_group[a]
    member = None if st.scaling_groups == 1 else lifecycle.group_members(st, p)[g]
    delta = lifecycle.bounded(life, st, p, life.act_delta[a].astype(jnp.int64), member)
    variant = life.act_variant[a]
    s = s.replace(life=lifecycle.took_actuation(life, a, active))
    s, added = lane_once(active & (delta > 0),
                         lambda carry, go: _scale_up(carry[0], st, p, delta, variant, now, go,
                                                     member), (s, jnp.asarray(0, jnp.int32)))
    s, drained = lane_once(active & (delta < 0),
                           lambda carry, go: _scale_down(carry[0], st, c, p, -delta, variant,
                                                         now, go, member),
                           (s, jnp.asarray(0, jnp.int32)))
    return s.replace(life=lifecycle.actuated(s.life, p, delta, added + drained, now, active, g))


def _scale_up(s: SimState, st, p, count, variant, now, active, member=None):
    """Place ``count`` instances, each in a free slot of the scaling group's slots
    ``member`` (None: any; a reused one restarts empty). Returns (state, instances
    placed)."""
    def body(carry, go):
        s, j, done = carry
        life = s.life
        k, has = lifecycle.free_slot(life, st, p, member)
        life, ok = lifecycle.place_instance(life, st, p, k, variant, now, False, go & has)
        life = lifecycle.placement_counted(life, no_slot=go & ~has, no_room=go & has & ~ok)
        s = lane_once(ok & (life.placements[k] > 1),
                      lambda s, go: instance.reset_instance(s, st, k, go), s.replace(life=life))
        return s, j + go.astype(jnp.int32), done + ok.astype(jnp.int32)

    zero = jnp.asarray(0, jnp.int32)
    s, _, done = lane_while(lambda carry: active & (carry[1] < count), body, (s, zero, zero))
    return s, done


def _scale_down(s: SimState, st, c, p, count, variant, now, active, member=None):
    """Drain ``count`` Active instances (of ``variant``; of the scaling group's slots
    ``member``, None: any) in drain order; then route the requests a redirect drain took
    from them, victim by victim, as the reference's routing events pushed by the drains run
    after the actuation. Returns (state, instances drained)."""
    zero = jnp.asarray(0, jnp.int32)

    def more(carry):
        return active & (carry[1] < count) & lifecycle.drain_victim(carry[0].life, st,
                                                                   variant, member)[1]

    def body(carry, go):
        s, j, victims = carry
        v, _ = lifecycle.drain_victim(s.life, st, variant, member)
        s = _drain(s, st, c, p, v, now, go)
        return s, j + go.astype(jnp.int32), upd(victims, j, v, go)

    victims = jnp.zeros(st.num_instances, jnp.int32)
    s, drained, victims = lane_while(more, body, (s, zero, victims))
    redirect = active & (p.autoscaler.drain == DrainPolicy.REDIRECT)

    def reroute_victim(carry, go):
        s, j = carry
        s, held = instance.take_not_running(s, st, c, victims[j], now, go)
        taken = jnp.where(go, held.count, 0)  # not the drain's ``count``
        s = s.replace(life=lifecycle.redirected(s.life, taken))

        def route_one(carry, go):
            s, k = carry
            r = jnp.where(go, held.reqs[k], st.num_requests)
            s = refresh_snapshots(s, st, c, now, go)
            return route_to_instance(s, st, c, p, r, now, go), k + go.astype(jnp.int32)

        s, _ = lane_while(lambda cr: go & (cr[1] < taken), route_one, (s, zero))
        return s, j + go.astype(jnp.int32)

    s, _ = lane_while(lambda carry: redirect & (carry[1] < drained), reroute_victim, (s, zero))
    return s, drained


def _drain(s: SimState, st, c, p, v, now, go) -> SimState:
    """Instance v stops being routable (``reference.lifecycle.Lifecycle._drain``); ``immediate`` drops what
    it holds and terminates it; by default an instance left holding nothing (after a
    redirect takes its waiting requests) terminates at once."""
    life = s.life
    s = s.replace(life=lifecycle.set_state(life, st, v, lifecycle.DRAINING, now, go))
    immediate = go & (p.autoscaler.drain == DrainPolicy.IMMEDIATE)
    s, dropped = lane_once(immediate, lambda carry, go: instance.drop_everything(
        carry[0], st, c, v, now, go), (s, jnp.asarray(0, jnp.int32)))
    life = lifecycle.dropped_at_drain(s.life, v, dropped, immediate)
    taken = jnp.where(p.autoscaler.drain == DrainPolicy.REDIRECT,
                      instance.held_requests(s, st, v).count, 0)
    idle = (s.router.in_flight[v] - taken == 0) & (not st.blis_quirks)
    if st.pd and st.lifecycle:  # nothing bound for it either
        idle = idle & (s.pd.headed[v] == 0)
    return s.replace(life=lifecycle.terminate(life, st, v, now, immediate | (go & idle)))


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
    idx = s.cursors.deadline + jnp.arange(w + 1)
    wr = c.deadline_order[jnp.minimum(idx, st.num_deadlines)]
    valid = (idx < st.num_deadlines) & (wr >= 0)
    wr_safe = jnp.where(valid, wr, st.num_requests)
    first = c.deadline_order[jnp.minimum(s.cursors.deadline, st.num_deadlines)]
    # entries past the workload's own deadlines are -1 padding (shapes shared across workloads)
    t = jnp.where((s.cursors.deadline < st.num_deadlines) & (first >= 0),
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
        events = DeadlineEvents(none, jnp.full(n_inst, INT64_MAX, jnp.int64),
                                jnp.full(n_inst, sink), sink, jnp.asarray(False))
        return _with_follow_up_timeouts(s, st, c, events) if st.sessions else events
    window = _deadline_window(s, st, c)
    member, on, wr, dl_t = window.member, window.on_instance, window.requests, window.time_us
    noop = member & ~on
    to_seq = jnp.where(on[None, :] & (s.instance[wr][None, :] == jnp.arange(n_inst)[:, None]),
                       s.enq_seq[wr][None, :], INT64_MAX)  # [I, W]
    timeout_t = jnp.where(jnp.min(to_seq, axis=1) < INT64_MAX, dl_t, INT64_MAX)
    events = DeadlineEvents(jnp.where(jnp.any(noop), dl_t, none), timeout_t,
                            wr[jnp.argmin(to_seq, axis=1)], wr[jnp.argmax(noop)],
                            window.overflow)
    return _with_follow_up_timeouts(s, st, c, events) if st.sessions else events


def _with_follow_up_timeouts(s: SimState, st, c, events: DeadlineEvents) -> DeadlineEvents:
    """Each instance's timeout: the earlier of its workload deadline's and its follow-ups'
    (``engine.sessions.timeouts``); at equal times the request enqueued first."""
    f = sessions.timeouts(s, st, c)
    seq = jnp.where(events.timeout_t_us < INT64_MAX, s.enq_seq[events.timeout_req], INT64_MAX)
    take = (f.t_us < events.timeout_t_us) | ((f.t_us == events.timeout_t_us) & (f.seq < seq))
    events = events._replace(timeout_t_us=jnp.where(take, f.t_us, events.timeout_t_us),
                             timeout_req=jnp.where(take, f.req, events.timeout_req))
    if not st.lifecycle:  # a deadline no-op only moves the lifecycles' last event
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


def next_event(s: SimState, st, c) -> NextEvent:
    """Cluster events precede instance events at equal times (in ``CL_*`` order); among
    instances the lowest index; within one, enqueue, step, timeout."""
    n = st.num_requests
    la, lr = st.admission_latency_us, st.routing_latency_us
    ac, rc = s.cursors.admit, s.cursors.route
    if st.sessions:  # arrivals merge the workload's rows and the follow-ups (engine.sessions)
        nxt = sessions.next_arrival(s, st, c).t_us
        adm_t = jnp.where(nxt < INT64_MAX, nxt + la, INT64_MAX)
        routed = s.sess.order[jnp.minimum(rc, n)]
        rt_t = jnp.where(rc < ac, s.sess.arrival_us[routed] + la + lr, INT64_MAX)
    else:
        adm_t = jnp.where(ac < n, c.arrival_us[jnp.minimum(ac, n)] + la, INT64_MAX)
        rt_t = jnp.where(rc < ac, c.arrival_us[jnp.minimum(rc, n)] + la + lr, INT64_MAX)
    if st.gateway:  # routings follow the dispatches
        rt_t = gateway.next_routing(s.gw, rc, n)[0]
    deadlines = _deadline_events(s, st, c)
    noop_t, timeout_t = deadlines.noop_t_us, deadlines.timeout_t_us
    none = jnp.asarray(INT64_MAX, jnp.int64)
    transfer = pd.next_transfer(s) if st.pd else pd.NextTransfer(none, jnp.asarray(0, jnp.int32))
    pf_t = pd.prefill_routing_us(s, st, c) if st.pd else none
    kinds = [(CL_ADMISSION, adm_t), (CL_ROUTING, rt_t), (CL_PREFILL_ROUTING, pf_t),
             (CL_TRANSFER, transfer.t_us)]
    if st.gateway:  # compiled in only with flow control
        kinds.append((CL_GATEWAY, s.gw.tick_us))
    kinds.append((CL_NOOP, noop_t))
    if st.lifecycle:  # compiled in only with lifecycles
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
    if st.lifecycle and st.blis_quirks:  # arrival events (priority 0) come first
        amin = jnp.min(s.life.arrive_us, axis=1)
        inst_t = jnp.minimum(inst_t, amin)
    i_star = jnp.argmin(inst_t).astype(jnp.int32)
    best_t = inst_t[i_star]
    use_cluster = cl_t <= best_t
    t_evt = jnp.minimum(cl_t, best_t)
    live = ~s.run.done & (t_evt <= st.horizon_us) & (t_evt < INT64_MAX)
    if st.tiered:  # a lane whose queued request found no holder slot for its blocks stops:
        # its result is refused (``run.lane_result``), and going on could only take time
        live = live & (s.tier.hold_overflow == 0)
    ins = live & ~use_cluster
    kind_arr = ins & (amin[i_star] == best_t) if st.lifecycle and st.blis_quirks \
        else jnp.asarray(False)
    ins = ins & ~kind_arr
    kind_enq = ins & (pmin[i_star] == best_t)
    kind_step = ins & ~kind_enq & (ts[i_star] == best_t)
    return NextEvent(
        t_us=t_evt, live=live, cluster_kind=jnp.where(use_cluster, cl_kind, -1),
        instance=i_star, kind_arrival=kind_arr, kind_enqueue=kind_enq, kind_step=kind_step,
        kind_timeout=ins & ~kind_enq & ~kind_step, pending_entry=e_star[i_star],
        timeout_req=deadlines.timeout_req[i_star], noop_req=deadlines.noop_req,
        deadline_overflow=deadlines.overflow, transfer_slot=transfer.slot)


def _begin(s: SimState, st, ev: NextEvent, go):
    """Bookkeeping of every event: a lane with no live event is done; counters; the clock of
    the event's instance. Returns (state, whether the lane handles ``ev``)."""
    live = go & ev.live
    s = s.replace(
        run=s.run.replace(
            done=s.run.done | (go & ~ev.live),
            iters=s.run.iters + live.astype(jnp.int64),
            ovf_deadline=s.run.ovf_deadline + (live & ev.deadline_overflow).astype(jnp.int32)))
    if st.lifecycle:  # held instances cost until the run's last event
        # a deadline no-op is a reference event only as a completed request's lazily
        # cancelled timeout (a dropped or redirected request's was removed, a request not yet
        # enqueued had none)
        phantom = (ev.cluster_kind == CL_NOOP) & (s.status[ev.noop_req] != COMPLETED)
        s = s.replace(life=lifecycle.saw_event(s.life, ev.t_us, live & ~phantom))
    ins = live & (ev.cluster_kind < 0)
    clock = upd(s.batch.clock, ev.instance, ev.t_us, ins)
    return s.replace(batch=s.batch.replace(clock=clock)), live


def _dispatch_cheap(s: SimState, st, c, p, ev: NextEvent, go) -> SimState:
    """Run ``ev`` where ``go``, for every kind but a step (the caller guarantees no lane's
    event is one), and after an admission the same request's routing when that is the lane's
    next event (``_routing_follows``). Each handler is skipped outright when no lane needs it."""
    n = st.num_requests
    s, live = _begin(s, st, ev, go)
    cl = live & (ev.cluster_kind >= 0)
    i_star, t_evt = ev.instance, ev.t_us
    admit = cl & (ev.cluster_kind == CL_ADMISSION)
    s = lane_once(admit, lambda s, go: admission(s, st, c, p, t_evt, go), s)
    route = cl & (ev.cluster_kind == CL_ROUTING)
    if st.routing_latency_us == 0 and not st.gateway:
        fused = _routing_follows(s, st, c, admit)
        # an event of its own
        s = s.replace(run=s.run.replace(iters=s.run.iters + fused.astype(jnp.int64)))
        route = route | fused
    s = lane_once(route, lambda s, go: routing(s, st, c, p, t_evt, go), s)
    if st.gateway:
        s = lane_once(cl & (ev.cluster_kind == CL_GATEWAY),
                      lambda s, go: gateway_tick(s, st, c, p, t_evt, go), s)
    if st.pd:
        s = lane_once(cl & (ev.cluster_kind == CL_PREFILL_ROUTING),
                      lambda s, go: prefill_routing(s, st, c, p, t_evt, go), s)
        s = lane_once(cl & (ev.cluster_kind == CL_TRANSFER),
                      lambda s, go: transfer_event(s, st, c, p, ev.transfer_slot, t_evt, go), s)
    if st.lifecycle:
        for kind, handler in ((CL_LIFECYCLE, lifecycle_event), (CL_TICK, scaling_tick),
                              (CL_ACTUATION, actuation)):
            s = lane_once(cl & (ev.cluster_kind == kind),
                          lambda s, go, handler=handler: handler(s, st, c, p, t_evt, go), s)
    if st.lifecycle and st.blis_quirks:
        arrive = live & ev.kind_arrival
        s = lane_once(arrive, lambda s, go: instance.arrival(s, st, i_star, t_evt, go), s)
        s = _after_instance_event(s, st, i_star, 0, t_evt, arrive)
    s = lane_once(live & ev.kind_enqueue,
             lambda s, go: instance.enqueue(s, st, c, i_star, ev.pending_entry, t_evt, go), s)
    s = _after_instance_event(s, st, i_star, 0, t_evt, live & ev.kind_enqueue)
    if st.num_deadlines == 0 and not st.sessions:  # no timeouts or deadline no-ops exist
        return s
    to_r = ev.timeout_req
    kind_to = live & ev.kind_timeout
    s = lane_once(kind_to, lambda s, go: instance.timeout(s, st, c, i_star, to_r, t_evt, go), s)
    s = _after_instance_event(s, st, i_star, 0, t_evt, kind_to)
    if st.lifecycle and st.blis_quirks:
        # a completed request's timeout is still pending in BLIS (lazily cancelled), an event
        # of its instance after which a draining instance with nothing left terminates
        stale = cl & (ev.cluster_kind == CL_NOOP) & (s.status[ev.noop_req] == COMPLETED)
        s = _after_instance_event(s, st, jnp.maximum(s.instance[ev.noop_req], 0), 0, t_evt,
                                  stale)
    # a handled deadline (timeout or no-op) is marked done; the cursor skips handled entries
    noop = cl & (ev.cluster_kind == CL_NOOP)
    if st.sessions and st.lifecycle:  # a completed follow-up's pending timeout came up
        s = sessions.stale_handled(s, st, c, ev.noop_req, noop)
    handled = jnp.where(kind_to, to_r, jnp.where(noop, ev.noop_req, n))
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
    r = s.cursors.admit - 1
    if st.sessions:
        this = s.sess.arrival_us[s.sess.order[jnp.maximum(r, 0)]]
        alone = sessions.next_arrival(s, st, c).t_us > this
        return admitted & (s.cursors.route == r) & alone
    nxt = jnp.minimum(s.cursors.admit, n)
    alone = (s.cursors.admit >= n) | (c.arrival_us[nxt] > c.arrival_us[jnp.maximum(r, 0)])
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
    if not st.lifecycle:
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
        r = c.deadline_order[jnp.minimum(cur, st.num_deadlines)]
        return (cur < st.num_deadlines) & s.tdone[jnp.maximum(r, 0)]

    def body(cur, go):
        return cur + go.astype(cur.dtype)

    return s.replace(
        cursors=s.cursors.replace(deadline=lane_while(cond, body, s.cursors.deadline)))
