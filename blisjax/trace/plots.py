"""Pictures of a decision trace: instance load over time, and a timeline close-up.

``plot_instances`` draws each instance's queue depth, batch size and KV utilization from the
``batch`` records (the counters of ``blisjax.trace.timeline``, same samples); ``plot_timeline``
draws a window of the Perfetto view as a still picture (step slices per instance, routing
decisions, a few request flows) for documents. Both take the JSON objects of ``trace.jsonl``
and write a PNG atomically.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from blisjax.figures import new_figure, save_png
from blisjax.trace.timeline import ROUTING_KINDS, counter_samples, instance_steps

__all__ = ["RequestFlow", "Series", "StepSlice", "busiest_window", "instance_series",
           "plot_instances", "plot_timeline", "request_flows", "routing_ticks",
           "window_slices"]

US_PER_S = 1e6
#: Default width of ``plot_timeline``'s window (µs).
WINDOW_US = 2_000_000
#: At most this many request flows drawn by ``plot_timeline``.
MAX_FLOWS = 8

PREFILL_COLOR = "tab:orange"
DECODE_COLOR = "tab:blue"
TICK_COLOR = "0.15"
FLOW_COLOR = "tab:red"


class Series(NamedTuple):
    """One instance's counters as step functions: value ``i`` holds from ``time_us[i]`` (µs) to
    the next time. Arrays of equal length; ``queue_depth`` and ``batch_size`` int64 counts,
    ``kv_utilization`` float64 fraction of the instance's KV blocks in use (0…1)."""

    time_us: np.ndarray
    queue_depth: np.ndarray
    batch_size: np.ndarray
    kv_utilization: np.ndarray


class StepSlice(NamedTuple):
    """A step drawn in a window: its instance, start and (cut) end in µs, and whether it did
    prefill work (admitted requests or further prefill chunks)."""

    instance: int
    start_us: int
    end_us: int
    prefill: bool


class RequestFlow(NamedTuple):
    """A request from its first routing decision (``routed_us``) to the end of the step that
    completed it last (``done_us``, on ``instance``), in µs."""

    request_id: int
    routed_us: int
    instance: int
    done_us: int


def instance_series(lines: Iterable[dict[str, Any]]) -> dict[int, Series]:
    """Per instance (in instance order), its counter samples: at every step start the
    ``batch`` record's state, and at the end of a step followed by idle time (or the last one)
    the batch less that step's completions, KV 0 if that emptied it
    (``timeline.counter_samples``)."""
    out = {}
    for k, steps in instance_steps(lines).items():
        samples = counter_samples(steps)
        out[k] = Series(np.array([s.time_us for s in samples], dtype=np.int64),
                        np.array([s.queue_depth for s in samples], dtype=np.int64),
                        np.array([s.batch_size for s in samples], dtype=np.int64),
                        np.array([s.kv_utilization for s in samples], dtype=np.float64))
    return out


def window_slices(lines: Iterable[dict[str, Any]], start_us: int,
                  end_us: int) -> list[StepSlice]:
    """The steps that overlap ``[start_us, end_us)`` (µs), by instance then time."""
    out = []
    for k, steps in instance_steps(lines).items():
        for step in steps:
            if step.end_us > start_us and step.start_us < end_us:
                rec = step.record
                out.append(StepSlice(k, step.start_us, step.end_us,
                                     bool(rec["admitted"] or rec["prefill_chunks"])))
    return out


def routing_ticks(lines: Iterable[dict[str, Any]], start_us: int,
                  end_us: int) -> list[tuple[int, int]]:
    """``(time_us, chosen_instance)`` of the routing decisions in ``[start_us, end_us)``, in
    time order."""
    ticks = [(x["time_us"], x["chosen_instance"]) for x in lines
             if x["kind"] in ROUTING_KINDS and start_us <= x["time_us"] < end_us]
    return sorted(ticks)


def request_flows(lines: Iterable[dict[str, Any]]) -> list[RequestFlow]:
    """Every request that was routed and completed, by request id: its first routing time and
    the end of the last step listing it as completed (under P/D a request is completed on its
    prefill instance first, then on its decode instance)."""
    lines = list(lines)
    routed: dict[int, int] = {}
    for x in lines:
        if x["kind"] in ROUTING_KINDS:
            routed[x["request_id"]] = min(routed.get(x["request_id"], x["time_us"]),
                                          x["time_us"])
    done: dict[int, tuple[int, int]] = {}
    for k, steps in instance_steps(lines).items():
        for step in steps:
            for request_id in step.record["completed"]:
                done[request_id] = max(done.get(request_id, (step.end_us, k)), (step.end_us, k))
    return [RequestFlow(r, routed[r], done[r][1], done[r][0])
            for r in sorted(routed.keys() & done.keys())]


def busiest_window(lines: Iterable[dict[str, Any]],
                   width_us: int = WINDOW_US) -> tuple[int, int]:
    """A ``width_us`` window centred on the busiest step (largest batch size + queue depth; the
    earliest of equals), shifted to lie within the steps' span when it can (µs). No steps:
    ``(0, width_us)``."""
    steps = [s for per in instance_steps(lines).values() for s in per]
    if not steps:
        return 0, width_us
    first = min(s.start_us for s in steps)
    last = max(s.end_us for s in steps)
    busiest = min(steps, key=lambda s: (-(s.record["batch_size"] + s.record["queue_depth"]),
                                        s.start_us))
    start = busiest.start_us - width_us // 2
    start = max(first, min(start, last - width_us))
    return start, start + width_us


def plot_instances(lines: Sequence[dict[str, Any]], png_path: str | Path,
                   title: str | None = None) -> Path:
    """Three panels sharing the time axis (s): per instance (one colour each), queue depth,
    batch size and KV utilization (%) as step lines of ``instance_series``. Written as PNG to
    ``png_path``."""
    from matplotlib.ticker import MaxNLocator

    series = instance_series(lines)
    fig = new_figure(7.0, 6.0, 100)
    panels = fig.subplots(3, 1, sharex=True)
    fields = (("queue_depth", "queue depth", 1.0), ("batch_size", "batch size", 1.0),
              ("kv_utilization", "KV used (%)", 100.0))
    for ax, (field, label, scale) in zip(panels, fields, strict=True):
        for k, s in series.items():
            ax.step(s.time_us / US_PER_S, getattr(s, field) * scale, where="post",
                    color=f"C{k % 10}", linewidth=0.8, label=f"instance_{k}")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        # Counts and percentages start at 0; a flat 0 (no queue) still gets a 0…1 axis.
        ax.set_ylim(bottom=0.0, top=max(ax.get_ylim()[1], 1.0))
        if field != "kv_utilization":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    panels[-1].set_xlabel("time (s)")
    if series:
        panels[0].legend(fontsize=8, loc="upper right", ncol=min(len(series), 4))
    if title:
        panels[0].set_title(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, png_path)


def _window(lines: Sequence[dict[str, Any]], start_us: int | None,
            end_us: int | None) -> tuple[int, int]:
    if start_us is None and end_us is None:
        return busiest_window(lines)
    if start_us is None:
        start_us = end_us - WINDOW_US
    if end_us is None:
        end_us = start_us + WINDOW_US
    if end_us <= start_us:
        raise ValueError(f"empty window: start_us {start_us} >= end_us {end_us}")
    return start_us, end_us


def _pick(flows: Sequence[RequestFlow], n: int) -> list[RequestFlow]:
    """``n`` flows spread evenly over ``flows`` (all when there are no more than ``n``)."""
    if len(flows) <= n:
        return list(flows)
    return [flows[i] for i in np.linspace(0, len(flows) - 1, n).round().astype(int)]


def plot_timeline(lines: Sequence[dict[str, Any]], png_path: str | Path,
                  start_us: int | None = None, end_us: int | None = None) -> Path:
    """A still of the timeline between ``start_us`` and ``end_us`` (µs; default
    ``busiest_window``, 2 s; one bound given: 2 s from it): a router row with a tick per
    routing decision (coloured by the instance chosen), a row per instance with its steps
    (orange with prefill work, blue decode only), and up to ``MAX_FLOWS`` requests routed and
    completed inside the window as arrows from decision to completion. Time axis in s
    since the run's start.
    Written as PNG to ``png_path``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lines = list(lines)
    start_us, end_us = _window(lines, start_us, end_us)
    instances = sorted(instance_steps(lines))
    row = {k: i + 1 for i, k in enumerate(instances)}  # router on row 0, at the top
    fig = new_figure(9.0, 1.4 + 0.45 * (len(instances) + 1), 110)
    ax = fig.subplots()
    slices = window_slices(lines, start_us, end_us)
    for k in instances:
        for prefill, color in ((True, PREFILL_COLOR), (False, DECODE_COLOR)):
            bars = [(s.start_us / US_PER_S, (s.end_us - s.start_us) / US_PER_S)
                    for s in slices if s.instance == k and s.prefill == prefill]
            if bars:
                ax.broken_barh(bars, (row[k] - 0.35, 0.7), facecolors=color,
                               edgecolors="white", linewidth=0.3)
    ticks = routing_ticks(lines, start_us, end_us)
    if ticks:
        ax.vlines([t / US_PER_S for t, _ in ticks], -0.3, 0.3, colors=TICK_COLOR,
                  linewidth=0.8)
    inside = [f for f in request_flows(lines)
              if start_us <= f.routed_us and f.done_us <= end_us and f.instance in row]
    for f in _pick(inside, MAX_FLOWS):
        ax.annotate("", xy=(f.done_us / US_PER_S, row[f.instance]),
                    xytext=(f.routed_us / US_PER_S, 0.0),
                    arrowprops={"arrowstyle": "->", "color": FLOW_COLOR, "linewidth": 0.8,
                                "shrinkA": 0, "shrinkB": 0, "alpha": 0.8})
    ax.set_yticks(range(len(instances) + 1), ["router"] + [f"instance_{k}" for k in instances])
    ax.set_ylim(len(instances) + 0.6, -0.6)
    ax.set_xlim(start_us / US_PER_S, end_us / US_PER_S)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=PREFILL_COLOR, label="step with prefill"),
                       Patch(color=DECODE_COLOR, label="decode-only step"),
                       Line2D([], [], color=TICK_COLOR, linewidth=0.8,
                              label="routing decision"),
                       Line2D([], [], color=FLOW_COLOR, marker=">", linewidth=0.8,
                              label="request: routed → completed")],
              fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4,
              frameon=False)
    fig.tight_layout()
    return save_png(fig, png_path)
