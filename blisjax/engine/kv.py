"""KV-cache operations on one lane's state: free list, prefix lookup, allocate, release.

Same semantics as ``blisjax.reference.kvcache`` (read its docstring first). Block hashes are
replaced by *hash slots* — dense indices of a block's content identity — which the reference's
64-bit chained hashes identify one to one:

* block j of a request in prefix group g, lying inside the shared prefix → slot (instance, g, j);
* any other full prompt block j of request r → slot ``group_slots + own_base[r] + j``;
* blocks holding output tokens are never looked up (lookups walk full prompt blocks only), so
  they are not registered.

``slot_block[slot]`` plays ``hash_to_block``: registration overwrites, lazy deletion on reuse
clears the slot whatever block it points to (as BLIS deletes by hash value).

Every function takes ``active``: when False it must leave the state unchanged (the kernel runs
all handlers for all lanes in lockstep and masks the writes instead of selecting whole states).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from blisjax.engine.state import NIL, SimState

LANES = "lanes"  # the vmap axis name of a population


def lane_while(cond_fn, body_fn, init):
    """``while_loop`` for code vmapped over ``LANES``: runs while *any* lane's ``cond_fn`` holds
    and calls ``body_fn(carry, go)`` with this lane's ``go``; the body must leave the carry
    unchanged where ``go`` is False.

    A plain ``while_loop`` with a per-lane predicate under ``vmap`` selects between old and new
    values of its whole carry at every iteration — O(state size) per inner iteration. Reducing
    the predicate over the lane axis keeps each iteration O(what it touches).
    """
    def cond(carry):
        return lax.pmax(cond_fn(carry).astype(jnp.int32), LANES) > 0

    return lax.while_loop(cond, lambda carry: body_fn(carry, cond_fn(carry)), init)


def lane_any(pred):
    """True (unbatched) when ``pred`` holds in any lane."""
    return lax.pmax(pred.astype(jnp.int32), LANES) > 0


def lane_cond(pred, true_fn, false_fn, *operands):
    """``lax.cond`` on whether *any* lane's ``pred`` holds: the branch is skipped entirely (not
    run masked) when no lane needs it. ``true_fn`` must itself mask lanes where ``pred`` is
    False, like every handler."""
    return lax.cond(lane_any(pred), true_fn, false_fn, *operands)


def lane_once(active, handler, s):
    """``handler(s, active)`` run once if any lane is ``active``, skipped otherwise. For
    populations small enough that an event kind is often absent from every lane (P = 1)."""
    def body(carry, go):
        return handler(carry[0], go), jnp.zeros_like(go)

    return lane_while(lambda carry: carry[1], body, (s, active))[0]


def upd(arr, idx, val, active):
    """``arr[idx] = val`` where ``active``; otherwise unchanged (one gather + one scatter)."""
    return arr.at[idx].set(jnp.where(active, val, arr[idx]))


def add(arr, idx, delta, active):
    return arr.at[idx].add(jnp.where(active, delta, 0).astype(arr.dtype))


# ---- free list -------------------------------------------------------------------------------


def unlink(s: SimState, st, i, b, active) -> SimState:
    k = st.kv_blocks
    p, n = s.kv_prev[i, b], s.kv_next[i, b]
    nxt = s.kv_next.at[i, jnp.where(active & (p != NIL), p, k)].set(n)
    prv = s.kv_prev.at[i, jnp.where(active & (n != NIL), n, k)].set(p)
    nxt = upd(nxt, (i, b), NIL, active)
    prv = upd(prv, (i, b), NIL, active)
    return s.replace(
        kv_next=nxt, kv_prev=prv,
        kv_head=upd(s.kv_head, i, jnp.where(p == NIL, n, s.kv_head[i]), active),
        kv_tail=upd(s.kv_tail, i, jnp.where(n == NIL, p, s.kv_tail[i]), active),
        kv_free=add(s.kv_free, i, -1, active))


def append_tail(s: SimState, st, i, b, active) -> SimState:
    k = st.kv_blocks
    t = s.kv_tail[i]
    nxt = s.kv_next.at[i, jnp.where(active & (t != NIL), t, k)].set(b)
    nxt = upd(nxt, (i, b), NIL, active)
    prv = upd(s.kv_prev, (i, b), t, active)
    return s.replace(
        kv_next=nxt, kv_prev=prv,
        kv_head=upd(s.kv_head, i, jnp.where(t == NIL, b, s.kv_head[i]), active),
        kv_tail=upd(s.kv_tail, i, b, active),
        kv_free=add(s.kv_free, i, 1, active))


def pop_head(s: SimState, st, i, active):
    """Take the LRU head block; forget its old hash slot (lazy deletion)."""
    b = jnp.maximum(s.kv_head[i], 0)
    s = unlink(s, st, i, b, active)
    old = s.kv_slot[i, b]
    sink = st.hash_slots
    slot_block = s.slot_block.at[jnp.where(active & (old != NIL), old, sink)].set(NIL)
    return s.replace(slot_block=slot_block, kv_slot=upd(s.kv_slot, (i, b), NIL, active)), b


# ---- hash slots --------------------------------------------------------------------------------


def hash_slot(st, c, i, r, j):
    """Dense slot of block j of request r on instance i (valid for full prompt blocks)."""
    in_group = j < c.group_blocks[r]
    group_slot = (i * st.num_groups + jnp.maximum(c.group[r], 0)) * st.group_blocks_max + j
    return jnp.where(in_group, group_slot, st.group_slots + c.own_base[r] + j)


def register(s: SimState, st, c, i, r, j, b, active) -> SimState:
    """A full prompt block gets its identity registered (output blocks are never looked up)."""
    on = active & st.prefix_caching & (j < c.full_blocks[r])
    sl = hash_slot(st, c, i, r, j)
    return s.replace(slot_block=upd(s.slot_block, jnp.where(on, sl, st.hash_slots), b, on),
                     kv_slot=upd(s.kv_slot, (i, b), sl, on))


def cached_blocks(s: SimState, st, c, i, r):
    """(blocks[MPB], count): the longest chain of registered prompt blocks of r on instance i."""
    mpb = max(st.max_prompt_blocks, 1)
    j = jnp.arange(mpb, dtype=jnp.int32)
    valid = j < c.full_blocks[r]
    blocks = s.slot_block[jnp.where(valid, hash_slot(st, c, i, r, j), st.hash_slots)]
    hit = valid & (blocks >= 0)
    count = jnp.sum(jnp.cumprod(hit.astype(jnp.int32))).astype(jnp.int32)
    if not st.prefix_caching:
        count = jnp.zeros_like(count)
    return blocks, count


# ---- allocation --------------------------------------------------------------------------------


def can_allocate(s: SimState, st, c, i, sb, r, start, end, cached, n_cached):
    """BLIS's check-then-act pre-check (prefill vs decode by the request's PI)."""
    bs = st.block_size
    blen = s.blen[i, sb]
    last = s.bt[i, sb, jnp.maximum(blen - 1, 0)]
    filled = jnp.where(blen > 0, s.kv_tok[i, jnp.maximum(last, 0)], 0)
    spare = jnp.where((blen > 0) & (filled >= 1), bs - filled, 0)
    need = (jnp.maximum(0, (end - start) - spare) + bs - 1) // bs
    k = jnp.arange(cached.shape[0])
    not_in_use = (k < n_cached) & ~s.kv_used[i, jnp.maximum(cached, 0)]
    prefill_ok = need + jnp.sum(not_in_use) <= s.kv_free[i]
    decode_ok = jnp.where((blen == 0) | (filled >= bs), s.kv_free[i] > 0, True)
    return jnp.where(s.pi[r] < c.input_tokens[r], prefill_ok, decode_ok)


def allocate(s: SimState, st, c, i, sb, r, start, end, cached, n_cached, active):
    """Allocate token positions [start, end) of request r in batch slot sb. Assumes the
    pre-check passed; does nothing unless ``active``."""
    bs, mb = st.block_size, st.max_blocks_per_request
    prefill = s.pi[r] < c.input_tokens[r]
    remaining = jnp.where(active, end - start, 0)
    # 1. First allocation of the request: claim its cached prefix blocks.
    claim = (remaining > 0) & (s.blen[i, sb] == 0)
    n_claim = jnp.where(claim, n_cached, 0)

    def claim_body(carry, go):
        s, k = carry
        b = cached[jnp.minimum(k, cached.shape[0] - 1)]
        was_free = ~s.kv_used[i, b]
        s = unlink(s, st, i, b, go & was_free)
        s = s.replace(
            kv_ref=add(s.kv_ref, (i, b), 1, go), kv_used=upd(s.kv_used, (i, b), True, go),
            bt=upd(s.bt, (i, sb, jnp.minimum(k, mb - 1)), b, go))
        return s, k + go.astype(k.dtype)

    s, _ = lane_while(lambda c: c[1] < n_claim, claim_body, (s, jnp.asarray(0, jnp.int32)))
    s = s.replace(blen=upd(s.blen, (i, sb), n_cached, claim),
                  hits=add(s.hits, i, n_cached, claim))
    # 2. Fill the partially filled last block, if any.
    blen = s.blen[i, sb]
    last = jnp.maximum(s.bt[i, sb, jnp.maximum(blen - 1, 0)], 0)
    filled = s.kv_tok[i, last]
    partial = (remaining > 0) & (blen > 0) & (filled >= 1) & (filled < bs)
    k = jnp.minimum(bs - filled, remaining)
    s = s.replace(kv_tok=add(s.kv_tok, (i, last), k, partial))
    s = register(s, st, c, i, r, blen - 1, last, partial & (filled + k == bs))
    remaining = jnp.where(partial, remaining - k, remaining)

    # 3. Fresh blocks from the LRU head.
    def fresh_body(carry, go):
        s, remaining = carry
        s, b = pop_head(s, st, i, go)
        k = jnp.minimum(bs, remaining)
        blen = s.blen[i, sb]
        s = s.replace(
            kv_tok=upd(s.kv_tok, (i, b), k, go), kv_ref=upd(s.kv_ref, (i, b), 1, go),
            kv_used=upd(s.kv_used, (i, b), True, go), misses=add(s.misses, i, 1, go),
            bt=upd(s.bt, (i, sb, jnp.minimum(blen, mb - 1)), b, go),
            blen=upd(s.blen, (i, sb), blen + 1, go),
            ovf_blocks=s.ovf_blocks + (go & (blen >= mb)).astype(jnp.int32))
        s = register(s, st, c, i, r, blen, b, go & (k == bs) & prefill)
        return s, jnp.where(go, remaining - k, remaining)

    s, _ = lane_while(lambda c: c[1] > 0, fresh_body, (s, remaining))
    return s


def release(s: SimState, st, i, sb, active) -> SimState:
    """Free a slot's blocks last to first; blocks reaching refcount 0 go to the LRU tail."""
    n = jnp.where(active, s.blen[i, sb], 0)

    def body(carry, go):
        s, k = carry
        b = jnp.maximum(s.bt[i, sb, jnp.clip(n - 1 - k, 0, st.max_blocks_per_request - 1)], 0)
        ref = s.kv_ref[i, b] - 1
        s = s.replace(kv_ref=upd(s.kv_ref, (i, b), ref, go))
        freed = go & (ref == 0)
        s = s.replace(kv_used=upd(s.kv_used, (i, b), False, freed))
        return append_tail(s, st, i, b, freed), k + go.astype(k.dtype)

    s, _ = lane_while(lambda c: c[1] < n, body, (s, jnp.asarray(0, n.dtype)))
    return s.replace(blen=upd(s.blen, (i, sb), 0, active))
