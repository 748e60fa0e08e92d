"""Policy programs in the reference engine: the expression tree evaluated in plain Python.

Counterpart: ``blisjax.engine.program`` (the same arithmetic over per-lane instructions).
The arithmetic (docs/policy-programs.md, Arithmetic): float64 throughout, every value finite
and normal — a result beyond the largest finite float is that float (``MAX_FLOAT``, with its
sign), one below the smallest normal float in magnitude (a subnormal, or -0.0) is 0.0, and
observables and constants are read the same way (XLA on CPU computes with subnormals as
zero, so a program never sees one); ``x / 0`` is 0; comparisons and ``and``/``or``/``not`` give 1.0 or 0.0 (any non-zero
value is true); ``min(a, b)`` is ``b`` if ``b < a`` else ``a`` and ``max`` alike;
``clip(x, lo, hi)`` is ``min(max(x, lo), hi)``; ``log1p`` follows the series of ``log1p``
below (x <= -1 gives ``-MAX_FLOAT``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping

from blisjax.program import Node, PolicyProgram
from blisjax.program.arithmetic import LN2, LOG_SERIES, MAX_FLOAT, MIN_NORMAL, SQRT_HALF
from blisjax.program.observables import (
    RECENT_SIGNALS,
    RECENT_WINDOW_US,
    SLO_CLASS_RANK,
)


def finite(x: float) -> float:
    """``x`` clamped to [-MAX_FLOAT, MAX_FLOAT] (an overflowed result), 0.0 where its
    magnitude is below ``MIN_NORMAL`` (a subnormal, or a zero of either sign)."""
    if x > MAX_FLOAT:
        return MAX_FLOAT
    if x < -MAX_FLOAT:
        return -MAX_FLOAT
    if abs(x) < MIN_NORMAL:
        return 0.0
    return x


def log1p(x: float) -> float:
    """log(1 + x) by one fixed sequence of IEEE operations (within a few ulp of the exact
    value): u = 1 + x; u = m·2^e with m in [√½, √2); s = (m−1)/(m+1);
    log m = 2s·Σ s^(2k)/(2k+1) (Horner, 12 terms); log u = e·ln 2 + log m; the result is
    log u · x/(u − 1), which corrects the rounding of 1 + x (x itself when u == 1)."""
    if x <= -1.0:
        return -MAX_FLOAT
    u = 1.0 + x
    if u == 1.0:
        return x
    m, e = math.frexp(u)
    if m < SQRT_HALF:
        m, e = m * 2.0, e - 1
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    poly = LOG_SERIES[-1]
    for coefficient in reversed(LOG_SERIES[:-1]):
        poly = coefficient + z * poly
    log_u = float(e) * LN2 + (2.0 * s) * poly
    return log_u * (x / (u - 1.0))


def _truth(x: bool) -> float:
    return 1.0 if x else 0.0


def evaluate(node: Node, values: Mapping[str, float]) -> float:
    """The value of ``node`` with names bound by ``values`` (observables and parameters),
    every node's value passed through ``finite``."""
    return finite(_evaluate(node, values))


def _evaluate(node: Node, values: Mapping[str, float]) -> float:
    op, args = node.op, node.args
    if op == "const":
        return node.value
    if op == "name":
        return values[node.name]
    if op == "if":
        cond = evaluate(args[0], values)
        return evaluate(args[1] if cond != 0.0 else args[2], values)
    x = [evaluate(a, values) for a in args]
    if op == "add":
        return x[0] + x[1]
    if op == "sub":
        return x[0] - x[1]
    if op == "mul":
        return x[0] * x[1]
    if op == "div":
        return 0.0 if x[1] == 0.0 else x[0] / x[1]
    if op == "neg":
        return -x[0]
    if op == "abs":
        return abs(x[0])
    if op == "log1p":
        return log1p(x[0])
    if op == "not":
        return _truth(x[0] == 0.0)
    if op == "and":
        return _truth(x[0] != 0.0 and x[1] != 0.0)
    if op == "or":
        return _truth(x[0] != 0.0 or x[1] != 0.0)
    if op == "min":
        return x[1] if x[1] < x[0] else x[0]
    if op == "max":
        return x[1] if x[1] > x[0] else x[0]
    if op == "clip":
        low = finite(x[1] if x[1] > x[0] else x[0])
        return x[2] if x[2] < low else low
    return _truth({"lt": x[0] < x[1], "le": x[0] <= x[1], "gt": x[0] > x[1],
                   "ge": x[0] >= x[1], "eq": x[0] == x[1], "ne": x[0] != x[1]}[op])


def run(program: PolicyProgram, observables: Mapping[str, float]) -> float:
    """The program's value for one decision (``observables``: every name it reads)."""
    return evaluate(program.node, {**observables, **dict(program.params)})


# ---- observables (docs/policy-programs.md, Observables) ----------------------------------------


def request_observables(req, now_us: int, tenant_in_flight: list[int]) -> dict[str, float]:
    """The request observables of ``req`` at ``now_us``."""
    prefix = req.prefix_length if req.prefix_group >= 0 else 0
    return {"input_tokens": float(req.input_tokens), "prefix_tokens": float(prefix),
            "slo_class_rank": float(SLO_CLASS_RANK[req.slo_class]),
            "tenant_in_flight": float(tenant_in_flight[req.tenant]),
            "age_ms": float(now_us - req.arrival_us) / 1000.0}


def cluster_observables(queue_depth: list[int], in_flight: list[int], kv_util: list[float],
                        members: list[int], arrivals: int) -> dict[str, float]:
    """The cluster observables over the instances ``members`` (summed in instance order);
    ``arrivals``: requests that arrived in the last ``RECENT_WINDOW_US``."""
    kv = 0.0
    for i in members:
        kv += kv_util[i]
    n = len(members)
    return {"cluster_queue_depth": float(sum(queue_depth[i] for i in members)),
            "cluster_in_flight": float(sum(in_flight[i] for i in members)),
            "cluster_kv_utilization": kv / float(n) if n else 0.0,
            "instances": float(n),
            "arrival_rate": float(arrivals) / (float(RECENT_WINDOW_US) / 1e6)}


def recent_arrivals(arrival_us: list[int], now_us: int) -> int:
    """Requests of the (sorted) ``arrival_us`` that arrived in (now − RECENT_WINDOW_US, now]."""
    return bisect_right(arrival_us, now_us) - bisect_right(arrival_us, now_us - RECENT_WINDOW_US)


class RecentSignals:
    """One instance's recent signals (``RECENT_SIGNALS``): per signal a (sum, count) of the
    current window of ``RECENT_WINDOW_US`` (aligned at its multiples) and of the previous one.
    Events are recorded at the step that produces them (its start, as everything a step does):
    a TTFT (µs, 1), a completion's ITL (µs summed, entries), an admission into the batch
    (arrival to admission µs, 1; cached prompt tokens, prompt tokens)."""

    TTFT, ITL, WAIT, HIT = range(len(RECENT_SIGNALS))

    def __init__(self) -> None:
        self.window = -2  # index of the current window (none yet)
        self.prev = [(0, 0)] * len(RECENT_SIGNALS)
        self.cur = [(0, 0)] * len(RECENT_SIGNALS)

    def record(self, now_us: int, signal: int, amount: int, count: int) -> None:
        k = now_us // RECENT_WINDOW_US
        if k == self.window + 1:
            self.prev, self.cur = self.cur, [(0, 0)] * len(RECENT_SIGNALS)
        elif k > self.window + 1:
            self.prev = self.cur = [(0, 0)] * len(RECENT_SIGNALS)
        self.window = max(self.window, k)
        total, n = self.cur[signal]
        self.cur = list(self.cur)
        self.cur[signal] = (total + amount, n + count)

    def values(self, now_us: int) -> dict[str, float]:
        """The signals at ``now_us``: sums over the current and previous window (only those
        that are, at ``now_us``, its current or previous one); 0 without events."""
        k = now_us // RECENT_WINDOW_US
        out = {}
        for j, name in enumerate(RECENT_SIGNALS):
            if k == self.window:
                total, n = self.prev[j][0] + self.cur[j][0], self.prev[j][1] + self.cur[j][1]
            elif k == self.window + 1:
                total, n = self.cur[j]
            else:
                total, n = 0, 0
            scale = 1.0 if j == self.HIT else 1000.0  # µs → ms
            out[name] = float(total) / (scale * float(n)) if n > 0 else 0.0
        return out
