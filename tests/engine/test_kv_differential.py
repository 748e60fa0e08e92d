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

from blisjax.engine import kv
from blisjax.engine.kv import LANES
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
        cached, n_cached = kv.cached_blocks(s, st, consts, 0, r)
        n_cached = jnp.where(lookup, n_cached, 0)
        ok = kv.can_allocate(s, st, consts, 0, sb, r, start, end, cached, n_cached)
        s = kv.allocate(s, st, consts, 0, sb, r, start, end, cached, n_cached, (op == 0) & ok)
        s = kv.release(s, st, 0, sb, op == 1)
        return s, ok

    batched = jax.vmap(lane, in_axes=(0,) + (None,) * 7, axis_name=LANES)
    return jax.jit(batched)


def _compare(s, st, ref: KVCache, hash_of, reqs):
    lane = jax.tree_util.tree_map(lambda x: x[0], s)
    assert kv.free_list(lane, st, 0) == ref.free_list()
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
