"""Rules both engines follow, written once: pure functions of the configuration that the
reference engine (``blisjax.reference``) and the JAX engine (``blisjax.engine``) both import,
so that neither engine imports the other.

* instance variants and their cost order (``policy.autoscaler``, ``cluster.node_pools``;
  docs/autoscaling.md);
* the lifecycle's drawn delays and the cost of holding an instance;
* the transfer time of a block reloaded from the CPU tier (docs/semantics.md §3.8);
* each instance's role under P/D pools (docs/semantics.md Decision 15);
* whether a configuration models instance lifecycles;
* the utilization bucket a step's KV blocks in use fall in (``kv_utilization``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from blisjax.config.autoscale import lifecycle_configured
from blisjax.config.pd import slot_roles
from blisjax.config.policy import normalized_weights
from blisjax.limits import KV_UTIL_BUCKETS, US_PER_HOUR

__all__ = ["NEVER_US", "US_PER_HOUR", "Variant", "cost_order", "delay_us", "held_cost",
           "instance_variants", "KV_UTIL_BUCKETS", "kv_util_bucket",
           "normalized_weights", "reload_cost_us", "slot_roles", "uses_lifecycle", "variant_of"]

#: "Never happened" for lifecycle times, µs (far below any simulated time).
NEVER_US = -(1 << 62)


def kv_util_bucket(used_blocks, total_blocks):
    """The whole percent of an instance's KV blocks in use, rounded up: 0 for none, 100 for
    all; ceil(100 · used / total) in integer arithmetic (Python ints or integer arrays of
    either engine; ``total_blocks`` >= 1)."""
    return (KV_UTIL_BUCKETS * used_blocks + total_blocks - 1) // total_blocks


class Variant(NamedTuple):
    """An instance type (BLIS's (GPU type, TP)) and the cost that orders variants."""

    cost_per_hour: float
    gpu_type: str
    tp: int


def instance_variants(pools, hardware: str, cost_per_hour: float, tp: int) -> list[Variant]:
    """The variants instances can be: one per GPU type of the node pools, in pool order,
    costing what the first pool of that type costs (without pools: the configured hardware
    at ``cost_per_hour``)."""
    if not pools:
        return [Variant(cost_per_hour, hardware, max(tp, 1))]
    out: list[Variant] = []
    for pool in pools:
        if all(v.gpu_type != pool.gpu_type for v in out):
            out.append(Variant(pool.cost_per_hour, pool.gpu_type, max(tp, 1)))
    return out


def speed_gpu(gpu_type: str, hardware: str, blis_quirks: bool) -> str:
    """The GPU whose latency an instance placed on a node pool of ``gpu_type`` runs with: the
    pool's, where the hardware table knows it, else the configuration's ``hardware`` (an
    unknown label changes the instance's cost only). With ``blis_quirks`` always the
    configuration's: BLIS labels the instance with the pool's GPU and keeps the CLI GPU's
    calibration and coefficients (docs/semantics.md Decision 12)."""
    from blisjax.config.hardware import shipped_hardware

    if blis_quirks or gpu_type not in shipped_hardware():
        return hardware
    return gpu_type


def variant_of(variants: list[Variant], gpu_type: str) -> int:
    """The index of the variant of ``gpu_type``."""
    return next(v for v, x in enumerate(variants) if x.gpu_type == gpu_type)


def cost_order(variants: list[Variant]) -> list[int]:
    """Variant indices in BLIS's order: cost ascending, then GPU type, then TP."""
    return sorted(range(len(variants)),
                  key=lambda v: (variants[v].cost_per_hour, variants[v].gpu_type, variants[v].tp))


def held_cost(held_us: int, cost_per_hour: float) -> float:
    """The cost of holding an instance ``held_us`` µs at ``cost_per_hour`` (one product, one
    division: the JAX engine's ``lifecycle.terminate`` forms it in the same order)."""
    return float(held_us) * cost_per_hour / US_PER_HOUR


def delay_us(spec, rng) -> int:
    """A ``DelaySpec`` drawn once, in µs: its mean when its stddev is 0 (no draw), else
    max(0, N(0,1)·stddev + mean) from ``rng`` (Go's ``NormFloat64``); truncated."""
    if spec.stddev_s <= 0:
        return int(spec.mean_s * 1e6)
    return int(max(0.0, rng.norm_float64() * spec.stddev_s + spec.mean_s) * 1e6)


def reload_cost_us(block_size_tokens: int, bandwidth_tokens_per_us: float,
                   base_latency_us: int) -> int:
    """Transfer time of one reloaded block: ``base + ceil(block size / bandwidth)`` µs (the
    division in float64, as BLIS)."""
    return base_latency_us + int(math.ceil(block_size_tokens / bandwidth_tokens_per_us))


def uses_lifecycle(cfg) -> bool:
    """The configuration models instance lifecycles (else every instance is up throughout)."""
    return lifecycle_configured(cfg.policy.autoscaler, cfg.cluster.node_pools,
                                cfg.cluster.lifecycle)
