"""Typed, validated configuration of a blisjax simulation.

* :mod:`~blisjax.config.sim` — the frozen ``SimConfig`` tree (engine, latency, cluster, metrics)
  with field-level validation (:class:`ConfigError` names the dotted field path);
  :mod:`~blisjax.config.policy` its policy sections; :mod:`~blisjax.config.fields` the accepted
  names and the checks the sections share.
* :mod:`~blisjax.config.model`, :mod:`~blisjax.config.hardware` — HF ``config.json`` and GPU specs,
  parsed exactly as BLIS does.
* :mod:`~blisjax.config.kv_capacity` — BLIS's KV-block capacity formula.
* :mod:`~blisjax.config.coefficients` — BLIS's blackbox α/β table and its selection rule.
* :mod:`~blisjax.config.resolve` — ``resolve_config``: model + hardware + KV blocks + coefficients.
* :mod:`~blisjax.config.yaml_io`, :mod:`~blisjax.config.flags` — YAML files, BLIS policy bundles
  and BLIS-named CLI flags.
"""

from blisjax.config._checks import ConfigError
from blisjax.config.autoscale import AutoscalerConfig, DelaySpec, LifecycleConfig, NodePool
from blisjax.config.coefficients import (
    BlackboxCoefficients,
    lookup_blackbox_coefficients,
    select_blackbox_coefficients,
    shipped_blackbox_coefficients,
)
from blisjax.config.flags import add_blis_flags, apply_blis_flag_values, apply_blis_flags
from blisjax.config.hardware import HardwareConfig, available_hardware, load_hardware
from blisjax.config.kv_capacity import (
    KVCapacityParamsError,
    compute_total_kv_blocks,
    kv_bytes_per_token_per_gpu,
    model_weight_bytes,
)
from blisjax.config.model import (
    ModelConfig,
    MoEConfig,
    UnknownModelError,
    load_model_config,
    shipped_models,
)
from blisjax.config.pd import PDConfig, PoolOverrides
from blisjax.config.policy import (
    AdmissionConfig,
    PolicyConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
    ScorerWeight,
)
from blisjax.config.resolve import ResolvedConfig, resolve_config
from blisjax.config.sim import (
    ClusterConfig,
    CompatConfig,
    EngineConfig,
    GatewayConfig,
    LatencyConfig,
    MetricsConfig,
    SimConfig,
    SLOTarget,
)
from blisjax.config.yaml_io import (
    apply_blis_bundle,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_blis_policy_config,
    load_config,
    save_config,
)

__all__ = [
    "AdmissionConfig",
    "AutoscalerConfig",
    "BlackboxCoefficients",
    "ClusterConfig",
    "PDConfig",
    "PoolOverrides",
    "ConfigError",
    "EngineConfig",
    "GatewayConfig",
    "HardwareConfig",
    "KVCapacityParamsError",
    "LatencyConfig",
    "CompatConfig",
    "DelaySpec",
    "LifecycleConfig",
    "MetricsConfig",
    "MoEConfig",
    "ModelConfig",
    "NodePool",
    "PolicyConfig",
    "PriorityConfig",
    "ResolvedConfig",
    "RoutingConfig",
    "SLOTarget",
    "SchedulerConfig",
    "ScorerWeight",
    "SimConfig",
    "UnknownModelError",
    "add_blis_flags",
    "apply_blis_bundle",
    "apply_blis_flag_values",
    "apply_blis_flags",
    "available_hardware",
    "compute_total_kv_blocks",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "kv_bytes_per_token_per_gpu",
    "load_blis_policy_config",
    "load_config",
    "load_hardware",
    "load_model_config",
    "lookup_blackbox_coefficients",
    "model_weight_bytes",
    "resolve_config",
    "save_config",
    "select_blackbox_coefficients",
    "shipped_blackbox_coefficients",
    "shipped_models",
]
