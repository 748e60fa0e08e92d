"""The simulation configuration: frozen, hashable, validated on construction.

Every field is checked in ``__post_init__``; a bad value raises :class:`ConfigError` whose message
names the dotted field path and the allowed range, e.g.
``engine.max_num_running_reqs: must be an integer >= 1, got 0``. Tables are tuples of pairs (not
dicts) so that configs can be hashed and used as cache keys. Facts that need the model or the
hardware (KV capacity, shipped coefficients) are checked by :func:`blisjax.config.resolve_config`.
"""

from __future__ import annotations

import copy
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
    LifecycleConfig,
    NodePool,
    as_lifecycle,
    as_node_pools,
    check_cluster_autoscaling,
    lifecycle_configured,
)
from blisjax.config.codes import FITNESS_KEYS
from blisjax.config.fields import (
    LATENCY_MODELS,
    PREEMPTION_POLICIES,
    SLO_TARGET_CLASSES,
    as_section,
    choice_key,
    ensure_type,
    name_key,
    non_negative_int,
)
from blisjax.config.pd import PDConfig
from blisjax.config.policy import PolicyConfig
from blisjax.limits import INT64_MAX

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
            set_field(self, name, non_negative_int(f"engine.{name}", getattr(self, name)))
        check_bool("engine.enable_prefix_caching", self.enable_prefix_caching)
        check_choice("engine.preemption_policy", self.preemption_policy, PREEMPTION_POLICIES)
        for name in ("kv_cpu_blocks", "kv_transfer_base_latency_us"):
            set_field(self, name, non_negative_int(f"engine.{name}", getattr(self, name)))
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
                  non_negative_int(f"{p}.max_queue_depth", self.max_queue_depth))
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
            set_field(self, name, non_negative_int(f"cluster.{name}", getattr(self, name)))
        capacity = check_int(
            "cluster.prefix_index_capacity_blocks", self.prefix_index_capacity_blocks, min_value=1
        )
        set_field(self, "prefix_index_capacity_blocks", capacity)
        delay = non_negative_int("cluster.cache_signal_delay_us", self.cache_signal_delay_us)
        set_field(self, "cache_signal_delay_us", delay)
        set_field(self, "pd", as_section(self.pd, PDConfig, "cluster.pd", "P/D settings"))
        set_field(self, "gateway", as_section(self.gateway, GatewayConfig, "cluster.gateway",
                                               "gateway settings"))
        if self.pd.pooled_instances > self.num_instances:
            raise ConfigError("cluster.pd", "prefill + decode + shared instances "
                              f"({self.pd.pooled_instances}) must not exceed "
                              f"cluster.num_instances ({self.num_instances})")


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
            "metrics.slo_targets", self.slo_targets, choice_key(SLO_TARGET_CLASSES), _as_slo_target
        )
        set_field(self, "slo_targets", targets)
        set_field(self, "tenant_slo_targets", check_pairs(
            "metrics.tenant_slo_targets", self.tenant_slo_targets, name_key, _as_slo_target))
        weights = check_pairs(
            "metrics.fitness_weights",
            self.fitness_weights,
            choice_key(FITNESS_KEYS),
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
            ensure_type(name, getattr(self, name), cls)
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
                                  self.engine.tensor_parallel_size, cluster.pd)
        if cluster.pd.enabled and self.compat.blis_quirks and lifecycle_configured(
                self.policy.autoscaler, cluster.node_pools, cluster.lifecycle):
            raise ConfigError("compat.blis_quirks", "instance lifecycles with P/D pools are "
                              "blisjax's own (BLIS adds autoscaled instances to no pool); "
                              "run them without --blis-quirks")
