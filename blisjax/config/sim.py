"""The simulation configuration: frozen, hashable, validated on construction.

Every field is checked in ``__post_init__``; a bad value raises :class:`ConfigError` whose message
names the dotted field path and the allowed range, e.g.
``engine.max_num_running_reqs: must be an integer >= 1, got 0``. Tables are tuples of pairs (not
dicts) so that configs can be hashed and used as cache keys. Facts that need the model or the
hardware (KV capacity, shipped coefficients) are checked by :func:`blisjax.config.resolve_config`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blisjax.config._checks import (
    INT64_MIN,
    ConfigError,
    check_bool,
    check_choice,
    check_float,
    check_float_tuple,
    check_int,
    check_pairs,
    check_str,
    set_field,
)
from blisjax.config.autoscale import (
    AutoscalerConfig,
    LifecycleConfig,
    NodePool,
    as_autoscaler,
    as_lifecycle,
    as_node_pools,
    check_cluster_autoscaling,
)
from blisjax.config.codes import (
    AdmissionPolicy,
    PDDecider,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.limits import INT64_MAX
from blisjax.metrics.formulas import FITNESS_KEYS  # the fitness formulas define the keys
from blisjax.workload.types import SLO_CLASSES

#: SLO classes a request can carry ("" = no class). Same names as ``blisjax.workload``.
SLO_CLASS_NAMES = SLO_CLASSES
LATENCY_MODELS = ("blackbox", "roofline", "physics")
# Accepted policy names, in code order (``blisjax.config.codes``).
PREEMPTION_POLICIES = PreemptionPolicy.labels()
ADMISSION_POLICIES = AdmissionPolicy.labels()
PRIORITY_POLICIES = PriorityPolicy.labels()
ROUTING_POLICIES = RoutingPolicy.labels()
SCORER_NAMES = Scorer.labels()
TIE_BREAKS = TieBreak.labels()
SCHEDULER_POLICIES = SchedulerPolicy.labels()
#: SLO-target class names: "default" stands for the empty class "".
SLO_TARGET_CLASSES = ("default",) + SLO_CLASS_NAMES[1:]
#: BLIS's static SLO-class scores (docs/semantics.md §5.5); higher = more urgent.
DEFAULT_SLO_CLASS_SCORES: tuple[tuple[str, float], ...] = (
    ("critical", 4.0),
    ("standard", 3.0),
    ("", 3.0),
    ("batch", -1.0),
    ("sheddable", -2.0),
    ("background", -3.0),
)
#: Score of a class missing from ``slo_class_scores`` (BLIS: unknown classes score as standard).
UNKNOWN_SLO_CLASS_SCORE = 3.0
#: BLIS rejects SLO-class score overrides outside this range.
SLO_CLASS_SCORE_LIMIT = 100.0


def _non_negative_int(path: str, value: Any) -> int:
    return check_int(path, value, min_value=0)


#: Nonzero policy weights, scores, rates and sizes lie within these magnitudes. The JAX engine
#: runs on XLA:CPU, which treats subnormal floats (below ~2.2e-308) as zero; within this range
#: no product or ratio of two knobs with the engine's other quantities comes near one, so both
#: engines compute the same values.
KNOB_MAGNITUDE = (1e-30, 1e30)


def check_knob(path: str, value: Any, **bounds: Any) -> float:
    """A finite policy knob within ``bounds`` (see ``check_float``) that is 0 or of a magnitude
    in ``KNOB_MAGNITUDE``."""
    value = check_float(path, value, **bounds)
    low, high = KNOB_MAGNITUDE
    if value != 0 and not low <= abs(value) <= high:
        raise ConfigError(path, f"must be 0 or between {low:g} and {high:g} in magnitude "
                                f"(the JAX engine flushes subnormal floats to zero), got {value!r}")
    return value


def _knob(path: str, value: Any) -> float:
    return check_knob(path, value)


def _name_key(path: str, value: Any) -> str:
    return check_str(f"{path} key", value, nonempty=False)


def _choice_key(choices: tuple[str, ...]) -> Any:
    def check(path: str, value: Any) -> str:
        return check_choice(f"{path} key", value, choices)

    return check


def _ensure_type(path: str, value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        raise ConfigError(path, f"must be a {cls.__name__}, got {type(value).__name__}")


# --------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine knobs of one instance (BLIS flag in brackets).

    Attributes:
      tensor_parallel_size: GPUs per model replica [--tp], >= 1.
      pipeline_parallel_size: pipeline stages, >= 1 (BLIS models no PP; only total_gpus uses it).
      data_parallel_size: DP replicas inside one instance, >= 1.
      max_num_running_reqs: max requests in the running batch [--max-num-running-reqs], >= 1.
      max_num_scheduled_tokens: token budget per step [--max-num-scheduled-tokens], >= 1.
      block_size_tokens: tokens per KV block [--block-size-in-tokens], >= 1.
      total_kv_blocks: KV blocks per instance [--total-kv-blocks]; None = computed from the model
        and hardware (docs/roofline.md §4).
      gpu_memory_utilization: HBM fraction vLLM may use, in (0, 1].
      long_prefill_token_threshold: max prefill tokens per request per step, 0 = off.
      max_model_len: max input + output tokens per request, 0 = unlimited.
      enable_prefix_caching: reuse cached KV blocks of shared prefixes.
      preemption_policy: victim choice when KV runs out: "fcfs" (newest running request, vLLM/BLIS)
        or "priority" (least urgent).
      kv_cpu_blocks: CPU-tier KV blocks per instance [--kv-cpu-blocks], >= 0; 0 = no CPU tier
        (docs/semantics.md §3.8). Needs prefix caching (the tier is keyed by block hashes).
      kv_transfer_bandwidth: CPU→GPU reload bandwidth in tokens per µs
        [--kv-transfer-bandwidth], > 0 and finite; a block costs ceil(block size / bandwidth) µs.
      kv_transfer_base_latency_us: fixed cost per reloaded block, µs
        [--kv-transfer-base-latency], >= 0.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    max_num_running_reqs: int = 256
    max_num_scheduled_tokens: int = 2048
    block_size_tokens: int = 16
    total_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    long_prefill_token_threshold: int = 0
    max_model_len: int = 0
    enable_prefix_caching: bool = True
    preemption_policy: str = "fcfs"
    kv_cpu_blocks: int = 0
    kv_transfer_bandwidth: float = 100.0
    kv_transfer_base_latency_us: int = 0

    _POSITIVE_INTS = (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "max_num_running_reqs",
        "max_num_scheduled_tokens",
        "block_size_tokens",
    )

    def __post_init__(self) -> None:
        for name in self._POSITIVE_INTS:
            set_field(self, name, check_int(f"engine.{name}", getattr(self, name), min_value=1))
        if self.total_kv_blocks is not None:
            blocks = check_int("engine.total_kv_blocks", self.total_kv_blocks, min_value=1)
            set_field(self, "total_kv_blocks", blocks)
        util = check_float(
            "engine.gpu_memory_utilization",
            self.gpu_memory_utilization,
            min_value=0,
            min_open=True,
            max_value=1,
        )
        set_field(self, "gpu_memory_utilization", util)
        for name in ("long_prefill_token_threshold", "max_model_len"):
            set_field(self, name, _non_negative_int(f"engine.{name}", getattr(self, name)))
        check_bool("engine.enable_prefix_caching", self.enable_prefix_caching)
        check_choice("engine.preemption_policy", self.preemption_policy, PREEMPTION_POLICIES)
        for name in ("kv_cpu_blocks", "kv_transfer_base_latency_us"):
            set_field(self, name, _non_negative_int(f"engine.{name}", getattr(self, name)))
        set_field(self, "kv_transfer_bandwidth", check_float(
            "engine.kv_transfer_bandwidth", self.kv_transfer_bandwidth, min_value=0,
            min_open=True))
        if self.kv_cpu_blocks > 0 and not self.enable_prefix_caching:
            raise ConfigError("engine.kv_cpu_blocks", "a CPU tier (kv_cpu_blocks > 0) needs "
                              "enable_prefix_caching: true (the tier is keyed by block hashes)")
        if self.total_kv_blocks is not None:
            check_model_len_fits(self.max_model_len, self.block_size_tokens, self.total_kv_blocks)

    @property
    def total_gpus(self) -> int:
        """GPUs of one instance: TP × PP × DP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def effective_expert_parallelism(self) -> int:
        """GPUs experts are spread over in vLLM (implicit EP = DP × TP)."""
        return self.data_parallel_size * self.tensor_parallel_size


def check_model_len_fits(max_model_len: int, block_size_tokens: int, total_kv_blocks: int) -> None:
    """BLIS rejects ceil(max_model_len / block size) > total KV blocks (when max_model_len > 0)."""
    needed = -(-max_model_len // block_size_tokens)
    if max_model_len > 0 and needed > total_kv_blocks:
        raise ConfigError(
            "engine.max_model_len",
            f"must fit in the KV cache: ceil({max_model_len}/{block_size_tokens}) = {needed} "
            f"blocks > total_kv_blocks = {total_kv_blocks}; lower max_model_len or raise "
            "total_kv_blocks",
        )


# --------------------------------------------------------------------------- latency


@dataclass(frozen=True)
class LatencyConfig:
    """Latency model and its coefficients.

    Attributes:
      model: "blackbox" (α/β linear model, docs/semantics.md B.1), "roofline" (docs/roofline.md) or
        "physics" (physics-normalized model, docs/latency-models.md §P).
      alpha_coeffs: α coefficients (µs); blackbox/roofline: (α0, α1 per input token, α2 per output
        token). None = shipped defaults (blackbox: BLIS's table entry for model, hardware, TP and
        vLLM version, docs/latency-models.md; roofline: zeros).
      beta_coeffs: β coefficients (µs); blackbox: (β0, β1 per prefill token, β2 per decode token).
        None = shipped defaults. The roofline model takes no β. Physics: 11 α and 16 β given
        inline, or ``coefficients_file``.
      coefficients_file: physics coefficient YAML (with provenance and the training γ).
      preemption_ema_gamma: physics preemption-EMA decay in (0, 1] (as a coefficient file's
        ``trained_on.gamma``); None = the coefficients' γ.
      vllm_version: blackbox only [--vllm-version]: the vLLM image of the shipped entry to use,
        as BLIS writes it (``vllm/vllm-openai:v0.8.4``); None = the model's default version in
        BLIS's table. Unused when both coefficient lists are given.
    """

    model: str = "blackbox"
    alpha_coeffs: tuple[float, ...] | None = None
    beta_coeffs: tuple[float, ...] | None = None
    coefficients_file: str | None = None
    preemption_ema_gamma: float | None = None
    vllm_version: str | None = None

    def __post_init__(self) -> None:
        check_choice("latency.model", self.model, LATENCY_MODELS)
        if self.vllm_version is not None:
            check_str("latency.vllm_version", self.vllm_version)
            if self.model != "blackbox":
                raise ConfigError("latency.vllm_version", "is only used with model 'blackbox'")
        if self.coefficients_file is not None:
            check_str("latency.coefficients_file", self.coefficients_file)
            if self.model != "physics":
                raise ConfigError("latency.coefficients_file", "is only used with model 'physics'")
        if self.preemption_ema_gamma is not None:
            set_field(self, "preemption_ema_gamma", check_float(
                "latency.preemption_ema_gamma", self.preemption_ema_gamma, min_value=0.0,
                min_open=True, max_value=1.0))
        for name in ("alpha_coeffs", "beta_coeffs"):
            value = getattr(self, name)
            if value is not None:
                set_field(self, name, check_float_tuple(f"latency.{name}", value))
        if self.model in ("blackbox", "roofline"):
            self._check_length("alpha_coeffs", self.alpha_coeffs, 3)
        if self.model == "blackbox":
            self._check_length("beta_coeffs", self.beta_coeffs, 3)
        if self.model == "roofline" and self.beta_coeffs is not None:
            raise ConfigError(
                "latency.beta_coeffs", "must be null with model 'roofline' (it has no β)"
            )

    def _check_length(self, name: str, value: tuple[float, ...] | None, n: int) -> None:
        if value is not None and len(value) != n:
            raise ConfigError(
                f"latency.{name}",
                f"must have exactly {n} values for model {self.model!r}, got {len(value)}",
            )


# --------------------------------------------------------------------------- cluster


#: P/D deciders (docs/semantics.md Decision 15): never | always | prefix-threshold.
PD_DECIDERS = PDDecider.labels()


@dataclass(frozen=True)
class PDConfig:
    """Prefill/decode disaggregation (docs/semantics.md Decision 15; BLIS HEAD's P/D pools).

    Instances are split by index as BLIS does: the first ``prefill_instances`` serve prefill,
    the next ``decode_instances`` decode, the next ``shared_instances`` both; any others serve
    nothing. With no pools (all three 0, the default) every instance serves everything.

    Attributes:
      prefill_instances, decode_instances, shared_instances: pool sizes, >= 0. Without shared
        instances, prefill and decode must be both > 0 or both 0.
      decider: which requests are disaggregated: never | always | prefix-threshold (those
        whose prompt tokens not cached on the pre-selected decode instance exceed
        ``prefix_threshold_tokens``). Anything but never needs prefill instances.
      prefix_threshold_tokens: the prefix-threshold decider's threshold, tokens, >= 0.
      transfer_bandwidth_gbps: KV transfer bandwidth prefill → decode, GB/s, > 0.
      transfer_base_latency_ms: fixed latency of each transfer, ms, >= 0.
      transfer_contention: concurrent transfers share the bandwidth (each transfer's
        bandwidth is divided by the transfers in flight when it starts, itself included).
      prefill_scorers, decode_scorers: weighted-routing scorers of the prefill / decode pool
        (BLIS's ``--prefill-routing-scorers`` / ``--decode-routing-scorers``); empty = the
        pool routes with ``policy.routing``.
    """

    prefill_instances: int = 0
    decode_instances: int = 0
    shared_instances: int = 0
    decider: str = "never"
    prefix_threshold_tokens: int = 16
    transfer_bandwidth_gbps: float = 25.0
    transfer_base_latency_ms: float = 0.05
    transfer_contention: bool = False
    prefill_scorers: tuple[ScorerWeight, ...] = ()
    decode_scorers: tuple[ScorerWeight, ...] = ()

    def __post_init__(self) -> None:
        for name in ("prefill_instances", "decode_instances", "shared_instances"):
            set_field(self, name, _non_negative_int(f"cluster.pd.{name}", getattr(self, name)))
        check_choice("cluster.pd.decider", self.decider, PD_DECIDERS)
        set_field(self, "prefix_threshold_tokens", _non_negative_int(
            "cluster.pd.prefix_threshold_tokens", self.prefix_threshold_tokens))
        set_field(self, "transfer_bandwidth_gbps", check_knob(
            "cluster.pd.transfer_bandwidth_gbps", self.transfer_bandwidth_gbps,
            min_value=0, min_open=True))
        set_field(self, "transfer_base_latency_ms", check_knob(
            "cluster.pd.transfer_base_latency_ms", self.transfer_base_latency_ms, min_value=0))
        set_field(self, "transfer_contention",
                  check_bool("cluster.pd.transfer_contention", self.transfer_contention))
        for name in ("prefill_scorers", "decode_scorers"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
                raise ConfigError(f"cluster.pd.{name}", f"must be a list of scorers, got {value!r}")
            scorers = tuple(_as_scorer(x) for x in value)
            if scorers and all(x.weight == 0 for x in scorers):
                raise ConfigError(f"cluster.pd.{name}", "weights must not all be 0")
            set_field(self, name, scorers)
        p, d, shared = self.prefill_instances, self.decode_instances, self.shared_instances
        if shared == 0 and (p > 0) != (d > 0):
            raise ConfigError("cluster.pd", "prefill_instances and decode_instances must be "
                              f"both > 0 or both 0 without shared instances, got {p} and {d}")
        if self.decider != "never" and p == 0:
            raise ConfigError("cluster.pd.decider", f"{self.decider!r} needs prefill "
                              "instances (cluster.pd.prefill_instances > 0)")
        if not self.enabled:
            if self.transfer_contention:
                raise ConfigError("cluster.pd.transfer_contention",
                                  "needs P/D pools (prefill, decode or shared instances)")
            for name in ("prefill_scorers", "decode_scorers"):
                if getattr(self, name):
                    raise ConfigError(f"cluster.pd.{name}",
                                      "needs P/D pools (prefill, decode or shared instances)")

    @property
    def enabled(self) -> bool:
        """P/D pools are configured."""
        return self.prefill_instances + self.decode_instances + self.shared_instances > 0

    @property
    def pooled_instances(self) -> int:
        """Instances in some pool (prefill, decode or shared); the others serve nothing."""
        return self.prefill_instances + self.decode_instances + self.shared_instances


def _as_section(value: Any, cls: type, path: str, what: str) -> Any:
    """``value`` as a ``cls`` section at ``path``: itself, or built from a mapping whose keys
    are ``cls``'s fields (an unknown key is named with the allowed ones)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        allowed = tuple(f.name for f in dataclasses.fields(cls))
        for key in value:
            if key not in allowed:
                raise ConfigError(f"{path}.{key}",
                                  f"unknown key; allowed keys: {', '.join(allowed)}")
        return cls(**value)
    raise ConfigError(path, f"must be a mapping of {what}, got {value!r}")


#: Saturation detectors of the gateway queue (BLIS HEAD's ``--saturation-detector``).
SATURATION_DETECTORS = ("never", "utilization", "concurrency")
#: Orders the gateway queue dispatches in (``--dispatch-order``; BLIS's slo-deadline is not
#: modelled).
DISPATCH_ORDERS = ("fifo", "priority")


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway queue: BLIS HEAD's flow control (docs/semantics.md §5.12, Decision 21).

    Admitted requests wait at the gateway and are dispatched to routing one at a time while
    the cluster is not saturated: at their own admission and at dispatch ticks.

    Attributes:
      enabled: flow control on (``--flow-control``); off, admitted requests go straight to
        routing.
      saturation_detector: never | utilization | concurrency (``--saturation-detector``):
        never = 0 (a pass-through); utilization = mean over the routable instances of
        max(queue depth / queue_depth_threshold, KV utilization / kv_cache_util_threshold);
        concurrency = in-flight requests / (instances × max_concurrency). Dispatch holds
        while it is >= 1.
      queue_depth_threshold: > 0 (``--queue-depth-threshold``, 5).
      kv_cache_util_threshold: > 0 (``--kv-cache-util-threshold``, 0.8).
      max_concurrency: in-flight requests per instance, >= 1 (``--max-concurrency``, 100).
      dispatch_order: fifo (enqueue order) | priority (highest SLO-class priority
        ``policy.priority.slo_class_scores`` first, then enqueue order) (``--dispatch-order``).
      max_queue_depth: requests the queue holds, >= 0, 0 = unlimited
        (``--max-gateway-queue-depth``); a request arriving at a full queue is rejected.
      dispatch_tick_interval_us: period of the dispatch ticks while requests wait, µs, >= 1
        (``--dispatch-tick-interval``, 1000).
    """

    enabled: bool = False
    saturation_detector: str = "never"
    queue_depth_threshold: float = 5.0
    kv_cache_util_threshold: float = 0.8
    max_concurrency: int = 100
    dispatch_order: str = "fifo"
    max_queue_depth: int = 0
    dispatch_tick_interval_us: int = 1000

    def __post_init__(self) -> None:
        p = "cluster.gateway"
        set_field(self, "enabled", check_bool(f"{p}.enabled", self.enabled))
        check_choice(f"{p}.saturation_detector", self.saturation_detector, SATURATION_DETECTORS)
        check_choice(f"{p}.dispatch_order", self.dispatch_order, DISPATCH_ORDERS)
        for name in ("queue_depth_threshold", "kv_cache_util_threshold"):
            set_field(self, name, check_float(f"{p}.{name}", getattr(self, name), min_value=0,
                                              min_open=True))
        set_field(self, "max_concurrency",
                  check_int(f"{p}.max_concurrency", self.max_concurrency, min_value=1))
        set_field(self, "max_queue_depth",
                  _non_negative_int(f"{p}.max_queue_depth", self.max_queue_depth))
        set_field(self, "dispatch_tick_interval_us",
                  check_int(f"{p}.dispatch_tick_interval_us", self.dispatch_tick_interval_us,
                            min_value=1, max_value=INT64_MAX))


@dataclass(frozen=True)
class ClusterConfig:
    """Cluster shape and router timing.

    Attributes:
      num_instances: identical instances behind the router, >= 1.
      admission_latency_us: delay arrival → admission decision, µs, >= 0.
      routing_latency_us: delay admission → routing decision, µs, >= 0.
      snapshot_refresh_interval_us: staleness of queue/KV signals the router sees, µs; 0 = live.
      prefix_index_capacity_blocks: router-side prefix index size per instance, blocks, >= 1.
      cache_signal_delay_us: staleness of the instances' prefix-cache contents as the
        precise-prefix-cache and no-hit-lru scorers see them, µs, >= 0: 0 = live; > 0 = a
        copy of every instance's cached-block index, refreshed at a router decision once this
        long has passed since the last refresh and empty before the first (BLIS HEAD's
        ``--cache-signal-delay``, whose default is 50000).
      pd: prefill/decode disaggregation (``PDConfig``; no pools by default).
      gateway: the gateway queue, BLIS's flow control (``GatewayConfig``; off by default).
      lifecycle: how instances load, warm up and what they cost (``LifecycleConfig``).
      node_pools: nodes the instances are placed on (``NodePool`` list); empty = no placement
        limit beyond ``policy.autoscaler.max_replicas``.
    """

    num_instances: int = 1
    admission_latency_us: int = 0
    routing_latency_us: int = 0
    snapshot_refresh_interval_us: int = 0
    prefix_index_capacity_blocks: int = 10000
    cache_signal_delay_us: int = 0
    pd: PDConfig = field(default_factory=PDConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    node_pools: tuple[NodePool, ...] = ()

    def __post_init__(self) -> None:
        set_field(self, "lifecycle", as_lifecycle(self.lifecycle))
        set_field(self, "node_pools", as_node_pools(self.node_pools))
        set_field(
            self,
            "num_instances",
            check_int("cluster.num_instances", self.num_instances, min_value=1),
        )
        for name in ("admission_latency_us", "routing_latency_us", "snapshot_refresh_interval_us"):
            set_field(self, name, _non_negative_int(f"cluster.{name}", getattr(self, name)))
        capacity = check_int(
            "cluster.prefix_index_capacity_blocks", self.prefix_index_capacity_blocks, min_value=1
        )
        set_field(self, "prefix_index_capacity_blocks", capacity)
        delay = _non_negative_int("cluster.cache_signal_delay_us", self.cache_signal_delay_us)
        set_field(self, "cache_signal_delay_us", delay)
        set_field(self, "pd", _as_section(self.pd, PDConfig, "cluster.pd", "P/D settings"))
        set_field(self, "gateway", _as_section(self.gateway, GatewayConfig, "cluster.gateway",
                                               "gateway settings"))
        if self.pd.pooled_instances > self.num_instances:
            raise ConfigError("cluster.pd", "prefill + decode + shared instances "
                              f"({self.pd.pooled_instances}) must not exceed "
                              f"cluster.num_instances ({self.num_instances})")


# --------------------------------------------------------------------------- policies


def _program_section(section: Any, site: str) -> None:
    """Check a section's program fields (``program``, ``tree``, ``params``): a tree becomes
    its expression (``program``), params a tuple of (name, value) pairs; with policy
    ``program`` one of them must be given. The compiled program is ``section.compiled()``."""
    from blisjax.program import compile_program  # the program package imports config

    p = f"policy.{site}"
    params = section.params
    if isinstance(params, Mapping):
        params = tuple(params.items())
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise ConfigError(f"{p}.params", f"must be a mapping of names to numbers, got {params!r}")
    pairs = tuple(params)
    if any(not (isinstance(x, (tuple, list)) and len(x) == 2) for x in pairs):
        raise ConfigError(f"{p}.params", f"must be a mapping of names to numbers, got {params!r}")
    pairs = tuple((k, v) for k, v in pairs)
    if section.tree is not None and section.program:
        raise ConfigError(p, "give program or tree, not both")
    if section.tree is None and not section.program:
        if section.policy == "program":
            raise ConfigError(f"{p}.program", "policy 'program' needs a program (an "
                              "expression) or a tree")
        if pairs:
            raise ConfigError(f"{p}.params", "parameters need a program or a tree")
        set_field(section, "params", ())
        return
    compiled = compile_program(site, program=section.program or None, tree=section.tree,
                               params=dict(pairs), path=p)
    set_field(section, "program", compiled.text)
    set_field(section, "tree", None)
    set_field(section, "params", compiled.params)


def _compiled(section: Any, site: str):
    """The section's ``PolicyProgram`` (None without a program)."""
    if not section.program:
        return None
    from blisjax.program import compile_program

    return compile_program(site, program=section.program, params=dict(section.params),
                           path=f"policy.{site}")


@dataclass(frozen=True)
class AdmissionConfig:
    """Admission policy (docs/semantics.md §5.3).

    Attributes:
      policy: always-admit | token-bucket | reject-all | rate-limit | tenant-quota.
      token_bucket_capacity: bucket size, input tokens, >= 0 (token-bucket).
      token_bucket_refill_rate: refill, input tokens per second, >= 0 (token-bucket).
      rate_limit_rps: sustained admissions, requests per second, >= 0 (rate-limit).
      rate_limit_burst: burst size, requests, >= 0 (rate-limit).
      tenant_max_in_flight: per-tenant cap on admitted, unfinished requests (tenant-quota).
      default_tenant_max_in_flight: cap for tenants not listed, >= 0.
      program, tree, params: policy ``program`` admits iff the program's value is > 0
        (docs/policy-programs.md): an expression, or a decision tree (stored as its
        expression), and its named parameters (name → number).
      shed_queue_depth: load-shed admits only while the routable instances' queued requests
        (router snapshots, summed) are fewer than this, >= 0 (0: not checked).
      shed_kv_utilization: load-shed admits only while their mean KV utilization (router
        snapshots) is below this, in [0, 1] (0: not checked).
      tenant_bucket_capacity, tenant_bucket_refill_rate: tenant-bucket's per-tenant bucket
        size (input tokens) and refill (input tokens per second), >= 0; tenants not listed get
        ``default_tenant_bucket_capacity`` / ``default_tenant_bucket_refill_rate``.
    """

    policy: str = "always-admit"
    token_bucket_capacity: float = 10000.0
    token_bucket_refill_rate: float = 1000.0
    rate_limit_rps: float = 100.0
    rate_limit_burst: float = 100.0
    tenant_max_in_flight: tuple[tuple[str, int], ...] = ()
    default_tenant_max_in_flight: int = 1000
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()
    shed_queue_depth: int = 0
    shed_kv_utilization: float = 0.0
    tenant_bucket_capacity: tuple[tuple[str, float], ...] = ()
    default_tenant_bucket_capacity: float = 10000.0
    tenant_bucket_refill_rate: tuple[tuple[str, float], ...] = ()
    default_tenant_bucket_refill_rate: float = 1000.0

    def __post_init__(self) -> None:
        p = "policy.admission"
        check_choice(f"{p}.policy", self.policy, ADMISSION_POLICIES)
        _program_section(self, "admission")
        for name in (
            "token_bucket_capacity",
            "token_bucket_refill_rate",
            "rate_limit_rps",
            "rate_limit_burst",
        ):
            set_field(self, name, check_knob(f"{p}.{name}", getattr(self, name), min_value=0))
        limits = check_pairs(
            f"{p}.tenant_max_in_flight", self.tenant_max_in_flight, _name_key, _non_negative_int
        )
        set_field(self, "tenant_max_in_flight", limits)
        default = _non_negative_int(
            f"{p}.default_tenant_max_in_flight", self.default_tenant_max_in_flight
        )
        set_field(self, "default_tenant_max_in_flight", default)
        set_field(self, "shed_queue_depth",
                  _non_negative_int(f"{p}.shed_queue_depth", self.shed_queue_depth))
        set_field(self, "shed_kv_utilization",
                  check_knob(f"{p}.shed_kv_utilization", self.shed_kv_utilization,
                             min_value=0, max_value=1))
        for name in ("tenant_bucket_capacity", "tenant_bucket_refill_rate"):
            set_field(self, name, check_pairs(
                f"{p}.{name}", getattr(self, name), _name_key,
                lambda path, v: check_knob(path, v, min_value=0)))
            default = f"default_{name}"
            set_field(self, default, check_knob(f"{p}.{default}", getattr(self, default),
                                                min_value=0))

    def compiled(self):
        """The admission ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "admission")

    def max_in_flight(self, tenant: str) -> int:
        """In-flight cap of ``tenant`` under tenant-quota."""
        return dict(self.tenant_max_in_flight).get(tenant, self.default_tenant_max_in_flight)

    def tenant_bucket_table(self, tenants: tuple[str, ...]) -> tuple[tuple[float, float], ...]:
        """tenant-bucket's (capacity, refill per second) of each tenant, indexed by the
        workload's tenant code."""
        cap, rate = dict(self.tenant_bucket_capacity), dict(self.tenant_bucket_refill_rate)
        return tuple((float(cap.get(t, self.default_tenant_bucket_capacity)),
                      float(rate.get(t, self.default_tenant_bucket_refill_rate)))
                     for t in tenants)

    def max_in_flight_table(self, tenants: tuple[str, ...]) -> tuple[int, ...]:
        """``max_in_flight`` of each tenant, indexed by the workload's tenant code."""
        return tuple(self.max_in_flight(t) for t in tenants)


def _slo_score(path: str, value: Any) -> float:
    limit = SLO_CLASS_SCORE_LIMIT
    return check_knob(path, value, min_value=-limit, max_value=limit)


@dataclass(frozen=True)
class PriorityConfig:
    """Request priority, recomputed each step; higher = more urgent (docs/semantics.md Decision 5).

    Attributes:
      policy: constant | slo-based | slo-class | tenant-priority | deadline-aware.
      age_weight: slo-based score per second of age (negative = BLIS's inverted-slo).
      slo_class_scores: slo-class score per SLO class, each in [-100, 100]; classes not listed
        score 3.0 (BLIS: unknown classes score as "standard").
      tenant_scores: tenant-priority score per tenant (finite).
      default_tenant_score: tenant-priority score of tenants not listed.
      no_deadline_slack_s: deadline-aware slack, seconds, assumed for requests without a
        deadline (> 0).
      program, tree, params: policy ``program`` scores a request by the program's value
        (docs/policy-programs.md; see ``AdmissionConfig``).
    """

    policy: str = "constant"
    age_weight: float = 1.0
    slo_class_scores: tuple[tuple[str, float], ...] = DEFAULT_SLO_CLASS_SCORES
    tenant_scores: tuple[tuple[str, float], ...] = ()
    default_tenant_score: float = 0.0
    no_deadline_slack_s: float = 1000.0
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        p = "policy.priority"
        check_choice(f"{p}.policy", self.policy, PRIORITY_POLICIES)
        _program_section(self, "priority")
        set_field(self, "age_weight", _knob(f"{p}.age_weight", self.age_weight))
        scores = check_pairs(
            f"{p}.slo_class_scores", self.slo_class_scores, _choice_key(SLO_CLASS_NAMES), _slo_score
        )
        set_field(self, "slo_class_scores", scores)
        set_field(
            self,
            "tenant_scores",
            check_pairs(f"{p}.tenant_scores", self.tenant_scores, _name_key, _knob),
        )
        set_field(
            self,
            "default_tenant_score",
            _knob(f"{p}.default_tenant_score", self.default_tenant_score),
        )
        slack = check_knob(
            f"{p}.no_deadline_slack_s", self.no_deadline_slack_s, min_value=0, min_open=True
        )
        set_field(self, "no_deadline_slack_s", slack)

    def compiled(self):
        """The priority ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "priority")

    def slo_class_score(self, slo_class: str) -> float:
        """slo-class score of a class name ("" = no class)."""
        return dict(self.slo_class_scores).get(slo_class, UNKNOWN_SLO_CLASS_SCORE)

    def tenant_score(self, tenant: str) -> float:
        """tenant-priority score of a tenant."""
        return dict(self.tenant_scores).get(tenant, self.default_tenant_score)

    def slo_class_score_table(self) -> tuple[float, ...]:
        """``slo_class_score`` of every SLO class, indexed by its code (``SLO_CLASS_NAMES``)."""
        return tuple(float(self.slo_class_score(c)) for c in SLO_CLASS_NAMES)

    def tenant_score_table(self, tenants: tuple[str, ...]) -> tuple[float, ...]:
        """``tenant_score`` of each tenant, indexed by the workload's tenant code."""
        return tuple(float(self.tenant_score(t)) for t in tenants)


@dataclass(frozen=True)
class ScorerWeight:
    """One scorer of the weighted routing policy and its (un-normalized) weight >= 0."""

    name: str
    weight: float

    def __post_init__(self) -> None:
        check_choice("policy.routing.scorers.name", self.name, SCORER_NAMES)
        set_field(
            self,
            "weight",
            check_knob(f"policy.routing.scorers[{self.name!r}].weight", self.weight, min_value=0),
        )


DEFAULT_SCORERS: tuple[ScorerWeight, ...] = (
    ScorerWeight("prefix-affinity", 3.0),
    ScorerWeight("queue-depth", 2.0),
    ScorerWeight("kv-utilization", 2.0),
)


def _as_scorer(value: Any) -> ScorerWeight:
    if isinstance(value, ScorerWeight):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"name", "weight"}
        if unknown or "name" not in value or "weight" not in value:
            raise ConfigError(
                "policy.routing.scorers",
                f"entries need exactly name and weight, got {dict(value)!r}",
            )
        return ScorerWeight(value["name"], value["weight"])
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return ScorerWeight(value[0], value[1])
    raise ConfigError(
        "policy.routing.scorers", f"entries must be ScorerWeight(name, weight), got {value!r}"
    )


@dataclass(frozen=True)
class RoutingConfig:
    """Routing policy (docs/semantics.md §5.6).

    Attributes:
      policy: round-robin | least-loaded | always-busiest | weighted.
      scorers: weighted-policy scorers in evaluation order; weights are normalized to sum 1 by
        the router, so only ratios matter; at least one weight must be > 0.
      tie_break: how least-loaded and weighted routing choose among tied instances:
        blis-random (BLIS's draw from its "router" random stream, seeded from ``seed``; only
        when more than one instance ties) | lowest-index. Also program routing's ties.
      program, tree, params: policy ``program`` scores each candidate instance by the
        program's value, the highest wins (docs/policy-programs.md; see ``AdmissionConfig``).
    """

    policy: str = "round-robin"
    scorers: tuple[ScorerWeight, ...] = DEFAULT_SCORERS
    tie_break: str = "blis-random"
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        check_choice("policy.routing.policy", self.policy, ROUTING_POLICIES)
        _program_section(self, "routing")
        check_choice("policy.routing.tie_break", self.tie_break, TIE_BREAKS)
        if isinstance(self.scorers, (str, bytes, Mapping)) or not hasattr(self.scorers, "__iter__"):
            raise ConfigError(
                "policy.routing.scorers", f"must be a list of scorers, got {self.scorers!r}"
            )
        scorers = tuple(_as_scorer(s) for s in self.scorers)
        set_field(self, "scorers", scorers)
        if self.policy == "weighted" and not scorers:
            raise ConfigError(
                "policy.routing.scorers", "must list at least one scorer for policy 'weighted'"
            )
        if scorers and all(s.weight == 0 for s in scorers):
            raise ConfigError("policy.routing.scorers", "weights must not all be 0")

    def compiled(self):
        """The routing ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "routing")

    def normalized_weights(self) -> tuple[float, ...]:
        """Scorer weights divided by their sum (the router's view), in scorer order."""
        total = math.fsum(s.weight for s in self.scorers)
        return tuple(s.weight / total for s in self.scorers)


@dataclass(frozen=True)
class SchedulerConfig:
    """Instance wait-queue order (docs/semantics.md §5.9): fcfs | priority-fcfs | sjf."""

    policy: str = "fcfs"

    def __post_init__(self) -> None:
        check_choice("policy.scheduler.policy", self.policy, SCHEDULER_POLICIES)


@dataclass(frozen=True)
class PolicyConfig:
    """The control policies (a BLIS policy bundle plus our extra knobs)."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)

    def __post_init__(self) -> None:
        set_field(self, "autoscaler", as_autoscaler(self.autoscaler))
        _ensure_type("policy.admission", self.admission, AdmissionConfig)
        _ensure_type("policy.priority", self.priority, PriorityConfig)
        _ensure_type("policy.routing", self.routing, RoutingConfig)
        _ensure_type("policy.scheduler", self.scheduler, SchedulerConfig)


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class SLOTarget:
    """Per-class latency targets in milliseconds; 0 = not checked (docs/semantics.md §6.4)."""

    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "itl_ms", "e2e_ms"):
            set_field(
                self,
                name,
                check_float(f"metrics.slo_targets.{name}", getattr(self, name), min_value=0),
            )


def _as_slo_target(path: str, value: Any) -> SLOTarget:
    if isinstance(value, SLOTarget):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"ttft_ms", "itl_ms", "e2e_ms"})
        if unknown:
            raise ConfigError(
                f"{path}.{unknown[0]}", "unknown key; allowed keys: ttft_ms, itl_ms, e2e_ms"
            )
        # checked here so that an error names the table and the entry, not SLOTarget's field
        return SLOTarget(**{k: check_float(f"{path}.{k}", v, min_value=0)
                            for k, v in value.items()})
    raise ConfigError(
        path, f"must be an SLOTarget or a mapping of ttft_ms/itl_ms/e2e_ms, got {value!r}"
    )


def _fitness_weight(path: str, value: Any) -> float:
    return check_float(path, value, min_value=0)


@dataclass(frozen=True)
class MetricsConfig:
    """What the metrics layer reports.

    Attributes:
      slo_targets: SLO class → targets; class "default" is the empty class "".
      tenant_slo_targets: tenant name → targets (the same rule over a tenant's requests;
        tenant "" is the unnamed tenant); reported as ``tenant_slo_attainment``.
      fitness_weights: fitness component → weight >= 0 (not normalized, docs/semantics.md §6.5).
      kv_thrash_window_us: the CPU tier's thrashing anomaly counts reloads of a block whose GPU
        copy was evicted less than this many µs before (>= 0; 0 counts none).
      gpu_price_per_hour: price of one GPU-hour (>= 0, any currency), for the ``cost`` metric;
        None = the hardware's indicative price (``blisjax.config.hardware.GPU_PRICE_PER_HOUR``,
        1.0 for a GPU not listed there, which makes ``cost`` the GPU-hours).
    """

    slo_targets: tuple[tuple[str, SLOTarget], ...] = ()
    fitness_weights: tuple[tuple[str, float], ...] = ()
    kv_thrash_window_us: int = 1_000_000
    gpu_price_per_hour: float | None = None
    tenant_slo_targets: tuple[tuple[str, SLOTarget], ...] = ()

    def __post_init__(self) -> None:
        targets = check_pairs(
            "metrics.slo_targets", self.slo_targets, _choice_key(SLO_TARGET_CLASSES), _as_slo_target
        )
        set_field(self, "slo_targets", targets)
        set_field(self, "tenant_slo_targets", check_pairs(
            "metrics.tenant_slo_targets", self.tenant_slo_targets, _name_key, _as_slo_target))
        weights = check_pairs(
            "metrics.fitness_weights",
            self.fitness_weights,
            _choice_key(FITNESS_KEYS),
            _fitness_weight,
        )
        set_field(self, "fitness_weights", weights)
        set_field(self, "kv_thrash_window_us", check_int(
            "metrics.kv_thrash_window_us", self.kv_thrash_window_us, min_value=0,
            max_value=INT64_MAX))
        if self.gpu_price_per_hour is not None:
            set_field(self, "gpu_price_per_hour", check_float(
                "metrics.gpu_price_per_hour", self.gpu_price_per_hour, min_value=0))


# --------------------------------------------------------------------------- compatibility


@dataclass(frozen=True)
class CompatConfig:
    """Compatibility with BLIS's own behaviour where it departs from what a real cluster does
    (docs/semantics.md Decision 12).

    Attributes:
      blis_quirks: reproduce BLIS exactly, its bugs included, so that any BLIS run replays
        request by request; off (the default), blisjax does what a real cluster does. The
        behaviours it switches are listed in docs/blis.md and
        docs/semantics.md; each feature that has one adds its entry there.
    """

    blis_quirks: bool = False

    def __post_init__(self) -> None:
        set_field(self, "blis_quirks", check_bool("compat.blis_quirks", self.blis_quirks))


# --------------------------------------------------------------------------- top level


@dataclass(frozen=True)
class SimConfig:
    """One simulation: model, hardware, engine, latency, cluster, policies, workload, metrics.

    Attributes:
      model: model id (``org/Name``), shipped name, or config.json path.
      hardware: GPU name in hardware_config.json.
      workload: raw BLIS workload-spec v2 mapping, parsed by ``blisjax.workload`` (opaque here;
        deep-copied, and excluded from the hash); None = workload given elsewhere (e.g. a trace).
      seed: master seed (int64).
      horizon_us: simulation horizon, µs, in [1, 2^63 - 1].
    """

    model: str = "meta-llama/llama-3.1-8b-instruct"
    hardware: str = "H100"
    engine: EngineConfig = field(default_factory=EngineConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    workload: dict | None = field(default=None, hash=False)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)
    seed: int = 42
    horizon_us: int = INT64_MAX

    def __post_init__(self) -> None:
        check_str("model", self.model)
        check_str("hardware", self.hardware)
        for name, cls in (
            ("engine", EngineConfig),
            ("latency", LatencyConfig),
            ("cluster", ClusterConfig),
            ("policy", PolicyConfig),
            ("metrics", MetricsConfig),
            ("compat", CompatConfig),
        ):
            _ensure_type(name, getattr(self, name), cls)
        if self.workload is not None:
            if not isinstance(self.workload, Mapping):
                raise ConfigError(
                    "workload",
                    f"must be a mapping (workload-spec v2) or null, got {self.workload!r}",
                )
            set_field(self, "workload", copy.deepcopy(dict(self.workload)))
        set_field(
            self, "seed", check_int("seed", self.seed, min_value=INT64_MIN, max_value=INT64_MAX)
        )
        set_field(
            self,
            "horizon_us",
            check_int("horizon_us", self.horizon_us, min_value=1, max_value=INT64_MAX),
        )
        if self.latency.model == "roofline" and self.engine.data_parallel_size > 1:
            raise ConfigError(
                "engine.data_parallel_size", "must be 1 with latency.model 'roofline' (as BLIS)"
            )
        cluster = self.cluster
        if cluster.pd.enabled:
            for site in ("routing", "admission", "priority"):
                if getattr(self.policy, site).policy == "program":
                    raise ConfigError(f"policy.{site}.policy", "'program' is not available "
                                      "with P/D pools (cluster.pd) yet")
        check_cluster_autoscaling(self.policy.autoscaler, cluster.num_instances,
                                  cluster.node_pools, cluster.lifecycle,
                                  self.engine.tensor_parallel_size, cluster.pd.enabled)
