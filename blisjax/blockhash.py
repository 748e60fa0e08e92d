"""Prefix-cache block identity: 64-bit chained hashes shared by both engines.

BLIS hashes a full KV block as SHA-256 of the previous block's hash and the block's token ids.
Our requests carry no token ids, so a block is identified by *what its tokens are* (docs/semantics.md
Decision 9): a block lying entirely inside a request's shared prefix is the same content for
every request of that prefix group, so it is keyed by ``(group, block index)``; any other block
(prompt tail, or output tokens written during decode) is unique to its request, keyed by
``(request, block index)``. In a closed-loop session whose prompts accumulate, a block lying
within the tokens the request shares with its conversation (``blisjax.workload.sessions.
content_tokens``) is keyed by ``(session, block index)``: every round holding it holds the same
tokens. Chaining each block's hash with its predecessor's gives the same
prefix property as BLIS's chain: two requests share block ``j`` iff they share blocks ``0..j``.

The mixer is SplitMix64's finaliser (Steele et al.), used as a fixed 64-bit permutation; all
arithmetic is modulo 2**64 so the JAX engine can reproduce it with ``uint64`` operations.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
_KIND_SESSION = 0
_KIND_REQUEST = 1
_KIND_GROUP = 2
_KIND_MISALIGNED = 3  # bit 61 then tells a group's content from a request's
# The chain starts from this value (BLIS: the empty string as the "previous hash").
CHAIN_SEED = 0


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a bijection on 64-bit integers with good avalanche."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
    return x ^ (x >> 31)


def block_code(request_index: int, group: int, prefix_length: int, block_index: int,
               block_size_tokens: int, session: int = -1, session_tokens: int = 0) -> int:
    """Content identity of block ``block_index`` of a request (before chaining).

    ``group`` is the request's prefix-group code (-1 for none) and ``prefix_length`` its shared
    prefix in tokens. A block is group-shared iff all its tokens lie inside the prefix; else
    session-shared iff ``session >= 0`` and all its tokens lie within ``session_tokens``.
    """
    end = (block_index + 1) * block_size_tokens
    if group >= 0 and end <= prefix_length:
        return (_KIND_GROUP << 62) | (group << 24) | block_index
    if session >= 0 and end <= session_tokens:
        return (_KIND_SESSION << 62) | (session << 24) | block_index
    return (_KIND_REQUEST << 62) | (request_index << 24) | block_index


def content_code(request_index: int, group: int, prefix_length: int, start_token: int,
                 block_size_tokens: int, session: int = -1, session_tokens: int = 0) -> int:
    """Content identity of a full block holding a request's tokens ``start_token ..
    start_token + block_size_tokens - 1``: ``block_code`` of its block index when the block is
    aligned, else a code of its own (a tiered reload can leave a request's blocks covering
    positions that are not multiples of the block size, docs/semantics.md §3.8). Shared by the
    prefix group iff all its tokens lie inside the prefix, else by the session iff all lie
    within ``session_tokens``."""
    if start_token % block_size_tokens == 0:
        return block_code(request_index, group, prefix_length,
                          start_token // block_size_tokens, block_size_tokens, session,
                          session_tokens)
    end = start_token + block_size_tokens
    if group >= 0 and end <= prefix_length:
        return (_KIND_MISALIGNED << 62) | (1 << 61) | (group << 24) | start_token
    if session >= 0 and end <= session_tokens:
        return (_KIND_MISALIGNED << 62) | (1 << 60) | (session << 24) | start_token
    return (_KIND_MISALIGNED << 62) | (request_index << 24) | start_token


def chain(prev_hash: int, code: int) -> int:
    """Hash of a block given its predecessor's hash and its own content identity."""
    return mix64(prev_hash ^ mix64(code))


def block_hashes(request_index: int, group: int, prefix_length: int, num_blocks: int,
                 block_size_tokens: int) -> list[int]:
    """Chained hashes of blocks ``0 .. num_blocks-1`` of a request (list of Python ints)."""
    out: list[int] = []
    h = CHAIN_SEED
    for j in range(num_blocks):
        h = chain(h, block_code(request_index, group, prefix_length, j, block_size_tokens))
        out.append(h)
    return out
