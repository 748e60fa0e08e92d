"""Decision-trace records of the reference engine on hand-made situations (docs/tracing.md).

The blackbox model of ``tests/reference/conftest`` (step = 1000 + 10·prefill tokens + 100·decode
tokens µs, α = 0) and hand-computed timelines; the counterfactual score of an instance without
policy scores is minus its load (queue + batch + in-flight), BLIS's (docs/tracing.md, Counterfactual regret).
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources

import jsonschema
import numpy as np
import pytest

from blisjax.config import PriorityConfig, RoutingConfig
from blisjax.metrics import aggregate_metrics
from blisjax.reference import ClusterSimulator
from blisjax.trace import of_kind, simulate_traced
from blisjax.trace.counterfactual import counterfactual
from blisjax.trace.records import RECORD_TYPES, InstanceView
from tests.reference.conftest import make_resolved, make_workload

# Three requests at t = 0 (round-robin: instances 0, 1, 2); request 0 decodes for ~1.1 s, 1 and
# 2 finish within 3 ms. Request 3 arrives at 0.1 s; round-robin sends it to instance 0, which
# still runs request 0 (queue 0 + batch 1 + in-flight 1 = load 2) while 1 and 2 are idle
# (load 0): regret 0 - (-2) = 2. Requests 0-2 see loads (0,0,0), (1,0,0), (1,1,0): regret 0.
ROWS = [dict(arrival=0, input=16, output=1000), dict(arrival=0, input=16, output=1),
        dict(arrival=0, input=16, output=1), dict(arrival=100_000, input=16, output=1)]


def _traced(routing: str, k: int = 2, rows=ROWS, level="decisions", **cfg):
    resolved = make_resolved(instances=3, routing=RoutingConfig(policy=routing), **cfg)
    return simulate_traced(resolved, make_workload(rows), level, k)


def _view(i, q=0, b=0, f=0):
    return InstanceView(i, q, b, f, 0.0, 100, 0)


def test_counterfactual_formula():
    views = [_view(0, 1, 1, 2), _view(1, 0, 0, 1), _view(2), _view(3)]
    top, regret = counterfactual(views, None, 0, 2)
    assert [(v.instance, v.score) for v in top] == [(2, 0.0), (3, 0.0)]  # ties by id
    assert regret == 4.0
    # policy scores win over loads; an instance the policy did not score counts 0
    top, regret = counterfactual(views, {0: 0.25, 1: 0.75}, 0, 3)
    assert [(v.instance, v.score) for v in top] == [(1, 0.75), (0, 0.25), (2, 0.0)]
    assert regret == 0.5
    assert counterfactual(views, None, 0, 0) == ((), 0.0)  # k = 0: BLIS computes nothing
    assert counterfactual(views, None, 7, 2) == ((), 0.0)  # not a candidate
    # BLIS compares instance IDs as text: instance_10 ranks before instance_2 on a tie
    top, _ = counterfactual([_view(2), _view(10)], None, 2, 2)
    assert [v.instance for v in top] == [10, 2]


def test_round_robin_regret_is_the_load_it_passes_by():
    result, trace = _traced("round-robin")
    routing = of_kind(trace.lines(), "routing")
    assert [r["chosen_instance"] for r in routing] == [0, 1, 2, 0]
    assert [r["regret"] for r in routing] == [0.0, 0.0, 0.0, 2.0]
    last = routing[3]
    assert [(v["queue_depth"], v["batch_size"], v["in_flight"]) for v in last["snapshots"]] == [
        (0, 1, 1), (0, 0, 0), (0, 0, 0)]
    assert [(v["instance"], v["score"]) for v in last["candidates"]] == [(1, 0.0), (2, 0.0)]
    assert last["scores"] is None
    summary = trace.summary()
    assert (summary.mean_regret, summary.max_regret) == (0.5, 2.0)
    assert summary.target_distribution == {"instance_0": 2, "instance_1": 1, "instance_2": 1}
    assert int(result.instance[3]) == 0


@pytest.mark.parametrize("routing", ["least-loaded", "weighted"])
def test_load_aware_routing_has_no_regret(routing):
    _, trace = _traced(routing)
    routing_records = of_kind(trace.lines(), "routing")
    assert routing_records[3]["chosen_instance"] in (1, 2)
    assert all(r["regret"] == 0.0 for r in routing_records)
    # weighted routing carries its scores, one per snapshot; the chosen one is the best
    if routing == "weighted":
        for r in routing_records:
            assert len(r["scores"]) == 3
            assert r["scores"][r["chosen_instance"]] == max(r["scores"])


def test_tracing_changes_nothing_and_counts_match_the_metrics():
    """A traced run's result is the untraced run's, and the records count what the metrics
    count: one batch record per step, completions, preemptions, admissions."""
    rows = [dict(arrival=5_000 * i, input=64 + 16 * (i % 7), output=40 + 10 * (i % 5))
            for i in range(60)]
    cfg = dict(kv_blocks=40, preemption="fcfs")  # tight KV: preemptions happen
    resolved = make_resolved(instances=3, routing=RoutingConfig(policy="round-robin"), **cfg)
    w = make_workload(rows)
    plain = ClusterSimulator(resolved, w).run()
    traced, trace = simulate_traced(resolved, w, "full", 3)
    for f in dataclasses.fields(plain):
        a, b = getattr(plain, f.name), getattr(traced, f.name)
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, f.name
    lines = list(trace.lines())
    metrics = aggregate_metrics(traced, w)
    batches = of_kind(lines, "batch")
    assert len(batches) == int(np.sum(traced.step_count))
    assert sum(len(b["completed"]) for b in batches) == metrics["completed_requests"]
    preemptions = of_kind(lines, "preemption")
    assert len(preemptions) == metrics["preemption_count"] > 0
    assert sorted(p for b in batches for p in b["preempted"]) == sorted(
        p["request_id"] for p in preemptions)
    # every admission into a batch is a request joining from the queue: first admissions plus
    # re-admissions after preemption
    assert sum(len(b["admitted"]) for b in batches) == 60 + len(preemptions)
    assert len(of_kind(lines, "admission")) == 60
    for b in batches:  # state after formation within the instance's limits
        assert b["kv_used_blocks"] <= b["kv_total_blocks"] == 40
    steps = [e for e in of_kind(lines, "event") if e["event"] == "step"]
    assert len(steps) >= len(batches)  # a step event may find nothing to do


def test_priority_records_and_inversions_match_the_metrics():
    """priority-fcfs with SLO classes: the priority records show the order used, and the
    inversion anomalies' counts sum to the metric."""
    rows = [dict(arrival=2_000 * i, input=200 + 37 * (i % 11), output=5 + 29 * (i % 13),
                 slo="batch" if i % 3 else "critical") for i in range(90)]
    resolved = make_resolved(instances=2, routing=RoutingConfig(policy="round-robin"),
                             priority=PriorityConfig(policy="slo-class"),
                             scheduler="priority-fcfs", max_running=4)
    w = make_workload(rows)
    result, trace = simulate_traced(resolved, w, "decisions", 0)
    lines = list(trace.lines())
    metrics = aggregate_metrics(result, w, scheduler="priority-fcfs")
    inversions = [a for a in of_kind(lines, "anomaly") if a["type"] == "priority_inversion"]
    assert sum(a["count"] for a in inversions) == metrics["priority_inversions"] > 0
    priority = of_kind(lines, "priority")
    assert priority
    for p in priority:
        scores = [q["priority"] for q in p["considered"]]
        assert scores == sorted(scores, reverse=True)  # slo-class: critical 4 before batch -1
        assert p["policy"] == "slo-class" and p["scheduler"] == "priority-fcfs"
    assert any(p["passed_over"] > 0 for p in priority)


def test_every_record_matches_the_schema():
    """Lines of every kind validate against blisjax/data/schema/trace.schema.json."""
    text = (resources.files("blisjax") / "data" / "schema" / "trace.schema.json").read_text()
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rows = [dict(arrival=5_000 * i, input=64 + 16 * (i % 7), output=40 + 10 * (i % 5),
                 slo="critical" if i % 2 else "batch") for i in range(30)]
    _, trace = _traced("round-robin", 2, rows, "full", kv_blocks=40,
                       priority=PriorityConfig(policy="slo-class"), scheduler="priority-fcfs")
    seen = set()
    for line in trace.lines():
        validator.validate(line)
        seen.add(line["kind"])
    assert {"admission", "routing", "batch", "preemption", "priority", "event",
            "instance_state"} <= seen
    assert set(RECORD_TYPES) == {k["properties"]["kind"]["const"] for k in schema["oneOf"]}


def test_kv_thrashing_anomaly_names_the_step_and_request():
    """tests/reference/test_tiered_kv.py's timeline: request 2's step at 10 ms reloads two
    blocks whose GPU copies request 1's step evicted 5,000 µs earlier: one thrashing record,
    count 2, instance 0, request 2, at that step."""
    from tests.reference.test_tiered_kv import ROWS as TIER_ROWS
    from tests.reference.test_tiered_kv import TIER

    tier = dict(TIER)
    groups = tier.pop("groups")
    resolved = make_resolved(thrash_window_us=1_000_000, **tier)
    _, trace = simulate_traced(resolved, make_workload(TIER_ROWS, groups=groups))
    thrash = [a for a in of_kind(trace.lines(), "anomaly") if a["type"] == "kv_thrashing"]
    assert [(a["count"], a["instances"], a["requests"]) for a in thrash] == [(2, [0], [2])]
    step = [b for b in of_kind(trace.lines(), "batch")
            if [c["request_id"] for c in b["admitted"]] == [2]]
    assert thrash[0]["time_us"] == step[0]["time_us"]


def test_scale_oscillation_anomalies_match_the_metric():
    """The shipped autoscaling example (a compressed traffic day): one oscillation record per
    oscillation the metrics count, each at an actuation that reversed the previous one."""
    from blisjax.config import load_config, resolve_config
    from blisjax.workload import generate_workload, parse_workload_spec
    from tests.paths import REPO

    cfg = load_config(REPO / "configs" / "autoscale.yaml")
    w = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    w = w.head(2300)
    result, trace = simulate_traced(resolve_config(cfg), w)
    lines = list(trace.lines())
    metrics = aggregate_metrics(result, w, cfg.metrics)
    flips = [a for a in of_kind(lines, "anomaly") if a["type"] == "scale_oscillation"]
    assert len(flips) == metrics["autoscaling"]["scale_oscillations"] > 0
    acts = of_kind(lines, "scale_actuation")
    for flip in flips:
        k = next(i for i, a in enumerate(acts) if a["time_us"] == flip["time_us"])
        done = [a for a in acts[:k] if a["placed"] or a["drained"]]
        assert bool(acts[k]["placed"]) != bool(done[-1]["placed"])  # the direction turned


def test_requests_no_instance_can_take_get_routing_rejections():
    """tests/reference/test_autoscaling.py's cold start: the only instance loads for 1 s, so
    the four requests of the burst at 0.1 s find nothing routable: four routing-rejection
    records at 0.1 s, no routing record, and BLIS's summary counts them admitted."""
    from blisjax.config import AutoscalerConfig, DelaySpec, LifecycleConfig, resolve_config

    base = make_resolved(beta=(10_000.0, 0.0, 0.0), kv_blocks=1000)
    cfg = base.config
    life = LifecycleConfig(loading_delay=DelaySpec(1.0), warm_start_initial_instances=False)
    cfg = dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, autoscaler=AutoscalerConfig()),
        cluster=dataclasses.replace(cfg.cluster, lifecycle=life))
    rows = [dict(arrival=100_000, input=32, output=100) for _ in range(4)]
    _, trace = simulate_traced(resolve_config(cfg), make_workload(rows))
    lines = list(trace.lines())
    assert [(r["time_us"], r["request_id"]) for r in of_kind(lines, "routing_rejection")] == [
        (100_000, 0), (100_000, 1), (100_000, 2), (100_000, 3)]
    assert of_kind(lines, "routing") == []
    assert [(s["time_us"], s["state"]) for s in of_kind(lines, "instance_state")] == [
        (0, "loading"), (1_000_000, "active")]
    summary = trace.summary()
    assert (summary.admitted, summary.unique_targets, summary.mean_regret) == (4, 0, 0.0)
