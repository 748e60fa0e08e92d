"""Token lengths of generated requests: the length distributions (``DistSpec``) sampled, and
BLIS's rounding of float draws to whole tokens (docs/semantics.md §8).

Statistical parity with BLIS only (numpy streams, not Go's ``math/rand``; docs/semantics.md
Decision 10).
"""

from __future__ import annotations

import numpy as np

from blisjax.workload.clients import DistSpec

#: Float draws are clipped to this (2^53) before they become whole tokens: no overflow.
_MAX_FLOAT = float(2**53)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Go ``math.Round``: nearest integer, halves away from zero (float64 in, float64 out).

    Uses the exact fractional part ``x - trunc(x)``, so 0.49999999999999994 rounds to 0
    (``floor(x + 0.5)`` would give 1).
    """
    x = np.asarray(x, dtype=np.float64)
    whole = np.trunc(x)
    return whole + np.sign(x) * (np.abs(x - whole) >= 0.5)


def _to_tokens(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, at least 1 token, as int64."""
    return np.clip(round_half_away(x), 1.0, _MAX_FLOAT).astype(np.int64)


def empirical_cdf(dist: DistSpec) -> tuple[np.ndarray, np.ndarray]:
    """Sorted bin values (int64) and their normalised CDF (last entry exactly 1.0).

    Zero-probability bins are dropped (they can never be drawn), as in BLIS.
    """
    order = np.argsort(np.asarray(dist.bins, dtype=np.int64), kind="stable")
    values = np.asarray(dist.bins, dtype=np.int64)[order]
    probs = np.asarray(dist.probabilities, dtype=np.float64)[order]
    keep = probs > 0
    values, probs = values[keep], probs[keep]
    cdf = np.cumsum(probs / probs.sum())
    cdf[-1] = 1.0
    return values, cdf


def _clamp(dist: DistSpec, x: np.ndarray) -> np.ndarray:
    lo, hi = dist.param("min"), dist.param("max")
    if lo is not None:
        x = np.maximum(x, float(lo))
    if hi is not None:
        x = np.minimum(x, float(hi))
    return x


def sample_lengths(dist: DistSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token lengths (int64, >= 1) drawn from ``dist`` (see ``DistSpec``).

    Float samples are clamped to [min, max] where given, then rounded half away from zero.
    gaussian with min == max returns min without drawing (BLIS). uniform draws integers in
    [min, max] inclusive. empirical inverts the CDF with a binary search (first bin whose
    cumulative probability >= U).
    """
    p = dist.params
    if dist.type == "gaussian":
        if p["min"] == p["max"]:
            return np.full(n, max(1, int(p["min"])), dtype=np.int64)
        return _to_tokens(_clamp(dist, rng.standard_normal(n) * p["std_dev"] + p["mean"]))
    if dist.type == "exponential":
        return _to_tokens(_clamp(dist, rng.standard_exponential(n) * p["mean"]))
    if dist.type == "lognormal":
        return _to_tokens(_clamp(dist, np.exp(p["mu"] + p["sigma"] * rng.standard_normal(n))))
    if dist.type == "uniform":
        draws = rng.integers(int(p["min"]), int(p["max"]), size=n, endpoint=True)
        return np.maximum(draws.astype(np.int64), 1)
    if dist.type == "constant":
        return np.full(n, max(1, int(p["value"])), dtype=np.int64)
    if dist.type == "empirical":
        values, cdf = empirical_cdf(dist)
        idx = np.searchsorted(cdf, rng.random(n), side="left")
        return np.maximum(values[np.minimum(idx, values.size - 1)], 1)
    if dist.type == "pareto_lognormal":
        return _sample_pareto_lognormal(p, rng, n)
    raise ValueError(f"distribution type: unknown value {dist.type!r}")


def _sample_pareto_lognormal(p: dict, rng: np.random.Generator, n: int) -> np.ndarray:
    """Mixture: with probability mix_weight Pareto(alpha, xm), else LogNormal(mu, sigma)."""
    use_pareto = rng.random(n) < p["mix_weight"]
    pareto = p["xm"] * (1.0 + rng.pareto(p["alpha"], n))
    lognormal = np.exp(p["mu"] + p["sigma"] * rng.standard_normal(n))
    return _to_tokens(np.where(use_pareto, pareto, lognormal))
