"""PNG plots of a search or sweep (matplotlib, Agg backend, no global pyplot state).

* :func:`plot_convergence` — fitness of every candidate per generation, the generation best and
  the best so far (several objectives: the best so far of each objective);
* :func:`plot_pareto` — two objectives: all feasible candidates, the Pareto front, the baseline;
* :func:`plot_sweep` — a sweep over 1 knob (objective vs value; bars for a categorical knob)
  or 2 knobs (heatmap of the objective; with more knobs, the best value over the others).

Axes show what was measured, not what was maximised: an objective ``-ttft_p99_ms`` is drawn as
"p99 TTFT (ms), lower is better" with its values un-negated (``objective_axis``); generations
are integers; legends sit beside the plot, never over the data. ``*_figure`` build the figure,
``plot_*`` write it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from matplotlib.ticker import MaxNLocator

from blisjax.figures import new_figure, save_png
from search.runner import Record

__all__ = ["ObjectiveAxis", "convergence_figure", "objective_axis", "pareto_figure",
           "plot_convergence", "plot_pareto", "plot_sweep", "sweep_figure"]

_NEGATED = re.compile(r"^-\s*([A-Za-z_][A-Za-z0-9_]*)$")
_LATENCY = re.compile(r"^(ttft|itl|e2e)_(mean|p\d+|min|max)_ms$")


class ObjectiveAxis(NamedTuple):
    """How an objective is drawn: its axis label and the sign that turns the maximised value
    back into the metric's."""

    label: str
    sign: float


def _metric_words(name: str) -> str:
    """``ttft_p99_ms`` → "p99 TTFT (ms)"; other names as they are."""
    m = _LATENCY.match(name)
    return f"{m.group(2)} {m.group(1).upper()} (ms)" if m else name


def objective_axis(text: str) -> ObjectiveAxis:
    """The axis of objective ``text``: a negated metric (``-ttft_p99_ms``) is drawn as the
    metric, lower is better; anything else as it is, higher is better."""
    m = _NEGATED.match(text.strip())
    if m:
        return ObjectiveAxis(f"{_metric_words(m.group(1))}, lower is better", -1.0)
    return ObjectiveAxis(f"{_metric_words(text.strip())}, higher is better", 1.0)


def _legend_beside(ax) -> None:
    """The legend to the right of the axes, outside the data."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _feasible(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if r.feasible and np.isfinite(r.fitness)]


#: Plotted values spanning more than this ratio (all positive) get a log axis.
LOG_AXIS_RATIO = 100.0


def _spans_decades(values: np.ndarray) -> bool:
    """Positive values whose largest is more than ``LOG_AXIS_RATIO`` times the smallest."""
    values = values[np.isfinite(values)]
    return values.size > 1 and bool(np.all(values > 0)) \
        and float(values.max()) > LOG_AXIS_RATIO * float(values.min())


def plot_convergence(records: Sequence[Record], path: str | Path, objective_names: Sequence[str],
                     baseline: dict | None = None, title: str = "") -> Path:
    """Every candidate's objective per generation (feasible: dots, infeasible: crosses), the
    generation best and the best so far (both over feasible candidates), and the baseline; a
    log axis where the plotted values are positive and span more than ``LOG_AXIS_RATIO``.

    Several objectives: one panel per objective.
    """
    return save_png(convergence_figure(records, objective_names, baseline, title), path)


def convergence_figure(records: Sequence[Record], objective_names: Sequence[str],
                       baseline: dict | None = None, title: str = ""):
    """The figure of :func:`plot_convergence`."""
    m = len(objective_names)
    fig = new_figure(8.4, 3.2 * m if m > 1 else 4.2)
    gens = sorted({r.generation for r in records})
    ok = _feasible(records)
    bad = [r for r in records if r.valid and not r.feasible]
    for j, name in enumerate(objective_names):
        ax = fig.add_subplot(m, 1, j + 1)
        axis = objective_axis(name)
        ax.scatter([r.generation for r in ok], [axis.sign * r.objectives[j] for r in ok], s=10,
                   alpha=0.4, color="tab:gray", label="feasible candidates")
        shown = [r for r in bad if np.isfinite(r.objectives[j])]
        if shown:
            ax.scatter([r.generation for r in shown],
                       [axis.sign * r.objectives[j] for r in shown], s=14, marker="x",
                       alpha=0.6, color="tab:orange", label="infeasible candidates")
        gen_best, so_far, running = [], [], -np.inf
        for g in gens:
            vals = [r.objectives[j] for r in ok if r.generation == g]
            best_g = max(vals) if vals else np.nan
            running = max(running, best_g) if vals else running
            gen_best.append(best_g)
            so_far.append(running if np.isfinite(running) else np.nan)
        ax.plot(gens, axis.sign * np.asarray(gen_best), "o-", color="tab:blue", ms=3, lw=1,
                label="generation best")
        ax.plot(gens, axis.sign * np.asarray(so_far), "-", color="tab:red", lw=2,
                label="best so far")
        if baseline is not None and name in baseline.get("objectives", {}):
            value = baseline["objectives"][name]
            if isinstance(value, float) and np.isfinite(value):
                ax.axhline(axis.sign * value, color="black", ls="--", lw=1,
                           label="baseline (config policy)")
        shown_values = np.asarray([axis.sign * r.objectives[j] for r in ok])
        if _spans_decades(shown_values):
            ax.set_yscale("log")  # one catastrophic candidate would flatten the rest
        ax.set_xlabel("generation")
        ax.set_ylabel(axis.label, fontsize=9)
        if gens:
            ax.set_xlim(min(gens) - 0.5, max(gens) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        if j == 0:
            _legend_beside(ax)
            if title:
                ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_pareto(records: Sequence[Record], front: Sequence[int], path: str | Path,
                objective_names: Sequence[str], baseline: dict | None = None,
                title: str = "") -> Path:
    """Objective 0 vs objective 1: feasible candidates, the front (connected), the baseline."""
    return save_png(pareto_figure(records, front, objective_names, baseline, title), path)


def pareto_figure(records: Sequence[Record], front: Sequence[int],
                  objective_names: Sequence[str], baseline: dict | None = None,
                  title: str = ""):
    """The figure of :func:`plot_pareto`."""
    fig = new_figure(8.4, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    sx, sy = (objective_axis(n) for n in objective_names[:2])
    ok = _feasible(records)
    ax.scatter([sx.sign * r.objectives[0] for r in ok], [sy.sign * r.objectives[1] for r in ok],
               s=12, alpha=0.4, color="tab:gray", label="feasible candidates")
    pts = sorted((sx.sign * records[i].objectives[0], sy.sign * records[i].objectives[1])
                 for i in front)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:red", ms=5,
                label=f"Pareto front ({len(pts)})")
    if baseline is not None:
        vals = [baseline.get("objectives", {}).get(n) for n in objective_names[:2]]
        if all(isinstance(v, float) and np.isfinite(v) for v in vals):
            ax.scatter([sx.sign * vals[0]], [sy.sign * vals[1]], marker="*", s=150,
                       color="black", label="baseline (config policy)")
    ax.set_xlabel(sx.label, fontsize=9)
    ax.set_ylabel(sy.label, fontsize=9)
    ax.grid(alpha=0.3)
    _legend_beside(ax)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _axis_values(records: Sequence[Record], name: str) -> list[Any]:
    values: list[Any] = []
    for r in records:
        v = r.knobs[name]
        if not any(type(v) is type(u) and v == u for u in values):
            values.append(v)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return sorted(values) if numeric else values


def _label(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell_best(records: Sequence[Record], key) -> dict:
    """Per grid cell (``key(record)``) the record that is best by (feasible, objective 0)."""
    best: dict = {}
    for r in records:
        if not r.valid or not np.isfinite(r.objectives[0]):
            continue
        k = key(r)
        cur = best.get(k)
        if cur is None or (r.feasible, r.objectives[0]) > (cur.feasible, cur.objectives[0]):
            best[k] = r
    return best


def plot_sweep(records: Sequence[Record], knob_names: Sequence[str], path: str | Path,
               objective_name: str, title: str = "") -> Path:
    """Objective 0 over a grid: line for one numeric knob, bars for one categorical knob,
    heatmap for two (with more knobs, the best over the others: feasible first, then by
    objective). Infeasible cells are marked ×, invalid ones left blank.
    """
    return save_png(sweep_figure(records, knob_names, objective_name, title), path)


def sweep_figure(records: Sequence[Record], knob_names: Sequence[str], objective_name: str,
                 title: str = ""):
    """The figure of :func:`plot_sweep`."""
    axis = objective_axis(objective_name)
    xs = _axis_values(records, knob_names[0])
    index_x = {repr(v): i for i, v in enumerate(xs)}
    fig = new_figure(8.4 if len(knob_names) == 1 else 6.4, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    if len(knob_names) == 1:
        cells = _cell_best(records, lambda r: index_x[repr(r.knobs[knob_names[0]])])
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
        pos = np.asarray(xs, float) if numeric else np.arange(len(xs), dtype=float)
        ys = axis.sign * np.array([cells[i].objectives[0] if i in cells else np.nan
                                   for i in range(len(xs))])
        feas = np.array([i in cells and cells[i].feasible for i in range(len(xs))])
        bad = ~feas & np.isfinite(ys)
        if numeric:
            ax.plot(pos, ys, "-", color="tab:blue", lw=1)
            ax.scatter(pos[feas], ys[feas], color="tab:blue", zorder=3, label="feasible")
            if bad.any():
                ax.scatter(pos[bad], ys[bad], marker="x", color="tab:orange", zorder=3,
                           label="infeasible")
            if all(float(v).is_integer() for v in xs):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        else:  # categories: bars, no line between them
            heights = np.where(np.isfinite(ys), ys, 0.0)
            ax.bar(pos[feas], heights[feas], color="tab:blue", label="feasible")
            if bad.any():
                ax.bar(pos[bad], heights[bad], color="tab:orange", hatch="x",
                       label="infeasible")
            ax.set_xticks(pos, [_label(v) for v in xs])
        ax.set_xlabel(knob_names[0])
        ax.set_ylabel(axis.label, fontsize=9)
        ax.grid(alpha=0.3)
        _legend_beside(ax)
    else:
        ys_vals = _axis_values(records, knob_names[1])
        index_y = {repr(v): i for i, v in enumerate(ys_vals)}
        cells = _cell_best(records, lambda r: (index_y[repr(r.knobs[knob_names[1]])],
                                               index_x[repr(r.knobs[knob_names[0]])]))
        grid = np.full((len(ys_vals), len(xs)), np.nan)
        for (i, j), r in cells.items():
            grid[i, j] = axis.sign * r.objectives[0]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=ax, label=axis.label)
        ax.set_xticks(np.arange(len(xs)), [_label(v) for v in xs], rotation=45, fontsize=8)
        ax.set_yticks(np.arange(len(ys_vals)), [_label(v) for v in ys_vals], fontsize=8)
        ax.set_xlabel(knob_names[0])
        ax.set_ylabel(knob_names[1])
        finite = grid[np.isfinite(grid)]
        mid = (finite.max() + finite.min()) / 2 if finite.size else 0.0
        if len(xs) * len(ys_vals) <= 100:
            for (i, j), r in cells.items():
                v = axis.sign * r.objectives[0]
                text = f"{v:.3g}" if r.feasible else f"× {v:.3g}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if v < mid else "black")
        ax.text(1.0, -0.2, "× = infeasible", transform=ax.transAxes, ha="right", fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
