"""Decode stretches: an instance's consecutive decode-only steps, planned at once and applied
in a few vector passes instead of one lockstep iteration each.

Counterpart: none of its own — a stretch is a run of ``Instance._step`` calls of the reference
engine in which nothing but decoding happens, and applying it leaves exactly the state those
steps leave (docs/jax-engine.md, Decode stretches).

A step is *plain* when every running request decodes one token, none finishes or reaches the
length cap, the wait queue is empty (phase 2 admits nothing), the token budget covers the batch
and the free list holds the fresh blocks decode growth takes (no preemption). A run of plain
steps has a fixed batch, so under the blackbox model each lasts the same ``d`` µs and they
start at t0, t0 + d, t0 + 2d, …; their effects are per-request sums (progress, ITL entries,
computed tokens) plus KV growth, which is a function of each request's last-block fill.

Under the roofline and physics models a plain step's time grows with the contexts, which grow
by one token per step: the plan evaluates the model for its next ``VARYING_PLAN`` steps at once
(the batch's progress plus 0, 1, …; each evaluation is the same float64 program as a real
step's, so each time is exact) and keeps their starts relative to the plan's first
(``StretchState.offset``), so a plan covers at most that many steps. Each step's time is
truncated to µs on its own, so the integer starts are exact prefix sums. A physics step also
reads the preemption EMA, which every step updates (with no preemption in a plain step, it
decays): the plan runs the reference's update step after step and keeps the EMA after each
(``StretchState.ema``); applying k steps sets the instance's EMA to entry k.

After every step the instance *plans* its stretch (``plan``): how many plain steps follow
before the first step that must run on its own (a completion or length cap, a KV shortfall,
the last step within the horizon). The planned steps are *virtual*: ``next_event`` sees the
instance's next step at the stretch's end, and the state is brought forward (``materialize``)
only when something must read or change it — the instance's next real step, a timeout of
one of its running requests, or (physics) an arrival whose queueing delay reads it; the
steps after it then run on their own. Everything else reads around them: a request joining the
instance only cuts the stretch short (``truncate``: the steps before its enqueue stay plain),
and router snapshots compute KV use at their time from the plan (``kv_used_at``). Nothing
else reads another instance's state.

KV growth of k plain steps from the current state: request j's last block has ``spare_j``
free token positions (0 .. B - 1, B the block size), so it takes a fresh block at steps
spare_j, spare_j + B, …. Within each window of B steps every request takes exactly one, in
the order of (spare, batch position) — the reference allocates in batch order within a step —
so the g-th fresh block (from 0) is taken at step (g // J)·B + (g % J)-th smallest spare, and
k steps take (k // B)·J + #{j : spare_j < k % B} blocks (J running requests). ``stretch.cum``
keeps the spare histogram so both are a few gathers.

With a CPU tier every plain step also mirrors the batch. Its keys only grow within a stretch,
so while no pass evicts, one pass after the last applied step stands for them all
(``_by_tier`` bounds the plan, ``materialize`` runs the pass; docs/jax-engine.md, CPU tier).
With ``blis_quirks`` a request whose blocks would chain off the true chain blocks the plan.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from blisjax.engine import kvblocks, kvtier, kvtiered, physics, roofline
from blisjax.engine import kvcache as kv
from blisjax.engine.consts import otp, physics_of, roofline_of
from blisjax.engine.lockstep import (
    add,
    after_reads,
    by_width,
    lane_max,
    lane_once,
    lane_while,
    upd,
)
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.request_rows import ITL_WINDOW
from blisjax.engine.state import NIL, SimState
from blisjax.engine.static import VARYING_PLAN, caps_length, max_model_len_of, setting
from blisjax.rules import kv_util_bucket

CHUNK_STEPS = 16  # plain steps per ``materialize`` pass where step times vary or a CPU tier
#                   keys the blocks a pass fills (at most the block size: one fresh block each)
PASS_BLOCKS = 4  # otherwise: fresh blocks a request may take per pass (steps: that many blocks'
#                  worth, at most LONG_PASS_STEPS)
LONG_PASS_STEPS = 64


@pytree_dataclass
class StretchState:
    """Each instance's planned plain decode steps from ``BatchState.step_time`` on, applied
    lazily (this module); I instances, S = ``static.VARYING_PLAN``."""

    steps: jax.Array  # int32 [I]: virtual steps before the next real one
    d: jax.Array  # int64 µs [I]: duration of each of them (blackbox)
    offset: jax.Array  # int64 µs [I, S + 1]: with step times that vary (roofline), start of
    #                    virtual step k = 0 .. S after step_time's (entry 0 is 0); [I, 0] otherwise
    ema: jax.Array  # float64 [I, S + 1]: physics, the EMA after k = 0 .. S virtual steps
    #                 (entry 0: the current EMA); [I, 0] otherwise
    cum: jax.Array  # int32 [I, block size]: running requests with <= v free positions in
    #                 their last block, at step_time


def init_stretch(st) -> StretchState:
    """No stretch planned."""
    i = st.shapes.num_instances
    return StretchState(
        steps=jnp.zeros(i, jnp.int32), d=jnp.zeros(i, jnp.int64),
        offset=jnp.zeros((i, st.stretch_offset_slots), jnp.int64),
        ema=jnp.zeros((i, st.stretch_ema_slots), jnp.float64),
        cum=jnp.zeros((i, st.settings.block_size), jnp.int32))


def chunk_steps(st) -> int:
    """Steps per ``materialize`` pass. Where step times vary (a plan covers at most
    ``VARYING_PLAN`` steps) or a CPU tier keys the blocks a pass fills: at most the block size,
    so that every request takes at most one fresh block per pass. Otherwise (blackbox) up to
    ``PASS_BLOCKS`` blocks' worth of steps: a long stretch then takes fewer passes, each
    popping at most ``pass_blocks`` blocks per request."""
    bs = st.settings.block_size
    if st.stretch_times_vary or st.tiered:
        return max(1, min(CHUNK_STEPS, bs))
    return max(1, min(LONG_PASS_STEPS, PASS_BLOCKS * bs))


def pass_blocks(st) -> int:
    """Fresh blocks one request may take in a pass of ``chunk_steps`` steps: its m-th
    (from 0) at step ``spare + m·B``, ``spare`` < B the free positions of its last block."""
    return -(-chunk_steps(st) // st.settings.block_size)


# ---- planning ---------------------------------------------------------------------------------


class BatchOutlook(NamedTuple):
    """What a step's running batch allows after it (``outlook``), computed where the batch's
    positions are at hand (the step's width programs)."""

    decoding: jax.Array  # bool: every request left running is past its prompt
    plain_steps: jax.Array  # int32: plain steps before the first completion or length cap
    spare_cum: jax.Array  # int32 [B]: requests whose last block has <= v free positions
    step_us: jax.Array  # int64 µs [VARYING_PLAN]: the model's times of the next plain steps
    #                     where they vary (roofline, physics; before any slow-down), [0] otherwise
    ema: jax.Array  # float64 [VARYING_PLAN + 1]: physics, the EMA after 0, 1, … of them; [0]


def _plain_times(st) -> int:
    return VARYING_PLAN if st.stretch_times_vary else 0


def no_outlook(st) -> BatchOutlook:
    """The carry's start value (no stretch)."""
    return BatchOutlook(jnp.asarray(False), jnp.asarray(0, jnp.int32),
                        jnp.zeros(st.settings.block_size, jnp.int32),
                        jnp.ones(_plain_times(st), jnp.int64),
                        jnp.zeros(st.stretch_ema_slots, jnp.float64))


def outlook(s: SimState, st, c, i, keep, slots, pi, l_in, out) -> BatchOutlook:
    """The outlook of the requests ``keep`` (running positions' slots, progress after the step,
    input and output tokens; shapes [width]) on instance i.

    A decoding request with progress p finishes after the step that brings it to
    l_in + out - 1 (``records.output_finished``), i.e. at step index l_in + out - 2 - p from
    now, and reaches the length cap L at index L - 2 - p (``records.at_length_cap``); every
    step before both is plain for it."""
    decoding = jnp.all(~keep | ((pi >= l_in) & (out > 0)))
    if st.tiered:  # a request holding fewer blocks than its full prompt blocks may reload
        reqs = jnp.where(keep, s.batch.slot_req[i, slots], 0)
        whole = ~keep | (s.batch.blen[i, slots] >= c.full_blocks[reqs])
        # the plan keys the blocks it fills by their positions in the block table
        # (``_cpu_keys``), which hold the tokens of those positions unless a reload shifted
        # the request's blocks (``kvcache.content_key``): then its tokens number otherwise
        held = kv.last_block_fill(s, st, i, slots)
        tokens = held.blen * st.settings.block_size - kv.spare_positions(st, held.blen, held.filled)
        whole = whole & (~keep | (tokens == pi))
        # the blocks a request fills chain from its last full block: the plan assumes they
        # are on the true chain (``_apply`` gives them their true keys), which holds unless a
        # reload replaced that block's content (off-chain hashes, ``blis_quirks``)
        m = held.blen - 1 - ((held.filled >= 1) & (held.filled < st.settings.block_size))
        block = s.batch.bt[i, slots, jnp.maximum(m, 0)]
        whole = whole & (~keep | kv.holds_true_key(s, st, c, i, reqs, m, block))
        decoding = decoding & ((s.tier.capacity == 0) | jnp.all(whole))
    left = l_in + out - 2 - pi
    if caps_length(st):
        mml = max_model_len_of(st, i)
        capped = jnp.minimum(left, mml - 2 - pi)
        left = capped if not st.settings.instance_max_model_len else jnp.where(mml > 0, capped,
                                                                               left)
    big = jnp.iinfo(jnp.int32).max
    plain = jnp.min(jnp.where(keep, left, big)).astype(jnp.int32)
    fill = kv.last_block_fill(s, st, i, slots)
    spare = kv.spare_positions(st, fill.blen, fill.filled).astype(jnp.int32)
    v = jnp.arange(st.settings.block_size, dtype=jnp.int32)
    cum = jnp.sum(keep[:, None] & (spare[:, None] <= v[None, :]), axis=0, dtype=jnp.int32)
    times = (jnp.ones(_plain_times(st), jnp.int64), jnp.zeros(st.stretch_ema_slots, jnp.float64))
    if st.stretch_times_vary:  # evaluated only when some lane may plan
        wanted = decoding & (s.queue.length[i] == 0) & jnp.any(keep)
        times = lane_once(wanted, lambda times, go: plain_step_times(
            st, c, i, keep, pi, l_in, out, s.batch.ema[i]), times)
    return BatchOutlook(decoding, plain, cum, *times)


def plain_step_times(st, c, i, keep, pi, l_in, out, ema):
    """(int64 µs [VARYING_PLAN], float64 EMA [VARYING_PLAN + 1] or [0]): the model's times of
    the plain steps k = 0, 1, … of the requests ``keep`` (progress ``pi`` after the step just
    run; [width] like ``outlook``'s), each decoding one token at progress pi + k; with
    physics, the EMA after each of them (``ema``: after the step just run)."""
    if st.stateful_latency:
        return physics.plain_step_times(physics_of(st, c, i), keep, pi, l_in, out, ema,
                                        VARYING_PLAN)
    # every kept request decodes (the plan is used only then: ``outlook``'s ``decoding``)
    k = jnp.arange(VARYING_PLAN, dtype=pi.dtype)[:, None]
    decode = jnp.broadcast_to(keep, (VARYING_PLAN, keep.shape[0]))
    rc = roofline_of(st, c, i)
    return (roofline.seconds_to_us(rc, roofline.decode_seconds(rc, decode, pi[None, :] + k)),
            jnp.zeros(0, jnp.float64))


def _block_step(cum, running, g, block_size: int):
    """Step index (from the plan's start) at which the g-th fresh block (from 0) is taken:
    (g // J)·B + the (g % J)-th smallest spare, which is the number of spare values v whose
    cumulative count is <= g % J."""
    j = jnp.maximum(running, 1)
    return (g // j) * block_size + jnp.sum(cum <= (g % j)[..., None], -1, dtype=jnp.int32)


def blocks_taken(cum, running, k, block_size: int):
    """Fresh blocks k plain steps take: (k // B)·J + #{spare < k % B}."""
    r = k % block_size
    below = jnp.where(r > 0, jnp.take_along_axis(
        cum, jnp.maximum(r - 1, 0)[..., None].astype(jnp.int32), -1)[..., 0], 0)
    return (k // block_size) * running + below


def plan(s: SimState, st, c, i, seen: BatchOutlook, plain_us, active) -> SimState:
    """After instance i's step (where ``active``): the plain steps that follow it, each
    ``plain_us`` long (the step time of the batch's decode tokens alone; where step times vary,
    [VARYING_PLAN] times of the steps in order). Zero unless the batch decodes, the wait queue
    is empty, the budget covers the batch and a next step is due; else the fewest of: steps to
    the first completion or length cap, steps whose fresh blocks the free list holds, steps
    that start before the horizon's last one (which runs on its own, so the lane never ends
    with virtual steps) and, where times vary, the steps whose times are known."""
    running = s.batch.n_run[i]
    t0 = s.batch.step_time[i]
    ok = (active & seen.decoding & (running > 0) & (s.queue.length[i] == 0)
          & (running <= setting(st, c, "token_budget")) & (t0 >= 0)
          & (t0 <= c.horizon_us))
    by_kv = _block_step(seen.spare_cum, running, s.kv.kv_free[i], st.settings.block_size)
    if st.stretch_times_vary:
        # offset[k] = the first k times: the real step after k plain ones starts there
        offset = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(plain_us)])
        by_horizon = jnp.sum(t0 + offset[1:] <= c.horizon_us, dtype=jnp.int64)
    else:
        by_horizon = (c.horizon_us - t0) // plain_us
    k = jnp.minimum(jnp.minimum(seen.plain_steps, by_kv).astype(jnp.int64), by_horizon)
    if st.tiered:
        k = jnp.minimum(k, _by_tier(s, st, i, seen, running))
    k = jnp.where(ok, jnp.maximum(k, 0), 0).astype(jnp.int32)
    s = s.replace(
        stretch=s.stretch.replace(
            steps=upd(s.stretch.steps, i, k, active),
            cum=upd(s.stretch.cum, i, seen.spare_cum, active)))
    if st.stateful_latency:
        s = s.replace(stretch=s.stretch.replace(ema=upd(s.stretch.ema, i, seen.ema, active)))
    if st.stretch_times_vary:
        return s.replace(stretch=s.stretch.replace(offset=upd(s.stretch.offset, i, offset, active)))
    return s.replace(stretch=s.stretch.replace(
                         d=upd(s.stretch.d, i, plain_us.astype(jnp.int64), active)))


def _by_tier(s: SimState, st, i, seen: BatchOutlook, running):
    """Plain steps whose mirror passes evict nothing from instance i's CPU tier, so that
    one pass after the last of them leaves what theirs would (``materialize``): the tier
    holds every key of the last pass and has room for the keys of the blocks the steps
    fill. A block fills at the step before the one that would take a fresh block after it
    (a request whose last block is full takes one at once, and fills it B steps later), so
    k steps fill ``blocks_taken(k + 1) - #{spare = 0}`` blocks."""
    t = s.tier
    room = t.capacity - t.size[i] + seen.spare_cum[0]
    by_room = _block_step(seen.spare_cum, running, room, st.settings.block_size) - 1
    holds_all = t.pass_keys[i] <= t.capacity
    big = jnp.iinfo(jnp.int32).max
    return jnp.where(t.capacity == 0, big, jnp.where(holds_all, by_room, 0)).astype(jnp.int64)


def next_step_us(s: SimState, st):
    """[I] start of each instance's next real step (after its virtual ones); -1 where none."""
    if st.stretch_times_vary:
        span = jnp.take_along_axis(s.stretch.offset, s.stretch.steps[:, None], 1)[:, 0]
    else:
        span = s.stretch.steps * s.stretch.d
    return jnp.where(s.batch.step_time >= 0, s.batch.step_time + span, -1)


def _steps_before(s: SimState, st, now, inclusive: bool):
    """[I] virtual steps of each plan that start before ``now`` (at or before, if
    inclusive)."""
    if st.stretch_times_vary:
        starts = s.batch.step_time[:, None] + s.stretch.offset[:, :VARYING_PLAN]
        k = jnp.arange(VARYING_PLAN, dtype=jnp.int32)
        started = (starts <= now) if inclusive else (starts < now)
        return jnp.sum(started & (k < s.stretch.steps[:, None]), axis=1, dtype=jnp.int32)
    d = jnp.maximum(s.stretch.d, 1)
    span = now - s.batch.step_time + (1 if inclusive else 0)
    started = jnp.where(span > 0, (span + d - 1) // d, 0)
    return jnp.minimum(started, s.stretch.steps).astype(jnp.int32)


def truncate(s: SimState, st, i, now, active) -> SimState:
    """A request joins instance i's wait queue at ``now``: the plain steps starting before it
    stay virtual, the first one at or after it will run on its own (phase 2 may admit)."""
    before = _steps_before(s, st, now, False)[i]
    return s.replace(stretch=s.stretch.replace(steps=upd(s.stretch.steps, i, before, active)))


def kv_used_at(s: SimState, st, now):
    """[I] KV blocks in use at ``now`` with every virtual step starting before it applied."""
    done = _steps_before(s, st, now, False)
    pending = jnp.where(s.batch.step_time >= 0, done, 0)
    grown = blocks_taken(s.stretch.cum, s.batch.n_run, pending, st.settings.block_size)
    return kvblocks.capacity(s, st) - s.kv.kv_free + grown


# ---- applying virtual steps -------------------------------------------------------------------


def materialize(s: SimState, st, c, i, now, active, widths: tuple[int, ...],
                inclusive: bool = False) -> SimState:
    """Apply instance i's virtual steps that start before ``now`` (or at it, if
    ``inclusive``), where ``active``. ``widths``: the vector widths of the running-batch
    programs (``instance.step_widths``). The caller ends the plan there (or runs the real
    step that follows it): its KV outlook (``stretch.cum``) stays that of the plan's start,
    which ``kv_used_at`` would misread after part of the plan was applied."""
    due = jnp.where(active, _steps_before(s, st, now, inclusive)[i], 0)
    widest = lane_max(jnp.where(due > 0, s.batch.n_run[i], 0))

    def program(s, go, width):
        def body(carry, go):
            s, left = carry
            kc = jnp.minimum(left, chunk_steps(st))
            return _apply(s, st, c, i, kc, go, width), left - jnp.where(go, kc, 0)

        return lane_while(lambda carry: go & (carry[1] > 0), body, (s, due))[0]

    go = active & (due > 0)
    s = by_width(widths, widest, go, program, s)
    if st.tiered:  # the last step's mirror pass (the plan keeps the tier from evicting), at
        # the width of the blocks the batch holds (its own width programs)
        pos = jnp.arange(st.shapes.batch_slots, dtype=jnp.int32)
        s = kvtiered.mirror_batch(s, st, i, jnp.maximum(s.batch.order[i], 0),
                                  go & (pos < s.batch.n_run[i]), go)
    return s


class PassTimes(NamedTuple):
    """Times of instance i's next virtual steps, from the first (``pass_times``)."""

    t0: jax.Array  # int64 µs: start of the first
    d: jax.Array | None  # int64 µs: each one's time, where they all last the same
    offset: jax.Array | None  # int64 µs [chunk + 1]: start of step k after t0, where they vary

    def after(self, k):
        """µs from t0 to the start of step k (k <= chunk; any shape)."""
        return k * self.d if self.offset is None else self.offset[k]

    def step_us(self):
        """Each step's time: a scalar where they all last the same, else [chunk]."""
        return self.d if self.offset is None else self.offset[1:] - self.offset[:-1]


def pass_times(s: SimState, st, i) -> PassTimes:
    """The times of instance i's next ``chunk_steps`` virtual steps."""
    if st.stretch_times_vary:
        return PassTimes(s.batch.step_time[i], None, s.stretch.offset[i, :chunk_steps(st) + 1])
    return PassTimes(s.batch.step_time[i], s.stretch.d[i], None)


def _apply(s: SimState, st, c, i, kc, go, width: int) -> SimState:
    """Apply ``kc`` (1 .. ``chunk_steps``) plain steps of instance i at running positions
    0 .. width - 1, where ``go``: the effects of kc consecutive ``Instance._step`` calls."""
    bs, n_blocks = st.settings.block_size, pass_blocks(st)
    kc = jnp.where(go, kc, 0).astype(jnp.int32)
    times = pass_times(s, st, i)
    span = times.after(kc)  # µs from the pass's first step to the step after its last
    pos = jnp.arange(width, dtype=jnp.int32)
    valid = go & (pos < s.batch.n_run[i])
    slots = jnp.maximum(s.batch.order[i, :width], 0)
    reqs = jnp.where(valid, s.batch.slot_req[i, slots], st.shapes.num_requests)
    fill = kv.last_block_fill(s, st, i, slots)
    spare = kv.spare_positions(st, fill.blen, fill.filled)  # 0 .. B - 1
    # request j takes its m-th fresh block of the pass at step spare_j + m·B (each window of
    # B steps one); the reference takes them step by step, in batch order within a step.
    # Arrays per (request, block): [width] where a request takes at most one, else
    # [width, n_blocks] (``lift`` puts a per-request vector beside the block axis)
    one = n_blocks == 1
    lift = (lambda x: x) if one else (lambda x: x[:, None])  # noqa: E731
    m = None if one else jnp.arange(n_blocks, dtype=jnp.int32)[None, :]
    take_step = spare if one else spare[:, None] + bs * m
    fresh = lift(valid) & (take_step < kc)
    first_fresh = fresh if one else fresh[:, 0]  # takes a block in the pass
    # order of the takes: by window m, then (spare, position): a counting sort over the B
    # spare values (XLA's sort of a short vector costs ~100x more). Within window m the
    # requests taking a block are those with spare_j < kc - m·B, a prefix of the (spare,
    # position) order, so a request's rank there is its rank in window 0, after the blocks of
    # the windows before
    v = jnp.arange(bs, dtype=jnp.int32)
    bucket = first_fresh[:, None] & (spare[:, None] == v[None, :])  # [width, B]
    per_value = jnp.sum(bucket, axis=0, dtype=jnp.int32)
    below = jnp.cumsum(per_value) - per_value  # fresh requests with a smaller spare
    ahead = jnp.cumsum(bucket.astype(jnp.int32), axis=0) - bucket  # same spare, before
    rank = jnp.sum(jnp.where(bucket, below[None, :] + ahead, 0), axis=1, dtype=jnp.int32)
    if one:
        count = jnp.sum(fresh, dtype=jnp.int32)
    else:
        per_window = jnp.sum(fresh, axis=0, dtype=jnp.int32)  # [n_blocks]
        rank = rank[:, None] + (jnp.cumsum(per_window) - per_window)[None, :]
        count = jnp.sum(per_window, dtype=jnp.int32)
    # KV block-time of the kc steps: the blocks in use before the pass for all of them, and
    # each fresh block from its step on — the reference's Σ used × d step by step
    used0 = (kvblocks.capacity_of(s, st, i) - s.kv.kv_free[i]).astype(jnp.int64)
    kv_time = used0 * span + jnp.sum(jnp.where(fresh, span - times.after(take_step), 0),
                                     dtype=jnp.int64)
    # each step's time by the whole percent of the blocks in use then (the fresh blocks taken
    # at or before it), as the reference's step by step: step k takes per_value[k % B]
    k = jnp.arange(chunk_steps(st), dtype=jnp.int32)
    taken_at = per_value if one else jnp.where(
        k < kc, jnp.tile(per_value, n_blocks)[:chunk_steps(st)], 0)
    used_k = used0 + jnp.cumsum(taken_at)[:chunk_steps(st)].astype(jnp.int64)
    step_k = jnp.where(k < kc, times.after(k + 1) - times.after(k), 0)
    s, blocks, taken = kvblocks.pop_blocks(s, st, i, count, go, width * n_blocks)
    k_blocks, mb = st.shapes.kv_blocks, st.shapes.max_blocks_per_request
    b = jnp.where(fresh, blocks[jnp.minimum(rank, width * n_blocks - 1)], k_blocks)
    top_up = valid & (spare > 0)
    table_pos = jnp.where(fresh, fill.blen if one else fill.blen[:, None] + m, mb)
    n_fresh = 1 if one else jnp.sum(fresh, axis=1, dtype=jnp.int32)
    s = s.replace(
        batch=s.batch.replace(
            bt=s.batch.bt.at[i, lift(slots), table_pos].set(b, mode="drop"),
            blen=s.batch.blen.at[i, jnp.where(first_fresh, slots, st.slot_count)].add(
                n_fresh, mode="drop")),
        kv=s.kv.replace(kv_tok=s.kv.kv_tok.at[i, jnp.where(top_up, fill.last, k_blocks)].add(
            jnp.minimum(spare, kc), mode="drop").at[i, b].set(
                kc - spare if one else jnp.minimum(bs, kc - take_step), mode="drop"),
                        kv_ref=s.kv.kv_ref.at[i, b].set(1, mode="drop")),
        stats=s.stats.replace(misses=add(s.stats.misses, i, count.astype(jnp.int64), go)),
        run=s.run.replace(
            ovf_blocks=s.run.ovf_blocks + jnp.sum(
                fresh & ((fill.blen if one else table_pos) >= mb), dtype=jnp.int32)))
    if st.tiered:  # before the hash-slot writes, which read no CPU key (``one``)
        s = _cpu_keys(s, st, c, i, reqs, fill=fill, spare=spare, fresh=fresh, top_up=top_up,
                      b=b, kc=kc, times=times)
    if st.settings.prefix_caching:
        s = _hash_slot_ops(s, st, i, fresh.reshape(-1), b.reshape(-1), width * n_blocks)
    grown = jnp.where(valid, kc, 0)  # the sink row (invalid positions) gets nothing
    # each step adds its time plus the output-token processing time to every ITL sum
    itl_total = span + kc.astype(jnp.int64) * otp(st, c, i)
    s = s.replace(
        pi=s.pi.at[reqs].add(grown), computed=s.computed.at[reqs].add(grown),
        num_new=s.num_new.at[reqs].set(jnp.where(valid, 1, 0)),
        itl_sum=s.itl_sum.at[reqs].add(jnp.where(valid, itl_total, 0)))
    if st.shapes.itl_capacity > 0:
        # the progress before the pass, read back from the updated array (valid requests are
        # distinct and the sink row grows by 0): a read of the old array beside the in-place
        # add made XLA copy the whole [requests] array twice per pass
        pi0 = s.pi[reqs] - grown
        first = c.itl_offset[reqs] + (pi0 - c.input_tokens[reqs])  # the pass's first entry
        itl = (times.step_us() + otp(st, c, i)).astype(jnp.int32)
        s = s.replace(itl_buf=_itl_windows(s.itl_buf, st, c, reqs, first=first,
                                           valid=valid, kc=kc, itl=itl))
    total = kvblocks.capacity_of(s, st, i)
    used = (total - s.kv.kv_free[i]).astype(jnp.int64)
    if st.stretch_times_vary:  # the plan's offsets from the next virtual step on
        later = jnp.minimum(jnp.arange(VARYING_PLAN + 1) + kc, VARYING_PLAN)
        s = s.replace(stretch=s.stretch.replace(
            offset=upd(s.stretch.offset, i, s.stretch.offset[i, later] - span, go)))
    if st.stateful_latency:  # the EMA after the pass's last step; the plan's from there on
        s = s.replace(
            stretch=s.stretch.replace(ema=upd(s.stretch.ema, i, s.stretch.ema[i, later], go)),
            batch=s.batch.replace(ema=upd(s.batch.ema, i, s.stretch.ema[i, kc], go)))
    return s.replace(
        stretch=s.stretch.replace(steps=add(s.stretch.steps, i, -kc, go)),
        batch=s.batch.replace(
            # the instance's clock is the last event's time: this pass's last step, unless a
            # later event (the real step that materializes it) has set it already
            clock=upd(s.batch.clock, i, jnp.maximum(s.batch.clock[i], times.t0 + times.after(
                jnp.maximum(kc - 1, 0))), go),
            step_time=upd(s.batch.step_time, i, times.t0 + span, go)),
        stats=s.stats.replace(
            steps=add(s.stats.steps, i, kc.astype(jnp.int64), go),
            busy=add(s.stats.busy, i, span, go),
            kv_time=add(s.stats.kv_time, i, kv_time, go),
            kv_util=s.stats.kv_util.at[i, kv_util_bucket(used_k, total)].add(step_k),
            peak_used=upd(s.stats.peak_used, i, jnp.maximum(s.stats.peak_used[i], used), go)),
        run=s.run.replace(iters=s.run.iters + kc.astype(jnp.int64),
                          stretched=s.run.stretched + kc.astype(jnp.int64)))


def _itl_windows(itl_buf, st, c, reqs, *, first, valid, kc, itl):
    """The raw ITL entries of a ``_apply`` pass: request ``reqs[j]`` (where ``valid[j]``)
    gets entries ``first[j] .. first[j] + kc - 1``, step k's being ``itl`` (a scalar, or
    [chunk] per step). Each request's entries are written as windows of ``ITL_WINDOW``
    consecutive entries, one per ``ITL_WINDOW`` steps of the pass, starting at its first
    entry: one contiguous window per request costs XLA:CPU a fraction of a scatter of single
    entries. A window's entries past the pass's last one get scratch values: they are the
    request's later entries (a request holds ``ITL_WINDOW - 1`` entries past its last,
    ``request_rows.itl_allotted``, so no window reaches another request's), which the steps
    that make them write in order, and a request's entries are read only once it has
    finished (its first entry, which no scratch reaches, also while it decodes). The clamp to
    the request's entries never moves a window that writes one."""
    w = ITL_WINDOW
    n_win = -(-chunk_steps(st) // w)
    at = w * jnp.arange(n_win, dtype=first.dtype)  # each window's first step
    last = c.itl_end[reqs] - w  # the last start inside the request's entries
    start = jnp.minimum(first[:, None] + at[None, :], last[:, None])
    start = jnp.where(valid[:, None] & (at[None, :] < kc), start, st.shapes.itl_capacity)
    if itl.ndim:  # step k's entry: window m's j-th entry is step m·w + j's
        steps = jnp.minimum(at[:, None] + jnp.arange(w, dtype=at.dtype)[None, :],
                            chunk_steps(st) - 1)
        new = jnp.broadcast_to(itl[steps][None], (first.shape[0], n_win, w))
    else:
        new = jnp.full((first.shape[0], n_win, w), itl, itl_buf.dtype)
    scatter = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=(0,))
    return lax.scatter(itl_buf, start.reshape(-1, 1), new.reshape(-1, w).astype(itl_buf.dtype),
                       scatter, mode="drop")


def _hash_slot_ops(s: SimState, st, i, fresh, b, width: int) -> SimState:
    """The hash-slot writes of a ``_apply`` pass: a block popped for decode growth forgets the
    slot it was registered under (``kvblocks.forget_slots``: the pass writes no block into a
    slot, so the order of its writes does not matter). A block that decode tokens fill holds
    output positions, never a prompt block's, so it gets no slot (``kvcache.grant_tokens``);
    the slots of the blocks the pass takes stay empty."""
    k_blocks = st.shapes.kv_blocks
    old_slot = jnp.where(fresh, s.kv.kv_slot[i, jnp.clip(b, 0, k_blocks - 1)], NIL)
    s = kvblocks.forget_slots(s, st, old_slot, fresh & (old_slot >= 0))
    # the write that depends on old_slot goes first, so every write follows that read
    return s.replace(
        kv=s.kv.replace(
            kv_slot=s.kv.kv_slot.at[i, b].set(after_reads(jnp.full(width, NIL, jnp.int32),
                                                                old_slot + 1), mode="drop")))


def _cpu_keys(s: SimState, st, c, i, reqs, *, fill, spare, fresh, top_up, b, kc,
              times: PassTimes) -> SimState:
    """The CPU keys of a ``_apply`` pass (``kvcache.grant_tokens``): a block taken for decode
    growth forgets its content's key, noted as a GPU eviction at the start of its step
    (``spare``); a block the pass fills gets its key — the last block at step ``spare - 1``,
    a fresh block taken at step 0 when the pass is B steps long (with B = 1 a fresh block is
    full at once and, as in the reference, a decode allocation does not hash it)."""
    bs, k_blocks = st.settings.block_size, st.shapes.kv_blocks
    t = s.tier
    old = t.key_of_block[i, jnp.clip(b, 0, k_blocks - 1)]
    t = kvtier.note_evictions(t, old, fresh, times.t0 + times.after(jnp.minimum(spare, kc)))
    fills_fresh = fresh & (spare == 0) & (kc == bs) & (bs > 1)
    fills_last = top_up & (spare <= kc)
    key_of_block = t.key_of_block.at[i, b].set(
        jnp.where(fills_fresh, kv.cpu_key(st, c, i, reqs, fill.blen), NIL), mode="drop")
    key_of_block = key_of_block.at[i, jnp.where(fills_last, fill.last, k_blocks)].set(
        kv.cpu_key(st, c, i, reqs, fill.blen - 1), mode="drop")
    return s.replace(tier=kvtier.keyed_blocks(t, key_of_block))
