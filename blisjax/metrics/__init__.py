"""Metrics: BLIS's aggregate JSON, per-request rows, SLO attainment, fairness, fitness.

Engines return a ``RunResult`` (``blisjax.metrics.records``); everything here is a pure function of
it and the ``Workload``.
"""

from blisjax.metrics.aggregate import (
    BLIS_METRIC_KEYS,
    aggregate_metrics,
    config_metrics,
    kv_cache_rates,
    kv_cache_summary,
)
from blisjax.metrics.cost import CostBasis, cost_basis, cost_metrics
from blisjax.metrics.lifecycle import lifecycle_metrics, replica_timeline, timeline_csv
from blisjax.metrics.per_request import per_request_rows, write_json_atomic
from blisjax.metrics.percentile import mean, percentile_linear
from blisjax.metrics.records import RunResult

__all__ = [
    "BLIS_METRIC_KEYS",
    "CostBasis",
    "cost_basis",
    "cost_metrics",
    "RunResult",
    "aggregate_metrics",
    "config_metrics",
    "kv_cache_rates",
    "kv_cache_summary",
    "lifecycle_metrics",
    "replica_timeline",
    "timeline_csv",
    "mean",
    "per_request_rows",
    "percentile_linear",
    "write_json_atomic",
]
