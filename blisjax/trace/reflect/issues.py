"""The issue detectors: each reads the run view and returns an ``Issue`` or None.

Severity: an issue's severity is the share of requests (decisions, instances, actuations) it
touched, times a weight for how directly it costs latency or requests (``SEVERITY_WEIGHTS``);
``detect_issues`` ranks issues by it. It orders issues; it is not a calibrated cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from blisjax.trace.reflect.decisions import (
    LONG_WAIT_US,
    _alternative,
    _limits_us,
    _outcome_phrase,
    _regret_rule,
    _request_phrase,
    _view_phrase,
    _wait_us,
    _worst_key,
)
from blisjax.trace.reflect.focus import (
    _admission_focus,
    _capacity_focus,
    _has_autoscaler,
    _pd_focus,
    _policy,
    _queueing_focus,
    _scorers,
    _slo_targets,
    _spread_knob,
)
from blisjax.trace.reflect.formats import (
    _at,
    _dur,
    _ids,
    _ms,
    _num,
    _pct,
    _per_instance,
    _quantile,
    _spread,
)
from blisjax.trace.reflect.runview import RunView

#: Weight of each issue's affected share in its severity: losses of requests outweigh latency,
#: which outweighs waste that may not cost latency (regret, cache misses, imbalance).
SEVERITY_WEIGHTS: dict[str, float] = {
    "lost_requests": 3.0, "admission_rejections": 2.0, "routing_rejections": 2.0,
    "long_queueing": 1.5, "preemptions": 1.5, "priority_inversions": 1.0, "hol_blocking": 1.0,
    "kv_thrashing": 1.0, "scale_oscillations": 1.0, "load_imbalance": 1.0,
    "prefix_cache_misses": 2.0, "routing_regret": 0.5,
}

#: Load imbalance is reported when an instance took this many times its fair share of the
#: decisions it was a candidate in (and that share is at least ``MIN_FAIR_SHARE`` requests).
IMBALANCE_RATIO = 1.25
MIN_FAIR_SHARE = 5.0

#: Detail cap: examples per issue.
EXAMPLES = 3


class Issue(NamedTuple):
    """A detected issue: ``count`` occurrences, a one-line ``headline``, example lines and
    suggestion lines (knob names in backticks)."""

    key: str
    title: str
    severity: float
    count: int
    headline: str
    examples: tuple[str, ...]
    focus: tuple[str, ...]


def _issue_regret(rv: RunView) -> Issue | None:
    pos = [d for d in rv.decisions if d.regret > 0]
    if not pos:
        return None
    policy = _policy(rv.config, "routing")
    total = sum(d.regret for d in pos)
    share = len(pos) / len(rv.decisions)
    headline = (f"{len(pos)} of {len(rv.decisions)} routing decisions ({_pct(share)}) passed a "
                f"better instance by ({_regret_rule(pos[0])}): total {_num(total)}, mean "
                f"{_num(total / len(pos))}, max {_num(max(d.regret for d in pos))}.")
    examples = []
    for d in sorted(pos, key=_worst_key(rv))[:EXAMPLES]:
        chosen, alt = d.view(d.chosen), _alternative(d)
        if chosen is None or alt is None:
            continue
        examples.append(f"request {d.request_id} at {_at(d.time_us)} → {_view_phrase(chosen)} "
                        f"while {_view_phrase(alt)}; regret {_num(d.regret)}; "
                        f"{_outcome_phrase(rv, d)}")
    focus = []
    if policy in ("round-robin", "always-busiest"):
        focus.append(f"Routing regret: `routing.policy` is {policy}, which ignores load and "
                     f"passed a less-loaded instance in {_pct(share)} of decisions: try "
                     "least-loaded, or weighted with `routing.scorers.queue-depth`.")
    else:
        focus.append("Routing regret: the policy's best-scored instance was not taken "
                     "(ties): raise `routing.scorers.queue-depth` to separate candidates.")
    return Issue("routing_regret", "Routing regret", share * SEVERITY_WEIGHTS["routing_regret"],
                 len(pos), headline, tuple(examples), tuple(focus))


def _issue_imbalance(rv: RunView) -> Issue | None:
    if not rv.decisions:
        return None
    chosen = Counter(d.chosen for d in rv.decisions)
    fair: dict[int, float] = {}
    for d in rv.decisions:
        for v in d.views:  # each candidate's fair share of this decision
            fair[v.instance] = fair.get(v.instance, 0.0) + 1.0 / len(d.views)
    ratio = {i: chosen.get(i, 0) / f for i, f in fair.items() if f >= MIN_FAIR_SHARE}
    if len(ratio) < 2:
        return None
    hot = min(ratio, key=lambda i: (-ratio[i], i))
    cold = min(ratio, key=lambda i: (ratio[i], i))
    if ratio[hot] < IMBALANCE_RATIO:
        return None
    # The share of decisions that would have to move for every instance to get its fair share.
    excess = sum(max(0.0, chosen.get(i, 0) - f) for i, f in fair.items()) / len(rv.decisions)
    headline = (f"instance {hot} took {chosen.get(hot, 0)} routed requests, "
                f"{ratio[hot]:.2f}× its fair share ({_num(fair[hot])} of the decisions it was "
                f"a candidate in); least used: instance {cold} with {chosen.get(cold, 0)} "
                f"({ratio[cold]:.2f}×); {_pct(excess)} of the requests went above fair shares. "
                f"Routed: {_per_instance(chosen)}.")
    busy = rv.metrics.get("instances", {})
    examples = []
    for i in (hot, cold):
        q = rv.queues.get(i)
        if q is None:
            continue
        b = busy.get(str(i), {}).get("busy_time_s")
        busy_text = "" if b is None else f", busy {_num(float(b))} s"
        examples.append(f"instance {i}: {chosen.get(i, 0)} routed; running batch mean "
                        f"{_num(q.mean_batch)} (peak {q.peak_batch}); wait queue mean "
                        f"{_num(q.mean_depth)} (peak {q.peak_depth} at {_at(q.peak_us)})"
                        f"{busy_text}")
    policy = _policy(rv.config, "routing")
    if policy == "weighted":
        scorers = _scorers(rv.config)
        against = (" relative to `routing.scorers.prefix-affinity`"
                   if "prefix-affinity" in scorers else "")
        focus = (f"Load imbalance: raise `routing.scorers.queue-depth` or "
                 f"`routing.scorers.load-balance`{against}.",)
    else:
        focus = (f"Load imbalance: `routing.policy` is {policy}: least-loaded or weighted "
                 "spreads requests by load.",)
    return Issue("load_imbalance", "Load imbalance", excess * SEVERITY_WEIGHTS["load_imbalance"],
                 chosen.get(hot, 0), headline, tuple(examples), focus)


def _issue_cache(rv: RunView) -> Issue | None:
    block = int(getattr(rv.config.engine, "block_size_tokens", 16))
    misses = []
    for d in rv.decisions:
        chosen = d.view(d.chosen)
        if chosen is None:
            continue
        top = max(d.views, key=lambda v: (v.cached_blocks, -v.instance))
        if top.cached_blocks > chosen.cached_blocks:
            misses.append((top.cached_blocks - chosen.cached_blocks, d, chosen, top))
    if not misses:
        return None
    lost = sum(m[0] for m in misses)
    prompt = sum(d.input_tokens for d in rv.decisions) or 1
    share = lost * block / prompt
    headline = (f"{len(misses)} of {len(rv.decisions)} requests were routed away from an "
                f"instance holding more of their prompt: {lost} blocks ({lost * block} tokens, "
                f"{_pct(share)} of all routed prompt tokens) that could have been cache hits; "
                f"cache hit rate {_pct(float(rv.metrics.get('cache_hit_rate', 0.0)))}.")
    ranked = sorted(misses, key=lambda m: (-m[0], m[1].time_us, m[1].request_id))[:EXAMPLES]
    examples = tuple(f"{_request_phrase(d)} at {_at(d.time_us)} → {_view_phrase(c)} while "
                     f"{_view_phrase(t)}; {_outcome_phrase(rv, d)}" for _, d, c, t in ranked)
    if _policy(rv.config, "routing") == "weighted":
        weights = _scorers(rv.config)
        now = (f" (now {_num(weights['prefix-affinity'])} of "
               f"{_num(sum(weights.values()))} in all)" if "prefix-affinity" in weights else "")
        focus = (f"Prefix-cache misses: raise `routing.scorers.prefix-affinity`{now}, or add "
                 "`routing.scorers.precise-prefix-cache`, against the load scorers.",)
    else:
        focus = ("Prefix-cache misses: `routing.policy` weighted with "
                 "`routing.scorers.prefix-affinity` keeps shared prefixes on one instance.",)
    return Issue("prefix_cache_misses", "Prefix-cache misses",
                 share * SEVERITY_WEIGHTS["prefix_cache_misses"], len(misses), headline,
                 examples, focus)


def _issue_preemptions(rv: RunView) -> Issue | None:
    recs = rv.by_kind.get("preemption", [])
    if not recs:
        return None
    victims = Counter(int(r["request_id"]) for r in recs)
    lost = sum(int(r["tokens_lost"]) for r in recs)
    most, times = min(victims.items(), key=lambda kv: (-kv[1], kv[0]))
    policy = str(getattr(rv.config.engine, "preemption_policy", recs[0]["policy"]))
    headline = (f"{len(recs)} preemptions (metrics preemption_count "
                f"{rv.metrics.get('preemption_count', '?')}) of {len(victims)} distinct requests, "
                f"{lost} tokens of progress lost; per instance: "
                f"{_per_instance(Counter(int(r['instance']) for r in recs))}; policy {policy}; "
                f"most preempted: request {most} ({times}×).")
    ranked = sorted(recs, key=lambda r: (-int(r["tokens_lost"]), r["time_us"], r["request_id"]))
    examples = tuple(f"request {r['request_id']} on inst {r['instance']} at {_at(r['time_us'])} "
                     f"lost {r['tokens_lost']} tokens: {r['reason']}"
                     for r in ranked[:EXAMPLES])
    kv = ("`routing.scorers.kv-utilization`" if _policy(rv.config, "routing") == "weighted"
          else "`routing.policy` weighted with `routing.scorers.kv-utilization`")
    focus = (f"Preemptions (KV pressure): `engine.preemption_policy` (now {policy}; priority "
             f"evicts the least urgent), a CPU tier `engine.kv_cpu_blocks`, {kv} to spread KV "
             "use, or admission control (`admission.policy`); capacity settings "
             "`engine.max_num_running_reqs`, `engine.total_kv_blocks`.",)
    share = len(victims) / max(1, len(rv.first_decision) or len(victims))
    return Issue("preemptions", "Preemptions", share * SEVERITY_WEIGHTS["preemptions"],
                 len(recs), headline, examples, focus)


def _anomalies(rv: RunView, kind: str) -> list[dict]:
    return [a for a in rv.by_kind.get("anomaly", []) if a["type"] == kind]


def _by_severity(recs: list[dict]) -> list[dict]:
    return sorted(recs, key=lambda a: (-float(a["severity"]), a["time_us"],
                                       tuple(a["requests"]), tuple(a["instances"])))


def _issue_inversions(rv: RunView) -> Issue | None:
    recs = _anomalies(rv, "priority_inversion")
    if not recs:
        return None
    total = sum(int(a["count"]) for a in recs)
    instances = Counter(i for a in recs for i in a["instances"])
    headline = (f"{total} priority inversions (metrics priority_inversions "
                f"{rv.metrics.get('priority_inversions', '?')}): {len(recs)} requests were "
                f"overtaken by later arrivals of their SLO class that finished in under half "
                f"their E2E; per instance: {_per_instance(instances)}.")
    examples = tuple(f"at {_at(a['time_us'])}: {a['description']}; overtaken by requests "
                     f"{_ids(a['requests'][1:], 3)}" for a in _by_severity(recs)[:EXAMPLES])
    sched, prio = _policy(rv.config, "scheduler"), _policy(rv.config, "priority")
    focus = (f"Priority inversions: `scheduler.policy` is {sched} with `priority.policy` "
             f"{prio}: age the scores (`priority.policy` slo-based, `priority.age_weight`) or "
             "order by arrival (`scheduler.policy` fcfs).",)
    completed = max(1, int(rv.metrics.get("completed_requests", 0)))
    return Issue("priority_inversions", "Priority inversions",
                 len(recs) / completed * SEVERITY_WEIGHTS["priority_inversions"], total,
                 headline, examples, focus)


def _issue_hol(rv: RunView) -> Issue | None:
    recs = _anomalies(rv, "hol_blocking")
    if not recs:
        return None
    headline = (f"{len(recs)} instance(s) with head-of-line blocking (metrics "
                f"hol_blocking_instances {rv.metrics.get('hol_blocking_instances', '?')}): "
                f"instances {_ids(sorted(i for a in recs for i in a['instances']))}.")
    examples = tuple(a["description"] + (f"; longest waits: requests {_ids(a['requests'], 3)}"
                                         if a["requests"] else "")
                     for a in _by_severity(recs)[:EXAMPLES])
    spread = _spread_knob(rv.config)
    focus = tuple(f for f in (
        *(_pd_focus(rv, i) for a in recs for i in a["instances"]),
        "HOL blocking: `scheduler.policy` sjf lets short prompts pass long ones"
        + (f"; {spread} steers new requests away from long queues." if spread else "."))
        if f is not None)
    n = max(1, len(rv.metrics.get("instances", {})) or rv.config.cluster.num_instances)
    return Issue("hol_blocking", "HOL blocking", len(recs) / n * SEVERITY_WEIGHTS["hol_blocking"],
                 len(recs), headline, examples, focus)


def _issue_thrashing(rv: RunView) -> Issue | None:
    recs = _anomalies(rv, "kv_thrashing")
    if not recs:
        return None
    blocks = sum(int(a["count"]) for a in recs)
    per = Counter(i for a in recs for i in a["instances"])
    headline = (f"KV thrashing in {len(recs)} steps: {blocks} blocks reloaded from the CPU tier "
                f"soon after their GPU copies were evicted; per instance: {_per_instance(per)}.")
    examples = tuple(f"at {_at(a['time_us'])}: {a['description']}; requests "
                     f"{_ids(a['requests'], 3)}" for a in _by_severity(recs)[:EXAMPLES])
    focus = ("KV thrashing: a larger CPU tier `engine.kv_cpu_blocks`, or "
             "`routing.scorers.prefix-affinity` so that each prefix lives on fewer instances.",)
    share = min(1.0, len(recs) / max(1, len(rv.first_decision)))
    return Issue("kv_thrashing", "KV thrashing", share * SEVERITY_WEIGHTS["kv_thrashing"], blocks,
                 headline, examples, focus)


def _issue_oscillations(rv: RunView) -> Issue | None:
    recs = _anomalies(rv, "scale_oscillation")
    if not recs:
        return None
    actuations = len(rv.by_kind.get("scale_actuation", []))
    auto = rv.metrics.get("autoscaling", {})
    headline = (f"{len(recs)} scale oscillations (metrics "
                f"{auto.get('scale_oscillations', '?')}) in {actuations} actuations: the "
                "autoscaler reversed direction within its cooldown.")
    examples = tuple(f"at {_at(a['time_us'])}: {a['description']} (instances "
                     f"{_ids(a['instances'])})"
                     for a in sorted(recs, key=lambda a: a["time_us"])[:EXAMPLES])
    cooldown = getattr(rv.config.policy.autoscaler, "cooldown_us", 0)
    focus = [f"Scale oscillations: raise `autoscaler.cooldown_us` (now {_dur(int(cooldown))})"]
    if _policy(rv.config, "autoscaler") == "queue-depth":
        focus[0] += " or move `autoscaler.target_queue_depth` away from the load's edge"
    focus[0] += "."
    share = len(recs) / max(1, actuations)
    return Issue("scale_oscillations", "Scale oscillations",
                 share * SEVERITY_WEIGHTS["scale_oscillations"], len(recs), headline, examples,
                 tuple(focus))


def _issue_admission(rv: RunView) -> Issue | None:
    recs = [a for a in rv.by_kind.get("admission", []) if not a["admitted"]]
    if not recs:
        return None
    total = len(rv.by_kind.get("admission", []))
    reasons = Counter(str(a["reason"]) for a in recs)
    headline = (f"{len(recs)} of {total} requests rejected at admission (metrics "
                f"rejected_requests {rv.metrics.get('rejected_requests', '?')}), from "
                f"{_at(recs[0]['time_us'])} to {_at(recs[-1]['time_us'])}; reasons: "
                + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) + ".")
    examples = []
    for a in _spread(recs, EXAMPLES):
        row = rv.rows.get(int(a["request_id"]))
        who = f" ({row['slo_class'] or 'default'}, tenant {row['tenant']!r})" if row else ""
        examples.append(f"request {a['request_id']}{who} rejected at {_at(a['time_us'])}")
    return Issue("admission_rejections", "Admission rejections",
                 len(recs) / max(1, total) * SEVERITY_WEIGHTS["admission_rejections"], len(recs),
                 headline, tuple(examples), (_admission_focus(rv.config),))


def _issue_routing_rejections(rv: RunView) -> Issue | None:
    recs = rv.by_kind.get("routing_rejection", [])
    if not recs:
        return None
    total = len(recs) + len(rv.first_decision)
    headline = (f"{len(recs)} requests found no routable instance (metrics rejected_routing "
                f"{rv.metrics.get('rejected_routing', '?')}), from {_at(recs[0]['time_us'])} to "
                f"{_at(recs[-1]['time_us'])}.")
    examples = tuple(f"request {r['request_id']} at {_at(r['time_us'])}: {r['reason']}"
                     for r in _spread(recs, EXAMPLES))
    if _has_autoscaler(rv.config):
        focus = ("Routing rejections: keep instances routable with `autoscaler.min_replicas` "
                 f"(now {rv.config.policy.autoscaler.min_replicas}).",)
    else:
        focus = ("Routing rejections: no instance was routable (lifecycles): more instances "
                 "(`cluster.num_instances`).",)
    return Issue("routing_rejections", "Routing rejections",
                 len(recs) / max(1, total) * SEVERITY_WEIGHTS["routing_rejections"], len(recs),
                 headline, examples, focus)


def _issue_queueing(rv: RunView) -> Issue | None:
    targets = _slo_targets(rv.config)
    waits = [(_wait_us(rv, d), d) for d in rv.first_decision.values()]
    done = sorted(w for w, _ in waits if w >= 0)
    long = [(w, d) for w, d in waits if w > _limits_us(rv, d)[0]]  # its first-token limit
    if not long:
        return None
    if targets:
        limits = ", ".join(f"{k} {_ms(float(v.ttft_ms))}" for k, v in sorted(targets.items())
                           if v.ttft_ms > 0)
        over = f"their class's TTFT target ({limits}; else {_dur(LONG_WAIT_US)})"
    else:
        over = _dur(LONG_WAIT_US)
    peaks = sorted(rv.queues.values(), key=lambda q: (-q.peak_depth, q.instance))[:3]
    headline = (f"{len(long)} of {len(waits)} routed requests waited longer than {over} from "
                f"routing to their first batch (wait p50 {_dur(_quantile(done, 0.5))}, p99 "
                f"{_dur(_quantile(done, 0.99))}, max {_dur(done[-1] if done else 0)}); peak "
                "wait queues: " + ", ".join(f"inst {q.instance} {q.peak_depth} at "
                                            f"{_at(q.peak_us)}" for q in peaks) + ".")
    ranked = sorted(long, key=lambda wd: (-wd[0], wd[1].time_us, wd[1].request_id))
    examples = []
    for w, d in ranked[:EXAMPLES]:
        v = d.view(d.chosen)
        seen = f" (queue {v.queue_depth}, batch {v.batch_size} at routing)" if v else ""
        examples.append(f"{_request_phrase(d)} routed at {_at(d.time_us)} to inst "
                        f"{d.chosen}{seen} waited {_dur(w)} for its first batch")
    share = len(long) / max(1, len(waits))
    return Issue("long_queueing", "Long queueing", share * SEVERITY_WEIGHTS["long_queueing"],
                 len(long), headline, tuple(examples), (_queueing_focus(rv),))


def _issue_lost(rv: RunView) -> Issue | None:
    m = rv.metrics
    timed_out, dropped = int(m.get("timed_out_requests", 0)), int(m.get("dropped_unservable", 0))
    unfinished = int(m.get("still_queued", 0)) + int(m.get("still_running", 0))
    lost = timed_out + dropped + unfinished
    if lost == 0:
        return None
    injected = max(1, int(m.get("injected_requests", 0)))
    headline = (f"{timed_out} timed out, {dropped} dropped as unservable, {unfinished} "
                f"unfinished at the horizon, of {injected} injected ({_pct(lost / injected)}).")
    examples = []
    for status in ("timed-out", "dropped", "unfinished"):
        ids = [rid for rid, row in sorted(rv.rows.items()) if row.get("status") == status]
        if ids:
            examples.append(f"{status}: requests {_ids(ids)}")
    if not rv.rows:
        examples.append("(request ids need per-request rows: the trace records no timeouts)")
    focus = (_capacity_focus(rv, "Lost requests"),)
    return Issue("lost_requests", "Timeouts, drops, unfinished",
                 lost / injected * SEVERITY_WEIGHTS["lost_requests"], lost, headline,
                 tuple(examples), focus)


#: Every detector, each ``RunView -> Issue | None``.
DETECTORS: tuple[Callable[[RunView], Issue | None], ...] = (
    _issue_lost, _issue_admission, _issue_routing_rejections, _issue_queueing,
    _issue_preemptions, _issue_inversions, _issue_hol, _issue_thrashing, _issue_oscillations,
    _issue_imbalance, _issue_cache, _issue_regret,
)


def detect_issues(rv: RunView) -> list[Issue]:
    """The run's issues, most severe first (ties by key)."""
    found = [i for i in (detect(rv) for detect in DETECTORS) if i is not None]
    return sorted(found, key=lambda i: (-i.severity, i.key))
