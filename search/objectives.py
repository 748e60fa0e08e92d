"""Scoring: from per-seed metrics to objectives, constraint violations and strategy fitness.

Everything is **maximised**. For one candidate evaluated on S workload seeds:

* each objective expression is evaluated per seed, giving ``values[S]``; the candidate's
  objective is a *robust statistic* of them — ``mean``, ``worst`` (the minimum) or ``cvar``
  (the mean of the ``ceil(alpha·S)`` lowest values, a lower-tail CVaR); the history also
  records the mean and the tail statistic (worst, or CVaR with ``cvar``);
* each constraint's *margin* (``lhs − rhs`` for ``>=``; ``rhs − lhs`` for ``<=``) is aggregated
  with the same statistic; the constraint holds when the aggregated margin is ≥ 0 (> 0 for the
  strict operators), and its *violation* is ``max(0, −margin)`` in the metric's units;
* a candidate is *feasible* when it is valid (its knobs form a valid configuration and the
  engine did not overflow), every objective is finite, and every constraint holds.

Fitness handed to strategies (one objective):

* ``filter`` (default, Deb's feasibility rule): feasible → the objective; infeasible →
  ``INFEASIBLE_BASE − total violation`` (−1e12 − v), so every feasible candidate outranks every
  infeasible one and less violation ranks higher; invalid or non-finite → −inf;
* ``penalty``: ``objective − penalty·total violation`` (invalid or non-finite → −inf).

With several objectives the same rule applies per component, giving a ``(P, M)`` matrix (which
makes feasible points dominate infeasible ones: NSGA-II's constrained domination);
single-objective strategies receive :func:`search.pareto.scalarize` of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blisjax.config import ConfigError
from search.expr import Constraint, Expression, flatten_metrics
from search.pareto import scalarize

__all__ = ["CONSTRAINT_MODES", "INFEASIBLE_BASE", "ROBUST_STATISTICS", "CandidateEval",
           "Robust", "Scoring", "cvar_lower", "invalid_candidate", "score_candidate",
           "strategy_fitness"]

ROBUST_STATISTICS = ("mean", "worst", "cvar")
CONSTRAINT_MODES = ("filter", "penalty")
#: Fitness of an infeasible candidate in ``filter`` mode, minus its total violation.
INFEASIBLE_BASE = -1e12


def cvar_lower(values: Sequence[float], alpha: float) -> float:
    """Mean of the ``ceil(alpha·n)`` smallest values (lower-tail CVaR at level alpha)."""
    v = np.sort(np.asarray(values, np.float64))
    k = max(1, math.ceil(alpha * v.size - 1e-12))
    return float(v[:k].mean())


@dataclass(frozen=True)
class Robust:
    """How per-seed values are combined: ``statistic`` in mean | worst | cvar; ``alpha`` is the
    CVaR tail fraction in (0, 1]."""

    statistic: str = "mean"
    alpha: float = 0.25

    def __post_init__(self) -> None:
        if self.statistic not in ROBUST_STATISTICS:
            raise ConfigError("--robust", f"must be one of {', '.join(ROBUST_STATISTICS)}, "
                              f"got {self.statistic!r}")
        if not 0 < self.alpha <= 1:
            raise ConfigError("--cvar-alpha", f"must be in (0, 1], got {self.alpha}")

    @property
    def tail_name(self) -> str:
        """Label of the tail statistic recorded beside the mean."""
        return f"cvar{self.alpha:g}" if self.statistic == "cvar" else "worst"

    def tail(self, values: Sequence[float]) -> float:
        """The tail statistic (worst, or CVaR when the statistic is cvar)."""
        if self.statistic == "cvar":
            return cvar_lower(values, self.alpha)
        return float(np.min(values))

    def aggregate(self, values: Sequence[float]) -> float:
        """The statistic used for fitness and feasibility."""
        if self.statistic == "mean":
            return float(np.mean(values))
        return self.tail(values)


@dataclass(frozen=True)
class Scoring:
    """Objectives (maximised), constraints, the robust statistic and the constraint mode."""

    objectives: tuple[Expression, ...]
    constraints: tuple[Constraint, ...] = ()
    robust: Robust = field(default_factory=Robust)
    constraint_mode: str = "filter"
    penalty: float = 1000.0

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ConfigError("--objective", "needs at least one expression")
        if self.constraint_mode not in CONSTRAINT_MODES:
            raise ConfigError("--constraint-mode", f"must be one of "
                              f"{', '.join(CONSTRAINT_MODES)}, got {self.constraint_mode!r}")
        if not (math.isfinite(self.penalty) and self.penalty >= 0):
            raise ConfigError("--penalty", f"must be a finite number >= 0, got {self.penalty}")

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def objective_texts(self) -> tuple[str, ...]:
        return tuple(o.text for o in self.objectives)

    @property
    def constraint_texts(self) -> tuple[str, ...]:
        return tuple(c.text for c in self.constraints)

    def check_names(self, available: Mapping[str, Any] | set[str]) -> None:
        """Every metric name of every expression must be available (else ExpressionError)."""
        for obj in self.objectives:
            obj.check_names(available, "--objective")
        for con in self.constraints:
            con.check_names(available, "--constraint")


@dataclass(frozen=True)
class CandidateEval:
    """One candidate's score. Arrays: objectives/objective_mean/objective_tail (M,),
    margins/violations (C,). ``metrics`` holds the per-seed metric dicts (may be dropped)."""

    knobs: dict
    objectives: np.ndarray
    objective_mean: np.ndarray
    objective_tail: np.ndarray
    margins: np.ndarray
    violations: np.ndarray
    feasible: bool
    valid: bool
    note: str = ""
    metrics: tuple = ()


def invalid_candidate(scoring: Scoring, knobs: Mapping[str, Any], note: str) -> CandidateEval:
    """A candidate that could not be evaluated (invalid knobs, engine overflow)."""
    m, c = len(scoring.objectives), len(scoring.constraints)
    nan_m = np.full(m, np.nan)
    return CandidateEval(dict(knobs), nan_m, nan_m.copy(), nan_m.copy(), np.full(c, np.nan),
                         np.full(c, np.nan), False, False, note)


def score_candidate(scoring: Scoring, knobs: Mapping[str, Any],
                    per_seed_metrics: Sequence[Mapping[str, Any]],
                    keep_metrics: bool = False) -> CandidateEval:
    """Score one candidate from its metrics on each workload seed (S >= 1 dicts)."""
    if not per_seed_metrics:
        raise ValueError("score_candidate needs the metrics of at least one seed")
    flat = [flatten_metrics(m) for m in per_seed_metrics]
    values = np.array([[o.evaluate(f, "--objective") for o in scoring.objectives]
                       for f in flat], np.float64)
    margins = np.array([[c.margin(f) for c in scoring.constraints] for f in flat],
                       np.float64).reshape(len(flat), len(scoring.constraints))
    r = scoring.robust
    objectives = np.array([r.aggregate(values[:, j]) for j in range(values.shape[1])])
    mean = values.mean(axis=0)
    tail = np.array([r.tail(values[:, j]) for j in range(values.shape[1])])
    agg = np.array([r.aggregate(margins[:, j]) for j in range(margins.shape[1])])
    violations = np.where(np.isnan(agg), np.inf, np.maximum(0.0, -agg))
    holds = all(c.holds(m) for c, m in zip(scoring.constraints, agg, strict=True))
    feasible = bool(holds and np.all(np.isfinite(objectives)))
    note = "" if feasible else ("infeasible" if np.all(np.isfinite(objectives))
                                else "non-finite objective")
    return CandidateEval(dict(knobs), objectives, mean, tail, agg, violations, feasible, True,
                         note, tuple(per_seed_metrics) if keep_metrics else ())


def _fitness_matrix(scoring: Scoring, evals: Sequence[CandidateEval]) -> np.ndarray:
    m = len(scoring.objectives)
    out = np.empty((len(evals), m), np.float64)
    for i, e in enumerate(evals):
        total = float(np.sum(e.violations)) if e.violations.size else 0.0
        if not e.valid or not np.all(np.isfinite(e.objectives)):
            out[i] = -np.inf
        elif scoring.constraint_mode == "penalty":
            out[i] = e.objectives - scoring.penalty * total
        elif e.feasible:
            out[i] = e.objectives
        else:
            out[i] = INFEASIBLE_BASE - total
    return out


def strategy_fitness(scoring: Scoring, evals: Sequence[CandidateEval],
                     strategy_multi_objective: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(what the strategy is told, the scalar fitness column of the history).

    One objective: both are the (P,) fitness above. Several: the strategy gets the (P, M)
    matrix if it is multi-objective, else its NSGA-II scalarisation; the history column is
    always the scalarisation (relative to this generation).
    """
    matrix = _fitness_matrix(scoring, evals)
    if matrix.shape[1] == 1:
        return matrix[:, 0], matrix[:, 0]
    scalar = scalarize(matrix) if matrix.shape[0] else np.zeros(0)
    return (matrix if strategy_multi_objective else scalar), scalar
