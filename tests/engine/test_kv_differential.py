"""The JAX KV cache against the reference ``KVCache``, operation by operation.

A seeded random sequence of admissions (with prefix-cache lookups), prefill chunks, decode
tokens and releases runs on both; after every operation the free list (LRU order), free count,
refcounts, token counts, hit/miss counters and every prompt hash slot must agree. The cache is
tiny (14 blocks, ring of 28 keys) and requests are re-admitted after release, so claims of
cached free blocks, lazy deletion of overwritten slots, stale ring keys and ring compaction all
happen many times. Expected values come from the reference implementation (the oracle).

With a CPU tier (docs/semantics.md §3.8) the same is done against the reference
``TieredKVCache`` with the reference's own chained block hashes: admissions, tiered and plain
allocations, releases, mirror passes and reloads, with the tier's contents compared in LRU
order after every operation, with and without ``blis_quirks``.
"""

from __future__ import annotations

import functools
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine import batch, kvblocks, kvcache, kvtiered
from blisjax.engine.consts import build_consts
from blisjax.engine.initial import init_state
from blisjax.engine.lockstep import LANES
from blisjax.engine.static import build_static
from blisjax.reference.cluster import ClusterSimulator
from blisjax.reference.kvcache import KVCache
from tests.reference.conftest import make_resolved, make_workload

BS, BLOCKS, CHUNK = 4, 14, 12
ROWS = [  # two requests share a 16-token group prefix; the others only their own blocks
    dict(input=30, output=10, group=0, prefix=16),
    dict(input=22, output=6, group=0, prefix=16),
    dict(input=17, output=9),
    dict(input=9, output=12),
    dict(input=25, output=4, group=0, prefix=16),
]


class _Req:
    def __init__(self, index: int, input_tokens: int) -> None:
        self.index, self.input_tokens, self.progress_index = index, input_tokens, 0


def _slot_of(st, consts):
    """Reference hash function: the JAX hash slot for full prompt blocks (one to one with
    content identity), a unique negative key for any other block (never looked up)."""
    full = np.asarray(consts.full_blocks)
    gb, grp, base = (np.asarray(consts.group_blocks), np.asarray(consts.group),
                     np.asarray(consts.own_base))

    def hash_of(req, j):
        r = req.index
        if j >= full[r]:
            return -1000 * (r + 1) - j
        if j < gb[r]:
            return (0 * st.shapes.num_groups + max(grp[r], 0)) * st.shapes.group_blocks_max + j
        return st.group_slots + base[r] + j

    return hash_of


def _kernel(st, consts):
    """One jitted step: allocate (op 0, optionally with the prefix lookup) or release (op 1)."""
    def lane(s, op, sb, r, pi, start, end, lookup):
        s = s.replace(pi=s.pi.at[r].set(pi))
        cached, n_cached = kvcache.cached_blocks(s, st, consts, 0, r)
        n_cached = jnp.where(lookup, n_cached, 0)
        ok = kvcache.can_allocate(s, st, consts, 0, sb, r, start=start, end=end, cached=cached,
                                  n_cached=n_cached)
        s = kvcache.allocate(s, st, consts, 0, sb, r, start=start, end=end, cached=cached,
                             n_cached=n_cached, active=(op == 0) & ok)
        s = kvcache.release(s, st, 0, sb, op == 1)
        return s, ok

    batched = jax.vmap(lane, in_axes=(0,) + (None,) * 7, axis_name=LANES)
    return jax.jit(batched)


def _compare(s, st, ref: KVCache, hash_of, reqs):
    lane = jax.tree_util.tree_map(lambda x: x[0], s)
    assert kvblocks.free_list(lane, st, 0) == ref.free_list()
    assert int(lane.kv.kv_free[0]) == ref.free_count
    assert np.asarray(lane.kv.kv_ref[0]).tolist() == ref.refcount
    used = np.asarray(lane.kv.kv_ref[0]) > 0
    assert np.asarray(lane.kv.kv_tok[0])[used].tolist() == [t for t, u in zip(ref.num_tokens, used,
                                                                               strict=True) if u]
    assert (int(lane.stats.hits[0]), int(lane.stats.misses[0])) == (ref.hits, ref.misses)
    slot_block = np.asarray(lane.kv.slot_block)
    for req in reqs:
        for j in range(req.input_tokens // BS):
            h = hash_of(req, j)
            assert int(slot_block[h]) == ref.hash_to_block.get(h, -1), (req.index, j)


@pytest.mark.parametrize("seed", [0])
def test_kv_cache_matches_reference_op_by_op(seed):
    resolved = make_resolved(block_size=BS, kv_blocks=BLOCKS, max_running=len(ROWS))
    w = make_workload(ROWS, ("",), ("g",))
    st = build_static(resolved, w)
    consts = build_consts(resolved, w, st)
    hash_of = _slot_of(st, consts)
    ref = KVCache(BLOCKS, BS, hash_of, prefix_caching=True)
    reqs = [_Req(k, row["input"]) for k, row in enumerate(ROWS)]
    total = [row["input"] + row["output"] for row in ROWS]
    s = jax.vmap(functools.partial(init_state, st), in_axes=(0, 0, 0, None))(
        jnp.zeros(1), jnp.zeros(1), jnp.zeros(1, jnp.int32), 3)
    step = _kernel(st, consts)
    rng = np.random.default_rng(seed)
    last_tail = BLOCKS
    active = {}  # request -> progress (tokens allocated)
    compactions = 0
    # 600 random operations, then 40 admit/release cycles of one cached request: each cycle
    # claims free cached blocks (stale ring keys) and frees them again, filling the ring.
    schedule = [int(rng.integers(len(ROWS))) for _ in range(600)] + [-1] + [1] * 80
    for step_no, r in enumerate(schedule):
        hot = step_no > 600
        if r < 0:  # before the cycles: everything still running finishes
            for q in list(active):
                ref.release(reqs[q])
                s, _ = step(s, 1, q, q, 0, 0, 0, False)
                del active[q]
            continue
        req = reqs[r]
        if r not in active:  # admission: prefix lookup, first chunk
            cached = ref.cached_blocks(req)
            start = len(cached) * BS
            end = min(req.input_tokens, start + CHUNK)
            req.progress_index = 0
            ok_ref = ref.allocate(req, start, end, cached)
            s, ok = step(s, 0, r, r, 0, start, end, True)
            if ok_ref:
                active[r] = end
        elif hot or rng.random() < 0.4 or active[r] >= total[r]:  # finish or preempt
            ref.release(req)
            s, ok = step(s, 1, r, r, 0, 0, 0, False)
            ok_ref = bool(ok[0])
            del active[r]
        else:  # next prefill chunk or one decode token
            pi = active[r]
            end = min(req.input_tokens, pi + CHUNK) if pi < req.input_tokens else pi + 1
            req.progress_index = pi
            ok_ref = ref.allocate(req, pi, end, [])
            s, ok = step(s, 0, r, r, pi, pi, end, False)
            if ok_ref:
                active[r] = end
        assert bool(ok[0]) == ok_ref
        tail = int(s.kv.ftail[0, 0])
        compactions += tail < last_tail  # keys renumbered from 0 (appends only raise the tail)
        last_tail = tail
        _compare(s, st, ref, hash_of, reqs)
    # the sequence really exercised the cache, its lazy deletion and the ring's compaction
    assert ref.hits > 20 and ref.misses > 50 and compactions > 0


def _queue_kernel(st, consts):
    """Per-lane ops: allocate (op 0, with the prefix lookup on admission) or queue the
    release of the request's slot (op 1, ``kvcache.defer_release``); op 2 does nothing."""
    def lane(s, op, r, pi, start, end, lookup):
        s = s.replace(pi=s.pi.at[r].set(pi))
        cached, n_cached = kvcache.cached_blocks(s, st, consts, 0, r)
        n_cached = jnp.where(lookup, n_cached, 0)
        ok = kvcache.can_allocate(s, st, consts, 0, r, r, start=start, end=end, cached=cached,
                                  n_cached=n_cached)
        s = kvcache.allocate(s, st, consts, 0, r, r, start=start, end=end, cached=cached,
                             n_cached=n_cached, active=(op == 0) & ok)
        return kvcache.defer_release(s, st, 0, r, op == 1), ok

    return jax.jit(jax.vmap(lane, axis_name=LANES))


@pytest.mark.parametrize("seed", [1])
def test_queued_releases_of_all_lanes_match_reference(seed):
    """Several lanes queue releases (up to four each, then a wave of allocations) and
    ``lanes.release_queued`` runs them all at once: every lane's free list, refcounts and
    counters must equal the reference cache's, which released them one by one in queue order.
    Requests share prefix blocks (refcounts above one, a block freed at its last holder) and
    the ring is tiny, so both the flat pass and the lanes' own loop (a ring that could need
    compaction) are taken."""
    from blisjax.engine.lanes import release_queued

    lanes = 3
    resolved = make_resolved(block_size=BS, kv_blocks=BLOCKS, max_running=len(ROWS))
    w = make_workload(ROWS, ("",), ("g",))
    st = build_static(resolved, w)
    consts = build_consts(resolved, w, st)
    hash_of = _slot_of(st, consts)
    refs = [KVCache(BLOCKS, BS, hash_of, prefix_caching=True) for _ in range(lanes)]
    reqs = [[_Req(k, row["input"]) for k, row in enumerate(ROWS)] for _ in range(lanes)]
    total = [row["input"] + row["output"] for row in ROWS]
    s = jax.vmap(functools.partial(init_state, st), in_axes=(0, 0, 0, None))(
        jnp.zeros(lanes), jnp.zeros(lanes), jnp.zeros(lanes, jnp.int32), 3)
    step = _queue_kernel(st, consts)
    flush = jax.jit(lambda s: release_queued(s, st))
    rng = np.random.default_rng(seed)
    active = [{} for _ in range(lanes)]
    queued = [[] for _ in range(lanes)]
    flat_ring = loop_ring = 0
    # 400 random rounds; then every lane releases all it holds and 60 rounds alternate
    # between admitting request 1 (claims its cached free blocks: stale ring entries) and
    # queueing its release, which fills the ring
    plan = [(rng.random() < 0.3, None) for _ in range(400)] + [(True, "all"), (False, None)]
    plan += [(k % 2 == 1, 1) for k in range(60)] + [(False, None)]
    for releasing, forced in plan:
        while forced == "all" and any(active):  # queue every held request, one per call
            args = np.zeros((6, lanes), np.int64)
            args[0] = 2
            for ln in range(lanes):
                if active[ln]:
                    r = next(iter(active[ln]))
                    args[:2, ln] = 1, r
                    queued[ln].append(r)
                    del active[ln][r]
            s, _ = step(s, *(jnp.asarray(a, jnp.int32) for a in args))
        if forced == "all":
            continue
        if not releasing and any(queued):
            # the queues run before this wave of allocations, as the engine runs them at
            # the end of the lockstep iteration that queued them
            room = [kvblocks.ring_size(st) - int(s.kv.ftail[ln, 0] - s.kv.fhead[ln, 0])
                    for ln in range(lanes)]
            held = [sum(int(s.batch.blen[ln, 0, q]) for q in queued[ln]) for ln in range(lanes)]
            fits = all(h <= rm for h, rm in zip(held, room, strict=True))
            flat_ring += fits
            loop_ring += not fits
            s = flush(s)
            for ln in range(lanes):
                for q in queued[ln]:
                    refs[ln].release(reqs[ln][q])
                queued[ln] = []
                one = jax.tree_util.tree_map(lambda x, ln=ln: x[ln:ln + 1], s)
                _compare(one, st, refs[ln], hash_of, reqs[ln])
                assert int(s.kv.rel_count[ln]) == 0 and int(s.batch.blen[ln, 0].sum()) == sum(
                    -(-active[ln][q] // BS) for q in active[ln])
        args = np.zeros((6, lanes), np.int64)  # op, r, pi, start, end, lookup
        args[0] = 2
        for ln in range(lanes):
            r = int(rng.integers(len(ROWS))) if forced is None else forced
            req = reqs[ln][r]
            if releasing:
                if r in active[ln] and len(queued[ln]) < 4:
                    args[:2, ln] = 1, r
                    queued[ln].append(r)
                    del active[ln][r]
            elif r not in active[ln] and r not in queued[ln]:
                cached = refs[ln].cached_blocks(req)
                start = len(cached) * BS
                end = min(req.input_tokens, start + CHUNK)
                req.progress_index = 0
                if refs[ln].allocate(req, start, end, cached):
                    active[ln][r] = end
                args[:, ln] = 0, r, 0, start, end, 1
            elif r in active[ln] and active[ln][r] < total[r]:
                pi = active[ln][r]
                end = min(req.input_tokens, pi + CHUNK) if pi < req.input_tokens else pi + 1
                req.progress_index = pi
                if refs[ln].allocate(req, pi, end, []):
                    active[ln][r] = end
                args[:, ln] = 0, r, pi, pi, end, 0
        expect_ok = [bool(args[0, ln] == 0 and args[1, ln] in active[ln]
                          and active[ln][int(args[1, ln])] == args[4, ln]) for ln in range(lanes)]
        s, ok = step(s, *(jnp.asarray(a, jnp.int32) for a in args))
        for ln in range(lanes):
            if args[0, ln] == 0:
                assert bool(ok[ln]) == expect_ok[ln], (ln, args[:, ln])
    # both ways of running the queues were taken, more than a few times
    assert flat_ring > 10 and loop_ring > 3


# ---- CPU tier ----------------------------------------------------------------------------------

TIER_ROWS = ROWS + [  # a second prefix group, so prefixes compete for the GPU's 14 blocks
    dict(input=28, output=5, group=1, prefix=20),
    dict(input=21, output=3, group=1, prefix=20),
]
TIER_MAX = 24  # the program's tier capacity; each run's tier is this size or smaller
THRASH_WINDOW_US = 120
ADMIT, TIERED, FAST, RELEASE, MIRROR, TAKE = range(6)


def _tier_kernel(st, consts):
    """One jitted operation on instance 0 of one lane, slot = request: an admission (phase 2's
    allocation: ``batch._admit_tiered``, then ``kvcache.allocate`` unless it granted the
    blocks itself), a running request's tiered allocation (``kvtiered.tiered_allocate``), its
    plain allocation (``kvcache.allocate``: the engine's vectorized path for requests that hold
    their full prompt blocks), a release, a mirror pass of the batch ``order[:n_order]``
    (``kvtiered.mirror_batch``, which gathers the keys for ``kvtier.mirror``) or taking the
    pending transfer time. ``budget``: an admission's token budget; ``now``: the instance
    clock the thrashing anomaly reads."""
    no_prefix = jnp.full(max(st.shapes.max_prompt_blocks, 1), -1, jnp.int32)
    none = jnp.zeros(1, jnp.int32)

    def lane(s, op, r, pi, end, budget, now, order, n_order):
        s = s.replace(pi=s.pi.at[r].set(pi), batch=s.batch.replace(
                                                 clock=s.batch.clock.at[0].set(now)))
        admit = op == ADMIT
        s, start, n, ok_admit, granted = batch._admit_tiered(
            s, st, consts, None, 0, r, r, budget, admit)
        fits = kvcache.can_allocate(s, st, consts, 0, r, r, start=pi, end=end, cached=none,
                                    n_cached=0)
        # one allocate serves the admission's grant and the plain allocation (a smaller
        # program to compile)
        s = kvcache.allocate(s, st, consts, 0, r, r, start=jnp.where(admit, start, pi),
                             end=jnp.where(admit, start + n, end), cached=none, n_cached=0,
                             active=(admit & ok_admit & ~granted) | ((op == FAST) & fits))
        s, tried = kvtiered.tiered_allocate(s, st, consts, 0, r, r, start=pi, end=end,
                                           cached=no_prefix, n_cached=0,
                                           active=op == TIERED)
        s = kvcache.release(s, st, 0, r, op == RELEASE)
        valid = jnp.arange(order.shape[0]) < n_order
        s = kvtiered.mirror_batch(s, st, 0, order, valid, op == MIRROR)
        t = s.tier
        s = s.replace(tier=t.replace(pending_us=t.pending_us.at[0].set(
            jnp.where(op == TAKE, 0, t.pending_us[0]))))
        ok = jnp.where(admit, ok_admit, jnp.where(op == FAST, fits, tried.ok))
        return s, (ok, start, n)

    return jax.jit(jax.vmap(lane, in_axes=(0,) + (None,) * 8, axis_name=LANES))


def _tier_order(t, ring_size: int) -> list[int]:
    """Instance 0's CPU keys, oldest first (live ring entries)."""
    where, ring = np.asarray(t.where), np.asarray(t.ring[0])
    out = []
    for pos in range(int(t.head[0]), int(t.tail[0])):
        k = int(ring[pos % ring_size])
        if k >= 0 and where[k] == pos:
            out.append(k)
    return out


class _KeyMap:
    """The correspondence between the engine's CPU keys and the reference's chained hashes,
    learned from the GPU blocks that hold both. A key may stand for another hash only once the
    old hash is gone from the reference (no block, not in the tier), and a hash for another key
    only once the old key is gone from the engine: otherwise one side would hold two contents
    the other holds as one."""

    def __init__(self) -> None:
        self.hash_of_key: dict[int, int] = {}
        self.key_of_hash: dict[int, int] = {}

    def learn(self, pairs, ref_live: set[int], eng_live: set[int]) -> None:
        for k, h in pairs:
            old_h = self.hash_of_key.get(k)
            if old_h is not None and old_h != h:
                assert old_h not in ref_live, ("one CPU key for two live hashes", k)
                self.key_of_hash.pop(old_h, None)
            old_k = self.key_of_hash.get(h)
            if old_k is not None and old_k != k:
                assert old_k not in eng_live, ("two live CPU keys for one hash", old_k, k)
                self.hash_of_key.pop(old_k, None)
            self.hash_of_key[k], self.key_of_hash[h] = h, k


def _compare_tier(s, st, ref, reqs, keymap: _KeyMap, cached_of, true_keys) -> None:
    lane = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], s)  # one host copy per field
    assert kvblocks.free_list(lane, st, 0) == ref.free_list()
    assert int(lane.kv.kv_free[0]) == ref.free_count
    assert np.asarray(lane.kv.kv_ref[0]).tolist() == ref.refcount
    used = np.asarray(lane.kv.kv_ref[0]) > 0
    assert np.asarray(lane.kv.kv_tok[0])[used].tolist() == [
        t for t, u in zip(ref.num_tokens, used, strict=True) if u]
    assert (int(lane.stats.hits[0]), int(lane.stats.misses[0])) == (ref.hits, ref.misses)
    blen, bt = np.asarray(lane.batch.blen[0]), np.asarray(lane.batch.bt[0])
    # slot = request, except a waiting request holding blocks (a failed admission with
    # ``blis_quirks``): a holder slot names it
    slot = {req.index: req.index for req in reqs}
    holders = np.asarray(lane.batch.slot_req[0])[st.hold_base:]
    slot.update({int(q): st.hold_base + h for h, q in enumerate(holders) if q >= 0})
    for req in reqs:
        sb = slot[req.index]
        assert bt[sb, :blen[sb]].tolist() == ref.request_blocks.get(req.index, [])
    blocks, counts = (np.asarray(x) for x in cached_of(s))
    for req in reqs:
        want = ref.cached_blocks(req)
        assert blocks[req.index, :counts[req.index]].tolist() == want, req.index
    # block contents: the same blocks hold a hash, and keys stand for hashes one to one
    t = lane.tier
    key_of_block = np.asarray(t.key_of_block[0]).tolist()
    assert [k >= 0 for k in key_of_block] == [h is not None for h in ref.block_hash]
    # a held block's hash is one of its request's true chain in both or off it in both; on
    # it, the key names that content (``kvcache.cpu_key`` of request and position; a reload
    # with ``blis_quirks`` can give a held block the content of another position)
    offchain_start = st.hash_slots + st.shapes.cpu_ext_slots
    for req in reqs:
        held = ref.request_blocks.get(req.index, [])
        position = {ref._hash_of(req, j): j for j in range(st.shapes.max_blocks_per_request)}
        for j, b in enumerate(held):
            h = ref.block_hash[b]
            if h is None:
                continue
            if h in position:
                assert key_of_block[b] == true_keys[req.index, position[h]], (req.index, j)
            else:
                assert key_of_block[b] >= offchain_start, ("off the chain", req.index, j)
    order = _tier_order(t, st.cpu_ring)
    keymap.learn([(k, h) for k, h in zip(key_of_block, ref.block_hash, strict=True) if k >= 0],
                 set(ref.cpu.lru) | {h for h in ref.block_hash if h is not None},
                 set(order) | {k for k in key_of_block if k >= 0})
    assert order == [keymap.key_of_hash.get(h) for h in ref.cpu.lru]
    assert int(t.size[0]) == len(ref.cpu.lru)
    counters = (int(t.reloads[0]), int(t.cpu_misses[0]), int(t.mirror_stores[0]),
                int(t.evictions[0]), int(t.thrash_reloads[0]), int(t.pending_us[0]))
    assert counters == (ref.reloads, ref.cpu_misses, ref.mirror_stores, ref.cpu.evictions,
                        ref.thrash_reloads, ref.pending_latency_us)
    assert np.asarray(t.request_reloads[:len(reqs)]).tolist() == [
        ref.request_reloads.get(req.index, 0) for req in reqs]
    assert int(t.hold_overflow) == 0


@pytest.mark.parametrize("quirks", [False, True])
def test_tiered_kv_cache_matches_reference_op_by_op(quirks):
    """The engine's tiered KV cache against the reference ``TieredKVCache`` (with the
    reference's own chained hashes, from ``ClusterSimulator``) after every one of ~2,000
    random operations: admissions (Decision 12's reload before sizing, or BLIS's tiered
    allocation with ``blis_quirks``), prefill chunks and decode tokens of running requests
    through the tiered allocation (and the plain one where the engine takes it), releases,
    mirror passes of the running batch in batch order, and the step's transfer time. Tiers of
    2 (thrashing), 6 and 24 blocks run on one compiled program. Checked after every operation:
    the GPU state as in ``test_kv_cache_matches_reference_op_by_op`` plus block tables and
    every request's cached prefix; which blocks hold a hash and that CPU keys and hashes
    correspond one to one; the tier's contents in LRU order; the reload, CPU-miss, store,
    eviction, thrash and per-request reload counters and the pending transfer time. An
    admission that claims reloaded blocks and then fails (``blis_quirks``) leaves the request
    holding them while it waits, in a holder slot of the engine's."""
    w = make_workload(TIER_ROWS, ("",), ("g0", "g1"))
    sizing = make_resolved(block_size=BS, kv_blocks=BLOCKS, max_running=len(TIER_ROWS),
                           cpu_blocks=TIER_MAX, quirks=quirks, thrash_window_us=THRASH_WINDOW_US)
    st = build_static(sizing, w)
    consts = build_consts(sizing, w, st)
    step = _tier_kernel(st, consts)
    cached_of = jax.jit(lambda s: jax.vmap(  # every request's cached prefix on lane 0
        lambda r: tuple(kvcache.cached_blocks(jax.tree_util.tree_map(lambda x: x[0], s), st,
                                              consts, 0, r)))(jnp.arange(len(TIER_ROWS))))
    true_keys = np.asarray(jax.vmap(lambda r: kvcache.cpu_key(
        st, consts, 0, r, jnp.arange(st.shapes.max_blocks_per_request)))(
            jnp.arange(len(TIER_ROWS))))
    total = [row["input"] + row["output"] for row in TIER_ROWS]
    seen: Counter = Counter()
    for run, (capacity, bandwidth, base_us) in enumerate(((2, 8.0, 5), (6, 0.5, 0),
                                                          (24, 100.0, 40))):
        resolved = make_resolved(block_size=BS, kv_blocks=BLOCKS, max_running=len(TIER_ROWS),
                                 cpu_blocks=capacity, transfer_bandwidth=bandwidth,
                                 transfer_base_us=base_us, quirks=quirks,
                                 thrash_window_us=THRASH_WINDOW_US)
        assert build_static(resolved, w, cpu_tier_blocks=TIER_MAX) == st  # one program
        sim = ClusterSimulator(resolved, w)
        ref, reqs = sim.instances[0].kv, sim.requests
        reload_us = ref.reload_cost_us
        s = jax.vmap(functools.partial(init_state, st, kv_cpu_blocks=capacity,
                                       kv_reload_us=reload_us),
                     in_axes=(0, 0, 0, None))(jnp.zeros(1), jnp.zeros(1),
                                              jnp.zeros(1, jnp.int32), 3)
        rng = np.random.default_rng(100 * run + quirks)
        keymap = _KeyMap()
        active: dict[int, int] = {}  # running request -> tokens allocated, in batch order
        now = 0
        last_tail = 0
        for _ in range(700):
            now += int(rng.integers(0, 40))
            ref.now_us = now
            roll = rng.random()
            r = int(rng.integers(len(reqs)))
            req = reqs[r]
            pi = end = 0
            # the step's token budget left: a whole chunk, or less (chunks that end inside a
            # block, so later appends top blocks up)
            budget = CHUNK if rng.random() < 0.6 else int(rng.integers(1, CHUNK))
            order = np.zeros(len(reqs), np.int64)
            n_order = 0
            reloads, misses = ref.reloads, ref.cpu_misses
            if roll < 0.14:
                op = MIRROR
                order[:len(active)] = list(active)
                n_order = len(active)
                ref.mirror([reqs[q] for q in active])
            elif roll < 0.19:
                op = TAKE
                ref.take_pending_latency_us()
            elif r not in active:  # admission, as Instance._form_batch
                op = ADMIT
                req.progress_index = 0
                cached = ref.cached_blocks(req)
                reloaded = 0
                if not quirks:
                    reloaded = ref.reload_prefix(req, len(cached), keep=cached)
                    if reloaded:
                        cached = ref.cached_blocks(req)
                start = len(cached) * BS
                n = min(req.input_tokens - start, budget)
                if quirks:
                    ok_ref = ref.allocate(req, start, start + n, cached)
                else:
                    ok_ref = ref.allocate_reloaded(req, start, start + n, cached, reloaded)
                end = start + n
            elif roll < 0.35 or active[r] >= total[r]:  # finish or preempt
                op = RELEASE
                ref.release(req)
            else:  # the next prefill chunk or decode token
                pi = active[r]
                end = min(req.input_tokens, pi + budget) if pi < req.input_tokens else pi + 1
                req.progress_index = pi
                holds_prompt = len(ref.request_blocks.get(r, [])) >= req.input_tokens // BS
                ok_ref = ref.allocate(req, pi, end)
                op = FAST if holds_prompt and ok_ref and rng.random() < 0.5 else TIERED
            s, (ok, start_eng, n_eng) = step(s, op, r, pi, end, budget, now,
                                             jnp.asarray(order), n_order)
            # a TieredKVCache.allocate that reloaded, claimed part of [start, end) and then
            # failed (see kvtiered.tiered_allocate): both sides hold the claimed blocks
            tiered_call = op == TIERED or (op == ADMIT and quirks)
            claimed_then_failed = (tiered_call and not ok_ref and ref.reloads > reloads
                                   and (pi if op == TIERED else start)
                                   < len(ref.cached_blocks(req)) * BS < end)
            seen["claimed then failed"] += claimed_then_failed
            if op in (ADMIT, TIERED, FAST):
                assert bool(ok[0]) == ok_ref, (op, r)
                seen["reloads at admission" if op == ADMIT else "reloads while running"] += (
                    ref.reloads > reloads)
                seen["cpu misses"] += ref.cpu_misses > misses
            if op == ADMIT:
                assert (int(start_eng[0]), int(n_eng[0])) == (start, n)
                if ok_ref:
                    active[r] = end
            elif op == RELEASE:
                del active[r]
            elif op in (TIERED, FAST) and ok_ref:
                active[r] = end
            tail = int(s.tier.tail[0, 0])
            seen["tier ring compactions"] += tail < last_tail
            last_tail = tail
            seen["off-chain blocks"] += any(
                ref.block_hash[b] != ref._hash_of(reqs[q], j)
                for q, bl in ref.request_blocks.items() for j, b in enumerate(bl)
                if ref.block_hash[b] is not None)
            _compare_tier(s, st, ref, reqs, keymap, cached_of, true_keys)
        seen["thrash reloads"] += ref.thrash_reloads
        seen["tier evictions"] += ref.cpu.evictions
    # the sequences exercised what they are meant to
    for what in ("reloads at admission", "reloads while running", "cpu misses",
                 "tier ring compactions", "thrash reloads", "tier evictions"):
        assert seen[what] > 0, (what, seen)
    if quirks:
        assert seen["off-chain blocks"] > 0 and seen["claimed then failed"] > 0, seen
