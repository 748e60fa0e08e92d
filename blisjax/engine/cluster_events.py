"""The cluster's events of one lane: admission, routing (into P/D pools too), the gateway
queue's dispatch, prefill routing and KV transfers, and the instance lifecycles' events (a node
provisioned or a model loaded, the autoscaler's tick, a scale actuation with its drains).
Every handler is masked by ``active`` so that all lanes run the same program in lockstep;
``engine.cluster`` picks the next event and dispatches it here.

Counterpart: ``blisjax.reference.cluster.ClusterSimulator``'s ``_execute_cluster_event``
handlers (``_admit``, ``_route``, ``_try_dispatch``, ``_gateway_tick``; ``_snapshots`` as
``refresh_snapshots``), ``reference.pd.PDCluster``'s ``route_prefill``, ``start_transfer``
and ``end_transfer``, and ``reference.lifecycle.Lifecycle``'s ``actuate`` and ``_drain``.
Behaviour: docs/semantics.md §5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.config.codes import DrainPolicy
from blisjax.engine import (
    autoscaler,
    gateway,
    instance,
    kvblocks,
    lifecycle,
    pd,
    policies,
    routings,
    sessions,
    stretch,
)
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.params import POOL_DECODE, POOL_PREFILL
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import (
    ADMITTED,
    NIL,
    REJECTED,
    SimState,
    prefill_row,
)
from blisjax.engine.static import setting
from blisjax.limits import INT64_MAX

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
    shape = (st.shapes.num_instances, st.shapes.pending_slots)
    return WindowState(req=jnp.full(shape, NIL, jnp.int32), time=jnp.zeros(shape, jnp.int64),
                       seq=jnp.zeros(shape, jnp.int64))


def refresh_snapshots(s: SimState, st, c, now, active) -> SimState:
    """Router snapshots of queue depth, batch size and KV utilisation, refreshed at every
    decision (interval 0) or when the refresh interval has passed, and the cache query's
    periodic copy of the hash slots when the cache signal delay has passed (docs/semantics.md
    §5.4; ``ClusterSimulator._snapshots``)."""
    interval = setting(st, c, "refresh_interval_us")
    due = active & ((interval == 0) | (now - s.router.snap_last >= interval))
    # virtual decode steps before `now` have taken blocks (``stretch.kv_used_at``)
    used = stretch.kv_used_at(s, st, now) if st.stretches \
        else kvblocks.capacity(s, st) - s.kv.kv_free
    kv_util = ieee_divide(used.astype(F64), c.kv_blocks_f)  # not x·(1/blocks): exactfloat
    s = s.replace(router=s.router.replace(snap_qd=jnp.where(due, s.queue.length, s.router.snap_qd),
                                          snap_bs=jnp.where(due, s.batch.n_run, s.router.snap_bs),
                                          snap_kv=jnp.where(due, kv_util, s.router.snap_kv),
                                          snap_last=jnp.where(due, now, s.router.snap_last)))
    if st.features.lifecycle:  # the autoscaler reads the blocks in use
        s = s.replace(life=lifecycle.snapshot_used(s.life, used, due))
    if not st.cache_copy_on:
        return s
    copy_due = active & (now - s.router.cache_copy_last >= st.settings.cache_signal_delay_us)

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
    if st.features.sessions:  # the earliest arrival not yet admitted, a follow-up's or not
        s, r = sessions.admit_next(s, st, c, active)
    else:
        r = jnp.where(active, s.cursors.admit, st.shapes.num_requests)
    s = refresh_snapshots(s, st, c, now, active)
    decision = policies.admit(s, st, c, p, r, now, active, router_members(s, st, p))
    admitted = decision.admitted
    if st.features.gateway:  # admitted requests wait at the gateway (flow-control lanes)
        g = s.gw
        refused = active & admitted & p.gateway.on & gateway.full(g, p)
        waits = active & admitted & p.gateway.on & ~refused
        g = gateway.enqueue(g, st, c, p, r, now, waits)
        g = gateway.to_routing(g, st, c, r, now, active & admitted & ~p.gateway.on)
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
    if st.features.lifecycle:
        s = s.replace(life=lifecycle.admitted(s.life, active & admitted))
    if st.features.gateway:
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
    return s.replace(gw=gateway.to_routing(g, st, c, r, now, send))


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
    r = jnp.where(active, routings.routed_row(s, st, s.cursors.route), st.shapes.num_requests)
    go = active & (s.status[r] == ADMITTED)
    s = refresh_snapshots(s, st, c, now, go)
    # the decode pool's routable instances; none: rejected
    if st.features.pd and st.features.lifecycle:
        members = lifecycle.routable(s.life)
        none = go & ~jnp.any(pd.pool_members(p, POOL_DECODE, routable=members))
        s, target, whole = pd.route_request(s, st, c, p, r, now, go & ~none,
                                            routable=members)
        s = instance.inject_arrival(s, st, c, target, r, now, whole)
        s = _reject_routing(s, st, c, r, none)
        s = s.replace(life=lifecycle.routed(s.life, st, p, r, target, go & ~none, none))
    elif st.features.pd:
        s, target, whole = pd.route_request(s, st, c, p, r, now, go)
        s = instance.inject_arrival(s, st, c, target, r, now, whole)
    else:
        s = route_to_instance(s, st, c, p, r, now, go)
    return s.replace(cursors=s.cursors.replace(route=s.cursors.route + active.astype(jnp.int32)))


def router_members(s: SimState, st, p):
    """The instances a router could pick now, bool [I] (``Lifecycle.routable``): with
    lifecycles the routable ones, with sized lanes the lane's own, else every instance."""
    if st.features.lifecycle:
        return lifecycle.routable(s.life)
    if st.features.sized_lanes:
        return jnp.arange(st.shapes.num_instances) < p.active_instances
    return jnp.ones(st.shapes.num_instances, bool)


def route_to_instance(s: SimState, st, c, p, r, now, go) -> SimState:
    """The router's decision for request r and its arrival at the chosen instance; with
    lifecycles among the routable instances, and rejected when there is none
    (``ClusterSimulator._route``)."""
    if not st.features.lifecycle:
        # with sized lanes, the lane's own instances are the program's first ones
        spec = policies.lane_spec(p)._replace(
            candidates=jnp.arange(st.shapes.num_instances) < p.active_instances) \
            if st.features.sized_lanes else None
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
        status=s.status.at[jnp.where(none, r, st.shapes.num_requests)].set(REJECTED),
        instance=s.instance.at[jnp.where(none, r, st.shapes.num_requests)].set(NIL),  # redirected
        admission=s.admission.replace(tenant_in_flight=upd(
            s.admission.tenant_in_flight, t, jnp.maximum(s.admission.tenant_in_flight[t] - 1, 0),
            none)))


def prefill_routing(s: SimState, st, c, p, now, active) -> SimState:
    """A disaggregated request's prefill routing (``reference.pd.PDCluster.route_prefill``): the
    prefill pool's router picks an instance and the prefill sub-request enters its α-delay
    window."""
    r = jnp.where(active, routings.routed_row(s, st, s.pd.pf_next), st.shapes.num_requests)
    own = pd.own_entries(s, r) if st.features.pd_own_index else None
    if not st.features.lifecycle:
        s = refresh_snapshots(s, st, c, now, active)
        s, target = pd.route_pool(s, st, c, p, r, now, POOL_PREFILL, active,
                                  own_entries=own)
        s = instance.inject_arrival(s, st, c, target, prefill_row(st, r), now, active)
        return pd.prefill_routed(s, st, r, target, active)
    # with instance lifecycles among the routable instances; none: r is rejected and no
    # longer bound for its decode instance
    members = lifecycle.routable(s.life)
    none = active & ~jnp.any(pd.pool_members(p, POOL_PREFILL, routable=members))
    routed = active & ~none
    s = refresh_snapshots(s, st, c, now, routed)
    s, target = pd.route_pool(s, st, c, p, r, now, POOL_PREFILL, routed, routable=members,
                              own_entries=own)
    s = instance.inject_arrival(s, st, c, target, prefill_row(st, r), now, routed)
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
    return autoscaler.tick(s, st, c, p, now, active)


def actuation(s: SimState, st, c, p, now, active) -> SimState:
    """The next scale actuation (``reference.lifecycle.Lifecycle.actuate``): within the bounds as they
    stand, place new instances or drain the oldest Active ones."""
    life = s.life
    _, a = lifecycle.next_actuation(life)
    g = life.act_group[a]
    member = None if st.scaling_groups == 1 else autoscaler.group_members(st, p)[g]
    delta = autoscaler.bounded(life, st, p, life.act_delta[a].astype(jnp.int64),
                              member=member)
    variant = life.act_variant[a]
    s = s.replace(life=lifecycle.took_actuation(life, a, active))
    s, added = lane_once(active & (delta > 0),
                         lambda carry, go: _scale_up(carry[0], st, p, delta, variant, now, go,
                                                     member=member), (s, jnp.asarray(0, jnp.int32)))
    s, drained = lane_once(active & (delta < 0),
                           lambda carry, go: _scale_down(carry[0], st, c, p, -delta, variant,
                                                         now, go, member=member),
                           (s, jnp.asarray(0, jnp.int32)))
    return s.replace(life=lifecycle.actuated(s.life, p, delta, added + drained, now, active, g=g))


def _scale_up(s: SimState, st, p, count, variant, now, active, *, member=None):
    """Place ``count`` instances, each in a free slot of the scaling group's slots
    ``member`` (None: any; a reused one restarts empty). Returns (state, instances
    placed)."""
    def body(carry, go):
        s, j, done = carry
        life = s.life
        k, has = lifecycle.free_slot(life, st, p, member=member)
        life, ok = lifecycle.place_instance(life, st, p, k, variant, now, False, go & has)
        life = lifecycle.placement_counted(life, no_slot=go & ~has, no_room=go & has & ~ok)
        s = lane_once(ok & (life.placements[k] > 1),
                      lambda s, go: instance.reset_instance(s, st, k, go), s.replace(life=life))
        return s, j + go.astype(jnp.int32), done + ok.astype(jnp.int32)

    zero = jnp.asarray(0, jnp.int32)
    s, _, done = lane_while(lambda carry: active & (carry[1] < count), body, (s, zero, zero))
    return s, done


def _scale_down(s: SimState, st, c, p, count, variant, now, active, *, member=None):
    """Drain ``count`` Active instances (of ``variant``; of the scaling group's slots
    ``member``, None: any) in drain order; then route the requests a redirect drain took
    from them, victim by victim, as the reference's routing events pushed by the drains run
    after the actuation. Returns (state, instances drained)."""
    zero = jnp.asarray(0, jnp.int32)

    def more(carry):
        return active & (carry[1] < count) & lifecycle.drain_victim(carry[0].life, st,
                                                                   variant, member=member)[1]

    def body(carry, go):
        s, j, victims = carry
        v, _ = lifecycle.drain_victim(s.life, st, variant, member=member)
        s = _drain(s, st, c, p, v, now, go)
        return s, j + go.astype(jnp.int32), upd(victims, j, v, go)

    victims = jnp.zeros(st.shapes.num_instances, jnp.int32)
    s, drained, victims = lane_while(more, body, (s, zero, victims))
    redirect = active & (p.autoscaler.drain == DrainPolicy.REDIRECT)

    def reroute_victim(carry, go):
        s, j = carry
        s, held = instance.take_not_running(s, st, c, victims[j], now, go)
        taken = jnp.where(go, held.count, 0)  # not the drain's ``count``
        s = s.replace(life=lifecycle.redirected(s.life, taken))

        def route_one(carry, go):
            s, k = carry
            r = jnp.where(go, held.reqs[k], st.shapes.num_requests)
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
    idle = (s.router.in_flight[v] - taken == 0) & (not st.settings.blis_quirks)
    if st.features.pd and st.features.lifecycle:  # nothing bound for it either
        idle = idle & (s.pd.headed[v] == 0)
    return s.replace(life=lifecycle.terminate(life, st, v, now, immediate | (go & idle)))
