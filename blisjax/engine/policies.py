"""Policy templates of the JAX engine, evaluated per lane from its ``PolicyParams``.

Counterpart: ``blisjax.reference.policies`` — ``Admission`` (with ``TokenBucket``) as
``admit``, ``Priority.score`` as ``priority_score``, ``reorder_wait_queue`` as ``head_offset``
(the wait queue is never sorted: the next request to admit is found by a fold over it),
``PrefixIndex`` as ``prefix_match`` and ``prefix_touch``, ``Router.route`` and
``Router.weighted_scores`` as ``route`` and ``weighted_scores``. Every template of a section is
computed and the lane's code selects one, so a population can mix templates freely
(docs/semantics.md §5.3, §5.5–§5.7, §5.9; Decisions 5–6).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.config.codes import (
    LOAD_AWARE_QUEUE_THRESHOLD,
    AdmissionPolicy,
    Code,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.engine import gorand, kvblocks, program, recent, sessions
from blisjax.engine import kvcache as kv
from blisjax.engine.exactfloat import exact_mul, ieee_divide
from blisjax.engine.lockstep import add, lane_once, upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.queues import q_fold
from blisjax.engine.state import SimState, parent_row
from blisjax.engine.vec import leading_count
from blisjax.gorand import FEED_START, STATE_WORDS
from blisjax.program.observables import scorer_name

F64 = jnp.float64


@pytree_dataclass
class RouterState:
    """The router's state (``Router``): what each instance has in flight, the periodic
    snapshots, BLIS's "router" random stream, the prefix index and no-hit-lru recency, and the
    cache query's periodic copy. Shapes: I instances, G prefix groups, Jg blocks per group."""

    in_flight: jax.Array  # int32 [I]: routed requests not yet finished, per instance
    rr: jax.Array  # int32: round-robin counter
    snap_qd: jax.Array  # int32 [I]: snapshot of queue depths
    snap_bs: jax.Array  # int32 [I]: snapshot of batch sizes
    snap_kv: jax.Array  # float64 [I]: snapshot of KV utilisation
    snap_last: jax.Array  # int64 µs: time of the last snapshot refresh
    # BLIS's "router" random stream (Router.rng; engine.gorand): ties draw from it
    rng_words: jax.Array  # int64 [607]: Go source state
    rng_tap: jax.Array  # int32
    rng_feed: jax.Array  # int32
    # no-hit-lru scorer (Router.cold_recency): when each instance last took a cold request
    cold_stamp: jax.Array  # int64 [I]: stamp of its last cold request, -1 = never
    cold_clock: jax.Array  # int64: next stamp
    # the cache query's periodic copy (ClusterSimulator._cache_copy; only with a positive
    # cache signal delay, ``EngineStatic.cache_copy_on``, else one unused entry)
    cache_copy: jax.Array  # bool [I·G·Jg]: the hash slot was registered at the last refresh
    cache_copy_last: jax.Array  # int64 µs: time of the last refresh
    # router-side prefix index per instance (PrefixIndex; see prefix_match)
    lru_pos: jax.Array  # int64 [I, G, Jg]: position of the group block's last touch, -1 = never
    lru_own_at: jax.Array  # int64 [I, G, Jg]: own entries inserted before that touch
    lru_clock: jax.Array  # int64 [I]: next touch position
    lru_own: jax.Array  # int64 [I]: own (not prefix-group) entries inserted so far
    # the blocks closed-loop sessions share (``EngineStatic.features.session_prefix_index``; else
    # one unused entry per instance): as ``lru_pos`` / ``lru_own_at`` per (session, block)
    lru_spos: jax.Array  # int64 [I, S, Js]
    lru_sown_at: jax.Array  # int64 [I, S, Js]


def init_router(st, router_rng=None) -> RouterState:
    """Nothing in flight, empty snapshots and index; ``router_rng``: the seeded words of the
    "router" stream (``PolicyParams.routing.router_rng``; zeros if not given)."""
    i, g, jg = st.shapes.num_instances, st.shapes.num_groups, st.shapes.group_blocks_max
    sessions = (st.shapes.num_sessions,
                st.shapes.session_blocks_max) if st.features.session_prefix_index else (1, 1)
    i32, i64 = jnp.int32, jnp.int64
    return RouterState(
        in_flight=jnp.zeros(i, i32), rr=jnp.asarray(0, i32), snap_qd=jnp.zeros(i, i32),
        snap_bs=jnp.zeros(i, i32), snap_kv=jnp.zeros(i, jnp.float64),
        snap_last=jnp.asarray(0, i64),
        rng_words=(jnp.zeros(STATE_WORDS, i64) if router_rng is None
                   else jnp.asarray(router_rng, i64)),
        rng_tap=jnp.asarray(0, i32), rng_feed=jnp.asarray(FEED_START, i32),
        cold_stamp=jnp.full(i, -1, i64), cold_clock=jnp.asarray(0, i64),
        cache_copy=jnp.zeros(st.group_slots + st.session_slots if st.cache_copy_on else 1, bool),
        cache_copy_last=jnp.asarray(0, i64),
        lru_pos=jnp.full((i, g, jg), -1, i64), lru_own_at=jnp.zeros((i, g, jg), i64),
        lru_clock=jnp.zeros(i, i64), lru_own=jnp.zeros(i, i64),
        lru_spos=jnp.full((i, *sessions), -1, i64), lru_sown_at=jnp.zeros((i, *sessions), i64))



def forget_instance(router: RouterState, i, active) -> RouterState:
    """The router forgets instance i where ``active`` (``Router.forget_instance``): its prefix
    index and no-hit-lru recency start over."""
    return router.replace(lru_pos=upd(router.lru_pos, i, -1, active),
                          lru_own_at=upd(router.lru_own_at, i, 0, active),
                          lru_clock=upd(router.lru_clock, i, 0, active),
                          lru_own=upd(router.lru_own, i, 0, active),
                          lru_spos=upd(router.lru_spos, i, -1, active),
                          lru_sown_at=upd(router.lru_sown_at, i, 0, active),
                          cold_stamp=upd(router.cold_stamp, i, -1, active))


@pytree_dataclass
class AdmissionState:
    """Admission's state (``Admission``): the token-bucket / rate-limit bucket, the
    tenant-bucket's per-tenant buckets and admitted requests in flight; T tenants."""

    bucket: jax.Array  # float64: token-bucket / rate-limit bucket level
    bucket_last: jax.Array  # int64 µs: time of the bucket's last refill
    tenant_bucket: jax.Array  # float64 [T]: tenant-bucket's per-tenant bucket levels
    tenant_bucket_last: jax.Array  # int64 µs [T]: time of each one's last refill
    tenant_in_flight: jax.Array  # int32 [T]: admitted requests not yet finished, per tenant
    rejected: jax.Array  # int32: requests rejected by admission


def init_admission(st, bucket, tenant_capacity=None) -> AdmissionState:
    """The bucket at ``bucket`` (full), each tenant's at ``tenant_capacity`` [T] (full;
    zeros if not given)."""
    t = st.shapes.num_tenants
    return AdmissionState(
        bucket=jnp.asarray(bucket, jnp.float64), bucket_last=jnp.asarray(0, jnp.int64),
        tenant_bucket=(jnp.zeros(t, jnp.float64) if tenant_capacity is None
                       else jnp.asarray(tenant_capacity, jnp.float64)),
        tenant_bucket_last=jnp.zeros(t, jnp.int64), tenant_in_flight=jnp.zeros(t, jnp.int32),
        rejected=jnp.asarray(0, jnp.int32))


def by_code(codes: type[Code], value_of: dict) -> jax.Array:
    """The values of ``value_of`` stacked in code order of the enumeration ``codes`` (every
    member must have one): indexing the result with a lane's code selects its template."""
    return jnp.stack([jnp.asarray(value_of[member]) for member in codes])


# ---- admission ---------------------------------------------------------------------------------


class AdmitDecision(NamedTuple):
    """An admission decision and the token bucket after it (``admit``)."""

    admitted: jax.Array  # bool: the request is admitted
    bucket: jax.Array  # float64: bucket level after the decision (tokens or requests)
    bucket_last: jax.Array  # int64 µs: time of the bucket's last refill
    tenant_bucket: jax.Array  # float64 [T]: the tenants' buckets after it (tenant-bucket)
    tenant_bucket_last: jax.Array  # int64 µs [T]


def admit(s: SimState, st, c, p, r, now, active, members) -> AdmitDecision:
    """Admission of request r at ``now`` (``Admission.admit``). Token bucket: cost = input
    tokens; rate limit: the same bucket counted in requests (cost 1); tenant quota: fewer
    in-flight requests of r's tenant than its quota; program: the lane's admission program's
    value > 0 (its cluster observables over ``members``, bool [I]: the instances the router
    could pick). The bucket changes only where ``active`` and the lane's template uses it."""
    code = p.admission.policy
    limited = code == AdmissionPolicy.RATE_LIMIT
    cap = jnp.where(limited, p.admission.rl_burst, p.admission.tb_capacity)
    rate = jnp.where(limited, p.admission.rl_rate, p.admission.tb_rate)
    tokens, refill = _refilled(s.admission.bucket, s.admission.bucket_last, cap, rate, now, c)
    cost = jnp.where(limited, 1.0, c.input_tokens[r].astype(F64))
    take = tokens >= cost
    uses_bucket = active & ((code == AdmissionPolicy.TOKEN_BUCKET) | limited)
    t = c.tenant[r]
    quota_ok = s.admission.tenant_in_flight[t] < p.admission.tenant_quota[t]
    # tenant-bucket: request r's tenant's bucket, refilled as the shared one
    t_tokens, t_refill = _refilled(s.admission.tenant_bucket[t], s.admission.tenant_bucket_last[t],
                                   p.admission.tt_capacity[t], p.admission.tt_rate[t], now, c)
    t_cost = c.input_tokens[r].astype(F64)
    t_take = t_tokens >= t_cost
    t_uses = active & (code == AdmissionPolicy.TENANT_BUCKET)
    admitted = by_code(AdmissionPolicy, {
        AdmissionPolicy.ALWAYS_ADMIT: True, AdmissionPolicy.TOKEN_BUCKET: take,
        AdmissionPolicy.REJECT_ALL: False, AdmissionPolicy.RATE_LIMIT: take,
        AdmissionPolicy.TENANT_QUOTA: quota_ok,
        AdmissionPolicy.PROGRAM: _admission_program(s, st, c, p, r, now, members),
        AdmissionPolicy.LOAD_SHED: _below_load_limits(s, p, members),
        AdmissionPolicy.TENANT_BUCKET: t_take})[code]
    return AdmitDecision(
        admitted=admitted,
        bucket=jnp.where(uses_bucket, jnp.where(take, tokens - cost, tokens), s.admission.bucket),
        bucket_last=jnp.where(uses_bucket & refill, now, s.admission.bucket_last),
        tenant_bucket=upd(s.admission.tenant_bucket, t,
                          jnp.where(t_take, t_tokens - t_cost, t_tokens), t_uses),
        tenant_bucket_last=upd(s.admission.tenant_bucket_last, t, now, t_uses & t_refill))


def _refilled(level, last_us, capacity, rate, now, c):
    """``(level, refills)``: a token bucket's level at ``now`` (``TokenBucket.try_take``'s
    refill: ``rate`` per second since ``last_us``, capped at ``capacity``) and whether time
    has passed since (else the level is unchanged and so is ``last_us``)."""
    elapsed = now - last_us
    refills = elapsed > 0
    refilled = ieee_divide(elapsed.astype(F64) * rate, c.one_e6)  # not ·(1/1e6): exactfloat
    return jnp.where(refills, jnp.minimum(capacity, level + refilled), level), refills


def _below_load_limits(s: SimState, p, members):
    """load-shed: the routable instances' queued requests (snapshots, summed) below
    ``p.admission.shed_queue`` and their mean KV utilization below ``p.admission.shed_kv`` (a 0
    limit unchecked),
    as the cluster observables read them (``program.cluster_load``)."""
    queued, mean, _ = program.cluster_load(s, members)
    return (((p.admission.shed_queue == 0) | (queued < p.admission.shed_queue))
            & ((p.admission.shed_kv == 0.0) | (mean < p.admission.shed_kv)))


def _admission_program(s: SimState, st, c, p, r, now, members):
    """The admission program's verdict (False where the site is not compiled in)."""
    if "admission" not in st.features.program_sites:
        return jnp.asarray(False)
    values = {**program.request_values(s, st, c, r, now),
              **program.cluster_values(s, st, c, members, now)}
    return program.run(p.admission.program, program.rows(1, values))[0] > 0.0


# ---- priority and the instance scheduler --------------------------------------------------------


def priority_score(s: SimState, st, p, c, r, now):
    """Priority of request(s) r at time now, float64, higher = more urgent (``Priority.score``):
    constant 0; slo-based age_weight·(0 + 1e-6·age); slo-class and tenant-priority static
    scores; deadline-aware minus the remaining slack in seconds; program: the lane's priority
    program's value (request observables)."""
    age = (now - sessions.arrival_us(s, st, c, r)).astype(F64)
    slo_based = p.priority.age_weight * (0.0 + c.one_e_6 * age)
    slo_class = p.priority.class_score[c.slo_class[r]]
    tenant = p.priority.tenant_score[c.tenant[r]]
    due_us = sessions.deadline_us(s, st, c, r)
    slack = (due_us - now).astype(F64)
    deadline = jnp.where(due_us > 0, -(c.one_e_6 * slack), p.priority.no_deadline_score)
    return by_code(PriorityPolicy, {
        PriorityPolicy.CONSTANT: jnp.zeros_like(slo_based), PriorityPolicy.SLO_BASED: slo_based,
        PriorityPolicy.SLO_CLASS: slo_class, PriorityPolicy.TENANT_PRIORITY: tenant,
        PriorityPolicy.DEADLINE_AWARE: deadline,
        PriorityPolicy.PROGRAM: _priority_program(s, st, p, c, r, now, slo_based),
    })[p.priority.policy]


def _priority_program(s: SimState, st, p, c, r, now, like):
    """The priority program's value for request(s) r (zeros where the site is not compiled
    in); ``like``: an array of r's shape."""
    if "priority" not in st.features.program_sites:
        return jnp.zeros_like(like)
    r = jnp.atleast_1d(r)
    values = program.run(p.priority.program, program.rows(r.shape[0], program.request_values(
        s, st, c, r, now)))
    return values.reshape(like.shape)


class _QueueBest(NamedTuple):
    """The best queued request found so far by ``head_offset``'s fold."""

    key: jax.Array  # float64: -priority (priority-fcfs) or input length (sjf); smaller first
    arrival_us: jax.Array  # int64: its arrival (first tie-break)
    request: jax.Array  # int32: its request index (second tie-break; a sub-request's parent)
    offset: jax.Array  # int32: its offset from the queue's head


def head_offset(s: SimState, st, c, p, i, now, active):
    """Queue offset of the next request to admit on instance i (``reorder_wait_queue``'s
    first entry): fcfs = the head; priority-fcfs = (priority desc, arrival, index); sjf =
    (input length, arrival, index) — the lexicographically smallest key, folded over the queue
    ``q_chunk`` entries at a time (work follows the queue's length; nothing runs when every
    lane is fcfs)."""
    by_priority = p.scheduler == SchedulerPolicy.PRIORITY_FCFS
    inf = jnp.asarray(jnp.inf, F64)
    imax = jnp.iinfo(jnp.int64).max

    def fold(best: _QueueBest, off, reqs, valid) -> _QueueBest:
        # sjf's integer lengths are exact in float64, so one key type serves both orders
        key = jnp.where(by_priority, -priority_score(s, st, p, c, reqs, now),
                        c.input_tokens[reqs].astype(F64))
        arrival = sessions.arrival_us(s, st, c, reqs)
        # the reference's index: a P/D sub-request carries its parent's
        index = parent_row(st, reqs) if st.features.pd else reqs
        key_min = jnp.min(jnp.where(valid, key, inf))
        cand = valid & (key == key_min)
        arrival_min = jnp.min(jnp.where(cand, arrival, imax))
        cand = cand & (arrival == arrival_min)
        j = jnp.argmin(jnp.where(cand, index, unseen))
        better = jnp.any(valid) & (
            (key[j] < best.key) | ((key[j] == best.key) & ((arrival[j] < best.arrival_us)
                                                           | ((arrival[j] == best.arrival_us)
                                                              & (index[j] < best.request)))))
        return _QueueBest(jnp.where(better, key[j], best.key),
                          jnp.where(better, arrival[j], best.arrival_us),
                          jnp.where(better, index[j], best.request),
                          jnp.where(better, off[j], best.offset))

    unseen = jnp.asarray(jnp.iinfo(jnp.int32).max, jnp.int32)  # past every row
    init = _QueueBest(inf, jnp.asarray(imax, jnp.int64), unseen, jnp.asarray(0, jnp.int32))
    return q_fold(s, st, i, active & (p.scheduler != SchedulerPolicy.FCFS), fold, init).offset


# ---- routing -----------------------------------------------------------------------------------


def prefix_fraction(matched, full_blocks):
    """The prefix-affinity score: matched / full blocks (0 without a full block), float64 [I]
    from ``matched`` [I] and the request's ``full_blocks``. The divisor is one scalar for
    every instance, so IEEE division (``ieee_divide``), not XLA's product by its rounded
    reciprocal (5/12 would come out one bit low, breaking ties)."""
    return jnp.where(full_blocks > 0, ieee_divide(matched.astype(F64),
                                                  jnp.maximum(full_blocks, 1).astype(F64)), 0.0)


def prefix_match(s: SimState, st, c, r, *, own: OwnEntries | None = None):
    """Matched leading prompt blocks of r in each instance's router-side LRU index [I]
    (``PrefixIndex.match_length``).

    A request's prompt blocks are, in order, its prefix group's (``j < group_blocks``), with
    closed-loop sessions its session's (``j < session_blocks``: every round of the
    conversation has them, ``EngineStatic.features.session_prefix_index``), and its own. The shared
    ones can match; its own ones only where an earlier routing of r indexed them (``own``:
    P/D's prefill routing after its decode routing), as they are indexed after r is routed.
    An entry is present iff fewer than ``capacity`` distinct entries were touched after it
    (LRU stack distance): own entries inserted since, plus shared entries with a later touch
    position. r's own entries were inserted in order after its shared ones, so all of them
    are present iff the oldest is (the newest entries of an LRU are evicted last).
    """
    pos, own_at, shared = _index_rows(s, st, c, r)  # [I, J], [J]
    newer = (s.router.lru_own[:, None] - own_at) + _touched_after(s.router, st, pos)
    present = shared & (pos >= 0) & (newer < st.shapes.prefix_index_capacity)
    matched = leading_count(present, axis=1)
    if own is None:
        return matched
    d = own.instance
    n_shared = _shared_blocks(st, c, r)
    n_own = c.full_blocks[r] - n_shared
    oldest = own.clock + n_shared  # the touch position of r's first own block
    newer_own = (s.router.lru_own[d] - own.base - 1) \
        + _touched_after(s.router, st, jnp.reshape(oldest, (1, 1)), d)[0, 0]
    kept = own.on & (n_own > 0) & (matched[d] >= n_shared) \
        & (newer_own < st.shapes.prefix_index_capacity)
    return matched.at[d].add(jnp.where(kept, n_own, 0).astype(matched.dtype))


def _touched_after(router, st, pos, instance=None):
    """Shared entries touched after the positions ``pos`` [I, J] on each instance, [I, J]
    (with ``session_prefix_index``, conversations' entries too); with ``instance``, ``pos``
    [1, J] on that instance alone."""
    def rows(x):  # [I or 1, entries]
        return x.reshape(st.shapes.num_instances, -1) if instance is None \
            else x[instance].reshape(1, -1)

    count = jnp.sum(rows(router.lru_pos)[:, None, :] > pos[:, :, None], axis=-1)
    if st.features.session_prefix_index:
        count = count + jnp.sum(rows(router.lru_spos)[:, None, :] > pos[:, :, None], axis=-1)
    return count


def _shared_blocks(st, c, r):
    """r's leading prompt blocks the index keeps per prefix group (and, with
    ``session_prefix_index``, per conversation); the rest of its full blocks are its own."""
    shared = jnp.minimum(c.group_blocks[r], c.full_blocks[r])
    if st.features.session_prefix_index:
        shared = jnp.where(c.session[r] >= 0,
                           jnp.maximum(shared, jnp.minimum(c.session_blocks[r],
                                                           c.full_blocks[r])), shared)
    return shared


def _index_rows(s: SimState, st, c, r):
    """r's shared prompt blocks in the prefix index, [I, J] over blocks j < J (the longer of
    a group's and, with ``session_prefix_index``, a session's blocks): each block's touch
    position (-1 where never touched, own or past the prompt), own entries at that touch, and
    which blocks are shared (bool [J])."""
    g = jnp.maximum(c.group[r], 0)
    gb = c.group_blocks[r]
    jg = st.shapes.group_blocks_max
    pos, own_at = s.router.lru_pos[:, g, :], s.router.lru_own_at[:, g, :]  # [I, Jg]
    if not st.features.session_prefix_index:
        return pos, own_at, jnp.arange(jg) < gb
    width = max(jg, st.shapes.session_blocks_max)
    j = jnp.arange(width)
    pad = ((0, 0), (0, width - jg))
    pos, own_at = jnp.pad(pos, pad, constant_values=-1), jnp.pad(own_at, pad)
    sid = jnp.maximum(c.session[r], 0)
    spad = ((0, 0), (0, width - st.shapes.session_blocks_max))
    spos = jnp.pad(s.router.lru_spos[:, sid, :], spad, constant_values=-1)
    sown = jnp.pad(s.router.lru_sown_at[:, sid, :], spad)
    in_session = (j >= gb) & (c.session[r] >= 0) & (j < c.session_blocks[r])
    full = j < c.full_blocks[r]
    pos = jnp.where(j < gb, pos, jnp.where(in_session & full, spos, -1))
    own_at = jnp.where(j < gb, own_at, sown)
    return pos, own_at, (j < gb) | in_session


def prefix_touch(s: SimState, st, c, r, target, active, *,
                 own: OwnEntries | None = None) -> SimState:
    """The routed request's prompt blocks become the most recent entries of the target's index
    (``PrefixIndex.touch``): shared blocks at touch positions in prompt order, own blocks
    counted. ``own``: r's own blocks an earlier routing indexed; touched again on that
    instance they move to the newest end rather than adding entries, so every entry touched
    before that routing stops counting them twice (its ``own_at`` grows by their number)."""
    router = s.router
    inserted = (c.full_blocks[r] - _shared_blocks(st, c, r)).astype(jnp.int64)  # own blocks
    if own is not None:
        again = active & own.on & (target == own.instance)

        def moved(own_at):  # [I, ...]: entries touched before r's first routing
            at = own_at[target]
            return own_at.at[target].set(jnp.where(again & (at <= own.base), at + inserted,
                                                   at))

        router = router.replace(lru_own_at=moved(router.lru_own_at))
        if st.features.session_prefix_index:
            router = router.replace(lru_sown_at=moved(router.lru_sown_at))
    g = jnp.maximum(c.group[r], 0)
    j = jnp.arange(st.shapes.group_blocks_max)
    mine = active & (j < c.group_blocks[r])
    row = jnp.where(mine, router.lru_clock[target] + j, router.lru_pos[target, g])
    row_own = jnp.where(mine, router.lru_own[target], router.lru_own_at[target, g])
    full = c.full_blocks[r].astype(jnp.int64)
    if st.features.session_prefix_index:
        js = jnp.arange(st.shapes.session_blocks_max)
        sid = jnp.maximum(c.session[r], 0)
        ours = active & (c.session[r] >= 0) & (js >= c.group_blocks[r]) \
            & (js < c.session_blocks[r]) & (js < c.full_blocks[r])
        srow = jnp.where(ours, router.lru_clock[target] + js, router.lru_spos[target, sid])
        srow_own = jnp.where(ours, router.lru_own[target], router.lru_sown_at[target, sid])
        router = router.replace(lru_spos=router.lru_spos.at[target, sid].set(srow),
                                lru_sown_at=router.lru_sown_at.at[target, sid].set(srow_own))
    return s.replace(router=router.replace(
                         lru_pos=router.lru_pos.at[target, g].set(row),
                         lru_own_at=router.lru_own_at.at[target, g].set(row_own),
                         lru_clock=add(router.lru_clock, target, full, active),
                         lru_own=add(router.lru_own, target, inserted, active)))


class RouterView(NamedTuple):
    """What routing reads about each instance (``reference.policies.Snapshot``), [I]."""

    load: jax.Array  # int32: queue depth + batch size + in flight (snapshots; in flight live)
    cached: jax.Array  # int32: cached leading prompt blocks of the request (cache query; zeros
    #                    when no lane's scorers read it, ``EngineStatic.features.cache_scorers``)
    cold: jax.Array  # bool (scalar): no instance caches any of the request's prompt


def _min(x, among):
    """Minimum of ``x`` over the instances ``among`` (bool [I]; None: all of them)."""
    if among is None:
        return jnp.min(x)
    return jnp.min(jnp.where(among, x, jnp.iinfo(x.dtype).max if x.dtype.kind in "iu"
                             else jnp.inf))


def _max(x, among):
    """Maximum of ``x`` over the instances ``among`` (bool [I]; None: all of them)."""
    return -_min(-x, among)


def _inverted_min_max(x, among=None):
    """(max − x)/(max − min) over the instances ``among``, 1.0 everywhere when all are equal
    (``min_max_inverted``)."""
    lo, hi = _min(x, among), _max(x, among)
    q = ieee_divide((hi - x).astype(F64), jnp.maximum(hi - lo, 1).astype(F64))
    return jnp.where(hi == lo, 1.0, q)


def _cold_ramp(s: SimState, st, among=None):
    """no-hit-lru's scores for a cold request (``Router.scorer``): among the candidates
    (``among``; None: every instance), those that never took a cold request first (instance
    order), then the least recently given one; rank k of n scores 1 − k/(n − 1)."""
    if st.shapes.num_instances == 1:
        return jnp.ones(1, F64)
    idx = jnp.arange(st.shapes.num_instances)
    stamp = s.router.cold_stamp
    never = stamp < 0
    cand = jnp.ones(st.shapes.num_instances, bool) if among is None else among
    n = st.shapes.num_instances if among is None else jnp.sum(among)
    never_before = jnp.sum((cand & never)[None, :] & (idx[None, :] < idx[:, None]), axis=1)
    used_before = jnp.sum((cand & ~never)[None, :] & (stamp[None, :] < stamp[:, None]), axis=1)
    rank = jnp.where(never, never_before, jnp.sum(cand & never) + used_before)
    denominator = jnp.broadcast_to(jnp.maximum(n - 1, 1), rank.shape).astype(F64)
    return jnp.where(n == 1, 1.0, 1.0 - ieee_divide(rank.astype(F64), denominator))


class OwnEntries(NamedTuple):
    """A request's own prompt blocks that an earlier routing of it put in the router's index
    (P/D: its decode routing, when both pools route with the lane's router,
    ``EngineStatic.features.pd_own_index``): on ``instance``, as the newest entries after that
    routing's shared blocks. Its prefill routing can match them there, and touching them
    again there moves them rather than adding entries (``prefix_match``, ``prefix_touch``)."""

    instance: jax.Array  # int32: where they were indexed
    clock: jax.Array  # int64: the instance's ``lru_clock`` before that routing
    base: jax.Array  # int64: its ``lru_own`` (own entries inserted) before that routing
    on: jax.Array  # bool: they were indexed


class RouteSpec(NamedTuple):
    """One routing decision's router (``reference.policies.Router`` and the candidates its
    ``route`` gets): the lane's own routing, or a P/D pool's (``engine.pd``)."""

    policy: jax.Array  # int32 ``RoutingPolicy`` code
    scorer_order: jax.Array  # int32 [S]: ``Scorer`` codes in configuration order, -1 padded
    scorer_weight: jax.Array  # float64 [S]: their weights over their sum (host-normalised)
    prefix_index_on: jax.Array  # bool: the prefix index records the decision
    candidates: jax.Array | None  # bool [I]: the instances it decides among (None: all)
    own_entries: OwnEntries | None = None  # the request's own blocks already indexed


def lane_spec(p) -> RouteSpec:
    """The lane's own router, deciding among every instance."""
    rt = p.routing
    return RouteSpec(rt.policy, rt.scorer_order, rt.scorer_weight, rt.prefix_index_on, None)


def scorer_values(s: SimState, st, c, r, view: RouterView, among, *, own=None):
    """Every scorer's value for each instance, before clamping (``Router.scorer``), float64
    [S, I] in ``Scorer`` code order; scores that normalise over instances do so over
    ``among`` (bool [I]; None: all). ``own``: r's own blocks already indexed
    (``OwnEntries``)."""
    qd, bs, in_flight = s.router.snap_qd, s.router.snap_bs, s.router.in_flight
    full = c.full_blocks[r]
    prefix = prefix_fraction(prefix_match(s, st, c, r, own=own), full)
    lo, hi = _min(view.cached, among), _max(view.cached, among)
    precise = jnp.where(hi == lo, 1.0, ieee_divide((view.cached - lo).astype(F64),
                                                   jnp.maximum(hi - lo, 1).astype(F64)))
    cap = LOAD_AWARE_QUEUE_THRESHOLD
    load_aware = jnp.where(qd == 0, 0.5, 0.5 * (1.0 - jnp.minimum(qd, cap).astype(F64) / cap))
    most = _max(in_flight, among)
    active_requests = jnp.where((in_flight == 0) | (most == 0), 1.0, ieee_divide(
        (most - in_flight).astype(F64), jnp.maximum(most, 1).astype(F64)))
    no_hit = jnp.where(view.cold, _cold_ramp(s, st, among), 0.5) if st.features.cache_scorers \
        else jnp.full(st.shapes.num_instances, 0.5, F64)
    scores = by_code(Scorer, {
        Scorer.PREFIX_AFFINITY: prefix, Scorer.QUEUE_DEPTH: _inverted_min_max(qd, among),
        Scorer.KV_UTILIZATION: 1.0 - s.router.snap_kv,
        Scorer.LOAD_BALANCE: 1.0 / (1 + view.load).astype(F64),
        Scorer.PRECISE_PREFIX_CACHE: precise, Scorer.LOAD_AWARE: load_aware,
        Scorer.ACTIVE_REQUESTS: active_requests,
        Scorer.RUNNING_REQUESTS: _inverted_min_max(bs, among),
        Scorer.NO_HIT_LRU: no_hit, Scorer.VLLM_DP: _inverted_min_max(4 * qd + bs, among)})
    return scores


def weighted_scores(scores, spec: RouteSpec, num_instances: int):
    """Σ clamp(score)·weight in configuration order, products formed exactly (no FMA)
    (``Router.weighted_scores``); float64 [I]. ``scores``: ``scorer_values`` [S, I]."""
    norm = spec.scorer_weight  # normalised on the host (``params._scorer_arrays``)
    total = jnp.zeros(num_instances, F64)
    for k in range(len(Scorer)):
        code = spec.scorer_order[k]
        sk = jnp.clip(scores[jnp.maximum(code, 0)], 0.0, 1.0)
        total = jnp.where(code >= 0, total + exact_mul(sk, norm[k]), total)
    return total


def cache_query(s: SimState, st, c, r):
    """Leading full prompt blocks of r registered on each instance [I] (``ClusterSimulator.
    _cached_blocks``): in the live hash slots, or in their periodic copy. Only prefix-group
    blocks can be registered before r is first routed, so the narrow lookup width is exact
    (``kv.prefix_widths``)."""
    if not st.settings.prefix_caching:
        return jnp.zeros(st.shapes.num_instances, jnp.int32)
    width = kv.prefix_widths(st)[0]
    j = jnp.arange(width, dtype=jnp.int32)
    valid = j < c.full_blocks[r]

    def count(i):
        slots = jnp.where(valid, kvblocks.hash_slot(st, c, i, r, j), st.hash_slots)
        if st.cache_copy_on:  # the copy holds the prefix-group (and session) slots
            group = slots < st.group_slots + st.session_slots
            present = group & s.router.cache_copy[jnp.where(group, slots, 0)]
        else:
            present = s.kv.slot_block[slots] >= 0
        return leading_count(valid & present)

    return jax.vmap(count)(jnp.arange(st.shapes.num_instances))


def router_view(s: SimState, st, c, r) -> RouterView:
    """Loads, and the cache query where compiled in."""
    load = s.router.snap_qd + s.router.snap_bs + s.router.in_flight
    if not st.features.cache_scorers:
        zeros = jnp.zeros(st.shapes.num_instances, jnp.int32)
        return RouterView(load, zeros, jnp.asarray(True))
    cached = cache_query(s, st, c, r)
    return RouterView(load, cached, ~jnp.any(cached > 0))


def _break_tie(s: SimState, p, tied, active):
    """The instance among ``tied`` (bool [I]): where the lane breaks ties BLIS's way and more
    than one ties, ``tied[Intn(count)]`` from its "router" stream; otherwise the first."""
    count = jnp.sum(tied)
    draw_now = active & (count > 1) & (p.routing.tie_break == TieBreak.BLIS_RANDOM)

    def draw(carry, go):
        src, _ = carry
        src, k = gorand.intn(src, count, go)
        return src, k

    src = gorand.GoSource(s.router.rng_words, s.router.rng_tap, s.router.rng_feed)
    src, k = lane_once(draw_now, draw, (src, jnp.asarray(0, jnp.int32)))
    nth = tied & (jnp.cumsum(tied) - 1 == k)
    target = jnp.where(draw_now, jnp.argmax(nth), jnp.argmax(tied)).astype(jnp.int32)
    return s.replace(router=s.router.replace(rng_words=src.words, rng_tap=src.tap,
                                             rng_feed=src.feed)), target


def program_scores(s: SimState, st, c, p, r, now, view: RouterView, among, raw):
    """The lane's routing program's value for each instance, float64 [I]
    (``Router.program_scores``): instance observables from the router's view and ``raw``
    (``scorer_values`` [S, I]), request and cluster ones over ``among`` (bool [I]; None: all
    instances)."""
    members = jnp.ones(st.shapes.num_instances, bool) if among is None else among
    values = {"queue_depth": s.router.snap_qd.astype(F64),
              "batch_size": s.router.snap_bs.astype(F64),
              "in_flight": s.router.in_flight.astype(F64), "kv_utilization": s.router.snap_kv,
              "cached_blocks": view.cached.astype(F64),
              **{scorer_name(x): jnp.clip(raw[x], 0.0, 1.0) for x in Scorer},
              **program.request_values(s, st, c, r, now),
              **program.cluster_values(s, st, c, members, now), **recent.values(s.recent, now)}
    return program.run(p.routing.program, program.rows(st.shapes.num_instances, values))


def route(s: SimState, st, c, p, r, now, active, spec: RouteSpec | None = None):
    """Target instance of request r (``Router.route``), from the router's snapshots: round
    robin, least loaded, always busiest (load = queue depth + batch size + in flight; ties to
    the first) or the best weighted score; least-loaded and weighted ties broken by
    ``_break_tie``. Where ``active``, the round-robin counter advances, the prefix index
    records r and no-hit-lru a cold request's target. ``spec``: the router and its
    candidates (default: the lane's routing among every instance). Returns
    ``(state, target)``."""
    spec = lane_spec(p) if spec is None else spec
    among = spec.candidates
    view = router_view(s, st, c, r)
    if among is not None:  # a cold request: none of the candidates caches its prompt
        view = view._replace(cold=~jnp.any(among & (view.cached > 0)))
    load = view.load
    weighted_lane = spec.policy == RoutingPolicy.WEIGHTED
    program_lane = spec.policy == RoutingPolicy.PROGRAM
    raw = scorer_values(s, st, c, r, view, among, own=spec.own_entries)
    scores = weighted_scores(raw, spec, st.shapes.num_instances)
    if "routing" in st.features.program_sites:
        scores = jnp.where(program_lane, program_scores(s, st, c, p, r, now, view, among, raw),
                           scores)
    scoring = weighted_lane | program_lane  # the highest score wins
    tied = jnp.where(scoring, scores == _max(scores, among), load == _min(load, among))
    if among is not None:
        tied = tied & among
    ties_matter = active & (scoring | (spec.policy == RoutingPolicy.LEAST_LOADED))
    s, best = _break_tie(s, p, tied, ties_matter)
    if among is None:
        rr_target = s.router.rr % st.shapes.num_instances
        busiest = jnp.argmax(load)
    else:  # the (counter mod candidates)-th candidate; the first busiest candidate
        nth = s.router.rr % jnp.maximum(jnp.sum(among), 1)
        rr_target = jnp.argmax(among & (jnp.cumsum(among) - 1 == nth))
        busiest = jnp.argmax(jnp.where(among, load, -1))
    target = by_code(RoutingPolicy, {
        RoutingPolicy.ROUND_ROBIN: rr_target.astype(jnp.int32),
        RoutingPolicy.LEAST_LOADED: best,
        RoutingPolicy.ALWAYS_BUSIEST: busiest.astype(jnp.int32),
        RoutingPolicy.WEIGHTED: best, RoutingPolicy.PROGRAM: best})[spec.policy]
    s = prefix_touch(s, st, c, r, target, active & spec.prefix_index_on & scoring,
                     own=spec.own_entries)
    if st.features.cache_scorers:
        uses_lru = jnp.any(spec.scorer_order == Scorer.NO_HIT_LRU)
        mark = active & ((weighted_lane & uses_lru) | (program_lane & p.routing.program_lru)) \
            & view.cold
        s = s.replace(router=s.router.replace(
                          cold_stamp=upd(s.router.cold_stamp, target, s.router.cold_clock, mark),
                          cold_clock=s.router.cold_clock + mark.astype(jnp.int64)))
    round_robin = spec.policy == RoutingPolicy.ROUND_ROBIN
    s = s.replace(router=s.router.replace(
                      rr=s.router.rr + (active & round_robin).astype(jnp.int32)))
    return s, target
