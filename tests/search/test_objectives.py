"""Scoring: robust statistics over seeds, constraints (filter / penalty), strategy fitness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blisjax.config import ConfigError
from search.expr import compile_constraint, compile_expression
from search.objectives import (
    INFEASIBLE_BASE,
    Robust,
    Scoring,
    cvar_lower,
    invalid_candidate,
    score_candidate,
    strategy_fitness,
)


def _scoring(objs=("-lat",), cons=(), **kw):
    return Scoring(tuple(compile_expression(o) for o in objs),
                   tuple(compile_constraint(c) for c in cons), **kw)


def test_cvar_and_worst_hand_values():
    vals = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert cvar_lower(vals, 0.4) == 1.5  # two lowest: 1, 2
    assert cvar_lower(vals, 0.25) == 1.5  # ceil(1.25) = 2
    assert cvar_lower(vals, 0.2) == 1.0
    assert cvar_lower(vals, 1.0) == 3.0
    assert Robust("worst").aggregate(vals) == 1.0
    assert Robust("mean").aggregate(vals) == 3.0
    assert Robust("mean").tail(vals) == 1.0 and Robust("mean").tail_name == "worst"
    assert Robust("cvar", 0.4).aggregate(vals) == 1.5 and Robust("cvar", 0.4).tail_name == \
        "cvar0.4"
    with pytest.raises(ConfigError, match="--robust"):
        Robust("median")
    with pytest.raises(ConfigError, match=r"--cvar-alpha: must be in \(0, 1\]"):
        Robust("cvar", 0.0)


def test_score_candidate_aggregates_seeds_and_constraints():
    s = _scoring(("-lat", "thr"), ("att >= 0.875",), robust=Robust("worst"))
    per_seed = [{"lat": 100.0, "thr": 5.0, "att": 1.0}, {"lat": 300.0, "thr": 7.0, "att": 0.75}]
    e = score_candidate(s, {"k": 1}, per_seed)
    assert list(e.objectives) == [-300.0, 5.0]  # worst over seeds, per objective
    assert list(e.objective_mean) == [-200.0, 6.0]
    assert list(e.objective_tail) == [-300.0, 5.0]
    assert e.margins[0] == -0.125  # worst margin: 0.75 - 0.875
    assert e.violations[0] == 0.125
    assert not e.feasible and e.valid and e.note == "infeasible"
    mean = score_candidate(_scoring(("-lat",), ("att >= 0.875",)), {}, per_seed)
    assert mean.feasible and mean.margins[0] == 0.0  # mean of +0.125 and -0.125


def test_filter_mode_ranks_feasible_first_then_by_violation():
    s = _scoring(("-lat",), ("att >= 0.9",))
    evals = [score_candidate(s, {}, [{"lat": 10.0, "att": 0.5}]),   # infeasible, violation 0.4
             score_candidate(s, {}, [{"lat": 900.0, "att": 0.95}]),  # feasible, slow
             score_candidate(s, {}, [{"lat": 10.0, "att": 0.8}]),   # infeasible, violation 0.1
             invalid_candidate(s, {}, "invalid: weights all 0")]
    told, column = strategy_fitness(s, evals)
    assert told[1] == -900.0
    assert told[0] == pytest.approx(INFEASIBLE_BASE - 0.4)
    assert told[2] == pytest.approx(INFEASIBLE_BASE - 0.1)
    assert told[3] == -math.inf
    assert list(np.argsort(-told, kind="stable")) == [1, 2, 0, 3]
    assert np.array_equal(told, column)


def test_penalty_mode_subtracts_weighted_violation():
    s = _scoring(("-lat",), ("att >= 0.9", "lat <= 50"), constraint_mode="penalty", penalty=100.0)
    e = score_candidate(s, {}, [{"lat": 60.0, "att": 0.85}])
    told, _ = strategy_fitness(s, [e])
    assert told[0] == pytest.approx(-60.0 - 100.0 * (0.05 + 10.0))
    with pytest.raises(ConfigError, match="--constraint-mode"):
        _scoring(constraint_mode="ignore")
    with pytest.raises(ConfigError, match="--penalty"):
        _scoring(penalty=-1.0)


def test_non_finite_objective_is_worst_and_infeasible():
    s = _scoring(("1 / lat",))
    e = score_candidate(s, {}, [{"lat": 0.0}])
    assert e.objectives[0] == math.inf and not e.feasible and e.note == "non-finite objective"
    assert strategy_fitness(s, [e])[0][0] == -math.inf


def test_multi_objective_matrix_and_scalarisation():
    s = _scoring(("a", "b"))
    evals = [score_candidate(s, {}, [{"a": a, "b": b}])
             for a, b in ((1.0, 5.0), (2.0, 4.0), (0.5, 0.5), (3.0, 1.0))]
    matrix, scalar = strategy_fitness(s, evals, strategy_multi_objective=True)
    assert matrix.shape == (4, 2) and matrix[2, 1] == 0.5
    told, scalar2 = strategy_fitness(s, evals, strategy_multi_objective=False)
    assert np.array_equal(told, scalar2) and np.array_equal(scalar, scalar2)
    assert scalar[2] < min(scalar[0], scalar[1], scalar[3])  # the dominated point ranks last
    assert scalar2.shape == (4,)


def test_scoring_requires_an_objective():
    with pytest.raises(ConfigError, match="--objective"):
        Scoring(())
