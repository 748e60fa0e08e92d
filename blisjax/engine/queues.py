"""Wait-queue ring buffer and running-batch order operations for one instance of one lane."""

from __future__ import annotations

import jax.numpy as jnp

from blisjax.engine.kv import add, upd
from blisjax.engine.state import NIL, SimState


def q_at(s: SimState, st, i, k):
    """Request at offset k from the head of instance i's wait queue."""
    return s.q_buf[i, (s.q_head[i] + k) % st.queue_slots]


def q_push_back(s: SimState, st, i, r, active) -> SimState:
    full = s.q_len[i] >= st.queue_slots
    ok = active & ~full
    pos = (s.q_head[i] + s.q_len[i]) % st.queue_slots
    return s.replace(q_buf=upd(s.q_buf, (i, pos), r, ok), q_len=add(s.q_len, i, 1, ok),
                     ovf_queue=s.ovf_queue + (active & full).astype(jnp.int32))


def q_push_front(s: SimState, st, i, r, active) -> SimState:
    full = s.q_len[i] >= st.queue_slots
    ok = active & ~full
    head = (s.q_head[i] - 1) % st.queue_slots
    return s.replace(q_buf=upd(s.q_buf, (i, head), r, ok), q_head=upd(s.q_head, i, head, ok),
                     q_len=add(s.q_len, i, 1, ok),
                     ovf_queue=s.ovf_queue + (active & full).astype(jnp.int32))


def q_remove_at(s: SimState, st, i, k, active) -> SimState:
    """Remove the entry at offset k, closing the gap (O(queue slots), vectorised)."""
    q = st.queue_slots
    idx = jnp.arange(q)
    off = (idx - s.q_head[i]) % q
    src = jnp.where(off >= k, off + 1, off)
    row = s.q_buf[i, (s.q_head[i] + src) % q]
    return s.replace(q_buf=s.q_buf.at[i].set(jnp.where(active, row, s.q_buf[i])),
                     q_len=add(s.q_len, i, -1, active))


def q_offset_of(s: SimState, st, i, r):
    """Offset of request r in instance i's wait queue (queue_slots if absent)."""
    q = st.queue_slots
    off = (jnp.arange(q) - s.q_head[i]) % q
    here = (s.q_buf[i] == r) & (off < s.q_len[i])
    return jnp.min(jnp.where(here, off, q))


def order_remove_at(s: SimState, st, i, pos, active) -> SimState:
    """Remove running position pos (later positions move up by one)."""
    b = st.batch_slots
    idx = jnp.arange(b)
    src = jnp.minimum(jnp.where(idx >= pos, idx + 1, idx), b - 1)
    row = jnp.where(idx < s.n_run[i] - 1, s.order[i, src], NIL)
    return s.replace(order=s.order.at[i].set(jnp.where(active, row, s.order[i])),
                     n_run=add(s.n_run, i, -1, active))
