"""Autoscaling, instance lifecycle and node pools (docs/semantics.md Decision 16).

``AutoscalerConfig`` is a control policy (``policy.autoscaler``); ``LifecycleConfig`` and
``NodePool`` describe the cluster (``cluster.lifecycle``, ``cluster.node_pools``). The
formulas each template applies are in docs/autoscaling.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blisjax.config._checks import (
    ConfigError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
    set_field,
)
from blisjax.config.codes import AutoscalerPolicy, DrainPolicy

AUTOSCALER_POLICIES = AutoscalerPolicy.labels()
DRAIN_POLICIES = DrainPolicy.labels()


def _section_mapping(path: str, value: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """``value``, a mapping whose keys are all in ``allowed``; else a ``ConfigError``."""
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, got {value!r}")
    for key in value:
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", f"unknown key; allowed keys: {', '.join(allowed)}")
    return value


def _as(cls: type, path: str, value: Any) -> Any:
    """``value`` as a ``cls``: itself, or built from a mapping of its fields."""
    if isinstance(value, cls):
        return value
    return cls(**_section_mapping(path, value, tuple(f.name for f in dataclasses.fields(cls))))


@dataclass(frozen=True)
class DelaySpec:
    """A random delay in seconds (BLIS's ``{mean, stddev}``): exactly ``mean_s`` when
    ``stddev_s`` is 0 (no random draw), else max(0, mean + stddev·N(0,1)) drawn from the
    delay's own random stream. Converted to µs by truncation."""

    mean_s: float = 0.0
    stddev_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("mean_s", "stddev_s"):
            set_field(self, name, _delay_seconds(f"delay.{name}", getattr(self, name)))

    @property
    def random(self) -> bool:
        """The delay draws from its random stream."""
        return self.stddev_s > 0


def _delay_seconds(path: str, value: Any) -> float:
    return check_float(path, value, min_value=0, max_value=1e9)


def _delay(path: str, value: Any) -> DelaySpec:
    """A ``DelaySpec`` from itself or a mapping, errors naming the field under ``path``."""
    if isinstance(value, Mapping):
        value = {k: _delay_seconds(f"{path}.{k}", v)
                 for k, v in _section_mapping(path, value, ("mean_s", "stddev_s")).items()}
    return _as(DelaySpec, path, value)


@dataclass(frozen=True)
class NodePool:
    """Nodes instances are placed on (BLIS's ``node_pools``). An instance needs
    ``engine.tensor_parallel_size`` GPUs of one node; pools are tried in order, their nodes
    in index order. ``initial_nodes`` are ready at time 0; by default (Decision 12) a scale-up
    that finds no room provisions one more node, up to ``max_nodes``, ready after
    ``provisioning_delay``; with ``--blis-quirks`` no node is ever provisioned.

    Attributes:
      name: pool name (unique); its nodes are ``<name>-<k>``.
      gpu_type: GPU of its nodes: an instance placed there runs at that GPU's speed where the
        hardware table knows it (its roofline rates, its shipped coefficients), else at
        ``hardware``'s; with ``--blis-quirks`` always at ``hardware``'s, as BLIS.
      gpus_per_node: GPUs per node, >= 1.
      gpu_memory_gib: memory per GPU, GiB, > 0 (sizes the KV cache when
        ``engine.total_kv_blocks`` is not given).
      initial_nodes, min_nodes, max_nodes: node counts; initial and min <= max, max >= 1.
      provisioning_delay: time a new node takes to become ready.
      cost_per_hour: cost of one instance placed on this pool per hour, >= 0.
    """

    name: str = "pool"
    gpu_type: str = "H100"
    gpus_per_node: int = 8
    gpu_memory_gib: float = 80.0
    initial_nodes: int = 1
    min_nodes: int = 0
    max_nodes: int = 1
    provisioning_delay: DelaySpec = field(default_factory=DelaySpec)
    cost_per_hour: float = 1.0

    def __post_init__(self) -> None:
        check_str("cluster.node_pools[].name", self.name)
        p = f"cluster.node_pools[{self.name}]"
        check_str(f"{p}.gpu_type", self.gpu_type)
        set_field(self, "gpus_per_node", check_int(f"{p}.gpus_per_node", self.gpus_per_node,
                                                   min_value=1))
        set_field(self, "gpu_memory_gib", check_float(f"{p}.gpu_memory_gib", self.gpu_memory_gib,
                                                      min_value=0, min_open=True))
        set_field(self, "max_nodes", check_int(f"{p}.max_nodes", self.max_nodes, min_value=1))
        for name in ("initial_nodes", "min_nodes"):
            set_field(self, name, check_int(f"{p}.{name}", getattr(self, name), min_value=0,
                                            max_value=self.max_nodes))
        set_field(self, "provisioning_delay",
                  _delay(f"{p}.provisioning_delay", self.provisioning_delay))
        set_field(self, "cost_per_hour", check_float(f"{p}.cost_per_hour", self.cost_per_hour,
                                                     min_value=0))

    def slots_per_node(self, tp: int) -> int:
        """Instances of ``tp`` GPUs one node holds."""
        return self.gpus_per_node // tp


def as_node_pools(value: Any) -> tuple[NodePool, ...]:
    """``cluster.node_pools``: a list of pools (mappings or ``NodePool``) with unique names."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ConfigError("cluster.node_pools", f"must be a list of node pools, got {value!r}")
    pools = [_as(NodePool, f"cluster.node_pools[{i}]", item) for i, item in enumerate(value)]
    names = [p.name for p in pools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"cluster.node_pools[{i}].name", f"duplicate pool name {name!r}")
    return tuple(pools)


@dataclass(frozen=True)
class LifecycleConfig:
    """How instances come up, warm up and what they cost (Decision 16).

    Attributes:
      loading_delay: model-loading time of a new instance (Loading → WarmingUp / Active).
      warm_start_initial_instances: the ``cluster.num_instances`` initial instances start
        ready (Active, or WarmingUp with a warm-up); false = they load first.
      warm_up_requests: requests an instance completes while WarmingUp before it is Active,
        >= 0 (0 = no warm-up).
      warm_up_factor: >= 1. By default a WarmingUp instance's steps take this factor longer
        (truncated to µs); with ``--blis-quirks`` its first ``warm_up_requests`` routed
        requests get their TTFT multiplied by it after the run, as BLIS does.
      cost_per_hour: cost of one instance per hour without node pools, >= 0 (with node pools
        each pool's ``cost_per_hour``).
    """

    loading_delay: DelaySpec = field(default_factory=DelaySpec)
    warm_start_initial_instances: bool = True
    warm_up_requests: int = 0
    warm_up_factor: float = 1.0
    cost_per_hour: float = 1.0

    def __post_init__(self) -> None:
        p = "cluster.lifecycle"
        set_field(self, "loading_delay", _delay(f"{p}.loading_delay", self.loading_delay))
        set_field(self, "warm_start_initial_instances", check_bool(
            f"{p}.warm_start_initial_instances", self.warm_start_initial_instances))
        set_field(self, "warm_up_requests", check_int(f"{p}.warm_up_requests",
                                                      self.warm_up_requests, min_value=0))
        set_field(self, "warm_up_factor", check_float(f"{p}.warm_up_factor", self.warm_up_factor,
                                                      min_value=1, max_value=1e6))
        set_field(self, "cost_per_hour", check_float(f"{p}.cost_per_hour", self.cost_per_hour,
                                                     min_value=0))


def as_lifecycle(value: Any) -> LifecycleConfig:
    return _as(LifecycleConfig, "cluster.lifecycle", value)


@dataclass(frozen=True)
class AutoscalerConfig:
    """The autoscaling policy (Decision 16; formulas in docs/autoscaling.md).

    Every ``interval_us`` a tick reads the routable instances and decides a change in replicas;
    the change takes effect ``actuation_delay`` later. Scale-ups place new instances (which
    load before they are routable); scale-downs drain Active instances, oldest first.

    Attributes:
      policy: none | threshold | target-utilization | queue-depth | blis-saturation.
      interval_us: time between ticks, µs, >= 1.
      min_replicas: fewest instances a scale-down leaves (counting those still coming up), >= 0.
      max_replicas: most instances that hold resources at once (draining ones included);
        the JAX engine's instance slots. 0 = what the node pools hold (GPUs / tensor
        parallelism), or ``cluster.num_instances`` without pools.
      max_scale_up_step, max_scale_down_step: most replicas one decision adds / removes, >= 0
        (0 = no limit).
      cooldown_us: threshold, target-utilization and queue-depth: no scale-up within this
        long of the last scale-up, no scale-down within this long of the last scale of either
        direction; for every policy, the window of the scale-oscillation count. µs, >= 0.
      actuation_delay: decision → actuation (BLIS's HPA scrape delay).
      drain_policy: wait | immediate | redirect (what a draining instance does with its
        requests).
      scale_up_utilization, scale_down_utilization: threshold: mean KV utilization of the
        routable instances above which one replica is added / below which one is removed;
        0 <= down < up <= 1.
      target_utilization: target-utilization: the mean KV utilization to hold, in (0, 1].
      utilization_tolerance: target-utilization: no change while |mean / target − 1| is
        within this, in [0, 1).
      target_queue_depth: queue-depth: requests queued or running per replica, > 0.
      kv_cache_threshold, saturation_up_threshold, saturation_down_boundary, avg_input_tokens:
        blis-saturation's analyzer (BLIS's ``kv_cache_threshold``, ``scale_up_threshold``,
        ``scale_down_boundary``, ``avg_input_tokens``): threshold in (0, 1], the others > 0,
        boundary < up threshold.
      scale_up_window_us, scale_down_window_us: blis-saturation's stabilization windows, µs,
        >= 0.
    """

    policy: str = "none"
    interval_us: int = 1_000_000
    min_replicas: int = 1
    max_replicas: int = 0
    max_scale_up_step: int = 0
    max_scale_down_step: int = 0
    cooldown_us: int = 60_000_000
    actuation_delay: DelaySpec = field(default_factory=DelaySpec)
    drain_policy: str = "wait"
    scale_up_utilization: float = 0.8
    scale_down_utilization: float = 0.3
    target_utilization: float = 0.6
    utilization_tolerance: float = 0.1
    target_queue_depth: float = 8.0
    kv_cache_threshold: float = 0.8
    saturation_up_threshold: float = 0.8
    saturation_down_boundary: float = 0.4
    avg_input_tokens: float = 512.0
    scale_up_window_us: int = 0
    scale_down_window_us: int = 0

    def __post_init__(self) -> None:
        p = "policy.autoscaler"
        check_choice(f"{p}.policy", self.policy, AUTOSCALER_POLICIES)
        check_choice(f"{p}.drain_policy", self.drain_policy, DRAIN_POLICIES)
        set_field(self, "interval_us", check_int(f"{p}.interval_us", self.interval_us,
                                                 min_value=1))
        for name in ("min_replicas", "max_replicas", "max_scale_up_step", "max_scale_down_step",
                     "cooldown_us", "scale_up_window_us", "scale_down_window_us"):
            set_field(self, name, check_int(f"{p}.{name}", getattr(self, name), min_value=0))
        if self.max_replicas and self.min_replicas > self.max_replicas:
            raise ConfigError(f"{p}.min_replicas", f"must be <= max_replicas "
                              f"({self.max_replicas}), got {self.min_replicas}")
        set_field(self, "actuation_delay", _delay(f"{p}.actuation_delay", self.actuation_delay))
        unit = dict(min_value=0, max_value=1, min_open=True)
        up = check_float(f"{p}.scale_up_utilization", self.scale_up_utilization, **unit)
        down = check_float(f"{p}.scale_down_utilization", self.scale_down_utilization,
                           min_value=0, max_value=up, max_open=True)
        set_field(self, "scale_up_utilization", up)
        set_field(self, "scale_down_utilization", down)
        set_field(self, "target_utilization", check_float(
            f"{p}.target_utilization", self.target_utilization, **unit))
        set_field(self, "utilization_tolerance", check_float(
            f"{p}.utilization_tolerance", self.utilization_tolerance, min_value=0, max_value=1,
            max_open=True))
        positive = dict(min_value=0, max_value=1e12, min_open=True)
        set_field(self, "target_queue_depth", check_float(
            f"{p}.target_queue_depth", self.target_queue_depth, **positive))
        set_field(self, "kv_cache_threshold", check_float(
            f"{p}.kv_cache_threshold", self.kv_cache_threshold, **unit))
        set_field(self, "saturation_up_threshold", check_float(
            f"{p}.saturation_up_threshold", self.saturation_up_threshold, **positive))
        set_field(self, "saturation_down_boundary", check_float(
            f"{p}.saturation_down_boundary", self.saturation_down_boundary, **positive))
        if self.saturation_down_boundary >= self.saturation_up_threshold:
            raise ConfigError(f"{p}.saturation_down_boundary", "must be < saturation_up_threshold "
                              f"({self.saturation_up_threshold}), got "
                              f"{self.saturation_down_boundary}")
        set_field(self, "avg_input_tokens", check_float(
            f"{p}.avg_input_tokens", self.avg_input_tokens, **positive))

    @property
    def enabled(self) -> bool:
        return self.policy != "none"

    @property
    def code(self) -> AutoscalerPolicy:
        return AutoscalerPolicy.of(self.policy)


def as_autoscaler(value: Any) -> AutoscalerConfig:
    return _as(AutoscalerConfig, "policy.autoscaler", value)


def blis_autoscaler(raw: Any, base: AutoscalerConfig) -> AutoscalerConfig:
    """A BLIS policy bundle's ``autoscaler`` block (docs/autoscaling.md, Configuration) on top of
    ``base``: read only when ``interval_us > 0`` (the policy is then blis-saturation);
    analyzer fields left at 0 keep their defaults; the scrape delay is ``{mean, stddev}`` in
    seconds."""
    p = "policy-config.autoscaler"
    raw = _section_mapping(p, raw, ("interval_us", "scale_up_stabilization_window_us",
                                    "scale_down_stabilization_window_us", "hpa_scrape_delay",
                                    "analyzer"))
    interval = check_float(f"{p}.interval_us", raw.get("interval_us", 0) or 0, min_value=0)
    if interval <= 0:
        return base
    fields: dict[str, Any] = {"policy": "blis-saturation", "interval_us": int(interval)}
    for key, name in (("scale_up_stabilization_window_us", "scale_up_window_us"),
                      ("scale_down_stabilization_window_us", "scale_down_window_us")):
        fields[name] = int(check_float(f"{p}.{key}", raw.get(key, 0) or 0, min_value=0))
    if raw.get("hpa_scrape_delay"):
        fields["actuation_delay"] = _blis_delay(f"{p}.hpa_scrape_delay", raw["hpa_scrape_delay"])
    analyzer = _section_mapping(f"{p}.analyzer", raw.get("analyzer") or {}, (
        "kv_cache_threshold", "scale_up_threshold", "scale_down_boundary", "avg_input_tokens"))
    for key, name in (("kv_cache_threshold", "kv_cache_threshold"),
                      ("scale_up_threshold", "saturation_up_threshold"),
                      ("scale_down_boundary", "saturation_down_boundary"),
                      ("avg_input_tokens", "avg_input_tokens")):
        if analyzer.get(key):  # BLIS: 0 or absent = the default
            fields[name] = analyzer[key]
    return dataclasses.replace(base, **fields)


def blis_cluster_sections(data: Mapping[str, Any], lifecycle: LifecycleConfig) -> dict[str, Any]:
    """A BLIS policy bundle's ``node_pools`` and ``instance_lifecycle`` as ``ClusterConfig``
    fields (the keys among ``node_pools``, ``lifecycle`` that the bundle sets): delays
    ``{mean, stddev}`` in seconds; ``warm_start_initial_instances`` false unless given, as in
    BLIS."""
    out: dict[str, Any] = {}
    pools = data.get("node_pools")
    if pools:
        items = []
        for i, item in enumerate(pools):
            path = f"policy-config.node_pools[{i}]"
            item = dict(_section_mapping(path, item, tuple(
                f.name for f in dataclasses.fields(NodePool))))
            if "provisioning_delay" in item:
                item["provisioning_delay"] = _blis_delay(f"{path}.provisioning_delay",
                                                         item["provisioning_delay"])
            items.append(item)
        out["node_pools"] = as_node_pools(items)
    life = data.get("instance_lifecycle")
    if pools or life:
        p = "policy-config.instance_lifecycle"
        life = _section_mapping(p, life or {}, ("loading_delay", "warm_start_initial_instances"))
        fields = {"warm_start_initial_instances": life.get("warm_start_initial_instances",
                                                           False)}
        if life.get("loading_delay"):
            fields["loading_delay"] = _blis_delay(f"{p}.loading_delay", life["loading_delay"])
        out["lifecycle"] = dataclasses.replace(lifecycle, **fields)
    return out


def _blis_delay(path: str, value: Any) -> DelaySpec:
    """BLIS's ``{mean, stddev}`` in seconds; errors name BLIS's keys."""
    raw = _section_mapping(path, value, ("mean", "stddev"))
    try:
        return _delay(path, {"mean_s": raw.get("mean", 0) or 0,
                             "stddev_s": raw.get("stddev", 0) or 0})
    except ConfigError as err:
        raise ConfigError(err.path.replace(".mean_s", ".mean").replace(".stddev_s", ".stddev"),
                          err.problem) from None


def pool_capacity(pools: tuple[NodePool, ...], tp: int, *, initial: bool = False) -> int:
    """Instances of ``tp`` GPUs the node pools hold: on their ``max_nodes`` (or, with
    ``initial``, their ``initial_nodes``)."""
    return sum(p.slots_per_node(tp) * (p.initial_nodes if initial else p.max_nodes)
               for p in pools)


def pool_maximum(autoscaler: AutoscalerConfig, pd) -> tuple[int, int]:
    """With P/D pools and an autoscaler (docs/autoscaling.md, P/D pools): the most instances
    the prefill and the decode pool may hold, each ``max_replicas`` (0: the pool's initial
    instances); (0, 0) otherwise."""
    if pd is None or not pd.enabled or not autoscaler.enabled:
        return 0, 0
    if autoscaler.max_replicas:
        return autoscaler.max_replicas, autoscaler.max_replicas
    return pd.prefill_instances, pd.decode_instances


def max_replicas(autoscaler: AutoscalerConfig, num_instances: int,
                 pools: tuple[NodePool, ...], tp: int, pd=None) -> int:
    """Instance slots of a run: ``max_replicas``, or what the node pools hold, or the initial
    instances (no autoscaler: always the initial instances). With P/D pools (``pd``): the
    initial instances and, after them, the slots each scaled pool may grow into
    (``pool_maximum``)."""
    if not autoscaler.enabled:
        return num_instances
    if pd is not None and pd.enabled:
        most_p, most_d = pool_maximum(autoscaler, pd)
        return num_instances + most_p - pd.prefill_instances + most_d - pd.decode_instances
    if autoscaler.max_replicas:
        return autoscaler.max_replicas
    return max(num_instances, pool_capacity(pools, tp)) if pools else num_instances


def lifecycle_configured(autoscaler: AutoscalerConfig, pools: tuple[NodePool, ...],
                         lifecycle: LifecycleConfig) -> bool:
    """The configuration models instance lifecycles: an autoscaler, node pools, or a
    lifecycle other than always-up instances."""
    return autoscaler.enabled or bool(pools) or lifecycle != LifecycleConfig()


def check_cluster_autoscaling(autoscaler: AutoscalerConfig, num_instances: int,
                              pools: tuple[NodePool, ...], lifecycle: LifecycleConfig, tp: int,
                              pd=None) -> None:
    """Cross-section checks of the autoscaler, node pools, lifecycle, initial instances and
    P/D pools (``pd``, a ``PDConfig``)."""
    if pools and pool_capacity(pools, tp, initial=True) < num_instances:
        raise ConfigError("cluster.node_pools", f"the initial nodes hold "
                          f"{pool_capacity(pools, tp, initial=True)} instances of "
                          f"{tp} GPU(s); cluster.num_instances is {num_instances}")
    pd_on = pd is not None and pd.enabled
    if pd_on and lifecycle_configured(autoscaler, pools, lifecycle):
        _check_pd_lifecycle(autoscaler, pools, pd)
    if not autoscaler.enabled or pd_on:
        return
    if autoscaler.max_replicas and autoscaler.max_replicas < num_instances:
        raise ConfigError("policy.autoscaler.max_replicas", f"must be >= cluster.num_instances "
                          f"({num_instances}), got {autoscaler.max_replicas}")
    if autoscaler.min_replicas > max_replicas(autoscaler, num_instances, pools, tp):
        raise ConfigError("policy.autoscaler.min_replicas", "must be <= the replica maximum "
                          f"({max_replicas(autoscaler, num_instances, pools, tp)}), got "
                          f"{autoscaler.min_replicas}")


def _check_pd_lifecycle(autoscaler: AutoscalerConfig, pools: tuple[NodePool, ...], pd) -> None:
    """Instance lifecycles with P/D pools: node pools place instances of the engine's TP and
    GPU, so pools of their own TP or GPU are refused with them; the autoscaler scales the
    prefill and the decode pool, each within [min_replicas, its maximum], draining by the
    ``wait`` policy only."""
    if pools:
        for role in ("prefill", "decode"):
            own = getattr(pd, role)
            for name in ("tensor_parallel_size", "hardware"):
                if getattr(own, name) is not None:
                    raise ConfigError(f"cluster.pd.{role}.{name}", "a P/D pool of its own TP or "
                                      "GPU cannot be placed on cluster.node_pools (their nodes "
                                      "hold instances of engine.tensor_parallel_size GPUs of "
                                      "their gpu_type)")
    if not autoscaler.enabled:
        return
    p, d = pd.prefill_instances, pd.decode_instances
    if p == 0 or d == 0:
        raise ConfigError("cluster.pd", "autoscaling scales the prefill and the decode pool: "
                          f"both need instances, got prefill_instances {p} and "
                          f"decode_instances {d}")
    if autoscaler.drain_policy != "wait":
        raise ConfigError("policy.autoscaler.drain_policy", "must be 'wait' with P/D pools "
                          f"(a drained instance finishes its sub-requests), got "
                          f"{autoscaler.drain_policy!r}")
    if autoscaler.max_replicas and autoscaler.max_replicas < max(p, d):
        raise ConfigError("policy.autoscaler.max_replicas", "bounds each P/D pool: must be >= "
                          f"the larger pool's initial instances ({max(p, d)}), got "
                          f"{autoscaler.max_replicas}")
    most = min(pool_maximum(autoscaler, pd))
    if not 1 <= autoscaler.min_replicas <= most:
        raise ConfigError("policy.autoscaler.min_replicas", "bounds each P/D pool: must be in "
                          f"[1, {most}] (the smaller pool's maximum), got "
                          f"{autoscaler.min_replicas}")
