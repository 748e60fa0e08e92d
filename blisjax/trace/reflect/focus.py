"""What the suggestions may name and the rules that word them.

``KNOBS`` and ``SETTINGS`` are the configuration names a suggestion may name; ``_policy``,
``_scorers``, ``_has_autoscaler``, ``_has_pd`` and ``_slo_targets`` read the run's configuration
as the suggestions (and the other sections) talk about it; the ``*_focus`` rules turn what a
detector or the SLO attainment found into a suggestion line naming those knobs in backticks.
"""

from __future__ import annotations

from typing import Any

from blisjax.trace.reflect.formats import _num, _pct
from blisjax.trace.reflect.runview import RunView

# ---- the names ----------------------------------------------------------------------------------

#: Per-lane knobs (``blisjax.engine.population.set_knob`` names) the suggestions may name; the
#: autoscaler's only when the run has one, the P/D pools' only when it has pools.
KNOBS: frozenset[str] = frozenset({
    "routing.policy", "routing.scorers.queue-depth", "routing.scorers.load-balance",
    "routing.scorers.prefix-affinity", "routing.scorers.precise-prefix-cache",
    "routing.scorers.kv-utilization", "scheduler.policy", "priority.policy",
    "priority.age_weight", "admission.policy", "admission.token_bucket_capacity",
    "admission.token_bucket_refill_rate", "admission.rate_limit_rps",
    "admission.rate_limit_burst", "admission.tenant_max_in_flight",
    "admission.default_tenant_max_in_flight", "engine.preemption_policy", "engine.kv_cpu_blocks",
    "engine.max_num_running_reqs", "engine.max_num_scheduled_tokens",
    "engine.long_prefill_token_threshold", "engine.total_kv_blocks",
    "autoscaler.cooldown_us", "autoscaler.target_queue_depth", "autoscaler.min_replicas",
    "autoscaler.max_replicas", "autoscaler.interval_us", "cluster.pd.split",
    "cluster.pd.prefix_threshold_tokens",
})

#: Configuration fields the suggestions may name that are not per-lane knobs (they change the
#: program's shapes: sweep them across separate runs).
SETTINGS: frozenset[str] = frozenset({
    "cluster.num_instances",
})

# ---- the run's configuration --------------------------------------------------------------------


def _policy(cfg: Any, section: str) -> str:
    return str(getattr(getattr(cfg.policy, section), "policy", "?"))


def _scorers(cfg: Any) -> dict[str, float]:
    return {s.name: float(s.weight) for s in cfg.policy.routing.scorers}


def _has_autoscaler(cfg: Any) -> bool:
    return _policy(cfg, "autoscaler") != "none"


def _has_pd(cfg: Any) -> bool:
    return bool(getattr(cfg.cluster.pd, "enabled", False))


def _slo_targets(cfg: Any) -> dict[str, Any]:
    return dict(getattr(cfg.metrics, "slo_targets", ()) or ())


# ---- the rules ----------------------------------------------------------------------------------


def _spread_knob(cfg: Any) -> str:
    """The knob that spreads load under the run's routing policy ("" when it already does)."""
    policy = _policy(cfg, "routing")
    if policy == "weighted":
        return "`routing.scorers.queue-depth`"
    return "" if policy == "least-loaded" else "`routing.policy` least-loaded"


def _dimension_focus(cfg: Any, dim: str) -> str:
    """The levers of an SLO dimension."""
    spread = _spread_knob(cfg)
    spread = f"{spread}, " if spread else ""
    if dim == "ttft":
        return (f"TTFT = queueing + prefill: {spread}`scheduler.policy`, or favour the class "
                "(`priority.policy` slo-class, `scheduler.policy` priority-fcfs)")
    if dim == "itl":
        return ("ITL grows when prefill chunks share steps with decodes: "
                "`engine.long_prefill_token_threshold`, `engine.max_num_scheduled_tokens`")
    return (f"E2E = queueing + decoding in crowded batches: {spread}`priority.policy`, "
            "`engine.max_num_running_reqs`")


def _slo_focus(rv: RunView) -> list[tuple[float, str]]:
    """(severity, line) per SLO dimension that some class missed: the classes, their
    attainment of it, and the levers; severity = (1 − worst attainment) × 2, so that a missed
    objective ranks with the issues that may explain it."""
    att = rv.metrics.get("slo_attainment", {}).get("per_class", {})
    missed: dict[str, list[tuple[float, str]]] = {}
    for name in sorted(att):
        for dim in ("ttft", "itl", "e2e"):
            met = att[name].get(f"{dim}_attainment")
            if met is not None and float(met) < 1.0:
                missed.setdefault(dim, []).append((float(met), name))
    out = []
    for dim in ("ttft", "itl", "e2e"):
        if dim in missed:
            classes = ", ".join(f"{n} {_pct(m)}" for m, n in missed[dim])
            worst = min(m for m, _ in missed[dim])
            out.append(((1.0 - worst) * 2.0, f"SLO {dim.upper()} met by: {classes} of completed "
                        f"requests. {_dimension_focus(rv.config, dim)}."))
    return out


def _admission_focus(cfg: Any) -> str:
    policy = _policy(cfg, "admission")
    knobs = {"token-bucket": "`admission.token_bucket_capacity` (input tokens) and "
                             "`admission.token_bucket_refill_rate` (tokens/s)",
             "rate-limit": "`admission.rate_limit_rps` and `admission.rate_limit_burst`",
             "tenant-quota": "`admission.tenant_max_in_flight` and "
                             "`admission.default_tenant_max_in_flight`"}
    if policy in knobs:
        return f"Admission rejections: loosen {knobs[policy]}, or change `admission.policy`."
    return f"Admission rejections: `admission.policy` is {policy}."


def _capacity_focus(rv: RunView, title: str) -> str:
    if _has_autoscaler(rv.config):
        a = rv.config.policy.autoscaler
        return (f"{title}: scale out sooner: a lower `autoscaler.target_queue_depth` (now "
                f"{_num(float(a.target_queue_depth))}), a higher `autoscaler.max_replicas` (now "
                f"{a.max_replicas}) or a shorter `autoscaler.interval_us`.")
    return (f"{title}: the cluster is short of capacity: shed or shape load "
            "(`admission.policy`), serve short prompts first (`scheduler.policy` sjf), or "
            "add instances (`cluster.num_instances`).")


def _prefill_pool(rv: RunView) -> frozenset[int]:
    """P/D: the instances the prefill pool routed among (empty without P/D)."""
    return frozenset(v.instance for d in rv.decisions if d.prefill for v in d.views)


def _pd_focus(rv: RunView, instance: int) -> str | None:
    """P/D: when ``instance`` prefills, the pool split and the decider are the levers (one
    line whichever issue asks, so that the suggestions list it once)."""
    pool = _prefill_pool(rv)
    if instance not in pool or not _has_pd(rv.config):
        return None
    pd = rv.config.cluster.pd
    return (f"Prefill pool: inst {instance} queues prefills ({len(pool)} instance(s)): more "
            f"prefill instances (`cluster.pd.split`, now {len(pool)}) or fewer disaggregated "
            f"prompts (a higher `cluster.pd.prefix_threshold_tokens`, now "
            f"{pd.prefix_threshold_tokens} tokens, with decider {pd.decider}).")


def _queueing_focus(rv: RunView) -> str:
    """Queues on one instance call for routing (or, on a P/D prefill instance, for the pool
    split); queues everywhere for capacity."""
    seen = {v.instance for d in rv.decisions for v in d.views} | set(rv.queues)
    if len(seen) >= 2 and rv.queues:
        top = min(rv.queues.values(), key=lambda q: (-q.mean_depth, q.instance))
        # Instances that never stepped had empty queues.
        rest = [rv.queues[i].mean_depth if i in rv.queues else 0.0
                for i in sorted(seen) if i != top.instance]
        if top.mean_depth > 2.0 * (sum(rest) / len(rest)) + 1.0:
            pd = _pd_focus(rv, top.instance)
            if pd is not None:
                return pd
            spread = _spread_knob(rv.config) or "`routing.policy`"
            return (f"Long queueing: the queue is on inst {top.instance} (mean "
                    f"{_num(top.mean_depth)} waiting per step, others "
                    f"{_num(sum(rest) / len(rest))}): spread the load ({spread}) before adding "
                    "capacity.")
    return _capacity_focus(rv, "Long queueing")
