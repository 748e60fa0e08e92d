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
  ``apply_slot_ops`` resolves such writes in sequence order (pairwise within a small call,
  else with a persistent per-slot "last write" stamp), so the result never depends on
  scatter order.

Writes are masked as in ``kvcache`` (``active``, ``mask``): masked scatters send their writes
out of bounds with ``mode="drop"``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import add, lane_once, lane_while, upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import DEFERRED_RELEASES, NIL, SimState
from blisjax.engine.vec import prefix_sum

KEY_LIMIT = 1 << 30  # ring keys are renumbered from 0 before they could overflow int32


def ring_size(st) -> int:
    return max(2 * st.shapes.kv_blocks, 1)


class FreeList(NamedTuple):
    """One instance's free list (``SimState`` fields of the same names, one row)."""

    fifo: jax.Array  # int32 [R]: ring of block ids
    fkey: jax.Array  # int32 [K]: ring key of each block's live entry, -1 = in use
    fhead: jax.Array  # int32: key of the head
    ftail: jax.Array  # int32: next key to append
    kv_free: jax.Array  # int32: free blocks


def capacity(s: SimState, st):
    """KV blocks of each instance: the lane's own (``KVState.capacity``, int32 [I]) where
    lanes have their own settings (``EngineStatic.features.lane_settings``), int32 [I] where
    P/D pools' caches differ in size (``EngineStatic.settings.instance_kv_blocks``), the int
    ``kv_blocks`` otherwise."""
    if st.features.lane_settings:
        return s.kv.capacity
    if st.settings.instance_kv_blocks:
        return jnp.asarray(st.settings.instance_kv_blocks, jnp.int32)
    return st.shapes.kv_blocks


def capacity_of(s: SimState, st, i):
    """KV blocks of instance i (``capacity``)."""
    if st.features.lane_settings or st.settings.instance_kv_blocks:
        return capacity(s, st)[i]
    return st.shapes.kv_blocks


def empty_free_list(st, blocks=None) -> FreeList:
    """An instance's free list with every block free, in id order: blocks 0 .. n-1 under keys
    0 .. n-1 (the initial state, and a new instance in a reused slot); n = ``blocks``, the
    instance's capacity (default K; the blocks past it are never free)."""
    k, ring = st.shapes.kv_blocks, ring_size(st)
    n = k if blocks is None else blocks
    return FreeList(fifo=jnp.where(jnp.arange(ring) < n, jnp.arange(ring), NIL).astype(jnp.int32),
                    fkey=jnp.where(jnp.arange(k) < n, jnp.arange(k), NIL).astype(jnp.int32),
                    fhead=jnp.asarray(0, jnp.int32), ftail=jnp.asarray(n, jnp.int32),
                    kv_free=jnp.asarray(n, jnp.int32))


@pytree_dataclass
class KVState:
    """Each instance's KV cache (``KVCache``): blocks, free list and the hash slots of all
    instances, and the releases this step's completions queued (``kvcache.defer_release``).
    Shapes: I instances, K blocks, R = 2K ring keys, S hash slots (+1 sink), D deferred
    releases."""

    kv_ref: jax.Array  # int32 [I, K]: refcount (in use iff > 0)
    kv_tok: jax.Array  # int32 [I, K]: tokens in the block
    kv_slot: jax.Array  # int32 [I, K]: hash slot registered for the block, -1 = none
    fifo: jax.Array  # int32 [I, R]: free-list ring of block ids
    fkey: jax.Array  # int32 [I, K]: ring key of the block's live entry, -1 = in use
    fhead: jax.Array  # int32 [I]: key of the free-list head (entries before it are consumed)
    ftail: jax.Array  # int32 [I]: next key to append
    kv_free: jax.Array  # int32 [I]: free blocks
    slot_block: jax.Array  # int32 [S+1]: hash slot -> block (-1 = absent); last entry a sink
    slot_seq: jax.Array  # int64 [S+1]: stamp of the last write to the slot (apply_slot_ops)
    slot_clock: jax.Array  # int64: next stamp
    rel_inst: jax.Array  # int32: the instance of the queued releases
    rel_slots: jax.Array  # int32 [D]: their batch slots, in completion order
    rel_count: jax.Array  # int32: releases queued
    capacity: jax.Array | None  # int32 [I]: each instance's blocks where lanes have their
    #                             own settings (``capacity``), else None


def init_kv(st, blocks=None) -> KVState:
    """Every block free in id order (``empty_free_list``), no hash slot registered.
    ``blocks``: with lane settings (``EngineStatic.features.lane_settings``) the lane's blocks
    per instance (``static.lane_settings_run``)."""
    i, k = st.shapes.num_instances, st.shapes.kv_blocks
    own = None
    if st.settings.instance_kv_blocks:  # each instance's own capacity (P/D pools)
        per = jnp.asarray(st.settings.instance_kv_blocks, jnp.int32)
        own = per if st.features.lane_settings else own
        free = jax.vmap(lambda n: empty_free_list(st, n))(per)
    elif st.features.lane_settings:  # the lane's
        own = jnp.full(i, k if blocks is None else blocks, jnp.int32)
        free = jax.tree.map(lambda x: jnp.broadcast_to(x, (i, *x.shape)),
                            empty_free_list(st, own[0]))
    else:
        free = jax.tree.map(lambda x: jnp.broadcast_to(x, (i, *x.shape)), empty_free_list(st))
    i32 = jnp.int32
    return KVState(
        kv_ref=jnp.zeros((i, k), i32), kv_tok=jnp.zeros((i, k), i32),
        kv_slot=jnp.full((i, k), NIL, i32),
        **free._asdict(),
        slot_block=jnp.full(st.hash_slots + 1, NIL, i32),
        slot_seq=jnp.full(st.hash_slots + 1, -1, jnp.int64), slot_clock=jnp.asarray(0, jnp.int64),
        rel_inst=jnp.asarray(0, i32), rel_slots=jnp.zeros(DEFERRED_RELEASES, i32),
        rel_count=jnp.asarray(0, i32), capacity=own)


def reset_instance(kv: KVState, st, i, active) -> KVState:
    """Instance i's blocks as a new instance's where ``active``: every block free in id order,
    none registered, and its prefix groups' and sessions' hash slots cleared."""
    if st.features.lane_settings:
        free = empty_free_list(st, kv.capacity[i])
    elif st.settings.instance_kv_blocks:
        free = empty_free_list(st, jnp.asarray(st.settings.instance_kv_blocks, jnp.int32)[i])
    else:
        free = empty_free_list(st)
    g = st.shapes.num_groups * st.shapes.group_blocks_max
    mine = jnp.arange(st.group_slots) // max(g, 1) == i  # the instance's group hash slots
    shared = st.group_slots + st.session_slots  # and its sessions' (engine.sessions)
    if st.features.sessions:
        per = st.shapes.num_sessions * st.shapes.session_blocks_max
        mine = jnp.concatenate([mine, jnp.arange(st.session_slots) // per == i])
    return kv.replace(
        kv_ref=upd(kv.kv_ref, i, 0, active), kv_tok=upd(kv.kv_tok, i, 0, active),
        kv_slot=upd(kv.kv_slot, i, NIL, active), fifo=upd(kv.fifo, i, free.fifo, active),
        fkey=upd(kv.fkey, i, free.fkey, active),
        fhead=upd(kv.fhead, i, free.fhead, active), ftail=upd(kv.ftail, i, free.ftail, active),
        kv_free=upd(kv.kv_free, i, free.kv_free, active),
        slot_block=kv.slot_block.at[:shared].set(
            jnp.where(active & mine, NIL, kv.slot_block[:shared])))


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
    r_size, k_blocks = ring_size(st), st.shapes.kv_blocks
    scan = max(max_count, 16)
    tail = s.kv.ftail[i]
    big = jnp.iinfo(jnp.int32).max

    def cond(carry):
        head, _, _, got, _ = carry
        return (got < m) & (head < tail)  # the second test only guards a corrupt state

    def body(carry, go):
        head, out, at, got, kept = carry
        pos = head + jnp.arange(scan, dtype=jnp.int32)
        blk = s.kv.fifo[i, pos % r_size]
        safe = jnp.clip(blk, 0, k_blocks - 1)
        live = (pos < tail) & (blk >= 0) & (s.kv.fkey[i, safe] == pos)
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
    init = (s.kv.fhead[i], none, none, jnp.asarray(0, jnp.int32), jnp.asarray(big, jnp.int32))
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
        kv=s.kv.replace(
            fkey=s.kv.fkey.at[i, jnp.where(taken, run.blocks, s.kv.fkey.shape[1])].set(
                NIL, mode="drop"),
            fhead=upd(s.kv.fhead, i, head, m > 0),
            kv_free=add(s.kv.kv_free, i, -m, active)))


def _compact(s: SimState, st, i, go) -> SimState:
    """Rewrite instance i's ring with only live entries, keys renumbered 0, 1, … (order kept)."""
    r_size, k_blocks = ring_size(st), st.shapes.kv_blocks
    pos = s.kv.fhead[i] + jnp.arange(r_size, dtype=jnp.int32)
    blk = s.kv.fifo[i, pos % r_size]
    live = go & (pos < s.kv.ftail[i]) & (blk >= 0) \
        & (s.kv.fkey[i, jnp.clip(blk, 0, k_blocks - 1)] == pos)
    key = jnp.cumsum(live.astype(jnp.int32)) - 1
    row = jnp.full(r_size, NIL, jnp.int32).at[jnp.where(live, key, r_size)].set(blk, mode="drop")
    return s.replace(
        kv=s.kv.replace(fifo=upd(s.kv.fifo, i, row, go),
                        fkey=s.kv.fkey.at[i, jnp.where(live, blk, k_blocks)].set(key, mode="drop"),
                        fhead=upd(s.kv.fhead, i, 0, go),
                        ftail=upd(s.kv.ftail, i, jnp.sum(live, dtype=jnp.int32), go)))


def append_blocks(s: SimState, st, i, blocks, mask) -> SimState:
    """Append ``blocks[k]`` where ``mask[k]``, in order, to instance i's free-list tail."""
    r_size, k_blocks = ring_size(st), st.shapes.kv_blocks
    count = jnp.sum(mask, dtype=jnp.int32)
    full = (s.kv.ftail[i] - s.kv.fhead[i] + count > r_size) | (s.kv.ftail[i] + count > KEY_LIMIT)
    s = lane_once(full, lambda s, go: _compact(s, st, i, go), s)
    key = s.kv.ftail[i] + prefix_sum(mask) - 1
    return s.replace(
        kv=s.kv.replace(
            fifo=s.kv.fifo.at[i, jnp.where(mask, key % r_size, r_size)].set(blocks, mode="drop"),
            fkey=s.kv.fkey.at[i, jnp.where(mask, blocks, k_blocks)].set(key, mode="drop"),
            ftail=s.kv.ftail.at[i].add(count),
            kv_free=s.kv.kv_free.at[i].add(count)))


def free_list(s: SimState, st, i):
    """Instance i's free blocks head first (host-side helper for tests; not jittable)."""
    import numpy as np

    fifo, fkey = np.asarray(s.kv.fifo[i]), np.asarray(s.kv.fkey[i])
    head, tail = int(s.kv.fhead[i]), int(s.kv.ftail[i])
    r_size = ring_size(st)
    out = []
    for pos in range(head, tail):
        b = int(fifo[pos % r_size])
        if 0 <= b < st.shapes.kv_blocks and int(fkey[b]) == pos:
            out.append(b)
    return out


# ---- hash slots --------------------------------------------------------------------------------


def hash_slot(st, c, i, r, j):
    """Dense slot of block j of request r on instance i (valid for full prompt blocks, and
    with closed-loop sessions for the blocks its session shares)."""
    in_group = j < c.group_blocks[r]
    group_slot = ((i * st.shapes.num_groups + jnp.maximum(c.group[r], 0))
                  * st.shapes.group_blocks_max + j)
    own = st.group_slots + st.session_slots + c.own_base[r] + j
    if st.own_per_instance:
        own = own + i * st.shapes.own_slots
    if st.features.sessions:  # a session's blocks: per (instance, session, block)
        own = jnp.where(j < c.session_blocks[r], session_slot(st, c, i, r, j), own)
    return jnp.where(in_group, group_slot, own)


def session_slot(st, c, i, r, j):
    """Slot j of request r's session on instance i (``EngineStatic.features.sessions``): the hash
    slot of the session's block j; every j < ``session_blocks_max`` has one."""
    return st.group_slots + (i * st.shapes.num_sessions + jnp.maximum(c.session[r], 0)) \
        * st.shapes.session_blocks_max + j


def forget_slots(s: SimState, st, slots, mask) -> SimState:
    """Empty hash slots ``slots`` where ``mask``: writes of one value (-1), equal in any order,
    so unlike ``apply_slot_ops`` no stamps are needed (stamps are compared only among the
    writes of one call, and the clock is already past every stamp kept)."""
    return s.replace(kv=s.kv.replace(slot_block=s.kv.slot_block.at[
        jnp.where(mask, slots, st.hash_slots)].set(NIL)))


PAIRWISE_SLOT_OPS = 64  # most writes of one ``apply_slot_ops`` call resolved pairwise


def apply_slot_ops(s: SimState, st, slots, values, seq, mask) -> SimState:
    """Write ``slot_block[slots[k]] = values[k]`` where ``mask``, as if in increasing ``seq``
    order (``seq >= 0``, distinct among masked entries): the last write to a slot wins whatever
    order the scatter applies duplicates in. Stamps are ``slot_clock + seq``; the clock then
    moves past the largest stamp used, so later calls always win over earlier ones.

    A call of at most ``PAIRWISE_SLOT_OPS`` writes compares them among themselves: a write
    takes effect unless a later one goes to the same slot (an [n, n] comparison). It stores no
    stamp, and the stamps stored stay below the clock, so calls of both kinds interleave."""
    sink = st.hash_slots
    if slots.shape[0] <= PAIRWISE_SLOT_OPS:
        later = (mask[None, :] & (slots[None, :] == slots[:, None])
                 & (seq[None, :] > seq[:, None]))
        win = mask & ~jnp.any(later, axis=1)
        return s.replace(kv=s.kv.replace(
            slot_block=s.kv.slot_block.at[jnp.where(win, slots, sink)].set(values)))
    stamp = s.kv.slot_clock + seq.astype(jnp.int64)
    target = jnp.where(mask, slots, sink)
    slot_seq = s.kv.slot_seq.at[target].max(jnp.where(mask, stamp, -1))
    win = mask & (slot_seq[target] == stamp)
    return s.replace(
        kv=s.kv.replace(
            slot_seq=slot_seq,
            slot_block=s.kv.slot_block.at[jnp.where(win, slots, sink)].set(values),
            slot_clock=jnp.maximum(s.kv.slot_clock, jnp.max(jnp.where(mask, stamp + 1, 0)))))
