"""Per-request result rows and atomic JSON output."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from blisjax.atomicio import write_text_atomic
from blisjax.metrics.aggregate import session_view
from blisjax.metrics.formulas import request_tpot_us
from blisjax.metrics.records import COMPLETED, NOT_RECORDED, STATUS_NAMES, RunResult
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, SLO_CLASSES, Workload

__all__ = ["per_request_rows", "write_json_atomic"]

#: µs per ms (``itl_mean_ms`` is the per-request TPOT in µs divided by this).
_US_PER_MS = 1000.0


def _recorded(value_us: int) -> int | None:
    """An int64 time field as a JSON value: None (null) for the "not recorded" sentinel."""
    return None if value_us == NOT_RECORDED else int(value_us)


def per_request_rows(result: RunResult, workload: Workload) -> list[dict[str, Any]]:
    """One dict per request, sorted by ``request_id`` (ties by row order).

    Keys: ``request_id``, ``status`` (``STATUS_NAMES``), ``instance`` (None if never routed),
    ``tenant``, ``slo_class`` (the raw class name, "" for the empty class), ``arrival_us``,
    ``input_tokens``, ``output_tokens`` (N_out requested), ``scheduling_delay_us`` (last
    admission − arrival, None if never scheduled), ``preemptions``, ``kv_reloads`` (with a CPU
    tier only: KV blocks reloaded for it), with P/D pools ``prefill_instance`` (None if not
    disaggregated; ``instance`` is then the decode instance), ``transfer_start_us`` and
    ``transfer_end_us`` of its KV transfer (None if none); then ``ttft_us`` whenever a
    TTFT was recorded (also for unfinished / timed-out requests, BLIS's TTFT population); and for
    completed requests ``e2e_us``, ``itl_mean_ms`` (per-request TPOT, ms), ``output_tokens_done``
    and ``length_capped``. All times are integer µs unless the name says ms.
    """
    n = workload.num_requests
    if int(np.asarray(result.status).shape[0]) != n:
        raise ValueError(f"result has {result.num_requests} rows, workload has {n}")
    workload = session_view(result, workload)
    tpot_us = request_tpot_us(
        result.itl_sum_us, result.itl_count, workload.output_tokens, result.length_capped
    )
    order = np.lexsort((np.arange(n), workload.request_id))
    rows: list[dict[str, Any]] = []
    for i in order.tolist():
        status = int(result.status[i])
        instance = int(result.instance[i])
        row: dict[str, Any] = {
            "request_id": int(workload.request_id[i]),
            "status": STATUS_NAMES[status],
            "instance": None if instance < 0 else instance,
            "tenant": workload.tenant_names[int(workload.tenant[i])],
            "slo_class": SLO_CLASSES[int(workload.slo_class[i])],
            "arrival_us": int(workload.arrival_us[i]),
            "input_tokens": int(workload.input_tokens[i]),
            "output_tokens": int(workload.output_tokens[i]),
            "scheduling_delay_us": _recorded(int(result.scheduling_delay_us[i])),
            "preemptions": int(result.preemptions[i]),
        }
        if workload.session[i] >= 0:  # a closed-loop session's round
            row["session_id"] = workload.session_names[int(workload.session[i])]
            row["round_index"] = int(workload.round_index[i])
            if workload.arrival_us[i] == FOLLOW_UP_ARRIVAL_US:  # never created
                row["arrival_us"] = None
        if result.kv_tier is not None:  # blocks its allocations reloaded from the CPU tier
            row["kv_reloads"] = int(result.kv_tier.request_reloads[i])
        if result.pd is not None:  # P/D: where it prefilled and when its KV moved
            pd = result.pd
            prefill = int(pd.prefill_instance[i])
            row["prefill_instance"] = None if prefill < 0 else prefill
            row["transfer_start_us"] = _recorded(int(pd.transfer_start_us[i]))
            row["transfer_end_us"] = _recorded(int(pd.transfer_end_us[i]))
        ttft = _recorded(int(result.ttft_us[i]))
        if ttft is not None:
            row["ttft_us"] = ttft
        if status == COMPLETED:
            row["e2e_us"] = int(result.e2e_us[i])
            row["itl_mean_ms"] = float(tpot_us[i]) / _US_PER_MS
            row["output_tokens_done"] = int(result.output_tokens_done[i])
            row["length_capped"] = bool(result.length_capped[i])
        rows.append(row)
    return rows


def _json_default(obj: Any) -> Any:
    """Serialise numpy scalars and arrays that slipped into a metrics dict."""
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON (indent 2, insertion order kept) so ``path`` is never half-written.

    The text goes to a temporary file in the destination directory (same filesystem), is flushed
    and fsynced, then ``os.replace``d over ``path``; on any error the temporary file is removed
    and ``path`` is untouched. NaN/inf are rejected (they are not valid JSON).
    """
    text = json.dumps(obj, indent=2, allow_nan=False, default=_json_default) + "\n"
    write_text_atomic(path, text)
