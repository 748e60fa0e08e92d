"""Recent signals of each instance, for routing programs: TTFT, ITL, admission wait and cache
hit rate over the last windows.

Counterpart: ``blisjax.reference.program.RecentSignals`` (and ``recent_arrivals``). Per
instance and signal (``blisjax.program.observables.RECENT_SIGNALS``) a (sum, count) pair of
int64 for the current window of ``RECENT_WINDOW_US`` and the previous one; integer sums, so a
step's events add up in any order. Compiled in with routing programs
(``EngineStatic.recent_signals``); one-entry placeholders otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.engine import sessions
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.program.observables import RECENT_SIGNALS, RECENT_WINDOW_US

#: Signal indices (``RecentSignals.TTFT`` …).
TTFT, ITL, WAIT, HIT = range(len(RECENT_SIGNALS))
_S = len(RECENT_SIGNALS)
F64 = jnp.float64


@pytree_dataclass
class RecentState:
    """``SimState.recent``: window int64 [I] (index of the current window, -2 = none yet);
    sums, counts int64 [I, 2, S] (previous, current window; S signals)."""

    window: jax.Array
    sums: jax.Array
    counts: jax.Array


def init_recent(st) -> RecentState:
    """No events yet (one-entry placeholders where the program has no routing program)."""
    n = st.shapes.num_instances if st.recent_signals else 1
    z = jnp.zeros((n, 2, _S), jnp.int64)
    return RecentState(window=jnp.full(n, -2, jnp.int64), sums=z, counts=z)


def record(s, i, now, signal: int, amount, count, active):
    """Instance i's events of one step at ``now``: ``amount`` and ``count`` (int, summed
    already) added to ``signal`` (``RecentSignals.record``); nothing where ``active`` is false
    or ``count`` is 0."""
    t = s.recent
    go = active & (count > 0)
    k = now // RECENT_WINDOW_US
    w = t.window[i]
    sums, counts = t.sums[i], t.counts[i]
    zero = jnp.zeros_like(sums[0])
    rolled = k == w + 1
    fresh = k > w + 1
    prev = jnp.where(rolled, sums[1], jnp.where(fresh, zero, sums[0]))
    cur = jnp.where(rolled | fresh, zero, sums[1])
    prev_n = jnp.where(rolled, counts[1], jnp.where(fresh, zero, counts[0]))
    cur_n = jnp.where(rolled | fresh, zero, counts[1])
    hot = jnp.arange(_S) == signal
    cur = cur + jnp.where(hot, jnp.asarray(amount, jnp.int64), 0)
    cur_n = cur_n + jnp.where(hot, jnp.asarray(count, jnp.int64), 0)
    return s.replace(recent=t.replace(
        window=upd(t.window, i, jnp.maximum(w, k), go),
        sums=upd(t.sums, i, jnp.stack([prev, cur]), go),
        counts=upd(t.counts, i, jnp.stack([prev_n, cur_n]), go)))


def reset(t: RecentState, i, active) -> RecentState:
    """A new instance in slot i knows no events (``Instance.restart``)."""
    return t.replace(window=upd(t.window, i, -2, active), sums=upd(t.sums, i, 0, active),
                     counts=upd(t.counts, i, 0, active))


def values(t: RecentState, now) -> dict:
    """Each instance's signals at ``now`` (``RecentSignals.values``), float64 [I] per name."""
    k = now // RECENT_WINDOW_US
    both = (k == t.window)[:, None]
    last = (k == t.window + 1)[:, None]
    total = jnp.where(both, t.sums[:, 0] + t.sums[:, 1], jnp.where(last, t.sums[:, 1], 0))
    n = jnp.where(both, t.counts[:, 0] + t.counts[:, 1], jnp.where(last, t.counts[:, 1], 0))
    scale = jnp.asarray([1000.0 if j != HIT else 1.0 for j in range(_S)], F64)
    mean = ieee_divide(total.astype(F64), scale * jnp.maximum(n, 1).astype(F64))
    mean = jnp.where(n > 0, mean, 0.0)
    return {name: mean[:, j] for j, name in enumerate(RECENT_SIGNALS)}


def arrivals(s, st, c, now):
    """Requests that arrived in (now − RECENT_WINDOW_US, now] (``recent_arrivals``): the
    workload's rows (in arrival order), and with closed-loop sessions the follow-ups created
    so far at their arrival (``sessions.arrived_by``)."""
    if st.features.sessions:
        return (sessions.arrived_by(s, st, c, now)
                - sessions.arrived_by(s, st, c, now - RECENT_WINDOW_US))
    arrival = c.arrival_us[:st.shapes.num_requests]
    return (jnp.searchsorted(arrival, now, side="right")
            - jnp.searchsorted(arrival, now - RECENT_WINDOW_US, side="right"))
