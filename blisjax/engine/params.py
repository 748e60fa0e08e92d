"""Policy knobs as arrays: one ``PolicyParams`` per lane, stacked along axis 0 for populations.

Every template choice is an integer code and every knob a float64/int32 array, so a population
can mix templates and values freely; the kernel evaluates the chosen template per lane.
"""

from __future__ import annotations

import jax
import numpy as np

from blisjax.config.codes import (
    AdmissionPolicy,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.engine.pytree import pytree_dataclass
from blisjax.gorand import blis_subsystem_rand
from blisjax.reference.kvcache import reload_cost_us

#: Scorer slots per lane: every scorer at most once, in configuration order.
MAX_SCORERS = len(Scorer)


@pytree_dataclass
class PolicyParams:
    """Knobs of one lane (shapes without the population axis).

    admission: ``AdmissionPolicy`` code; token bucket (capacity in tokens, refill tokens/s);
      rate limit (burst requests, requests/s); tenant_quota[T] max in-flight per tenant.
    priority: ``PriorityPolicy`` code; age_weight; class_score[6] by SLO class code;
      tenant_score[T]; no_deadline_score (= -no_deadline_slack_s).
    routing: ``RoutingPolicy`` code; scorer_order[S] ``Scorer`` codes in configuration
      order, padded with -1 (S = ``MAX_SCORERS``); scorer_weight[S] raw weights in the same
      order; prefix_index_on: the prefix-affinity observer is active; tie_break:
      ``TieBreak`` code; router_rng[607]: int64 words of BLIS's "router" stream as seeded
      from the configuration's seed (``blisjax.gorand``), the state ties draw from.
    scheduler: ``SchedulerPolicy`` code; preemption: ``PreemptionPolicy`` code.
    kv_cpu_blocks: the CPU tier's size in blocks per instance (0: none; at most the
      program's ``EngineStatic.cpu_tier_blocks``); kv_reload_us: int64 µs one reloaded block
      adds to its step (``reference.kvcache.reload_cost_us``).
    """

    admission: jax.Array
    tb_capacity: jax.Array
    tb_rate: jax.Array
    rl_burst: jax.Array
    rl_rate: jax.Array
    tenant_quota: jax.Array
    priority: jax.Array
    age_weight: jax.Array
    class_score: jax.Array
    tenant_score: jax.Array
    no_deadline_score: jax.Array
    routing: jax.Array
    scorer_order: jax.Array
    scorer_weight: jax.Array
    prefix_index_on: jax.Array
    tie_break: jax.Array
    router_rng: jax.Array
    kv_cpu_blocks: jax.Array
    kv_reload_us: jax.Array
    scheduler: jax.Array
    preemption: jax.Array


def params_from_config(cfg, tenant_names: tuple[str, ...]) -> PolicyParams:
    """Knobs of ``cfg`` (a ``SimConfig``) as arrays; tenants follow the workload's codes."""
    pol = cfg.policy
    adm, pri, rt = pol.admission, pol.priority, pol.routing
    scorers = [Scorer.of(w.name) for w in rt.scorers]
    padding = MAX_SCORERS - len(scorers)
    order = [int(code) for code in scorers] + [-1] * padding
    weights = [float(w.weight) for w in rt.scorers] + [0.0] * padding
    # Host arrays: converting on the device would compile a program per field.
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
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
        prefix_index_on=np.asarray(routing == RoutingPolicy.WEIGHTED
                                   and Scorer.PREFIX_AFFINITY in scorers),
        tie_break=i32(TieBreak.of(rt.tie_break)),
        router_rng=np.asarray(blis_subsystem_rand(cfg.seed, "router").state().words,
                              dtype=np.int64),
        scheduler=i32(SchedulerPolicy.of(pol.scheduler.policy)),
        preemption=i32(PreemptionPolicy.of(cfg.engine.preemption_policy)),
        kv_cpu_blocks=i32(cfg.engine.kv_cpu_blocks),
        kv_reload_us=np.asarray(reload_cost_us(cfg.engine.block_size_tokens,
                                               cfg.engine.kv_transfer_bandwidth,
                                               cfg.engine.kv_transfer_base_latency_us),
                                dtype=np.int64),
    )


def stack_params(params: list[PolicyParams]) -> PolicyParams:
    """Stack per-lane params along a new leading population axis. Stacked on the host and
    put on the device as they are: ``jnp.stack`` would compile a small program per field
    (~0.15 s in a new process)."""
    return jax.tree_util.tree_map(lambda *xs: jax.device_put(np.stack([np.asarray(x)
                                                                       for x in xs])), *params)

