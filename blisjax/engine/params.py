"""Policy knobs as arrays: one ``PolicyParams`` per lane, stacked along axis 0 for populations.

Every template choice is an integer code and every knob a float64/int32 array, so a population
can mix templates and values freely; the kernel evaluates the chosen template per lane.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from blisjax.config.codes import (
    AdmissionPolicy,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
)

#: Scorer slots per lane: every scorer at most once, in configuration order.
MAX_SCORERS = len(Scorer)


@chex.dataclass(frozen=True)
class PolicyParams:
    """Knobs of one lane (shapes without the population axis).

    admission: ``AdmissionPolicy`` code; token bucket (capacity in tokens, refill tokens/s);
      rate limit (burst requests, requests/s); tenant_quota[T] max in-flight per tenant.
    priority: ``PriorityPolicy`` code; age_weight; class_score[6] by SLO class code;
      tenant_score[T]; no_deadline_score (= -no_deadline_slack_s).
    routing: ``RoutingPolicy`` code; scorer_order[4] ``Scorer`` codes in configuration
      order, padded with -1; scorer_weight[4] raw weights in the same order;
      prefix_index_on: the prefix-affinity observer is active.
    scheduler: ``SchedulerPolicy`` code; preemption: ``PreemptionPolicy`` code.
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
    scorers = [Scorer.of(w.name) for w in rt.scorers]
    padding = MAX_SCORERS - len(scorers)
    order = [int(code) for code in scorers] + [-1] * padding
    weights = [float(w.weight) for w in rt.scorers] + [0.0] * padding
    f64 = lambda x: jnp.asarray(x, dtype=jnp.float64)  # noqa: E731
    i32 = lambda x: jnp.asarray(x, dtype=jnp.int32)  # noqa: E731
    routing = RoutingPolicy.of(rt.policy)
    return PolicyParams(
        admission=i32(AdmissionPolicy.of(adm.policy)),
        tb_capacity=f64(adm.token_bucket_capacity), tb_rate=f64(adm.token_bucket_refill_rate),
        rl_burst=f64(adm.rate_limit_burst), rl_rate=f64(adm.rate_limit_rps),
        tenant_quota=i32(adm.max_in_flight_table(tenant_names)),
        priority=i32(PriorityPolicy.of(pri.policy)),
        age_weight=f64(pri.age_weight),
        class_score=f64(pri.slo_class_score_table()),
        tenant_score=f64(pri.tenant_score_table(tenant_names)),
        no_deadline_score=f64(-float(pri.no_deadline_slack_s)),
        routing=i32(routing),
        scorer_order=i32(order), scorer_weight=f64(weights),
        prefix_index_on=jnp.asarray(routing == RoutingPolicy.WEIGHTED
                                    and Scorer.PREFIX_AFFINITY in scorers),
        scheduler=i32(SchedulerPolicy.of(pol.scheduler.policy)),
        preemption=i32(PreemptionPolicy.of(cfg.engine.preemption_policy)),
    )


def stack_params(params: list[PolicyParams]) -> PolicyParams:
    """Stack per-lane params along a new leading population axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)

