"""Plots render from records (PNG files, written atomically) for every supported shape."""

from __future__ import annotations

import math

from search.plots import plot_convergence, plot_pareto, plot_sweep
from search.runner import Record

PNG = b"\x89PNG\r\n\x1a\n"


def _rec(g, c, knobs, objs, feasible=True, valid=True):
    return Record(g, c, knobs, objs[0] if valid else -math.inf, tuple(objs), tuple(objs),
                  tuple(objs), (), feasible, valid, "")


def test_convergence_single_and_multi_objective(tmp_path):
    recs = [_rec(g, c, {"a": c}, (float(g + c),), feasible=c != 1) for g in range(3)
            for c in range(3)]
    recs.append(_rec(3, 0, {"a": 0}, (math.nan,), valid=False))
    p = plot_convergence(recs, tmp_path / "c.png", ["obj"], {"objectives": {"obj": 1.0}}, "t")
    assert p.read_bytes()[:8] == PNG
    multi = [_rec(g, 0, {"a": g}, (float(g), -float(g))) for g in range(4)]
    p = plot_convergence(multi, tmp_path / "m.png", ["x", "y"])
    assert p.read_bytes()[:8] == PNG


def test_pareto_plot(tmp_path):
    recs = [_rec(0, i, {"a": i}, (float(i), float(3 - i))) for i in range(4)]
    recs.append(_rec(0, 4, {"a": 9}, (0.0, 0.0)))
    p = plot_pareto(recs, [0, 1, 2, 3], tmp_path / "p.png", ["x", "y"],
                    {"objectives": {"x": 1.0, "y": 1.0}})
    assert p.read_bytes()[:8] == PNG


def test_sweep_plots_one_two_and_three_knobs(tmp_path):
    one = [_rec(0, i, {"k": v}, (float(i),), feasible=i != 2)
           for i, v in enumerate([0.1, 1.0, 10.0])]
    assert plot_sweep(one, ["k"], tmp_path / "1.png", "obj").read_bytes()[:8] == PNG
    cat = [_rec(0, i, {"k": v}, (float(i),)) for i, v in enumerate(["fcfs", "sjf"])]
    assert plot_sweep(cat, ["k"], tmp_path / "c.png", "obj").read_bytes()[:8] == PNG
    three = [_rec(0, 4 * i + 2 * j + k, {"x": i, "y": "ab"[j], "z": k}, (float(i + j + k),),
                  feasible=(i + j) % 2 == 0)
             for i in range(2) for j in range(2) for k in range(2)]
    three.append(_rec(0, 99, {"x": 5, "y": "a", "z": 0}, (math.nan,), valid=False))
    assert plot_sweep(three, ["x", "y"], tmp_path / "3.png", "obj").read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.png", "3.png", "c.png"]


def _legend_outside(fig) -> bool:
    """Every legend of the figure lies right of its axes (never over the data)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None and legend.get_window_extent(renderer).x0 < \
                ax.get_window_extent(renderer).x1:
            return False
    return True


def test_axes_read_as_metrics_with_integer_generations():
    """A one-generation search: the x axis spans generation 0 alone with whole ticks (not
    -0.04 … 0.04); a negated objective is drawn as its metric, lower is better, un-negated;
    the legend sits beside the plot."""
    from search.plots import convergence_figure, objective_axis, pareto_figure

    assert objective_axis("-ttft_p99_ms") == ("p99 TTFT (ms), lower is better", -1.0)
    assert objective_axis("slo_attainment") == ("slo_attainment, higher is better", 1.0)
    assert objective_axis("-cost").label == "cost, lower is better"
    recs = [_rec(0, c, {"a": c}, (-10.0 * (c + 1),)) for c in range(3)]
    fig = convergence_figure(recs, ["-ttft_p99_ms"], {"objectives": {"-ttft_p99_ms": -40.0}})
    ax = fig.axes[0]
    assert ax.get_ylabel() == "p99 TTFT (ms), lower is better"
    assert ax.get_xlim() == (-0.5, 0.5)
    assert all(float(t).is_integer() for t in ax.get_xticks())
    best_so_far = next(line for line in ax.get_lines() if line.get_label() == "best so far")
    assert list(best_so_far.get_ydata()) == [10.0]  # the best p99 TTFT, as measured
    assert _legend_outside(fig)
    pareto = pareto_figure([_rec(0, i, {"a": i}, (-float(i), float(i))) for i in range(3)],
                           [0, 1, 2], ["-e2e_mean_ms", "slo_attainment"])
    assert pareto.axes[0].get_xlabel() == "mean E2E (ms), lower is better"
    assert _legend_outside(pareto)


def test_categorical_sweep_draws_bars():
    """A sweep over a categorical knob: one bar per category, no line joining categories."""
    from search.plots import sweep_figure

    recs = [_rec(0, i, {"p": name}, (-float(i + 1),), feasible=i != 2)
            for i, name in enumerate(("fcfs", "sjf", "priority-fcfs"))]
    fig = sweep_figure(recs, ["p"], "-ttft_mean_ms")
    ax = fig.axes[0]
    assert not ax.get_lines()  # no line between categories
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [1.0, 2.0, 3.0]  # un-negated mean TTFT per category
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fcfs", "sjf", "priority-fcfs"]
    assert _legend_outside(fig)


def test_a_convergence_axis_spanning_decades_is_logarithmic():
    # p99 TTFTs of 20 ms and 50 s (2,500x): a linear axis would draw 20 ms at the floor
    from search.plots import convergence_figure

    wide = [_rec(0, 0, {}, (-20.0,)), _rec(0, 1, {}, (-50_000.0,))]
    assert convergence_figure(wide, ["-ttft_p99_ms"]).axes[0].get_yscale() == "log"
    narrow = [_rec(0, 0, {}, (-20.0,)), _rec(0, 1, {}, (-1_999.0,))]  # 99.95x
    assert convergence_figure(narrow, ["-ttft_p99_ms"]).axes[0].get_yscale() == "linear"
    signs = [_rec(0, 0, {}, (-20.0,)), _rec(0, 1, {}, (50_000.0,))]  # not all positive
    assert convergence_figure(signs, ["-ttft_p99_ms"]).axes[0].get_yscale() == "linear"
