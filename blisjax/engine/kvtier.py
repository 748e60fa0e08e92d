"""The CPU tier of the KV cache on one lane: an LRU of block contents per instance, the mirror
pass after every step and the transfer-time bookkeeping.

Counterpart: ``blisjax.reference.kvcache.CpuTier`` and the mirror and counters of
``TieredKVCache`` (behaviour: docs/semantics.md §3.8). The reload itself, which moves GPU
blocks, lives with the other allocation operations in ``kvcache.py``.

* **Keys.** The reference keys the tier by a block's chained hash. Here a hash is a *CPU key*,
  a dense index of a block's content: a full prompt block's key is its hash slot
  (``kvblocks.hash_slot``: per instance for prefix-group blocks, per instance and session for
  a conversation's blocks, output blocks included, per request otherwise); any other block
  holding output tokens gets one of its request's *extension* keys (``WorkloadConsts.ext_base``
  + its position past the full prompt blocks). These *true keys* name a block's content and
  its place on the true chain, as the hash does. A block can get its hash chained from a held
  block of other content, or hold tokens that are not its position's (the reference's
  ``_register`` off the true chain, after a tiered reload: ``kvcache.content_key``): BLIS's
  hash is then a function of the held block's hash and the block's own tokens, and matches no
  prompt's block. Such a block gets an *off-chain* key that is a function of the same two
  things, the held block's key (``origin``) and the block's tokens — a true key t and the
  tokens' shift from t's block start: generation g of t is ``T + g·T + t`` (T true keys),
  where g is the first of t's generations whose recorded origin and shift
  (``KVTierState.off_origin``) are these, or the first unused (``offchain_key``). Off-chain
  chains continue from off-chain keys the same way. Keys of different instances never meet:
  a request only ever runs on one instance.
  ``KVTierState.key_of_block`` is the key registered for each GPU block (-1: no hash).
* **LRU.** Each instance's tier is a ring of keys in recency order, oldest first, with lazy
  deletion as the GPU free list's (``kvblocks.py``): a touch appends the key again and
  ``where[key]`` moves to the new entry's position; an entry is live iff ``where`` of its key
  points at it. The ring is compacted (live entries renumbered from 0, order kept) before an
  append would overflow it.
* **Mirror.** Every access of a mirror pass either touches (key present) or stores (key
  absent, the oldest entry evicted when the tier is full) — an LRU in which every access makes
  its key the most recent. Such an LRU holds the C most recent distinct keys (C its
  capacity), so whether an access finds its key present is a question of *stack distance*: the
  number of distinct keys accessed since the key's previous access must be below C. With the
  tier's entries before the pass taken as earlier accesses in ring order, that gives every
  access's outcome without replaying the pass key by key: usually no key of the pass can be
  evicted before its access, and the stores are its new keys. Otherwise every access of a
  *run* (repeats of a stretch of earlier accesses in order, or first accesses of consecutive
  tier entries) has the same distance, and a pass of few runs — a batch's shared prompt
  chains make few, however many requests share them — is resolved pairwise over its runs
  (``_stores_by_runs``); a pass of more runs takes two dominance counts over its accesses (a
  merge sort, O(W log² W), ``_pass_stores``). The
  tier after the pass is the old ring with the pass's keys appended in order of their last
  access, trimmed to C from the oldest end; keys that already are the newest entries in that
  order stay where they are (``_moved_keys``), so a batch that repeats its pass grows the ring
  only by its new keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import add, after_reads, lane_once, lane_while, upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import NIL
from blisjax.engine.vec import earlier_smaller, prefix_sum

KEY_LIMIT = 1 << 30  # ring positions are renumbered from 0 before they could overflow int32
EVICT_WINDOW = 32  # ring entries read per trip of an eviction
RUN_WIDTH = 64  # runs of accesses a mirror pass resolves pairwise (``_stores_by_runs``)
OFF_UNUSED = -1  # an off-chain generation not yet used (a recorded tag is >= 0, ``_tag``)


@pytree_dataclass
class KVTierState:
    """One lane's CPU tiers and tier counters (``SimState.tier``; one-entry placeholders
    when the program has no CPU tier). Shapes: I instances, Rc ring entries per instance
    (``EngineStatic.cpu_ring``), KEYS CPU keys (+1: a sink), K GPU blocks, N requests (+1)."""

    where: jax.Array  # int32 [KEYS + 1]: ring position of the key's live entry, -1 = absent
    ring: jax.Array  # int32 [I, Rc]: keys in recency order from head (oldest) to tail
    head: jax.Array  # int32 [I]: position of the oldest entry that may be live
    tail: jax.Array  # int32 [I]: next position to append at
    size: jax.Array  # int32 [I]: keys held
    key_of_block: jax.Array  # int32 [I, K]: CPU key of the hash registered for the GPU
    #                          block, -1 = none (the reference's ``block_hash``)
    pending_us: jax.Array  # int64 [I]: transfer time of reloads not yet charged to a step
    reloads: jax.Array  # int64 [I]: blocks reloaded CPU -> GPU (BLIS's cpuHitCount)
    cpu_misses: jax.Array  # int64 [I]: allocations that failed without reloading anything
    mirror_stores: jax.Array  # int64 [I]: keys stored by mirror passes
    evictions: jax.Array  # int64 [I]: keys the full tier dropped
    request_reloads: jax.Array  # int32 [request rows]: blocks reloaded by each row's allocations
    #                             (a P/D prefill sub-request's row: its own)
    evicted_at: jax.Array  # int64 µs [KEYS + 1]: when a GPU block holding the key was last
    #                        taken for other content, -1 = never (the thrashing anomaly)
    thrash_reloads: jax.Array  # int64 [I]: reloads of a key evicted from the GPU less than
    #                            ``EngineStatic.settings.kv_thrash_window_us`` before
    capacity: jax.Array  # int32: this lane's tier size (``PolicyParams.kv_cpu_blocks``)
    pass_mark: jax.Array  # int64 [KEYS + 1]: scratch of ``mirror`` (first and last accesses)
    pass_stamp: jax.Array  # int64: the last mark ``mirror`` used
    reload_us: jax.Array  # int64 µs: one reload's transfer time (``PolicyParams.kv_reload_us``)
    pass_keys: jax.Array  # int32 [I]: distinct keys of the instance's last mirror pass (a
    #                       decode stretch needs the tier to hold them all, ``stretch.plan``)
    off_origin: jax.Array  # int32 [G·T + 1]: the origin key and shift of each off-chain
    #                        generation (``_tag``; ``OFF_UNUSED``: not yet used)
    offchain_overflow: jax.Array  # int32: off-chain keys a lane needed beyond
    #                               ``EngineStatic.shapes.offchain_generations`` (flagged)
    hold_overflow: jax.Array  # int32: queued requests left holding blocks with no free
    #                           ``EngineStatic.shapes.kv_hold_slots`` slot (flagged)


def init_tier(st, capacity=0, reload_us=0) -> KVTierState:
    """Empty tiers of ``capacity`` blocks whose reloads cost ``reload_us`` each (or one-entry
    placeholders when ``st`` has no CPU tier)."""
    on = st.tiered
    n_inst = st.shapes.num_instances if on else 1
    keys = st.cpu_keys if on else 0
    ring = st.cpu_ring if on else 1
    i32, i64 = jnp.int32, jnp.int64
    return KVTierState(
        where=jnp.full(keys + 1, NIL, i32), ring=jnp.full((n_inst, ring), NIL, i32),
        head=jnp.zeros(n_inst, i32), tail=jnp.zeros(n_inst, i32), size=jnp.zeros(n_inst, i32),
        key_of_block=jnp.full((n_inst, st.shapes.kv_blocks if on else 1), NIL, i32),
        pending_us=jnp.zeros(n_inst, i64), reloads=jnp.zeros(n_inst, i64),
        cpu_misses=jnp.zeros(n_inst, i64), mirror_stores=jnp.zeros(n_inst, i64),
        evictions=jnp.zeros(n_inst, i64),
        request_reloads=jnp.zeros(st.request_rows if on else 1, i32),
        evicted_at=jnp.full(keys + 1, -1, i64), thrash_reloads=jnp.zeros(n_inst, i64),
        capacity=jnp.asarray(capacity, i32),
        pass_mark=jnp.full(keys + 1, -1, i64), pass_stamp=jnp.asarray(0, i64),
        reload_us=jnp.asarray(reload_us, i64), pass_keys=jnp.zeros(n_inst, i32),
        off_origin=jnp.full(st.cpu_off_slots + 1 if on else 1, OFF_UNUSED,
                            i32),
        offchain_overflow=jnp.asarray(0, i32), hold_overflow=jnp.asarray(0, i32))


def key_instance(st, key):
    """The instance whose tier CPU key ``key`` belongs to, with keys per instance
    (``EngineStatic.own_per_instance``): the instance of its hash slot (prefix-group, session
    and own slots are laid out instance by instance, ``kvblocks.hash_slot``) or extension key,
    and an off-chain key's true key's."""
    true = st.cpu_true_keys
    t = jnp.where(key < true, key, (key - true) % true)
    groups, sessions = st.group_slots, st.session_slots
    own, ext = groups + sessions, st.hash_slots
    per_group = max(st.shapes.num_groups * st.shapes.group_blocks_max, 1)
    per_session = max(st.shapes.num_sessions * st.shapes.session_blocks_max, 1)
    return jnp.select([t < groups, t < own, t < ext],
                      [t // per_group, (t - groups) // per_session,
                       (t - own) // st.shapes.own_slots],
                      (t - ext) // st.shapes.cpu_ext_slots)


def reset_instance(t: KVTierState, st, i, active) -> KVTierState:
    """A new instance in slot i (``Instance.restart``: a new tiered cache carrying the slot's
    counters): its tier empty, no reload time pending, no GPU eviction remembered."""
    keys = jnp.arange(t.where.shape[0])
    mine = active & (keys < t.where.shape[0] - 1) & (key_instance(st, keys) == i)
    return t.replace(
        where=jnp.where(mine, NIL, t.where), evicted_at=jnp.where(mine, -1, t.evicted_at),
        ring=upd(t.ring, i, NIL, active),
        head=upd(t.head, i, 0, active), tail=upd(t.tail, i, 0, active),
        size=upd(t.size, i, 0, active), pending_us=upd(t.pending_us, i, 0, active),
        pass_keys=upd(t.pass_keys, i, 0, active),
        key_of_block=upd(t.key_of_block, i, NIL, active))


# ---- the ring ----------------------------------------------------------------------------------


def _live(t: KVTierState, i, pos):
    """Whether ring positions ``pos`` of instance i hold live entries; and their keys."""
    r_size = t.ring.shape[1]
    key = t.ring[i, pos % r_size]
    sink = t.where.shape[0] - 1
    live = (pos >= t.head[i]) & (pos < t.tail[i]) & (key >= 0) \
        & (t.where[jnp.where(key >= 0, key, sink)] == pos)
    return live, key


def _compact(t: KVTierState, i, go) -> KVTierState:
    """Rewrite instance i's ring with only its live entries, renumbered 0, 1, … (order kept)."""
    r_size, sink = t.ring.shape[1], t.where.shape[0] - 1
    pos = t.head[i] + jnp.arange(r_size, dtype=jnp.int32)
    live, key = _live(t, i, pos)
    live = live & go
    new = prefix_sum(live) - 1
    row = jnp.full(r_size, NIL, jnp.int32).at[jnp.where(live, new, r_size)].set(key, mode="drop")
    return t.replace(
        ring=upd(t.ring, i, row, go),
        where=t.where.at[jnp.where(live, key, sink)].set(new, mode="drop"),
        head=upd(t.head, i, 0, go),
        tail=upd(t.tail, i, jnp.sum(live, dtype=jnp.int32), go))


def append(t: KVTierState, i, keys, mask) -> KVTierState:
    """Make ``keys[k]`` (where ``mask``; distinct) the most recent keys of instance i's tier,
    in k order: a touch for a present key, an insertion for an absent one (``size`` is the
    caller's to update)."""
    r_size, sink = t.ring.shape[1], t.where.shape[0] - 1
    count = jnp.sum(mask, dtype=jnp.int32)
    full = (t.tail[i] - t.head[i] + count > r_size) | (t.tail[i] + count > KEY_LIMIT)
    t = lane_once(full, lambda t, go: _compact(t, i, go), t)
    pos = t.tail[i] + prefix_sum(mask) - 1
    return t.replace(
        ring=t.ring.at[i, jnp.where(mask, pos % r_size, r_size)].set(keys, mode="drop"),
        where=t.where.at[jnp.where(mask, keys, sink)].set(pos, mode="drop"),
        tail=t.tail.at[i].add(count))


def evict_oldest(t: KVTierState, i, m, active) -> KVTierState:
    """Drop the ``m`` oldest keys of instance i's tier (``size`` is the caller's)."""
    sink = t.where.shape[0] - 1
    m = jnp.where(active, m, 0).astype(jnp.int32)

    def body(carry, go):
        t, got = carry
        pos = t.head[i] + jnp.arange(EVICT_WINDOW, dtype=jnp.int32)
        live, key = _live(t, i, pos)
        rank = got + prefix_sum(live) - 1
        take = go & live & (rank < m)
        n_take = jnp.sum(take, dtype=jnp.int32)
        last = jnp.max(jnp.where(take, pos, -1))
        head = jnp.where(got + n_take >= m, last + 1, t.head[i] + EVICT_WINDOW)
        t = t.replace(where=t.where.at[jnp.where(take, key, sink)].set(NIL, mode="drop"),
                      head=upd(t.head, i, head.astype(jnp.int32), go))
        return t, got + n_take

    t, _ = lane_while(lambda carry: (carry[1] < m) & (carry[0].head[i] < carry[0].tail[i]),
                      body, (t, jnp.asarray(0, jnp.int32)))
    return t


def missed(t: KVTierState, i, go) -> KVTierState:
    """A tiered allocation on instance i failed without reloading a block (a CPU miss)."""
    return t.replace(cpu_misses=add(t.cpu_misses, i, 1, go))


def hold_overflowed(t: KVTierState, mask) -> KVTierState:
    """A refused admission kept blocks but found no holder slot (where ``mask``): flagged."""
    return t.replace(hold_overflow=t.hold_overflow + mask.astype(jnp.int32))


def reload_time_taken(t: KVTierState, i, go) -> KVTierState:
    """Instance i's step added its pending reload time (``pending_us``) where ``go``."""
    return t.replace(pending_us=upd(t.pending_us, i, 0, go))


def keyed_blocks(t: KVTierState, key_of_block) -> KVTierState:
    """The keys registered for the GPU blocks (``key_of_block`` [I, K]) after a decode
    stretch filled some."""
    return t.replace(key_of_block=key_of_block)


def note_evictions(t: KVTierState, keys, mask, now) -> KVTierState:
    """GPU blocks holding ``keys`` (where ``mask`` and the key is >= 0) were taken for other
    content at ``now`` (µs; a scalar or one time per key) (``TieredKVCache._evicted``)."""
    sink = t.where.shape[0] - 1
    return t.replace(evicted_at=t.evicted_at.at[jnp.where(mask & (keys >= 0), keys, sink)]
                     .set(now, mode="drop"))


def holds(t: KVTierState, key):
    """Whether the tier holds ``key`` (any shape; negative keys are never held)."""
    sink = t.where.shape[0] - 1
    return (key >= 0) & (t.where[jnp.where(key >= 0, key, sink)] >= 0)


# ---- off-chain keys ------------------------------------------------------------------------------


def _tag(st, origin, shift):
    """What an off-chain generation records: its origin key (-1: a held block without a hash)
    and its content's shift (0 for a block at a multiple of the block size), as one int32."""
    return (origin + 1) * st.settings.block_size + shift


def offchain_key(t: KVTierState, st, origin, true_key, go, shift=0):
    """``(tier, key)``: the off-chain key of a block whose hash chains from a held block of key
    ``origin`` (-1: no hash) and whose content is true key ``true_key``'s, or with ``shift`` >
    0 the tokens ``shift`` positions past the start of the block before ``true_key``'s (a
    misaligned block: ``kvcache.content_key``) — the generation of ``true_key`` that recorded
    this origin and shift, else the first unused one, which records them (where ``go``). When
    every generation holds another the lane is flagged (``offchain_overflow``) and the last
    generation's key stands in."""
    n_true = st.cpu_true_keys
    gens = jnp.arange(st.shapes.offchain_generations, dtype=jnp.int32)
    row = t.off_origin[gens * n_true + true_key]
    origin = _tag(st, origin, shift)
    seen, unused = row == origin, row == OFF_UNUSED
    gen = jnp.where(jnp.any(seen), jnp.argmax(seen),
                    jnp.where(jnp.any(unused), jnp.argmax(unused), gens[-1])).astype(jnp.int32)
    record = go & ~jnp.any(seen) & jnp.any(unused)
    sink = t.off_origin.shape[0] - 1
    t = t.replace(
        off_origin=t.off_origin.at[jnp.where(record, gen * n_true + true_key, sink)].set(
            origin, mode="drop"),
        offchain_overflow=t.offchain_overflow
        + (go & ~jnp.any(seen) & ~jnp.any(unused)).astype(jnp.int32))
    return t, n_true + gen * n_true + true_key


def chain_offchain(t: KVTierState, st, i, prev_block, block, true_key, need,
                   shift=None) -> KVTierState:
    """Give GPU block ``block[k]`` of instance i, for every k where ``need``, in k order, the
    off-chain key of true key ``true_key[k]`` (and ``shift[k]``, ``offchain_key``) chained
    from the key ``prev_block[k]`` holds when its turn comes (an earlier entry may have just
    given it one: the fresh blocks of one allocation chain from each other); ``prev_block[k]``
    < 0: no block before it. One entry per trip: off-chain hashes arise only where a tiered
    allocation left a request's blocks off their positions or chained from other content
    (``blis_quirks``), rarely."""
    if shift is None:
        shift = jnp.zeros_like(true_key)
    count = jnp.sum(need, dtype=jnp.int32)
    order = jnp.argsort(~need, stable=True).astype(jnp.int32)  # the needed entries first
    k_blocks = t.key_of_block.shape[1]

    def body(carry, go):
        t, k = carry
        e = order[k]
        origin = jnp.where(prev_block[e] >= 0,
                           t.key_of_block[i, jnp.clip(prev_block[e], 0, k_blocks - 1)], NIL)
        t, key = offchain_key(t, st, origin, true_key[e], go, shift[e])
        t = t.replace(key_of_block=upd(t.key_of_block, (i, jnp.clip(block[e], 0, k_blocks - 1)),
                                       key, go))
        return t, k + go.astype(jnp.int32)

    def run(t, go):
        todo = jnp.where(go, count, 0)
        return lane_while(lambda carry: carry[1] < todo, body,
                          (t, jnp.asarray(0, jnp.int32)))[0]

    return lane_once(count > 0, run, t)


# ---- mirror (GPU -> CPU) ---------------------------------------------------------------------


def mirror(t: KVTierState, i, keys, valid, active) -> KVTierState:
    """One mirror pass of instance i (``TieredKVCache.mirror``): ``keys[k]`` where ``valid``,
    in k order (the running batch's full hashed blocks, requests in batch order, each
    request's blocks in order; repeats allowed). A lane whose tier size is 0 has none.

    Stores are the accesses that do not find their key. Usually no key of the pass can be
    evicted before its access: the evictions a pass causes (its new keys beyond the free
    room) take the oldest entries, and entries older than every key of the pass that the
    tier holds are never touched by it. Then every held key and every repeat is found, the
    stores are the new keys, and two scatters over a key-indexed mark find each key's first and
    last access. Otherwise (a tier smaller than the pass's working set) ``_pass_stores``
    resolves each access from its stack distance."""
    width = keys.shape[0]
    capacity = t.capacity
    valid = valid & active & (capacity > 0)
    sink = t.where.shape[0] - 1
    k = jnp.where(valid, keys, sink)
    idx = jnp.arange(width, dtype=jnp.int64)
    # first and last access of each key: scatter-max of (pass stamp, -position), then of
    # (next stamp, position); older passes' marks are smaller
    shift = jnp.int64(1) << 32
    first_mark = (t.pass_stamp + 1) * shift + (width - idx)
    last_mark = (t.pass_stamp + 2) * shift + idx
    # (each read of a mark, the ring or ``where`` feeds the next write of that array, so that
    # XLA updates them in place: ``lockstep.after_reads``)
    mark = t.pass_mark.at[k].max(jnp.where(valid, first_mark, -1))
    seen = mark[k]
    first = valid & (seen == first_mark)
    mark = mark.at[k].max(after_reads(jnp.where(valid, last_mark, -1), seen))
    is_last = valid & (mark[k] == last_mark)
    t = t.replace(pass_mark=mark, pass_stamp=t.pass_stamp + jnp.where(active, 2, 0))
    where = jnp.where(valid, t.where[k], NIL)
    held = first & (where >= 0)
    r_size = t.ring.shape[1]
    ring_pos = t.head[i] + jnp.arange(r_size, dtype=jnp.int32)
    live_through = prefix_sum(_live(t, i, ring_pos)[0])  # live entries at or before each
    older = live_through[jnp.clip(where - t.head[i], 0, r_size - 1)] - 1
    size0 = t.size[i]
    new_keys = jnp.sum(first & ~held, dtype=jnp.int32)
    grown = size0 + new_keys
    untouched = jnp.min(jnp.where(held, older, size0))  # entries older than any held key
    simple = jnp.maximum(grown - capacity, 0) <= untouched
    exact = active & ~simple & jnp.any(valid)
    if width > RUN_WIDTH:
        def by_runs(carry, go):
            got, fits = _stores_by_runs(t, i, keys, valid, first, where, older)
            return jnp.where(go & fits, got, carry[0]), go & fits

        stores, done = lane_once(exact, by_runs, (new_keys, jnp.asarray(False)))
        exact = exact & ~done
    else:
        stores = new_keys
    stores = lane_once(exact, lambda stores, go: jnp.where(go, _pass_stores(
        t, i, keys, valid, first, where, live_through), stores), stores)
    # the pass's reads of the ring and ``where`` (``held``, ``older``) all feed ``stores``
    moved = _moved_keys(is_last, where, older, size0)
    t = append(t, i, jnp.where(moved, keys, 0), after_reads(moved, stores))
    size = jnp.minimum(grown, capacity)
    t = evict_oldest(t, i, grown - size, active)
    return t.replace(
        size=upd(t.size, i, size, active),
        pass_keys=upd(t.pass_keys, i, jnp.sum(first, dtype=jnp.int32), active),
        mirror_stores=add(t.mirror_stores, i, stores, active),
        evictions=add(t.evictions, i, stores - (size - size0), active))


def _moved_keys(is_last, where, older, size0):
    """The last accesses of the pass's keys that must be appended (bool, like ``is_last``):
    all but the first m keys in order of last access when those m already are the tier's
    newest entries in that order (oldest first) — appending them again would leave the
    recency order as it is, so the ring grows by the others alone. ``older``: live entries
    older than each access's key."""
    rank = prefix_sum(is_last) - 1  # each key's place by last access (at its last access)
    held = is_last & (where >= 0)
    m = 1 + jnp.max(jnp.where(held & (older == size0 - 1), rank, -1))
    in_tail = is_last & (rank < m)
    kept = jnp.all(~in_tail | (held & (older - rank == size0 - m)))
    return is_last & (rank >= jnp.where(kept, m, 0))


def _previous_access(keys, valid, sink: int):
    """Position of the previous access of each access's key (int32, -1: its first; invalid
    accesses -1): neighbours in (key, position) order. ``sink``: above every key."""
    width = keys.shape[0]
    c = jnp.arange(width, dtype=jnp.int32)
    order = jnp.argsort(jnp.where(valid, keys, sink).astype(jnp.int64) * width + c)
    order = order.astype(jnp.int32)
    k_sorted = jnp.where(valid, keys, -1)[order]
    prev_sorted = jnp.where((c > 0) & (k_sorted >= 0) & (k_sorted == jnp.roll(k_sorted, 1)),
                            jnp.roll(order, 1), -1)
    return jnp.zeros(width, jnp.int32).at[order].set(prev_sorted)


def _stores_by_runs(t: KVTierState, i, keys, valid, first, where, older):
    """Stores of a mirror pass whose accesses form at most ``RUN_WIDTH`` runs, and whether
    they do (int32, bool). Same outcomes as ``_pass_stores``, resolved per run of accesses
    rather than per access (docs/semantics.md §3.8 states the LRU; the derivation follows).

    Take the valid accesses in order, positions 0..n-1, and ``prev[t]`` the previous access
    of t's key (-1: its first). A *run* is a maximal stretch of accesses of one kind:
    repeats each of whose previous access is one past the previous one's
    (``prev[t] = prev[t-1] + 1``), first accesses of keys the tier lacks, or first accesses
    of held keys each one entry newer in the tier than the one before (``older``: live
    entries older than the key). Every access of a run has the same outcome:

    * repeats: the distinct keys accessed strictly between ``prev[t]`` and t lose
      ``key[prev[t] + 1]`` and gain ``key[prev[t]]`` as both ends move on by one, so the
      stack distance stays;
    * held first accesses: the keys newer than the next one in the tier drop by one, the
      pass's distinct keys before it grow by one, and no earlier access touched an entry
      between the two;
    * first accesses of absent keys are stores.

    For a repeat run r starting at t with p = prev[t] (p + 1 < t), let b be the run holding
    position p + 1. A run u strictly between b and r has all its previous accesses on one
    side of p (one equal to p would be key[p]'s next access before t), so it counts whole
    or not at all; runs up to b all lie at or before p except b's tail, whose accesses count
    where their previous access precedes p. Hence ``distinct = sum over u < r of L_u·[q_u <
    p] - end(b) + b's counted tail`` (L_u: run length, q_u: previous access of its first
    access, -1 for first accesses). A held first run's keys newer than it that the pass
    touched before are counted from the held runs before it, whose tier positions are
    consecutive. With at most ``RUN_WIDTH`` runs both sums are pairwise over runs. A pass
    whose keys are prompt chains shared by the batch's requests has few runs (a few per
    request), however many accesses."""
    width = keys.shape[0]
    capacity = t.capacity
    n = jnp.sum(valid, dtype=jnp.int32)
    dest = jnp.where(valid, prefix_sum(valid) - 1, width)

    def compact(x, fill):  # valid accesses first, in order
        return jnp.full(width, fill, x.dtype).at[dest].set(x, mode="drop")

    key = compact(keys, -1)
    is_first = compact(first, False)
    held = compact(first & (where >= 0), False)
    rank = compact(older.astype(jnp.int32), 0)
    c = jnp.arange(width, dtype=jnp.int32)
    on = c < n
    prev = _previous_access(key, on, t.where.shape[0])

    def after(x):  # x of the access before (False / 0 at position 0)
        return jnp.concatenate([jnp.zeros(1, x.dtype), x[:-1]])

    repeat = on & ~is_first
    fresh = is_first & ~held
    goes_on = ((repeat & after(repeat) & (prev == after(prev) + 1))
               | (fresh & after(fresh))
               | (held & after(held) & (rank == after(rank) + 1)))
    start = on & ~goes_on
    run_of = prefix_sum(start) - 1
    fits = jnp.sum(start, dtype=jnp.int32) <= RUN_WIDTH
    # per run (unused runs start at n and are empty)
    r = jnp.arange(RUN_WIDTH, dtype=jnp.int32)
    begin = jnp.full(RUN_WIDTH, n, jnp.int32).at[jnp.where(start, run_of, RUN_WIDTH)].set(
        c, mode="drop")
    end = jnp.concatenate([begin[1:], n[None]])
    length = end - begin
    at = jnp.minimum(begin, width - 1)
    q = jnp.where(length > 0, prev[at], -1)
    is_repeat = q >= 0
    is_held = held[at] & (length > 0)
    r_rank = rank[at]
    earlier = r[None, :] < r[:, None]  # [run, earlier run]
    # repeat runs: distinct keys since the previous access
    counted = jnp.sum(jnp.where(earlier & (q[None, :] < q[:, None]), length[None, :], 0),
                      axis=1)
    b = jnp.clip(run_of[jnp.clip(q + 1, 0, width - 1)], 0, RUN_WIDTH - 1)
    tail = jnp.where(is_repeat[b],
                     jnp.maximum(jnp.minimum(length[b], q - q[b]) - (q + 1 - begin[b]), 0),
                     end[b] - (q + 1))
    distinct = jnp.where(b < r, counted - end[b] + tail, 0)
    found_repeat = is_repeat & (distinct < capacity)
    # held first runs: held keys newer than the run's that the pass touched before it
    newer_touched = jnp.sum(jnp.where(
        earlier & is_held[None, :],
        length[None, :] - jnp.clip(r_rank[:, None] - r_rank[None, :] + 1, 0, length[None, :]),
        0), axis=1)
    newer = t.size[i] - 1 - r_rank
    firsts_before = (prefix_sum(is_first) - is_first)[at]
    found_first = is_held & (newer - newer_touched + firsts_before < capacity)
    stores = jnp.sum(jnp.where(found_repeat | found_first, 0, length), dtype=jnp.int32)
    return stores, fits


def _pass_stores(t: KVTierState, i, keys, valid, first, where, live_through):
    """Stores of a mirror pass from each access's stack distance (module docstring): a repeat
    of the key accessed at ``prev`` finds it iff fewer than the tier's size distinct keys were
    accessed in between; a key's first access finds it iff the tier held it and the keys newer
    than it there, together with the distinct keys of the pass before it, number fewer.

    Both counts are dominance counts (``vec.earlier_smaller``): the distinct keys between
    ``prev`` and t are the accesses u in between whose own previous access precedes ``prev``,
    i.e. ``#{u < t : prev[u] < prev[t]}`` less the accesses up to ``prev``; the tier's keys
    newer than a held key that the pass touched before t are ``#{u < t : held first access,
    where[u] > where[t]}``."""
    width = keys.shape[0]
    capacity = t.capacity
    idx = jnp.arange(width, dtype=jnp.int64)
    prev = _previous_access(keys, valid, t.where.shape[0]).astype(jnp.int64)
    held = first & (where >= 0)
    # distinct values: the key term, then the position; excluded accesses above all others
    top = jnp.int64(1) << 60  # above (KEY_LIMIT + 1) · width
    by_prev = jnp.where(valid, (prev + 1) * width + idx, top + idx)
    by_where = jnp.where(held, (KEY_LIMIT - where.astype(jnp.int64)) * width + idx, top + idx)
    below = jax.vmap(earlier_smaller)(jnp.stack([by_prev, by_where]))
    valid_through = prefix_sum(valid)
    distinct_between = below[0] - valid_through[jnp.maximum(prev, 0)]
    found_repeat = valid & (prev >= 0) & (distinct_between < capacity)
    r_size = t.ring.shape[1]
    newer = t.size[i] - live_through[jnp.clip(where - t.head[i], 0, r_size - 1)]
    distinct_before = prefix_sum(first) - first
    found_first = held & (newer - below[1] + distinct_before < capacity)
    return jnp.sum(valid & ~(found_repeat | found_first), dtype=jnp.int32)
