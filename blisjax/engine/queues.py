"""Wait-queue ring buffer and running-batch order operations for one instance of one lane."""

from __future__ import annotations

import jax.numpy as jnp

from blisjax.engine.kv import add, lane_once, upd
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


def q_remove_at(s: SimState, st, i, k, active, through=None):
    """Remove the entry at offset k: the k entries before it move back by one and the head
    advances (O(1) at the head, as fcfs always is; O(queue slots) otherwise, and then only run
    when some lane needs it). Entries past the queue length are never read."""
    q = st.queue_slots
    mid = active & (k > 0)

    def shift(carry, go):
        q_buf, kept = carry
        # Offsets are computed from ``go`` (a loop variable) so that XLA cannot hoist this
        # O(queue slots) work out of the loop and run it even when no lane needs it.
        head, kk = jnp.where(go, s.q_head[i], 0), jnp.where(go, k, 0)
        idx = jnp.arange(q)
        off = (idx - head) % q
        src = jnp.where((off >= 1) & (off <= kk), idx - 1, idx) % q
        return q_buf.at[i].set(jnp.where(go, q_buf[i, src], q_buf[i])), kept

    # A one-shot loop updates in place (a cond copies). Values read from the queue before
    # (``through``) ride in its carry, so nothing re-reads the old queue afterwards.
    q_buf, through_out = lane_once(mid, shift, (s.q_buf, through))
    s = s.replace(q_buf=q_buf, q_head=upd(s.q_head, i, (s.q_head[i] + 1) % q, active),
                  q_len=add(s.q_len, i, -1, active))
    return s if through is None else (s, through_out)


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
