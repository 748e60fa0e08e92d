"""Block-level KV cache with prefix caching, as BLIS models vLLM (docs/semantics.md §3).

State: blocks 0..N-1 with a refcount, an in-use flag, a token count and an optional hash; a
per-request ordered block list; ``hash → block`` for prefix lookup; and a doubly linked free list
(LRU order: allocation pops the head, release appends to the tail). Freed blocks keep their hash
(lazy deletion) so they can still be hit until they are reused.
"""

from __future__ import annotations

from collections.abc import Callable

_NIL = -1


class KVCache:
    """One instance's KV blocks. ``hash_of(req, j)`` gives the chained hash of a request's block j."""

    def __init__(self, total_blocks: int, block_size_tokens: int,
                 hash_of: Callable[[object, int], int], prefix_caching: bool = True) -> None:
        self.total_blocks = total_blocks
        self.block_size = block_size_tokens
        self.prefix_caching = prefix_caching
        self._hash_of = hash_of
        self.refcount = [0] * total_blocks
        self.in_use = [False] * total_blocks
        self.num_tokens = [0] * total_blocks
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
        while remaining > 0:
            blocks = self.request_blocks.get(req.index)
            if blocks is None:
                # First allocation of this request: claim the cached prefix blocks.
                blocks = []
                for b in cached:
                    self.refcount[b] += 1
                    if not self.in_use[b]:
                        self.in_use[b] = True
                        self._unlink(b)
                    self.hits += 1
                    blocks.append(b)
                self.request_blocks[req.index] = blocks
            last = blocks[-1] if blocks else _NIL
            if last != _NIL and 1 <= self.num_tokens[last] < bs:
                k = min(bs - self.num_tokens[last], remaining)
                self.num_tokens[last] += k
                remaining -= k
                if self.num_tokens[last] == bs:  # filled (also during decode): register its hash
                    self._register(req, len(blocks) - 1, last)
                continue
            b = self._head
            self._unlink(b)
            old = self.block_hash[b]
            if old is not None:
                # Lazy deletion by hash value, as BLIS: may drop a newer mapping of the same hash.
                self.hash_to_block.pop(old, None)
                self.block_hash[b] = None
            k = min(bs, remaining)
            self.num_tokens[b] = k
            self.refcount[b] = 1
            self.in_use[b] = True
            self.misses += 1
            blocks.append(b)
            remaining -= k
            if k == bs and prefill:
                self._register(req, len(blocks) - 1, b)
        return True

    def _register(self, req, j: int, b: int) -> None:
        if not self.prefix_caching:
            return
        h = self._hash_of(req, j)
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
