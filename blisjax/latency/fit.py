"""Fit latency coefficients from vLLM-style traces (docs/latency-models.md §P.9–§P.10).

Inputs are a step table and a journey table with vLLM's tracing attribute names as columns,
read by :mod:`blisjax.latency.fit_tables` (``read_step_table``, ``read_journey_table``).

Each row becomes a :class:`~blisjax.latency.physics.PhysicsStepInputs` /
:class:`~blisjax.latency.physics.PhysicsQueueInputs` through the very functions the simulator
calls (``from_batch``, ``from_state``, ``update_preemption_ema``, ``beta_features``,
``alpha_features``), so trained coefficients mean the same thing in training and simulation.
Ridge regression (closed form), λ and γ chosen by stratified, time-ordered cross-validation,
per-regime MAPE/RMSE on a temporal hold-out against the v1 acceptance criteria, and a
coefficient YAML that :func:`~blisjax.latency.physics.load_physics_coefficients` reads.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from blisjax.config._checks import ConfigError
from blisjax.latency.blackbox import blackbox_queueing_delay_us, blackbox_step_time_us
from blisjax.latency.fit_tables import FitDataError, JourneyRecord, StepRecord
from blisjax.latency.physics import (
    ALPHA_FEATURE_NAMES,
    BETA_FEATURE_NAMES,
    SPEC_VERSION,
    PhysicsCoefficients,
    PhysicsConfig,
    PhysicsQueueInputs,
    PhysicsStepInputs,
    alpha_features,
    beta_features,
    congestion_gate,
    parse_physics_coefficients,
    queueing_delay_from_features,
    step_time_from_features,
    update_preemption_ema,
)

ALPHA_TARGETS = ("queued", "scheduled")

#: Defaults of docs/latency-models.md §P.9: λ grid, γ grid, folds, hold-out share, warm-up,
#: outliers, weight of preemption-heavy steps.
DEFAULT_LAMBDAS = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
DEFAULT_GAMMAS = (0.1, 0.3, 0.5)
DEFAULT_FOLDS = 5
DEFAULT_HOLDOUT = 0.2
DEFAULT_WARMUP_STEPS = 10
DEFAULT_OUTLIER_FACTOR = 5.0
DEFAULT_PREEMPTION_WEIGHT = 0.5
#: Integer µs targets are truncations of a time in [y, y + 1): fit the midpoint.
DEFAULT_TRUNCATION_OFFSET = 0.5

#: Acceptance criteria (docs/latency-models.md §P.10; provisional).
ACCEPTANCE = {
    "alpha": {"mape_pct": 25.0, "max_error_median_factor": 5.0},
    "beta": {"mape_pct": 15.0, "max_error_median_factor": 3.0},
}
#: Physically plausible signs (§P.10): β1 prefill compute > 0, β3 decode weight loading
#: > 0, β11 fixed overhead > 0, β16 bias >= 0.
PLAUSIBLE_BETA = ((0, ">0"), (2, ">0"), (10, ">0"), (15, ">=0"))
ALPHA_BIAS, BETA_BIAS = 3, 15
#: A feature needs this many non-zero rows in a training set to get a coefficient.
MIN_SUPPORT = 5
#: Share of each stratum's training rows in the first forward-chaining CV training window.
CV_INITIAL_WINDOW = 0.5


# ---------------------------------------------------------------------------------- features


@dataclass
class Design:
    """Feature matrix, target and per-row metadata for one model (alpha or beta)."""

    X: np.ndarray
    y: np.ndarray
    weight: np.ndarray
    stratum: list[str]
    order: np.ndarray  # time key within a stratum
    regimes: dict[str, np.ndarray] = field(default_factory=dict)


def _check_config(pc: PhysicsConfig, path: str, row: int, total: int, col: str) -> None:
    if total != pc.total_kv_blocks_gpu:
        raise FitDataError(f"{path}: row {row}, column {col!r}: {total} blocks, but the "
                           f"deployment config has {pc.total_kv_blocks_gpu} (wrong --config?)")


def step_emas(steps: Sequence[StepRecord], gamma: float) -> list[float]:
    """The preemption EMA after each step, recomputed along each instance's step sequence with
    :func:`update_preemption_ema` (steps are grouped by instance and ordered by id)."""
    out, prev, inst = [], 0.0, None
    for s in steps:
        if s.instance != inst:
            prev, inst = 0.0, s.instance
        prev = update_preemption_ema(prev, s.num_preempted, s.running_depth, gamma)
        out.append(prev)
    return out


def beta_design(pc: PhysicsConfig, steps: Sequence[StepRecord], gamma: float, *,
                path: str = "steps", truncation_offset: float = DEFAULT_TRUNCATION_OFFSET,
                preemption_weight: float = DEFAULT_PREEMPTION_WEIGHT) -> Design:
    """16 beta features per step via ``from_batch`` + ``beta_features`` (simulator code)."""
    emas = step_emas(steps, gamma)
    X = np.empty((len(steps), len(BETA_FEATURE_NAMES)))
    for i, (s, ema) in enumerate(zip(steps, emas, strict=True)):
        _check_config(pc, path, s.row, s.kv_total_blocks, "kv.blocks_total_gpu")
        inputs = PhysicsStepInputs.from_batch(s.batch, block_size_tokens=pc.block_size_tokens,
                                              preemption_ema=ema)
        X[i] = beta_features(pc, inputs)
    y = np.array([s.duration_us for s in steps]) + truncation_offset
    heavy = np.array([s.num_preempted / max(1, s.running_depth) > 0.5 for s in steps])
    prefill = np.array([sum(t for t, pi, l_in in zip(s.batch.new_tokens, s.batch.progress_index,
                                                     s.batch.input_tokens, strict=True)
                            if pi < l_in) for s in steps])
    total = np.array([sum(s.batch.new_tokens) for s in steps])
    decode = total - prefill
    usage = np.array([(s.kv_total_blocks - s.kv_free_blocks) / s.kv_total_blocks for s in steps])
    regimes = {
        "prefill-heavy": prefill >= np.maximum(decode, 1),
        "decode-heavy": decode > prefill,
        "pure-prefill": (prefill > 0) & (decode == 0),
        "pure-decode": (decode > 0) & (prefill == 0),
        "mixed": (prefill > 0) & (decode > 0),
        "small-batch": total <= 4,
        "high-preemption": np.array([s.num_preempted > 0 for s in steps]),
        "near-full-kv": usage >= 0.9,
    }
    return Design(X=X, y=y, weight=np.where(heavy, preemption_weight, 1.0),
                  stratum=[s.instance for s in steps],
                  order=np.array([s.step_id for s in steps], dtype=float), regimes=regimes)


def alpha_design(pc: PhysicsConfig, journeys: Sequence[JourneyRecord],
                 steps: Sequence[StepRecord], gamma: float, *, path: str = "journeys",
                 target: str = "queued",
                 truncation_offset: float = DEFAULT_TRUNCATION_OFFSET) -> Design:
    """11 alpha features per request via ``from_state`` + ``alpha_features`` (simulator code).

    The preemption EMA is the one after step ``scheduler.step`` of the request's instance
    (0.0 before the first step), recomputed with ``gamma``. Queue state comes from the journey
    row, or else from that step's summary.

    ``target``: ``"queued"`` = ts.QUEUED − ts.ARRIVED (the delay blisjax's α model adds before
    the wait queue); ``"scheduled"`` = ts.SCHEDULED − ts.QUEUED (vLLM's wait in its queue).
    """
    emas = step_emas(steps, gamma)
    by_key = {(s.instance, s.step_id): (s, e) for s, e in zip(steps, emas, strict=True)}
    X = np.empty((len(journeys), len(ALPHA_FEATURE_NAMES)))
    y = np.empty(len(journeys))
    gates, waiting, usage = [], [], []
    for i, j in enumerate(journeys):
        step, ema = by_key.get((j.instance, j.scheduler_step), (None, 0.0))
        if j.scheduler_step > 0 and step is None:
            raise FitDataError(f"{path}: row {j.row}, column 'scheduler.step': no step "
                               f"{j.scheduler_step} for instance {j.instance!r} in the step table")
        if j.running_depth is not None:
            run, wait = j.running_depth, j.waiting_depth
            total, free = j.kv_total_blocks, j.kv_free_blocks
            _check_config(pc, path, j.row, total, "kv.blocks_total_gpu")
        elif step is not None:
            run, wait = step.running_depth, step.waiting_depth
            total, free = step.kv_total_blocks, step.kv_free_blocks
        else:
            run, wait, total, free = 0, 0, pc.total_kv_blocks_gpu, pc.total_kv_blocks_gpu
        q = PhysicsQueueInputs.from_state(
            pc, running_depth=run, waiting_depth=wait, kv_used_blocks=total - free,
            prompt_tokens=j.prompt_tokens, prefix_cached_blocks=j.cached_blocks,
            preemption_ema=ema)
        X[i] = alpha_features(pc, q)
        if target == "queued":
            y[i] = (j.queued_ns - j.arrived_ns) / 1000.0
        else:
            if j.scheduled_ns is None:
                raise FitDataError(f"{path}: row {j.row}, column 'ts.SCHEDULED': required by "
                                   "--alpha-target scheduled")
            y[i] = (j.scheduled_ns - j.queued_ns) / 1000.0
        gates.append(congestion_gate(pc, run, q.kv_usage_ratio))
        waiting.append(wait)
        usage.append(q.kv_usage_ratio)
    g, w, u = np.array(gates), np.array(waiting), np.array(usage)
    regimes = {"instant": w == 0, "queued": w > 0, "saturated": g > 0.9, "near-full-kv": u >= 0.9}
    return Design(X=X, y=y + truncation_offset, weight=np.ones(len(journeys)),
                  stratum=[j.instance for j in journeys],
                  order=np.array([j.arrived_ns for j in journeys], dtype=float), regimes=regimes)


# ---------------------------------------------------------------------------------- ridge


def identifiable_columns(X: np.ndarray, bias: int | None) -> np.ndarray:
    """Columns that carry information: not all zero and, other than the bias column, not
    constant (a constant column is indistinguishable from the bias; its effect is credited to
    the bias and its coefficient is 0), with at least :data:`MIN_SUPPORT` non-zero rows (a
    feature seen in one or two rows cannot be estimated, only extrapolated from)."""
    keep = np.count_nonzero(X, axis=0) >= min(MIN_SUPPORT, len(X))
    if bias is not None:
        const = np.all(X == X[:1], axis=0)
        const[bias] = False
        keep &= ~const
    return keep


def _scaled(X: np.ndarray, w: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.sqrt(np.average(X[:, keep] ** 2, axis=0, weights=w))
    return X[:, keep] / scale, scale


def ridge_path(X: np.ndarray, y: np.ndarray, lambdas: Sequence[float],
               weights: np.ndarray | None = None, bias: int | None = None) -> list[np.ndarray]:
    """Weighted ridge solutions for each λ: ``argmin Σ wᵢ(yᵢ − xᵢ·β)² + λ‖Dβ‖²``.

    Closed form through one SVD of the weighted, RMS-scaled design ``Z = W^½ X D⁻¹``
    (D = per-column RMS): ``β = D⁻¹ V diag(s/(s²+λ)) Uᵀ W^½ y`` — the ridge solution
    ``(XᵀX + λI)⁻¹Xᵀy`` in scaled coordinates, so one λ grid suits features in seconds and
    ratios alike. λ = 0 gives the minimum-norm least-squares solution. Columns that are not
    :func:`identifiable_columns` get coefficient 0.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    keep = identifiable_columns(X, bias)
    outs = [np.zeros(X.shape[1]) for _ in lambdas]
    if not keep.any() or len(y) == 0:
        return outs
    Z, scale = _scaled(X, w, keep)
    sw = np.sqrt(w)
    U, s, Vt = np.linalg.svd(Z * sw[:, None], full_matrices=False)
    ub = U.T @ (y * sw)
    tol = (s[0] if s.size else 0.0) * max(Z.shape) * np.finfo(float).eps
    for out, lam in zip(outs, lambdas, strict=True):
        d = np.where(s > tol, s / (s * s + lam), 0.0)
        out[keep] = (Vt.T @ (d * ub)) / scale
    return outs


def ridge(X, y, lam: float, weights=None, bias: int | None = None) -> np.ndarray:
    """One ridge solution (see :func:`ridge_path`)."""
    return ridge_path(X, y, [lam], weights, bias)[0]


def effective_dof(X: np.ndarray, lam: float, weights=None, bias: int | None = None) -> float:
    """``trace(Z(ZᵀZ + λI)⁻¹Zᵀ)`` of the scaled design (§P.9 step 9, to compare with n)."""
    w = np.ones(len(X)) if weights is None else np.asarray(weights, dtype=float)
    keep = identifiable_columns(X, bias)
    if not keep.any():
        return 0.0
    Z, _ = _scaled(X, w, keep)
    s = np.linalg.svd(Z * np.sqrt(w)[:, None], compute_uv=False)
    return float(np.sum(s * s / (s * s + lam)))


# ---------------------------------------------------------------------------------- splits


def temporal_blocks(stratum: Sequence[str], order: np.ndarray, nblocks: int,
                    index: np.ndarray | None = None, head: float = 0.0) -> list[np.ndarray]:
    """Split rows (``index``, default all) into consecutive time blocks *per stratum*; block b
    is the union over strata of each stratum's b-th block. With ``head`` > 0, block 0 is the
    first ``head`` share of each stratum and the rest is cut into ``nblocks − 1`` equal blocks;
    otherwise all ``nblocks`` blocks are equal."""
    idx = np.arange(len(order)) if index is None else np.asarray(index)
    blocks: list[list[int]] = [[] for _ in range(nblocks)]
    groups: dict[str, list[int]] = {}
    for i in idx:
        groups.setdefault(stratum[i], []).append(int(i))
    for key in sorted(groups):
        rows = sorted(groups[key], key=lambda i: (order[i], i))
        n = len(rows)
        if head > 0 and nblocks > 1:
            h = int(round(head * n))
            cuts = [0] + [h + ((n - h) * b) // (nblocks - 1) for b in range(nblocks)]
        else:
            cuts = [(b * n) // nblocks for b in range(nblocks + 1)]
        for b in range(nblocks):
            blocks[b].extend(rows[cuts[b]:cuts[b + 1]])
    return [np.array(sorted(b), dtype=int) for b in blocks]


def holdout_split(d: Design, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, hold-out): the last ``holdout`` share of each stratum, in time, is held out."""
    train, test = [], []
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(d.stratum):
        groups.setdefault(key, []).append(i)
    for key in sorted(groups):
        rows = sorted(groups[key], key=lambda i: (d.order[i], i))
        cut = len(rows) - int(round(holdout * len(rows)))
        train.extend(rows[:cut])
        test.extend(rows[cut:])
    return np.array(sorted(train), dtype=int), np.array(sorted(test), dtype=int)


def cv_rmse(d: Design, index: np.ndarray, lambdas: Sequence[float], folds: int,
            bias: int | None) -> list[float]:
    """Mean validation RMSE per λ over ``folds`` forward-chaining folds.

    Stratified and time-ordered (§P.9 step 7): each stratum's rows are cut into an
    initial window (its first half) and ``folds`` consecutive blocks after it; fold k trains on
    the window and blocks 1..k−1 of every stratum and validates on block k of every stratum, so
    no fold trains on the future of its validation and every fold trains on >= half the data.
    """
    blocks = temporal_blocks(d.stratum, d.order, folds + 1, index, head=CV_INITIAL_WINDOW)
    sums = np.zeros(len(lambdas))
    used = 0
    for k in range(1, folds + 1):
        tr = np.concatenate(blocks[:k])
        va = blocks[k]
        if len(tr) == 0 or len(va) == 0:
            continue
        coefs = ridge_path(d.X[tr], d.y[tr], lambdas, d.weight[tr], bias)
        for i, c in enumerate(coefs):
            r = d.X[va] @ c - d.y[va]
            sums[i] += math.sqrt(float(np.average(r * r, weights=d.weight[va])))
        used += 1
    if used == 0:
        raise FitDataError("cross-validation: too few samples for the folds")
    return [float(x) for x in sums / used]


# ---------------------------------------------------------------------------------- metrics


def error_metrics(pred: np.ndarray, target: np.ndarray) -> dict[str, Any]:
    """n, MAPE % (rows with target > 0), RMSE µs, max |error| µs, median target µs."""
    if len(target) == 0:
        return {"n": 0}
    err = pred - target
    pos = target > 0
    return {
        "n": int(len(target)),
        "mape_pct": float(np.mean(np.abs(err[pos]) / target[pos]) * 100.0) if pos.any() else None,
        "rmse_us": float(math.sqrt(np.mean(err * err))),
        "max_abs_error_us": float(np.max(np.abs(err))),
        "median_target_us": float(np.median(target)),
    }


def _regime_metrics(d: Design, idx: np.ndarray, pred: np.ndarray, target: np.ndarray) -> dict:
    out = {"all": error_metrics(pred, target)}
    for name, mask in d.regimes.items():
        m = mask[idx]
        out[name] = error_metrics(pred[m], target[m])
    return out


# ---------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class FitOptions:
    """Fitting knobs; defaults as in docs/latency-models.md §P.9."""

    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    gammas: tuple[float, ...] = DEFAULT_GAMMAS
    folds: int = DEFAULT_FOLDS
    holdout: float = DEFAULT_HOLDOUT
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    outlier_factor: float = DEFAULT_OUTLIER_FACTOR
    preemption_weight: float = DEFAULT_PREEMPTION_WEIGHT
    truncation_offset: float = DEFAULT_TRUNCATION_OFFSET
    alpha_target: str = "queued"

    def __post_init__(self) -> None:
        if not self.lambdas or any(not math.isfinite(x) or x < 0 for x in self.lambdas):
            raise ConfigError("--lambdas", f"must be finite numbers >= 0, got {self.lambdas}")
        if not self.gammas or any(not (0 < x <= 1) for x in self.gammas):
            raise ConfigError("--gammas", f"must be numbers in (0, 1], got {self.gammas}")
        if self.folds < 1:
            raise ConfigError("--folds", f"must be an integer >= 1, got {self.folds}")
        if not 0 < self.holdout < 1:
            raise ConfigError("--holdout", f"must be in (0, 1), got {self.holdout}")
        if self.warmup_steps < 0:
            raise ConfigError("--warmup-steps", f"must be >= 0, got {self.warmup_steps}")
        if not math.isfinite(self.outlier_factor) or self.outlier_factor < 0:
            raise ConfigError("--outlier-factor", f"must be >= 0 (0 = off), got "
                              f"{self.outlier_factor}")
        if not 0 < self.preemption_weight <= 1:
            raise ConfigError("--preemption-weight", f"must be in (0, 1], got "
                              f"{self.preemption_weight}")
        if not 0 <= self.truncation_offset < 1:
            raise ConfigError("--truncation-offset", f"must be in [0, 1), got "
                              f"{self.truncation_offset}")
        if self.alpha_target not in ALPHA_TARGETS:
            raise ConfigError("--alpha-target", f"must be one of {', '.join(ALPHA_TARGETS)}, "
                              f"got {self.alpha_target!r}")


@dataclass
class FitResult:
    """Fitted physics coefficients, the JSON report, and the blackbox fit."""

    coefficients: PhysicsCoefficients
    report: dict[str, Any]
    blackbox_alpha: tuple[float, float, float]
    blackbox_beta: tuple[float, float, float]


def _clean(d: Design, keep: np.ndarray, factor: float) -> tuple[np.ndarray, int]:
    """Rows kept after outlier removal (target > factor × median, §P.9 step 4)."""
    if factor <= 0 or not keep.any():
        return keep, 0
    med = float(np.median(d.y[keep]))
    if med <= 0:
        return keep, 0
    out = keep & (d.y <= factor * med)
    return out, int(keep.sum() - out.sum())


def _training_date(steps: Sequence[StepRecord], journeys: Sequence[JourneyRecord]) -> str | None:
    """UTC date of the latest wall-clock timestamp in the data (OTLP ns since the Unix epoch),
    or None when the timestamps are not wall-clock (before 2000-01-01)."""
    latest = max([s.ts_end_ns or 0 for s in steps] + [j.queued_ns for j in journeys], default=0)
    if latest < 946_684_800 * 10**9:
        return None
    return _dt.datetime.fromtimestamp(latest / 1e9, tz=_dt.timezone.utc).date().isoformat()


def fit_latency(steps: Sequence[StepRecord], journeys: Sequence[JourneyRecord],
                pc: PhysicsConfig, *, model: str, hardware: str, tp: int,
                options: FitOptions | None = None, sources: dict[str, str] | None = None,
                ) -> FitResult:
    """Fit α (11) and β (16) with (λ, γ) chosen by cross-validation; evaluate on the hold-out.

    Pipeline (docs/latency-models.md §P.9–§P.10): features per γ (EMA recomputed along each
    instance's steps) → cleaning (warm-up steps dropped from β, preemption-heavy steps weighted
    ``preemption_weight``, outliers above ``outlier_factor`` × median dropped) → temporal
    hold-out (last ``holdout`` of each instance) → forward-chaining stratified CV on the rest
    for each (λ, γ) → γ minimising the mean of the α and β CV RMSEs relative to their best γ,
    λ per model minimising its CV RMSE at that γ → final fit on the training part → hold-out
    metrics per regime with the simulator's own truncating formulas → acceptance checks.
    """
    opt = options or FitOptions()
    if not steps:
        raise FitDataError("steps: no steps to fit")
    if not journeys:
        raise FitDataError("journeys: no journeys to fit")
    spath = (sources or {}).get("steps", "steps")
    jpath = (sources or {}).get("journeys", "journeys")
    betas = {g: beta_design(pc, steps, g, path=spath, truncation_offset=opt.truncation_offset,
                            preemption_weight=opt.preemption_weight) for g in opt.gammas}
    alphas = {g: alpha_design(pc, journeys, steps, g, path=jpath, target=opt.alpha_target,
                              truncation_offset=opt.truncation_offset) for g in opt.gammas}
    any_b, any_a = betas[opt.gammas[0]], alphas[opt.gammas[0]]
    # Cleaning masks do not depend on γ (targets and step order only).
    pos: dict[str, int] = {}
    warm = np.zeros(len(steps), dtype=bool)
    for i, s in enumerate(steps):
        pos[s.instance] = pos.get(s.instance, 0) + 1
        warm[i] = pos[s.instance] <= opt.warmup_steps
    b_keep, b_out = _clean(any_b, ~warm, opt.outlier_factor)
    a_keep, a_out = _clean(any_a, np.ones(len(journeys), dtype=bool), opt.outlier_factor)
    b_rows, a_rows = np.flatnonzero(b_keep), np.flatnonzero(a_keep)
    if len(b_rows) < 2 or len(a_rows) < 2:
        raise FitDataError("too few samples after cleaning (warm-up/outliers): "
                           f"{len(b_rows)} steps, {len(a_rows)} journeys")

    def sub(d: Design, rows: np.ndarray) -> Design:
        return Design(X=d.X[rows], y=d.y[rows], weight=d.weight[rows],
                      stratum=[d.stratum[i] for i in rows], order=d.order[rows],
                      regimes={k: v[rows] for k, v in d.regimes.items()})

    betas = {g: sub(d, b_rows) for g, d in betas.items()}
    alphas = {g: sub(d, a_rows) for g, d in alphas.items()}
    b_train, b_test = holdout_split(betas[opt.gammas[0]], opt.holdout)
    a_train, a_test = holdout_split(alphas[opt.gammas[0]], opt.holdout)

    grid = []
    for g in opt.gammas:
        rb = cv_rmse(betas[g], b_train, opt.lambdas, opt.folds, BETA_BIAS)
        ra = cv_rmse(alphas[g], a_train, opt.lambdas, opt.folds, ALPHA_BIAS)
        ib, ia = int(np.argmin(rb)), int(np.argmin(ra))
        grid.append({"gamma": g, "lambda_beta": opt.lambdas[ib], "cv_rmse_beta_us": rb[ib],
                     "lambda_alpha": opt.lambdas[ia], "cv_rmse_alpha_us": ra[ia],
                     "cv_rmse_beta_by_lambda": rb, "cv_rmse_alpha_by_lambda": ra})
    best_b = min(e["cv_rmse_beta_us"] for e in grid)
    best_a = min(e["cv_rmse_alpha_us"] for e in grid)
    for e in grid:
        e["score"] = 0.5 * (e["cv_rmse_beta_us"] / max(best_b, 1e-12)
                            + e["cv_rmse_alpha_us"] / max(best_a, 1e-12))
    chosen = min(grid, key=lambda e: e["score"])  # ties: first in grid order
    gamma, lam_b, lam_a = chosen["gamma"], chosen["lambda_beta"], chosen["lambda_alpha"]
    B, A = betas[gamma], alphas[gamma]
    beta = ridge(B.X[b_train], B.y[b_train], lam_b, B.weight[b_train], BETA_BIAS)
    alpha = ridge(A.X[a_train], A.y[a_train], lam_a, A.weight[a_train], ALPHA_BIAS)
    beta_t, alpha_t = tuple(float(x) for x in beta), tuple(float(x) for x in alpha)

    # Hold-out with the simulator's formulas (truncation, max(1, ·) / max(0, ·)).
    off = opt.truncation_offset
    yb = B.y[b_test] - off
    pb = np.array([step_time_from_features(beta_t, B.X[i]) for i in b_test], dtype=float)
    ya = A.y[a_test] - off
    pa = np.array([queueing_delay_from_features(alpha_t, A.X[i]) for i in a_test], dtype=float)
    hold_b = _regime_metrics(B, b_test, pb, yb)
    hold_a = _regime_metrics(A, a_test, pa, ya)

    # Blackbox 3+3 on the same rows and split: β on (1, prefill, decode), α on (1, L_in).
    step_rows = [steps[i] for i in b_rows]
    pref = np.array([sum(t for t, pi, li in zip(s.batch.new_tokens, s.batch.progress_index,
                                                s.batch.input_tokens, strict=True) if pi < li)
                     for s in step_rows], dtype=float)
    dec = np.array([sum(s.batch.new_tokens) for s in step_rows], dtype=float) - pref
    Xb = np.column_stack([np.ones(len(pref)), pref, dec])
    bb = np.linalg.lstsq(Xb[b_train] * np.sqrt(B.weight[b_train])[:, None],
                         B.y[b_train] * np.sqrt(B.weight[b_train]), rcond=None)[0]
    lin = np.array([journeys[i].prompt_tokens for i in a_rows], dtype=float)
    Xa = np.column_stack([np.ones(len(lin)), lin])
    ab = np.linalg.lstsq(Xa[a_train], A.y[a_train], rcond=None)[0]
    bb_t = (float(bb[0]), float(bb[1]), float(bb[2]))
    ab_t = (float(ab[0]), float(ab[1]), 0.0)
    pbb = np.array([blackbox_step_time_us(bb_t, int(pref[i]), int(dec[i])) for i in b_test],
                   dtype=float)
    pab = np.array([blackbox_queueing_delay_us(ab_t, int(lin[i])) for i in a_test], dtype=float)

    checks = _acceptance(hold_a["all"], hold_b["all"], beta_t, B.X[b_train])
    evaluable = [c for c in checks if c["result"] != "not-evaluated"]
    accepted = all(c["result"] == "pass" for c in evaluable)
    date = _training_date(steps, journeys)
    src = sources or {}
    source = "blisjax fit-latency: " + ", ".join(f"{k}={v}" for k, v in src.items())
    trained_on = {
        "model": model, "hardware": hardware, "tp": tp, "vllm_version": None,
        "training_date": date, "n_samples_alpha": int(len(a_train)),
        "n_samples_beta": int(len(b_train)), "lambda_alpha": float(lam_a),
        "lambda_beta": float(lam_b), "gamma": float(gamma),
        "hold_out_rmse_alpha": hold_a["all"]["rmse_us"],
        "hold_out_rmse_beta": hold_b["all"]["rmse_us"],
    }
    document = {"physics_coefficients": {
        "spec_version": SPEC_VERSION, "status": "trained", "source": source,
        "trained_on": trained_on, "alpha_coefficients": list(alpha_t),
        "beta_coefficients": list(beta_t)}}
    coeffs = parse_physics_coefficients(document)  # the loader's own validation

    def ident(X, bias, names):
        keep = identifiable_columns(X, bias)
        return [n for n, k in zip(names, keep, strict=True) if not k]

    report = {
        "spec_version": SPEC_VERSION,
        "inputs": {**src, "steps_rows": len(steps), "journey_rows": len(journeys),
                   "instances": len({s.instance for s in steps}),
                   "deployment": {"model": model, "hardware": hardware, "tp": tp},
                   "training_date": date},
        "cleaning": {"warmup_steps_per_instance": opt.warmup_steps,
                     "beta_warmup_excluded": int(warm.sum()),
                     "beta_outliers_removed": b_out, "alpha_outliers_removed": a_out,
                     "outlier_factor": opt.outlier_factor,
                     "beta_preemption_downweighted": int(np.sum(B.weight < 1.0)),
                     "truncation_offset_us": off, "alpha_target": opt.alpha_target},
        "split": {"holdout_share": opt.holdout, "beta_train": int(len(b_train)),
                  "beta_holdout": int(len(b_test)), "alpha_train": int(len(a_train)),
                  "alpha_holdout": int(len(a_test))},
        "selection": {"gamma": gamma, "lambda_alpha": lam_a, "lambda_beta": lam_b,
                      "lambdas": list(opt.lambdas), "gammas": list(opt.gammas),
                      "cv": f"{opt.folds}-fold forward-chaining, stratified by instance, "
                            "time-ordered; criterion mean validation RMSE", "grid": grid},
        "physics": {
            "alpha_coefficients": dict(zip(ALPHA_FEATURE_NAMES, alpha_t, strict=True)),
            "beta_coefficients": dict(zip(BETA_FEATURE_NAMES, beta_t, strict=True)),
            "not_identifiable": {
                "alpha": ident(A.X[a_train], ALPHA_BIAS, ALPHA_FEATURE_NAMES),
                "beta": ident(B.X[b_train], BETA_BIAS, BETA_FEATURE_NAMES)},
            "effective_dof": {
                "alpha": effective_dof(A.X[a_train], lam_a, A.weight[a_train], ALPHA_BIAS),
                "beta": effective_dof(B.X[b_train], lam_b, B.weight[b_train], BETA_BIAS)},
            "hold_out": {"alpha": hold_a, "beta": hold_b},
        },
        "blackbox": {"alpha": list(ab_t), "beta": list(bb_t),
                     "note": "alpha2 (output-token processing) is not identifiable from these "
                             "tables and is reported as 0",
                     "hold_out": {"alpha": error_metrics(pab, ya), "beta": error_metrics(pbb, yb)}},
        "acceptance": {"criteria": "provisional, docs/latency-models.md §P.10",
                       "checks": checks, "pass": accepted},
    }
    return FitResult(coefficients=coeffs, report=report, blackbox_alpha=ab_t,
                     blackbox_beta=bb_t)


def _acceptance(hold_a: dict, hold_b: dict, beta: Sequence[float], Xb: np.ndarray) -> list[dict]:
    checks = []
    for name, h in (("alpha", hold_a), ("beta", hold_b)):
        lim = ACCEPTANCE[name]
        mape = h.get("mape_pct")
        checks.append({"name": f"{name} within-config hold-out MAPE", "value": mape,
                       "threshold": f"< {lim['mape_pct']}%",
                       "result": "not-evaluated" if mape is None
                       else ("pass" if mape < lim["mape_pct"] else "fail")})
        if h.get("n", 0):
            bound = lim["max_error_median_factor"] * h["median_target_us"]
            checks.append({"name": f"{name} max abs error", "value": h["max_abs_error_us"],
                           "threshold": f"< {lim['max_error_median_factor']} x median target "
                                        f"({bound:g} us)",
                           "result": "pass" if h["max_abs_error_us"] < bound else "fail"})
        checks.append({"name": f"{name} cross-config MAPE (leave-one-config-out)",
                       "value": None, "threshold": "< 40%" if name == "alpha" else "< 25%",
                       "result": "not-evaluated",
                       "note": "one deployment configuration per fit"})
    keep = identifiable_columns(Xb, BETA_BIAS)
    for i, rule in PLAUSIBLE_BETA:
        v = beta[i]
        name = f"beta[{i}] {BETA_FEATURE_NAMES[i]} {rule}"
        if not keep[i]:
            checks.append({"name": name, "value": v, "threshold": rule,
                           "result": "not-evaluated", "note": "feature not excited in the data"})
            continue
        ok = v > 0 if rule == ">0" else v >= 0
        checks.append({"name": name, "value": v, "threshold": rule,
                       "result": "pass" if ok else "fail"})
    return checks


# ---------------------------------------------------------------------------------- output


def coefficients_yaml(result: FitResult) -> str:
    """The coefficient file text (docs/latency-models.md §P.8 format, with a header comment)."""
    c = result.coefficients
    trained_on = {"model": c.model, "hardware": c.hardware, "tp": c.tp,
                  "vllm_version": None, "training_date": None}
    trained_on.update(dict(c.metadata))
    trained_on["gamma"] = c.gamma
    body = {"physics_coefficients": {
        "spec_version": c.spec_version, "status": c.status, "source": c.source,
        "trained_on": trained_on, "alpha_coefficients": list(c.alpha),
        "beta_coefficients": list(c.beta)}}
    ok = result.report["acceptance"]["pass"]
    head = ("# Physics latency coefficients fitted by `blisjax fit-latency` (ridge regression,\n"
            "# λ/γ by stratified time-ordered CV). alpha: 11 values in ALPHA_FEATURE_NAMES order;\n"
            "# beta: 16 values in BETA_FEATURE_NAMES order; µs per feature unit.\n"
            f"# v1 acceptance criteria: {'pass' if ok else 'FAIL'}.\n")
    return head + yaml.safe_dump(body, sort_keys=False, width=100)


def physics_config_from_sim(cfg) -> tuple[PhysicsConfig, str, str, int]:
    """The :class:`PhysicsConfig` a simulation of ``cfg`` (a ``SimConfig``) would use, built as
    the latency factory builds it; also returns (model, hardware, tp)."""
    import dataclasses

    from blisjax.config import resolve_config
    from blisjax.latency.factory import make_latency_model

    lat = dataclasses.replace(cfg.latency, model="physics", alpha_coeffs=None, beta_coeffs=None,
                              coefficients_file=None, preemption_ema_gamma=None)
    resolved = resolve_config(dataclasses.replace(cfg, latency=lat))
    return (make_latency_model(resolved).config, cfg.model, cfg.hardware,
            cfg.engine.tensor_parallel_size)
