"""The sections of the text, each a list of ``Block`` s with priorities for the budget.

Outcome, the issue list and Suggested Focus are in every strategy; Worst Decisions is
``issue_focused``'s, Decision Audit and Other Decisions ``decision_audit``'s, Counterfactuals
and Regret Totals ``counterfactual``'s. Every ranking has a total order (ties by time, then
request id or instance).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from blisjax.trace.reflect.decisions import (
    _alternative,
    _outcome_phrase,
    _outcome_short,
    _regret_rule,
    _request_phrase,
    _view_phrase,
    _view_row,
    _worst,
    _worst_key,
)
from blisjax.trace.reflect.focus import _policy, _scorers, _slo_focus, _slo_targets
from blisjax.trace.reflect.formats import _at, _class_name, _dur, _ms, _num, _pct, _spread
from blisjax.trace.reflect.issues import Issue
from blisjax.trace.reflect.runview import Decision, RunView, View

#: Detail caps: worst decisions, audit sample size (and the worst added to it),
#: counterfactuals, time windows of the regret totals.
WORST = 5
AUDIT_SAMPLE = 12
AUDIT_WORST = 3
COUNTERFACTUALS = 8
WINDOWS = 6

#: Candidates shown per decision besides the chosen one.
ALTERNATIVES = 3


class Block(NamedTuple):
    """Lines of the text at position ``order`` (section, item, ...). Blocks are kept while they
    fit by ascending ``priority`` = (tier, rank): tier 0 is the skeleton, higher tiers detail;
    within a tier, the rank-1 items of every section (the top issue, the worst decision, the
    first suggestion) come before the rank-2 ones, so that a small budget still covers every
    section. A block is kept only when its ``parent`` (an ``order``) was."""

    order: tuple[int, ...]
    priority: tuple[int, int]
    lines: tuple[str, ...]
    parent: tuple[int, ...] | None = None


# ---- outcome ------------------------------------------------------------------------------------


def _slo_lines(rv: RunView) -> list[str]:
    targets = _slo_targets(rv.config)
    if not targets:
        return ["SLO: no targets configured (metrics.slo_targets)."]
    per_class = rv.metrics.get("per_slo_class", {})
    att = rv.metrics.get("slo_attainment", {})
    out = []
    for name in sorted(targets):
        t, m = targets[name], per_class.get(name)
        a = att.get("per_class", {}).get(name, {})
        if m is None:
            out.append(f"SLO {name}: no requests of this class.")
            continue
        parts = []
        for dim, label, stat in (("ttft", "TTFT p99", "ttft_p99_ms"),
                                 ("itl", "ITL mean", "itl_mean_ms"),
                                 ("e2e", "E2E p99", "e2e_p99_ms")):
            target = float(getattr(t, f"{dim}_ms"))
            if target <= 0:
                continue
            value = float(m.get(stat, 0.0))
            mark = "≤" if value <= target else ">"
            ok = "✓" if value <= target else "✗"
            met = a.get(f"{dim}_attainment")
            met_text = "" if met is None else f" ({_pct(met)} met)"
            parts.append(f"{label} {_ms(value)} {mark} {_ms(target)} {ok}{met_text}")
        good, injected = a.get("good", 0), a.get("injected", m.get("injected", 0))
        out.append(f"SLO {name} ({m.get('injected', 0)} req): " + "; ".join(parts)
                   + f"; attainment {_pct(a.get('attainment', 0.0))} ({good}/{injected}).")
    if att:
        out.append(f"SLO attainment overall: {_pct(att.get('overall', 0.0))} "
                   f"({att.get('good', 0)}/{att.get('injected', 0)}).")
    return out


def _instances_text(rv: RunView) -> str:
    auto = rv.metrics.get("autoscaling")
    if auto:
        return (f"{rv.config.cluster.num_instances} instances at first, up to "
                f"{auto.get('peak_replicas', 0)} (autoscaler {_policy(rv.config, 'autoscaler')})")
    return f"{len(rv.metrics.get('instances', {})) or rv.config.cluster.num_instances} instances"


def _k_text(rv: RunView) -> str:
    k = max((len(r.get("candidates") or ()) for r in rv.by_kind.get("routing", [])), default=0)
    return f"counterfactual top-{k}" if k else "no counterfactual (k = 0)"


def _outcome_head(rv: RunView) -> list[str]:
    """The run, its requests' fates, throughput and latencies."""
    m, cfg = rv.metrics, rv.config
    routing = _policy(cfg, "routing")
    if routing == "weighted":
        routing += " (" + ", ".join(f"{k} {_num(w)}" for k, w in _scorers(cfg).items()) + ")"
    unfinished = int(m.get("still_queued", 0)) + int(m.get("still_running", 0))
    head = [
        "## Outcome",
        f"Run: {m.get('injected_requests', 0)} requests over "
        f"{float(m.get('vllm_estimated_duration_s', 0.0)):.2f} s on "
        f"{_instances_text(rv)}; admission "
        f"{_policy(cfg, 'admission')}, priority {_policy(cfg, 'priority')}, routing {routing}, "
        f"scheduler {_policy(cfg, 'scheduler')}; trace: {len(rv.decisions)} routing "
        f"decisions, {_k_text(rv)}.",
        f"Requests: {m.get('completed_requests', 0)} completed, "
        f"{m.get('rejected_requests', 0)} rejected at admission, "
        f"{m.get('rejected_routing', 0)} rejected at routing, "
        f"{m.get('dropped_unservable', 0)} dropped as unservable, "
        f"{m.get('timed_out_requests', 0)} timed out, {unfinished} unfinished.",
        f"Throughput: {_num(float(m.get('responses_per_sec', 0.0)))} req/s, "
        f"{_num(float(m.get('tokens_per_sec', 0.0)))} output tokens/s.",
        f"Latency: TTFT mean {_ms(m.get('ttft_mean_ms', 0.0))}, p90 "
        f"{_ms(m.get('ttft_p90_ms', 0.0))}, p99 {_ms(m.get('ttft_p99_ms', 0.0))}; E2E mean "
        f"{_ms(m.get('e2e_mean_ms', 0.0))}, p99 {_ms(m.get('e2e_p99_ms', 0.0))}; ITL mean "
        f"{_ms(m.get('itl_mean_ms', 0.0))}, p99 {_ms(m.get('itl_p99_ms', 0.0))}; scheduling "
        f"delay p99 {_ms(m.get('scheduling_delay_p99_ms', 0.0))}.",
    ]
    return head


def _outcome_extras(rv: RunView) -> list[str]:
    """Fitness, autoscaling cost and P/D transfers, when the run has them."""
    m, cfg = rv.metrics, rv.config
    extra = []
    if "fitness" in m:
        comps = m.get("fitness_components", {})
        extra.append(f"Fitness {_num(float(m['fitness']))} (components: " + ", ".join(
            f"{k} {_num(float(v))}" for k, v in sorted(comps.items())) + ").")
    auto = m.get("autoscaling")
    if auto:
        extra.append(
            f"Autoscaling: cost {_num(float(auto.get('cost', 0.0)))} (per-hour cost × hours), "
            f"{_num(float(auto.get('replica_seconds', 0.0)))} replica-s, mean "
            f"{_num(float(auto.get('mean_replicas', 0.0)))} / peak {auto.get('peak_replicas', 0)} "
            f"replicas, {auto.get('scale_ups', 0)} scale-ups, {auto.get('scale_downs', 0)} "
            f"scale-downs, {auto.get('scale_oscillations', 0)} oscillations.")
    transfers = rv.by_kind.get("kv_transfer", [])
    if transfers:
        mean_us = sum(int(t["transfer_duration_us"]) for t in transfers) / len(transfers)
        pd = cfg.cluster.pd
        extra.append(f"P/D: {pd.prefill_instances} prefill / {pd.decode_instances} decode / "
                     f"{pd.shared_instances} shared instances, decider {pd.decider}; "
                     f"{len(transfers)} requests disaggregated, KV transfer mean "
                     f"{_dur(int(mean_us))}, prefill/decode load imbalance "
                     f"{_num(float(m.get('pd_load_imbalance', 0.0)))}.")
    return extra


def _outcome_blocks(rv: RunView, section: int) -> list[Block]:
    m = rv.metrics
    blocks = [Block((section, 0), (0, 0), ("", *_outcome_head(rv))),
              Block((section, 1), (0, 1), tuple(_slo_lines(rv)))]
    for j, line in enumerate(_outcome_extras(rv)):
        blocks.append(Block((section, 2 + j), (1, 2 + j), (line,)))
    tenants = m.get("per_tenant", {})
    if len(tenants) > 1:  # one tenant would repeat the cluster's numbers
        blocks.append(Block((section, 8), (2, 2), ("Tenants: " + "; ".join(
            f"{name or '(none)'} {t.get('completed', 0)}/{t.get('injected', 0)} completed, TTFT "
            f"p99 {_ms(t.get('ttft_p99_ms', 0.0))}, E2E p99 {_ms(t.get('e2e_p99_ms', 0.0))}"
            for name, t in sorted(tenants.items())) + ".",)))
    blocks.append(Block((section, 9), (2, 1), (
        f"Cache hit rate {_pct(float(m.get('cache_hit_rate', 0.0)))}, preemptions "
        f"{m.get('preemption_count', 0)}, KV peak {m.get('kv_peak_blocks', 0)} blocks, "
        f"priority inversions {m.get('priority_inversions', 0)}, HOL-blocking instances "
        f"{m.get('hol_blocking_instances', 0)}, Jain fairness "
        f"{_num(float(m.get('jain_fairness', 0.0)))}.",)))
    return blocks


# ---- issues and suggestions ---------------------------------------------------------------------


def _issue_blocks(issues: list[Issue], section: int, with_examples: bool,
                  heading: str) -> list[Block]:
    blocks = [Block((section, 0), (0, 0), ("", heading))]
    if not issues:
        blocks.append(Block((section, 1), (0, 1), ("No issues detected.",)))
    for r, issue in enumerate(issues, start=1):
        tier = 0 if r <= 3 else 1 if r <= 6 else 2
        head = (f"{r}. {issue.title} (severity {issue.severity:.3f}, count {issue.count}): "
                f"{issue.headline}",)
        # Each headline needs the one before it, so a trimmed list has no gaps.
        blocks.append(Block((section, r), (tier, r), head,
                            None if r == 1 else (section, r - 1)))
        if with_examples:
            for j, ex in enumerate(issue.examples):
                blocks.append(Block((section, r, j + 1), (tier + 1 + j, r),
                                    (f"   - e.g. {ex}",), (section, r)))
    return blocks


def _focus_blocks(rv: RunView, issues: list[Issue], section: int) -> list[Block]:
    ranked = sorted([*_slo_focus(rv), *((i.severity, f) for i in issues for f in i.focus)],
                    key=lambda sf: -sf[0])  # stable: SLO lines first on equal severity
    lines: list[str] = []
    for _, line in ranked:
        if line not in lines:
            lines.append(line)
    if not lines:
        lines = ["Nothing stands out: try a cheaper configuration (fewer instances, a lighter "
                 "`routing.policy`) or a heavier workload to find the limits."]
    blocks = [Block((section, 0), (0, 0), ("", "## Suggested Focus"))]
    for j, line in enumerate(lines):
        # The first suggestions outrank every example: they are what the reader acts on.
        tier = 0 if j < 4 else 1 if j < 6 else 2
        blocks.append(Block((section, j + 1), (tier, j + 1), (f"- {line}",),
                            None if j == 0 else (section, j)))
    return blocks


# ---- worst decisions ----------------------------------------------------------------------------

_LEGEND = ("   (q = waiting, b = running, f = in flight, kv = KV use, c = prompt blocks cached "
           "there, s = policy score; load = q + b + f)")


def _context_rows(d: Decision) -> tuple[str, ...]:
    """The chosen candidate and up to ``ALTERNATIVES`` others, best first."""
    def rank(v: View) -> tuple:
        return (-(v.score if v.score is not None else -v.load), v.load, v.instance)
    others = sorted((v for v in d.views if v.instance != d.chosen), key=rank)[:ALTERNATIVES]
    chosen = d.view(d.chosen)
    rows = [] if chosen is None else [_view_row(chosen, " ← chosen")]
    best = d.best if d.regret > 0 else -1
    rows += [_view_row(v, " ← best counterfactual" if v.instance == best else "")
             for v in others]
    return tuple(rows)


def _decision_head(d: Decision, with_time: bool = True) -> str:
    pool = "prefill inst" if d.prefill else "instance"
    regret = f"; regret {_num(d.regret)}" if d.regret > 0 else ""
    when = f" at {_at(d.time_us)}" if with_time else ""
    return f"{_request_phrase(d)}{when} → {pool} {d.chosen} by {d.policy}{regret}"


def _worst_basis(rv: RunView) -> str:
    outcome = ("not completed, then more targets missed (class TTFT/E2E, preemption), then by "
               "how far")
    if not rv.rows:
        outcome += ("; without per-request rows, TTFT ≥ routing → first batch and E2E ≥ "
                    "routing → last step")
    if any(d.regret > 0 for d in rv.decisions):
        return f"by regret, then outcome: {outcome}"
    basis = ("regret not recorded (counterfactual k = 0)" if not rv.has_counterfactual
             else "no decision has regret > 0")
    return f"{basis}; by outcome: {outcome}"


def _no_miss_text(rv: RunView) -> str:
    if rv.rows:
        return "no request missed its class's targets"
    return ("no request's trace times (lower bounds of TTFT and E2E without per-request rows) "
            "exceed its class's targets")


def _worst_blocks(rv: RunView, section: int) -> list[Block]:
    worst = _worst(rv, WORST)
    blocks = [Block((section, 0), (0, 0), ("", "## Worst Decisions"))]
    if not worst:
        slowest = sorted(rv.decisions, key=_worst_key(rv))[:1]
        blocks.append(Block((section, 1), (0, 1), (
            f"No decision had regret, and {_no_miss_text(rv)}"
            + ("; the slowest:" if slowest else "."),)))
        for d in slowest:
            blocks.append(Block((section, 2), (1, 1), (
                f"- {_decision_head(d)}", f"   result: {_outcome_phrase(rv, d)}")))
        return blocks
    blocks.append(Block((section, 1), (0, 1), (f"({_worst_basis(rv)})",)))
    blocks.append(Block((section, 2), (1, 1), (_LEGEND,), (section, 1)))
    for r, d in enumerate(worst, start=1):
        tier = 0 if r == 1 else 1 if r <= 3 else 2
        blocks.append(Block((section, 2 + r), (tier, r), (
            f"{r}. {_decision_head(d)}", f"   result: {_outcome_phrase(rv, d)}"),
            None if r == 1 else (section, 1 + r)))
        blocks.append(Block((section, 2 + r, 1), (tier + 1, r),
                            ("   saw:", *_context_rows(d)), (section, 2 + r)))
    return blocks


# ---- decision audit -----------------------------------------------------------------------------


def _audit_line(rv: RunView, d: Decision, n: int) -> tuple[str, ...]:
    """Two lines: the decision with what the chosen and the other candidates offered, and
    its outcome."""
    chosen = d.view(d.chosen)
    others = [v for v in d.views if v.instance != d.chosen]
    pool = "prefill inst" if d.prefill else "inst"
    regret = f", regret {_num(d.regret)}" if d.regret > 0 else ""
    parts = [f"#{d.index + 1}/{n} at {_at(d.time_us)}: request {d.request_id} "
             f"({_class_name(d.slo_class)}, {d.input_tokens} tok) → {pool} {d.chosen}{regret}"]
    if chosen is not None:
        parts.append(f"its load {chosen.load}, cached {chosen.cached_blocks}")
    if others and chosen is not None:
        light = min(others, key=lambda v: (v.load, v.instance))
        parts.append(f"least-loaded other inst {light.instance} (load {light.load})")
        cached = max(others, key=lambda v: (v.cached_blocks, -v.instance))
        if cached.cached_blocks > chosen.cached_blocks:
            parts.append(f"more cached on inst {cached.instance} ({cached.cached_blocks})")
    return (f"- {'; '.join(parts)}", f"   → {_outcome_short(rv, d)}")


def _audit_blocks(rv: RunView, section: int) -> list[Block]:
    n = len(rv.decisions)
    sample = _spread(rv.decisions, AUDIT_SAMPLE)
    worst = _worst(rv, AUDIT_WORST, frozenset(d.index for d in sample))
    # "Up to": a tight budget keeps every other sample, still spread over the whole run.
    intro = (f"Up to {len(sample)} of the {n} routing decisions, spread evenly over the run "
             f"(policy {_policy(rv.config, 'routing')}; load = queued + running + in flight; "
             "cached = prompt blocks cached there; times after routing)")
    blocks = [Block((section, 0), (0, 0), ("", "## Decision Audit", intro + ":"))]
    for j, d in enumerate(sample):
        # Alternate samples are kept first, so a trimmed audit still spans the run evenly.
        tier = 1 if j % 2 == 0 else 2
        blocks.append(Block((section, 1 + j), (tier, 1 + j // 2), _audit_line(rv, d, n)))
    for j, d in enumerate(worst):
        # The heading travels with the first worst decision, so it is never left alone.
        head = (f"The {len(worst)} worst others ({_worst_basis(rv)}):",) if j == 0 else ()
        blocks.append(Block((section, 50 + j), (1 + (j > 0), 1 + j),
                            (*head, *_audit_line(rv, d, n)),
                            None if j == 0 else (section, 50)))
    return blocks


def _other_decision_lines(rv: RunView) -> list[tuple[int, str]]:
    """(tier, line) samples of the other decision kinds, spread over the run."""
    out: list[tuple[int, str]] = []
    for p in _spread(rv.by_kind.get("preemption", []), 3):
        out.append((2, f"- preemption at {_at(p['time_us'])} on inst {p['instance']}: request "
                       f"{p['request_id']} evicted, {p['tokens_lost']} tokens lost "
                       f"({p['reason']})"))
    rejected = [a for a in rv.by_kind.get("admission", []) if not a["admitted"]]
    for a in _spread(rejected, 2):
        out.append((2, f"- admission at {_at(a['time_us'])}: request {a['request_id']} "
                       f"rejected ({a['reason']})"))
    passed = sorted((p for p in rv.by_kind.get("priority", []) if int(p["passed_over"]) > 0),
                    key=lambda p: (-int(p["passed_over"]), p["time_us"], p["instance"]))
    for p in passed[:2]:
        first = p["considered"][0]
        out.append((3, f"- priority order at {_at(p['time_us'])} on inst {p['instance']} "
                       f"({p['policy']}/{p['scheduler']}): request {first['request_id']} "
                       f"(priority {_num(float(first['priority']))}) first, "
                       f"{p['passed_over']} earlier arrivals passed over"))
    for s in _spread([s for s in rv.by_kind.get("scale_decision", []) if s["actuate"]], 3):
        out.append((2, f"- scale decision at {_at(s['time_us'])}: {s['live']} live, queue "
                       f"{s['queue_depth']}, batch {s['batch_size']} → desired "
                       f"{s['desired']:+d}, bounded {s['bounded']:+d}"))
    return out


def _other_blocks(rv: RunView, section: int) -> list[Block]:
    lines = _other_decision_lines(rv)
    first_tier = min((tier for tier, _ in lines), default=0)  # the parent goes first
    blocks = []
    for j, (tier, line) in enumerate(lines):
        head = ("", "## Other Decisions") if j == 0 else ()  # never a heading alone
        blocks.append(Block((section, 1 + j), (first_tier if j == 0 else tier, 1 + j),
                            (*head, line), None if j == 0 else (section, 1)))
    return blocks


# ---- counterfactuals ----------------------------------------------------------------------------


def _counterfactual_line(rv: RunView, d: Decision) -> str | None:
    chosen, alt = d.view(d.chosen), _alternative(d)
    if chosen is None or alt is None:
        return None
    regret = f", regret {_num(d.regret)}" if d.regret > 0 else ""
    return (f"Had {_request_phrase(d)} at {_at(d.time_us)} gone to {_view_phrase(alt)} instead "
            f"of {_view_phrase(chosen)}{regret}: it met {chosen.queue_depth} waiting and "
            f"{chosen.batch_size} running there; {_outcome_phrase(rv, d)}.")


def _counterfactual_blocks(rv: RunView, section: int) -> list[Block]:
    pos = [d for d in rv.decisions if d.regret > 0]
    if pos:
        intro = (f"{len(pos)} of {len(rv.decisions)} decisions have regret > 0 "
                 f"({_regret_rule(pos[0])}), total {_num(sum(d.regret for d in pos))}; the "
                 "highest:")
        pool = sorted(pos, key=_worst_key(rv))
    else:
        why = ("regret was not recorded (counterfactual k = 0)" if not rv.has_counterfactual
               else "no decision has regret > 0: the policy took its best-scored instance")
        pool = _worst(rv, len(rv.decisions))
        which = "requests that missed a target"
        if not pool:  # nothing missed: the slowest still show what the alternatives were
            which = f"{_no_miss_text(rv)}, so the slowest requests"
            pool = sorted(rv.decisions, key=_worst_key(rv))
        intro = (f"{why[0].upper()}{why[1:]}. Below: {which}, against the least-loaded other "
                 "instance or one with more of the prompt cached:")
    blocks = [Block((section, 0), (0, 0), ("", "## Counterfactuals", intro))]
    shown = 0
    for d in pool:
        if shown == COUNTERFACTUALS:
            break
        line = _counterfactual_line(rv, d)
        if line is None:
            continue
        shown += 1
        tier = 0 if shown <= 2 else 1 if shown <= 5 else 2
        blocks.append(Block((section, shown), (tier, shown), (f"- {line}",),
                            None if shown == 1 else (section, shown - 1)))
    if shown == 0:
        blocks.append(Block((section, 1), (0, 1), (
            "- none: no request had a less-loaded or better-cached alternative.",)))
    return blocks


class _Tally(NamedTuple):
    decisions: int
    with_regret: int
    regret: float
    load_gap: int
    cache_gap: int


def _tally(ds: Iterable[Decision]) -> _Tally:
    """Counts and sums over decisions: load gap = chosen load − least load (requests), cache
    gap = most cached − chosen cached (blocks)."""
    n = pos = load_gap = cache_gap = 0
    regret = 0.0
    for d in ds:
        chosen = d.view(d.chosen)
        n += 1
        pos += d.regret > 0
        regret += d.regret
        if chosen is not None:
            load_gap += chosen.load - min(v.load for v in d.views)
            cache_gap += max(v.cached_blocks for v in d.views) - chosen.cached_blocks
    return _Tally(n, pos, regret, load_gap, cache_gap)


def _tally_text(t: _Tally) -> str:
    return (f"{t.decisions} decisions, {t.with_regret} with regret (sum {_num(t.regret)}), load "
            f"gap sum {t.load_gap}, cache gap sum {t.cache_gap} blocks")


def _totals_blocks(rv: RunView, section: int) -> list[Block]:
    """Regret totals by chosen instance and by time window, one block each (a table cut in
    the middle would mislead)."""
    if not rv.decisions:
        return []
    best = Counter(d.best for d in rv.decisions if d.regret > 0)
    rows = []
    for inst in sorted({d.chosen for d in rv.decisions}):
        t = _tally(d for d in rv.decisions if d.chosen == inst)
        passed = f"; passed over as the best {best[inst]}×" if best.get(inst) else ""
        rows.append(f"- chosen inst {inst}: {_tally_text(t)}{passed}")
    blocks = [Block((section, 1), (1, 1), (
        "", "## Regret Totals",
        "(load gap = chosen load − least load, requests; cache gap = most cached − chosen "
        "cached, blocks)", "By instance:", *rows))]
    if len(rv.decisions) >= 4 * WINDOWS:  # fewer would make windows of a handful of decisions
        t0, t1 = rv.decisions[0].time_us, rv.decisions[-1].time_us + 1
        width = -(-(t1 - t0) // WINDOWS)
        rows = []
        for w in range(WINDOWS):
            lo, hi = t0 + w * width, t0 + (w + 1) * width
            t = _tally(d for d in rv.decisions if lo <= d.time_us < hi)
            rows.append(f"- {lo / 1e6:.2f}–{hi / 1e6:.2f} s: {_tally_text(t)}")
        blocks.append(Block((section, 2), (2, 2), ("By time window:", *rows),
                            (section, 1)))
    return blocks
