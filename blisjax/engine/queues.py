"""Wait-queue ring buffer and running-batch order operations for one instance of one lane.

Counterpart: ``blisjax.reference.instance.Instance.wait_queue`` (a deque: ``q_push_back`` is
``append``, ``q_push_front`` ``appendleft``, ``q_remove_at`` ``remove``/``popleft``) and
``Instance.running`` (a list in batch order: ``order_remove_at`` is ``remove``/``pop``). The
queue is a ring ``queue.buf[i, (queue.head + k) % Q]`` of ``queue.length`` request ids
(``QueueState``, this module's part of ``SimState``); the running batch is
``batch.order[i, :n_run]``, batch slots in running order (a slot holds a request's block
table; ``batch.BatchState``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import add, lane_while, upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import NIL, SimState


@pytree_dataclass
class QueueState:
    """Each instance's wait queue (``Instance.wait_queue``) as a ring; I instances, Q slots."""

    buf: jax.Array  # int32 [I, Q]: ring buffer of request ids
    head: jax.Array  # int32 [I]: ring index of the queue's head
    length: jax.Array  # int32 [I]: queued requests


def init_queue(st) -> QueueState:
    """Every queue empty."""
    i = st.shapes.num_instances
    return QueueState(buf=jnp.full((i, st.shapes.queue_slots), NIL, jnp.int32),
                      head=jnp.zeros(i, jnp.int32), length=jnp.zeros(i, jnp.int32))


def q_at(s: SimState, st, i, k):
    """Request at offset k from the head of instance i's wait queue."""
    return s.queue.buf[i, (s.queue.head[i] + k) % st.shapes.queue_slots]


def q_push_back(s: SimState, st, i, r, active) -> SimState:
    full = s.queue.length[i] >= st.shapes.queue_slots
    ok = active & ~full
    pos = (s.queue.head[i] + s.queue.length[i]) % st.shapes.queue_slots
    return s.replace(queue=s.queue.replace(buf=upd(s.queue.buf, (i, pos), r, ok),
                                           length=add(s.queue.length, i, 1, ok)),
                     run=s.run.replace(
                         ovf_queue=s.run.ovf_queue + (active & full).astype(jnp.int32)))


def q_push_front(s: SimState, st, i, r, active) -> SimState:
    full = s.queue.length[i] >= st.shapes.queue_slots
    ok = active & ~full
    head = (s.queue.head[i] - 1) % st.shapes.queue_slots
    return s.replace(queue=s.queue.replace(buf=upd(s.queue.buf, (i, head), r, ok),
                                           head=upd(s.queue.head, i, head, ok),
                                           length=add(s.queue.length, i, 1, ok)),
                     run=s.run.replace(
                         ovf_queue=s.run.ovf_queue + (active & full).astype(jnp.int32)))


Q_CHUNK = 64  # queue entries per iteration of a scan or shift (work follows the queue length)


def q_chunk(st) -> int:
    return max(1, min(Q_CHUNK, st.shapes.queue_slots))


def q_fold(s: SimState, st, i, active, fold, acc):
    """Fold instance i's queued requests into ``acc``, ``q_chunk`` entries per iteration, head
    first: ``fold(acc, offsets[C], requests[C], valid[C]) -> acc`` must return ``acc``
    unchanged where ``valid`` is all False. Iterations follow the longest queue of the lanes
    that fold, so a scan costs O(queue length), not O(queue slots)."""
    c, n_len = q_chunk(st), jnp.where(active, s.queue.length[i], 0)

    def body(carry, go):
        start, acc = carry
        off = start + jnp.arange(c, dtype=jnp.int32)
        valid = go & (off < n_len)
        reqs = jnp.where(valid, q_at(s, st, i, jnp.minimum(off, st.shapes.queue_slots - 1)),
                         st.shapes.num_requests)
        return start + go.astype(jnp.int32) * c, fold(acc, off, reqs, valid)

    return lane_while(lambda carry: carry[0] < n_len, body, (jnp.asarray(0, jnp.int32), acc))[1]


def q_remove_at(s: SimState, st, i, k, active, through=None):
    """Remove the entry at offset k: the k entries before it move back by one and the head
    advances (O(1) at the head, as fcfs always is; otherwise ``q_chunk`` entries per loop
    iteration, from offset k - 1 down to 0). Entries past the queue length are never read."""
    q, c = st.shapes.queue_slots, q_chunk(st)
    hi0 = jnp.where(active, k, 0).astype(jnp.int32)

    def shift(carry, go):
        # top-down: each chunk reads its sources before any lower chunk overwrites them
        q_buf, hi, kept = carry
        off = hi - 1 - jnp.arange(c, dtype=jnp.int32)
        move = go & (off >= 0)
        src = (s.queue.head[i] + jnp.maximum(off, 0)) % q
        dst = jnp.where(move, (src + 1) % q, q)
        q_buf = q_buf.at[i, dst].set(q_buf[i, src], mode="drop")
        return q_buf, jnp.where(go, jnp.maximum(hi - c, 0), hi), kept

    # Values read from the queue before (``through``) ride in the loop's carry, so nothing
    # re-reads the old queue afterwards and XLA updates it in place.
    q_buf, _, through_out = lane_while(lambda carry: carry[1] > 0, shift,
                                       (s.queue.buf, hi0, through))
    s = s.replace(queue=s.queue.replace(
                      buf=q_buf,
                      head=upd(s.queue.head, i, (s.queue.head[i] + 1) % q, active),
                      length=add(s.queue.length, i, -1, active)))
    return s if through is None else (s, through_out)


def q_offset_of(s: SimState, st, i, r, active):
    """Offset of request r in instance i's wait queue (queue_slots if absent)."""
    def fold(best, off, reqs, valid):
        return jnp.minimum(best, jnp.min(jnp.where(valid & (reqs == r), off,
                                                   st.shapes.queue_slots)))

    return q_fold(s, st, i, active, fold, jnp.asarray(st.shapes.queue_slots, jnp.int32))


def order_remove_at(s: SimState, st, i, pos, active) -> SimState:
    """Remove running position pos (later positions move up by one)."""
    b = st.shapes.batch_slots
    idx = jnp.arange(b)
    src = jnp.minimum(jnp.where(idx >= pos, idx + 1, idx), b - 1)
    row = jnp.where(idx < s.batch.n_run[i] - 1, s.batch.order[i, src], NIL)
    return s.replace(batch=s.batch.replace(
                         order=upd(s.batch.order, i, row, active),
                         n_run=add(s.batch.n_run, i, -1, active)))


class RunningSlots(NamedTuple):
    """Running positions 0 .. width - 1 of an instance (``running_slots``); each [width]."""

    valid: jax.Array  # bool: position < n_run
    slots: jax.Array  # int32: the position's batch slot (0 where not valid)
    reqs: jax.Array  # int32: the slot's request (N, the sink row, where not valid)


def running_slots(s: SimState, st, i, width: int) -> RunningSlots:
    """Valid flags, batch slots and requests of running positions 0..width-1 (width >=
    n_run)."""
    pos = jnp.arange(width)
    valid = pos < s.batch.n_run[i]
    slots = jnp.maximum(s.batch.order[i, :width], 0)
    reqs = jnp.where(valid, s.batch.slot_req[i, slots], st.shapes.num_requests)
    return RunningSlots(valid, slots, reqs)
