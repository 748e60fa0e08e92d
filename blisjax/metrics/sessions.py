"""Closed-loop session metrics (BLIS's ``=== Session Metrics ===``, ``sim/cluster/metrics.go``).

Over the completed requests that belong to a session: ``sessions`` = distinct sessions among
them; ``ttft_cold_ms`` = round-0 TTFTs, ``ttft_warm_ms`` = TTFTs of rounds ≥ 1; a session's
duration = the latest (arrival + E2E) of its completed rounds − its round 0's arrival, counted
when > 0 (``duration_ms``). Each distribution: ``mean``, ``p50``, ``p95``, ``p99`` (ms, BLIS's
linear-interpolation percentile) and ``n``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blisjax.metrics.percentile import mean, percentile_linear, sort_values
from blisjax.metrics.records import COMPLETED, RunResult
from blisjax.workload.types import NO_SESSION, Workload

__all__ = ["session_metrics", "session_metrics_text"]

_US_PER_MS = 1000.0


def _distribution_ms(values_us: np.ndarray) -> dict[str, Any]:
    v = sort_values(values_us)
    return {"mean": mean(v, _US_PER_MS), "p50": percentile_linear(v, 50, _US_PER_MS),
            "p95": percentile_linear(v, 95, _US_PER_MS),
            "p99": percentile_linear(v, 99, _US_PER_MS), "n": int(v.values.shape[0])}


def session_metrics(result: RunResult, workload: Workload) -> dict[str, Any]:
    """The session figures of a run; ``workload`` as the run saw it (``aggregate.session_view``:
    follow-ups with their arrivals)."""
    done = (np.asarray(result.status) == COMPLETED) & (workload.session != NO_SESSION)
    rows = np.flatnonzero(done)
    ttft = np.asarray(result.ttft_us, dtype=np.int64)
    cold = rows[workload.round_index[rows] == 0]
    warm = rows[workload.round_index[rows] > 0]
    # BLIS converts arrival and E2E to ms before taking the difference
    end_ms = (workload.arrival_us[rows].astype(np.float64) / _US_PER_MS
              + np.asarray(result.e2e_us, np.int64)[rows].astype(np.float64) / _US_PER_MS)
    start_ms: dict[int, float] = {}
    for i in np.flatnonzero((workload.session != NO_SESSION) & (workload.round_index == 0)):
        start_ms[int(workload.session[i])] = float(workload.arrival_us[i]) / _US_PER_MS
    latest: dict[int, float] = {}
    for i, end in zip(rows.tolist(), end_ms.tolist(), strict=True):
        s = int(workload.session[i])
        latest[s] = max(latest.get(s, end), end)
    durations = [latest[s] - start_ms[s] for s in sorted(latest) if latest[s] - start_ms[s] > 0]
    out = {"sessions": len(latest), "ttft_cold_ms": _distribution_ms(ttft[cold]),
           "ttft_warm_ms": _distribution_ms(ttft[warm])}
    # durations are already ms
    d = sort_values(np.asarray(durations, dtype=np.float64))
    out["duration_ms"] = {"mean": mean(d), "p50": percentile_linear(d, 50),
                          "p95": percentile_linear(d, 95), "p99": percentile_linear(d, 99),
                          "n": int(d.values.shape[0])}
    return out


def session_metrics_text(sessions: dict[str, Any]) -> str:
    """BLIS's ``=== Session Metrics ===`` block body (no header line, no trailing newline)."""

    def line(label: str, d: dict[str, Any]) -> str:
        return (f"{label}mean={d['mean']:.2f} p50={d['p50']:.2f} p95={d['p95']:.2f} "
                f"p99={d['p99']:.2f} ms (n={d['n']})")

    return "\n".join([f"  Sessions: {sessions['sessions']}",
                      line("  TTFT cold (round 0): ", sessions["ttft_cold_ms"]),
                      line("  TTFT warm (round≥1): ", sessions["ttft_warm_ms"]),
                      line("  Session duration:    ", sessions["duration_ms"])])
