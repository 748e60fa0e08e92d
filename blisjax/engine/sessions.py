"""Closed-loop sessions in the JAX engine: follow-up rounds created at completions, and the
arrival stream that merges them with the workload's own arrivals.

Counterpart: ``blisjax.reference.cluster.ClusterSimulator._follow_up`` and its cluster arrival
events (rules: ``blisjax.workload.sessions``, docs/semantics.md §8.5). Compiled in only when the
workload has follow-ups (``EngineStatic.features.sessions``); otherwise ``SessionState`` is a set of
one-entry placeholders and nothing here runs.

* A session has at most one request alive, so per session one pending follow-up: its row and
  arrival (``pending_us``, INT64_MAX: none) and a generation stamp (``pending_gen``) that orders
  follow-ups arriving at the same time by creation, as the reference's cluster sequence numbers.
* The k-th admission takes the earliest arrival not yet admitted: the next initial row (rows
  0 .. N0 − 1 are in arrival order) or the earliest pending follow-up; at equal times the
  initial row first (its arrival event was created at the start). ``order[k]`` records the
  row, so the routing cursor follows the admissions.
* A follow-up's deadline is its arrival + its row's timeout (``WorkloadConsts.deadline_us``
  of a follow-up is relative; 0 = none); its timeout is an event of the instance holding it
  (``timeouts``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import COMPLETED, DECODE, QUEUED, RUNNING, parent_row, prefill_row
from blisjax.engine.vec import prefix_sum
from blisjax.limits import INT64_MAX
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US


@pytree_dataclass
class SessionState:
    """Shapes: N + 1 request rows (row N a sink), S sessions; one-entry placeholders without
    sessions."""

    arrival_us: jax.Array  # int64 [N + 1]: each row's arrival once known (admission for the
    #                        workload's rows, creation for a follow-up)
    order: jax.Array  # int32 [N + 1]: the row of the k-th admission
    init_cursor: jax.Array  # int32: the next initial row to arrive
    pending_us: jax.Array  # int64 [S]: arrival of the session's follow-up not yet admitted
    pending_row: jax.Array  # int32 [S]: the session's latest follow-up (N: none)
    pending_gen: jax.Array  # int64 [S]: its creation stamp
    gen_clock: jax.Array  # int64: the next creation stamp
    created: jax.Array  # int32: follow-ups created so far
    stale_next: jax.Array  # int32 [S]: the session's completed follow-ups whose pending
    #                        timeout was handled (``stale_timeout``)
    rounds_overflow: jax.Array  # int32: follow-ups a session out of rows would have sent
    #                             (``Workload.session_unbounded``; flagged)


def init_sessions(st) -> SessionState:
    if not st.features.sessions:
        one = lambda dtype, v=0: jnp.full(1, v, dtype)  # noqa: E731
        return SessionState(arrival_us=one(jnp.int64), order=one(jnp.int32),
                            init_cursor=jnp.asarray(0, jnp.int32), pending_us=one(jnp.int64),
                            pending_row=one(jnp.int32), pending_gen=one(jnp.int64),
                            gen_clock=jnp.asarray(0, jnp.int64),
                            created=jnp.asarray(0, jnp.int32), stale_next=one(jnp.int32),
                            rounds_overflow=jnp.asarray(0, jnp.int32))
    rows, ns = st.shapes.num_requests + 1, st.shapes.num_sessions
    return SessionState(
        arrival_us=jnp.full(rows, FOLLOW_UP_ARRIVAL_US, jnp.int64),
        order=jnp.full(rows, st.shapes.num_requests, jnp.int32),
        init_cursor=jnp.asarray(0, jnp.int32),
        pending_us=jnp.full(ns, INT64_MAX, jnp.int64),
        pending_row=jnp.full(ns, st.shapes.num_requests, jnp.int32),
        pending_gen=jnp.zeros(ns, jnp.int64), gen_clock=jnp.asarray(0, jnp.int64),
        created=jnp.asarray(0, jnp.int32), stale_next=jnp.zeros(ns, jnp.int32),
        rounds_overflow=jnp.asarray(0, jnp.int32))


def arrival_us(s, st, c, r):
    """Request r's arrival (its row's constant without sessions; a P/D prefill sub-request's
    row: its parent's)."""
    if not st.features.sessions:
        return c.arrival_us[r]
    return s.sess.arrival_us[parent_row(st, r) if st.features.pd else r]


def deadline_us(s, st, c, r):
    """Request r's deadline, 0 = none (a follow-up's: its arrival + the session timeout)."""
    if not st.features.sessions:
        return c.deadline_us[r]
    timeout = c.deadline_us[r]
    return jnp.where(c.follow_up[r], jnp.where(timeout > 0, arrival_us(s, st, c, r) + timeout, 0),
                     timeout)


class NextArrival:
    """The earliest arrival not yet admitted (``next_arrival``)."""

    def __init__(self, t_us, row, initial, session):
        self.t_us = t_us  # int64 (INT64_MAX: none)
        self.row = row  # int32
        self.initial = initial  # bool: the next initial row (else a follow-up)
        self.session = session  # int32: the follow-up's session


def next_arrival(s, st, c) -> NextArrival:
    q = s.sess
    ic = q.init_cursor
    t_init = jnp.where(ic < c.initial_rows,
                       c.arrival_us[jnp.minimum(ic, st.shapes.num_requests)], INT64_MAX)
    t_min = jnp.min(q.pending_us)
    k = jnp.argmin(jnp.where(q.pending_us == t_min, q.pending_gen, INT64_MAX)).astype(jnp.int32)
    initial = t_init <= t_min
    t = jnp.minimum(t_init, t_min)
    row = jnp.where(initial, jnp.minimum(ic, st.shapes.num_requests), q.pending_row[k])
    return NextArrival(t, row.astype(jnp.int32), initial, k)


def arrived_by(s, st, c, t):
    """Arrivals at or before ``t`` (the workload's rows and the follow-ups created so far;
    ``t`` no later than the event being handled), in O(log N + S): the admitted ones by a
    binary search of their arrivals (admissions take arrivals in order, ``order``; the one
    being admitted included), plus those not admitted yet — initial rows from the cursor on
    and pending follow-ups."""
    q = s.sess
    n = st.shapes.num_requests
    # positions before the cursor, and at it the admission being handled (``admit_next``
    # wrote its row; else the row is N)
    lo = jnp.asarray(0, jnp.int32)
    hi = jnp.minimum(s.cursors.admit + 1, n).astype(jnp.int32)
    for _ in range(n.bit_length() + 1):  # the first admitted arrival later than t
        mid = (lo + hi) // 2
        row = q.order[jnp.minimum(mid, n)]
        later = (row >= n) | (q.arrival_us[jnp.minimum(row, n)] > t)
        searching = lo < hi
        lo, hi = jnp.where(searching & ~later, mid + 1, lo), jnp.where(searching & later, mid, hi)
    waiting = jnp.searchsorted(c.arrival_us[:n], t, side="right") - q.init_cursor
    pending = jnp.sum((q.pending_us <= t).astype(jnp.int32))
    return lo + jnp.maximum(waiting, 0).astype(jnp.int32) + pending


def admit_next(s, st, c, active):
    """The admission at the cursor takes the next arrival: returns (state, its row)."""
    q = s.sess
    nxt = next_arrival(s, st, c)
    r = jnp.where(active, nxt.row, st.shapes.num_requests)
    from_init = active & nxt.initial
    q = q.replace(
        order=q.order.at[jnp.where(active, s.cursors.admit, st.shapes.num_requests)].set(r),
        init_cursor=q.init_cursor + from_init.astype(jnp.int32),
        arrival_us=q.arrival_us.at[jnp.where(from_init, r, st.shapes.num_requests)].set(
            c.arrival_us[r]),
        pending_us=upd(q.pending_us, nxt.session, INT64_MAX, active & ~nxt.initial))
    return s.replace(sess=q), r


def create_follow_ups(s, st, c, reqs, fin, rank, *, start_us, left_us):
    """The requests ``reqs`` where ``fin`` completed (normally or at the length cap) in one
    step from ``start_us`` to ``left_us``, ``rank`` their batch order (positions in that
    order): each one's next round, if any, arrives a think time after ``left_us`` unless the
    follow-up budget is spent (``WorkloadConsts.follow_up_budget``, counted in batch order)
    or that is past the horizon (``ClusterSimulator._follow_up``). A session out of rows
    whose rows are a capacity (a concurrency user's) that would send one more is counted in
    ``rounds_overflow`` instead. With P/D pools a prefill sub-request's completion creates
    nothing, and with ``blis_quirks`` a decode sub-request's round completes at
    ``start_us`` plus the post-decode overhead (BLIS's ``detectDecodeCompletions``)."""
    q = s.sess
    n = st.shapes.num_requests
    if st.features.pd:
        fin = fin & (reqs < n)
        if st.settings.blis_quirks:
            left_us = jnp.where(s.pd.phase[jnp.minimum(reqs, n)] == DECODE,
                                start_us + st.settings.post_decode_us, left_us)
    nxt = c.next_row[reqs]
    row = jnp.maximum(nxt, 0)
    if st.features.open_sessions:
        out_of_rows = (nxt < 0) & c.open_row[reqs]  # think: the user's own, on every row
        t = left_us + jnp.where(out_of_rows, c.think_us[reqs], c.think_us[row])
        due = fin & ((nxt >= 0) | out_of_rows) & (t <= c.horizon_us)
        before = prefix_sum(due.astype(jnp.int32)) - due  # earlier in batch order
        room = c.follow_up_budget - q.created
        due = due & ((c.follow_up_budget < 0) | (before < room))
        make = due & (nxt >= 0)
        q = q.replace(rounds_overflow=q.rounds_overflow
                      + jnp.sum(due & out_of_rows).astype(jnp.int32))
    else:
        t = left_us + c.think_us[row]
        make = fin & (nxt >= 0) & (t <= c.horizon_us)
    sess = jnp.where(make, c.session[reqs], st.shapes.num_sessions)
    stamp = q.gen_clock + rank.astype(jnp.int64)
    q = q.replace(
        pending_us=q.pending_us.at[sess].set(t, mode="drop"),
        pending_row=q.pending_row.at[sess].set(row.astype(jnp.int32), mode="drop"),
        pending_gen=q.pending_gen.at[sess].set(stamp, mode="drop"),
        arrival_us=q.arrival_us.at[jnp.where(make, row, n)].set(t),
        gen_clock=q.gen_clock + jnp.sum(fin).astype(jnp.int64),
        created=q.created + jnp.sum(make).astype(jnp.int32))
    return s.replace(sess=q)


def arrivals_known(s, st, c):
    """Requests whose arrival exists: the workload's own rows and the follow-ups created so far
    (the workload's rows without sessions)."""
    if st.features.sessions:
        return c.initial_rows + s.sess.created
    return c.rows


class StaleTimeout(NamedTuple):
    """The earliest pending timeout of a completed follow-up (``stale_timeout``)."""

    t_us: jax.Array  # int64 (INT64_MAX: none)
    req: jax.Array  # int32


def stale_timeout(s, st, c) -> StaleTimeout:
    """A follow-up that completed before its deadline leaves its timeout pending on its
    instance (the reference cancels it lazily, when it comes up): the earliest such deadline
    within the horizon not yet handled, ties to the lowest row. Compiled in only with
    lifecycles, whose last event it can be. A session's rounds complete in order and share one
    timeout (``Workload.validate``), so their pending timeouts come up in round order: each
    session's next one is its follow-up ``stale_next`` (one entry per session); with P/D
    pools a completed prefill sub-request leaves its timeout pending as well."""
    sessions = jnp.arange(st.shapes.num_sessions)
    rows = jnp.minimum(c.follow_start + s.sess.stale_next, st.shapes.num_requests)
    timeout = c.deadline_us[rows]
    dl = s.sess.arrival_us[rows] + timeout
    done = s.status[rows] == COMPLETED
    if st.features.pd:  # a completed prefill sub-request's timeout is pending while its request is
        # off every instance (in transfer, or dropped at the decode side's reservation)
        off = (s.status[rows] != QUEUED) & (s.status[rows] != RUNNING)
        done = done | (off & (s.status[prefill_row(st, rows)] == COMPLETED))
    stale = c.follow_up[rows] & (c.session[rows] == sessions) & done & (timeout > 0) \
        & (dl <= c.horizon_us) & ~s.tdone[rows]
    t = jnp.where(stale, dl, INT64_MAX)
    k = jnp.argmin(t)  # ties: the lowest session, whose rows come first
    return StaleTimeout(t[k], rows[k].astype(jnp.int32))


def stale_handled(s, st, c, row, go):
    """The pending timeout of follow-up ``row`` was handled where ``go``."""
    q = s.sess
    k = jnp.where(go & c.follow_up[row], c.session[row], st.shapes.num_sessions)
    return s.replace(sess=q.replace(stale_next=q.stale_next.at[k].add(1, mode="drop")))


class SessionTimeouts:
    """Each instance's earliest follow-up timeout (``timeouts``), [I]."""

    def __init__(self, t_us, req, seq):
        self.t_us, self.req, self.seq = t_us, req, seq


def timeouts(s, st, c) -> SessionTimeouts:
    """Follow-ups queued or running whose deadline is within the horizon: per instance the
    earliest, ties to the one enqueued first (the reference's instance event order)."""
    q = s.sess
    rows = q.pending_row
    held = lambda row: (s.status[row] == QUEUED) | (s.status[row] == RUNNING)  # noqa: E731
    live = (rows < st.shapes.num_requests) & held(rows)
    if st.features.pd:  # the deadline is its prefill sub-request's while that is on an instance
        pre = prefill_row(st, rows)  # the sink's shadow (2N + 1) for none
        first = (rows < st.shapes.num_requests) & held(pre)
        rows, live = jnp.where(first, pre, rows), live | first
    timeout = c.deadline_us[rows]
    dl = arrival_us(s, st, c, rows) + timeout
    due = live & (timeout > 0) & (dl <= c.horizon_us)
    on = due[None, :] & (s.instance[rows][None, :] == jnp.arange(st.shapes.num_instances)[:, None])
    t = jnp.where(on, dl[None, :], INT64_MAX)  # [I, S]
    t_min = jnp.min(t, axis=1)
    seq = jnp.where(on & (t == t_min[:, None]), s.enq_seq[rows][None, :], INT64_MAX)
    k = jnp.argmin(seq, axis=1)
    return SessionTimeouts(t_min, rows[k], jnp.min(seq, axis=1))
