"""KV-cache operations on one lane's state: prefix lookup, allocate, release, and with a CPU
tier the blocks' CPU keys (the reload and the tiered allocation: ``kvtiered``).

Counterpart: ``blisjax.reference.kvcache.KVCache`` — ``cached_blocks``, ``can_allocate``,
``allocate`` and ``release`` keep its names and meaning (read its docstring first; behaviour:
docs/semantics.md §3). The reference's per-request block list is the block table of the
request's batch slot (``BatchState.bt``, ``blen``). The data structures differ so that every
operation is a handful of vector gathers and scatters rather than a loop over blocks: the free
list is a ring of keys and block hashes are hash slots (``kvblocks``, which holds both and
their primitive operations).

Every function takes ``active``: when False it must leave the state unchanged (the kernel runs
all handlers for all lanes in lockstep and masks the writes instead of selecting whole states).
Masked scatters send their writes out of bounds with ``mode="drop"``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine import kvtier
from blisjax.engine.kvblocks import (
    append_blocks,
    apply_slot_ops,
    hash_slot,
    pop_blocks,
    session_slot,
)
from blisjax.engine.lockstep import (
    add,
    after_reads,
    by_width,
    lane_max,
    lane_once,
    lane_while,
    upd,
)
from blisjax.engine.state import NIL, SimState
from blisjax.engine.vec import leading_count, prefix_sum

# ---- prefix lookup -------------------------------------------------------------------------------


class CachedPrefix(NamedTuple):
    """The longest chain of registered prompt blocks of a request on an instance
    (``cached_blocks``; the reference returns the list ``blocks[:count]``)."""

    blocks: jax.Array  # int32 [width]: block of each prompt block's hash slot, -1 if none
    count: jax.Array  # int32: leading blocks that form the chain (0 without prefix caching)


def cached_blocks(s: SimState, st, c, i, r, width: int | None = None) -> CachedPrefix:
    """The longest chain of registered prompt blocks of r on instance i. ``width`` (default:
    the longest prompt's block count) may be smaller when the chain cannot be longer (see
    ``prefix_widths``)."""
    mpb = max(st.shapes.max_prompt_blocks, 1) if width is None else width
    j = jnp.arange(mpb, dtype=jnp.int32)
    valid = j < c.full_blocks[r]
    blocks = s.kv.slot_block[jnp.where(valid, hash_slot(st, c, i, r, j), st.hash_slots)]
    hit = valid & (blocks >= 0)
    count = leading_count(hit)
    if not st.settings.prefix_caching:
        count = jnp.zeros_like(count)
    return CachedPrefix(blocks, count)


def prefix_widths(st) -> tuple[int, ...]:
    """Widths of a queued request's cached-prefix lookup: the prefix groups' block count, then
    the longest prompt's. Only r itself registers r's own prompt blocks (their hash slots are
    r's), so before r has ever run — it was never preempted — its chain is made of prefix-group
    blocks and is at most ``group_blocks_max`` long; a preempted request's chain may cover its
    whole prompt."""
    mpb = max(st.shapes.max_prompt_blocks, 1)
    if st.features.sessions:  # a follow-up finds its conversation's blocks before it first runs
        return (mpb,)
    narrow = min(st.shapes.group_blocks_max, mpb)
    return (narrow, mpb) if narrow < mpb else (mpb,)


# ---- allocation --------------------------------------------------------------------------------


class BlockFill(NamedTuple):
    """The block table's end of batch slot(s) sb (``last_block_fill``); shapes of sb."""

    blen: jax.Array  # int32: blocks the slot holds
    last: jax.Array  # int32: its last block (0 if it holds none)
    filled: jax.Array  # int32: tokens in that block (0 if it holds none)


def last_block_fill(s: SimState, st, i, sb) -> BlockFill:
    """Blocks held, last block and the tokens in it of batch slot(s) sb on instance i."""
    blen = s.batch.blen[i, sb]
    last = jnp.maximum(s.batch.bt[i, sb, jnp.maximum(blen - 1, 0)], 0)
    filled = jnp.where(blen > 0, s.kv.kv_tok[i, last], 0)
    return BlockFill(blen, last, filled)


def spare_positions(st, blen, filled):
    """Token positions left in a slot's last block: none when it holds no block (a request
    whose whole prompt was a cached prefix holds none of its own) or the block is full."""
    return jnp.where((blen > 0) & (filled >= 1), st.settings.block_size - filled, 0)


def blocks_needed(st, blen, filled, n):
    """Fresh blocks for n more tokens after the spare room of the last block (BLIS)."""
    bs = st.settings.block_size
    return (jnp.maximum(0, n - spare_positions(st, blen, filled)) + bs - 1) // bs


def can_allocate(s: SimState, st, c, i, sb, r, *, start, end, cached, n_cached):
    """BLIS's check-then-act pre-check (prefill vs decode by the request's PI)."""
    bs = st.settings.block_size
    fill = last_block_fill(s, st, i, sb)
    blen, filled = fill.blen, fill.filled
    need = blocks_needed(st, blen, filled, end - start)
    k = jnp.arange(cached.shape[0])
    not_in_use = (k < n_cached) & (s.kv.kv_ref[i, jnp.maximum(cached, 0)] == 0)
    prefill_ok = need + jnp.sum(not_in_use) <= s.kv.kv_free[i]
    decode_ok = jnp.where((blen == 0) | (filled >= bs), s.kv.kv_free[i] > 0, True)
    return jnp.where(s.pi[r] < c.input_tokens[r], prefill_ok, decode_ok)


def claim_cached(s: SimState, st, i, sb, cached, n_claim, active, first=0) -> SimState:
    """Take cached blocks (``KVCache.claim``: refcount +1, free ones leave the free list, each
    a hit). ``first`` 0 (a request's first allocation): ``cached[:n_claim]`` become the first
    entries of its block table. Otherwise (a CPU-tier allocation of a request that may hold
    blocks): ``cached[first : first + n_claim]`` are appended to the ones it holds."""
    k_blocks, mb = st.shapes.kv_blocks, st.shapes.max_blocks_per_request
    k = jnp.arange(cached.shape[0])
    appending = not (isinstance(first, int) and first == 0)
    on = active & (k >= first) & (k < first + n_claim) if appending else active & (k < n_claim)
    b = jnp.maximum(cached, 0)
    ref = s.kv.kv_ref[i, b]
    was_free = on & (ref == 0)
    s = s.replace(
        kv=s.kv.replace(
            kv_ref=s.kv.kv_ref.at[i, jnp.where(on, b, k_blocks)].set(ref + 1, mode="drop"),
            fkey=s.kv.fkey.at[i, jnp.where(was_free, b, k_blocks)].set(NIL, mode="drop"),
            kv_free=add(s.kv.kv_free, i, -jnp.sum(was_free, dtype=jnp.int32), active)),
        stats=s.stats.replace(
            hits=add(s.stats.hits, i, jnp.asarray(n_claim).astype(jnp.int64), active)))
    if not appending:
        return s.replace(batch=s.batch.replace(
                             bt=s.batch.bt.at[i, sb, jnp.where(on, k, mb)].set(b, mode="drop"),
                             blen=upd(s.batch.blen, (i, sb), n_claim, active)))
    pos = s.batch.blen[i, sb] + k - first
    return s.replace(
        batch=s.batch.replace(
            bt=s.batch.bt.at[i, sb, jnp.where(on & (pos < mb), pos, mb)].set(b, mode="drop"),
            blen=add(s.batch.blen, (i, sb), n_claim, active)),
        run=s.run.replace(ovf_blocks=s.run.ovf_blocks + jnp.sum(on & (pos >= mb), dtype=jnp.int32)))


POP_CHUNK = 16  # fresh blocks per inner iteration of an allocation (phase 1, admissions)


class KnownGrant(NamedTuple):
    """What a caller of ``grant_tokens`` already computed from the same state, per request k
    (shapes of ``sb``), so it is not gathered again."""

    blen: jax.Array  # ``last_block_fill(s, st, i, sb)``
    last: jax.Array
    filled: jax.Array
    cum: jax.Array  # int32: prefix sum of the fresh blocks each request takes where ``mask``
    #                 (``blocks_needed``; 0 elsewhere)


class _GrantChunks(NamedTuple):
    """What every chunk of one ``grant_tokens`` call reads, per request k (shapes of ``sb``)."""

    sb: jax.Array  # batch slot
    r: jax.Array  # request
    prefill: jax.Array  # the request was in prefill when the call was made
    blen: jax.Array  # blocks held before the call
    last: jax.Array  # last block held before the call
    rest: jax.Array  # tokens left after topping up the last block
    cum: jax.Array  # prefix sum of fresh blocks
    before: jax.Array  # fresh blocks of the requests before k
    reg_partial: jax.Array  # the top-up fills a prompt block, which is registered
    top_index: jax.Array  # the prompt block the top-up's block holds
    chunk_of: jax.Array  # the chunk that applies that registration
    fresh_pos: jax.Array  # position of the first token of its first fresh block
    on_chain: jax.Array  # its fresh blocks' hashes are on the true chain (a CPU tier)


def grant_tokens(s: SimState, st, c, i, sb, r, *, n, first_pos, prefill, mask,
                 chunk: int = POP_CHUNK, known: KnownGrant | None = None) -> SimState:
    """Allocate ``n[k]`` more tokens for request ``r[k]`` in batch slot ``sb[k]``, the first at
    position ``first_pos[k]``, for every k where ``mask``, in k order — as consecutive
    reference ``allocate`` calls whose pre-checks passed: top up the partially filled last
    block, then take fresh blocks from the LRU head. ``prefill[k]``: the request was in
    prefill when the call was made (fresh full blocks are then registered). A block's hash
    covers the tokens it holds: a block whose tokens are not a prompt block's (a tiered
    reload can shift a request's blocks off their positions) gets no hash slot.

    Fresh blocks are taken ``chunk`` at a time. Hash-slot writes keep the reference order:
    request k's top-up registration (op ``base_k``), then per fresh block "forget its old
    slot" and "register" (ops ``base_k + 1 + 2m``, ``base_k + 2 + 2m``); a top-up
    registration is applied with the chunk holding its request's first fresh block, and every
    chunk's ops come after the previous chunk's, so per-chunk resolution is exact.

    ``known``: the block fill and fresh-block prefix sum the caller already computed.
    """
    bs = st.settings.block_size
    fill_now = last_block_fill(s, st, i, sb) if known is None else known
    blen, last, filled = fill_now.blen, fill_now.last, fill_now.filled
    partial = mask & (n > 0) & (blen > 0) & (filled >= 1) & (filled < bs)
    fill = jnp.where(partial, jnp.minimum(bs - filled, n), 0)
    rest = jnp.where(mask, n - fill, 0)
    fresh = (rest + bs - 1) // bs
    cum = prefix_sum(fresh.astype(jnp.int32)) if known is None else known.cum
    before = cum - fresh
    total = cum[-1]
    s = s.replace(kv=s.kv.replace(kv_tok=s.kv.kv_tok.at[i, jnp.where(partial, last,
                                                                     st.shapes.kv_blocks)]
                  .add(fill, mode="drop")))
    top_first = first_pos - filled  # the top-up block's first token
    top_index = top_first // bs
    reg_partial = partial & (filled + fill == bs) & (top_first % bs == 0) \
        & (top_index < (c.reg_blocks[r] if st.features.sessions else c.full_blocks[r]))
    if not st.settings.prefix_caching:
        reg_partial = jnp.zeros_like(reg_partial)
    fresh_pos = first_pos + fill
    on_chain = jnp.ones_like(partial)
    if st.tiered:
        # Every block an append fills gets a hash (output blocks too: the CPU tier mirrors
        # them); fresh blocks chain from the last block's
        top_full = partial & (filled + fill == bs)
        s, top_on = register_keys(s, st, c, i, r, blen - 1,
                                  prev_block=s.batch.bt[i, sb, jnp.maximum(blen - 2, 0)],
                                  block=last, mask=top_full,
                                  first_token=top_first)
        held = s.tier.key_of_block[i, jnp.clip(last, 0, st.shapes.kv_blocks - 1)]
        on_chain = content_key(st, c, i, r, fresh_pos,
                               jnp.where(blen > 0, held, NIL)).on_chain
        reg_partial = reg_partial & top_on
    n_chunks = jnp.maximum((total + chunk - 1) // chunk, jnp.any(reg_partial))
    chunk_of = jnp.minimum(before // chunk, n_chunks - 1)
    plan = _GrantChunks(sb, r, prefill, blen, last, rest, cum, before, reg_partial, top_index,
                        chunk_of, fresh_pos, on_chain)

    def chunks(s, top_ups: bool):
        def body(carry, go):
            s, k = carry
            s = _grant_chunk(s, st, c, i, plan, k=k, total=total, go=go, chunk=chunk,
                             top_ups=top_ups)
            return s, k + go.astype(k.dtype)

        init = (s, jnp.asarray(0, jnp.int32))
        return lane_while(lambda carry: carry[1] < n_chunks, body, init)[0]

    if sb.shape[0] == 1 or not st.settings.prefix_caching:  # one request, or no hash slots at all
        s = chunks(s, True)
    else:
        # Top-up registrations add a hash-slot op per request (a vector as wide as the
        # running batch) to every chunk; phase 1 rarely has one (a prefill chunk completing a
        # prompt block), so without any in the block a program without them runs.
        any_top = lane_max(jnp.any(reg_partial).astype(jnp.int32)) > 0
        s = lane_once(any_top, lambda s, go: chunks(s, True), s)
        s = lane_once(~any_top, lambda s, go: chunks(s, False), s)
    return s.replace(
        batch=s.batch.replace(
            blen=s.batch.blen.at[i, jnp.where(mask, sb, st.slot_count)].add(fresh, mode="drop")),
        stats=s.stats.replace(misses=s.stats.misses.at[i].add(total.astype(jnp.int64))))


def _grant_chunk(s: SimState, st, c, i, plan: _GrantChunks, *, k, total, go, chunk: int,
                 top_ups: bool = True) -> SimState:
    """Chunk k of ``grant_tokens``: fresh blocks g in [k·C, k·C + C). ``top_ups=False``: no
    request registers a topped-up block (its hash-slot ops would all be masked)."""
    sb, r, prefill, blen, last = plan.sb, plan.r, plan.prefill, plan.blen, plan.last
    rest, cum, before = plan.rest, plan.cum, plan.before
    reg_partial, chunk_of = plan.reg_partial, plan.chunk_of
    bs, mb, k_blocks = st.settings.block_size, st.shapes.max_blocks_per_request, st.shapes.kv_blocks
    g0 = k * chunk
    s, blocks, taken = pop_blocks(s, st, i, jnp.clip(total - g0, 0, chunk), go, chunk)
    g = g0 + jnp.arange(chunk, dtype=jnp.int32)
    if sb.shape[0] == 1:  # one request (an admission, a decode token) owns every block
        owner = jnp.zeros(chunk, jnp.int32)

        def of_owner(x):
            return jnp.broadcast_to(x[0], (chunk,))
    else:
        owner = jnp.minimum(jnp.searchsorted(cum, g, side="right",
                                             method="scan_unrolled"), sb.shape[0] - 1)

        def of_owner(x):
            return x[owner]
    m = g - of_owner(before)  # index among the owner's fresh blocks
    tok = jnp.minimum(bs, of_owner(rest) - m * bs)
    j = of_owner(blen) + m  # position in the owner's block table
    b_safe = jnp.where(taken, blocks, k_blocks)
    old_slot = s.kv.kv_slot[i, jnp.clip(blocks, 0, k_blocks - 1)]
    s = s.replace(
        batch=s.batch.replace(
            bt=s.batch.bt.at[i, of_owner(sb), jnp.where(taken, j, mb)].set(blocks, mode="drop")),
        kv=s.kv.replace(kv_tok=s.kv.kv_tok.at[i, b_safe].set(tok, mode="drop"),
                        kv_ref=s.kv.kv_ref.at[i, b_safe].set(1, mode="drop")),
        run=s.run.replace(
            ovf_blocks=s.run.ovf_blocks + jnp.sum(taken & (j >= mb), dtype=jnp.int32)))
    if not st.settings.prefix_caching:
        return s
    # a fresh block filled during a prefill gets a hash; a prompt block's goes in its slot
    hashed = taken & (tok == bs) & of_owner(prefill)
    first = of_owner(plan.fresh_pos) + m * bs  # the block's first token
    q = first // bs
    reg_fresh = hashed & (first % bs == 0) & (q < c.full_blocks[of_owner(r)])
    slot_fresh = hash_slot(st, c, i, of_owner(r), q)
    if st.tiered:  # the CPU key of each fresh block's hash (-1: none); off the chain, no slot
        on = of_owner(plan.on_chain)
        t = s.tier
        t = kvtier.note_evictions(t, t.key_of_block[i, jnp.clip(blocks, 0, k_blocks - 1)],
                                  taken, s.batch.clock[i])
        # A block whose tokens are not its position's (a prefill after a reload that covered
        # part of a block, ``TieredKVCache.allocate``) has an off-chain key
        key = content_key(st, c, i, of_owner(r), first, NIL)
        t = t.replace(key_of_block=t.key_of_block.at[i, b_safe].set(
            jnp.where(hashed & on, key.true_key, NIL), mode="drop"))
        # off the chain: each chains from the block before it (none: -1)
        prev = jnp.where(j > 0, s.batch.bt[i, of_owner(sb), jnp.clip(j - 1, 0, mb - 1)], NIL)
        t = kvtier.chain_offchain(t, st, i, prev, b_safe, key.true_key, hashed & ~on,
                                  key.shift)
        s = s.replace(tier=t)
        reg_fresh = reg_fresh & on
    base_owner = owner + 2 * of_owner(before)  # first op of the owner (see grant_tokens)
    seq = jnp.concatenate([base_owner + 1 + 2 * m, base_owner + 2 + 2 * m])
    slots = jnp.concatenate([old_slot, slot_fresh])
    values = jnp.concatenate([jnp.full(chunk, NIL, jnp.int32), blocks])
    ops = jnp.concatenate([taken & (old_slot >= 0), reg_fresh])
    if top_ups:
        reg_top = go & reg_partial & (chunk_of == k)
        slot_top = hash_slot(st, c, i, r, plan.top_index)
        base = jnp.arange(sb.shape[0], dtype=jnp.int32) + 2 * before
        seq, slots = jnp.concatenate([base, seq]), jnp.concatenate([slot_top, slots])
        values, ops = jnp.concatenate([last, values]), jnp.concatenate([reg_top, ops])
    s = apply_slot_ops(s, st, slots, values, seq, ops)
    # the write that depends on old_slot goes first, so every write follows that read
    fresh_slot = after_reads(jnp.where(reg_fresh, slot_fresh, NIL), old_slot)
    s = s.replace(kv=s.kv.replace(kv_slot=s.kv.kv_slot.at[i, b_safe].set(fresh_slot, mode="drop")))
    if top_ups:
        s = s.replace(kv=s.kv.replace(
                          kv_slot=s.kv.kv_slot.at[i, jnp.where(reg_top, last, k_blocks)]
                      .set(slot_top, mode="drop")))
    return s


def allocate(s: SimState, st, c, i, sb, r, *, start, end, cached, n_cached, active,
             chunk: int | None = None):
    """One reference ``allocate`` of positions [start, end) of request r in batch slot sb,
    whose pre-check passed; does nothing unless ``active``. ``chunk``: fresh blocks per inner
    iteration (default ``POP_CHUNK``, or fewer if the token budget needs fewer; pass 1 for a
    single decode token). 16 per iteration beat 8, 32 and 64 (a wider window costs every
    admission, more iterations only the long prompts; docs/performance.md, Ideas tried and
    not kept)."""
    if chunk is None:
        chunk = max(1, min(POP_CHUNK, -(-st.settings.token_budget // st.settings.block_size)))
    n = jnp.where(active, end - start, 0).astype(jnp.int32)
    if not (isinstance(n_cached, int) and n_cached == 0):  # statically no cached prefix
        claim = active & (n > 0) & (s.batch.blen[i, sb] == 0) & (n_cached > 0)
        s = claim_cached(s, st, i, sb, cached, n_cached, claim)
    prefill = s.pi[r] < c.input_tokens[r]
    one = lambda x: jnp.reshape(x, (1,))  # noqa: E731
    return grant_tokens(s, st, c, i, one(sb), one(r), n=one(n),
                        first_pos=one(jnp.asarray(start, jnp.int32)), prefill=one(prefill),
                        mask=one(active & (n > 0)), chunk=chunk)


RELEASE_NARROWEST = 32  # narrowest vector width of a release (doubled up to the table width)


def release_widths(st) -> tuple[int, ...]:
    """Vector widths of the release programs: ``RELEASE_NARROWEST`` doubled while below the
    block-table width ``max_blocks_per_request``, then that width (e.g. 32, 64, 85); only
    the table width without ``narrow_programs``."""
    widths = []
    w = RELEASE_NARROWEST if st.tuning.narrow_programs else st.shapes.max_blocks_per_request
    while w < st.shapes.max_blocks_per_request:
        widths.append(w)
        w *= 2
    return (*widths, max(st.shapes.max_blocks_per_request, 1))


def release(s: SimState, st, i, sb, active) -> SimState:
    """Free a slot's blocks last to first; blocks reaching refcount 0 go to the LRU tail.

    A release's cost follows its vector width, and most requests hold far fewer blocks than
    the table's width (on scenario S ~30 of 85; a masked entry costs ~40 % of a live one). So
    it runs at the narrowest of ``release_widths`` that holds every active lane's block count
    — the same width for all lanes of a lockstep loop, so only one program runs."""
    need = lane_max(jnp.where(active, s.batch.blen[i, sb], 0))
    return by_width(release_widths(st), need, active,
                    lambda s, go, w: _release(s, st, i, sb, go, w), s)


def _release(s: SimState, st, i, sb, active, width: int) -> SimState:
    """``release`` with blocks 0 .. width - 1 of the slot (width >= its block count)."""
    mb, k_blocks = st.shapes.max_blocks_per_request, st.shapes.kv_blocks
    n = jnp.where(active, s.batch.blen[i, sb], 0)
    k = jnp.arange(width)
    on = k < n
    b = jnp.where(on, s.batch.bt[i, sb, jnp.clip(n - 1 - k, 0, mb - 1)], 0)
    ref = s.kv.kv_ref[i, b] - 1
    s = s.replace(kv=s.kv.replace(
                      kv_ref=s.kv.kv_ref.at[i, jnp.where(on, b, k_blocks)].set(ref, mode="drop")))
    s = append_blocks(s, st, i, b, on & (ref == 0))
    # The block count is reset last, with a value tied to both writes above: fusion re-reads
    # the count inside each kernel that uses it, and unless every such read is an ancestor of
    # the reset, XLA copies the whole [instances, slots] array at every release.
    tie = s.kv.kv_ref[i, b[0]] | s.kv.ftail[i]  # never negative
    return s.replace(batch=s.batch.replace(
                         blen=upd(s.batch.blen, (i, sb), after_reads(jnp.int32(0), tie), active)))


# ---- deferred releases (completions) -----------------------------------------------------------


def defer_release(s: SimState, st, i, sb, active) -> SimState:
    """Queue the release of batch slot sb of instance i (a completion) instead of running it;
    the queue must have room (``must_flush``).

    Queued releases run in queue order — by ``flush_releases`` inside the lane, or for every
    lane of a block at once by ``lanes.release_queued`` at the end of the lockstep iteration —
    which is the reference's order. Running them later is exact while nothing in between
    depends on them: within a step only a completion's final-token allocation could, and only
    when the free list is empty (a release appends at the LRU tail, a pop takes the head)."""
    sb = jnp.asarray(sb, jnp.int32)
    return s.replace(kv=s.kv.replace(
                         rel_slots=upd(s.kv.rel_slots, s.kv.rel_count, sb, active),
                         rel_inst=jnp.where(active, jnp.asarray(i, jnp.int32), s.kv.rel_inst),
                         rel_count=s.kv.rel_count + active.astype(jnp.int32)))


def must_flush(s: SimState, i, final_token):
    """Whether the lane must run its queued releases before a completion on instance i: its
    queue is full, or the completion's final token (``final_token``) may need a block from a
    free list that is empty without them."""
    full = s.kv.rel_count >= s.kv.rel_slots.shape[0]
    return full | (final_token & (s.kv.rel_count > 0) & (s.kv.kv_free[i] == 0))


def flush_releases(s: SimState, st, active) -> SimState:
    """Run the lane's queued releases in queue order and empty the queue (where ``active``)."""
    count = jnp.where(active, s.kv.rel_count, 0)

    def body(carry, go):
        s, k = carry
        sb = s.kv.rel_slots[jnp.minimum(k, s.kv.rel_slots.shape[0] - 1)]
        return release(s, st, s.kv.rel_inst, sb, go), k + go.astype(k.dtype)

    s, _ = lane_while(lambda carry: carry[1] < count, body, (s, jnp.asarray(0, jnp.int32)))
    return s.replace(kv=s.kv.replace(rel_count=jnp.where(active, 0, s.kv.rel_count)))


# ---- CPU tier: the blocks' keys (engine.kvtier; reloads: engine.kvtiered) ------------------------------


def cpu_key(st, c, i, r, j):
    """CPU key of block j of request r on instance i on its true hash chain: its hash slot
    for a full prompt block (with closed-loop sessions, for every block its session shares:
    an output block of one round is a prompt block of the next), else an extension key
    (``engine.kvtier``)."""
    ext = c.ext_base[r] + j + (i * st.shapes.cpu_ext_slots if st.own_per_instance else 0)
    slotted = c.reg_blocks[r] if st.features.sessions else c.full_blocks[r]
    return jnp.where(j < slotted, hash_slot(st, c, i, r, j), ext)


class ContentKey(NamedTuple):
    """The CPU key of a full block by what it holds (``content_key``); shapes of its inputs."""

    on_chain: jax.Array  # bool: its hash is its content's true hash (``cpu_key``)
    true_key: jax.Array  # int32: that key; for a block off its positions, a key whose
    #                      sharing is its tokens' (``content_key``, ``kvtier.offchain_key``)
    shift: jax.Array  # int32: its first token's position modulo the block size


def content_key(st, c, i, r, first_token, origin) -> ContentKey:
    """What a full block of request r holds, from its first token's position ``first_token``
    and the key ``origin`` of the block the request holds before it (-1: none, or one without
    a hash): BLIS hashes its tokens chained from that block's hash (``KVCache._register``).
    The hash is the true one iff the block sits at a multiple of the block size and its
    predecessor holds the true block before it (or, for block 0, nothing hashed).

    A block off its positions (a tiered allocation after a reload that covered part of a
    block, ``TieredKVCache.allocate``) holds the prefix group's tokens iff all of them lie in
    the prefix, which puts the block its first token lies in inside the group's blocks: it is
    keyed by that block's key with its shift; tokens of the request's own are keyed by the
    block after it, which is then the request's own too (a group block would put them inside
    the prefix). With closed-loop sessions, tokens that all lie in the conversation
    (``WorkloadConsts.session_tokens``) and not all in the prefix are the session's at those positions
    in every round: they are keyed by the session's slot of the block their first token lies
    in (a slot no aligned block of a group's uses when that block is the group's); tokens
    past it are the request's own, and the block after them is then no session block. Either
    way (key, shift) names the tokens."""
    bs = st.settings.block_size
    q = first_token // bs
    shift = first_token % bs
    aligned = shift == 0
    shared = (c.group[r] >= 0) & (first_token + bs <= c.prefix_tokens[r])
    true_key = cpu_key(st, c, i, r, jnp.where(aligned | shared, q, q + 1))
    if st.features.sessions:
        talk = ~aligned & ~shared & (first_token + bs <= c.session_tokens[r])
        true_key = jnp.where(talk, session_slot(st, c, i, r, q), true_key)
    after = cpu_key(st, c, i, r, jnp.maximum(q - 1, 0))
    on_chain = aligned & jnp.where(q == 0, origin < 0, origin == after)
    return ContentKey(on_chain, true_key, shift)


def holds_true_key(s: SimState, st, c, i, r, m, block):
    """Whether GPU block ``block``, held by request r at position m, has r's true key there
    (m < 0: no block, the true chain's start). A block chaining from one that does not has an
    off-chain hash (``blis_quirks``: a reload replaced the held block's content)."""
    held = s.tier.key_of_block[i, jnp.clip(block, 0, st.shapes.kv_blocks - 1)]
    return (m < 0) | (held == cpu_key(st, c, i, r, jnp.maximum(m, 0)))


def register_keys(s: SimState, st, c, i, r, j, *, prev_block, block, mask, first_token):
    """``(state, on_chain)``: give GPU block ``block`` (block j of request r, its first token
    at position ``first_token``) the CPU key of its hash where ``mask``, chained from the
    block the request holds at j - 1 (``prev_block``; ``KVCache._register``). A block off its
    positions, or chained from a block of other content, gets an off-chain key
    (``content_key``) and no hash slot. Vectors: one entry per request."""
    t = s.tier
    k_blocks = st.shapes.kv_blocks
    prev = jnp.where(j > 0, prev_block, NIL)
    origin = jnp.where(prev >= 0, t.key_of_block[i, jnp.clip(prev, 0, k_blocks - 1)], NIL)
    key = content_key(st, c, i, r, first_token, origin)
    on = key.on_chain
    t = t.replace(key_of_block=t.key_of_block.at[i, jnp.where(mask, block, k_blocks)].set(
        jnp.where(on, key.true_key, NIL), mode="drop"))
    t = kvtier.chain_offchain(t, st, i, prev, block, key.true_key, mask & ~on, key.shift)
    return s.replace(tier=t), on
