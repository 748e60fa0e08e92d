"""aggregate_metrics on hand-built RunResults: populations, counters, extras."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from blisjax.metrics.aggregate import BLIS_METRIC_KEYS, aggregate_metrics, kv_cache_summary
from blisjax.metrics.records import COMPLETED, DROPPED, REJECTED, TIMED_OUT, UNFINISHED
from blisjax.workload.types import SLO_CLASS_CODE


def _cfg(slo_targets=(), fitness_weights=()):
    return SimpleNamespace(slo_targets=tuple(slo_targets), fitness_weights=tuple(fitness_weights))


def _target(ttft_ms=0.0, itl_ms=0.0, e2e_ms=0.0):
    return SimpleNamespace(ttft_ms=ttft_ms, itl_ms=itl_ms, e2e_ms=e2e_ms)


def test_blis_keys_come_first_in_blis_order(make_workload, make_result):
    m = aggregate_metrics(make_result(2), make_workload(2))
    assert tuple(m)[: len(BLIS_METRIC_KEYS)] == BLIS_METRIC_KEYS
    assert m["instance_id"] == "cluster"
    extras = tuple(m)[len(BLIS_METRIC_KEYS) :]
    assert extras[:4] == (
        "rejected_requests",
        "cache_hit_rate",
        "preemption_rate",
        "kv_peak_blocks",
    )
    assert "fitness" not in m and "slo_attainment" not in m


def test_blis_populations(make_workload, make_result):
    # completed / timed-out with TTFT / unfinished with TTFT / unfinished without / dropped
    status = [COMPLETED, TIMED_OUT, UNFINISHED, UNFINISHED, DROPPED]
    result = make_result(
        5,
        status=status,
        ttft_us=[100, 300, 500, -1, -1],
        e2e_us=[1000, -1, -1, -1, -1],
        scheduling_delay_us=[10, 30, 50, -1, -1],
        still_running=[2],
        itl_entries_us=[10, 20, 30, 40],
        itl_sum_us=[100, 0, 0, 0, 0],
        itl_count=[4, 0, 0, 0, 0],
    )
    m = aggregate_metrics(result, make_workload(5))
    assert m["ttft_mean_ms"] == pytest.approx((100 + 300 + 500) / 3 / 1000, rel=1e-15)
    assert m["ttft_p99_ms"] == pytest.approx((300 + 200 * 0.98) / 1000, rel=1e-12)
    assert m["e2e_mean_ms"] == 1.0 and m["e2e_p99_ms"] == 1.0  # completed only
    assert m["itl_mean_ms"] == 0.025  # raw entries, not per-request means
    assert m["itl_p90_ms"] == pytest.approx(0.037, rel=1e-12)  # rank 2.7 over 10..40
    # every scheduled request, including the timed-out and unfinished ones
    assert m["scheduling_delay_p99_ms"] == pytest.approx((30 + 20 * 0.98) / 1000, rel=1e-12)
    assert m["completed_requests"] == 1
    assert m["timed_out_requests"] == 1
    assert m["dropped_unservable"] == 1


def test_no_completed_requests_gives_blis_zero_latency_fields(make_workload, make_result):
    result = make_result(2, status=[TIMED_OUT, UNFINISHED], ttft_us=[500, 700], still_queued=[1])
    m = aggregate_metrics(result, make_workload(2))
    for key in BLIS_METRIC_KEYS[8:23]:
        assert m[key] == 0.0, key  # BLIS prints every field; stats only when completed > 0
    assert m["completed_requests"] == 0


def test_injected_is_derived_from_counters(make_workload, make_result):
    status = [COMPLETED, COMPLETED, UNFINISHED, UNFINISHED, DROPPED, TIMED_OUT, REJECTED]
    result = make_result(
        7,
        num_instances=2,
        status=status,
        instance=[0, 1, 0, 1, 1, 0, -1],
        still_queued=[1, 0],
        still_running=[0, 1],
        rejected_admission=1,
    )
    m = aggregate_metrics(result, make_workload(7))
    assert m["injected_requests"] == 2 + 1 + 1 + 1 + 1  # rejections are not injected
    assert m["still_queued"] == 1 and m["still_running"] == 1
    assert m["rejected_requests"] == 1 and "routing_rejections" not in m


def test_throughput_and_duration(make_workload, make_result):
    result = make_result(
        4, sim_ended_us=2_000_000, output_tokens_done=[10, 20, 30, 40], total_input_tokens=[123]
    )
    m = aggregate_metrics(result, make_workload(4))
    assert m["vllm_estimated_duration_s"] == 2.0
    assert m["responses_per_sec"] == 2.0
    assert m["total_output_tokens"] == 100
    assert m["tokens_per_sec"] == 50.0
    assert m["total_input_tokens"] == 123


def test_counters_are_summed_over_instances(make_workload, make_result):
    result = make_result(
        2,
        num_instances=2,
        instance=[0, 1],
        preemption_count=[2, 3],
        length_capped_count=[1, 0],
        peak_kv_blocks_used=[7, 11],
    )
    m = aggregate_metrics(result, make_workload(2))
    assert m["preemption_count"] == 5
    assert m["length_capped_requests"] == 1
    assert m["preemption_rate"] == 2.5
    assert m["kv_peak_blocks"] == 11


def test_cache_hit_rate_is_unweighted_mean_over_instances(make_workload, make_result):
    result = make_result(
        1, num_instances=3, cache_hits=[1, 9, 0], cache_misses=[1, 1, 0], instance=[0]
    )
    m = aggregate_metrics(result, make_workload(1))
    assert m["cache_hit_rate"] == pytest.approx((0.5 + 0.9 + 0.0) / 3, rel=1e-15)


def test_kv_cache_summary(make_result):
    assert kv_cache_summary(make_result(2)) == ""  # BLIS prints nothing when all rates are 0
    result = make_result(4, cache_hits=[3], cache_misses=[1], preemption_count=[1])
    assert kv_cache_summary(result) == (
        "Preemption Rate: 0.2500\nCache Hit Rate: 0.7500\nKV Thrashing Rate: 0.0000"
    )


def test_per_class_and_per_tenant(make_workload, make_result):
    workload = make_workload(
        4,
        slo_class=[0, 0, SLO_CLASS_CODE["critical"], SLO_CLASS_CODE["critical"]],
        tenant=[0, 1, 1, 1],
        tenant_names=("alice", "bob"),
    )
    result = make_result(
        4,
        status=[COMPLETED, COMPLETED, COMPLETED, TIMED_OUT],
        ttft_us=[100, 200, 300, 900],
        e2e_us=[1000, 2000, 3000, -1],
        output_tokens_done=[5, 6, 7, 0],
        itl_sum_us=[40, 0, 60, 0],
        itl_count=[4, 0, 2, 0],
    )
    m = aggregate_metrics(result, workload)
    assert list(m["per_slo_class"]) == ["critical", "default"]
    crit = m["per_slo_class"]["critical"]
    assert crit["injected"] == 2 and crit["completed"] == 1 and crit["timed_out"] == 1
    assert crit["ttft_mean_ms"] == 0.6  # TTFT population includes the timed-out request
    assert crit["e2e_mean_ms"] == 3.0
    assert crit["itl_mean_ms"] == 0.03
    assert m["per_slo_class"]["default"]["e2e_p99_ms"] == pytest.approx(1.99, rel=1e-12)
    assert list(m["per_tenant"]) == ["alice", "bob"]
    assert m["per_tenant"]["alice"]["output_tokens"] == 5
    assert m["per_tenant"]["bob"]["output_tokens"] == 13
    assert m["per_tenant"]["bob"]["completed"] == 2


def test_jain_fairness(make_workload, make_result):
    names = ("a", "b", "c")
    equal = aggregate_metrics(
        make_result(3, output_tokens_done=[4, 4, 4]),
        make_workload(3, tenant=[0, 1, 2], tenant_names=names),
    )
    assert equal["jain_fairness"] == 1.0
    skew = aggregate_metrics(
        make_result(3, output_tokens_done=[1, 2, 3]),
        make_workload(3, tenant=[0, 1, 2], tenant_names=names),
    )
    assert skew["jain_fairness"] == pytest.approx(36 / (3 * 14), rel=1e-15)
    # a starved tenant (arrived, nothing completed) counts as 0 tokens
    starved = aggregate_metrics(
        make_result(2, status=[COMPLETED, UNFINISHED], output_tokens_done=[8, 0]),
        make_workload(2, tenant=[0, 1], tenant_names=("a", "b")),
    )
    assert starved["jain_fairness"] == 0.5


def test_slo_attainment(make_workload, make_result):
    crit = SLO_CLASS_CODE["critical"]
    workload = make_workload(
        6, slo_class=[crit, crit, crit, crit, 0, 0], output_tokens=[3, 3, 3, 3, 1, 1]
    )
    result = make_result(
        6,
        status=[COMPLETED, COMPLETED, COMPLETED, DROPPED, COMPLETED, REJECTED],
        ttft_us=[5000, 20000, 5000, -1, 1, -1],
        e2e_us=[9000, 30000, 9000, -1, 50000, -1],
        # TPOT = itl_sum / (N_out - 1) = 2000 / 2 = 1 ms, 3 ms
        itl_sum_us=[2000, 2000, 6000, 0, 0, 0],
        itl_count=[2, 2, 2, 0, 0, 0],
    )
    cfg = _cfg(
        slo_targets=[
            ("critical", _target(ttft_ms=10.0, itl_ms=2.0)),
            ("default", _target(e2e_ms=10.0)),
        ]
    )
    s = aggregate_metrics(result, workload, cfg)["slo_attainment"]
    c = s["per_class"]["critical"]
    # good: only request 0 (request 1 misses TTFT, request 2 misses ITL); the drop counts
    assert (c["good"], c["injected"], c["completed"]) == (1, 4, 3)
    assert c["attainment"] == 0.25
    assert c["ttft_attainment"] == pytest.approx(2 / 3)
    assert c["itl_attainment"] == pytest.approx(2 / 3)
    assert "e2e_attainment" not in c  # 0 = unchecked
    d = s["per_class"]["default"]
    assert (d["good"], d["injected"], d["attainment"]) == (0, 2, 0.0)
    assert s["overall"] == pytest.approx(1 / 6)


def test_slo_attainment_rejects_unknown_class(make_workload, make_result):
    with pytest.raises(ValueError, match="unknown SLO class"):
        aggregate_metrics(
            make_result(1), make_workload(1), _cfg(slo_targets=[("gold", _target(ttft_ms=1))])
        )


def test_fitness_normalisations(make_workload, make_result):
    result = make_result(
        2,
        status=[COMPLETED, UNFINISHED],
        ttft_us=[50_000, 50_000],
        e2e_us=[1_000, -1],
        sim_ended_us=1_000_000,
        output_tokens_done=[10_000, 0],
    )
    weights = [("throughput", 2.0), ("p99_ttft", 1.0), ("mean_e2e", 0.5), ("tokens_per_sec", 1.0)]
    m = aggregate_metrics(result, make_workload(2), _cfg(fitness_weights=weights))
    comps = m["fitness_components"]
    assert list(comps) == sorted(comps)
    assert comps["p99_ttft"] == 1 / 51  # 50,000 µs = 50 ms → 1/(1+50)
    assert comps["throughput"] == 1 / 101  # 1 req/s
    assert comps["tokens_per_sec"] == 0.5  # 10,000 tok/s
    assert comps["mean_e2e"] == 0.5  # 1 ms
    expected = 0.5 * 0.5 + 1 / 51 + 2 * (1 / 101) + 0.5  # sorted key order
    assert m["fitness"] == pytest.approx(expected, rel=1e-15)


def test_fitness_rejects_unknown_key(make_workload, make_result):
    with pytest.raises(ValueError, match="unknown fitness metric"):
        aggregate_metrics(make_result(1), make_workload(1), _cfg(fitness_weights=[("p42", 1.0)]))


def test_hol_blocking(make_workload, make_result):
    def hol(depth_time, busy):
        n = len(busy)
        result = make_result(
            1, num_instances=n, queue_depth_time_us=depth_time, busy_time_us=busy, instance=[0]
        )
        return aggregate_metrics(result, make_workload(1))["hol_blocking_instances"]

    assert hol([100, 10, 10], [10, 10, 10]) == 1  # depths 10, 1, 1; mean 4; 10 > 8
    assert hol([100, 100], [10, 10]) == 0
    assert hol([100, 0, 0, 0], [10, 0, 5, 5]) == 1  # idle instances stay in the mean
    assert hol([100], [10]) == 0  # needs two instances
    assert hol([0, 0], [10, 10]) == 0


def test_priority_inversions_only_with_priority_fcfs(make_workload, make_result):
    crit = SLO_CLASS_CODE["critical"]
    workload = make_workload(4, arrival_us=[0, 1, 2, 3], slo_class=[0, 0, 0, crit])
    result = make_result(4, e2e_us=[5000, 2000, 2500, 100])
    # class "": (5000 vs 2000) and (5000 vs 2500 is not > 2×) → 1; class critical alone → 0
    inversions = aggregate_metrics(result, workload, scheduler="priority-fcfs")[
        "priority_inversions"
    ]
    assert inversions == 1
    assert aggregate_metrics(result, workload, scheduler="fcfs")["priority_inversions"] == 0
    assert aggregate_metrics(result, workload)["priority_inversions"] == 0
    # different instances are never compared
    split = make_result(4, num_instances=2, instance=[0, 1, 0, 0], e2e_us=[5000, 2000, 2500, 100])
    assert aggregate_metrics(split, workload, scheduler="priority-fcfs")["priority_inversions"] == 0


def test_overflow_is_reported(make_workload, make_result):
    m = aggregate_metrics(make_result(1, overflow={"queue": 3}), make_workload(1))
    assert m["overflow"] == {"queue": 3}
    assert "overflow" not in aggregate_metrics(make_result(1), make_workload(1))


def test_shape_mismatch_is_an_error(make_workload, make_result):
    with pytest.raises(ValueError, match="differs from workload size"):
        aggregate_metrics(make_result(2), make_workload(3))


def test_values_are_plain_python_types(make_workload, make_result):
    m = aggregate_metrics(make_result(3), make_workload(3))

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        else:
            assert type(v) in (int, float, str, bool), (v, type(v))

    walk(m)
    assert not any(isinstance(v, np.generic) for v in m.values())
