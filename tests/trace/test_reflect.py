"""Reflection text of a traced run (blisjax.trace.reflect).

The runs are small (the default experiment cut to its first 300 requests, well under a second
each). Expected values are computed here from the records and the metrics themselves, not from
the module's helpers, so a wrong count, a wrong ranking or a wrong join shows.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from blisjax.config import load_config, resolve_config
from blisjax.engine.population import set_knob
from blisjax.metrics import aggregate_metrics, per_request_rows
from blisjax.trace import simulate_traced
from blisjax.trace.reflect import (
    KNOBS,
    MIN_TOKENS,
    SETTINGS,
    STRATEGIES,
    approx_tokens,
    reflection_text,
)
from blisjax.trace.reflect.sections import AUDIT_SAMPLE
from blisjax.workload import generate_workload, parse_workload_spec
from tests.paths import REPO

CONFIGS = REPO / "configs"
N_REQUESTS = 300


def _run(knobs: dict, n: int = N_REQUESTS, k: int = 3, engine: dict | None = None,
         rate: float | None = None, path: str = "default.yaml"):
    """(lines, metrics, config, per-request rows) of a traced reference run of ``path`` with
    ``knobs`` set, the workload cut to its first ``n`` requests."""
    cfg = load_config(CONFIGS / path)
    for name, value in knobs.items():
        cfg = set_knob(cfg, name, value)
    if engine:
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **engine))
    if rate is not None:
        cfg = dataclasses.replace(cfg, workload={**cfg.workload, "aggregate_rate": rate})
    w = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    w = w.head(n)
    result, trace = simulate_traced(resolve_config(cfg), w, "decisions", k)
    metrics = aggregate_metrics(result, w, cfg.metrics, scheduler=cfg.policy.scheduler.policy)
    return list(trace.lines()), metrics, cfg, per_request_rows(result, w)


RR = {"routing.policy": "round-robin"}
#: Always-busiest routing into small KV caches at twice the rate, with priority scheduling:
#: preemptions, priority inversions, HOL blocking, long queues and large regrets.
STRESS = dict(knobs={"routing.policy": "always-busiest", "scheduler.policy": "priority-fcfs",
                     "priority.policy": "slo-class"}, engine={"total_kv_blocks": 600}, rate=60)
BUCKET = {"admission.policy": "token-bucket", "admission.token_bucket_capacity": 5000.0}


@pytest.fixture(scope="module")
def rr():
    return _run(RR)


@pytest.fixture(scope="module")
def stress():
    return _run(**STRESS)


def _of(lines, kind):
    return [x for x in lines if x["kind"] == kind]


def _section(text: str, heading: str) -> str:
    """The text of one ``## heading`` section."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"no section {heading!r} in:\n{text}"
    return m.group(1)


# ---- the token estimate -------------------------------------------------------------------------


def test_approx_tokens_rule():
    assert approx_tokens("") == 0
    assert approx_tokens("   \n\t") == 0
    assert approx_tokens("regret 6.25 ms") == 5  # regret, 6, ., 25, ms
    assert approx_tokens("abcdefgh") == 1
    assert approx_tokens("abcdefghi") == 2  # 9 letters: ceil(9 / 8)
    assert approx_tokens("1234567") == 3  # 7 digits: ceil(7 / 3)
    assert approx_tokens("p99") == 2  # letters and digits are separate runs
    assert approx_tokens("max_num_running_reqs") == 7  # 4 words + 3 underscores
    assert approx_tokens("µs ✓") == 3  # µ, s, ✓


def test_approx_tokens_adds_over_lines():
    parts = ["## Outcome", "TTFT p99 37.4 ms ≤ 30 ms ✗", "", "- request 12 → inst 3"]
    assert approx_tokens("\n".join(parts)) == sum(approx_tokens(p) for p in parts)


# ---- the API ------------------------------------------------------------------------------------


def test_unknown_strategy_names_the_allowed_ones(rr):
    lines, metrics, cfg, _ = rr
    with pytest.raises(ValueError) as err:
        reflection_text(lines, metrics, cfg, strategy="vibes")
    for name in STRATEGIES:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="max_tokens"):
        reflection_text(lines, metrics, cfg, max_tokens=0)


def test_deterministic_across_runs():
    """Two simulations of the same configuration give the same text, byte for byte."""
    a, b = _run(RR), _run(RR)
    for strategy in STRATEGIES:
        for rows in (False, True):
            ta = reflection_text(a[0], a[1], a[2], strategy, requests=a[3] if rows else None)
            tb = reflection_text(b[0], b[1], b[2], strategy, requests=b[3] if rows else None)
            assert ta == tb


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_length_within_bounds(rr, stress, strategy):
    for lines, metrics, cfg, rows in (rr, stress):
        for requests in (None, rows):
            text = reflection_text(lines, metrics, cfg, strategy, requests=requests)
            assert MIN_TOKENS <= approx_tokens(text) <= 1500, text
            small = reflection_text(lines, metrics, cfg, strategy, max_tokens=700,
                                    requests=requests)
            assert approx_tokens(small) <= 700
            assert small.startswith("# Reflection on a traced run")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_trimming_keeps_sections_and_ranked_lists_whole(stress, strategy):
    lines, metrics, cfg, rows = stress
    for budget in range(150, 1500, 50):  # cuts fall everywhere: a sweep, not a few points
        text = reflection_text(lines, metrics, cfg, strategy, max_tokens=budget, requests=rows)
        assert approx_tokens(text) <= budget
        assert budget >= 1000 or re.search(
            rf"\[\d+ detail blocks left out to stay within {budget} tokens\]", text)
        for heading in re.findall(r"^## .*$", text, re.M):  # no heading without content
            assert _section(text, heading[3:]).strip(), (budget, heading)
        for heading in ("Key Issues", "Issues", "Suggested Focus"):
            if f"## {heading}\n" in text:  # numbered lists keep their head, without gaps
                ranks = [int(r) for r in re.findall(r"^(\d+)\. ", _section(text, heading),
                                                    re.M)]
                assert ranks == list(range(1, len(ranks) + 1)), (budget, heading, ranks)
    assert approx_tokens(reflection_text(lines, metrics, cfg, strategy, max_tokens=20)) <= 20


def test_little_to_say_is_not_padded():
    """A run of 5 requests has no issues: the text says so and shows one decision (the
    slowest), well within the budget, rather than filling it."""
    lines, metrics, cfg, rows = _run({}, n=5)
    text = reflection_text(lines, metrics, cfg, requests=rows)
    assert "No issues detected." in text
    worst = _section(text, "Worst Decisions")
    assert "; the slowest:" in worst and len(re.findall(r"^- request \d+ ", worst, re.M)) == 1
    assert "left out" not in text
    assert approx_tokens(text) < 1500 - 500


# ---- outcome ------------------------------------------------------------------------------------


def test_outcome_against_slo_targets(rr):
    lines, metrics, cfg, _ = rr
    out = _section(reflection_text(lines, metrics, cfg), "Outcome")
    assert f"Requests: {metrics['completed_requests']} completed" in out
    for name, target in cfg.metrics.slo_targets:
        cls = metrics["per_slo_class"][name]
        line = next(x for x in out.splitlines() if x.startswith(f"SLO {name} "))
        ttft_ok = cls["ttft_p99_ms"] <= target.ttft_ms
        e2e_ok = cls["e2e_p99_ms"] <= target.e2e_ms
        assert re.search(r"TTFT p99 [^;]* " + ("≤" if ttft_ok else ">") + r" [^;]* "
                         + ("✓" if ttft_ok else "✗"), line), line
        assert re.search(r"E2E p99 [^;]* " + ("≤" if e2e_ok else ">") + r" [^;]* "
                         + ("✓" if e2e_ok else "✗"), line), line
        att = metrics["slo_attainment"]["per_class"][name]
        assert f"({att['good']}/{att['injected']})" in line
    assert "Fitness" in out


# ---- issues -------------------------------------------------------------------------------------


def test_issue_counts_equal_records_and_metrics(stress):
    lines, metrics, cfg, _ = stress
    text = reflection_text(lines, metrics, cfg, max_tokens=4000)
    preemptions = _of(lines, "preemption")
    assert preemptions and len(preemptions) == metrics["preemption_count"]
    m = re.search(r"(\d+) preemptions \(metrics preemption_count (\d+)\) of (\d+) distinct", text)
    assert m and int(m[1]) == len(preemptions) == int(m[2])
    assert int(m[3]) == len({p["request_id"] for p in preemptions})
    inversions = [a for a in _of(lines, "anomaly") if a["type"] == "priority_inversion"]
    m = re.search(r"(\d+) priority inversions \(metrics priority_inversions (\d+)\): (\d+) "
                  r"requests", text)
    assert m and int(m[1]) == metrics["priority_inversions"] == int(m[2]) > 0
    assert int(m[3]) == len(inversions)
    m = re.search(r"(\d+) instance\(s\) with head-of-line blocking", text)
    assert m and int(m[1]) == metrics["hol_blocking_instances"] > 0
    pos = [r for r in _of(lines, "routing") if r["regret"] > 0]
    m = re.search(r"Routing regret \(severity [\d.]+, count (\d+)\)", text)
    assert m and int(m[1]) == len(pos) > 0


def test_issues_ranked_by_severity(stress):
    lines, metrics, cfg, _ = stress
    issues = _section(reflection_text(lines, metrics, cfg, max_tokens=4000), "Key Issues")
    severities = [float(s) for s in re.findall(r"^\d+\. .*?\(severity ([\d.]+)", issues, re.M)]
    assert len(severities) >= 4 and severities == sorted(severities, reverse=True)


def test_preemption_examples_lose_the_most_tokens(stress):
    lines, metrics, cfg, _ = stress
    text = reflection_text(lines, metrics, cfg, max_tokens=4000)
    top = max(_of(lines, "preemption"), key=lambda p: (p["tokens_lost"], -p["time_us"]))
    assert (f"e.g. request {top['request_id']} on inst {top['instance']} at "
            f"{top['time_us'] / 1e6:.3f} s lost {top['tokens_lost']} tokens") in text


def test_prefix_cache_misses_from_snapshots(rr):
    lines, metrics, cfg, _ = rr
    misses = []
    for r in _of(lines, "routing"):
        cached = {s["instance"]: s["cached_blocks"] for s in r["snapshots"]}
        gap = max(cached.values()) - cached[r["chosen_instance"]]
        if gap > 0:
            misses.append((gap, r))
    assert misses
    text = reflection_text(lines, metrics, cfg, max_tokens=4000)
    lost = sum(g for g, _ in misses)
    assert (f"{len(misses)} of {len(_of(lines, 'routing'))} requests were routed away from an "
            f"instance holding more of their prompt: {lost} blocks "
            f"({lost * cfg.engine.block_size_tokens} tokens") in text
    gap, worst = max(misses, key=lambda gr: (gr[0], -gr[1]["time_us"]))
    assert f"e.g. request {worst['request_id']} (" in text


def test_admission_rejections_counted():
    lines, metrics, cfg, _ = _run(BUCKET)
    rejected = [a for a in _of(lines, "admission") if not a["admitted"]]
    assert rejected and len(rejected) == metrics["rejected_requests"]
    text = reflection_text(lines, metrics, cfg)
    assert (f"{len(rejected)} of {len(_of(lines, 'admission'))} requests rejected at admission "
            f"(metrics rejected_requests {metrics['rejected_requests']})") in text
    assert f"request {rejected[0]['request_id']} rejected at" in text
    assert "`admission.token_bucket_capacity`" in text
    other = _section(reflection_text(lines, metrics, cfg, "decision_audit", max_tokens=4000),
                     "Other Decisions")
    for a in (rejected[0], rejected[-1]):  # the sample spans the rejections, first to last
        assert (f"- admission at {a['time_us'] / 1e6:.3f} s: request {a['request_id']} "
                f"rejected ({a['reason']})") in other


def test_synthetic_anomalies_and_rejections():
    """Kinds the small runs do not produce: KV thrashing, scale oscillations, routing
    rejections (hand-made records)."""
    cfg = load_config(CONFIGS / "autoscale.yaml")
    lines = [
        {"kind": "routing_rejection", "time_us": 1_000_000, "request_id": 7,
         "reason": "no routable instance"},
        {"kind": "routing_rejection", "time_us": 2_000_000, "request_id": 9,
         "reason": "no routable instance"},
        {"kind": "anomaly", "time_us": 3_000_000, "type": "kv_thrashing", "count": 5,
         "instances": [1], "requests": [11, 12], "severity": 5.0, "description": "thrash A"},
        {"kind": "anomaly", "time_us": 4_000_000, "type": "kv_thrashing", "count": 2,
         "instances": [0], "requests": [13], "severity": 2.0, "description": "thrash B"},
        {"kind": "scale_actuation", "time_us": 5_000_000, "delta": 1, "placed": [2],
         "drained": [], "refused": 0},
        {"kind": "anomaly", "time_us": 6_000_000, "type": "scale_oscillation", "count": 1,
         "instances": [2], "requests": [], "severity": 1.0, "description": "flip"},
    ]
    metrics = {"rejected_routing": 2, "autoscaling": {"scale_oscillations": 1}}
    text = reflection_text(lines, metrics, cfg)
    assert "2 requests found no routable instance (metrics rejected_routing 2)" in text
    assert "KV thrashing in 2 steps: 7 blocks reloaded" in text
    assert "e.g. at 3.000 s: thrash A" in text  # the more severe example first
    assert "1 scale oscillations (metrics 1) in 1 actuations" in text
    assert "`autoscaler.cooldown_us`" in text and "`autoscaler.min_replicas`" in text


# ---- decisions ----------------------------------------------------------------------------------


def _regret_order(lines, rows, cfg):
    """Routing records as the text ranks them: by regret, highest first; ties by outcome: not
    completed, then more targets missed (the class's TTFT and E2E targets, a preemption),
    then the worst ratio of TTFT or E2E to its target, then time."""
    targets = dict(cfg.metrics.slo_targets)
    by_id = {r["request_id"]: r for r in rows}

    def outcome(rec):
        row = by_id[rec["request_id"]]
        t = targets[row["slo_class"]]
        ttft, e2e = row["ttft_us"] / 1e3, row["e2e_us"] / 1e3
        missed = (ttft > t.ttft_ms) + (e2e > t.e2e_ms) + (row["preemptions"] > 0)
        return (row["status"] != "completed", missed, max(ttft / t.ttft_ms, e2e / t.e2e_ms))

    def key(rec):
        done, missed, ratio = outcome(rec)
        return (-rec["regret"], -done, -missed, -ratio, rec["time_us"])
    return sorted(_of(lines, "routing"), key=key)


def test_counterfactual_names_the_highest_regret(rr):
    lines, metrics, cfg, rows = rr
    text = reflection_text(lines, metrics, cfg, "counterfactual")
    top = max(r["regret"] for r in _of(lines, "routing"))
    argmax = {r["request_id"] for r in _of(lines, "routing") if r["regret"] == top}
    first = re.search(r"^- Had request (\d+) .*? gone to inst (\d+) .*? instead of inst (\d+) ",
                      _section(text, "Counterfactuals"), re.M)
    assert first and int(first[1]) in argmax
    rec = next(r for r in _of(lines, "routing") if r["request_id"] == int(first[1]))
    assert int(first[2]) == rec["candidates"][0]["instance"]  # the best counterfactual
    assert int(first[3]) == rec["chosen_instance"]
    n_pos = sum(r["regret"] > 0 for r in _of(lines, "routing"))
    assert f"{n_pos} of {len(_of(lines, 'routing'))} decisions have regret > 0" in text
    # Totals by chosen instance are the records' sums.
    for inst in sorted({r["chosen_instance"] for r in _of(lines, "routing")}):
        mine = [r for r in _of(lines, "routing") if r["chosen_instance"] == inst]
        with_regret = sum(r["regret"] > 0 for r in mine)
        total = sum(r["regret"] for r in mine)
        assert (f"- chosen inst {inst}: {len(mine)} decisions, {with_regret} with regret "
                f"(sum {total:g})") in text


def test_counterfactual_with_rows_ranks_ties_by_outcome(rr):
    lines, metrics, cfg, rows = rr
    text = reflection_text(lines, metrics, cfg, "counterfactual", requests=rows)
    named = [int(x) for x in re.findall(r"^- Had request (\d+) ", text, re.M)]
    expected = [r["request_id"] for r in _regret_order(lines, rows, cfg)][:len(named)]
    assert named and named == expected


def test_worst_decision_shows_what_the_router_saw(rr):
    lines, metrics, cfg, rows = rr
    text = reflection_text(lines, metrics, cfg, requests=rows)
    worst = _regret_order(lines, rows, cfg)[0]
    section = _section(text, "Worst Decisions")
    assert f"1. request {worst['request_id']} (" in section
    chosen = next(s for s in worst["snapshots"] if s["instance"] == worst["chosen_instance"])
    assert (f"inst {chosen['instance']}: q {chosen['queue_depth']}, b {chosen['batch_size']}, "
            f"f {chosen['in_flight']}") in section
    row = next(r for r in rows if r["request_id"] == worst["request_id"])
    assert re.search(rf"TTFT {row['ttft_us'] / 1e3:.3g} ms", section)
    done = next(b["time_us"] + b["duration_us"] for b in _of(lines, "batch")
                if worst["request_id"] in b["completed"])
    assert f"(at {done / 1e6:.3f} s)" in section


def test_decision_audit_spreads_over_the_run(rr):
    lines, metrics, cfg, rows = rr
    text = reflection_text(lines, metrics, cfg, "decision_audit", max_tokens=4000,
                           requests=rows)
    routing = sorted(_of(lines, "routing"), key=lambda r: (r["time_us"], r["request_id"]))
    n = len(routing)
    picks = [routing[(n - 1) * j // (AUDIT_SAMPLE - 1)] for j in range(AUDIT_SAMPLE)]
    audit = _section(text, "Decision Audit")
    listed = re.findall(r"^- #(\d+)/(\d+) at [\d.]+ s: request (\d+) ", audit, re.M)
    assert [int(x[2]) for x in listed[:AUDIT_SAMPLE]] == [p["request_id"] for p in picks]
    assert all(int(x[1]) == n for x in listed)
    # Each sampled decision is followed by its outcome, with the request's own TTFT.
    ttft = {r["request_id"]: r["ttft_us"] for r in rows}
    for p in picks[:3]:
        block = audit.split(f": request {p['request_id']} (", 1)[1].split("\n- ", 1)[0]
        assert re.search(rf"→ scheduled .*TTFT {ttft[p['request_id']] / 1e3:.3g} ms", block)
    # Then the worst decisions not sampled, highest regret first.
    sampled = {p["request_id"] for p in picks}
    worst = [r["request_id"] for r in _regret_order(lines, rows, cfg)
             if r["request_id"] not in sampled]
    assert re.search(r"^The \d+ worst others \(by regret", audit, re.M)
    assert [int(x[2]) for x in listed[AUDIT_SAMPLE:]] == worst[:len(listed) - AUDIT_SAMPLE]
    assert len(listed) > AUDIT_SAMPLE


# ---- suggestions --------------------------------------------------------------------------------


def _knob_base(name: str):
    if name.startswith("autoscaler."):
        return load_config(CONFIGS / "autoscale.yaml")
    if name.startswith("cluster.pd."):
        return load_config(CONFIGS / "search" / "pd-split.yaml")
    return load_config(CONFIGS / "default.yaml")


def _current(cfg, name: str):
    if name.startswith("routing.scorers."):
        return 1.0
    if name == "cluster.pd.split":
        return 1
    if name == "engine.total_kv_blocks":  # computed from the GPU in the default configuration
        return 1000
    obj = cfg
    for part in name.replace("autoscaler.", "policy.autoscaler.").split("."):
        obj = getattr(obj.policy if part in ("admission", "priority", "routing", "scheduler")
                      and obj is cfg else obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_named_knobs_exist(name):
    cfg = _knob_base(name)
    set_knob(cfg, name, _current(cfg, name))  # raises ConfigError for an unknown knob


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_named_settings_exist(name):
    obj = load_config(CONFIGS / "default.yaml")
    for part in name.split("."):
        obj = getattr(obj, part)


def test_suggestions_name_only_known_knobs(rr, stress):
    for lines, metrics, cfg, rows in (rr, stress, _run(BUCKET)):
        for strategy in STRATEGIES:
            text = reflection_text(lines, metrics, cfg, strategy, max_tokens=4000,
                                   requests=rows)
            named = set(re.findall(r"`([^`]+)`", text))
            assert named and named <= KNOBS | SETTINGS, named - (KNOBS | SETTINGS)


def test_round_robin_regret_suggests_routing_policy(rr):
    lines, metrics, cfg, _ = rr
    focus = _section(reflection_text(lines, metrics, cfg), "Suggested Focus")
    assert "`routing.policy` is round-robin" in focus


# ---- robustness ---------------------------------------------------------------------------------


def test_trace_without_cache_signal_or_counterfactual(rr):
    """Older traces lack ``cached_blocks``; k = 0 traces lack candidates and regret."""
    lines, metrics, cfg, _ = rr
    stripped = [{**x, "snapshots": [{k: v for k, v in s.items() if k != "cached_blocks"}
                                    for s in x["snapshots"]], "candidates": [], "regret": 0.0}
                if x["kind"] == "routing" else x for x in lines]
    text = reflection_text(stripped, metrics, cfg, "counterfactual")
    assert "Regret was not recorded (counterfactual k = 0)" in text
    assert "Prefix-cache misses" not in text and "Routing regret" not in text
