"""Multi-objective tools (NSGA-II style), all for **maximisation** of every objective.

* :func:`dominates` — ``a`` is at least as good as ``b`` everywhere and better somewhere;
* :func:`non_dominated_sort` — front index (rank) of every point, 0 = the Pareto front;
* :func:`crowding_distance` — NSGA-II crowding distance within one front (boundary points: inf);
* :func:`nsga2_order` — all points best-first by (rank ascending, crowding descending);
* :func:`scalarize` — one number per point that orders points like :func:`nsga2_order`, for
  single-objective strategies run in multi-objective mode;
* :func:`pareto_front` — indices of the non-dominated points.

Ties are broken by index (stable sorts), so every function is deterministic.
"""

from __future__ import annotations

import numpy as np

__all__ = ["crowding_distance", "dominates", "non_dominated_sort", "nsga2_order",
           "pareto_front", "scalarize"]

#: Objective values are clamped to ±this before crowding arithmetic (keeps ±inf finite).
_CLAMP = 1e300


def _as_matrix(F) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    if F.ndim == 1:
        F = F[:, None]
    if F.ndim != 2:
        raise ValueError(f"objectives must have shape (N, M), got {F.shape}")
    return np.where(np.isnan(F), -np.inf, F)


def dominates(a, b) -> bool:
    """Whether objective vector ``a`` Pareto-dominates ``b`` (maximisation)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(a >= b) and np.any(a > b))


def non_dominated_sort(F) -> np.ndarray:
    """Front index of each of the N points of ``F`` (N, M); 0 = non-dominated.

    Deb et al.'s fast non-dominated sort, O(M N²). NaN counts as −inf.
    """
    F = _as_matrix(F)
    n = F.shape[0]
    ge = np.all(F[:, None, :] >= F[None, :, :], axis=2)
    gt = np.any(F[:, None, :] > F[None, :, :], axis=2)
    dom = ge & gt  # dom[i, j]: i dominates j
    count = dom.sum(axis=0)  # how many points dominate j
    rank = np.full(n, -1, dtype=np.int64)
    front = np.flatnonzero(count == 0)
    level = 0
    while front.size:
        rank[front] = level
        count = count - dom[front].sum(axis=0)
        count[rank >= 0] = -1
        front = np.flatnonzero(count == 0)
        level += 1
    return rank


def crowding_distance(F) -> np.ndarray:
    """NSGA-II crowding distance of each point of one front ``F`` (N, M).

    For each objective the points are sorted; the two extremes get inf, an interior point adds
    ``(f[next] − f[prev]) / (f_max − f_min)`` (0 when the objective is constant). Fronts of at
    most two points are all inf.
    """
    F = np.clip(_as_matrix(F), -_CLAMP, _CLAMP)
    n, m = F.shape
    dist = np.zeros(n, dtype=np.float64)
    if n <= 2:
        return np.full(n, np.inf)
    for j in range(m):
        order = np.argsort(F[:, j], kind="stable")
        col = F[order, j]
        span = col[-1] - col[0]
        dist[order[0]] = np.inf
        dist[order[-1]] = np.inf
        if span > 0:
            dist[order[1:-1]] += (col[2:] - col[:-2]) / span
    return dist


def _rank_and_crowding(F) -> tuple[np.ndarray, np.ndarray]:
    F = _as_matrix(F)
    rank = non_dominated_sort(F)
    crowd = np.zeros(F.shape[0], dtype=np.float64)
    for r in np.unique(rank):
        idx = np.flatnonzero(rank == r)
        crowd[idx] = crowding_distance(F[idx])
    return rank, crowd


def nsga2_order(F) -> np.ndarray:
    """Indices of all points best-first: front rank ascending, then crowding descending."""
    rank, crowd = _rank_and_crowding(F)
    return np.lexsort((np.arange(rank.size), -crowd, rank))


def scalarize(F) -> np.ndarray:
    """One fitness per point, higher = better, ordering points as :func:`nsga2_order` does.

    ``−rank + c/(1 + c)`` with ``c`` the crowding distance (inf → 1), so it lies in
    ``(−rank, −rank + 1]``. Only the order is meaningful (it is relative to this set of points).
    """
    rank, crowd = _rank_and_crowding(F)
    finite = np.where(np.isinf(crowd), 0.0, crowd)
    frac = np.where(np.isinf(crowd), 1.0, finite / (1.0 + finite))
    return -rank.astype(np.float64) + frac


def pareto_front(F) -> np.ndarray:
    """Indices (ascending) of the non-dominated points of ``F`` (N, M)."""
    if np.asarray(F).shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(non_dominated_sort(F) == 0)
