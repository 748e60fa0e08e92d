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
from blisjax.rules import normalized_weights, reload_cost_us, slot_roles

#: Scorer slots per lane: every scorer at most once, in configuration order.
MAX_SCORERS = len(Scorer)


@pytree_dataclass
class AdmissionParams:
    """``policy.admission`` of one lane (docs/semantics.md §5.3).

    policy: ``AdmissionPolicy`` code; tb_capacity, tb_rate: the token bucket (capacity in
    tokens, refill tokens/s); rl_burst, rl_rate: the rate limit (burst requests, requests/s);
    tenant_quota[T]: max in-flight per tenant; shed_queue, shed_kv: load-shed's limits on
    queued requests and mean KV use (0: none); tt_capacity[T], tt_rate[T]: tenant-bucket's
    per-tenant bucket size and refill; program: the admission program
    (``blisjax.program.Bytecode``, see ``RoutingParams.program``).
    """

    policy: jax.Array
    tb_capacity: jax.Array
    tb_rate: jax.Array
    rl_burst: jax.Array
    rl_rate: jax.Array
    tenant_quota: jax.Array
    shed_queue: jax.Array
    shed_kv: jax.Array
    tt_capacity: jax.Array
    tt_rate: jax.Array
    program: program_code.Bytecode


@pytree_dataclass
class PriorityParams:
    """``policy.priority`` of one lane (docs/semantics.md §5.5).

    policy: ``PriorityPolicy`` code; age_weight; class_score[6] by SLO class code;
    tenant_score[T]; no_deadline_score (= -no_deadline_slack_s); program: the priority program.
    """

    policy: jax.Array
    age_weight: jax.Array
    class_score: jax.Array
    tenant_score: jax.Array
    no_deadline_score: jax.Array
    program: program_code.Bytecode


@pytree_dataclass
class RoutingParams:
    """``policy.routing`` of one lane (docs/semantics.md §5.6).

    policy: ``RoutingPolicy`` code; scorer_order[S] ``Scorer`` codes in configuration order,
    padded with -1 (S = ``MAX_SCORERS``); scorer_weight[S] their weights over their sum;
    prefix_index_on: the prefix-affinity observer is active; tie_break: ``TieBreak`` code;
    router_rng[607]: int64 words of BLIS's "router" stream as seeded from the configuration's
    seed (``blisjax.gorand``), the state ties draw from. program: the routing program
    (``policy.routing.policy: program``; each site's program is read only by programs that
    compile the site's interpreter in, ``EngineStatic.features.program_sites``): a
    ``blisjax.program.Bytecode`` of ``MAX_PROGRAM_LENGTH`` instructions, its parameters bound
    (a site without a program holds one unused instruction); program_lru: the routing program
    reads no-hit-lru's scorer, so its cold requests' targets are recorded
    (``prefix_index_on`` likewise covers a program reading prefix-affinity's).
    """

    policy: jax.Array
    scorer_order: jax.Array
    scorer_weight: jax.Array
    prefix_index_on: jax.Array
    tie_break: jax.Array
    router_rng: jax.Array
    program: program_code.Bytecode
    program_lru: jax.Array


@pytree_dataclass
class AutoscalerParams:
    """``policy.autoscaler`` of one lane (read only by programs with lifecycles,
    ``EngineStatic.features.lifecycle``; docs/autoscaling.md): policy (``AutoscalerPolicy`` code),
    the tick interval, replica bounds and steps, cooldown, drain (``DrainPolicy`` code), the
    utilization, queue-depth, KV and saturation thresholds, the windows in µs, and the
    actuation delays drawn in stream order (``DELAY_DRAWS`` of them) —
    ``engine.lifecycle.lifecycle_params``."""

    policy: jax.Array
    interval_us: jax.Array
    min: jax.Array
    max: jax.Array
    up_step: jax.Array
    down_step: jax.Array
    cooldown_us: jax.Array
    drain: jax.Array
    up_util: jax.Array
    down_util: jax.Array
    target_util: jax.Array
    tolerance: jax.Array
    target_qd: jax.Array
    kv_threshold: jax.Array
    sat_up: jax.Array
    sat_down: jax.Array
    avg_input: jax.Array
    up_window_us: jax.Array
    down_window_us: jax.Array
    act_delay_us: jax.Array
    act_random: jax.Array


@pytree_dataclass
class LifecycleParams:
    """``cluster.lifecycle`` and ``cluster.node_pools`` of one lane (read only by programs with
    lifecycles): ``on`` the lane models them (else its results are a fixed cluster's, as the
    reference's); loading and node-provisioning delays drawn in stream order, warm-up, cost;
    the node pools' GPUs and nodes, cost and variant; the variants' costs and cost order —
    ``engine.lifecycle.lifecycle_params``."""

    on: jax.Array
    load_delay_us: jax.Array
    load_random: jax.Array
    prov_delay_us: jax.Array
    prov_random: jax.Array
    warm_start: jax.Array
    warm_requests: jax.Array
    warm_factor: jax.Array
    cost_per_hour: jax.Array
    pool_gpus: jax.Array
    pool_max_nodes: jax.Array
    pool_cost: jax.Array
    pool_variant: jax.Array
    variant_cost: jax.Array
    variant_gpu: jax.Array  # int32 [V]: hardware code of the GPU each variant runs at
    variant_order: jax.Array


@pytree_dataclass
class PDParams:
    """``cluster.pd`` of one lane (read only by programs with pools, ``EngineStatic.features.pd``).

    pools: the lane has pools (else it serves co-located: every instance shared, decider
    never, and its results have no P/D counters, as the reference's); role[I] ``PDRole`` code
    of each instance (the lane's split); decider ``PDDecider`` code; threshold tokens;
    base_us float64 µs of each transfer's base latency; bandwidth float64 bytes/µs;
    contention: transfers share the bandwidth; per pool (``POOL_DECODE``, ``POOL_PREFILL``):
    pool_own — it routes with its own weighted scorers pool_order[S] / pool_weight[S] and
    random stream pool_rng[607] ("decode-router" / "prefill-router"), else with the lane's
    routing.
    """

    pools: jax.Array
    role: jax.Array
    decider: jax.Array
    threshold: jax.Array
    base_us: jax.Array
    bandwidth: jax.Array
    contention: jax.Array
    pool_own: jax.Array
    pool_order: jax.Array
    pool_weight: jax.Array
    pool_rng: jax.Array


@pytree_dataclass
class GatewayParams:
    """``cluster.gateway`` of one lane (read only by programs with flow control,
    ``EngineStatic.features.gateway``): on — the lane has flow control; detector
    ``SaturationDetector`` code, its thresholds qd_threshold, kv_threshold (float64) and
    max_conc; by_band dispatches by SLO-class band (``priority`` order, or fifo under
    ``compat.blis_quirks``: BLIS's gated dispatch); max_depth (0: unlimited); tick_us the
    dispatch tick period."""

    on: jax.Array
    detector: jax.Array
    qd_threshold: jax.Array
    kv_threshold: jax.Array
    max_conc: jax.Array
    by_band: jax.Array
    max_depth: jax.Array
    tick_us: jax.Array


@pytree_dataclass
class LaneSettings:
    """The cluster's settings that are per-lane knobs: max_running
    (``engine.max_num_running_reqs``, int32, at most the program's batch slots
    ``EngineStatic.shapes.batch_slots`` unless those hold every request row), token_budget
    (``engine.max_num_scheduled_tokens``, int32, at most the program's
    ``EngineStatic.settings.token_budget``), long_prefill_threshold
    (``engine.long_prefill_token_threshold``, int32, 0: none), admission_latency_us and
    routing_latency_us (``cluster.*``, int64 µs), refresh_interval_us
    (``cluster.snapshot_refresh_interval_us``, int64 µs), kv_blocks
    (``engine.total_kv_blocks``, int32 GPU KV blocks per instance, at most the program's
    ``EngineStatic.shapes.kv_blocks``; 0: the program's, where the configuration leaves them
    to be computed). A program reads a lane's own only where some lane's differ from the
    program's (``EngineStatic.features.lane_settings``; ``consts.setting``)."""

    max_running: jax.Array
    token_budget: jax.Array
    long_prefill_threshold: jax.Array
    admission_latency_us: jax.Array
    routing_latency_us: jax.Array
    refresh_interval_us: jax.Array
    kv_blocks: jax.Array


#: ``LaneSettings``' fields: the configuration's field of each (the program's is
#: ``static.LANE_SETTING_FIELDS``).
LANE_SETTINGS = {"max_running": "engine.max_num_running_reqs",
                 "token_budget": "engine.max_num_scheduled_tokens",
                 "long_prefill_threshold": "engine.long_prefill_token_threshold",
                 "admission_latency_us": "cluster.admission_latency_us",
                 "routing_latency_us": "cluster.routing_latency_us",
                 "refresh_interval_us": "cluster.snapshot_refresh_interval_us",
                 "kv_blocks": "engine.total_kv_blocks"}
#: ``LaneSettings``' fields that size the program (a lane's may not exceed the program's) and
#: that the physics latency model's constants read (not per-lane knobs under it): what the
#: program holds for each.
SIZED_SETTINGS = {"max_running": "batch slots", "token_budget": "step tables' tokens",
                  "kv_blocks": "KV blocks per instance"}
#: Why a sized setting is not a per-lane knob under the physics latency model.
PHYSICS_READS_SIZES = ("the physics latency model's constants read vLLM's max_num_seqs, "
                       "max_num_batched_tokens and the GPU's KV blocks")


def lane_settings(cfg) -> LaneSettings:
    """The per-lane settings of configuration ``cfg`` (host arrays)."""
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    i64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    return LaneSettings(
        max_running=i32(cfg.engine.max_num_running_reqs),
        token_budget=i32(cfg.engine.max_num_scheduled_tokens),
        long_prefill_threshold=i32(cfg.engine.long_prefill_token_threshold),
        admission_latency_us=i64(cfg.cluster.admission_latency_us),
        routing_latency_us=i64(cfg.cluster.routing_latency_us),
        refresh_interval_us=i64(cfg.cluster.snapshot_refresh_interval_us),
        kv_blocks=i32(cfg.engine.total_kv_blocks or 0))


@pytree_dataclass
class PolicyParams:
    """Knobs of one lane (shapes without the population axis), nested like the configuration:
    ``admission``, ``priority``, ``routing``, ``autoscaler`` (``policy.*``), ``lifecycle``,
    ``pd``, ``gateway`` (``cluster.*``), ``settings`` (the cluster's settings that are
    knobs, ``LaneSettings``), and the single knobs below.

    scheduler: ``SchedulerPolicy`` code; preemption: ``PreemptionPolicy`` code.
    active_instances: the instances the lane's cluster has (``cluster.num_instances``), the
      program's first ones; the router never picks the others. Read only by programs built
      with ``sized_lanes`` (``EngineStatic.features.sized_lanes``), which need no lifecycle or
      pools.
    gpu: the lane's GPU type (``hardware``), ``blisjax.config.hardware.hardware_code``: the row
      of the latency tables it reads (only programs with per-lane GPU types,
      ``EngineStatic.settings.gpus``, read it).
    kv_cpu_blocks: the CPU tier's size in blocks per instance (0: none; at most the
      program's ``EngineStatic.shapes.cpu_tier_blocks``); kv_reload_us: int64 µs one reloaded block
      adds to its step (``blisjax.rules.reload_cost_us``).
    """

    admission: AdmissionParams
    priority: PriorityParams
    routing: RoutingParams
    scheduler: jax.Array
    preemption: jax.Array
    autoscaler: AutoscalerParams
    lifecycle: LifecycleParams
    pd: PDParams
    gateway: GatewayParams
    settings: LaneSettings
    active_instances: jax.Array
    gpu: jax.Array
    kv_cpu_blocks: jax.Array
    kv_reload_us: jax.Array


#: Pools of ``PDParams.pool_*`` (index of the first axis).
POOL_DECODE, POOL_PREFILL = 0, 1


def _scorer_arrays(scorers) -> tuple[np.ndarray, np.ndarray]:
    """(codes, weights over their sum) of a scorer list in configuration order, padded with
    -1 / 0. The weights are normalised here, on the host, as the reference does
    (``rules.normalized_weights``): no division is left to XLA."""
    codes = [int(Scorer.of(w.name)) for w in scorers]
    padding = MAX_SCORERS - len(codes)
    weights = normalized_weights([float(w.weight) for w in scorers]) if scorers else []
    return (np.asarray(codes + [-1] * padding, dtype=np.int32),
            np.asarray(weights + [0.0] * padding, dtype=np.float64))


def _pd_params(cfg) -> PDParams:
    """The P/D knobs of ``cfg`` (every instance shared, decider never, without
    pools)."""
    pd = cfg.cluster.pd
    pools = (pd.decode_scorers, pd.prefill_scorers)
    orders, weights = zip(*(_scorer_arrays(x) for x in pools), strict=True)
    streams = ("decode-router", "prefill-router")
    return PDParams(
        pools=np.asarray(bool(pd.enabled)),
        role=np.asarray([int(x) for x in slot_roles(cfg)], dtype=np.int32),
        decider=np.asarray(PDDecider.of(pd.decider), dtype=np.int32),
        threshold=np.asarray(pd.prefix_threshold_tokens, dtype=np.int32),
        base_us=np.asarray(float(pd.transfer_base_latency_ms) * 1000.0, dtype=np.float64),
        bandwidth=np.asarray(float(pd.transfer_bandwidth_gbps) * 1000.0, dtype=np.float64),
        contention=np.asarray(bool(pd.transfer_contention)),
        pool_own=np.asarray([bool(x) for x in pools]),
        pool_order=np.stack(orders), pool_weight=np.stack(weights),
        pool_rng=np.stack([np.asarray(blis_subsystem_rand(cfg.seed, name).state().words,
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
    programs = {site: program_code.empty() if x is None else x.bytecode()
                for site, x in code.items()}
    autoscaler, lifecycle = lifecycle_params(cfg)
    return PolicyParams(
        admission=AdmissionParams(
            policy=i32(AdmissionPolicy.of(adm.policy)),
            tb_capacity=f64(adm.token_bucket_capacity),
            tb_rate=f64(adm.token_bucket_refill_rate),
            rl_burst=f64(adm.rate_limit_burst), rl_rate=f64(adm.rate_limit_rps),
            tenant_quota=i32(adm.max_in_flight_table(tenant_names)),
            shed_queue=i32(adm.shed_queue_depth), shed_kv=f64(adm.shed_kv_utilization),
            tt_capacity=f64([cap for cap, _ in adm.tenant_bucket_table(tenant_names)]),
            tt_rate=f64([rate for _, rate in adm.tenant_bucket_table(tenant_names)]),
            program=programs["admission"]),
        priority=PriorityParams(
            policy=i32(PriorityPolicy.of(pri.policy)),
            age_weight=f64(pri.age_weight),
            class_score=f64(pri.slo_class_score_table()),
            tenant_score=f64(pri.tenant_score_table(tenant_names)),
            no_deadline_score=f64(-float(pri.no_deadline_slack_s)),
            program=programs["priority"]),
        routing=RoutingParams(
            policy=i32(routing),
            scorer_order=order, scorer_weight=weights,
            prefix_index_on=np.asarray((routing == RoutingPolicy.WEIGHTED
                                        and Scorer.PREFIX_AFFINITY in scorers)
                                       or scorer_name(Scorer.PREFIX_AFFINITY) in program_reads),
            tie_break=i32(TieBreak.of(rt.tie_break)),
            router_rng=np.asarray(blis_subsystem_rand(cfg.seed, "router").state().words,
                                  dtype=np.int64),
            program=programs["routing"],
            program_lru=np.asarray(scorer_name(Scorer.NO_HIT_LRU) in program_reads)),
        scheduler=i32(SchedulerPolicy.of(pol.scheduler.policy)),
        preemption=i32(PreemptionPolicy.of(cfg.engine.preemption_policy)),
        autoscaler=AutoscalerParams(**autoscaler),
        lifecycle=LifecycleParams(**lifecycle),
        pd=_pd_params(cfg),
        gateway=_gateway_params(cfg),
        settings=lane_settings(cfg),
        active_instances=i32(cfg.cluster.num_instances),
        gpu=i32(hardware_code(cfg.hardware)),
        kv_cpu_blocks=i32(cfg.engine.kv_cpu_blocks),
        kv_reload_us=np.asarray(reload_cost_us(cfg.engine.block_size_tokens,
                                               cfg.engine.kv_transfer_bandwidth,
                                               cfg.engine.kv_transfer_base_latency_us),
                                dtype=np.int64),
    )


def _gateway_params(cfg) -> GatewayParams:
    """The gateway queue's knobs of ``cfg``."""
    gw = cfg.cluster.gateway
    return GatewayParams(
        on=np.asarray(bool(gw.enabled)),
        detector=np.asarray(SaturationDetector.of(gw.saturation_detector), dtype=np.int32),
        qd_threshold=np.asarray(gw.queue_depth_threshold, dtype=np.float64),
        kv_threshold=np.asarray(gw.kv_cache_util_threshold, dtype=np.float64),
        max_conc=np.asarray(gw.max_concurrency, dtype=np.int32),
        by_band=np.asarray(gw.dispatch_order == "priority" or cfg.compat.blis_quirks),
        max_depth=np.asarray(gw.max_queue_depth, dtype=np.int32),
        tick_us=np.asarray(gw.dispatch_tick_interval_us, dtype=np.int64))


def fit_instances(params: PolicyParams, width: int) -> PolicyParams:
    """``params`` (one lane's or stacked) with its per-instance knobs (``pd.role``) ``width``
    entries wide on their last axis, padded with their last entry, as host arrays.

    A lane of fewer instances (the ``cluster.num_instances`` knob) has shorter ones; only
    programs with P/D pools read them, and those refuse the knob, so the padding is never
    read. It keeps one input shape: a program is compiled per shape."""
    role = np.asarray(params.pd.role)
    if role.shape[-1] == width:
        return params
    role = np.pad(role, [(0, 0)] * (role.ndim - 1) + [(0, width - role.shape[-1])], mode="edge")
    return params.replace(pd=params.pd.replace(role=role))


def stack_params(params: list[PolicyParams]) -> PolicyParams:
    """Stack per-lane params along a new leading population axis (per-instance fields as wide
    as the widest lane's, ``fit_instances``). Stacked on the host and put on the device as
    they are: ``jnp.stack`` would compile a small program per field (docs/performance.md,
    Seconds to first result)."""
    widest = max((np.shape(p.pd.role)[-1] for p in params), default=0)
    params = [fit_instances(p, widest) for p in params]
    return jax.tree_util.tree_map(lambda *xs: jax.device_put(np.stack([np.asarray(x)
                                                                       for x in xs])), *params)

