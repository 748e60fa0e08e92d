"""Small pure metric formulas over numpy arrays (each mirrors one BLIS definition).

Every function here takes plain arrays / numbers and returns plain numbers, so the JAX engine can
mirror each one with ``jnp`` one to one. Units are in the names (``_us`` = integer microseconds,
``_ms`` = float milliseconds, ``_s`` = float seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from blisjax.config.codes import FITNESS_KEYS  # the configuration's names; formulas below
from blisjax.metrics.percentile import mean, percentile_linear

__all__ = [
    "FITNESS_KEYS",
    "REFERENCE_LATENCY_US",
    "REFERENCE_RPS",
    "REFERENCE_TPS",
    "TAIL_RATIO_FLOOR_US",
    "cache_hit_rate",
    "fitness",
    "fitness_components",
    "hol_blocking_count",
    "hol_blocking_flags",
    "hol_blocking_means",
    "jain_fairness",
    "latency_score",
    "preemption_rate",
    "priority_inversion_count",
    "priority_inversions_per_request",
    "request_tpot_us",
    "tail_ratio",
    "throughput_per_s",
    "throughput_score",
]

#: Fitness normalisation references (BLIS): 100 requests/s, 10 000 tokens/s, 1 ms = 1000 µs.
REFERENCE_RPS = 100.0
REFERENCE_TPS = 10000.0
REFERENCE_LATENCY_US = 1000.0



def request_tpot_us(
    itl_sum_us: np.ndarray,
    itl_count: np.ndarray,
    output_tokens: np.ndarray,
    length_capped: np.ndarray,
) -> np.ndarray:
    """Per-request mean inter-token latency (TPOT) in µs, BLIS ``RequestITLs``.

    ``ΣITL / max(N_out − 1, 1)``; for a length-capped request the denominator is
    ``max(len(ITL) − 1, 1)`` instead (BLIS counts one entry fewer than it recorded there).
    It is 0 when ``N_out = 0`` (no ITL entries, so the sum is 0).

    Args:
      itl_sum_us: int64 µs, sum of each request's ITL entries.
      itl_count: int64, number of ITL entries of each request.
      output_tokens: int64, the request's N_out.
      length_capped: bool, completion forced by max_model_len.

    Returns:
      float64 µs per request.
    """
    itl_count = np.asarray(itl_count, dtype=np.int64)
    output_tokens = np.asarray(output_tokens, dtype=np.int64)
    denom = np.where(
        np.asarray(length_capped, dtype=bool),
        np.maximum(itl_count - 1, 1),
        np.maximum(output_tokens - 1, 1),
    )
    return np.asarray(itl_sum_us, dtype=np.int64).astype(np.float64) / denom.astype(np.float64)


def throughput_per_s(count: int, sim_ended_us: int, completed: int) -> float:
    """``count / (sim_ended_us / 1e6)`` per second, or 0.0 when nothing completed or no time ran.

    BLIS computes both responses/s and tokens/s only when ``completed > 0`` and the duration is
    positive, dividing by the duration in seconds (not multiplying by 1e6 first).
    """
    duration_s = float(sim_ended_us) / 1e6
    if completed <= 0 or duration_s <= 0.0:
        return 0.0
    return float(count) / duration_s


def cache_hit_rate(cache_hits: np.ndarray, cache_misses: np.ndarray,
                   cpu_misses: np.ndarray | None = None) -> float:
    """Unweighted mean over instances of ``hits / (hits + misses + cpu misses)`` (0 for an
    instance with none); the CPU-miss term is BLIS's tiered cache's (0 without a CPU tier).

    Args:
      cache_hits, cache_misses: int64 per instance (block counts).
      cpu_misses: int64 per instance, allocations that failed without a reload; None = zeros.

    Returns:
      Dimensionless rate in [0, 1]; 0.0 for zero instances.
    """
    hits = np.asarray(cache_hits, dtype=np.int64).tolist()
    misses = np.asarray(cache_misses, dtype=np.int64).tolist()
    cpu = [0] * len(hits) if cpu_misses is None else np.asarray(cpu_misses, np.int64).tolist()
    if not hits:
        return 0.0
    total = 0.0
    for h, m, c in zip(hits, misses, cpu, strict=True):
        # Summed in instance order, as BLIS accumulates its per-instance rates.
        total += float(h) / float(h + m + c) if h + m + c > 0 else 0.0
    return total / float(len(hits))


#: The floor of ``tail_ratio``'s terms, µs: the clock's resolution.
TAIL_RATIO_FLOOR_US = 1.0


def tail_ratio(p99_us: float, p50_us: float) -> float:
    """Tail-latency blow-up ``max(p99, 1 µs) / max(p50, 1 µs)`` of a population's µs
    percentiles: p99 / p50 when the median is at least the clock's 1 µs resolution; a p50 below
    it (an empty population, or one whose median is 0) counts as 1 µs, so the ratio stays
    finite and is 1.0 when both are 0."""
    return max(float(p99_us), TAIL_RATIO_FLOOR_US) / max(float(p50_us), TAIL_RATIO_FLOOR_US)


def kv_thrashing_rate(cpu_evictions: np.ndarray, mirror_stores: np.ndarray) -> float:
    """BLIS's "KV Thrashing Rate": unweighted mean over instances of CPU-tier evictions /
    mirror stores (0 for an instance that stored nothing).

    Args:
      cpu_evictions, mirror_stores: int64 per instance (block counts).

    Returns:
      Dimensionless rate in [0, 1]; 0.0 for zero instances.
    """
    evictions = np.asarray(cpu_evictions, dtype=np.int64).tolist()
    stores = np.asarray(mirror_stores, dtype=np.int64).tolist()
    if not evictions:
        return 0.0
    total = 0.0
    for e, m in zip(evictions, stores, strict=True):
        total += float(e) / float(m) if m > 0 else 0.0
    return total / float(len(evictions))


def preemption_rate(preemptions: int, completed: int) -> float:
    """Preemptions per completed request (BLIS ``PreemptionRate``); 0.0 when nothing completed."""
    if completed <= 0:
        return 0.0
    return float(preemptions) / float(completed)


def jain_fairness(x: Iterable[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``.

    Returns 0.0 for an empty input and 1.0 when ``Σx² = 0`` (everyone got the same nothing).
    Sums run left to right in the given order (callers pass tenants sorted by name, as BLIS).
    """
    values = [float(v) for v in x]
    if not values:
        return 0.0
    sum_x = 0.0
    sum_x2 = 0.0
    for v in values:
        sum_x += v
        sum_x2 += v * v
    if sum_x2 == 0.0:
        return 1.0
    return (sum_x * sum_x) / (float(len(values)) * sum_x2)


def throughput_score(value_per_s: float, reference_per_s: float) -> float:
    """Higher-is-better normalisation ``value / (value + reference)`` in [0, 1)."""
    return value_per_s / (value_per_s + reference_per_s)


def latency_score(value_us: float) -> float:
    """Lower-is-better normalisation ``1 / (1 + value_us / 1000)``: 1 ms → 0.5, 50 ms → 1/51."""
    return 1.0 / (1.0 + value_us / REFERENCE_LATENCY_US)


def fitness_components(
    weights: Mapping[str, float],
    responses_per_s: float,
    tokens_per_s: float,
    ttft_us: np.ndarray,
    e2e_us: np.ndarray,
) -> dict[str, float]:
    """Normalised fitness component per weighted key, keys in sorted order (BLIS).

    Args:
      weights: fitness key → weight; keys must be in ``FITNESS_KEYS``.
      responses_per_s, tokens_per_s: cluster throughput.
      ttft_us: every recorded TTFT (µs), including unfinished / timed-out requests.
      e2e_us: E2E of completed requests (µs).

    Returns:
      key → component in [0, 1], in sorted key order. Latency statistics of an empty population
      are 0 µs (BLIS's zero ``Distribution``), i.e. a component of 1.0.
    """
    unknown = sorted(k for k in weights if k not in FITNESS_KEYS)
    if unknown:
        raise ValueError(
            f"unknown fitness metric key(s) {unknown}; valid keys: {', '.join(FITNESS_KEYS)}"
        )
    comps: dict[str, float] = {}
    for key in sorted(weights):
        if key == "throughput":
            comps[key] = throughput_score(responses_per_s, REFERENCE_RPS)
        elif key == "tokens_per_sec":
            comps[key] = throughput_score(tokens_per_s, REFERENCE_TPS)
        else:
            stat, _, metric = key.partition("_")
            values = ttft_us if metric == "ttft" else e2e_us
            if stat == "mean":
                value_us = mean(values)
            else:
                value_us = percentile_linear(values, float(stat[1:]))
            comps[key] = latency_score(value_us)
    return comps


def fitness(weights: Mapping[str, float], components: Mapping[str, float]) -> float:
    """``Σ w_k·comp_k`` over keys in sorted order, weights not normalised (BLIS)."""
    score = 0.0
    for key in sorted(weights):
        score += components[key] * float(weights[key])
    return score


def hol_blocking_means(queue_depth_time_us: np.ndarray, busy_time_us: np.ndarray
                       ) -> tuple[list[float], float]:
    """Each instance's mean wait-queue depth and their cross-instance mean.

    An instance's mean depth is its time-weighted average ``Σ(depth·step_us) / Σ step_us``
    (0 for an instance that never stepped; idle instances stay in the mean, so one instance
    hoarding the queue stands out). An instance is HOL-blocking when its mean exceeds twice the
    cross-instance mean, with at least two instances and a positive mean.
    """
    depth_time = np.asarray(queue_depth_time_us, dtype=np.int64).tolist()
    busy = np.asarray(busy_time_us, dtype=np.int64).tolist()
    avgs = [float(q) / float(b) if b > 0 else 0.0 for q, b in zip(depth_time, busy, strict=True)]
    total = 0.0
    for a in avgs:
        total += a
    return avgs, total / float(len(avgs)) if avgs else 0.0


def hol_blocking_flags(queue_depth_time_us: np.ndarray, busy_time_us: np.ndarray) -> list[bool]:
    """Per instance: is it HOL-blocking (:func:`hol_blocking_means`)?"""
    avgs, mean_avg = hol_blocking_means(queue_depth_time_us, busy_time_us)
    if len(avgs) < 2 or mean_avg <= 0.0:
        return [False] * len(avgs)
    return [a > 2.0 * mean_avg for a in avgs]


def hol_blocking_count(queue_depth_time_us: np.ndarray, busy_time_us: np.ndarray) -> int:
    """Number of HOL-blocking instances (:func:`hol_blocking_means`)."""
    return sum(hol_blocking_flags(queue_depth_time_us, busy_time_us))


def priority_inversions_per_request(arrival_us: np.ndarray, e2e_us: np.ndarray,
                                    group: np.ndarray) -> np.ndarray:
    """For each request, how many later arrivals of its group finished in under half its E2E.

    BLIS groups completed requests by (instance, SLO class); pass a combined group code. Within
    a group requests are ordered by arrival, ties by row (request index) order; a pair (earlier
    i, later j) is an inversion when ``E2E_i > 2·E2E_j``.

    Args:
      arrival_us: int64 arrival times of the completed requests.
      e2e_us: int64 E2E of the same requests.
      group: int64 group code of the same requests.

    Returns:
      int64 counts aligned with the inputs (computed in O(n log n) with a Fenwick tree over
      E2E ranks, from the latest arrival back).
    """
    arrival = np.asarray(arrival_us, dtype=np.int64)
    e2e = np.asarray(e2e_us, dtype=np.int64)
    grp = np.asarray(group, dtype=np.int64)
    counts = np.zeros(arrival.shape[0], dtype=np.int64)
    for g in np.unique(grp).tolist():
        idx = np.nonzero(grp == g)[0]
        if idx.shape[0] < 2:
            continue
        order = idx[np.lexsort((idx, arrival[idx]))]
        e = e2e[order]
        ranks_sorted = np.sort(e)
        # 1-based Fenwick position of each value, and how many values v satisfy 2·v < e_i
        pos = np.searchsorted(ranks_sorted, e, side="left") + 1
        below_half = np.searchsorted(2 * ranks_sorted, e, side="left")
        tree = [0] * (len(e) + 1)
        for i in range(len(e) - 1, -1, -1):
            later = 0
            k = int(below_half[i])
            while k > 0:
                later += tree[k]
                k -= k & -k
            counts[order[i]] = later
            k = int(pos[i])
            while k <= len(e):
                tree[k] += 1
                k += k & -k
    return counts


def priority_inversion_count(arrival_us: np.ndarray, e2e_us: np.ndarray, group: np.ndarray) -> int:
    """Pairs (earlier, later arrival) in the same group where ``E2E_earlier > 2·E2E_later``
    (:func:`priority_inversions_per_request`, summed)."""
    return int(np.sum(priority_inversions_per_request(arrival_us, e2e_us, group)))
