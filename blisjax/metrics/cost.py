"""What a run costs: the GPU-hours its instances were held and their price.

A fixed cluster holds every instance for the whole run (``num_instances`` × the simulated
duration, BLIS's SimEndedTime); with instance lifecycles each instance from its placement to
its termination or the run's end (``LifecycleCounters.replica_us``). GPU-hours are those
instance-hours times the GPUs of one instance (TP × PP × DP), and ``cost`` is the GPU-hours
times the price of one GPU-hour (``metrics.gpu_price_per_hour``, by default the hardware's
indicative price). Both engines' ``RunResult`` feed it alike (docs/semantics.md §6.5).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blisjax.config.hardware import gpu_price_per_hour
from blisjax.metrics.records import RunResult
from blisjax.rules import US_PER_HOUR

__all__ = ["CostBasis", "cost_basis", "cost_metrics"]


class CostBasis(NamedTuple):
    """GPUs of one instance and the price of one GPU-hour."""

    gpus_per_instance: int
    gpu_price_per_hour: float


def cost_basis(config) -> CostBasis:
    """The cost basis of a ``SimConfig``: its engine's GPUs per instance and its
    ``metrics.gpu_price_per_hour`` (the hardware's default price when None)."""
    price = config.metrics.gpu_price_per_hour
    if price is None:
        price = gpu_price_per_hour(config.hardware)
    return CostBasis(int(config.engine.total_gpus), float(price))


def instance_us(result: RunResult) -> int:
    """Instance-microseconds held over the run."""
    if result.lifecycle is not None:
        return int(np.sum(np.asarray(result.lifecycle.replica_us, dtype=np.int64)))
    return int(result.num_instances) * int(result.sim_ended_us)


def cost_metrics(result: RunResult, basis: CostBasis) -> dict[str, float]:
    """``gpu_hours`` and ``cost`` of one run."""
    gpu_hours = float(instance_us(result) * basis.gpus_per_instance) / US_PER_HOUR
    return {"gpu_hours": gpu_hours, "cost": gpu_hours * basis.gpu_price_per_hour}
