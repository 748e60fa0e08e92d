"""Hand-computed checks of the block KV cache: allocation order, hashing, LRU, lazy deletion."""

from types import SimpleNamespace

from blisjax.reference.kvcache import KVCache


def req(index, input_tokens, shared_blocks=0, progress_index=0):
    """A request whose first ``shared_blocks`` prompt blocks have group-shared content."""
    return SimpleNamespace(index=index, input_tokens=input_tokens, shared=shared_blocks,
                           progress_index=progress_index)


def hash_of(r, j):
    # Content identity stand-in: shared prefix blocks are equal across requests.
    return ("shared", j) if j < r.shared else (r.index, j)


def cache(total=4, bs=4):
    return KVCache(total, bs, hash_of)


def test_fresh_allocation_takes_lowest_ids_and_hashes_full_prefill_blocks():
    kv = cache()
    a = req(0, 10)
    assert kv.allocate(a, 0, 10)
    assert kv.request_blocks[0] == [0, 1, 2]
    assert kv.num_tokens[:3] == [4, 4, 2]
    assert kv.hash_to_block == {(0, 0): 0, (0, 1): 1}  # the partial block 2 is not hashed
    assert kv.free_count == 1 and kv.misses == 3 and kv.hits == 0
    kv.check_conservation()


def test_precheck_failure_changes_nothing():
    kv = cache()
    assert not kv.allocate(req(0, 20), 0, 20)  # needs 5 blocks, 4 exist
    assert kv.free_count == 4 and kv.request_blocks == {} and kv.misses == 0
    kv.check_conservation()


def test_release_appends_last_block_first_to_lru_tail_and_keeps_hashes():
    kv = cache()
    a = req(0, 10)
    kv.allocate(a, 0, 10)
    kv.release(a)
    # free list was [3]; blocks released last-to-first: 2, 1, 0 → eviction order 3, 2, 1, 0
    assert kv.free_list() == [3, 2, 1, 0]
    assert kv.hash_to_block == {(0, 0): 0, (0, 1): 1}
    kv.check_conservation()


def test_cached_prefix_hit_claims_free_blocks_and_counts_hits():
    kv = cache(total=6)
    a = req(0, 8, shared_blocks=2)
    kv.allocate(a, 0, 8)
    kv.release(a)  # free list: [2, 3, 4, 5, 1, 0]
    b = req(1, 10, shared_blocks=2)
    cached = kv.cached_blocks(b)
    assert cached == [0, 1]
    # 2 tokens beyond the 8 cached: one new block; both cached blocks are not in use (count 2)
    assert kv.allocate(b, 8, 10, cached)
    assert kv.request_blocks[1] == [0, 1, 2]
    assert kv.hits == 2 and kv.misses == 3  # a's 2 blocks + b's 1 fresh block
    assert kv.free_list() == [3, 4, 5]
    kv.check_conservation()


def test_shared_block_refcount_and_release_order():
    kv = cache(total=6)
    a, b = req(0, 8, shared_blocks=2), req(1, 8, shared_blocks=2)
    kv.allocate(a, 0, 6)  # blocks 0 (full, hashed) and 1 (2 tokens)
    kv.allocate(a, 6, 8)  # fills block 1 → hashed now
    assert kv.hash_to_block == {("shared", 0): 0, ("shared", 1): 1}
    cached = kv.cached_blocks(b)
    assert cached == [0, 1]
    # n = 0 (fully cached, block-aligned prompt): BLIS returns success without claiming
    assert kv.allocate(b, 8, 8, cached)
    assert 1 not in kv.request_blocks and kv.hits == 0
    kv.release(a)
    assert kv.free_list() == [2, 3, 4, 5, 1, 0]


def test_lazy_hash_deletion_on_reuse():
    kv = cache(total=2, bs=4)
    a = req(0, 8)
    kv.allocate(a, 0, 8)
    kv.release(a)  # free list [1, 0], both hashed
    c = req(2, 4)
    kv.allocate(c, 0, 4)  # pops block 1: its old hash (0, 1) is deleted, new (2, 0) registered
    assert kv.hash_to_block == {(0, 0): 0, (2, 0): 1}
    assert kv.cached_blocks(req(0, 8)) == [0]  # chain stops at the first missing block


def test_decode_precheck_and_decode_fill_hashing():
    kv = cache(total=2, bs=2)
    a = req(0, 3)
    kv.allocate(a, 0, 3)  # blocks 0 (full) and 1 (1 token)
    a.progress_index = 3  # decode mode
    assert kv.allocate(a, 3, 4)  # fills block 1 during decode → hashed (output tokens too)
    assert (0, 1) in kv.hash_to_block
    assert not kv.allocate(a, 4, 5)  # last block full, free list empty
    assert kv.request_blocks[0] == [0, 1]
    kv.check_conservation()


def test_prefix_caching_disabled_never_hits():
    kv = KVCache(4, 4, hash_of, prefix_caching=False)
    a = req(0, 8, shared_blocks=2)
    kv.allocate(a, 0, 8)
    kv.release(a)
    assert kv.cached_blocks(req(1, 8, shared_blocks=2)) == []
    assert kv.hash_to_block == {}
