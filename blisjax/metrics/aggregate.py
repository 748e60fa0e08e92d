"""Turn a ``RunResult`` into BLIS's aggregate metrics JSON (plus blisjax extras).

The first block of keys is exactly BLIS's ``MetricsOutput`` for the cluster, in BLIS's order and
with BLIS's populations (docs/semantics.md §2.8, §6):

* TTFT statistics cover every request with a recorded TTFT (including unfinished and timed-out
  requests that produced a first token); E2E statistics cover completed requests; ITL statistics
  cover every raw ITL entry of completed requests (``itl_entries_us``, BLIS ``AllITLs``);
  the scheduling-delay p99 covers every request that was ever scheduled.
* All of these, and the two throughputs, are computed only when at least one request completed;
  otherwise they keep BLIS's zero value 0.0 (BLIS always prints every field).
* ``injected_requests`` is derived, not counted:
  completed + still_queued + still_running + dropped_unservable + timed_out.
* Times are reported in ms = µs / 1000 and ``vllm_estimated_duration_s`` = SimEndedTime / 1e6.

The extras that follow (admission/routing rejections, cache and preemption rates, latency
distributions with min/p50/max and tail blow-up, per-class and per-tenant breakdowns with TPOT
distributions, SLO attainment per class and per tenant, fairness, anomaly counters, fitness) are
blisjax additions whose formulas follow BLIS's ``RawMetrics`` (docs/semantics.md §6.4–§6.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from blisjax.limits import KV_UTIL_BUCKETS
from blisjax.metrics.cost import CostBasis, cost_basis, cost_metrics
from blisjax.metrics.formulas import (
    cache_hit_rate,
    fitness,
    fitness_components,
    hol_blocking_count,
    jain_fairness,
    kv_thrashing_rate,
    preemption_rate,
    priority_inversion_count,
    request_tpot_us,
    tail_ratio,
    throughput_per_s,
)
from blisjax.metrics.lifecycle import existing_instances, instance_summaries, lifecycle_metrics
from blisjax.metrics.percentile import mean, percentile_linear, sort_values
from blisjax.metrics.records import COMPLETED, DROPPED, REJECTED, TIMED_OUT, UNFINISHED, RunResult
from blisjax.metrics.sessions import session_metrics
from blisjax.metrics.slo import DEFAULT_CLASS_NAME, slo_attainment, tenant_slo_attainment
from blisjax.workload.sessions import realized
from blisjax.workload.types import SLO_CLASSES, Workload

__all__ = [
    "BLIS_METRIC_KEYS",
    "US_PER_MS",
    "aggregate_metrics",
    "config_metrics",
    "kv_cache_summary",
    "kv_cache_rates",
    "kv_utilization",
]

#: µs per ms: every ``*_ms`` field is a µs quantity divided by this.
US_PER_MS = 1000.0

#: BLIS's cluster ``MetricsOutput`` keys, in BLIS's JSON order.
BLIS_METRIC_KEYS: tuple[str, ...] = (
    "instance_id",
    "completed_requests",
    "still_queued",
    "still_running",
    "injected_requests",
    "total_input_tokens",
    "total_output_tokens",
    "vllm_estimated_duration_s",
    "responses_per_sec",
    "tokens_per_sec",
    "e2e_mean_ms",
    "e2e_p90_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "ttft_mean_ms",
    "ttft_p90_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_p90_ms",
    "itl_p95_ms",
    "itl_p99_ms",
    "scheduling_delay_p99_ms",
    "preemption_count",
    "dropped_unservable",
    "length_capped_requests",
    "timed_out_requests",
)

#: Schedulers for which priority inversions are meaningful (docs/semantics.md §6.5).
INVERSION_SCHEDULERS = frozenset({"priority-fcfs"})


def inversion_inputs(result: RunResult, workload: Workload
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(request rows, arrival µs, E2E µs, group code) of the completed requests, as BLIS
    counts priority inversions: grouped by (instance, SLO class)."""
    rows = np.nonzero(np.asarray(result.status) == COMPLETED)[0]
    instance = np.asarray(result.instance, dtype=np.int64)
    group = instance * len(SLO_CLASSES) + workload.slo_class.astype(np.int64)
    return (rows, workload.arrival_us[rows], np.asarray(result.e2e_us, dtype=np.int64)[rows],
            group[rows])


def session_view(result: RunResult, workload: Workload) -> Workload:
    """``workload`` as the run saw it: follow-up rounds with their arrivals and every prompt
    as assembled (``blisjax.workload.sessions.realized``); the workload itself without
    closed-loop sessions."""
    if result.sessions is None:
        return workload
    return realized(workload, result.sessions.arrival_us, result.sessions.prompt_tokens)


def _check_shapes(result: RunResult, workload: Workload) -> None:
    n = workload.num_requests
    for name in (
        "status",
        "instance",
        "ttft_us",
        "e2e_us",
        "scheduling_delay_us",
        "itl_sum_us",
        "itl_count",
        "output_tokens_done",
        "preemptions",
        "length_capped",
    ):
        length = int(np.asarray(getattr(result, name)).shape[0])
        if length != n:
            raise ValueError(f"result.{name}: length {length} differs from workload size {n}")


def _latency_block(prefix: str, values_us: np.ndarray) -> dict[str, float]:
    """``<prefix>_mean_ms`` and p90/p95/p99 in ms of a µs population (BLIS's JSON formulas)."""
    values_us = sort_values(values_us)
    return {
        f"{prefix}_mean_ms": mean(values_us, US_PER_MS),
        f"{prefix}_p90_ms": percentile_linear(values_us, 90, US_PER_MS),
        f"{prefix}_p95_ms": percentile_linear(values_us, 95, US_PER_MS),
        f"{prefix}_p99_ms": percentile_linear(values_us, 99, US_PER_MS),
    }


#: Statistics of a ``latency_summary`` entry, in order (ms; ``count`` is the population size).
SUMMARY_STATS: tuple[str, ...] = ("count", "mean", "min", "p50", "p90", "p95", "p99", "max")


def distribution_ms(values_us: np.ndarray, *, ratio: bool = True) -> dict[str, Any]:
    """``SUMMARY_STATS`` of a µs population in ms (BLIS's percentile and mean formulas; min and
    max are the 0th and 100th percentiles), and with ``ratio`` the tail blow-up
    ``p99_p50_ratio`` (``formulas.tail_ratio`` of the µs percentiles). All 0.0 (count 0, ratio
    1.0) for an empty population."""
    values_us = sort_values(values_us)
    out: dict[str, Any] = {"count": int(values_us.values.shape[0]),
                           "mean": mean(values_us, US_PER_MS)}
    for label, p in (("min", 0), ("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99),
                     ("max", 100)):
        out[label] = percentile_linear(values_us, p, US_PER_MS)
    if ratio:
        out["p99_p50_ratio"] = tail_ratio(percentile_linear(values_us, 99),
                                          percentile_linear(values_us, 50))
    return out


def _group_extras(ttft_us: np.ndarray, e2e_us: np.ndarray, tpot_us: np.ndarray
                  ) -> dict[str, float]:
    """A class's or tenant's figures beyond BLIS's: TTFT and E2E min/p50/max, its completed
    requests' TPOT distribution (mean, min, p50, p90, p99, max), and the p99/p50 ratios."""
    out: dict[str, float] = {}
    ttft_us, e2e_us, tpot_us = sort_values(ttft_us), sort_values(e2e_us), sort_values(tpot_us)
    for prefix, values in (("ttft", ttft_us), ("e2e", e2e_us)):
        out[f"{prefix}_min_ms"] = percentile_linear(values, 0, US_PER_MS)
        out[f"{prefix}_p50_ms"] = percentile_linear(values, 50, US_PER_MS)
        out[f"{prefix}_max_ms"] = percentile_linear(values, 100, US_PER_MS)
    out["tpot_mean_ms"] = mean(tpot_us, US_PER_MS)
    for label, p in (("min", 0), ("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
        out[f"tpot_{label}_ms"] = percentile_linear(tpot_us, p, US_PER_MS)
    for prefix, values in (("ttft", ttft_us), ("e2e", e2e_us), ("tpot", tpot_us)):
        out[f"{prefix}_p99_p50_ratio"] = tail_ratio(percentile_linear(values, 99),
                                                    percentile_linear(values, 50))
    return out


def kv_cache_rates(result: RunResult) -> tuple[float, float, float]:
    """(preemption rate, cache hit rate, KV thrashing rate) as BLIS's ``RawMetrics`` defines them.

    Preemption rate = Σ preemptions / completed; cache hit rate and thrashing rate = unweighted
    means over the instances that existed, with the CPU tier's terms (both 0 / absent without
    a CPU tier).
    """
    completed = int(np.sum(result.completed))
    tier = result.kv_tier
    existed = existing_instances(result)

    def own(values: np.ndarray) -> np.ndarray:
        return np.asarray(values)[existed]

    return (
        preemption_rate(int(np.sum(result.preemption_count)), completed),
        cache_hit_rate(own(result.cache_hits), own(result.cache_misses),
                       None if tier is None else own(tier.cpu_misses)),
        0.0 if tier is None else kv_thrashing_rate(own(tier.cpu_evictions),
                                                   own(tier.mirror_stores)),
    )


def kv_utilization(result: RunResult) -> dict[str, float]:
    """GPU KV-cache utilization over time, over the instances that existed (docs/semantics.md
    §6.5). With A_i = Σ(blocks in use × step duration), C_i the instance's KV blocks, T_i the
    time it was held (the run's simulated duration; with lifecycles placement to termination
    or the run's end) and busy_i its Σ step durations:

    * ``mean`` = Σ A_i / Σ C_i·T_i — the fraction of the cluster's KV capacity in use,
      averaged over the run (idle time counts as empty);
    * ``busy_mean`` = Σ A_i / Σ C_i·busy_i — the same over the time the instances stepped;
    * ``peak`` = max_i peak blocks_i / C_i;
    * ``p50``, ``p90``, ``p95``, ``p99`` (with ``kv_util_time_us``): percentiles of the
      utilization over the instances' held time, ``kv_util_percentiles``.

    Each is 0.0 where its denominator is 0."""
    existed = existing_instances(result)
    used_time = np.asarray(result.kv_block_time_us, dtype=np.int64)[existed]
    blocks = np.asarray(result.kv_total_blocks, dtype=np.int64)[existed]
    busy = np.asarray(result.busy_time_us, dtype=np.int64)[existed]
    peak = np.asarray(result.peak_kv_blocks_used, dtype=np.int64)[existed]
    if result.lifecycle is None:
        held = np.full(used_time.shape, int(result.sim_ended_us), dtype=np.int64)
    else:
        held = np.asarray(result.lifecycle.replica_us, dtype=np.int64)[existed]
    # Python ints: block·µs products stay exact
    area = sum(used_time.tolist())

    def ratio(numerator: int, denominator: int) -> float:
        return float(numerator) / float(denominator) if denominator > 0 else 0.0

    capacity = blocks.tolist()
    out = {
        "mean": ratio(area, sum(c * t for c, t in zip(capacity, held.tolist(), strict=True))),
        "busy_mean": ratio(area, sum(c * b for c, b in zip(capacity, busy.tolist(),
                                                           strict=True))),
        "peak": max((ratio(p, c) for p, c in zip(peak.tolist(), capacity, strict=True)),
                    default=0.0),
    }
    if result.kv_util_time_us is not None:
        stepped = np.asarray(result.kv_util_time_us, dtype=np.int64)[existed]
        out.update(kv_util_percentiles(stepped, np.maximum(held - busy, 0)))
    return out


#: Percentiles of ``kv_utilization`` over time.
KV_UTIL_PERCENTILES = (50, 90, 95, 99)


def kv_util_percentiles(stepped_us: np.ndarray, idle_us: np.ndarray) -> dict[str, float]:
    """Percentiles of KV utilization over the instances' held time, in whole percent rounded
    up (``rules.kv_util_bucket``): ``pX`` is the least u in {0, 0.01, …, 1} such that the
    instances spent at least X % of their held time at a utilization of at most u.

    Args:
      stepped_us: int64 [instances, 101], µs of each instance's steps by bucket
        (``RunResult.kv_util_time_us``).
      idle_us: int64 [instances], each instance's held time outside its steps (counted at 0).
    Each is 0.0 when no time was held."""
    weight = [0] * (KV_UTIL_BUCKETS + 1)
    for row in np.asarray(stepped_us, dtype=np.int64).tolist():  # Python ints: exact sums
        weight = [w + x for w, x in zip(weight, row, strict=True)]
    weight[0] += sum(np.asarray(idle_us, dtype=np.int64).tolist())
    total = sum(weight)
    out = {}
    for q in KV_UTIL_PERCENTILES:
        b, reached = 0, weight[0]  # the least bucket whose time so far is >= q % of the total
        while 100 * reached < q * total:
            b += 1
            reached += weight[b]
        out[f"p{q}"] = b / KV_UTIL_BUCKETS
    return out


def kv_cache_summary(result: RunResult) -> str:
    """BLIS's three KV-cache stdout lines, or "" when all three rates are 0 (BLIS prints nothing).

    Format: ``"Preemption Rate: %.4f\\nCache Hit Rate: %.4f\\nKV Thrashing Rate: %.4f"`` (no trailing
    newline; BLIS's "=== KV Cache Metrics ===" header line is not part of it).
    """
    pre, hit, thrash = kv_cache_rates(result)
    if pre == 0.0 and hit == 0.0 and thrash == 0.0:
        return ""
    return f"Preemption Rate: {pre:.4f}\nCache Hit Rate: {hit:.4f}\nKV Thrashing Rate: {thrash:.4f}"


def _stats_us(values_us: np.ndarray) -> dict[str, float]:
    """Mean, p50, p95 and p99 of a µs population (linear interpolation; 0.0 when empty)."""
    values_us = sort_values(values_us)
    return {"mean": mean(values_us, 1.0), "p50": percentile_linear(values_us, 50, 1.0),
            "p95": percentile_linear(values_us, 95, 1.0),
            "p99": percentile_linear(values_us, 99, 1.0)}


def pd_metrics(result: RunResult) -> dict[str, Any]:
    """BLIS's "PD Metrics" (docs/semantics.md §5.10), as ``pd_*`` keys of the metrics JSON.

    ``pd_disaggregated_requests``: transfers that completed. ``pd_dropped_at_decode_kv``:
    failed decode-side reservations (with ``--blis-quirks`` BLIS's 0; the drops are in
    ``dropped_unservable`` either way). ``pd_prefill_throughput`` / ``pd_decode_throughput``:
    requests completed per second by the instances serving prefill / decode (shared ones in
    both, whole requests on decode instances included); ``pd_load_imbalance``: the larger over
    the smaller (1.0 when both are 0, ``inf`` when one is). ``pd_parent_ttft_us``: the
    disaggregated requests' TTFTs > 0; ``pd_transfer_duration_us``: end − start of completed
    transfers (with ``--blis-quirks`` only those that started after time 0, as BLIS) — each
    as mean/p50/p95/p99 µs. With contention:
    ``pd_peak_concurrent_transfers`` and ``pd_mean_transfer_queue_depth``."""
    pd = result.pd
    seconds = float(result.sim_ended_us) / 1e6
    completed = np.asarray(result.completed, dtype=np.int64)
    role = np.asarray(pd.role)

    def throughput(bit: int) -> float:
        count = float(int(np.sum(completed[(role & bit) != 0])))
        return count / seconds if seconds > 0 else 0.0

    prefill, decode = throughput(1), throughput(2)
    if prefill == 0.0 and decode == 0.0:
        imbalance = 1.0
    elif prefill == 0.0 or decode == 0.0:
        imbalance = float("inf")
    else:
        imbalance = max(prefill, decode) / min(prefill, decode)
    parents = np.asarray(pd.prefill_instance) >= 0
    ttft = np.asarray(result.ttft_us, dtype=np.int64)[parents]
    start = np.asarray(pd.transfer_start_us, dtype=np.int64)
    end = np.asarray(pd.transfer_end_us, dtype=np.int64)
    # a completed transfer (BLIS: one that started after time 0)
    timed = (start > 0 if pd.blis_quirks else start >= 0) & (end >= start)
    out: dict[str, Any] = {
        "pd_disaggregated_requests": int(np.sum(end > 0)),
        "pd_dropped_at_decode_kv": 0 if pd.blis_quirks else int(pd.dropped_at_decode_kv),
        "pd_prefill_throughput": prefill,
        "pd_decode_throughput": decode,
        "pd_load_imbalance": imbalance,
        "pd_parent_ttft_us": _stats_us(ttft[ttft > 0]),
        "pd_transfer_duration_us": _stats_us(end[timed] - start[timed]),
    }
    if pd.transfer_starts:
        out["pd_peak_concurrent_transfers"] = int(pd.peak_transfers)
        out["pd_mean_transfer_queue_depth"] = float(pd.transfer_depth_sum) / float(
            pd.transfer_starts)
    return out


def _group_stats(
    mask: np.ndarray,
    arrived: np.ndarray,
    status: np.ndarray,
    ttft_us: np.ndarray,
    e2e_us: np.ndarray,
    itl_sum_us: np.ndarray,
    itl_count: np.ndarray,
    output_tokens_done: np.ndarray,
    tpot_us: np.ndarray,
    itl_entries_us: np.ndarray,
    itl_entry_rows: np.ndarray | None,
) -> dict[str, Any]:
    """Counts and latency summary of the requests selected by ``mask`` (a class or a tenant);
    ``tpot_us`` is every request's TPOT (``formulas.request_tpot_us``), read for its completed
    requests with at least one ITL entry; ``itl_entry_rows`` (the request of each of
    ``itl_entries_us``, None when the run lacks it) gives the group's own ITL distribution."""
    done = mask & (status == COMPLETED)
    ttft = sort_values(ttft_us[mask & (ttft_us >= 0)])
    e2e = sort_values(e2e_us[done])
    entries = int(np.sum(itl_count[done]))
    out: dict[str, Any] = {
        "injected": int(np.sum(mask & arrived)),
        "completed": int(np.sum(done)),
        "rejected": int(np.sum(mask & (status == REJECTED))),
        "timed_out": int(np.sum(mask & (status == TIMED_OUT))),
        "dropped_unservable": int(np.sum(mask & (status == DROPPED))),
        "unfinished": int(np.sum(mask & (status == UNFINISHED))),
        "output_tokens": int(np.sum(output_tokens_done[done])),
        **_latency_block("ttft", ttft),
        **_latency_block("e2e", e2e),
        # Mean over the group's raw ITL entries: Σ entries / count, the same quantity as BLIS's
        # itl_mean_ms restricted to the group (per-entry values are not kept per request).
        "itl_mean_ms": (
            float(int(np.sum(itl_sum_us[done]))) / float(entries) / US_PER_MS if entries else 0.0
        ),
        **_group_extras(ttft, e2e, tpot_us[done & (itl_count > 0)]),
    }
    if itl_entry_rows is not None:  # the group's raw ITL entries (completed requests only)
        own = sort_values(itl_entries_us[mask[itl_entry_rows]])
        for label, p in (("p50", 50), ("p90", 90), ("p99", 99)):
            out[f"itl_{label}_ms"] = percentile_linear(own, p, US_PER_MS)
        out["itl_p99_p50_ratio"] = tail_ratio(percentile_linear(own, 99),
                                              percentile_linear(own, 50))
    return out


def _config_pairs(metrics_cfg: Any, attr: str) -> tuple:
    """``metrics_cfg.<attr>`` as a tuple of pairs (accepts a mapping too); () when absent."""
    if metrics_cfg is None:
        return ()
    value = getattr(metrics_cfg, attr, None)
    if not value:
        return ()
    if isinstance(value, Mapping):
        return tuple(value.items())
    return tuple(value)


def aggregate_metrics(
    result: RunResult,
    workload: Workload,
    metrics_cfg: Any = None,
    *,
    scheduler: str | None = None,
    cost: CostBasis | None = None,
) -> dict[str, Any]:
    """Aggregate one run into BLIS's metrics dict followed by blisjax extras.

    Args:
      result: the engine's ``RunResult`` (rows indexed like ``workload``).
      workload: the workload that was run (names, classes, tenants, N_out, arrivals).
      metrics_cfg: a ``blisjax.config.MetricsConfig`` or None. Read by duck typing:
        ``slo_targets`` = ((class name, target with ``ttft_ms``/``itl_ms``/``e2e_ms``, 0 = not
        checked), ...), ``tenant_slo_targets`` = ((tenant name, target), ...) and
        ``fitness_weights`` = ((key, weight), ...).
      scheduler: the instance scheduler name; priority inversions are counted only for
        ``"priority-fcfs"`` (0 otherwise).
      cost: GPUs per instance and the price of a GPU-hour (``blisjax.metrics.cost.cost_basis``
        of the configuration): adds ``gpu_hours`` and ``cost``.

    Returns:
      A dict: ``BLIS_METRIC_KEYS`` in order, then ``rejected_requests``, ``cache_hit_rate``,
      ``preemption_rate``, [CPU tier, P/D keys], ``kv_peak_blocks``, ``latency_summary``,
      ``per_slo_class``, ``per_tenant``, [``slo_attainment``], [``tenant_slo_attainment``],
      ``jain_fairness``, ``hol_blocking_instances``, ``priority_inversions``, [``fitness``,
      ``fitness_components``], ``rejected_routing``, [cost], ``instances``, [``autoscaling``],
      [``overflow``]. Bracketed keys appear only when the feature is in the run / SLO targets
      (per class, per tenant) / fitness weights are configured / the engine overflowed.
    """
    _check_shapes(result, workload)
    workload = session_view(result, workload)
    status = np.asarray(result.status)
    ttft_us = np.asarray(result.ttft_us, dtype=np.int64)
    e2e_us = np.asarray(result.e2e_us, dtype=np.int64)
    sched_us = np.asarray(result.scheduling_delay_us, dtype=np.int64)
    itl_sum_us = np.asarray(result.itl_sum_us, dtype=np.int64)
    itl_count = np.asarray(result.itl_count, dtype=np.int64)
    tokens_done = np.asarray(result.output_tokens_done, dtype=np.int64)
    length_capped = np.asarray(result.length_capped, dtype=bool)
    is_completed = status == COMPLETED
    # Only arrivals at or before the horizon reach the cluster (past-horizon events never run).
    arrived = workload.arrival_us <= int(result.horizon_us)

    completed = int(np.sum(result.completed))
    still_queued = int(np.sum(result.still_queued))
    still_running = int(np.sum(result.still_running))
    dropped = int(np.sum(result.dropped_unservable))
    timed_out = int(np.sum(result.timed_out))
    pd = result.pd
    if pd is not None:  # the instances count sub-requests: BLIS's cluster view of them
        completed -= pd.prefill_completed
        dropped += pd.dropped_at_decode_kv
        still_running += pd.in_transfer
    total_output_tokens = int(np.sum(tokens_done[is_completed]))
    sim_ended_us = int(result.sim_ended_us)

    ttft_population = ttft_us[ttft_us >= 0]
    e2e_population = e2e_us[is_completed]
    sched_population = sched_us[sched_us >= 0]
    itl_entries = np.asarray(result.itl_entries_us, dtype=np.int64)

    out: dict[str, Any] = {
        "instance_id": "cluster",
        "completed_requests": completed,
        "still_queued": still_queued,
        "still_running": still_running,
        "injected_requests": completed + still_queued + still_running + dropped + timed_out,
        "total_input_tokens": int(np.sum(result.total_input_tokens)),
        "total_output_tokens": total_output_tokens,
        "vllm_estimated_duration_s": float(sim_ended_us) / 1e6,
        "responses_per_sec": throughput_per_s(completed, sim_ended_us, completed),
        "tokens_per_sec": throughput_per_s(total_output_tokens, sim_ended_us, completed),
    }
    if completed > 0:
        out.update(_latency_block("e2e", e2e_population))
        out.update(_latency_block("ttft", ttft_population))
        out.update(_latency_block("itl", itl_entries))
        out["scheduling_delay_p99_ms"] = percentile_linear(sched_population, 99, US_PER_MS)
    else:
        for key in BLIS_METRIC_KEYS[10:23]:
            out[key] = 0.0
    alloc_failures = int(np.sum(result.kv_allocation_failures))
    if alloc_failures:  # BLIS prints the key only when it is not 0
        out["kv_allocation_failures"] = alloc_failures
    out["preemption_count"] = int(np.sum(result.preemption_count))
    out["dropped_unservable"] = dropped
    out["length_capped_requests"] = int(np.sum(result.length_capped_count))
    out["timed_out_requests"] = timed_out
    # key order is part of the output format
    assert tuple(k for k in out if k != "kv_allocation_failures") == BLIS_METRIC_KEYS

    # ---- blisjax extras -------------------------------------------------------------------
    pre_rate, hit_rate, thrash_rate = kv_cache_rates(result)
    out["rejected_requests"] = int(result.rejected_admission)
    out["cache_hit_rate"] = hit_rate
    out["preemption_rate"] = pre_rate
    tier = result.kv_tier
    if tier is not None:  # the CPU tier's own counts (docs/semantics.md §3.8)
        out["kv_thrashing_rate"] = thrash_rate
        reloads = int(np.sum(tier.reloads))
        out["kv_reloads"] = reloads
        out["kv_mirror_stores"] = int(np.sum(tier.mirror_stores))
        out["kv_cpu_evictions"] = int(np.sum(tier.cpu_evictions))
        lookups = reloads + int(np.sum(tier.cpu_misses))
        out["kv_cpu_hit_rate"] = float(reloads) / float(lookups) if lookups else 0.0
        out["kv_thrash_reloads"] = int(np.sum(tier.thrash_reloads))
    if pd is not None:
        out.update(pd_metrics(result))
    peak = np.asarray(result.peak_kv_blocks_used, dtype=np.int64)
    out["kv_peak_blocks"] = int(peak.max()) if peak.size else 0
    if result.kv_block_time_us is not None:
        out["kv_utilization"] = kv_utilization(result)

    # TPOT (a request's mean ITL, BLIS's RequestITLs) of the completed requests with ITL entries
    tpot_us = request_tpot_us(itl_sum_us, itl_count, workload.output_tokens, length_capped)
    has_itl = is_completed & (itl_count > 0)
    out["latency_summary"] = {
        "ttft_ms": distribution_ms(ttft_population),
        "e2e_ms": distribution_ms(e2e_population),
        "itl_ms": distribution_ms(itl_entries),
        "tpot_ms": distribution_ms(tpot_us[has_itl]),
        "scheduling_delay_ms": distribution_ms(sched_population, ratio=False),
    }

    entry_rows = (None if result.itl_entry_request is None
                  else np.asarray(result.itl_entry_request, dtype=np.int64))
    group_args = (arrived, status, ttft_us, e2e_us, itl_sum_us, itl_count, tokens_done, tpot_us,
                  itl_entries, entry_rows)
    per_class: dict[str, dict] = {}
    class_names = {
        (DEFAULT_CLASS_NAME if code == 0 else SLO_CLASSES[code]): code
        for code in np.unique(workload.slo_class).tolist()
    }
    for name in sorted(class_names):
        per_class[name] = _group_stats(workload.slo_class == class_names[name], *group_args)
    out["per_slo_class"] = per_class

    per_tenant: dict[str, dict] = {}
    tenant_codes = {workload.tenant_names[c]: c for c in np.unique(workload.tenant).tolist()}
    for name in sorted(tenant_codes):
        per_tenant[name] = _group_stats(workload.tenant == tenant_codes[name], *group_args)
    out["per_tenant"] = per_tenant

    slo_targets = _config_pairs(metrics_cfg, "slo_targets")
    tenant_targets = _config_pairs(metrics_cfg, "tenant_slo_targets")
    if slo_targets or tenant_targets:
        zero = np.zeros(workload.num_requests, dtype=np.float64)
        measured = (np.where(is_completed, ttft_us / US_PER_MS, zero),
                    np.where(is_completed, tpot_us / US_PER_MS, zero),
                    np.where(is_completed, e2e_us / US_PER_MS, zero))
    if slo_targets:
        out["slo_attainment"] = slo_attainment(
            slo_targets, workload.slo_class, arrived, is_completed, *measured)
    if tenant_targets:
        out["tenant_slo_attainment"] = tenant_slo_attainment(
            tenant_targets, workload.tenant, workload.tenant_names, arrived, is_completed,
            *measured)

    # Tenants with arrivals but nothing completed count as 0 tokens (a starved tenant is unfair).
    out["jain_fairness"] = jain_fairness(
        stats["output_tokens"] for stats in per_tenant.values() if stats["injected"]
    )
    existed = existing_instances(result)
    out["hol_blocking_instances"] = hol_blocking_count(
        np.asarray(result.queue_depth_time_us)[existed], np.asarray(result.busy_time_us)[existed]
    )
    out["priority_inversions"] = (priority_inversion_count(*inversion_inputs(result, workload)[1:])
                                  if scheduler in INVERSION_SCHEDULERS else 0)

    weight_pairs = _config_pairs(metrics_cfg, "fitness_weights")
    weights = {str(k): float(w) for k, w in weight_pairs}
    if len(weights) != len(weight_pairs):
        raise ValueError(f"fitness_weights: duplicate key in {weight_pairs}")
    if weights:
        comps = fitness_components(
            weights,
            out["responses_per_sec"],
            out["tokens_per_sec"],
            ttft_population,
            e2e_population,
        )
        out["fitness"] = fitness(weights, comps)
        out["fitness_components"] = comps

    out["rejected_routing"] = int(result.rejected_routing)
    if result.gateway is not None:
        out["gateway"] = gateway_metrics(result.gateway)
    if cost is not None:
        out.update(cost_metrics(result, cost))
    out["instances"] = instance_summaries(result)
    if result.sessions is not None:
        out["sessions"] = session_metrics(result, workload)
    if result.lifecycle is not None:
        out["autoscaling"] = lifecycle_metrics(result)
    if result.overflow:
        out["overflow"] = dict(result.overflow)
    return out


def config_metrics(result: RunResult, workload: Workload, config: Any) -> dict[str, Any]:
    """``aggregate_metrics`` of a run of ``config`` (a ``SimConfig``) as the configuration
    asks for them: its ``metrics`` settings, its scheduler (priority inversions) and its cost
    basis (``cost_basis``) — what ``blisjax run``, populations and searches report."""
    return aggregate_metrics(result, workload, config.metrics,
                             scheduler=config.policy.scheduler.policy, cost=cost_basis(config))


def gateway_metrics(gw) -> dict:
    """The gateway queue's metrics (``RunResult.gateway``, docs/configuration.md): BLIS's
    ``Gateway Queue Rejected`` and ``Gateway Queue Depth (horizon)``, the requests dispatched
    to routing and their mean wait at the gateway (enqueue to dispatch), ms."""
    return {
        "rejected": int(gw.rejected),
        "queue_depth": int(gw.queue_depth),
        "dispatched": int(gw.dispatched),
        "mean_wait_ms": float(gw.wait_sum_us) / float(gw.dispatched) / 1000.0
        if gw.dispatched else 0.0,
    }
