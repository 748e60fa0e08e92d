"""Block-level KV cache with prefix caching, as BLIS models vLLM (docs/semantics.md §3).

State: blocks 0..N-1 with a refcount, an in-use flag, a token count and an optional hash; a
per-request ordered block list; ``hash → block`` for prefix lookup; and a doubly linked free list
(LRU order: allocation pops the head, release appends to the tail). Freed blocks keep their hash
(lazy deletion) so they can still be hit until they are reused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from blisjax.rules import reload_cost_us

_NIL = -1


class KVCache:
    """One instance's KV blocks. ``hash_of(req, j)`` gives the chained hash of a request's block j."""

    def __init__(self, total_blocks: int, block_size_tokens: int,
                 hash_of: Callable[[object, int], int], prefix_caching: bool = True,
                 hash_at: Callable[[int | None, object, int], int] | None = None) -> None:
        self.total_blocks = total_blocks
        # (held predecessor's hash or None, req, first token position) -> the block's hash
        self._hash_at = hash_at
        self.block_size = block_size_tokens
        self.prefix_caching = prefix_caching
        self._hash_of = hash_of
        self.refcount = [0] * total_blocks
        self.in_use = [False] * total_blocks
        self.num_tokens = [0] * total_blocks
        # position, in its owner's tokens, of the first token an allocation wrote to the block
        self.first_token = [0] * total_blocks
        self.block_hash: list[int | None] = [None] * total_blocks
        self.hash_to_block: dict[int, int] = {}
        self.request_blocks: dict[int, list[int]] = {}
        # Free list: blocks 0..N-1 in id order, so the first allocations take the lowest ids.
        self._prev = [i - 1 for i in range(total_blocks)]
        self._next = [i + 1 if i + 1 < total_blocks else _NIL for i in range(total_blocks)]
        self._head = 0 if total_blocks else _NIL
        self._tail = total_blocks - 1 if total_blocks else _NIL
        self.free_count = total_blocks
        self.hits = 0
        self.misses = 0

    # ---- free list -------------------------------------------------------------------------
    def _unlink(self, b: int) -> None:
        p, n = self._prev[b], self._next[b]
        if p == _NIL:
            self._head = n
        else:
            self._next[p] = n
        if n == _NIL:
            self._tail = p
        else:
            self._prev[n] = p
        self._prev[b] = self._next[b] = _NIL
        self.free_count -= 1

    def _append_tail(self, b: int) -> None:
        self._prev[b] = self._tail
        self._next[b] = _NIL
        if self._tail == _NIL:
            self._head = b
        else:
            self._next[self._tail] = b
        self._tail = b
        self.free_count += 1

    def _pop_free(self, keep: frozenset[int] = frozenset()) -> int:
        """Take the free list's head (the least recently freed block), passing over blocks in
        ``keep``, and forget its cached content: lazy deletion by hash value, as BLIS (it may
        drop a newer mapping of the same hash)."""
        b = self._head
        while b in keep:
            b = self._next[b]
        self._unlink(b)
        old = self.block_hash[b]
        if old is not None:
            self.hash_to_block.pop(old, None)
            self.block_hash[b] = None
            self._evicted(old)
        return b

    def _evicted(self, h: int) -> None:
        """A block holding hash ``h`` was taken for other content (a tier notes when)."""

    def free_list(self) -> list[int]:
        """Free blocks in eviction order (head first); for tests and invariant checks."""
        out, b = [], self._head
        while b != _NIL:
            out.append(b)
            b = self._next[b]
        return out

    @property
    def used_blocks(self) -> int:
        """Blocks not on the free list (cached-but-free blocks count as free)."""
        return self.total_blocks - self.free_count

    # ---- prefix lookup ---------------------------------------------------------------------
    def carry_counters(self, old: KVCache) -> None:
        """Continue ``old``'s counters: a new instance in the same slot (its caches empty)
        adds to the slot's counts."""
        self.hits, self.misses = old.hits, old.misses

    def cached_blocks(self, req) -> list[int]:
        """Longest chain of cached full prompt blocks (may include free blocks with refcount 0)."""
        if not self.prefix_caching:
            return []
        out: list[int] = []
        for j in range(req.input_tokens // self.block_size):
            b = self.hash_to_block.get(self._hash_of(req, j))
            if b is None:
                break
            out.append(b)
        return out

    # ---- allocation ------------------------------------------------------------------------
    def can_allocate(self, req, start: int, end: int, cached: list[int]) -> bool:
        """BLIS's check-then-act pre-check; never changes state."""
        blocks = self.request_blocks.get(req.index)
        if req.progress_index < req.input_tokens:  # prefill mode
            spare = 0
            if blocks:
                filled = self.num_tokens[blocks[-1]]
                if filled >= 1:
                    spare = self.block_size - filled
            need = -(-max(0, (end - start) - spare) // self.block_size)
            cached_not_in_use = sum(1 for b in cached if not self.in_use[b])
            return need + cached_not_in_use <= self.free_count
        # decode mode: one token goes into the last block or into a fresh one
        if not blocks:
            return self.free_count > 0
        if self.num_tokens[blocks[-1]] >= self.block_size:
            return self.free_count > 0
        return True

    def allocate(self, req, start: int, end: int, cached: list[int] | None = None) -> bool:
        """Allocate KV for token positions [start, end) of ``req``; False (no change) if short."""
        blocks = self.request_blocks.get(req.index)
        if end - start == 1 and blocks and 1 <= self.num_tokens[blocks[-1]] < self.block_size:
            # Fast path for the commonest call (a decode token that fits in the partial last
            # block): exactly what the general loop below does for it, without the pre-check.
            last = blocks[-1]
            self.num_tokens[last] += 1
            if self.num_tokens[last] == self.block_size:
                self._register(req, len(blocks) - 1, last)
            return True
        cached = cached or []
        if not self.can_allocate(req, start, end, cached):
            return False
        prefill = req.progress_index < req.input_tokens
        bs = self.block_size
        remaining = end - start
        pos = start  # the next token's position
        while remaining > 0:
            blocks = self.request_blocks.get(req.index)
            if blocks is None:
                # First allocation of this request: claim the cached prefix blocks.
                blocks = self.claim(req, cached)
            last = blocks[-1] if blocks else _NIL
            if last != _NIL and 1 <= self.num_tokens[last] < bs:
                k = min(bs - self.num_tokens[last], remaining)
                self.num_tokens[last] += k
                remaining -= k
                pos += k
                if self.num_tokens[last] == bs:  # filled (also during decode): register its hash
                    self._register(req, len(blocks) - 1, last)
                continue
            b = self._pop_free()
            k = min(bs, remaining)
            self.num_tokens[b] = k
            self.first_token[b] = pos
            pos += k
            self.refcount[b] = 1
            self.in_use[b] = True
            self.misses += 1
            blocks.append(b)
            remaining -= k
            if k == bs and prefill:
                self._register(req, len(blocks) - 1, b)
        return True

    def claim(self, req, blocks: list[int]) -> list[int]:
        """Append cached blocks to ``req``'s blocks (each a cache hit: one more holder, off
        the free list); returns its block list (BLIS ``commitCachedBlocks``)."""
        owned = self.request_blocks.setdefault(req.index, [])
        for b in blocks:
            self.refcount[b] += 1
            if not self.in_use[b]:
                self.in_use[b] = True
                self._unlink(b)
            self.hits += 1
            owned.append(b)
        return owned

    def _register(self, req, j: int, b: int) -> None:
        """Give block ``b`` (block ``j`` of ``req``'s blocks, just filled) its hash: BLIS hashes
        the block's tokens chained from the hash of the block the request holds at ``j - 1``.
        That is the true chain's hash unless a tiered reload left the request holding blocks
        of other content or at other positions (§3.8): the hash then matches no prompt's
        block (``hash_at``)."""
        if not self.prefix_caching:
            return
        h = self._hash_of(req, j)
        if self._hash_at is not None:
            prev = self.block_hash[self.request_blocks[req.index][j - 1]] if j > 0 else None
            first = self.first_token[b]
            if first != j * self.block_size or (j > 0 and prev != self._hash_of(req, j - 1)):
                h = self._hash_at(prev, req, first)
        self.block_hash[b] = h
        self.hash_to_block[h] = b

    def release(self, req) -> None:
        """Free a request's blocks, last to first, to the free-list tail (hashes are kept)."""
        blocks = self.request_blocks.pop(req.index, None)
        if not blocks:
            return
        for b in reversed(blocks):
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                self.in_use[b] = False
                self._append_tail(b)

    def check_conservation(self) -> None:
        """INV-4: free-list length + in-use blocks == total, and refcounts are consistent."""
        free = self.free_list()
        assert len(free) == self.free_count, "free counter disagrees with the free list"
        in_use = sum(self.in_use)
        assert in_use + self.free_count == self.total_blocks, "KV blocks not conserved"
        for b in free:
            assert self.refcount[b] == 0 and not self.in_use[b], f"free block {b} is referenced"


class CpuTier:
    """The CPU tier of one instance: an LRU of block hashes with a fixed capacity (§3.8).

    ``store`` inserts a hash at the most-recent end (evicting the least recent one when full;
    a hash already present is left where it is); ``touch`` moves a present hash to the
    most-recent end. Nothing else removes a hash: a reload leaves its copy in the tier.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()  # first = least recently used
        self.evictions = 0

    def __contains__(self, h: int) -> bool:
        return h in self.lru

    def store(self, h: int) -> bool:
        """Insert ``h``; False (and no change) when it is already present."""
        if h in self.lru:
            return False
        if len(self.lru) >= self.capacity:
            self.lru.popitem(last=False)
            self.evictions += 1
        self.lru[h] = None
        return True

    def touch(self, h: int) -> None:
        self.lru.move_to_end(h)


class TieredKVCache(KVCache):
    """GPU blocks backed by a CPU tier (BLIS HEAD's ``TieredKVCache``, docs/semantics.md §3.8).

    * After every step the running batch's full hashed blocks are mirrored to the CPU tier
      (``mirror``): present ones touched, others stored (``mirror_stores``).
    * Every allocation first scans the request's prompt blocks past those it has (or those the
      caller found cached on the GPU) and reloads consecutive ones the GPU lacks but the CPU
      holds, at most as many as the GPU has free blocks: each takes the free list's head
      (evicting that block's cached content), becomes a cached free block at the tail, and
      costs ``base latency + ceil(block size / bandwidth)`` µs, charged to the step being
      formed (``take_pending_latency_us``). The allocation then claims what the reload made
      cached (``allocate``).
    * Queries (cached blocks, used blocks) see the GPU only.
    Counters: ``reloads`` (BLIS's cpuHitCount), ``cpu_misses`` (allocations that failed
    without reloading anything), ``mirror_stores``, the tier's ``evictions``, and
    ``thrash_reloads`` (reloads of a hash whose GPU copy was evicted less than
    ``thrash_window_us`` before: Decision 14's anomaly, not BLIS's).
    """

    def __init__(self, total_blocks: int, block_size_tokens: int,
                 hash_of: Callable[[object, int], int], cpu_blocks: int,
                 bandwidth_tokens_per_us: float, base_latency_us: int,
                 hash_at: Callable[[int | None, object, int], int] | None = None,
                 thrash_window_us: int = 0) -> None:
        super().__init__(total_blocks, block_size_tokens, hash_of, prefix_caching=True,
                         hash_at=hash_at)
        self.cpu = CpuTier(cpu_blocks)
        self.reload_cost_us = reload_cost_us(block_size_tokens, bandwidth_tokens_per_us,
                                             base_latency_us)
        self.pending_latency_us = 0
        self.reloads = 0
        self.cpu_misses = 0
        self.mirror_stores = 0
        self.request_reloads: dict[int, int] = {}
        # thrashing anomaly (Decision 14): reloads of a hash whose GPU copy was evicted less
        # than ``thrash_window_us`` before; the instance sets ``now_us`` at each step
        self.thrash_window_us = thrash_window_us
        self.now_us = 0
        self.evicted_at: dict[int, int] = {}
        self.thrash_reloads = 0

    def carry_counters(self, old: KVCache) -> None:
        super().carry_counters(old)
        self.reloads, self.cpu_misses = old.reloads, old.cpu_misses
        self.mirror_stores, self.thrash_reloads = old.mirror_stores, old.thrash_reloads
        self.cpu.evictions = old.cpu.evictions
        self.request_reloads = dict(old.request_reloads)

    def _evicted(self, h: int) -> None:
        self.evicted_at[h] = self.now_us

    # ---- reload (CPU → GPU) ----------------------------------------------------------------
    def reload_prefix(self, req, start_block: int, keep: list[int] = ()) -> int:
        """Reload the consecutive prompt blocks of ``req`` from ``start_block`` on that the GPU
        lacks and the CPU holds (blocks the GPU holds are skipped); returns how many.

        Each reload takes a free block. BLIS takes the free list's head even when that is a
        block of the very prefix the request found cached (``keep`` empty); with ``keep`` (the
        request's cached blocks) those are passed over, as vLLM holds a request's cached blocks
        before it allocates for the tokens it loads (docs/semantics.md §3.8, Decision 12)."""
        bs = self.block_size
        keep = frozenset(b for b in keep if not self.in_use[b])  # the free ones matter
        budget = self.free_count - len(keep)  # at most the (other) free blocks at entry
        count = 0
        for j in range(start_block, req.input_tokens // bs):
            h = self._hash_of(req, j)
            if h in self.hash_to_block:
                continue
            if h not in self.cpu or count >= budget:
                break
            evicted_us = self.evicted_at.get(h)
            if evicted_us is not None and self.now_us - evicted_us < self.thrash_window_us:
                self.thrash_reloads += 1
            b = self._pop_free(keep)
            self.num_tokens[b] = bs
            self.refcount[b] = 0
            self.in_use[b] = False
            self.block_hash[b] = h
            self.hash_to_block[h] = b
            self._append_tail(b)
            self.pending_latency_us += self.reload_cost_us
            self.cpu.touch(h)
            self.reloads += 1
            count += 1
        if count:
            self.request_reloads[req.index] = self.request_reloads.get(req.index, 0) + count
        return count

    def take_pending_latency_us(self) -> int:
        """Transfer time of the reloads since the last call (added to the step being formed)."""
        latency, self.pending_latency_us = self.pending_latency_us, 0
        return latency

    def allocate(self, req, start: int, end: int, cached: list[int] | None = None) -> bool:
        """BLIS's tiered ``AllocateKVBlocks``: reload first, then allocate (§3.8)."""
        cached = cached or []
        owned = self.request_blocks.get(req.index)
        scan_from = len(cached)
        chain_known = True
        if owned and len(owned) > scan_from:
            scan_from = len(owned)
            # BLIS seeds the scan's hash chain with the last owned block's hash: a partially
            # filled block has none yet, and a block off the true chain matches nothing
            chain_known = self.block_hash[owned[-1]] == self._hash_of(req, len(owned) - 1)
        if not (chain_known and self.reload_prefix(req, scan_from)):
            ok = super().allocate(req, start, end, cached)
            if not ok:
                self.cpu_misses += 1
            return ok
        bs = self.block_size
        now_cached = self.cached_blocks(req)
        new_start = len(now_cached) * bs
        if new_start <= start:
            return super().allocate(req, start, end, cached)
        first = -(-start // bs) if owned else 0
        if new_start >= end:
            last = min(-(-end // bs), len(now_cached))
            if not owned or first < last:
                self.claim(req, now_cached[first:last])
            return True
        self.claim(req, now_cached[first:new_start // bs])
        return super().allocate(req, new_start, end, now_cached)

    def allocate_reloaded(self, req, start: int, end: int, cached: list[int],
                          reloaded: int) -> bool:
        """Allocate for an admission whose reload already ran (``reload_prefix``) and whose
        ``cached`` prefix includes the reloaded blocks: no second scan. A failure without a
        reload counts as a CPU miss, as in ``allocate``."""
        ok = super().allocate(req, start, end, cached)
        if not ok and not reloaded:
            self.cpu_misses += 1
        return ok

    # ---- mirror (GPU → CPU) ----------------------------------------------------------------
    def mirror(self, running: list) -> None:
        """Copy the full hashed blocks of the running batch to the CPU tier, requests in batch
        order and each request's blocks in order (touching copies already there)."""
        bs = self.block_size
        for req in running:
            for b in self.request_blocks.get(req.index, ()):
                h = self.block_hash[b]
                if h is None or self.num_tokens[b] < bs:
                    continue
                if h in self.cpu:
                    self.cpu.touch(h)
                elif self.cpu.store(h):
                    self.mirror_stores += 1
