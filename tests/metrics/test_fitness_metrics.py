"""The metrics a fitness function reads beside BLIS's: latency distributions (min, p50, max,
tail blow-up), per-class TPOT distributions and per-tenant SLO attainment. Expected values are
worked out by hand from the populations each test builds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from blisjax.config import ConfigError, MetricsConfig, SimConfig
from blisjax.config.yaml_io import config_from_dict, config_to_dict
from blisjax.metrics.aggregate import BLIS_METRIC_KEYS, aggregate_metrics
from blisjax.metrics.formulas import tail_ratio
from blisjax.metrics.records import COMPLETED, DROPPED, REJECTED, TIMED_OUT, UNFINISHED
from blisjax.workload.types import SLO_CLASS_CODE


def _cfg(slo_targets=(), tenant_slo_targets=()):
    return SimpleNamespace(slo_targets=tuple(slo_targets), fitness_weights=(),
                           tenant_slo_targets=tuple(tenant_slo_targets))


def _target(ttft_ms=0.0, itl_ms=0.0, e2e_ms=0.0):
    return SimpleNamespace(ttft_ms=ttft_ms, itl_ms=itl_ms, e2e_ms=e2e_ms)


def test_tail_ratio_floors_both_terms_at_one_microsecond():
    assert tail_ratio(300.0, 150.0) == 2.0
    assert tail_ratio(0.0, 0.0) == 1.0  # an empty population: no blow-up
    assert tail_ratio(5.0, 0.0) == 5.0  # median 0 counts as 1 µs
    assert tail_ratio(0.5, 0.25) == 1.0  # both below the clock's resolution


def test_latency_summary_distributions(make_workload, make_result):
    # TTFT population: 100, 300, 500 µs (the timed-out and unfinished requests' TTFTs count);
    # E2E: the completed request's 1000 µs; ITL entries 10, 20, 30, 40 µs; scheduling delay of
    # the three scheduled requests 0, 30, 50 µs.
    result = make_result(
        5,
        status=[COMPLETED, TIMED_OUT, UNFINISHED, UNFINISHED, DROPPED],
        ttft_us=[100, 300, 500, -1, -1],
        e2e_us=[1000, -1, -1, -1, -1],
        scheduling_delay_us=[0, 30, 50, -1, -1],
        itl_entries_us=[40, 10, 30, 20],
        itl_sum_us=[100, 0, 0, 0, 0],
        itl_count=[4, 0, 0, 0, 0],
        output_tokens_done=[5, 0, 0, 0, 0],
    )
    m = aggregate_metrics(result, make_workload(5, output_tokens=[5, 5, 5, 5, 5]))
    summary = m["latency_summary"]
    assert list(summary) == ["ttft_ms", "e2e_ms", "itl_ms", "tpot_ms", "scheduling_delay_ms"]
    ttft = summary["ttft_ms"]
    assert list(ttft) == ["count", "mean", "min", "p50", "p90", "p95", "p99", "max",
                          "p99_p50_ratio"]
    assert ttft["count"] == 3
    assert (ttft["min"], ttft["p50"], ttft["max"]) == (0.1, 0.3, 0.5)
    # rank 0.98·2 = 1.98: 300 + 200·0.98 = 496 µs
    assert ttft["p99"] == pytest.approx(0.496, rel=1e-12)
    assert ttft["p99_p50_ratio"] == pytest.approx(496 / 300, rel=1e-12)
    e2e = summary["e2e_ms"]
    assert (e2e["count"], e2e["min"], e2e["p50"], e2e["max"], e2e["p99_p50_ratio"]) == (
        1, 1.0, 1.0, 1.0, 1.0)
    itl = summary["itl_ms"]
    assert (itl["count"], itl["min"], itl["max"], itl["mean"]) == (4, 0.01, 0.04, 0.025)
    assert itl["p50"] == pytest.approx(0.025, rel=1e-12)  # rank 1.5: 20 + 10·0.5
    assert itl["p99_p50_ratio"] == pytest.approx(39.7 / 25, rel=1e-12)  # 30 + 10·0.97
    # TPOT of the completed request: 100 µs / (5 − 1) = 25 µs
    tpot = summary["tpot_ms"]
    assert (tpot["count"], tpot["min"], tpot["p50"], tpot["max"]) == (1, 0.025, 0.025, 0.025)
    sched = summary["scheduling_delay_ms"]
    assert "p99_p50_ratio" not in sched
    assert (sched["count"], sched["min"], sched["p50"], sched["max"]) == (3, 0.0, 0.03, 0.05)
    # the BLIS block is untouched and agrees with the summary where both report a figure
    assert tuple(k for k in m if k in BLIS_METRIC_KEYS) == BLIS_METRIC_KEYS
    assert m["ttft_p99_ms"] == ttft["p99"] and m["itl_p90_ms"] == itl["p90"]


def test_latency_summary_of_empty_populations(make_workload, make_result):
    m = aggregate_metrics(make_result(1, status=[UNFINISHED], ttft_us=[-1],
                                      scheduling_delay_us=[-1]), make_workload(1))
    for name, stats in m["latency_summary"].items():
        assert stats["count"] == 0, name
        assert all(stats[k] == 0.0 for k in ("mean", "min", "p50", "p90", "p95", "p99", "max"))
        assert stats.get("p99_p50_ratio", 1.0) == 1.0


def test_per_class_tpot_distribution(make_workload, make_result):
    crit, std = SLO_CLASS_CODE["critical"], SLO_CLASS_CODE["standard"]
    # critical: TPOTs 20/(3−1) = 10 µs and 100/(5−1) = 25 µs; a one-token request (no ITL
    # entry) and a timed-out request stay out of the population. standard: 40/(3−1) = 20 µs,
    # and a length-capped request: 90 µs over max(3 − 1, 1) = 2 of its 3 entries = 45 µs.
    workload = make_workload(6, slo_class=[crit, crit, crit, crit, std, std],
                             output_tokens=[3, 5, 1, 3, 3, 10])
    result = make_result(
        6,
        status=[COMPLETED, COMPLETED, COMPLETED, TIMED_OUT, COMPLETED, COMPLETED],
        itl_sum_us=[20, 100, 0, 0, 40, 90],
        itl_count=[2, 4, 0, 0, 2, 3],
        length_capped=[False, False, False, False, False, True],
        ttft_us=[1000, 3000, 2000, -1, 4000, 4000],
        e2e_us=[2000, 6000, 4000, -1, 8000, 8000],
    )
    m = aggregate_metrics(result, workload)
    c = m["per_slo_class"]["critical"]
    assert c["tpot_mean_ms"] == 0.0175
    assert (c["tpot_min_ms"], c["tpot_max_ms"]) == (0.01, 0.025)
    assert c["tpot_p50_ms"] == pytest.approx(0.0175, rel=1e-12)  # rank 0.5
    assert c["tpot_p90_ms"] == pytest.approx(0.0235, rel=1e-12)  # 10 + 15·0.9
    assert c["tpot_p99_ms"] == pytest.approx(0.02485, rel=1e-12)  # 10 + 15·0.99
    assert c["tpot_p99_p50_ratio"] == pytest.approx(24.85 / 17.5, rel=1e-12)
    # TTFT 1, 2, 3 ms and E2E 2, 4, 6 ms (the timed-out request recorded none)
    assert (c["ttft_min_ms"], c["ttft_p50_ms"], c["ttft_max_ms"]) == (1.0, 2.0, 3.0)
    assert (c["e2e_min_ms"], c["e2e_p50_ms"], c["e2e_max_ms"]) == (2.0, 4.0, 6.0)
    assert c["ttft_p99_p50_ratio"] == pytest.approx(2.98 / 2.0, rel=1e-12)
    s = m["per_slo_class"]["standard"]
    assert (s["tpot_min_ms"], s["tpot_max_ms"], s["tpot_mean_ms"]) == (0.02, 0.045, 0.0325)
    assert s["e2e_p99_p50_ratio"] == 1.0
    # the per-tenant groups carry the same figures (one tenant: every request)
    t = m["per_tenant"][""]
    assert (t["tpot_min_ms"], t["tpot_max_ms"]) == (0.01, 0.045)
    assert t["tpot_mean_ms"] == pytest.approx((10 + 25 + 20 + 45) / 4 / 1000, rel=1e-12)


def test_tenant_slo_attainment(make_workload, make_result):
    # tenant a: TTFT 1 ms (good) and 3 ms (misses 2 ms), and a rejected request that counts
    # against it; tenant b: TPOT 2000/(3 − 1) = 1 ms within 1.5 ms; tenant c has no requests.
    workload = make_workload(4, tenant=[0, 0, 0, 1], tenant_names=("a", "b"),
                             output_tokens=[3, 3, 3, 3])
    result = make_result(
        4,
        status=[COMPLETED, COMPLETED, REJECTED, COMPLETED],
        ttft_us=[1000, 3000, -1, 500],
        e2e_us=[5000, 5000, -1, 5000],
        itl_sum_us=[2000, 2000, 0, 2000],
        itl_count=[2, 2, 0, 2],
    )
    targets = [("a", _target(ttft_ms=2.0)), ("b", _target(itl_ms=1.5, e2e_ms=5.0)),
               ("c", _target(ttft_ms=1.0))]
    m = aggregate_metrics(result, workload, _cfg(tenant_slo_targets=targets))
    assert "slo_attainment" not in m
    s = m["tenant_slo_attainment"]
    assert list(s["per_tenant"]) == ["a", "b", "c"]
    a = s["per_tenant"]["a"]
    assert (a["good"], a["injected"], a["completed"]) == (1, 3, 2)
    assert a["attainment"] == 1 / 3 and a["ttft_attainment"] == 0.5
    b = s["per_tenant"]["b"]
    assert (b["attainment"], b["itl_attainment"], b["e2e_attainment"]) == (1.0, 1.0, 1.0)
    assert s["per_tenant"]["c"] == {"attainment": 0.0, "good": 0, "injected": 0,
                                    "completed": 0, "ttft_attainment": 0.0}
    assert (s["good"], s["injected"], s["overall"]) == (2, 4, 0.5)
    # class targets and tenant targets are reported side by side
    both = aggregate_metrics(result, workload, _cfg(slo_targets=[("default", _target(
        ttft_ms=2.0))], tenant_slo_targets=targets))
    assert both["slo_attainment"]["overall"] == 0.5  # 1 ms and 0.5 ms of 4 arrivals
    assert both["tenant_slo_attainment"] == s


def test_tenant_slo_targets_config_errors_name_the_field():
    cfg = MetricsConfig(tenant_slo_targets={"a": {"ttft_ms": 5}, "": {"e2e_ms": 1}})
    assert cfg.tenant_slo_targets[0][1].ttft_ms == 5.0
    for bad, where in (({"a": {"ttft_ms": -1}}, r"metrics\.tenant_slo_targets\['a'\]\.ttft_ms"),
                       ({"a": {"tpot_ms": 1}}, r"metrics\.tenant_slo_targets\['a'\]\.tpot_ms"),
                       ({"a": 5}, r"metrics\.tenant_slo_targets\['a'\]"),
                       ({7: {"ttft_ms": 1}}, r"metrics\.tenant_slo_targets key"),
                       ("a", r"metrics\.tenant_slo_targets")):
        with pytest.raises(ConfigError, match=where):
            MetricsConfig(tenant_slo_targets=bad)


def test_tenant_slo_targets_yaml_round_trip():
    cfg = SimConfig(metrics=MetricsConfig(tenant_slo_targets={"gold": {"ttft_ms": 50.0}}))
    data = config_to_dict(cfg)
    assert data["metrics"]["tenant_slo_targets"] == {
        "gold": {"ttft_ms": 50.0, "itl_ms": 0.0, "e2e_ms": 0.0}}
    assert config_from_dict(data) == cfg


def test_the_new_blocks_match_the_metrics_schema(make_workload, make_result):
    from tests.metrics.test_output_schema import _validate

    workload = make_workload(2, tenant=[0, 1], tenant_names=("a", "b"), output_tokens=[3, 3])
    result = make_result(2, itl_sum_us=[20, 40], itl_count=[2, 2], itl_entries_us=[10, 10, 20, 20])
    m = aggregate_metrics(result, workload, _cfg(
        slo_targets=[("default", _target(ttft_ms=2.0))],
        tenant_slo_targets=[("a", _target(ttft_ms=2.0)), ("zed", _target(e2e_ms=1.0))]))
    _validate(m, "metrics")
    m["tenant_slo_attainment"]["per_tenant"]["a"]["unknown"] = 1
    with pytest.raises(Exception, match="unknown"):
        _validate(m, "metrics")
