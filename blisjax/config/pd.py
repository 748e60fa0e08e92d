"""The P/D pools' configuration (``cluster.pd``; docs/semantics.md §5.10, Decision 15): the
instances' split into prefill, decode and shared pools, the decider, the KV transfers, each
pool's routing scorers and its own settings (``PoolOverrides``), and each instance slot's role
(``PDConfig.roles``). Checked on construction, as every section of ``blisjax.config.sim``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from blisjax.config._checks import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_str,
    set_field,
)
from blisjax.config.autoscale import max_replicas, pool_maximum
from blisjax.config.codes import PDDecider, PDRole
from blisjax.config.fields import (
    LATENCY_MODELS,
    as_section,
    check_knob,
    non_negative_int,
)
from blisjax.config.policy import ScorerWeight, as_scorer

__all__ = ["PD_DECIDERS", "POOL_FIELDS", "POOL_ROLES", "PDConfig", "PoolOverrides", "slot_roles"]

#: P/D deciders (docs/semantics.md Decision 15): never | always | prefix-threshold.
PD_DECIDERS = PDDecider.labels()


#: Roles whose instances take a pool's own settings (``PDConfig.prefill`` / ``decode``).
POOL_ROLES = ("prefill", "decode")
#: The settings a pool may set for itself (``PoolOverrides``' fields).
POOL_FIELDS = ("tensor_parallel_size", "hardware", "latency_model", "max_model_len")


@dataclass(frozen=True)
class PoolOverrides:
    """One P/D pool's own settings (BLIS's ``--prefill-tp``, ``--decode-hardware``, ...);
    None = the global one (docs/semantics.md §5.10, "Per-pool settings").

    Attributes:
      tensor_parallel_size: GPUs per instance of the pool, >= 1 (``engine.tensor_parallel_size``).
      hardware: the pool's GPU (``hardware``): its FLOP rates, bandwidth, memory, coefficients.
      latency_model: the pool's latency model (``latency.model``).
      max_model_len: max input + output tokens per request on the pool, >= 1
        (``engine.max_model_len``).
    """

    tensor_parallel_size: int | None = None
    hardware: str | None = None
    latency_model: str | None = None
    max_model_len: int | None = None

    def check(self, path: str) -> None:
        """ConfigError naming ``path``'s field at fault."""
        if self.tensor_parallel_size is not None:
            set_field(self, "tensor_parallel_size", check_int(
                f"{path}.tensor_parallel_size", self.tensor_parallel_size, min_value=1))
        if self.max_model_len is not None:
            set_field(self, "max_model_len", check_int(
                f"{path}.max_model_len", self.max_model_len, min_value=1))
        if self.hardware is not None:
            set_field(self, "hardware", check_str(f"{path}.hardware", self.hardware))
        if self.latency_model is not None:
            check_choice(f"{path}.latency_model", self.latency_model, LATENCY_MODELS)

    @property
    def empty(self) -> bool:
        """No setting of its own: the pool's instances run the global configuration."""
        return all(getattr(self, f) is None for f in POOL_FIELDS)


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
      prefill, decode: the pools' own TP, GPU, latency model and max-model-len
        (``PoolOverrides``); shared instances take the decode pool's, as in BLIS.
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
    prefill: PoolOverrides = field(default_factory=PoolOverrides)
    decode: PoolOverrides = field(default_factory=PoolOverrides)

    def __post_init__(self) -> None:
        for role in POOL_ROLES:
            path = f"cluster.pd.{role}"
            section = as_section(getattr(self, role), PoolOverrides, path, "pool settings")
            section = PoolOverrides(**{f: getattr(section, f) for f in POOL_FIELDS})
            section.check(path)
            set_field(self, role, section)
        for name in ("prefill_instances", "decode_instances", "shared_instances"):
            set_field(self, name, non_negative_int(f"cluster.pd.{name}", getattr(self, name)))
        check_choice("cluster.pd.decider", self.decider, PD_DECIDERS)
        set_field(self, "prefix_threshold_tokens", non_negative_int(
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
            scorers = tuple(as_scorer(x) for x in value)
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
        for role in POOL_ROLES:
            own = getattr(self, role)
            if not own.empty and p == 0:
                name = next(f for f in POOL_FIELDS if getattr(own, f) is not None)
                raise ConfigError(f"cluster.pd.{role}.{name}", "per-pool settings need a "
                                  "prefill pool (cluster.pd.prefill_instances > 0), as in BLIS")
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

    def overrides_for(self, role: PDRole) -> PoolOverrides:
        """The pool settings an instance of ``role`` runs with: prefill instances the prefill
        pool's, decode and shared instances the decode pool's ("decode wins", BLIS
        ``resolveConfigForRole``), the others none."""
        if role == PDRole.PREFILL:
            return self.prefill
        if role in (PDRole.DECODE, PDRole.SHARED):
            return self.decode
        return PoolOverrides()

    def roles(self, num_instances: int, pool_maximum: tuple[int, int] = (0, 0)
              ) -> list[PDRole]:
        """Each instance slot's role: prefill, then decode, then shared instances by index,
        then none (up to ``num_instances``), then — with an autoscaler — the slots the prefill
        and then the decode pool may grow into (``pool_maximum``: each pool's most instances,
        ``config.autoscale.pool_maximum``); every instance serves both without pools."""
        if not self.enabled:
            return [PDRole.SHARED] * num_instances
        roles = ([PDRole.PREFILL] * self.prefill_instances
                 + [PDRole.DECODE] * self.decode_instances
                 + [PDRole.SHARED] * self.shared_instances)
        roles += [PDRole.NONE] * (num_instances - len(roles))
        most_p, most_d = pool_maximum
        return (roles + [PDRole.PREFILL] * max(most_p - self.prefill_instances, 0)
                + [PDRole.DECODE] * max(most_d - self.decode_instances, 0))

    @property
    def has_overrides(self) -> bool:
        """Some pool has settings of its own."""
        return not (self.prefill.empty and self.decode.empty)

    @property
    def pooled_instances(self) -> int:
        """Instances in some pool (prefill, decode or shared); the others serve nothing."""
        return self.prefill_instances + self.decode_instances + self.shared_instances


def slot_roles(cfg) -> list[PDRole]:
    """Each instance slot's role of a ``SimConfig`` (``PDConfig.roles`` over its
    ``max_replicas`` slots; slots past the roles serve nothing, or both without pools)."""
    pd, autoscaler = cfg.cluster.pd, cfg.policy.autoscaler
    roles = pd.roles(cfg.cluster.num_instances, pool_maximum(autoscaler, pd))
    slots = max_replicas(autoscaler, cfg.cluster.num_instances, cfg.cluster.node_pools,
                         cfg.engine.tensor_parallel_size, pd)
    return roles + [PDRole.SHARED if not pd.enabled else PDRole.NONE] * (slots - len(roles))
