"""The generation loop on an analytic problem: reproducible bytes, resume after a kill equals
an uninterrupted run, guards, history contents, progress, multi-objective fronts."""

from __future__ import annotations

import csv
import io
import math
import time

import numpy as np
import pytest

from search.expr import compile_constraint, compile_expression
from search.io import load_checkpoint
from search.objectives import Robust, Scoring, invalid_candidate, score_candidate
from search.pareto import dominates
from search.runner import run_search
from search.space import space_from_mapping
from search.strategies import CUBE_STRATEGIES, GeneticAlgorithm, make_strategy

SPACE = space_from_mapping({"knobs": {
    "admission.token_bucket_refill_rate": {"low": 0.0, "high": 1.0},
    "routing.scorers.queue-depth": {"low": 0.01, "high": 100.0, "scale": "log"},
    "scheduler.policy": {"choices": ["fcfs", "sjf"]},
}})


#: The "base configuration" of the analytic problem (what an empty knob set means).
BASE = {"admission.token_bucket_refill_rate": 1.0, "routing.scorers.queue-depth": 1.0,
        "scheduler.policy": "fcfs"}


def fake_metrics(knobs: dict, seed: int) -> dict:
    """An analytic 'simulation': lat is minimal at x = 0.3, log10(w) = 1, sjf."""
    knobs = {**BASE, **knobs}
    x = knobs["admission.token_bucket_refill_rate"]
    w = knobs["routing.scorers.queue-depth"]
    lat = (x - 0.3) ** 2 + (math.log10(w) - 1) ** 2 / 16 + (0.0 if knobs["scheduler.policy"] ==
                                                           "sjf" else 0.25)
    noise = 0.01 * ((seed * 7919) % 13) / 13
    return {"lat": lat + noise, "att": 1.0 - x, "thr": x + noise, "nested": {"overall": x}}


class Evaluator:
    """knob sets -> CandidateEval, optionally failing at a given call (a kill mid-generation)."""

    def __init__(self, scoring: Scoring, seeds=(1,), fail_at_call: int | None = None,
                 invalid_if=None) -> None:
        self.scoring, self.seeds = scoring, seeds
        self.fail_at_call, self.calls, self.invalid_if = fail_at_call, 0, invalid_if

    def __call__(self, knob_sets):
        self.calls += 1
        if self.fail_at_call is not None and self.calls == self.fail_at_call:
            raise KeyboardInterrupt("killed")
        out = []
        for k in knob_sets:
            if self.invalid_if is not None and self.invalid_if(k):
                out.append(invalid_candidate(self.scoring, k, "invalid: test"))
            else:
                out.append(score_candidate(self.scoring, k, [fake_metrics(k, s)
                                                             for s in self.seeds]))
        return out


def scoring(objs=("-lat",), cons=("att >= 0.5",), **kw) -> Scoring:
    return Scoring(tuple(compile_expression(o) for o in objs),
                   tuple(compile_constraint(c) for c in cons), **kw)


def _run(out, name="cma", gens=6, seed=3, resume=False, callback=None, evaluator=None,
         sc=None, pop=6, progress=False, fingerprint=None):
    sc = sc or scoring()
    strategy = make_strategy(name, SPACE.template(), pop,
                             num_objectives=len(sc.objectives))
    return run_search(SPACE, strategy, evaluator or Evaluator(sc), sc, generations=gens,
                      seed=seed, out_dir=out, resume=resume,
                      fingerprint=fingerprint or {"strategy": name, "seed": seed},
                      baseline={}, progress=progress, callback=callback)


class Kill(Exception):
    pass


def _kill_after(k):
    def callback(report):
        if report.generation == k:
            raise Kill(f"killed after generation {k}")
    return callback


def test_same_seed_gives_identical_history_bytes(tmp_path):
    _run(tmp_path / "a")
    _run(tmp_path / "b")
    _run(tmp_path / "c", seed=4)
    a = (tmp_path / "a" / "history.csv").read_bytes()
    assert a == (tmp_path / "b" / "history.csv").read_bytes()
    assert a != (tmp_path / "c" / "history.csv").read_bytes()


@pytest.mark.parametrize("name", CUBE_STRATEGIES)
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, name):
    full = _run(tmp_path / "full", name)
    with pytest.raises(Kill):
        _run(tmp_path / "killed", name, callback=_kill_after(2))
    _, meta = load_checkpoint(tmp_path / "killed" / "checkpoint.npz")
    assert meta["generation"] == 3
    assert len((tmp_path / "killed" / "history.csv").read_text().splitlines()) == 1 + 3 * 6
    resumed = _run(tmp_path / "killed", name, resume=True)
    assert resumed.resumed_from == 3
    assert (tmp_path / "full" / "history.csv").read_bytes() == \
        (tmp_path / "killed" / "history.csv").read_bytes()
    assert resumed.best == full.best and resumed.records == full.records
    a, _ = load_checkpoint(tmp_path / "full" / "checkpoint.npz")
    b, _ = load_checkpoint(tmp_path / "killed" / "checkpoint.npz")
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_kill_inside_a_generation_loses_only_that_generation(tmp_path):
    sc = scoring()
    full = _run(tmp_path / "full", "openes", sc=sc)
    # call 1 = baseline, calls 2.. = generations; die while evaluating generation 3 (call 5)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "k", "openes", sc=sc, evaluator=Evaluator(sc, fail_at_call=5))
    _, meta = load_checkpoint(tmp_path / "k" / "checkpoint.npz")
    assert meta["generation"] == 3
    resumed = _run(tmp_path / "k", "openes", sc=sc, resume=True)
    assert resumed.records == full.records
    assert (tmp_path / "full" / "history.csv").read_bytes() == \
        (tmp_path / "k" / "history.csv").read_bytes()


def test_extending_a_finished_run_equals_a_longer_run(tmp_path):
    _run(tmp_path / "long", "ga", gens=5)
    _run(tmp_path / "short", "ga", gens=3)
    _run(tmp_path / "short", "ga", gens=5, resume=True)
    assert (tmp_path / "long" / "history.csv").read_bytes() == \
        (tmp_path / "short" / "history.csv").read_bytes()


def test_guards_on_existing_checkpoint_and_changed_settings(tmp_path):
    _run(tmp_path / "r", gens=2)
    with pytest.raises(FileExistsError, match="already holds a search checkpoint"):
        _run(tmp_path / "r", gens=2)
    with pytest.raises(ValueError, match=r"different settings \(seed\)"):
        _run(tmp_path / "r", gens=3, resume=True, fingerprint={"strategy": "cma", "seed": 9})
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        _run(tmp_path / "none", resume=True)


def test_history_table_contents(tmp_path):
    sc = scoring(robust=Robust("worst"))
    result = _run(tmp_path / "h", "random", gens=2, sc=sc,
                  evaluator=Evaluator(sc, seeds=(1, 2, 3)))
    rows = list(csv.reader((tmp_path / "h" / "history.csv").read_text().splitlines()))
    assert rows[0] == ["generation", "candidate", *SPACE.names, "fitness", "objective[-lat]",
                       "violation[att >= 0.5]", "feasible", "note"]
    body = rows[1:]
    assert len(body) == 12 and [r[0] for r in body] == ["0"] * 6 + ["1"] * 6
    assert [r[1] for r in body[:6]] == [str(i) for i in range(6)]
    for row, rec in zip(body, result.records, strict=True):
        x = float(row[2])
        assert x == rec.knobs["admission.token_bucket_refill_rate"]  # repr round-trips
        assert row[4] in ("fcfs", "sjf")
        worst_lat = max(fake_metrics(rec.knobs, s)["lat"] for s in (1, 2, 3))
        assert float(row[6]) == pytest.approx(-worst_lat)
        assert row[-2] == ("1" if x <= 0.5 else "0")
        assert float(row[-3]) == pytest.approx(max(0.0, x - 0.5))


def test_multi_seed_columns_are_written_when_requested(tmp_path):
    sc = scoring(robust=Robust("cvar", 0.5))
    strategy = make_strategy("random", SPACE.template(), 4)
    run_search(SPACE, strategy, Evaluator(sc, seeds=(1, 2, 3, 4)), sc, generations=1, seed=0,
               out_dir=tmp_path, robust_columns=sc.robust, progress=False)
    header = (tmp_path / "history.csv").read_text().splitlines()[0]
    assert "mean[-lat]" in header and "cvar0.5[-lat]" in header


def test_best_is_feasible_and_never_invalid(tmp_path):
    sc = scoring()
    ev = Evaluator(sc, invalid_if=lambda k: k.get("scheduler.policy") == "sjf")
    result = _run(tmp_path / "b", "ga", gens=4, evaluator=ev, sc=sc)
    assert result.best.feasible and result.best.knobs["scheduler.policy"] == "fcfs"
    feasible = [r for r in result.records if r.feasible]
    assert result.best.fitness == max(r.fitness for r in feasible)
    invalid = [r for r in result.records if not r.valid]
    assert invalid and all(r.fitness == -math.inf and r.note == "invalid: test"
                           for r in invalid)
    assert result.baseline["feasible"] in (True, False)


def test_cma_finds_the_known_optimum(tmp_path):
    result = _run(None, "cma", gens=25, pop=8)
    k = result.best.knobs
    assert k["scheduler.policy"] == "sjf"
    assert abs(k["admission.token_bucket_refill_rate"] - 0.3) < 0.02
    assert abs(math.log10(k["routing.scorers.queue-depth"]) - 1) < 0.2


def test_progress_line_reports_best(tmp_path):
    stream = io.StringIO()
    _run(None, "random", gens=3, progress=stream)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("search: evaluating the configured policy (baseline")
    lines = lines[1:]
    assert len(lines) == 3 and lines[-1].startswith("search: gen 3/3 [####")
    assert "evals 18" in lines[-1] and " best -" in lines[-1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_engine_call_shows_a_ticking_line_on_a_terminal_only():
    # The evaluator takes 1.2 s per call (a first engine call compiles for a minute): on a
    # terminal a line names the generation and counts the seconds; elsewhere nothing ticks.
    sc = scoring()

    def slow(knob_sets):
        time.sleep(1.2)
        return Evaluator(sc)(knob_sets)

    terminal = _Terminal()
    _run(None, "random", gens=1, evaluator=slow, progress=terminal)
    assert "\rblisjax: generation 1/1: evaluating 6 candidates … 1 s" in terminal.getvalue()
    assert "\rblisjax: evaluating the configured policy … 1 s" in terminal.getvalue()
    plain = io.StringIO()
    _run(None, "random", gens=1, evaluator=slow, progress=plain)
    assert "blisjax:" not in plain.getvalue() and " s\r" not in plain.getvalue()


def test_multi_objective_front_is_non_dominated(tmp_path):
    sc = scoring(objs=("-lat", "thr"), cons=())
    strategy = GeneticAlgorithm(SPACE.template(), 8, num_objectives=2)
    result = run_search(SPACE, strategy, Evaluator(sc), sc, generations=6, seed=1,
                        out_dir=tmp_path, progress=False)
    front = [result.records[i] for i in result.front]
    assert front
    feasible = [r for r in result.records if r.feasible]
    for f in front:
        assert not any(dominates(o.objectives, f.objectives) for o in feasible)
    for r in feasible:
        if r not in front:
            assert any(dominates(f.objectives, r.objectives) or f.objectives == r.objectives
                       for f in front)
