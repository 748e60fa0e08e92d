"""Completions of an instance's step: requests that finished or reached the length cap leave
the batch, their final tokens allocated and their KV released (or queued for release).

Counterpart: ``blisjax.reference.instance.Instance._complete`` and ``_finish`` (``complete``
accounts the batch; ``run_loop`` and ``complete_planned`` complete the requests). Both run
once after the step's width programs: with deferred releases the lanes whose completions all
fit one pass are completed by one planned pass (``_plan_queued``, ``complete_planned``), the
others one request at a time (``run_loop``).
Behaviour: docs/semantics.md §2.7.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine import kvcache as kv
from blisjax.engine import kvtiered, recent, sessions
from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.state import COMPLETED, NIL, SimState
from blisjax.engine.static import max_model_len_of
from blisjax.engine.vec import prefix_sum
from blisjax.metrics import records


def tenants_left(s: SimState, c, reqs, mask):
    """``tenant_in_flight`` after the requests ``reqs`` where ``mask`` left: max(x − 1, 0)
    once per request of the tenant, which is max(x − n, 0) (the reference's loop)."""
    n_tenants = s.admission.tenant_in_flight.shape[0]
    ended = jnp.zeros(n_tenants, jnp.int32).at[jnp.where(mask, c.tenant[reqs], n_tenants)].add(
        1, mode="drop")
    left = s.admission.tenant_in_flight
    return jnp.where(ended > 0, jnp.maximum(left - ended, 0), left)


class Running(NamedTuple):
    """What ``instance.execute`` read and wrote of running positions 0 .. width - 1, for
    ``complete``; each [width], request fields at N (the sink row) where not valid."""

    valid: jax.Array  # bool: position < n_run
    slots: jax.Array  # int32: batch slot
    reqs: jax.Array  # int32: request
    pi: jax.Array  # int32: progress after the step
    l_in: jax.Array  # int32: input tokens
    out: jax.Array  # int32: output tokens


def complete(s: SimState, st, c, i, now, d, active, running: Running, defer: bool = False):
    """Completions and length caps, accounted at the step start, in batch order
    (``Instance._complete`` and ``_finish``; docs/semantics.md §2.7).
    ``running``: what ``instance.execute`` read and wrote of the running positions, so it is
    not read again. Returns ``(state, plan, todo)``: with ``defer`` (releases queued for the
    block's pass across lanes, ``kv.defer_release``) the lanes whose completions all go in one
    pass are left to ``plan`` (``complete_planned``; None without ``defer``); the others'
    completions to ``todo`` (``run_loop``). Both run after the step's width programs; this
    part accounts the batch (its compaction and counters) at the step start."""
    valid, slots, reqs = running.valid, running.slots, running.reqs
    pi, l_in, out = running.pi, running.l_in, running.out
    width = valid.shape[0]
    done = records.output_finished(pi, l_in, out)
    capped = ~done & records.at_length_cap(pi, max_model_len_of(st, i))
    fin = valid & active & (done | capped)
    count = jnp.sum(fin.astype(jnp.int32)).astype(jnp.int32)
    if st.recent_signals:  # the completed requests' ITL entries (routing programs)
        s = recent.record(s, i, now, recent.ITL, jnp.sum(jnp.where(fin, s.itl_sum[reqs], 0)),
                          jnp.sum(jnp.where(fin, pi - l_in, 0).astype(jnp.int64)), active)
    fin_through = prefix_sum(fin)  # finishing positions at or before each position
    rank = fin_through - 1  # k-th finishing position has rank k
    left = now + d

    if defer:
        plan = _plan_queued(s, st, c, i, fin=fin, done=done, rank=rank, count=count,
                            running=running, active=active)
        fast = plan.fast
    else:
        plan, fast = None, jnp.asarray(False)
    count_loop = jnp.where(fast, 0, count)

    def listing(todo, go):
        """What the one-at-a-time loop (``run_loop``, after the width programs) reads of the
        running positions: the k-th finishing position's, at the batch slots' width."""
        kth = finishing_positions(fin, rank, st.shapes.batch_slots)
        return LoopCompletions(count_loop, slots[kth], reqs[kth], pi[kth], l_in[kth],
                               out[kth], done[kth])

    todo = lane_once(count_loop > 0, listing, no_loop(st))  # listed only if a lane needs it
    if st.features.sessions:  # each completed round's next round, in batch order
        s = sessions.create_follow_ups(s, st, c, reqs, fin, rank, start_us=now,
                                           left_us=left)
    keep = valid & ~fin
    # valid positions are 0 .. n_run - 1, so the kept ones up to position k number
    # k + 1 - fin_through[k]
    dest = jnp.where(keep, jnp.arange(width) - fin_through, width)
    row = jnp.full(width + 1, NIL, jnp.int32).at[dest].set(s.batch.order[i, :width])[:-1]
    s = s.replace(
        router=s.router.replace(
            in_flight=s.router.in_flight.at[i].set(
                jnp.maximum(s.router.in_flight[i] - count, 0))),
        batch=s.batch.replace(
            order=upd(s.batch.order, (i, slice(None, width)), row, active),
            n_run=add(s.batch.n_run, i, -count, active),
            last_left=upd(s.batch.last_left, i, jnp.maximum(s.batch.last_left[i], left),
                          active & (count > 0) & (left <= c.horizon_us))),
        stats=s.stats.replace(
            completed=add(s.stats.completed, i, count.astype(jnp.int64), active),  # capped too
            capped_count=add(s.stats.capped_count, i, jnp.sum((fin & capped).astype(jnp.int64)),
                             active)))
    return s, plan, todo


def finishing_positions(fin, rank, size: int):
    """[size] int32: the running position of the k-th finishing request (``fin`` [width],
    ``rank`` its prefix count - 1) at index k, for k < min(finishing, size); 0 elsewhere."""
    return jnp.zeros(size, jnp.int32).at[jnp.where(fin, rank, size)].set(
        jnp.arange(fin.shape[0], dtype=jnp.int32), mode="drop")


class LoopCompletions(NamedTuple):
    """A step's completions left to the one-at-a-time loop (``run_loop``): ``count`` of them
    (0 where the lane's completions went in the queued pass, or none finished), and for the
    k-th (k < count, batch order) its slot, request, progress after the step, input and output
    tokens and whether its output is done (else it reached the length cap); each [batch
    slots]."""

    count: jax.Array  # int32
    sb: jax.Array
    r: jax.Array
    pi: jax.Array
    l_in: jax.Array
    out: jax.Array
    done: jax.Array  # bool


def no_loop(st) -> LoopCompletions:
    """No completions (the carry's start value before the width programs)."""
    zeros = jnp.zeros(st.shapes.batch_slots, jnp.int32)
    return LoopCompletions(jnp.asarray(0, jnp.int32), zeros, zeros, zeros, zeros, zeros,
                           jnp.zeros(st.shapes.batch_slots, bool))


def run_loop(s: SimState, st, c, i, todo: LoopCompletions, defer: bool = False) -> SimState:
    """The completions of ``todo``, one at a time in batch order: the final token's block,
    then the release (queued with ``defer``), status, slot and tenant in-flight.

    It runs once after the step's width programs (``instance.step``), so it is compiled once
    rather than once per width: it reads none of their running positions but ``todo``, and
    what runs between (the batch's compaction and counters, the next step time, P/D transfer
    starts, the decode-stretch outlook) neither writes what it reads nor reads what it writes
    (the finishing slots' blocks, the free list, status, slots, tenants in flight)."""

    def body(carry, go):
        s, k = carry
        sb, r = todo.sb[k], jnp.where(go, todo.r[k], st.shapes.num_requests)
        p_r, l_r, o_r = todo.pi[k], todo.l_in[k], todo.out[k]  # as execute left them
        final = go & todo.done[k] & (o_r > 0) & (p_r < l_r + o_r)
        if defer:
            # The releases of earlier completions are queued; the final token's block comes
            # from the free list's head, which they would only reach empty.
            s = lane_once(go & kv.must_flush(s, i, final),
                             lambda s, go: kv.flush_releases(s, st, go), s)
        # with a CPU tier the tiered allocation (it may reload, see batch.phase1_fast)
        s, ok = kvtiered.allocate_uncached(s, st, c, i, sb, r, start=p_r, end=p_r + 1, active=final,
                                     chunk=1)
        # a final token that finds no block is counted; the request completes all the same
        s = s.replace(stats=s.stats.replace(
                          alloc_failures=add(s.stats.alloc_failures, i, 1, final & ~ok)))
        s = kv.defer_release(s, st, i, sb, go) if defer else kv.release(s, st, i, sb, go)
        t = c.tenant[r]
        # E2E, output tokens done and the length-cap flag are functions of progress, TTFT
        # and ITL sum, which no longer change: ``results.lane_result`` derives them.
        s = s.replace(status=s.status.at[r].set(COMPLETED),
                      admission=s.admission.replace(
                          tenant_in_flight=upd(s.admission.tenant_in_flight, t,
                                 jnp.maximum(s.admission.tenant_in_flight[t] - 1, 0), go)),
                      batch=s.batch.replace(slot_req=upd(s.batch.slot_req, (i, sb), NIL, go)))
        return s, k + go.astype(k.dtype)

    s, _ = lane_while(lambda cr: cr[1] < todo.count, body, (s, jnp.asarray(0, jnp.int32)))
    return s


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
    depth = s.kv.rel_slots.shape[0]
    zeros, false = jnp.zeros(depth, jnp.int32), jnp.zeros(depth, bool)
    return QueuedPlan(jnp.asarray(False), jnp.asarray(0, jnp.int32), zeros, zeros, zeros,
                      false, false, zeros, zeros, zeros, zeros, jnp.asarray(False))


def _plan_queued(s: SimState, st, c, i, *, fin, done, rank, count, running: Running,
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
    depth = s.kv.rel_slots.shape[0]
    k = jnp.arange(depth, dtype=jnp.int32)
    pos = finishing_positions(fin, rank, depth)  # count <= depth where it is used
    on = k < count
    sb, r = slots[pos], jnp.where(on, reqs[pos], st.shapes.num_requests)
    p_r, l_r, o_r = pi[pos], l_in[pos], out[pos]
    final = on & done[pos] & (o_r > 0) & (p_r < l_r + o_r)
    fill = kv.last_block_fill(s, st, i, sb)
    blen, last, filled = fill.blen, fill.last, fill.filled
    fresh = jnp.where(final, kv.blocks_needed(st, blen, filled, 1), 0).astype(jnp.int32)
    room = (count <= depth - s.kv.rel_count) & ((s.kv.rel_count == 0) | (s.kv.rel_inst == i))
    fast = active & (count > 0) & room & (jnp.sum(fresh) <= s.kv.kv_free[i])
    if st.tiered:  # a final token that may reload takes the loop (kvtiered.tiered_allocate)
        fast = fast & ~jnp.any(final & (blen < c.full_blocks[r]))
    # Most final tokens only top up their last block; fresh blocks (or a top-up that would
    # register a prompt block, which a decode token never completes) take ``grant_tokens``.
    top_reg = (filled + 1 == st.settings.block_size) & (blen - 1 < c.full_blocks[r])
    general = jnp.any(final & ((fresh > 0) | top_reg))
    return QueuedPlan(fast, count, sb, r, p_r, p_r < l_r, final, blen, last, filled, fresh,
                      general)


def complete_planned(s: SimState, st, c, i, plan: QueuedPlan) -> SimState:
    """Run ``plan`` (``_plan_queued``) where its ``fast`` holds: the final tokens, then status,
    slot, tenant in-flight and release-queue updates as scatters over the queue's positions."""
    depth = s.kv.rel_slots.shape[0]
    k = jnp.arange(depth, dtype=jnp.int32)
    sb, r, final, fresh, general = plan.sb, plan.r, plan.final, plan.fresh, plan.general
    on = k < plan.count

    def grant(s, go):
        return kv.grant_tokens(s, st, c, i, sb, r, n=jnp.ones(depth, jnp.int32),
                               first_pos=plan.pos, prefill=plan.prefill, mask=final & go,
                               chunk=depth,
                               known=kv.KnownGrant(plan.blen, plan.last, plan.filled,
                                                   prefix_sum(jnp.where(go, fresh, 0))))

    def queued(s, go):
        m = on & go
        s = lane_once(go & general, grant, s)
        top = final & go & ~general  # every final token of the lane tops up
        s = s.replace(kv=s.kv.replace(
                          kv_tok=s.kv.kv_tok.at[i, jnp.where(top, plan.last,
                                                             st.shapes.kv_blocks)].add(
            1, mode="drop")))
        if st.tiered:  # a block the final token fills gets its hash (kv.grant_tokens)
            filled = top & (plan.filled + 1 == st.settings.block_size)
            s, _ = kv.register_keys(s, st, c, i, r, plan.blen - 1,
                                    prev_block=s.batch.bt[i, sb, jnp.maximum(plan.blen - 2, 0)],
                                    block=plan.last, mask=filled,
                                    first_token=plan.pos - plan.filled)
        return s.replace(
            status=s.status.at[jnp.where(m, r, st.shapes.num_requests)].set(COMPLETED, mode="drop"),
            admission=s.admission.replace(tenant_in_flight=tenants_left(s, c, r, m)),
            batch=s.batch.replace(
                slot_req=s.batch.slot_req.at[i, jnp.where(m, sb, st.slot_count)].set(
                    NIL, mode="drop")),
            kv=s.kv.replace(
                rel_slots=s.kv.rel_slots.at[jnp.where(m, s.kv.rel_count + k, depth)].set(
                    sb, mode="drop"),
                rel_inst=jnp.where(go, jnp.asarray(i, jnp.int32), s.kv.rel_inst),
                rel_count=s.kv.rel_count + jnp.where(go, plan.count, 0)))

    return lane_once(plan.fast, queued, s)
