"""YAML form of :class:`SimConfig`, and BLIS policy-bundle files.

Our schema mirrors the dataclasses: top-level ``model, hardware, engine, latency, cluster, policy,
workload, metrics, seed, horizon_us``; each section's keys are the dataclass field names. Tables
(``tenant_max_in_flight``, ``slo_class_scores``, ``tenant_scores``, ``slo_targets``,
``tenant_slo_targets``, ``fitness_weights``, a policy program's ``params``) are YAML mappings;
``policy.routing.scorers`` is a list of ``{name, weight}``; a program's decision ``tree`` is
written as its expression (``program``).
Unknown keys are errors. ``config_from_dict(config_to_dict(cfg)) == cfg`` for every config.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from blisjax.config._checks import ConfigError, check_float
from blisjax.config.autoscale import AutoscalerConfig, blis_autoscaler, blis_cluster_sections
from blisjax.config.policy import (
    AdmissionConfig,
    PolicyConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
)
from blisjax.config.sim import (
    ClusterConfig,
    CompatConfig,
    EngineConfig,
    LatencyConfig,
    MetricsConfig,
    SimConfig,
)

TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(SimConfig))
POLICY_KEYS = tuple(f.name for f in dataclasses.fields(PolicyConfig))
#: Fields stored as tuples of (name, value) pairs and written as YAML mappings.
TABLE_FIELDS = frozenset(
    {"tenant_max_in_flight", "slo_class_scores", "tenant_scores", "slo_targets",
     "tenant_slo_targets", "fitness_weights", "params"}
)
#: BLIS's inverted-slo priority = slo-based with a negative age weight.
BLIS_INVERTED_SLO = "inverted-slo"

_SECTIONS: dict[str, type] = {
    "engine": EngineConfig,
    "latency": LatencyConfig,
    "cluster": ClusterConfig,
    "metrics": MetricsConfig,
    "compat": CompatConfig,
}
_POLICY_SECTIONS: dict[str, type] = {
    "admission": AdmissionConfig,
    "priority": PriorityConfig,
    "routing": RoutingConfig,
    "scheduler": SchedulerConfig,
    "autoscaler": AutoscalerConfig,
}
#: Sections of a BLIS policy bundle that configure the cluster rather than a policy.
BUNDLE_CLUSTER_KEYS = ("node_pools", "instance_lifecycle")


# --------------------------------------------------------------------------- helpers


def _mapping(path: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, got {value!r}")
    return value


def _check_keys(path: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(where, f"unknown key; allowed keys: {', '.join(allowed)}")


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _section(cls: type, path: str, value: Any) -> Any:
    data = _mapping(path, value)
    _check_keys(path, data, _field_names(cls))
    return cls(**data)


def _scheduler_mapping(path: str, value: Any) -> Mapping[str, Any]:
    # BLIS bundles write `scheduler: fcfs`; our schema writes `scheduler: {policy: fcfs}`.
    return {"policy": value} if isinstance(value, str) else _mapping(path, value)


def _read_yaml(path: str | Path, what: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(what, f"cannot read {str(path)!r}: {err}") from err


# --------------------------------------------------------------------------- our schema


def _policy_from_dict(value: Any) -> PolicyConfig:
    data = _mapping("policy", value)
    _check_keys("policy", data, POLICY_KEYS)
    sections = {}
    for name, cls in _POLICY_SECTIONS.items():
        raw = data.get(name)
        if name == "scheduler":
            raw = _scheduler_mapping("policy.scheduler", raw)
        sections[name] = _section(cls, f"policy.{name}", raw)
    return PolicyConfig(**sections)


def config_from_dict(data: Mapping[str, Any] | None) -> SimConfig:
    """Build a SimConfig from our YAML schema (missing keys take the dataclass defaults).

    Raises:
      ConfigError: unknown key (naming it and the allowed keys) or invalid value.
    """
    data = _mapping("config", data)
    _check_keys("", data, TOP_LEVEL_KEYS)
    kwargs: dict[str, Any] = {
        k: data[k] for k in ("model", "hardware", "workload", "seed", "horizon_us") if k in data
    }
    for name, cls in _SECTIONS.items():
        kwargs[name] = _section(cls, name, data.get(name))
    kwargs["policy"] = _policy_from_dict(data.get("policy"))
    return SimConfig(**kwargs)


def _plain(name: str, value: Any) -> Any:
    """A field value as plain YAML data (mappings, lists, scalars)."""
    if name in TABLE_FIELDS:
        return {key: _plain("", v) for key, v in value}
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain("", v) for v in value]
    return copy.deepcopy(value)


def config_to_dict(cfg: SimConfig) -> dict[str, Any]:
    """The full config (defaults included) as plain data in our YAML schema."""
    return _plain("", cfg)


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing the empty SLO class as ``'': 3.0`` rather than a ``? ''`` complex key."""

    def check_simple_key(self) -> bool:
        if isinstance(self.event, yaml.ScalarEvent) and self.event.value == "":
            return True
        return super().check_simple_key()


def dump_config(cfg: SimConfig) -> str:
    """The config as YAML text (keys in dataclass order; floats written exactly)."""
    return yaml.dump(config_to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def save_config(cfg: SimConfig, path: str | Path) -> None:
    """Write the config as YAML to ``path``."""
    Path(path).write_text(dump_config(cfg))


def load_config(path: str | Path) -> SimConfig:
    """Read a SimConfig from a YAML file in our schema (an empty file gives the defaults)."""
    return config_from_dict(_read_yaml(path, "config"))


# --------------------------------------------------------------------------- BLIS bundles


def _is_unset(value: Any) -> bool:
    # BLIS bundles use "" / absent for "not set"; we also treat null and empty lists that way.
    return value is None or value == "" or (isinstance(value, (list, tuple, Mapping)) and not value)


def blis_priority_overrides(overrides: Mapping[str, Any], base: PriorityConfig) -> dict[str, Any]:
    """Map BLIS's ``inverted-slo`` onto ``slo-based`` with a negative age weight."""
    out = dict(overrides)
    if out.get("policy") == BLIS_INVERTED_SLO:
        weight = check_float("policy.priority.age_weight", out.get("age_weight", base.age_weight))
        out.update(policy="slo-based", age_weight=-abs(weight))
    return out


def _merge_section(current: Any, path: str, value: Any) -> Any:
    data = _mapping(path, value)
    _check_keys(path, data, _field_names(type(current)))
    overrides = {k: v for k, v in data.items() if not _is_unset(v)}
    if isinstance(current, PriorityConfig):
        overrides = blis_priority_overrides(overrides, current)
    return dataclasses.replace(current, **overrides)


def load_blis_policy_config(
    source: str | Path | Mapping[str, Any], base: PolicyConfig | None = None
) -> PolicyConfig:
    """Apply a BLIS policy bundle's policy sections (``--policy-config`` YAML) on top of
    ``base``.

    Sections ``admission: {policy, token_bucket_capacity, token_bucket_refill_rate}``,
    ``priority: {policy}``, ``routing: {policy, scorers: [{name, weight}]}``,
    ``scheduler: <name>`` (or ``{policy: <name>}``) and ``autoscaler`` (BLIS's
    ``{interval_us, …, analyzer}``, or ours when it names a ``policy``), plus our extra knobs
    under the same sections. Absent, null or "" values keep ``base``; BLIS's ``inverted-slo``
    priority becomes ``slo-based`` with ``age_weight = -|age_weight|``. The cluster sections
    ``node_pools`` and ``instance_lifecycle`` are accepted and read by
    :func:`apply_blis_bundle`.

    Raises:
      ConfigError: unreadable file, unknown key (naming it and the allowed keys), bad value.
    """
    base = PolicyConfig() if base is None else base
    data = _bundle_data(source)
    merged = {}
    for name in POLICY_KEYS:
        raw = data.get(name)
        if name == "scheduler":
            raw = _scheduler_mapping("policy-config.scheduler", raw)
        if name == "autoscaler" and raw and "policy" not in raw:  # BLIS's form
            merged[name] = blis_autoscaler(raw, base.autoscaler)
            continue
        merged[name] = _merge_section(getattr(base, name), f"policy-config.{name}", raw)
    return PolicyConfig(**merged)


def _bundle_data(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    data = _read_yaml(source, "policy-config") if isinstance(source, (str, Path)) else source
    data = _mapping("policy-config", data)
    _check_keys("policy-config", data, POLICY_KEYS + BUNDLE_CLUSTER_KEYS)
    return data


def apply_blis_bundle(cfg: SimConfig, source: str | Path | Mapping[str, Any]) -> SimConfig:
    """``cfg`` with a whole BLIS policy bundle applied: its policy sections
    (:func:`load_blis_policy_config`) and its ``node_pools`` and ``instance_lifecycle``
    (docs/autoscaling.md, Configuration)."""
    data = _bundle_data(source)
    policy = load_blis_policy_config(data, cfg.policy)
    cluster_part = blis_cluster_sections(data, cfg.cluster.lifecycle)
    cluster = dataclasses.replace(cfg.cluster, **cluster_part) if cluster_part else cfg.cluster
    return dataclasses.replace(cfg, policy=policy, cluster=cluster)
