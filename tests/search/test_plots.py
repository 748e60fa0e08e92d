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
