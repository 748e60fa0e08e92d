"""The tiered KV cache on one lane's state: the reload from the CPU tier, the mirror pass of a
running batch, and the allocation that may reload.

Counterpart: ``blisjax.reference.kvcache.TieredKVCache`` — ``reload_prefix``, ``mirror``
(``mirror_batch``) and ``allocate`` (``tiered_allocate``) keep its names and meaning
(behaviour: docs/semantics.md §3.8). The GPU cache's own operations are ``kvcache``'s, the CPU
tier's LRU and keys ``kvtier``'s. As there, every function takes ``active`` and leaves the
state unchanged where it is False.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine import kvtier
from blisjax.engine.kvblocks import append_blocks, apply_slot_ops, free_run, hash_slot, take_run
from blisjax.engine.kvcache import (
    allocate,
    cached_blocks,
    can_allocate,
    claim_cached,
    holds_true_key,
)
from blisjax.engine.lockstep import add, after_reads, by_width, lane_max, lane_once, lane_while
from blisjax.engine.state import NIL, SimState
from blisjax.engine.vec import prefix_sum


def reload_prefix(s: SimState, st, c, i, r, start_block, keep, active):
    """``TieredKVCache.reload_prefix``: reload r's prompt blocks from ``start_block`` on that
    the GPU lacks and the CPU tier holds, consecutively, at most as many as the free blocks
    outside ``keep`` (bool [K]; the request's cached-but-free blocks a reload passes over).
    Each takes a free block (its old hash slot cleared), becomes a cached free block at the
    free list's tail and adds the lane's reload time to the step being formed. Returns
    ``(state, blocks reloaded)``; nothing unless ``active``."""
    active = active & (s.tier.capacity > 0) & (start_block < c.full_blocks[r])
    init = (s, jnp.asarray(0, jnp.int32))
    return lane_once(active, lambda carry, go: _reload(carry[0], st, c, i, r, start_block,
                                                        keep, go), init)


def _first_match(values, queries):
    """For each query, 1 + the first k with ``values[k] == query`` (n + 1 if none; negative
    values match nothing). Pairwise: the vectors are a prompt's blocks long."""
    n = values.shape[0]
    hit = (values[None, :] == queries[:, None]) & (values[None, :] >= 0)
    return jnp.min(jnp.where(hit, jnp.arange(1, n + 1, dtype=jnp.int32)[None, :], n + 1),
                   axis=1)


def _reload(s: SimState, st, c, i, r, start_block, keep, go):
    """``reload_prefix`` at once instead of block by block.

    The reference walks the blocks j in order: a block the GPU holds is skipped; otherwise it
    is reloaded if the tier holds it and the budget allows, else the walk stops. Each reload
    takes the free list's next block outside ``keep``, so the k-th reload takes the k-th block
    of ``free_run`` whatever block it reloads (the blocks it appends at the tail are beyond
    the budget), and the tier only gains recency (membership is fixed during the walk). Block
    j is on the GPU when the walk reaches it iff it was at the start and none of the blocks
    taken before it (as many as the reloads before it) held its hash slot. So whether j is
    passed over depends only on how many earlier blocks were not: the least solution of that
    recurrence, found by iterating from "only the blocks missing at the start" (each round
    settles at least the first unsettled block; one or two rounds in practice), is the walk."""
    bs, k_blocks = st.settings.block_size, st.shapes.kv_blocks
    mpb = max(st.shapes.max_prompt_blocks, 1)
    j = jnp.arange(mpb, dtype=jnp.int32)
    slots = hash_slot(st, c, i, r, j)
    in_range = go & (j >= start_block) & (j < c.full_blocks[r])
    slots = jnp.where(in_range, slots, NIL)
    on_gpu = s.kv.slot_block[jnp.where(in_range, slots, st.hash_slots)] >= 0
    kept_free = 0 if keep is None else jnp.sum(keep & (s.kv.kv_ref[i] == 0), dtype=jnp.int32)
    budget = s.kv.kv_free[i] - kept_free
    run = free_run(s, st, i, jnp.where(go, jnp.minimum(budget, mpb), 0), mpb, keep)
    found = run.blocks >= 0
    safe = jnp.clip(run.blocks, 0, k_blocks - 1)
    old_slot = jnp.where(found, s.kv.kv_slot[i, safe], NIL)
    old_key = jnp.where(found, s.tier.key_of_block[i, safe], NIL)
    slot_taken_at = _first_match(old_slot, slots)  # the reload that takes j's GPU copy
    key_taken_at = _first_match(old_key, slots)

    def walk(x):  # blocks the walk does not pass over, given which earlier ones it did not
        before = prefix_sum(x) - x
        return in_range & (~on_gpu | (slot_taken_at <= before))

    def settle(carry, go_on):
        x, _ = carry
        x_next = walk(x)
        return jnp.where(go_on, x_next, x), ~go_on | jnp.all(x_next == x)

    x, _ = lane_while(lambda carry: ~carry[1], settle, (in_range & ~on_gpu, ~go))
    before = prefix_sum(x) - x  # reloads before each block (before the walk stops)
    stops = x & (~kvtier.holds(s.tier, slots) | (before >= budget))
    reload = x & (j < jnp.min(jnp.where(stops, j, mpb)))
    count = jnp.sum(reload, dtype=jnp.int32)
    now = s.batch.clock[i]
    window = st.settings.kv_thrash_window_us
    evicted_us = s.tier.evicted_at[jnp.where(reload, slots, s.tier.evicted_at.shape[0] - 1)]
    thrash = reload & (((evicted_us >= 0) & (now - evicted_us < window))
                       | ((key_taken_at <= before) & (window > 0)))
    # the k-th block taken gets the k-th reloaded block's content
    taken = j < count
    new_slot = jnp.full(mpb, NIL, jnp.int32).at[jnp.where(reload, before, mpb)].set(
        slots, mode="drop")
    s = take_run(s, i, run, count, go)
    # old_key made dependent on the read of evicted_at, so that the write is in place
    t = kvtier.note_evictions(s.tier, after_reads(old_key, evicted_us), taken, now)
    s = s.replace(tier=t)
    s = apply_slot_ops(s, st, jnp.concatenate([old_slot, new_slot]),
                       jnp.concatenate([jnp.full(mpb, NIL, jnp.int32), run.blocks]),
                       jnp.concatenate([2 * j, 2 * j + 1]),
                       jnp.concatenate([taken & (old_slot >= 0), taken]))
    dest = jnp.where(taken, run.blocks, k_blocks)
    t = s.tier
    t = t.replace(key_of_block=t.key_of_block.at[i, dest].set(new_slot, mode="drop"),
                  pending_us=add(t.pending_us, i, count * t.reload_us, go),
                  reloads=add(t.reloads, i, count, go),
                  thrash_reloads=add(t.thrash_reloads, i, jnp.sum(thrash), go),
                  request_reloads=add(t.request_reloads, r, count, go))
    t = kvtier.append(t, i, new_slot, taken)  # each reloaded hash becomes the most recent
    s = s.replace(tier=t, kv=s.kv.replace(
                              kv_slot=s.kv.kv_slot.at[i, dest].set(new_slot, mode="drop"),
                              kv_tok=s.kv.kv_tok.at[i, dest].set(bs, mode="drop")))
    return append_blocks(s, st, i, run.blocks, taken), count


def mirror_widths(st) -> tuple[int, ...]:
    """Vector widths of the mirror pass (``mirror_batch``): 64, then x4 up to every block of
    a full batch."""
    most = max(st.shapes.batch_slots * st.shapes.max_blocks_per_request, 1)
    widths, w = [], 64
    while w < most:
        widths.append(w)
        w *= 4
    return (*widths, most)


def mirror_batch(s: SimState, st, i, slots, valid, active) -> SimState:
    """``TieredKVCache.mirror`` of a running batch (its batch ``slots`` where ``valid``, in
    batch order): the hashed full blocks, each request's in table order, as one pass
    (``kvtier.mirror``) at the narrowest width that holds every block the batch holds.

    Position p of the pass is block p of the batch's blocks laid end to end (requests in
    batch order): its request is the one whose run of blocks covers p, so the pass gathers
    only the blocks held, not the batch's whole block tables; blocks without a hash or not
    full are left out of the pass by its mask."""
    mb, rows = st.shapes.max_blocks_per_request, slots.shape[0]
    held = jnp.where(valid, s.batch.blen[i, slots], 0)
    ends = prefix_sum(held)  # blocks of the requests up to each
    total = jnp.where(active, ends[-1], 0)

    def program(s, go, w):
        p = jnp.arange(w, dtype=jnp.int32)
        row = jnp.minimum(jnp.searchsorted(ends, p, side="right", method="scan_unrolled"),
                          rows - 1)
        col = p - (ends[row] - held[row])
        blocks = s.batch.bt[i, slots[row], jnp.clip(col, 0, mb - 1)]
        safe = jnp.clip(blocks, 0, st.shapes.kv_blocks - 1)
        keys = s.tier.key_of_block[i, safe]
        on = (p < total) & (keys >= 0) & (s.kv.kv_tok[i, safe] == st.settings.block_size)
        return s.replace(tier=kvtier.mirror(s.tier, i, keys, on, go))

    return by_width(mirror_widths(st), lane_max(total), active, program, s)


def keep_mask(s: SimState, st, i, cached, n_cached, active):
    """bool [K]: the blocks ``cached[:n_cached]`` (where ``active``)."""
    k = jnp.arange(cached.shape[0])
    on = active & (k < n_cached)
    return jnp.zeros(st.shapes.kv_blocks, bool).at[jnp.where(on, cached, st.shapes.kv_blocks)].set(
        True, mode="drop")


class TieredOutcome(NamedTuple):
    """What ``tiered_allocate`` did besides changing the state."""

    ok: jax.Array  # bool: the allocation succeeded
    reloaded: jax.Array  # int32: blocks it reloaded


def allocate_uncached(s: SimState, st, c, i, sb, r, *, start, end, active,
                      chunk: int | None = None):
    """Positions [start, end) of request r in slot sb, with no cached prefix to claim: the
    tiered allocation with a CPU tier (it may reload), else the plain one where its pre-check
    passes. Returns ``(state, ok)``."""
    if st.tiered:
        no_prefix = jnp.full(max(st.shapes.max_prompt_blocks, 1), NIL, jnp.int32)
        s, got = tiered_allocate(s, st, c, i, sb, r, start=start, end=end, cached=no_prefix,
                                 n_cached=0, active=active,
                                 chunk=chunk)
        return s, got.ok
    empty = jnp.zeros(1, jnp.int32)
    ok = active & can_allocate(s, st, c, i, sb, r, start=start, end=end, cached=empty, n_cached=0)
    return allocate(s, st, c, i, sb, r, start=start, end=end, cached=empty, n_cached=0, active=ok,
                    chunk=chunk), ok


def tiered_allocate(s: SimState, st, c, i, sb, r, *, start, end, cached, n_cached, active,
                    chunk: int | None = None):
    """``TieredKVCache.allocate`` of positions [start, end) of request r in batch slot sb:
    reload first, then one of the three ways on (claim what the reload made cached and
    allocate the rest, claim only, or allocate as before), each with its pre-check. A failure
    without a reload is a CPU miss. ``cached``/``n_cached``: the caller's GPU-cached prefix
    (an admission's, at the full prompt width ``max_prompt_blocks``; none for a running
    request). Returns ``(state, TieredOutcome)``.

    An allocation that claims reloaded blocks and then fails its pre-check leaves the request
    holding them (BLIS's behaviour): an admission's caller keeps them for the waiting request
    (``batch._settle_held_blocks``)."""
    bs = st.settings.block_size
    n_cached = jnp.asarray(n_cached, jnp.int32)
    blen = s.batch.blen[i, sb]
    owned = blen > 0
    scan_from = jnp.where(owned & (blen > n_cached), blen, n_cached)
    last = s.batch.bt[i, sb, jnp.maximum(blen - 1, 0)]
    chain_known = ~(owned & (blen > n_cached)) | holds_true_key(s, st, c, i, r, blen - 1, last)
    scan = active & chain_known & (scan_from < c.full_blocks[r])
    s, count = reload_prefix(s, st, c, i, r, scan_from, None, scan)
    reloaded = count > 0
    now = cached_blocks(s, st, c, i, r)
    new_start = now.count * bs
    first = jnp.where(owned, (start + bs - 1) // bs, 0)
    plain = active & (~reloaded | (new_start <= start))
    claim_only = active & reloaded & (new_start > start) & (new_start >= end)
    partial = active & reloaded & (new_start > start) & (new_start < end)
    # claim only: the reloaded blocks cover the range, no pre-check
    end_block = jnp.minimum((end + bs - 1) // bs, now.count)
    s = claim_cached(s, st, i, sb, now.blocks, jnp.maximum(end_block - first, 0),
                     claim_only & (~owned | (first < end_block)), first)
    s = claim_cached(s, st, i, sb, now.blocks, jnp.maximum(new_start // bs - first, 0),
                     partial, first)
    a_start = jnp.where(partial, new_start, start)
    pre_cached = jnp.where(partial, now.blocks, cached)
    pre_n = jnp.where(partial, now.count, n_cached)
    fits = can_allocate(s, st, c, i, sb, r, start=a_start, end=end, cached=pre_cached,
                        n_cached=pre_n)
    grant = (plain | partial) & fits
    claim_first = plain & grant & (s.batch.blen[i, sb] == 0) & (end > start) & (n_cached > 0)
    s = claim_cached(s, st, i, sb, cached, n_cached, claim_first)
    s = allocate(s, st, c, i, sb, r, start=a_start, end=end, cached=jnp.zeros(1, jnp.int32),
                 n_cached=0, active=grant, chunk=chunk)
    ok = claim_only | grant
    s = s.replace(tier=kvtier.missed(s.tier, i, active & ~ok & ~reloaded))
    return s, TieredOutcome(ok, count)
