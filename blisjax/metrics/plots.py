"""Replicas against load: the picture of an autoscaled run (``blisjax run --timeline-plot``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from blisjax.figures import new_figure, save_png
from blisjax.metrics.lifecycle import replica_timeline
from blisjax.metrics.records import RunResult

__all__ = ["plot_replicas"]

US_PER_S = 1e6


def _steps(result: RunResult, end_us: int, key: str) -> tuple[list[float], list[int]]:
    """(times in s, values) of a step line of ``key`` (replicas or routable) to ``end_us``;
    several changes at one time keep the last."""
    times, values = [], []
    for row in replica_timeline(result):
        t = row["time_us"] / US_PER_S
        if times and times[-1] == t:
            values[-1] = row[key]
        else:
            times.append(t)
            values.append(row[key])
    if times:
        times.append(end_us / US_PER_S)
        values.append(values[-1])
    return times, values


def plot_replicas(runs: Sequence[tuple[str, RunResult]], arrival_us: np.ndarray,
                  path: str | Path, title: str = "") -> Path:
    """Two panels sharing the time axis (s): the arrival rate (requests/s, in bins of a
    hundredth of the span, at least 1 s) and, per labelled run, the instances holding a slot
    (solid) and the routable ones (dotted) over time. Written as PNG to ``path``."""
    arrivals = np.asarray(arrival_us, dtype=np.int64)
    end_us = max([int(arrivals.max()) if arrivals.size else 0]
                 + [int(r.lifecycle.end_us) for _, r in runs if r.lifecycle is not None])
    width_s = max(1.0, end_us / US_PER_S / 100)
    edges = np.arange(0.0, end_us / US_PER_S + width_s, width_s)
    counts, _ = np.histogram(arrivals / US_PER_S, bins=edges)
    fig = new_figure(7.0, 5.0)
    load, reps = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 2]})
    load.stairs(counts / width_s, edges, fill=True, alpha=0.4, color="tab:gray")
    load.set_ylabel("arrivals (req/s)")
    load.grid(alpha=0.3)
    for k, (label, result) in enumerate(runs):
        color = f"C{k}"
        t, held = _steps(result, end_us, "replicas")
        reps.step(t, held, where="post", color=color, label=f"{label}: held")
        t, routable = _steps(result, end_us, "routable")
        reps.step(t, routable, where="post", color=color, linestyle=":",
                  label=f"{label}: routable")
    reps.set_xlabel("time (s)")
    reps.set_ylabel("instances")
    reps.grid(alpha=0.3)
    reps.legend(fontsize=8, loc="best")
    if title:
        load.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)
