"""The two indexes over one lane's KV blocks that the KV-cache operations (``kvcache``) work
on: the free list, a ring of keys, and the hash slots, with their primitive operations (pop,
take, append; slot of a block, ordered slot writes).

Counterpart: the free list of ``blisjax.reference.kvcache.KVCache`` (``_unlink``,
``_append_tail``, ``_pop_free``, ``free_list``) and its ``hash_to_block`` map (behaviour:
docs/semantics.md §3).

* **Free list.** The reference keeps a doubly linked LRU list: allocation pops the head, release
  appends to the tail, claiming a cached free block unlinks it from the middle. Here every
  append gets the next *key* of an instance-wide counter and is written to a ring buffer
  ``fifo[key % R]``; ``fkey[block]`` holds the key of the block's live entry (-1 while the block
  is in use). Free blocks ordered by key are exactly the reference's list, head first. Unlinking
  from the middle is lazy (``fkey = -1`` leaves a stale ring entry); popping m blocks reads a
  window from the head and keeps the first m live entries. When stale entries would overflow
  the ring (R = 2·K) it is compacted, renumbering keys from 0 (order kept).
* **Hash slots.** Block hashes are replaced by *hash slots* — dense indices of a block's content
  identity — which the reference's 64-bit chained hashes identify one to one:
  block j of a request in prefix group g, inside the shared prefix → slot (instance, g, j); any
  other full prompt block j of request r → slot ``group_slots + own_base[r] + j`` (with P/D
  pools, whose sub-requests hold a request's blocks on two instances, one such range per
  instance: ``+ i·own_slots``). Blocks
  holding output tokens are never looked up, so they are not registered — except, with
  closed-loop sessions, a block its session shares (``engine.sessions``): block j of a request
  of session s on instance i → slot ``group_slots + (i·S + s)·Js + j``, own slots after those.
  ``slot_block[slot]`` plays ``hash_to_block``: registration overwrites, and reusing a block
  clears the slot it was registered under whatever block that slot now points to (as BLIS
  deletes by hash value). One allocation may write a slot several times (clear, then register);
  ``apply_slot_ops`` resolves such writes in sequence order with a persistent per-slot
  "last write" stamp, so the result never depends on scatter order.

Writes are masked as in ``kvcache`` (``active``, ``mask``): masked scatters send their writes
out of bounds with ``mode="drop"``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.state import NIL, SimState
from blisjax.engine.vec import prefix_sum

KEY_LIMIT = 1 << 30  # ring keys are renumbered from 0 before they could overflow int32


def ring_size(st) -> int:
    return max(2 * st.kv_blocks, 1)


class FreeList(NamedTuple):
    """One instance's free list (``SimState`` fields of the same names, one row)."""

    fifo: jax.Array  # int32 [R]: ring of block ids
    fkey: jax.Array  # int32 [K]: ring key of each block's live entry, -1 = in use
    fhead: jax.Array  # int32: key of the head
    ftail: jax.Array  # int32: next key to append
    kv_free: jax.Array  # int32: free blocks


def empty_free_list(st) -> FreeList:
    """An instance's free list with every block free, in id order: blocks 0 .. K-1 under keys
    0 .. K-1 (the initial state, and a new instance in a reused slot)."""
    k, ring = st.kv_blocks, ring_size(st)
    return FreeList(fifo=jnp.where(jnp.arange(ring) < k, jnp.arange(ring), NIL).astype(jnp.int32),
                    fkey=jnp.arange(k, dtype=jnp.int32), fhead=jnp.asarray(0, jnp.int32),
                    ftail=jnp.asarray(k, jnp.int32), kv_free=jnp.asarray(k, jnp.int32))


# ---- free list (ring of keys) ---------------------------------------------------------------


def pop_blocks(s: SimState, st, i, m, active, max_count: int):
    """Take the ``m`` least recently freed blocks of instance i (``m <= max_count``).

    Returns ``(state, blocks[max_count], taken[max_count])``: ``blocks[k]`` for ``k < m`` in
    LRU order. The blocks leave the free list; their hash slots are *not* touched here (the
    caller orders those writes with its registrations, see ``apply_slot_ops``).
    """
    m = jnp.where(active, m, 0).astype(jnp.int32)
    run = free_run(s, st, i, m, max_count)
    return take_run(s, i, run, m, active), run.blocks, jnp.arange(max_count) < m


class FreeRun(NamedTuple):
    """The first free blocks of an instance, head first (``free_run``); nothing is taken."""

    blocks: jax.Array  # int32 [max_count]: the blocks, -1 past the last one found
    positions: jax.Array  # int32 [max_count]: their ring keys
    kept_from: jax.Array  # int32: ring key of the first block in ``keep`` that the scan met
    #                       (int32 max: none)


def free_run(s: SimState, st, i, m, max_count: int, keep=None) -> FreeRun:
    """The ``m`` (<= ``max_count``) least recently freed blocks of instance i outside ``keep``
    (bool [K]; None: every block), reading windows of the ring from its head."""
    r_size, k_blocks = ring_size(st), st.kv_blocks
    scan = max(max_count, 16)
    tail = s.ftail[i]
    big = jnp.iinfo(jnp.int32).max

    def cond(carry):
        head, _, _, got, _ = carry
        return (got < m) & (head < tail)  # the second test only guards a corrupt state

    def body(carry, go):
        head, out, at, got, kept = carry
        pos = head + jnp.arange(scan, dtype=jnp.int32)
        blk = s.fifo[i, pos % r_size]
        safe = jnp.clip(blk, 0, k_blocks - 1)
        live = (pos < tail) & (blk >= 0) & (s.fkey[i, safe] == pos)
        if keep is not None:
            kept = jnp.where(go, jnp.minimum(kept, jnp.min(jnp.where(live & keep[safe], pos,
                                                                          big))), kept)
            live = live & ~keep[safe]
        rank = got + prefix_sum(live) - 1
        take = go & live & (rank < m)
        dest = jnp.where(take, rank, max_count)
        n_take = jnp.sum(take, dtype=jnp.int32)
        return (jnp.where(go, head + scan, head).astype(jnp.int32),
                out.at[dest].set(blk, mode="drop"), at.at[dest].set(pos, mode="drop"),
                (got + n_take).astype(jnp.int32), kept)

    none = jnp.full(max_count, NIL, jnp.int32)
    init = (s.fhead[i], none, none, jnp.asarray(0, jnp.int32), jnp.asarray(big, jnp.int32))
    _, blocks, positions, _, kept = lane_while(cond, body, init)
    return FreeRun(blocks, positions, kept)


def take_run(s: SimState, i, run: FreeRun, m, active) -> SimState:
    """Take the first ``m`` blocks of ``run`` off instance i's free list. The head moves past
    the last of them, or stops at the first kept block before it (kept blocks stay where they
    are, as the reference's ``_pop_free(keep)`` passes over them)."""
    m = jnp.where(active, m, 0)
    taken = jnp.arange(run.blocks.shape[0]) < m
    last = run.positions[jnp.maximum(m - 1, 0)]
    head = jnp.minimum(run.kept_from, last + 1)
    return s.replace(
        fkey=s.fkey.at[i, jnp.where(taken, run.blocks, s.fkey.shape[1])].set(NIL, mode="drop"),
        fhead=upd(s.fhead, i, head, m > 0),
        kv_free=add(s.kv_free, i, -m, active))


def _compact(s: SimState, st, i, go) -> SimState:
    """Rewrite instance i's ring with only live entries, keys renumbered 0, 1, … (order kept)."""
    r_size, k_blocks = ring_size(st), st.kv_blocks
    pos = s.fhead[i] + jnp.arange(r_size, dtype=jnp.int32)
    blk = s.fifo[i, pos % r_size]
    live = go & (pos < s.ftail[i]) & (blk >= 0) \
        & (s.fkey[i, jnp.clip(blk, 0, k_blocks - 1)] == pos)
    key = jnp.cumsum(live.astype(jnp.int32)) - 1
    row = jnp.full(r_size, NIL, jnp.int32).at[jnp.where(live, key, r_size)].set(blk, mode="drop")
    return s.replace(
        fifo=s.fifo.at[i].set(jnp.where(go, row, s.fifo[i])),
        fkey=s.fkey.at[i, jnp.where(live, blk, k_blocks)].set(key, mode="drop"),
        fhead=upd(s.fhead, i, 0, go),
        ftail=upd(s.ftail, i, jnp.sum(live, dtype=jnp.int32), go))


def append_blocks(s: SimState, st, i, blocks, mask) -> SimState:
    """Append ``blocks[k]`` where ``mask[k]``, in order, to instance i's free-list tail."""
    r_size, k_blocks = ring_size(st), st.kv_blocks
    count = jnp.sum(mask, dtype=jnp.int32)
    full = (s.ftail[i] - s.fhead[i] + count > r_size) | (s.ftail[i] + count > KEY_LIMIT)
    s = lane_once(full, lambda s, go: _compact(s, st, i, go), s)
    key = s.ftail[i] + prefix_sum(mask) - 1
    return s.replace(
        fifo=s.fifo.at[i, jnp.where(mask, key % r_size, r_size)].set(blocks, mode="drop"),
        fkey=s.fkey.at[i, jnp.where(mask, blocks, k_blocks)].set(key, mode="drop"),
        ftail=s.ftail.at[i].add(count),
        kv_free=s.kv_free.at[i].add(count))


def free_list(s: SimState, st, i):
    """Instance i's free blocks head first (host-side helper for tests; not jittable)."""
    import numpy as np

    fifo, fkey = np.asarray(s.fifo[i]), np.asarray(s.fkey[i])
    head, tail = int(s.fhead[i]), int(s.ftail[i])
    r_size = ring_size(st)
    out = []
    for pos in range(head, tail):
        b = int(fifo[pos % r_size])
        if 0 <= b < st.kv_blocks and int(fkey[b]) == pos:
            out.append(b)
    return out


# ---- hash slots --------------------------------------------------------------------------------


def hash_slot(st, c, i, r, j):
    """Dense slot of block j of request r on instance i (valid for full prompt blocks, and
    with closed-loop sessions for the blocks its session shares)."""
    in_group = j < c.group_blocks[r]
    group_slot = (i * st.num_groups + jnp.maximum(c.group[r], 0)) * st.group_blocks_max + j
    own = st.group_slots + st.session_slots + c.own_base[r] + j
    if st.own_per_instance:
        own = own + i * st.own_slots
    if st.sessions:  # a session's blocks: per (instance, session, block)
        shared = st.group_slots + (i * st.num_sessions + jnp.maximum(c.session[r], 0)) \
            * st.session_blocks_max + j
        own = jnp.where(j < c.session_blocks[r], shared, own)
    return jnp.where(in_group, group_slot, own)


def apply_slot_ops(s: SimState, st, slots, values, seq, mask) -> SimState:
    """Write ``slot_block[slots[k]] = values[k]`` where ``mask``, as if in increasing ``seq``
    order (``seq >= 0``, distinct among masked entries): the last write to a slot wins whatever
    order the scatter applies duplicates in. Stamps are ``slot_clock + seq``; the clock then
    moves past the largest stamp used, so later calls always win over earlier ones."""
    sink = st.hash_slots
    stamp = s.slot_clock + seq.astype(jnp.int64)
    target = jnp.where(mask, slots, sink)
    slot_seq = s.slot_seq.at[target].max(jnp.where(mask, stamp, -1))
    win = mask & (slot_seq[target] == stamp)
    return s.replace(slot_seq=slot_seq,
                     slot_block=s.slot_block.at[jnp.where(win, slots, sink)].set(values),
                     slot_clock=jnp.maximum(s.slot_clock, jnp.max(jnp.where(mask, stamp + 1, 0))))
