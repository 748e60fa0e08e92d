"""A preemption meeting a CPU tier, step by step, computed by hand (docs/semantics.md §3.8, C.1.7).

Blocks of 4 tokens, 7 GPU blocks, a CPU tier of 6 blocks, a reload costing 10 + ceil(4/4) =
11 µs. Request A has a 20-token prompt (blocks a0..a4), B a 10-token prompt (b0, b1 and a
2-token tail). Each step allocates as ``Instance._form_batch`` does and then mirrors the running
batch, as ``Instance._step`` does:

1. A's first chunk [0, 8) takes blocks 0, 1; the mirror stores a0, a1.
2. B's chunk [0, 8) takes blocks 2, 3; the mirror touches a0, a1 and stores b0, b1.
3. B is preempted: its blocks go to the free list's tail, last first, keeping their hashes:
   free list 4, 5, 6, 3, 2.
4. A's chunk [8, 20) takes 4, 5, 6 (a2..a4); the mirror touches a0, a1 and stores a2, a3, a4: the
   tier is full at a3, so a4 evicts the least recent entry, b0.
5. A's first decode token takes block 3 from the free list's head: b1 leaves the GPU (it stays
   on the CPU tier). Its block holds one token: nothing new to mirror.
6. A completes; its blocks go to the tail, last first: free list 2, 3, 6, 5, 4, 1, 0.
7. B is readmitted. Its block 0 (b0) is still cached on the GPU, in block 2; b1 is only on the
   CPU tier, so it is reloaded:

   * by default (Decision 12) before the chunk is sized, passing over B's own cached block 2:
     b1 goes into block 3, B claims blocks 2 and 3 (2 hits) and prefills its 2-token tail in a
     fresh block 6; the mirror stores b0 (evicting a0) and touches b1;
   * with ``--blis-quirks`` (BLIS) after the chunk is sized from the GPU's cached prefix (start
     4): the reload takes the free list's head, which is B's own block 2, so b0 leaves the GPU;
     the cached prefix is now empty, so the fallback claims the stale list [2] (1 hit; the
     block holds b1's tokens) and takes blocks 3 and 6 for tokens 4..9. Block 3's hash chains
     from block 2's hash, b1, over B's tokens 4..7: off the true chain. The mirror touches b1
     and stores that hash (evicting a0).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from blisjax.reference.kvcache import TieredKVCache

BS = 4


def _request(name: str, index: int, input_tokens: int):
    return SimpleNamespace(name=name, index=index, input_tokens=input_tokens, progress_index=0)


def _hash_of(r, j):
    return f"{r.name.lower()}{j}"  # a0, a1, ..., b0, b1: the true chain's hashes


def _hash_at(prev, r, start):
    return f"{prev}>{r.name}@{start}"  # a block hashed from ``prev`` over r's tokens from start


def _cache() -> TieredKVCache:
    return TieredKVCache(7, BS, _hash_of, cpu_blocks=6, bandwidth_tokens_per_us=4.0,
                         base_latency_us=10, hash_at=_hash_at)


def _admit(kv: TieredKVCache, r, budget: int, quirks: bool) -> bool:
    """Phase 2's allocation for the queue's head (``Instance._form_batch``)."""
    cached = kv.cached_blocks(r)
    reloaded = 0
    if not quirks:
        reloaded = kv.reload_prefix(r, len(cached), keep=cached)
        if reloaded:
            cached = kv.cached_blocks(r)
    start = len(cached) * BS
    n = min(r.input_tokens - start, budget)
    if quirks:
        return kv.allocate(r, start, start + n, cached)
    return kv.allocate_reloaded(r, start, start + n, cached, reloaded)


def _tier(kv: TieredKVCache) -> list[str]:
    return list(kv.cpu.lru)  # least recent first


@pytest.mark.parametrize("quirks", [False, True])
def test_preempted_request_reloads_from_the_cpu_tier(quirks):
    kv = _cache()
    a, b = _request("A", 0, 20), _request("B", 1, 10)

    # 1. A's first chunk
    assert _admit(kv, a, 8, quirks)
    kv.mirror([a])
    a.progress_index = 8
    assert kv.request_blocks[0] == [0, 1] and kv.free_list() == [2, 3, 4, 5, 6]
    assert _tier(kv) == ["a0", "a1"] and kv.mirror_stores == 2

    # 2. B's first chunk
    assert _admit(kv, b, 8, quirks)
    kv.mirror([a, b])
    b.progress_index = 8
    assert kv.request_blocks[1] == [2, 3] and kv.free_list() == [4, 5, 6]
    assert _tier(kv) == ["a0", "a1", "b0", "b1"] and kv.mirror_stores == 4

    # 3. B preempted
    kv.release(b)
    b.progress_index = 0
    assert kv.free_list() == [4, 5, 6, 3, 2]
    assert kv.hash_to_block["b0"] == 2 and kv.hash_to_block["b1"] == 3

    # 4. A's second chunk: the full tier evicts b0
    assert kv.allocate(a, 8, 20)
    kv.mirror([a])
    a.progress_index = 20
    assert kv.request_blocks[0] == [0, 1, 4, 5, 6] and kv.free_list() == [3, 2]
    assert _tier(kv) == ["b1", "a0", "a1", "a2", "a3", "a4"]
    assert (kv.mirror_stores, kv.cpu.evictions) == (7, 1)

    # 5. A's first decode token takes block 3: b1 leaves the GPU
    assert kv.allocate(a, 20, 21)
    kv.mirror([a])
    a.progress_index = 21
    assert kv.request_blocks[0][-1] == 3 and kv.free_list() == [2]
    assert "b1" not in kv.hash_to_block and kv.hash_to_block["b0"] == 2
    assert _tier(kv) == ["b1", "a0", "a1", "a2", "a3", "a4"] and kv.mirror_stores == 7

    # 6. A completes
    kv.release(a)
    assert kv.free_list() == [2, 3, 6, 5, 4, 1, 0]
    assert (kv.reloads, kv.pending_latency_us) == (0, 0)

    # 7. B readmitted: b1 comes back from the CPU tier
    assert _admit(kv, b, 16, quirks)
    assert (kv.reloads, kv.take_pending_latency_us()) == (1, 11)
    kv.mirror([b])
    assert kv.request_blocks[1] == [2, 3, 6]
    assert kv.cpu.evictions == 2 and kv.mirror_stores == 8
    if not quirks:
        assert [kv.block_hash[x] for x in (2, 3, 6)] == ["b0", "b1", None]
        assert kv.free_list() == [5, 4, 1, 0]
        assert _tier(kv) == ["a1", "a2", "a3", "a4", "b0", "b1"]
        assert (kv.hits, kv.misses, kv.cpu_misses) == (2, 9, 0)
    else:
        off_chain = "b1>B@4"
        assert [kv.block_hash[x] for x in (2, 3, 6)] == ["b1", off_chain, None]
        assert [kv.first_token[x] for x in (3, 6)] == [4, 8]
        assert kv.free_list() == [5, 4, 1, 0]
        assert "b0" not in kv.hash_to_block and kv.hash_to_block[off_chain] == 3
        assert _tier(kv) == ["a1", "a2", "a3", "a4", "b1", off_chain]
        assert (kv.hits, kv.misses, kv.cpu_misses) == (1, 10, 0)
    kv.check_conservation()


def test_failed_partial_reload_leaves_the_queued_request_holding_blocks():
    """BLIS's partial branch (C.1.7, 2): the reload makes blocks 0 and 1 of a 3-block prompt
    cached, they are committed, and the allocation of the rest fails its pre-check; the request
    stays queued holding both blocks (2 hits), and its next attempt appends after them."""
    kv = TieredKVCache(4, BS, _hash_of, cpu_blocks=8, bandwidth_tokens_per_us=4.0,
                       base_latency_us=0, hash_at=_hash_at)
    c = _request("C", 2, 12)
    for name in ("c0", "c1"):
        kv.cpu.store(name)  # mirrored by an earlier run of C
    filler = _request("F", 3, 8)
    assert kv.allocate(filler, 0, 8)  # blocks 0, 1 in use; free list 2, 3
    assert not kv.allocate(c, 0, 12, [])  # reloads c0, c1 into 2, 3, claims them, then fails
    assert kv.reloads == 2 and kv.request_blocks[2] == [2, 3] and kv.free_count == 0
    assert kv.hits == 2 and kv.cpu_misses == 0
    kv.release(filler)  # free list 1, 0
    # the next attempt: the owned blocks are past the cached list, the scan starts after them
    assert kv.allocate(c, 8, 12, kv.cached_blocks(c))
    assert kv.request_blocks[2] == [2, 3, 1] and kv.block_hash[1] == "c2"
    kv.check_conservation()
