"""Policy knobs as arrays: one ``PolicyParams`` per lane, stacked along axis 0 for populations.

Every template choice is an integer code and every knob a float64/int32 array, so a population
can mix templates and values freely; the kernel evaluates the chosen template per lane.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from blisjax.config.sim import (
    ADMISSION_POLICIES,
    PREEMPTION_POLICIES,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    SCHEDULER_POLICIES,
    SCORER_NAMES,
)
from blisjax.workload.types import SLO_CLASSES


@chex.dataclass(frozen=True)
class PolicyParams:
    """Knobs of one lane (shapes without the population axis).

    admission: code into ADMISSION_POLICIES; token bucket (capacity in tokens, refill tokens/s);
      rate limit (burst requests, requests/s); tenant_quota[T] max in-flight per tenant.
    priority: code into PRIORITY_POLICIES; age_weight; class_score[6] by SLO class code;
      tenant_score[T]; no_deadline_score (= -no_deadline_slack_s).
    routing: code into ROUTING_POLICIES; scorer_order[4] scorer codes (SCORER_NAMES) in
      configuration order, padded with -1; scorer_weight[4] raw weights in the same order;
      prefix_index_on: the prefix-affinity observer is active.
    scheduler: code into SCHEDULER_POLICIES; preemption: code into PREEMPTION_POLICIES.
    """

    admission: chex.Array
    tb_capacity: chex.Array
    tb_rate: chex.Array
    rl_burst: chex.Array
    rl_rate: chex.Array
    tenant_quota: chex.Array
    priority: chex.Array
    age_weight: chex.Array
    class_score: chex.Array
    tenant_score: chex.Array
    no_deadline_score: chex.Array
    routing: chex.Array
    scorer_order: chex.Array
    scorer_weight: chex.Array
    prefix_index_on: chex.Array
    scheduler: chex.Array
    preemption: chex.Array


def params_from_config(cfg, tenant_names: tuple[str, ...]) -> PolicyParams:
    """Knobs of ``cfg`` (a ``SimConfig``) as arrays; tenants follow the workload's codes."""
    pol = cfg.policy
    adm, pri, rt = pol.admission, pol.priority, pol.routing
    quota = dict(adm.tenant_max_in_flight)
    cls = dict(pri.slo_class_scores)
    ten = dict(pri.tenant_scores)
    names = [s.name for s in rt.scorers]
    order = [SCORER_NAMES.index(n) for n in names] + [-1] * (4 - len(names))
    weights = [float(s.weight) for s in rt.scorers] + [0.0] * (4 - len(names))
    f64 = lambda x: jnp.asarray(x, dtype=jnp.float64)  # noqa: E731
    i32 = lambda x: jnp.asarray(x, dtype=jnp.int32)  # noqa: E731
    return PolicyParams(
        admission=i32(ADMISSION_POLICIES.index(adm.policy)),
        tb_capacity=f64(adm.token_bucket_capacity), tb_rate=f64(adm.token_bucket_refill_rate),
        rl_burst=f64(adm.rate_limit_burst), rl_rate=f64(adm.rate_limit_rps),
        tenant_quota=i32([quota.get(t, adm.default_tenant_max_in_flight) for t in tenant_names]),
        priority=i32(PRIORITY_POLICIES.index(pri.policy)),
        age_weight=f64(pri.age_weight),
        class_score=f64([float(cls.get(c, cls.get("", 0.0))) for c in SLO_CLASSES]),
        tenant_score=f64([float(ten.get(t, pri.default_tenant_score)) for t in tenant_names]),
        no_deadline_score=f64(-float(pri.no_deadline_slack_s)),
        routing=i32(ROUTING_POLICIES.index(rt.policy)),
        scorer_order=i32(order), scorer_weight=f64(weights),
        prefix_index_on=jnp.asarray(rt.policy == "weighted" and "prefix-affinity" in names),
        scheduler=i32(SCHEDULER_POLICIES.index(pol.scheduler.policy)),
        preemption=i32(PREEMPTION_POLICIES.index(cfg.engine.preemption_policy)),
    )


def stack_params(params: list[PolicyParams]) -> PolicyParams:
    """Stack per-lane params along a new leading population axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)


def lane(params: PolicyParams, k: int) -> PolicyParams:
    """The k-th lane of a stacked population."""
    return jax.tree_util.tree_map(lambda x: x[k], params)
