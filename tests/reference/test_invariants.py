"""Invariants of docs/semantics.md §9 on randomized scenarios, and determinism (INV-6 / BC-9).

Per-event invariants (KV conservation INV-4/BC-13, batch limit BC-12, work conservation INV-8,
clock monotonicity INV-3/BC-5, bounded event queues BC-14) are asserted inside the engine when
``check_invariants=True``; end-of-run invariants (conservation INV-1, causality INV-5/BC-8,
lifecycle INV-2) are asserted here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import AdmissionConfig, PriorityConfig, RoutingConfig, ScorerWeight
from blisjax.metrics.records import COMPLETED, DROPPED, REJECTED, TIMED_OUT, UNFINISHED
from blisjax.reference import ClusterSimulator
from tests.reference.conftest import make_resolved, make_workload

ROUTINGS = [
    RoutingConfig(policy="round-robin"),
    RoutingConfig(policy="least-loaded"),
    RoutingConfig(policy="always-busiest"),
    RoutingConfig(policy="weighted"),
    RoutingConfig(policy="weighted", scorers=(ScorerWeight("load-balance", 1.0),
                                              ScorerWeight("queue-depth", 2.0))),
]
ADMISSIONS = [
    AdmissionConfig(),
    AdmissionConfig(policy="token-bucket", token_bucket_capacity=2000.0,
                    token_bucket_refill_rate=50_000.0),
    AdmissionConfig(policy="rate-limit", rate_limit_rps=200.0, rate_limit_burst=5.0),
    AdmissionConfig(policy="tenant-quota", default_tenant_max_in_flight=3),
]
PRIORITIES = ["constant", "slo-based", "slo-class", "tenant-priority", "deadline-aware"]


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 40))
    rows = []
    t = 0
    for _ in range(n):
        t += draw(st.integers(0, 3000))
        group = draw(st.sampled_from([-1, 0, 1]))
        prefix = draw(st.integers(1, 64)) if group >= 0 else 0
        rows.append(dict(
            arrival=t, input=prefix + draw(st.integers(1, 120)), output=draw(st.integers(0, 30)),
            group=group, prefix=prefix, tenant=draw(st.sampled_from(["a", "b"])),
            slo=draw(st.sampled_from(["", "critical", "batch"])),
            deadline=draw(st.sampled_from([0, 0, t + draw(st.integers(1, 40_000))]))))
    # a prefix group keeps one prefix length
    lengths = {}
    for r in rows:
        if r["group"] >= 0:
            r["prefix"] = lengths.setdefault(r["group"], r["prefix"])
            r["input"] = max(r["input"], r["prefix"])
    cfg = dict(
        instances=draw(st.integers(1, 3)),
        alpha=(draw(st.sampled_from([0.0, 150.5])), draw(st.sampled_from([0.0, 1.25])),
               draw(st.sampled_from([0.0, 33.3]))),
        beta=(draw(st.sampled_from([500.0, 5752.705])), draw(st.sampled_from([3.5, 17.25])),
              draw(st.sampled_from([40.0, 5.999]))),
        kv_blocks=draw(st.integers(12, 60)),
        block_size=draw(st.sampled_from([4, 16])),
        max_running=draw(st.integers(1, 8)),
        max_tokens=draw(st.sampled_from([32, 128, 2048])),
        threshold=draw(st.sampled_from([0, 0, 24])),
        max_model_len=draw(st.sampled_from([0, 0, 150])),  # capped below to fit the cache
        scheduler=draw(st.sampled_from(["fcfs", "priority-fcfs", "sjf"])),
        preemption=draw(st.sampled_from(["fcfs", "priority"])),
        refresh_us=draw(st.sampled_from([0, 5000])),
        horizon_us=draw(st.sampled_from([2**63 - 1, 60_000])),  # see the note below
        routing=draw(st.sampled_from(ROUTINGS)),
        admission=draw(st.sampled_from(ADMISSIONS)),
        priority=PriorityConfig(policy=draw(st.sampled_from(PRIORITIES))),
        prefix_caching=draw(st.booleans()),
    )
    cfg["max_model_len"] = min(cfg["max_model_len"], cfg["kv_blocks"] * cfg["block_size"])
    # FCFS preemption always lets the head of the batch progress, so every run ends. Priority
    # preemption with stale priorities (BLIS semantics) can thrash forever: bound those runs.
    if cfg["preemption"] == "priority":
        cfg["horizon_us"] = 200_000
    return rows, cfg


def _simulate(rows, cfg):
    sim = ClusterSimulator(make_resolved(**cfg), make_workload(rows, ("a", "b"), ("g0", "g1")),
                           check_invariants=True)
    return sim.run(), sim


def check_end_of_run(res, sim, rows):
    n = len(rows)
    status = res.status
    # INV-1: every request is accounted for exactly once.
    counts = {s: int((status == s).sum()) for s in (COMPLETED, REJECTED, TIMED_OUT, DROPPED)}
    assert counts[COMPLETED] == res.completed.sum()
    assert counts[TIMED_OUT] == res.timed_out.sum()
    assert counts[DROPPED] == res.dropped_unservable.sum()
    assert counts[REJECTED] == res.rejected_admission
    assert sum(counts.values()) + int((status == UNFINISHED).sum()) == n
    assert res.still_queued.sum() + res.still_running.sum() <= (status == UNFINISHED).sum()
    # INV-5 / BC-8: causality for completed requests.
    arrival = np.array([r["arrival"] for r in rows])
    done = status == COMPLETED
    assert np.all(res.scheduling_delay_us[done] >= 0)
    assert np.all(res.ttft_us[done] > res.scheduling_delay_us[done])
    assert np.all(res.e2e_us[done] >= res.ttft_us[done])
    assert np.all(arrival[done] + res.e2e_us[done] >= arrival[done])
    out = np.array([r["output"] for r in rows])
    assert np.all(res.output_tokens_done[done & ~res.length_capped] == out[done & ~res.length_capped])
    assert np.all(res.itl_count[done & ~res.length_capped]
                  == np.maximum(out[done & ~res.length_capped] - 1, 0))
    assert res.itl_entries_us.shape[0] == res.itl_count.sum()
    # Rejected requests were never routed; everything else that got a slot was.
    assert np.all(res.instance[status == REJECTED] == -1)
    assert np.all(res.instance[done] >= 0)
    assert res.sim_ended_us <= sim.horizon_us
    # KV returns to empty once nothing is running.
    for x in sim.instances:
        if not x.running:
            assert x.kv.used_blocks == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_on_random_scenarios(scenario):
    rows, cfg = scenario
    res, sim = _simulate(rows, cfg)
    check_end_of_run(res, sim, rows)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_same_inputs_same_results(scenario):
    rows, cfg = scenario
    a, _ = _simulate(rows, cfg)
    b, _ = _simulate(rows, cfg)
    for field in ("status", "instance", "ttft_us", "e2e_us", "scheduling_delay_us",
                  "itl_entries_us", "cache_hits", "cache_misses", "preemption_count"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.sim_ended_us == b.sim_ended_us


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_on_many_random_scenarios(scenario):
    rows, cfg = scenario
    res, sim = _simulate(rows, cfg)
    check_end_of_run(res, sim, rows)
