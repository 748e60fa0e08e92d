"""The JAX KV cache against the reference ``KVCache``, operation by operation.

A seeded random sequence of admissions (with prefix-cache lookups), prefill chunks, decode
tokens and releases runs on both; after every operation the free list (LRU order), free count,
refcounts, token counts, hit/miss counters and every prompt hash slot must agree. The cache is
tiny (14 blocks, ring of 28 keys) and requests are re-admitted after release, so claims of
cached free blocks, lazy deletion of overwritten slots, stale ring keys and ring compaction all
happen many times. Expected values come from the reference implementation (the oracle).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine import kvcache
from blisjax.engine.lockstep import LANES
from blisjax.engine.state import init_state
from blisjax.engine.static import build_consts, build_static
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
            return (0 * st.num_groups + max(grp[r], 0)) * st.group_blocks_max + j
        return st.group_slots + base[r] + j

    return hash_of


def _kernel(st, consts):
    """One jitted step: allocate (op 0, optionally with the prefix lookup) or release (op 1)."""
    def lane(s, op, sb, r, pi, start, end, lookup):
        s = s.replace(pi=s.pi.at[r].set(pi))
        cached, n_cached = kvcache.cached_blocks(s, st, consts, 0, r)
        n_cached = jnp.where(lookup, n_cached, 0)
        ok = kvcache.can_allocate(s, st, consts, 0, sb, r, start, end, cached, n_cached)
        s = kvcache.allocate(s, st, consts, 0, sb, r, start, end, cached, n_cached, (op == 0) & ok)
        s = kvcache.release(s, st, 0, sb, op == 1)
        return s, ok

    batched = jax.vmap(lane, in_axes=(0,) + (None,) * 7, axis_name=LANES)
    return jax.jit(batched)


def _compare(s, st, ref: KVCache, hash_of, reqs):
    lane = jax.tree_util.tree_map(lambda x: x[0], s)
    assert kvcache.free_list(lane, st, 0) == ref.free_list()
    assert int(lane.kv_free[0]) == ref.free_count
    assert np.asarray(lane.kv_ref[0]).tolist() == ref.refcount
    used = np.asarray(lane.kv_ref[0]) > 0
    assert np.asarray(lane.kv_tok[0])[used].tolist() == [t for t, u in zip(ref.num_tokens, used,
                                                                               strict=True) if u]
    assert (int(lane.hits[0]), int(lane.misses[0])) == (ref.hits, ref.misses)
    slot_block = np.asarray(lane.slot_block)
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
        tail = int(s.ftail[0, 0])
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
        ok = kvcache.can_allocate(s, st, consts, 0, r, r, start, end, cached, n_cached)
        s = kvcache.allocate(s, st, consts, 0, r, r, start, end, cached, n_cached, (op == 0) & ok)
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
            room = [kvcache.ring_size(st) - int(s.ftail[ln, 0] - s.fhead[ln, 0])
                    for ln in range(lanes)]
            held = [sum(int(s.blen[ln, 0, q]) for q in queued[ln]) for ln in range(lanes)]
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
                assert int(s.rel_count[ln]) == 0 and int(s.blen[ln, 0].sum()) == sum(
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
