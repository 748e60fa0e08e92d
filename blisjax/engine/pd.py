"""P/D pools in the JAX engine: routing into pools, the decider, prefill sub-requests, KV
transfers and the decode side's reservation (docs/semantics.md §5.10, Decision 15).

Counterpart: ``blisjax.reference.pd``, its ``PDCluster``'s ``route``
(``route_request``), ``route_prefill`` (``route_pool`` and ``prefill_routed``, called by
``cluster_events.prefill_routing``), ``prefills_completed`` (``push_transfer_starts``),
``start_transfer`` and ``end_transfer`` (``transfer_started`` and ``transfer_ended``, called
by ``cluster_events.transfer_event``). ``Instance.reserve_transferred_kv`` and ``enqueue_decode`` have
their counterparts of the same names in ``engine.instance``.

Request rows: a disaggregated request r keeps row r for its decode sub-request (and for the
parent's facts) while its prefill sub-request is row N + 1 + r (``prefill_row``), whose
constants are r's without output tokens (``consts.build_consts``). Transfer starts (cluster
priority 5) and ends (priority 6) are entries of a fixed-capacity array ordered by (time,
priority, sequence) as the reference's cluster heap; prefill routings (priority 4) follow the
routings of their own time in routing order (``PDState.pf_next``: the routing cursor's order,
which the gateway queue's dispatches set where it is compiled in). A decode sub-request
waiting with its reserved KV holds a reservation slot (batch slots past ``batch_slots``) and
moves into a running slot when admitted.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.config.codes import PDDecider, PDRole, RoutingPolicy, Scorer
from blisjax.engine import policies, routings
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import add, lane_while, upd
from blisjax.engine.params import POOL_DECODE, POOL_PREFILL
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import (
    DECODE,
    DROPPED_AT_DECODE,
    NIL,
    PREFILL,
    PREFILL_ROUTING,
    ROUTED,
    TRANSFER,
    WHOLE,
    SimState,
    parent_row,
)
from blisjax.gorand import FEED_START, STATE_WORDS
from blisjax.limits import INT64_MAX


@pytree_dataclass
class PDState:
    """One lane's P/D state (``SimState.pd``; one-entry placeholders without pools). Shapes:
    N requests (+1, the sink), X transfer slots (``EngineStatic.shapes.pd_transfer_slots``)."""

    phase: jax.Array  # int8 [N + 1]: the request's progress (``state.WHOLE`` .. ``DROPPED_AT_DECODE``)
    prefill_instance: jax.Array  # int32 [N + 1]: its prefill sub-request's instance, -1
    transfer_start_us: jax.Array  # int64 [N + 1]: -1 until its transfer starts
    transfer_end_us: jax.Array  # int64 [N + 1]: -1 until its KV arrives
    pf_next: jax.Array  # int32: the first routing (index in routing order) whose request
    #                    awaits its prefill routing (N: none)
    x_req: jax.Array  # int32 [X]: the transfer's request, -1 = free
    x_time: jax.Array  # int64 µs [X]: time of its next event
    x_done: jax.Array  # bool [X]: False: its start is due (priority 5); True: its end (6)
    x_seq: jax.Array  # int64 [X]: push order (ties of equal time and priority)
    x_clock: jax.Array  # int64: events that pushed transfer events so far
    active: jax.Array  # int32: transfers in flight (contention)
    peak: jax.Array  # int32: most transfers in flight at once (contention)
    depth_sum: jax.Array  # int64: transfers in flight at each start, summed (contention)
    starts: jax.Array  # int64: transfer starts counted by contention
    prefill_completed: jax.Array  # int32: prefill sub-requests completed
    dropped_kv: jax.Array  # int32: reservations that failed (requests dropped)
    rr: jax.Array  # int32 [2]: round-robin counters per pool (``POOL_DECODE``, ``POOL_PREFILL``)
    rng_words: jax.Array  # int64 [2, 607]: each pool's own random stream (pools with scorers)
    rng_tap: jax.Array  # int32 [2]
    rng_feed: jax.Array  # int32 [2]
    # each pool's own router state when it has its own scorers (``SimState``'s fields of the
    # same names are the lane router's): the prefix index and no-hit-lru's recency
    lru_pos: jax.Array  # int64 [2, I, G, Jg]
    lru_own_at: jax.Array  # int64 [2, I, G, Jg]
    lru_clock: jax.Array  # int64 [2, I]
    lru_own: jax.Array  # int64 [2, I]
    cold_stamp: jax.Array  # int64 [2, I]
    cold_clock: jax.Array  # int64 [2]
    lru_spos: jax.Array  # int64 [2, I, S, Js] (``EngineStatic.features.session_prefix_index``; else
    lru_sown_at: jax.Array  # int64 [2, 1, 1, 1]): the conversations' blocks in the index
    # with ``EngineStatic.features.pd_own_index`` (else one entry): where a disaggregated request's
    # decode routing put its own prompt blocks in the lane router's index on its decode
    # instance (``policies.OwnEntries``), -1 = not indexed
    own_clock: jax.Array  # int64 [N + 1]: that instance's ``lru_clock`` before the routing
    own_base: jax.Array  # int64 [N + 1]: its ``lru_own`` before the routing
    pools: jax.Array  # bool: the lane has pools (``PDParams.pools``; for its results)
    role: jax.Array  # int8 [I]: the lane's ``PDRole`` of each instance (for its results)
    headed: jax.Array  # int32 [I]: disaggregated requests bound for the instance whose decode
    #                    sub-request has not joined it yet (a draining instance waits for them)
    ovf_transfers: jax.Array  # int32: transfers refused by full transfer slots (flagged)
    ovf_reserve: jax.Array  # int32: reservations refused by full reservation slots (flagged)


def init_pd(st, pd_rng=None, pd_role=None, pd_pools=False) -> PDState:
    """No transfer, nothing disaggregated; ``pd_rng``: the pools' seeded streams [2, 607];
    ``pd_role``, ``pd_pools``: the instances' roles [I] and whether the lane has pools
    (``PolicyParams``)."""
    on = st.features.pd
    n = st.shapes.num_requests + 1 if on else 1
    x = st.shapes.pd_transfer_slots if on else 1
    i32, i64 = jnp.int32, jnp.int64
    inst = st.shapes.num_instances if on else 1
    groups = (inst, st.shapes.num_groups, st.shapes.group_blocks_max) if on else (1, 1, 1)
    sessions = (inst, st.shapes.num_sessions, st.shapes.session_blocks_max) \
        if on and st.features.session_prefix_index else (1, 1, 1)
    words = jnp.zeros((2, STATE_WORDS), i64) if pd_rng is None else jnp.asarray(pd_rng, i64)
    return PDState(
        phase=jnp.zeros(n, jnp.int8), prefill_instance=jnp.full(n, NIL, i32),
        transfer_start_us=jnp.full(n, -1, i64), transfer_end_us=jnp.full(n, -1, i64),
        pf_next=jnp.asarray(st.shapes.num_requests, i32),
        x_req=jnp.full(x, NIL, i32), x_time=jnp.zeros(x, i64), x_done=jnp.zeros(x, bool),
        x_seq=jnp.zeros(x, i64), x_clock=jnp.asarray(0, i64),
        active=jnp.asarray(0, i32), peak=jnp.asarray(0, i32), depth_sum=jnp.asarray(0, i64),
        starts=jnp.asarray(0, i64), prefill_completed=jnp.asarray(0, i32),
        dropped_kv=jnp.asarray(0, i32), rr=jnp.zeros(2, i32),
        rng_words=words, rng_tap=jnp.zeros(2, i32),
        rng_feed=jnp.full(2, FEED_START, i32),
        lru_pos=jnp.full((2, *groups), -1, i64), lru_own_at=jnp.zeros((2, *groups), i64),
        lru_clock=jnp.zeros((2, inst), i64), lru_own=jnp.zeros((2, inst), i64),
        cold_stamp=jnp.full((2, inst), -1, i64), cold_clock=jnp.zeros(2, i64),
        lru_spos=jnp.full((2, *sessions), -1, i64), lru_sown_at=jnp.zeros((2, *sessions), i64),
        own_clock=jnp.full(n if st.features.pd_own_index else 1, -1, i64),
        own_base=jnp.full(n if st.features.pd_own_index else 1, -1, i64),
        pools=jnp.asarray(pd_pools, bool),
        role=(jnp.full(st.shapes.num_instances, PDRole.SHARED, jnp.int8) if pd_role is None
              else jnp.asarray(pd_role).astype(jnp.int8)),
        headed=jnp.zeros(inst, i32),
        ovf_transfers=jnp.asarray(0, i32), ovf_reserve=jnp.asarray(0, i32))



def disaggregates(p, c, r, cached_on_decode, block_size: int):
    """The lane's decider (``reference.pd.disaggregates``): never, always, or whether the
    prompt tokens not cached on the pre-selected decode instance exceed the threshold."""
    l_in = c.input_tokens[r]
    uncached = l_in - cached_on_decode * block_size
    by_prefix = (l_in > 0) & (uncached > p.pd.threshold)
    return jnp.where(p.pd.decider == PDDecider.ALWAYS, True,
                     jnp.where(p.pd.decider == PDDecider.PREFIX_THRESHOLD, by_prefix, False))


def transfer_duration_us(p, c, r, active):
    """``reference.pd.transfer_duration_us``: ceil(base + bytes / bandwidth) µs, at least 1,
    the bandwidth divided by the transfers in flight (``active``) when more than one."""
    bandwidth = jnp.where(active > 1, ieee_divide(p.pd.bandwidth, active.astype(jnp.float64)),
                          p.pd.bandwidth)
    span = p.pd.base_us + ieee_divide(c.pd_kv_bytes[r], bandwidth)
    return jnp.maximum(jnp.ceil(span).astype(jnp.int64), 1)


def reserve_overflowed(q: PDState, mask) -> PDState:
    """Decode sub-requests that found no reservation slot (where ``mask``): flagged."""
    return q.replace(ovf_reserve=q.ovf_reserve + mask.astype(jnp.int32))


def _headed(q: PDState, st, decode, change, mask) -> PDState:
    """``headed`` of instance ``decode`` changed by ``change`` where ``mask`` (kept only with
    instance lifecycles, where a draining instance waits for the requests bound for it)."""
    if not st.features.lifecycle:
        return q
    return q.replace(headed=add(q.headed, jnp.maximum(decode, 0), change, mask))


def prefill_failed(s: SimState, st, row, mask) -> SimState:
    """Where ``mask``: ``row`` left its instance without completing (timed out, dropped); a
    prefill sub-request's parent is then no longer bound for its decode instance."""
    if not (st.features.pd and st.features.lifecycle):
        return s
    pre = mask & (row > st.shapes.num_requests)
    return s.replace(pd=_headed(s.pd, st, s.instance[parent_row(st, row)], -1, pre))


# ---- routing into pools -------------------------------------------------------------------------


# The lane router's state that a pool with its own scorers keeps apart (``RouterState``'s
# fields that ``PDState`` holds under the same names): its random stream, prefix index and
# no-hit-lru recency.
_ROUTER_FIELDS = ("rng_words", "rng_tap", "rng_feed", "lru_pos", "lru_own_at", "lru_clock",
                  "lru_own", "cold_stamp", "cold_clock")
_SESSION_FIELDS = ("lru_spos", "lru_sown_at")  # with the conversations' blocks in the index


def _exchange(s: SimState, st, pool: int, own) -> SimState:
    """The lane router's state exchanged with the pool's: all of it where the pool has its
    own scorers (``own``, BLIS's separate router), and the round-robin counter unless
    ``blis_quirks`` (BLIS's one shared counter, Decision 12). Its own inverse: it brings the
    pool's in before the pool's decision and takes them out after it."""
    q = s.pd
    mine, pools = {}, {}

    def swap(name, on, counter=None):
        lane, kept = getattr(s.router, name), getattr(q, counter or name)
        mine[name] = jnp.where(on, kept[pool], lane)
        pools[counter or name] = upd(kept, pool, lane, on)

    for name in _ROUTER_FIELDS + (_SESSION_FIELDS if st.features.session_prefix_index else ()):
        swap(name, own)
    swap("rr", not st.settings.blis_quirks)
    return s.replace(router=s.router.replace(**mine), pd=q.replace(**pools))


def pool_members(p, pool: int, *, routable=None):
    """[I] the pool's instances a router may pick: those of its role, among ``routable``
    (with instance lifecycles; None: all)."""
    wanted = PDRole.DECODE if pool == POOL_DECODE else PDRole.PREFILL
    members = (p.pd.role & wanted) != 0
    return members if routable is None else members & routable


def route_pool(s: SimState, st, c, p, r, now, pool: int, active, *, routable=None,
               own_entries=None):
    """Route r among the pool's instances (``Router.route`` with the pool's candidates,
    ``pool_members``). A pool with its own scorers routes by weight with its own random
    stream; otherwise with the lane's routing and the "router" stream. Round-robin counts
    per pool, or on one counter with ``blis_quirks``. ``own_entries``: r's own prompt blocks
    an earlier routing of r indexed (``policies.OwnEntries``). Returns ``(state, target)``."""
    own = p.pd.pool_own[pool]
    spec = policies.RouteSpec(
        policy=jnp.where(own, RoutingPolicy.WEIGHTED, p.routing.policy),
        scorer_order=jnp.where(own, p.pd.pool_order[pool], p.routing.scorer_order),
        scorer_weight=jnp.where(own, p.pd.pool_weight[pool], p.routing.scorer_weight),
        prefix_index_on=jnp.where(own, jnp.any(p.pd.pool_order[pool] == Scorer.PREFIX_AFFINITY),
                                  p.routing.prefix_index_on),
        candidates=pool_members(p, pool, routable=routable), own_entries=own_entries)
    s = _exchange(s, st, pool, own)
    s, target = policies.route(s, st, c, p, r, now, active, spec)
    return _exchange(s, st, pool, own), target


def _own_indexed(s: SimState, st, p, r, decode, before, active) -> SimState:
    """Record where r's decode routing put its own prompt blocks in the lane router's index
    (``before``: the instances' ``lru_clock`` and ``lru_own`` before it), when both pools route
    with the lane's router and that routing indexed r (its clock moved)."""
    clock, own = before
    same_router = ~p.pd.pool_own[POOL_DECODE] & ~p.pd.pool_own[POOL_PREFILL]
    indexed = active & same_router & (s.router.lru_clock[decode] != clock[decode])
    q = s.pd
    row = jnp.where(indexed, r, st.shapes.num_requests)
    return s.replace(pd=q.replace(own_clock=q.own_clock.at[row].set(clock[decode]),
                                  own_base=q.own_base.at[row].set(own[decode])))


def own_entries(s: SimState, r):
    """r's own prompt blocks as its decode routing indexed them (``_own_indexed``), for its
    prefill routing (``EngineStatic.features.pd_own_index``)."""
    q = s.pd
    return policies.OwnEntries(instance=s.instance[r], clock=q.own_clock[r],
                               base=q.own_base[r], on=q.own_base[r] >= 0)


def route_request(s: SimState, st, c, p, r, now, active, *, routable=None):
    """Routing with pools (``PDCluster.route``): the decode instance first (among
    ``routable``, with instance lifecycles), then the decider, which reads that instance's
    cached prefix (the cache query). A disaggregated request awaits its prefill routing at
    this time, bound for its decode instance (``headed``); any other is served whole by the
    decode instance. Returns ``(state, decode instance, whole)``."""
    before = (s.router.lru_clock, s.router.lru_own)
    s, decode = route_pool(s, st, c, p, r, now, POOL_DECODE, active, routable=routable)
    if st.features.pd_own_index:
        s = _own_indexed(s, st, p, r, decode, before, active)
    cached = policies.cache_query(s, st, c, r)[decode]
    split = active & disaggregates(p, c, r, cached, st.settings.block_size)
    q = s.pd
    r_or_sink = jnp.where(split, r, st.shapes.num_requests)
    s = s.replace(
        status=s.status.at[r_or_sink].set(ROUTED), instance=s.instance.at[r_or_sink].set(decode),
        pd=q.replace(phase=q.phase.at[r_or_sink].set(PREFILL_ROUTING),
                     pf_next=jnp.where(split & (q.pf_next == st.shapes.num_requests),
                                       s.cursors.route,
                                       q.pf_next)))
    s = s.replace(pd=_headed(s.pd, st, decode, 1, split))
    return s, decode, active & ~split


def prefill_routing_us(s: SimState, st, c):
    """Time of the next prefill routing (INT64_MAX: none): its request's routing time."""
    k = s.pd.pf_next
    return jnp.where(k < st.shapes.num_requests, routings.routing_us(s, st, c, k), INT64_MAX)


def prefill_routed(s: SimState, st, r, target, active, *, rejected=False) -> SimState:
    """Request r (``routed_row`` of ``pf_next``)'s prefill sub-request went to ``target`` (or,
    ``rejected``, no prefill instance was routable: r is served by none, no longer
    disaggregated, no longer bound for its decode instance); the next routing awaiting its
    prefill routing is the first one after r's in routing order (all of them were routed at
    this time)."""
    q = s.pd
    r_or_sink = jnp.where(active & ~rejected, r, st.shapes.num_requests)
    r_rejected = jnp.where(rejected, r, st.shapes.num_requests)
    q = _headed(q.replace(phase=q.phase.at[r_rejected].set(WHOLE)), st, s.instance[r], -1,
                rejected)

    def cond(k):
        return (k < s.cursors.route) & (q.phase[routings.routed_row(s, st, k)] != PREFILL_ROUTING)

    def body(k, go):
        return k + go.astype(k.dtype)

    after = lane_while(cond, body, jnp.where(active, q.pf_next + 1, s.cursors.route))
    return s.replace(pd=q.replace(
        phase=q.phase.at[r_or_sink].set(PREFILL),
        prefill_instance=q.prefill_instance.at[r_or_sink].set(target),
        pf_next=jnp.where(active, jnp.where(after < s.cursors.route, after, st.shapes.num_requests),
                          q.pf_next)))


# ---- transfers ---------------------------------------------------------------------------------


class NextTransfer(NamedTuple):
    """The lane's next transfer event (``next_transfer``)."""

    t_us: jax.Array  # int64: its time (INT64_MAX: none)
    slot: jax.Array  # int32: its transfer slot


def next_transfer(s: SimState) -> NextTransfer:
    """The earliest transfer event by (time, priority: start before end, push order)."""
    q = s.pd
    used = q.x_req >= 0
    t = jnp.where(used, q.x_time, INT64_MAX)
    first = used & (t == jnp.min(t))
    first = first & (q.x_done == jnp.all(~first | q.x_done))  # a start, if one is due
    slot = jnp.argmin(jnp.where(first, q.x_seq, INT64_MAX)).astype(jnp.int32)
    return NextTransfer(jnp.min(t), slot)


def push_transfer_starts(s: SimState, st, c, reqs, finished, now, left) -> SimState:
    """Prefill sub-requests among ``reqs`` that ``finished`` in a step at ``now`` ending at
    ``left`` start their transfers (``PDCluster.prefills_completed``): at ``left``,
    or with ``blis_quirks`` at ``now`` (Decision 12), pushed in the order of their id text
    (``WorkloadConsts.pd_rank``)."""
    q = s.pd
    n = st.shapes.num_requests
    done = finished & (reqs > n)
    r = parent_row(st, reqs)
    count = jnp.sum(done, dtype=jnp.int32)
    x = q.x_req.shape[0]
    free = q.x_req < 0
    # the k-th finishing prefill takes the k-th free slot
    slot_of = jnp.zeros(x, jnp.int32).at[jnp.where(free, jnp.cumsum(free) - 1, x)].set(
        jnp.arange(x, dtype=jnp.int32), mode="drop")
    k = jnp.cumsum(done) - 1
    fits = done & (k < jnp.sum(free))
    slot = jnp.where(fits, slot_of[jnp.clip(k, 0, x - 1)], x)
    start = now if st.settings.blis_quirks else left
    seq = q.x_clock * (n + 1) + c.pd_rank[jnp.where(done, r, n)].astype(jnp.int64)
    r_or_sink = jnp.where(done, r, n)
    return s.replace(pd=q.replace(
        x_req=q.x_req.at[slot].set(r, mode="drop"),
        x_time=q.x_time.at[slot].set(start, mode="drop"),
        x_done=q.x_done.at[slot].set(False, mode="drop"),
        x_seq=q.x_seq.at[slot].set(seq, mode="drop"),
        x_clock=q.x_clock + (count > 0).astype(jnp.int64),
        phase=q.phase.at[r_or_sink].set(TRANSFER),
        prefill_completed=q.prefill_completed + count,
        ovf_transfers=q.ovf_transfers + jnp.sum(done & ~fits, dtype=jnp.int32)))


def transfer_started(s: SimState, st, c, p, k, r, now, reserved, active) -> SimState:
    """The bookkeeping of request r's transfer start in slot k (``_start_transfer``): the
    start time; a failed reservation drops the request, a successful one schedules the
    transfer's end (its bandwidth shared by the transfers in flight under contention)."""
    q = s.pd
    n = st.shapes.num_requests
    go = active & reserved
    failed = active & ~reserved
    contention = go & p.pd.contention
    in_flight = jnp.where(contention, q.active + 1, 1)
    end = now + transfer_duration_us(p, c, r, in_flight)
    q = _headed(q, st, s.instance[jnp.maximum(r, 0)], -1, failed)
    return s.replace(pd=q.replace(
        transfer_start_us=q.transfer_start_us.at[jnp.where(active, r, n)].set(now),
        phase=q.phase.at[jnp.where(failed, r, n)].set(DROPPED_AT_DECODE),
        dropped_kv=q.dropped_kv + failed.astype(jnp.int32),
        x_req=upd(q.x_req, k, NIL, failed), x_done=upd(q.x_done, k, True, go),
        x_time=upd(q.x_time, k, end, go), x_seq=upd(q.x_seq, k, q.x_clock * (n + 1), go),
        x_clock=q.x_clock + go.astype(jnp.int64),
        active=q.active + contention.astype(jnp.int32),
        peak=jnp.where(contention, jnp.maximum(q.peak, in_flight), q.peak),
        depth_sum=q.depth_sum + jnp.where(contention, in_flight, 0).astype(jnp.int64),
        starts=q.starts + contention.astype(jnp.int64)))


def transfer_ended(s: SimState, st, p, k, r, now, active) -> SimState:
    """The bookkeeping of a transfer's end in slot k (``_end_transfer``)."""
    q = s.pd
    r_or_sink = jnp.where(active, r, st.shapes.num_requests)
    q = _headed(q, st, s.instance[jnp.maximum(r, 0)], -1, active)
    return s.replace(pd=q.replace(
        x_req=upd(q.x_req, k, NIL, active),
        active=q.active - (active & p.pd.contention).astype(jnp.int32),
        transfer_end_us=q.transfer_end_us.at[r_or_sink].set(now),
        phase=q.phase.at[r_or_sink].set(DECODE)))
