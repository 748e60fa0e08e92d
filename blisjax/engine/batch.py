"""Batch formation of an instance's step (FormBatch): continue the running batch, then admit
from the wait queue.

Counterpart: ``blisjax.reference.instance.Instance._form_batch`` and its helpers — ``phase1``
continues the running requests in batch order (chunked prefill, ``clamp_prefill``; preemption:
``preempt_for_tokens`` is ``_preempt_for_tokens``, with ``victim_position`` and ``evict``),
``phase2`` admits from the wait queue (``_admit``; with a CPU tier ``_admit_tiered``, a P/D
decode sub-request holding its transferred KV ``_admit_decode``). Behaviour:
docs/semantics.md §2.3–§2.5, §3.8, §5.10.

Work over the running batch is vectorized over its positions 0 .. width - 1 (``phase1_fast``);
loops remain only where one request's outcome changes the next one's (preemption, admissions).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.config.codes import PreemptionPolicy
from blisjax.engine import kvcache as kv
from blisjax.engine import kvtier, kvtiered, recent, sessions
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
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.queues import (
    order_remove_at,
    q_at,
    q_push_front,
    q_remove_at,
    running_slots,
)
from blisjax.engine.state import DECODE, NIL, QUEUED, RUNNING, SimState
from blisjax.engine.static import caps_length, max_model_len_of, setting
from blisjax.engine.vec import prefix_sum


@pytree_dataclass
class BatchState:
    """Each instance's running batch (``Instance.running``) and step clock. Shapes: I
    instances, B batch slots (with P/D pools, reservation slots after them:
    ``EngineStatic.slot_count``; the running order has B positions), MB blocks per request."""

    order: jax.Array  # int32 [I, B]: batch slots in running order; the first n_run are valid
    n_run: jax.Array  # int32 [I]: running requests
    slot_req: jax.Array  # int32 [I, slots]: request in the slot, -1 = free
    bt: jax.Array  # int32 [I, slots, MB]: block table per slot (the request's blocks, in order)
    blen: jax.Array  # int32 [I, slots]: blocks the slot holds
    step_cached: jax.Array  # int32 [I, slots]: prefix tokens of the slot's request if admitted
    #                          this step (physics latency only)
    ema: jax.Array  # float64 [I]: physics preemption EMA
    step_time: jax.Array  # int64 µs [I]: next step, -1 = none pending
    clock: jax.Array  # int64 µs [I]: time of the last executed event
    last_left: jax.Array  # int64 µs [I]: latest completion time within the horizon


def init_batch(st) -> BatchState:
    """Every batch empty, no step pending."""
    i, slots = st.shapes.num_instances, st.slot_count
    i32, i64 = jnp.int32, jnp.int64
    return BatchState(
        order=jnp.full((i, st.shapes.batch_slots), NIL, i32), n_run=jnp.zeros(i, i32),
        slot_req=jnp.full((i, slots), NIL, i32),
        bt=jnp.full((i, slots, st.shapes.max_blocks_per_request), NIL, i32),
        blen=jnp.zeros((i, slots), i32), step_cached=jnp.zeros((i, slots), i32),
        ema=jnp.zeros(i, jnp.float64), step_time=jnp.full(i, -1, i64), clock=jnp.zeros(i, i64),
        last_left=jnp.zeros(i, i64))


def clamp_prefill(st, c, i, n, start, budget):
    """Chunk size on instance i: long-prefill threshold, then token budget, then its
    max-model-len cap."""
    thr = setting(st, c, "long_prefill_threshold")
    if not isinstance(thr, int):  # the lane's own
        n = jnp.where((thr > 0) & (n > thr), thr, n)
    elif thr > 0:
        n = jnp.where(n > thr, thr, n)
    n = jnp.minimum(n, budget)
    if caps_length(st):
        mml = max_model_len_of(st, i)
        capped = jnp.minimum(n, jnp.maximum(mml - 1 - start, 0))
        n = capped if not st.settings.instance_max_model_len else jnp.where(mml > 0, capped, n)
    return n.astype(jnp.int32)


def victim_position(s: SimState, st, c, p, i, width: int):
    """fcfs: the tail; priority: least urgent, latest arrival, tail-most among equals."""
    n = s.batch.n_run[i]
    pos = jnp.arange(width)
    valid = pos < n
    r = jnp.where(valid, s.batch.slot_req[i, jnp.maximum(s.batch.order[i, :width], 0)],
                  st.shapes.num_requests)
    neg = -s.prio[r]
    m1 = jnp.max(jnp.where(valid, neg, -jnp.inf))
    cand = valid & (neg == m1)
    arrival = sessions.arrival_us(s, st, c, r)
    m2 = jnp.max(jnp.where(cand, arrival, -1))
    cand = cand & (arrival == m2)
    by_priority = jnp.max(jnp.where(cand, pos, -1)).astype(jnp.int32)
    return jnp.where(p.preemption == PreemptionPolicy.FCFS, n - 1, by_priority)


def evict(s: SimState, st, c, p, i, vpos, budget, active):
    """Preempt the request at running position vpos: progress lost, KV freed, queue front."""
    sb = s.batch.order[i, jnp.maximum(vpos, 0)]
    sb0 = jnp.maximum(sb, 0)
    r = jnp.where(active, s.batch.slot_req[i, sb0], st.shapes.num_requests)
    budget = (budget + jnp.where(active & (s.num_new[r] > 0), s.num_new[r], 0)).astype(jnp.int32)
    s = kv.release(s, st, i, sb0, active)
    # Each write below is tied (``after_reads``) to results of what read its array's old value
    # — the victim's request and grant, then the release and slot writes that used its slot —
    # so XLA updates num_new, slot_req and order in place; otherwise it copies them whole at
    # every eviction (fusion re-reads the slot inside each kernel that uses it). All tie
    # values are >= 0: r, the budget, ftail, a block count, a slot's request + 1.
    tie = jnp.minimum(r, jnp.maximum(budget, 0))
    s = s.replace(num_new=s.num_new.at[r].set(after_reads(jnp.int32(0), tie)),
                  status=s.status.at[r].set(QUEUED), pi=s.pi.at[r].set(0),
                  itl_sum=s.itl_sum.at[r].set(0), computed=s.computed.at[r].set(0),
                  preempt=s.preempt.at[r].add(1),
                  batch=s.batch.replace(
                      slot_req=upd(s.batch.slot_req, (i, sb0), after_reads(NIL, tie), active)),
                  stats=s.stats.replace(preempt_count=add(s.stats.preempt_count, i, 1, active)))
    done = jnp.minimum(jnp.minimum(tie, s.kv.ftail[i]),
                       jnp.minimum(s.batch.blen[i, sb0], s.batch.slot_req[i, sb0] + 1))
    s = order_remove_at(s, st, i, after_reads(vpos, done), active)
    s = q_push_front(s, st, i, r, active)
    return s, budget, sb


class PreemptOutcome(NamedTuple):
    """What ``preempt_for_tokens`` did besides changing the state."""

    success: jax.Array  # bool: the tokens were allocated (the request was not itself evicted)
    pos: jax.Array  # int32: the cursor, moved back by one per victim evicted before it
    budget: jax.Array  # int32: tokens left, with the victims' grants of this step refunded
    preempted: jax.Array  # bool: some request was evicted


def preempt_for_tokens(s: SimState, st, c, p, i, sb, r, *, n, pos, budget, active,
                       widths: tuple[int, ...]):
    """Evict victims until n tokens of running request r fit, then allocate them
    (``Instance._preempt_for_tokens``; docs/semantics.md §2.5); each victim found by a scan
    at the narrowest of ``widths`` that holds the block's largest running batch. Returns
    ``(state, PreemptOutcome)``."""
    empty = jnp.zeros(1, jnp.int32)
    no_prefix = jnp.full(max(st.shapes.max_prompt_blocks, 1), NIL, jnp.int32)

    def body(carry, go):
        s, pos, budget, pre, failed, going = carry  # masked by `going` (== go) throughout
        pi = s.pi[r]
        if st.tiered:  # each attempt reloads, then allocates if it can (kvtiered.tiered_allocate)
            s, tried = kvtiered.tiered_allocate(s, st, c, i, sb, r, start=pi, end=pi + n,
                                          cached=no_prefix, n_cached=0, active=going)
            ok = tried.ok
        else:
            ok = kv.can_allocate(s, st, c, i, sb, r, start=pi, end=pi + n, cached=empty, n_cached=0)
        no_one = s.batch.n_run[i] == 0
        do_evict = going & ~ok & ~no_one
        vpos = by_width(widths, lane_max(jnp.where(do_evict, s.batch.n_run[i], 0)), do_evict,
                        lambda v, go, w: jnp.where(go, victim_position(s, st, c, p, i, w), v),
                        jnp.int32(0))
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
        s = kv.allocate(s, st, c, i, sb, r, start=pi, end=pi + n, cached=empty, n_cached=0,
                        active=success)
    return s, PreemptOutcome(success, pos, budget, pre)


class Wants(NamedTuple):
    """What running requests ask for in phase 1 (``_continue_wants``); shapes of r."""

    needs: jax.Array  # bool: the request is served this step if the budget allows
    tokens: jax.Array  # int32: its prefill chunk, or 1 for a decode token
    prefill: jax.Array  # bool: it is in prefill


def _continue_wants(s: SimState, st, c, i, r) -> Wants:
    """Tokens each running request r[k] asks for in phase 1, before the token budget: its
    prefill chunk (long-prefill threshold, max-model-len cap) or one decode token; 0 for a
    request that gets nothing (length-capped decode, or no output tokens)."""
    l_in, pi = c.input_tokens[r], s.pi[r]
    prefill = pi < l_in
    decode = ~prefill & (c.output_tokens[r] > 0)
    if caps_length(st):
        mml = max_model_len_of(st, i)
        decode = decode & ~((mml > 0) & (pi + 1 > mml - 1))
    budget = jnp.asarray(setting(st, c, "token_budget"), jnp.int32)
    chunk = clamp_prefill(st, c, i, l_in - pi, pi, budget)
    return Wants(prefill | decode, jnp.where(prefill, chunk, 1), prefill)


def phase1_fast(s: SimState, st, c, i, active, width: int, start=0, budget=None,
                reset=False):
    """Phase 1 for the running requests from position ``start`` on whose KV fits without
    preemption, all at once; ``budget``: tokens left (default: the whole step budget).
    ``reset`` (bool, may be traced): the step's first pass; every running request's grant is
    written (0 if not served), which is the step's reset of last step's grants in the same
    scatter.

    Sequentially, request k gets ``min(want_k, budget left)`` tokens while the budget is
    positive, so with prefix sums of the wants: k is served iff the wants before it sum to less
    than the budget. Each pre-check ``fresh_k <= free blocks left`` holds for every k up to
    the first k whose running sum of fresh blocks exceeds the free count; from there on the
    sequential loop (with preemption) takes over. Returns (state, that position, budget left).
    """
    if budget is None:
        budget = jnp.asarray(setting(st, c, "token_budget"), jnp.int32)
    run_slots = running_slots(s, st, i, width)
    valid, slots, reqs = run_slots.valid, run_slots.slots, run_slots.reqs
    valid = valid & (jnp.arange(width) >= start)
    r = jnp.where(valid & active, reqs, st.shapes.num_requests)
    wants = _continue_wants(s, st, c, i, r)
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
    short = served & (fresh_through > s.kv.kv_free[i])
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
    s = kv.grant_tokens(s, st, c, i, slots, r, n=n, first_pos=s.pi[r], prefill=prefill, mask=ok,
                        known=known)
    r_or_sink = jnp.where(ok, r, st.shapes.num_requests)
    granted = s.num_new.at[jnp.where(reset, r, r_or_sink)].set(jnp.where(ok | ~reset, n, 0))
    s = s.replace(num_new=granted, computed=s.computed.at[r_or_sink].add(n))
    budget = (budget - jnp.sum(jnp.where(ok, n, 0))).astype(jnp.int32)
    return s, stop, budget


def phase1(s: SimState, st, c, p, i, active, widths: tuple[int, ...]):
    """Continue running requests in batch order: prefill chunks, then one decode token each.
    Resets last step's grants. Returns (state, budget left, whether anything was preempted;
    budget and flag unchanged where not ``active``).

    The vectorized pass (``phase1_fast``) serves every request up to the first one whose KV
    does not fit; the loop below serves that one with preemption, then resumes the vectorized
    pass after it. Its first trip is the step's first vectorized pass and each later trip one
    such shortfall (usually none), not one request after the first one, so one lane's
    preemption does not keep every lane of a lockstep block waiting for a request-by-request
    loop. Each vectorized pass runs at the narrowest of ``widths`` that holds the block's
    largest running batch (``by_width``); the loop and its preemptions are compiled once,
    whatever the width (docs/performance.md, What the engine does for speed)."""
    def fast(carry, go, w, reset):
        s, pos, budget = carry
        s, stop, budget_w = phase1_fast(s, st, c, i, go, w, pos, budget, reset=reset)
        return s, jnp.where(go, stop, pos), jnp.where(go, budget_w, budget)

    def fast_at_widths(carry, go, reset):
        running = lane_max(jnp.where(go, carry[0].batch.n_run[i], 0))
        return by_width(widths, running, go, lambda cr, g, w: fast(cr, g, w, reset), carry)

    def cond(carry):
        s, pos, budget, pre, halt, first = carry
        return active & (first | (~halt & (pos < s.batch.n_run[i]) & (budget > 0)))

    def shortfall(carry, go):
        """The request at ``pos`` (whose KV did not fit) served with preemption."""
        s, pos, budget, pre, halt = carry
        sb = s.batch.order[i, jnp.minimum(pos, st.shapes.batch_slots - 1)]
        r = jnp.where(go, s.batch.slot_req[i, jnp.maximum(sb, 0)], st.shapes.num_requests)
        wants = _continue_wants(s, st, c, i, r)
        needs, want = wants.needs, wants.tokens
        need = go & needs
        n = jnp.minimum(want, budget).astype(jnp.int32)
        s, outcome = preempt_for_tokens(s, st, c, p, i, jnp.maximum(sb, 0), r, n=n, pos=pos,
                                        budget=budget, active=need, widths=widths)
        ok, pos, budget, pre_now = outcome.success, outcome.pos, outcome.budget, outcome.preempted
        granted = need & ok
        r_or_sink = jnp.where(granted, r, st.shapes.num_requests)
        s = s.replace(num_new=s.num_new.at[r_or_sink].set(n),
                      computed=s.computed.at[r_or_sink].add(n))
        budget = jnp.where(granted, budget - n, budget).astype(jnp.int32)
        halt_now = need & ~ok
        pos = jnp.where(go & ~halt_now, pos + 1, pos)
        return s, pos, budget, pre | pre_now, halt | halt_now

    def body(carry, go):  # the step's first trip is the first vectorized pass
        s, pos, budget, pre, halt, first = carry
        s, pos, budget, pre, halt = lane_once(go & ~first, shortfall,
                                              (s, pos, budget, pre, halt))
        more = go & (first | (~halt & (budget > 0)))
        s, pos, budget = fast_at_widths((s, pos, budget), more, first)
        return s, pos, budget, pre, halt, jnp.zeros_like(first)

    budget = jnp.asarray(setting(st, c, "token_budget"), jnp.int32)
    init = (s, jnp.int32(0), budget, jnp.asarray(False), jnp.asarray(False), jnp.asarray(True))
    s, _, budget, pre, _, _ = lane_while(cond, body, init)
    return s, budget, pre


def phase2(s: SimState, st, c, p, i, now, budget, preempted, active):
    """Admit from the wait queue while slots, budget and KV allow; stops at the first misfit."""

    def cond(carry):
        s, budget, stop = carry
        return (active & ~stop & ~preempted
                & (s.batch.n_run[i] < setting(st, c, "max_running"))
                & (s.queue.length[i] > 0) & (budget > 0))

    def body(carry, go):
        s, budget, stop = carry
        k = head_offset(s, st, c, p, i, now, go)
        r = q_at(s, st, i, k)
        sb = jnp.argmax(s.batch.slot_req[i, :st.shapes.batch_slots] == NIL).astype(jnp.int32)
        # a decode sub-request holding its transferred KV: its first decode token
        if st.features.pd:
            held = (s.pd.phase[jnp.minimum(r, st.shapes.num_requests)] == DECODE) \
                & (r <= st.shapes.num_requests) & (s.pi[r] >= c.input_tokens[r])
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
            start_w = n_cached * st.settings.block_size
            n_w = clamp_prefill(st, c, i, c.input_tokens[r] - start_w, start_w, budget)
            ok_w = go & kv.can_allocate(s, st, c, i, sb, r, start=start_w, end=start_w + n_w,
                                        cached=cached, n_cached=n_cached)
            claim = ok_w & (n_w > 0) & (s.batch.blen[i, sb] == 0) & (n_cached > 0)
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
        if st.features.pd:
            start = jnp.where(held, c.input_tokens[r], start)
            n = jnp.where(held, 1, n).astype(jnp.int32)
            ok = jnp.where(held, decode_ok, ok)
            allocated = allocated | held
        s, r = q_remove_at(s, st, i, k, ok, through=r)  # r read before the queue moves
        s = kv.allocate(s, st, c, i, sb, r, start=start, end=start + n,
                        cached=jnp.zeros(1, jnp.int32), n_cached=0, active=ok & ~allocated)
        r_or_sink = jnp.where(ok, r, st.shapes.num_requests)
        # a decode sub-request's transferred KV is no prefix-cache hit: physics credits it no
        # cached tokens and the recent signals record no hit for it (``Instance._schedule``)
        credited = jnp.where(held, 0, start) if st.features.pd else start
        if st.stateful_latency:  # physics reads the prefix tokens of this step's admissions
            s = s.replace(batch=s.batch.replace(
                              step_cached=upd(s.batch.step_cached, (i, sb), credited, ok)))
        s = s.replace(status=s.status.at[r_or_sink].set(RUNNING),
                      num_new=s.num_new.at[r_or_sink].set(n),
                      computed=s.computed.at[r_or_sink].set(n + start),
                      sched=s.sched.at[r_or_sink].set(now - sessions.arrival_us(s, st, c, r)),
                      prio=s.prio.at[r_or_sink].set(priority_score(s, st, p, c, r, now)),
                      batch=s.batch.replace(
                          order=upd(s.batch.order, (i, s.batch.n_run[i]), sb, ok),
                          n_run=add(s.batch.n_run, i, 1, ok),
                          slot_req=upd(s.batch.slot_req, (i, sb), r, ok)))
        if st.recent_signals:  # the admission's wait and cache hits (routing programs)
            s = recent.record(s, i, now, recent.WAIT, now - sessions.arrival_us(s, st, c, r),
                              1, ok)
            s = recent.record(s, i, now, recent.HIT, start, c.input_tokens[r],
                              ok & ~held if st.features.pd else ok)
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
    is sized from the GPU's cached prefix, then ``kvtiered.tiered_allocate`` reloads and allocates."""
    bs = st.settings.block_size
    found = kv.cached_blocks(s, st, c, i, r)
    cached, n_cached = found.blocks, found.count
    if st.settings.blis_quirks:
        start = n_cached * bs
        n = clamp_prefill(st, c, i, c.input_tokens[r] - start, start, budget)
        if not st.shapes.kv_hold_slots:  # a program built without holder slots
            s, tried = kvtiered.tiered_allocate(s, st, c, i, sb, r, start=start, end=start + n,
                                          cached=cached, n_cached=n_cached, active=go)
            refused = go & ~tried.ok & (s.batch.blen[i, sb] > 0)
            s = s.replace(tier=kvtier.hold_overflowed(s.tier, refused))
            return s, start, n, tried.ok, tried.ok
        # a request still holding the blocks of an earlier failed admission allocates there
        holding = s.batch.slot_req[i, st.hold_base:] == r
        held = go & jnp.any(holding)
        src = jnp.where(held, st.hold_base + jnp.argmax(holding), sb).astype(jnp.int32)
        s, tried = kvtiered.tiered_allocate(s, st, c, i, src, r, start=start, end=start + n,
                                      cached=cached, n_cached=n_cached, active=go)
        s = _settle_held_blocks(s, st, i, r, sb, src, held, tried.ok, go)
        return s, start, n, tried.ok, tried.ok
    keep = kvtiered.keep_mask(s, st, i, cached, n_cached, go)
    s, count = kvtiered.reload_prefix(s, st, c, i, r, n_cached, keep, go)
    found = kv.cached_blocks(s, st, c, i, r)
    cached, n_cached = found.blocks, found.count
    start = n_cached * bs
    n = clamp_prefill(st, c, i, c.input_tokens[r] - start, start, budget)
    ok = go & kv.can_allocate(s, st, c, i, sb, r, start=start, end=start + n, cached=cached,
                              n_cached=n_cached)
    claim = ok & (n > 0) & (s.batch.blen[i, sb] == 0) & (n_cached > 0)
    s = kv.claim_cached(s, st, i, sb, cached, n_cached, claim)
    s = s.replace(tier=kvtier.missed(s.tier, i, go & ~ok & (count == 0)))
    return s, start, n, ok, jnp.zeros_like(ok)


def _settle_held_blocks(s: SimState, st, i, r, sb, src, held, ok, go) -> SimState:
    """After a tiered admission of r with ``blis_quirks`` (``_admit_tiered``): admitted, the
    blocks it held move from its holder slot ``src`` to its running slot sb; refused, blocks
    it claimed before failing (``kvtiered.tiered_allocate``) stay its own while it waits, in a
    holder slot (none free: flagged, ``KVTierState.hold_overflow``)."""
    s = _move_blocks(s, i, src, sb, held & ok)
    s = s.replace(batch=s.batch.replace(slot_req=upd(s.batch.slot_req, (i, src), NIL, held & ok)))
    keeps = go & ~held & ~ok & (s.batch.blen[i, sb] > 0)
    free = s.batch.slot_req[i, st.hold_base:] == NIL
    room = jnp.any(free)
    h = (st.hold_base + jnp.argmax(free)).astype(jnp.int32)
    s = _move_blocks(s, i, sb, h, keeps & room)
    return s.replace(
        tier=kvtier.hold_overflowed(s.tier, keeps & ~room),
        batch=s.batch.replace(slot_req=upd(s.batch.slot_req, (i, h), r, keeps & room)))


def _admit_decode(s: SimState, st, c, i, r, sb, active):
    """The first admission of a decode sub-request holding its transferred KV (phase 2's
    branch in ``Instance._form_batch``): one decode token allocated in its reservation slot,
    whose blocks then move to running slot sb. Returns ``(state, ok)``."""
    l_in = c.input_tokens[r]
    src = jnp.argmax(s.batch.slot_req[i] == r).astype(jnp.int32)
    # with a CPU tier the tiered allocation (its prompt blocks are held: nothing to reload)
    s, ok = kvtiered.allocate_uncached(s, st, c, i, src, r, start=l_in, end=l_in + 1, active=active,
                                 chunk=1)
    s = _move_blocks(s, i, src, sb, ok)
    return s.replace(batch=s.batch.replace(slot_req=upd(s.batch.slot_req, (i, src), NIL, ok))), ok


def _move_blocks(s: SimState, i, src, dst, active) -> SimState:
    """Slot dst of instance i takes the blocks of slot src (src != dst where ``active``),
    which is left empty."""
    # one gather and one scatter per array: a second read of the old array after a first
    # write would make XLA copy the whole block table
    pair = jnp.stack([src, dst])
    tables, held = s.batch.bt[i, pair], s.batch.blen[i, pair]
    empty_row = jnp.full_like(tables[0], NIL)
    return s.replace(
        batch=s.batch.replace(
            bt=s.batch.bt.at[i, pair].set(
                jnp.where(active, jnp.stack([empty_row, tables[0]]), tables)),
            blen=s.batch.blen.at[i, pair].set(jnp.where(active, jnp.stack([0, held[0]]), held))))
