"""Policy knobs as arrays: one ``PolicyParams`` per lane, stacked along axis 0 for populations.

Every template choice is an integer code and every knob a float64/int32 array, so a population
can mix templates and values freely; the kernel evaluates the chosen template per lane.
"""

from __future__ import annotations

import jax
import numpy as np

from blisjax.config.codes import (
    AdmissionPolicy,
    PDDecider,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SaturationDetector,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.config.hardware import hardware_code
from blisjax.engine.lifecycle import lifecycle_params
from blisjax.engine.pytree import pytree_dataclass
from blisjax.gorand import blis_subsystem_rand
from blisjax.program import bytecode as program_code
from blisjax.program.observables import scorer_name
from blisjax.rules import instance_roles, reload_cost_us

#: Scorer slots per lane: every scorer at most once, in configuration order.
MAX_SCORERS = len(Scorer)


@pytree_dataclass
class PolicyParams:
    """Knobs of one lane (shapes without the population axis).

    admission: ``AdmissionPolicy`` code; token bucket (capacity in tokens, refill tokens/s);
      rate limit (burst requests, requests/s); tenant_quota[T] max in-flight per tenant;
      shed_queue, shed_kv: load-shed's limits on queued requests and mean KV use (0: none);
      tt_capacity[T], tt_rate[T]: tenant-bucket's per-tenant bucket size and refill.
    priority: ``PriorityPolicy`` code; age_weight; class_score[6] by SLO class code;
      tenant_score[T]; no_deadline_score (= -no_deadline_slack_s).
    routing: ``RoutingPolicy`` code; scorer_order[S] ``Scorer`` codes in configuration
      order, padded with -1 (S = ``MAX_SCORERS``); scorer_weight[S] raw weights in the same
      order; prefix_index_on: the prefix-affinity observer is active; tie_break:
      ``TieBreak`` code; router_rng[607]: int64 words of BLIS's "router" stream as seeded
      from the configuration's seed (``blisjax.gorand``), the state ties draw from.
    scheduler: ``SchedulerPolicy`` code; preemption: ``PreemptionPolicy`` code.
    Policy programs (``policy.<site>.policy: program``; read only by programs that compile
    the site's interpreter in, ``EngineStatic.program_sites``): routing_program,
    admission_program, priority_program — each a ``blisjax.program.Bytecode`` of
    ``MAX_PROGRAM_LENGTH`` instructions, its parameters bound (a site without a program holds
    one unused instruction); program_lru: the routing program reads no-hit-lru's scorer, so
    its cold requests' targets are recorded (``prefix_index_on`` likewise covers a program
    reading prefix-affinity's).
    active_instances: the instances the lane's cluster has (``cluster.num_instances``), the
      program's first ones; the router never picks the others. Read only by programs built
      with ``sized_lanes`` (``EngineStatic.sized_lanes``), which need no lifecycle or pools.
    gpu: the lane's GPU type (``hardware``), ``blisjax.config.hardware.hardware_code``: the row
      of the latency tables it reads (only programs with per-lane GPU types,
      ``EngineStatic.gpus``, read it).
    kv_cpu_blocks: the CPU tier's size in blocks per instance (0: none; at most the
      program's ``EngineStatic.cpu_tier_blocks``); kv_reload_us: int64 µs one reloaded block
      adds to its step (``blisjax.rules.reload_cost_us``).
    P/D pools (``cluster.pd``; read only by programs with pools, ``EngineStatic.pd``):
      pd_pools: the lane has pools (else it serves co-located: every instance shared,
      decider never, and its results have no P/D counters, as the reference's);
      pd_role[I] ``PDRole`` code of each instance (the lane's split); pd_decider
      ``PDDecider`` code; pd_threshold tokens; pd_base_us float64 µs of each transfer's base
      latency; pd_bandwidth float64 bytes/µs; pd_contention: transfers share the bandwidth;
      per pool (``POOL_DECODE``, ``POOL_PREFILL``): pd_pool_own — it routes with its own
      weighted scorers pd_pool_order[S] / pd_pool_weight[S] and random stream
      pd_pool_rng[607] ("decode-router" / "prefill-router"), else with the lane's routing.
    Instance lifecycles (``policy.autoscaler``, ``cluster.lifecycle``, ``cluster.node_pools``;
    read only by programs with lifecycles, ``EngineStatic.lifecycle``): ``life_on`` the lane
    models them (else its results are a fixed cluster's, as the reference's); ``as_*`` the
    autoscaler's knobs (``AutoscalerPolicy`` and ``DrainPolicy`` codes, thresholds, windows
    and intervals in µs, replica bounds, its actuation delays drawn in stream order,
    ``DELAY_DRAWS`` of them); ``life_*`` the lifecycle's (loading and node-provisioning delays
    drawn likewise, warm-up, cost) and the node pools' (GPUs and nodes per pool, cost,
    variant; variants' costs and cost order) — ``engine.lifecycle.lifecycle_params``.
    The gateway queue (``cluster.gateway``; read only by programs with flow control,
    ``EngineStatic.gateway``): gw_on the lane has flow control; gw_detector
    ``SaturationDetector`` code, its thresholds gw_qd_threshold, gw_kv_threshold (float64)
    and gw_max_conc; gw_by_band dispatches by SLO-class band (``priority`` order, or fifo
    under ``compat.blis_quirks``: BLIS's gated dispatch); gw_max_depth (0: unlimited);
    gw_tick_us the dispatch tick period.
    """

    admission: jax.Array
    tb_capacity: jax.Array
    tb_rate: jax.Array
    rl_burst: jax.Array
    rl_rate: jax.Array
    tenant_quota: jax.Array
    shed_queue: jax.Array
    shed_kv: jax.Array
    tt_capacity: jax.Array
    tt_rate: jax.Array
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
    active_instances: jax.Array
    gpu: jax.Array
    kv_cpu_blocks: jax.Array
    kv_reload_us: jax.Array
    scheduler: jax.Array
    preemption: jax.Array
    routing_program: program_code.Bytecode
    admission_program: program_code.Bytecode
    priority_program: program_code.Bytecode
    program_lru: jax.Array
    pd_pools: jax.Array
    pd_role: jax.Array
    pd_decider: jax.Array
    pd_threshold: jax.Array
    pd_base_us: jax.Array
    pd_bandwidth: jax.Array
    pd_contention: jax.Array
    pd_pool_own: jax.Array
    pd_pool_order: jax.Array
    pd_pool_weight: jax.Array
    pd_pool_rng: jax.Array
    life_on: jax.Array
    as_policy: jax.Array
    as_interval_us: jax.Array
    as_min: jax.Array
    as_max: jax.Array
    as_up_step: jax.Array
    as_down_step: jax.Array
    as_cooldown_us: jax.Array
    as_drain: jax.Array
    as_up_util: jax.Array
    as_down_util: jax.Array
    as_target_util: jax.Array
    as_tolerance: jax.Array
    as_target_qd: jax.Array
    as_kv_threshold: jax.Array
    as_sat_up: jax.Array
    as_sat_down: jax.Array
    as_avg_input: jax.Array
    as_up_window_us: jax.Array
    as_down_window_us: jax.Array
    as_act_delay_us: jax.Array
    as_act_random: jax.Array
    life_load_delay_us: jax.Array
    life_load_random: jax.Array
    life_prov_delay_us: jax.Array
    life_prov_random: jax.Array
    life_warm_start: jax.Array
    life_warm_requests: jax.Array
    life_warm_factor: jax.Array
    life_cost_per_hour: jax.Array
    life_pool_gpus: jax.Array
    life_pool_max_nodes: jax.Array
    life_pool_cost: jax.Array
    life_pool_variant: jax.Array
    life_variant_cost: jax.Array
    life_variant_order: jax.Array
    gw_on: jax.Array
    gw_detector: jax.Array
    gw_qd_threshold: jax.Array
    gw_kv_threshold: jax.Array
    gw_max_conc: jax.Array
    gw_by_band: jax.Array
    gw_max_depth: jax.Array
    gw_tick_us: jax.Array


#: Pools of ``PolicyParams.pd_pool_*`` (index of the first axis).
POOL_DECODE, POOL_PREFILL = 0, 1


def _scorer_arrays(scorers) -> tuple[np.ndarray, np.ndarray]:
    """(codes, raw weights) of a scorer list in configuration order, padded with -1 / 0."""
    codes = [int(Scorer.of(w.name)) for w in scorers]
    padding = MAX_SCORERS - len(codes)
    return (np.asarray(codes + [-1] * padding, dtype=np.int32),
            np.asarray([float(w.weight) for w in scorers] + [0.0] * padding, dtype=np.float64))


def _pd_params(cfg) -> dict:
    """The P/D knobs of ``cfg`` as arrays (every instance shared, decider never, without
    pools)."""
    pd = cfg.cluster.pd
    pools = (pd.decode_scorers, pd.prefill_scorers)
    orders, weights = zip(*(_scorer_arrays(x) for x in pools), strict=True)
    streams = ("decode-router", "prefill-router")
    return dict(
        pd_pools=np.asarray(bool(pd.enabled)),
        pd_role=np.asarray([int(x) for x in instance_roles(pd, cfg.cluster.num_instances)],
                           dtype=np.int32),
        pd_decider=np.asarray(PDDecider.of(pd.decider), dtype=np.int32),
        pd_threshold=np.asarray(pd.prefix_threshold_tokens, dtype=np.int32),
        pd_base_us=np.asarray(float(pd.transfer_base_latency_ms) * 1000.0, dtype=np.float64),
        pd_bandwidth=np.asarray(float(pd.transfer_bandwidth_gbps) * 1000.0, dtype=np.float64),
        pd_contention=np.asarray(bool(pd.transfer_contention)),
        pd_pool_own=np.asarray([bool(x) for x in pools]),
        pd_pool_order=np.stack(orders), pd_pool_weight=np.stack(weights),
        pd_pool_rng=np.stack([np.asarray(blis_subsystem_rand(cfg.seed, name).state().words,
                                         dtype=np.int64) for name in streams]))


def params_from_config(cfg, tenant_names: tuple[str, ...]) -> PolicyParams:
    """Knobs of ``cfg`` (a ``SimConfig``) as arrays; tenants follow the workload's codes."""
    pol = cfg.policy
    adm, pri, rt = pol.admission, pol.priority, pol.routing
    scorers = [Scorer.of(w.name) for w in rt.scorers]
    order, weights = _scorer_arrays(rt.scorers)
    # Host arrays: converting on the device would compile a program per field.
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    routing = RoutingPolicy.of(rt.policy)
    code = {site: (section.compiled() if section.policy == "program" else None)
            for site, section in (("routing", rt), ("admission", adm), ("priority", pri))}
    program_reads = set(code["routing"].reads) if code["routing"] is not None else set()
    return PolicyParams(
        admission=i32(AdmissionPolicy.of(adm.policy)),
        tb_capacity=f64(adm.token_bucket_capacity), tb_rate=f64(adm.token_bucket_refill_rate),
        rl_burst=f64(adm.rate_limit_burst), rl_rate=f64(adm.rate_limit_rps),
        tenant_quota=i32(adm.max_in_flight_table(tenant_names)),
        shed_queue=i32(adm.shed_queue_depth), shed_kv=f64(adm.shed_kv_utilization),
        tt_capacity=f64([cap for cap, _ in adm.tenant_bucket_table(tenant_names)]),
        tt_rate=f64([rate for _, rate in adm.tenant_bucket_table(tenant_names)]),
        priority=i32(PriorityPolicy.of(pri.policy)),
        age_weight=f64(pri.age_weight),
        class_score=f64(pri.slo_class_score_table()),
        tenant_score=f64(pri.tenant_score_table(tenant_names)),
        no_deadline_score=f64(-float(pri.no_deadline_slack_s)),
        routing=i32(routing),
        scorer_order=order, scorer_weight=weights,
        prefix_index_on=np.asarray((routing == RoutingPolicy.WEIGHTED
                                    and Scorer.PREFIX_AFFINITY in scorers)
                                   or scorer_name(Scorer.PREFIX_AFFINITY) in program_reads),
        tie_break=i32(TieBreak.of(rt.tie_break)),
        router_rng=np.asarray(blis_subsystem_rand(cfg.seed, "router").state().words,
                              dtype=np.int64),
        scheduler=i32(SchedulerPolicy.of(pol.scheduler.policy)),
        preemption=i32(PreemptionPolicy.of(cfg.engine.preemption_policy)),
        **{f"{site}_program": program_code.empty() if x is None else x.bytecode()
           for site, x in code.items()},
        program_lru=np.asarray(scorer_name(Scorer.NO_HIT_LRU) in program_reads),
        active_instances=i32(cfg.cluster.num_instances),
        gpu=i32(hardware_code(cfg.hardware)),
        kv_cpu_blocks=i32(cfg.engine.kv_cpu_blocks),
        kv_reload_us=np.asarray(reload_cost_us(cfg.engine.block_size_tokens,
                                               cfg.engine.kv_transfer_bandwidth,
                                               cfg.engine.kv_transfer_base_latency_us),
                                dtype=np.int64),
        **_pd_params(cfg),
        **lifecycle_params(cfg),
        **_gateway_params(cfg),
    )


def _gateway_params(cfg) -> dict:
    """The gateway queue's knobs of ``cfg`` as arrays."""
    gw = cfg.cluster.gateway
    return dict(
        gw_on=np.asarray(bool(gw.enabled)),
        gw_detector=np.asarray(SaturationDetector.of(gw.saturation_detector), dtype=np.int32),
        gw_qd_threshold=np.asarray(gw.queue_depth_threshold, dtype=np.float64),
        gw_kv_threshold=np.asarray(gw.kv_cache_util_threshold, dtype=np.float64),
        gw_max_conc=np.asarray(gw.max_concurrency, dtype=np.int32),
        gw_by_band=np.asarray(gw.dispatch_order == "priority" or cfg.compat.blis_quirks),
        gw_max_depth=np.asarray(gw.max_queue_depth, dtype=np.int32),
        gw_tick_us=np.asarray(gw.dispatch_tick_interval_us, dtype=np.int64))


#: Fields with one entry per instance of the lane's cluster (``cluster.num_instances``).
_PER_INSTANCE = ("pd_role",)


def fit_instances(params: PolicyParams, width: int) -> PolicyParams:
    """``params`` (one lane's or stacked) with its per-instance fields ``width`` entries wide
    on their last axis, padded with their last entry; the padded fields as host arrays.

    A lane of fewer instances (the ``cluster.num_instances`` knob) has shorter ones; only
    programs with P/D pools read them, and those refuse the knob, so the padding is never
    read. It keeps one input shape: a program is compiled per shape."""
    fields = {}
    for f in _PER_INSTANCE:
        x = np.asarray(getattr(params, f))
        if x.shape[-1] != width:
            fields[f] = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])],
                               mode="edge")
    return params.replace(**fields) if fields else params


def stack_params(params: list[PolicyParams]) -> PolicyParams:
    """Stack per-lane params along a new leading population axis (per-instance fields as wide
    as the widest lane's, ``fit_instances``). Stacked on the host and put on the device as
    they are: ``jnp.stack`` would compile a small program per field (~0.15 s in a new
    process)."""
    widest = max((np.shape(p.pd_role)[-1] for p in params), default=0)
    params = [fit_instances(p, widest) for p in params]
    return jax.tree_util.tree_map(lambda *xs: jax.device_put(np.stack([np.asarray(x)
                                                                       for x in xs])), *params)

