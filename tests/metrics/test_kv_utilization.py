"""KV utilization over time (``kv_utilization``): the engines' Σ(blocks in use × step duration)
and their step time by utilization percent on a run worked out by hand, in both engines, and
the summary's formulas."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.metrics.aggregate import aggregate_metrics, kv_util_percentiles, kv_utilization
from blisjax.metrics.records import LifecycleCounters
from tests.reference.conftest import make_resolved, make_workload

# One instance, 10 KV blocks of 16 tokens, step = 1000 + 10·prefill + 100·decode tokens µs.
# Request 0 (t = 0, 32 prompt tokens, 40 output tokens): a prefill step of 1000 + 320 = 1320 µs
# holding its 2 prompt blocks, then 39 decode steps of 1100 µs for the tokens at positions
# 32 .. 70: 16 of them in 3 blocks (32 .. 47), 16 in 4 (48 .. 63), 7 in 5 (64 .. 70).
# Request 1 (t = 100,000, 16 prompt tokens, 1 output token): one 1160 µs step in 1 block.
ROWS = [dict(arrival=0, input=32, output=40), dict(arrival=100_000, input=16, output=1)]
KV_BLOCKS = 10
BLOCK_TIME = 2 * 1320 + 1100 * (16 * 3 + 16 * 4 + 7 * 5) + 1 * 1160  # 165,500 block·µs
BUSY = 1320 + 39 * 1100 + 1160  # 45,380 µs
END = 100_000 + 1160  # the run ends when request 1 leaves
# Step µs by blocks in use, as a percent of the 10 blocks: request 1's step at 10 %, the
# prefill at 20 %, the decode steps at 30, 40 and 50 %; the 55,780 idle µs count at 0 %.
STEP_TIME_BY_PERCENT = {10: 1160, 20: 1320, 30: 16 * 1100, 40: 16 * 1100, 50: 7 * 1100}
# cumulative share of the 101,160 µs: 0 % 55.1 %, 10 % 56.3 %, 20 % 57.6 %, 30 % 75.0 %,
# 40 % 92.4 %, 50 % 100 %
PERCENTILES = {"p50": 0.0, "p90": 0.4, "p95": 0.5, "p99": 0.5}


def _check(result) -> None:
    assert result.kv_block_time_us.tolist() == [BLOCK_TIME]
    assert result.kv_total_blocks.tolist() == [KV_BLOCKS]
    assert result.busy_time_us.tolist() == [BUSY] and result.sim_ended_us == END
    by_percent = result.kv_util_time_us
    assert by_percent.shape == (1, 101)
    assert {k: int(x) for k, x in enumerate(by_percent[0]) if x} == STEP_TIME_BY_PERCENT
    util = aggregate_metrics(result, make_workload(ROWS))["kv_utilization"]
    assert util == {"mean": 165_500 / (10 * 101_160), "busy_mean": 165_500 / (10 * 45_380),
                    "peak": 0.5, **PERCENTILES}


def test_reference_engine_accumulates_block_time():
    from blisjax.reference import simulate

    _check(simulate(make_resolved(kv_blocks=KV_BLOCKS), make_workload(ROWS)))


def test_jax_engine_accumulates_block_time_inside_decode_stretches():
    from blisjax.engine import simulate

    # the 39 decode steps run as stretches whose passes take fresh blocks part-way
    _check(simulate(make_resolved(kv_blocks=KV_BLOCKS), make_workload(ROWS)))


def _result(make_result, **fields):
    base = make_result(1, num_instances=3, instance=[0], sim_ended_us=1000,
                       busy_time_us=[500, 1000, 0], peak_kv_blocks_used=[10, 2, 0])
    return dataclasses.replace(base, **fields)


def test_utilization_formulas(make_workload, make_result):
    result = _result(make_result, kv_block_time_us=np.array([4000, 1000, 0]),
                     kv_total_blocks=np.array([10, 20, 10]))
    util = aggregate_metrics(result, make_workload(1))["kv_utilization"]
    # capacity·time: 10·1000 + 20·1000 + 10·1000 = 40,000; capacity·busy: 5000 + 20,000 + 0
    assert util == {"mean": 5000 / 40_000, "busy_mean": 5000 / 25_000, "peak": 1.0}
    # with lifecycles: each slot's held time, and only the slots that held an instance
    life = LifecycleCounters(
        final_state=np.zeros(3, np.int8), placements=np.array([1, 1, 0], np.int32),
        replica_us=np.array([800, 200, 0]), cost=np.zeros(3), dropped_at_drain=np.zeros(3),
        end_us=1000, scale_ups=0, scale_downs=0, instances_added=0, instances_drained=0,
        oscillations=0, refused_no_room=0, redirected=0, timeline_us=np.zeros(0, np.int64),
        timeline_slot=np.zeros(0, np.int32), timeline_state=np.zeros(0, np.int8))
    held = kv_utilization(dataclasses.replace(result, lifecycle=life))
    assert held == {"mean": 5000 / (10 * 800 + 20 * 200), "busy_mean": 5000 / 25_000,
                    "peak": 1.0}


def test_utilization_of_an_idle_cluster_and_of_a_result_without_the_counters(
        make_workload, make_result):
    idle = _result(make_result, kv_block_time_us=np.zeros(3, np.int64),
                   kv_total_blocks=np.full(3, 10), busy_time_us=np.zeros(3, np.int64),
                   peak_kv_blocks_used=np.zeros(3, np.int64), sim_ended_us=0)
    assert kv_utilization(idle) == {"mean": 0.0, "busy_mean": 0.0, "peak": 0.0}
    assert "kv_utilization" not in aggregate_metrics(make_result(1), make_workload(1))


def test_utilization_matches_the_metrics_schema():
    from blisjax.reference import simulate
    from tests.metrics.test_output_schema import _validate

    metrics = aggregate_metrics(simulate(make_resolved(kv_blocks=KV_BLOCKS), make_workload(ROWS)),
                                make_workload(ROWS))
    _validate(metrics, "metrics")
    metrics["kv_utilization"]["p95"] = 1.5
    with pytest.raises(Exception, match="maximum"):
        _validate(metrics, "metrics")
    metrics["kv_utilization"]["p95"] = 0.5
    metrics["kv_utilization"]["p97"] = 0.5
    with pytest.raises(Exception, match="p97"):
        _validate(metrics, "metrics")


def test_utilization_bucket_is_the_whole_percent_rounded_up():
    from blisjax.rules import kv_util_bucket

    assert [kv_util_bucket(u, t) for u, t in ((0, 10), (1, 10), (1, 3), (2, 3), (3, 3),
                                               (1, 1000), (999, 1000))] \
        == [0, 10, 34, 67, 100, 1, 100]


def test_utilization_percentiles_over_instances_and_idle_time():
    # instance 0: 300 µs at 100 %, 200 µs at 50 %, 500 µs idle; instance 1: 1000 µs at 20 %.
    # Of 2000 µs: 0 % 500 (25 %), 20 % 1000 (75 %), 50 % 200 (85 %), 100 % 300 (100 %).
    stepped = np.zeros((2, 101), np.int64)
    stepped[0, 100], stepped[0, 50], stepped[1, 20] = 300, 200, 1000
    assert kv_util_percentiles(stepped, np.array([500, 0])) \
        == {"p50": 0.2, "p90": 1.0, "p95": 1.0, "p99": 1.0}
    # a share reached exactly counts: 1800 of 2000 µs (90 %) at 50 % or less
    stepped[0, 100], stepped[0, 50] = 200, 300
    assert kv_util_percentiles(stepped, np.array([500, 0]))["p90"] == 0.5
    assert kv_util_percentiles(np.zeros((0, 101), np.int64), np.zeros(0, np.int64)) \
        == {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0}
