"""Builders for hand-made ``Workload`` / ``RunResult`` objects used by the metrics tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from blisjax.metrics.records import (
    COMPLETED,
    DROPPED,
    NOT_RECORDED,
    TIMED_OUT,
    RunResult,
)
from blisjax.workload.types import NO_PREFIX_GROUP, Workload


def build_workload(
    n: int,
    *,
    arrival_us: Sequence[int] | None = None,
    input_tokens: Sequence[int] | None = None,
    output_tokens: Sequence[int] | None = None,
    tenant: Sequence[int] | None = None,
    tenant_names: tuple[str, ...] = ("",),
    slo_class: Sequence[int] | None = None,
    request_id: Sequence[int] | None = None,
) -> Workload:
    """A workload of ``n`` requests; unspecified columns get simple defaults."""

    def col(values, default):
        return np.asarray(values if values is not None else [default] * n, dtype=np.int64)

    return Workload(
        request_id=col(request_id, 0) if request_id is not None else np.arange(n),
        arrival_us=col(arrival_us, 0),
        input_tokens=col(input_tokens, 100),
        output_tokens=col(output_tokens, 10),
        prefix_group=np.full(n, NO_PREFIX_GROUP),
        prefix_length=np.zeros(n),
        tenant=col(tenant, 0),
        client=np.zeros(n),
        slo_class=col(slo_class, 0),
        deadline_us=np.zeros(n),
        tenant_names=tenant_names,
    )


def build_result(n: int, num_instances: int = 1, **overrides) -> RunResult:
    """A ``RunResult`` for ``n`` requests with consistent defaults.

    Defaults: every request completed on instance 0 with TTFT 1000 µs, E2E 2000 µs, no ITL.
    Per-instance counters ``completed``, ``timed_out`` and ``dropped_unservable`` default to the
    counts implied by ``status`` / ``instance``; everything else per instance defaults to 0.
    Any field can be overridden by keyword.
    """
    f = dict(overrides)
    status = np.asarray(f.pop("status", [COMPLETED] * n), dtype=np.int8)
    instance = np.asarray(f.pop("instance", [0] * n), dtype=np.int32)
    done = status == COMPLETED

    def per_request(name, default, dtype):
        return np.asarray(f.pop(name, [default] * n), dtype=dtype)

    def per_instance(name, default=None):
        if name in f:
            return np.asarray(f.pop(name), dtype=np.int64)
        if default is not None:
            return default
        return np.zeros(num_instances, dtype=np.int64)

    def count_by_instance(mask):
        return np.bincount(instance[mask & (instance >= 0)], minlength=num_instances).astype(
            np.int64
        )

    kwargs = dict(
        status=status,
        instance=instance,
        ttft_us=per_request("ttft_us", 1000, np.int64),
        e2e_us=np.where(done, per_request("e2e_us", 2000, np.int64), NOT_RECORDED),
        scheduling_delay_us=per_request("scheduling_delay_us", 0, np.int64),
        itl_sum_us=per_request("itl_sum_us", 0, np.int64),
        itl_count=per_request("itl_count", 0, np.int64),
        output_tokens_done=per_request("output_tokens_done", 10, np.int64),
        preemptions=per_request("preemptions", 0, np.int32),
        length_capped=per_request("length_capped", False, bool),
        itl_entries_us=np.asarray(f.pop("itl_entries_us", []), dtype=np.int64),
        sim_ended_us=int(f.pop("sim_ended_us", 1_000_000)),
        horizon_us=int(f.pop("horizon_us", 2**63 - 1)),
        num_instances=num_instances,
        cache_hits=per_instance("cache_hits"),
        cache_misses=per_instance("cache_misses"),
        preemption_count=per_instance("preemption_count"),
        still_queued=per_instance("still_queued"),
        still_running=per_instance("still_running"),
        dropped_unservable=per_instance("dropped_unservable", count_by_instance(status == DROPPED)),
        timed_out=per_instance("timed_out", count_by_instance(status == TIMED_OUT)),
        length_capped_count=per_instance("length_capped_count"),
        completed=per_instance("completed", count_by_instance(done)),
        total_input_tokens=per_instance("total_input_tokens"),
        kv_allocation_failures=per_instance("kv_allocation_failures"),
        rejected_admission=int(f.pop("rejected_admission", 0)),
        queue_depth_time_us=per_instance("queue_depth_time_us"),
        busy_time_us=per_instance("busy_time_us"),
        step_count=per_instance("step_count"),
        peak_kv_blocks_used=per_instance("peak_kv_blocks_used"),
        overflow=f.pop("overflow", {}),
    )
    if f:
        raise TypeError(f"unknown RunResult fields: {sorted(f)}")
    return RunResult(**kwargs)


@pytest.fixture
def make_workload():
    return build_workload


@pytest.fixture
def make_result():
    return build_result
