"""What a run costs: the GPU-hours its instances were held and their price.

A fixed cluster holds every instance for the whole run (``num_instances`` × the simulated
duration, BLIS's SimEndedTime); with instance lifecycles each instance from its placement to
its termination or the run's end (``LifecycleCounters.replica_us``). GPU-hours are those
instance-hours times the GPUs of one instance (TP × PP × DP), and ``cost`` is the GPU-hours
times the price of one GPU-hour (``metrics.gpu_price_per_hour``, by default the hardware's
indicative price). P/D pools with their own TP or GPU (``cluster.pd.prefill`` / ``decode``)
price each instance by its pool's GPUs and GPU. Both engines' ``RunResult`` feed it alike
(docs/semantics.md §6.5).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from blisjax.config.hardware import gpu_price_per_hour
from blisjax.config.pd import slot_roles
from blisjax.limits import US_PER_HOUR
from blisjax.metrics.records import RunResult

__all__ = ["CostBasis", "cost_basis", "cost_metrics"]


class CostBasis(NamedTuple):
    """GPUs of one instance and the price of one GPU-hour; with P/D pools of their own
    hardware, ``per_instance`` holds each instance's (GPUs, price of one GPU-hour)."""

    gpus_per_instance: int
    gpu_price_per_hour: float
    per_instance: tuple[tuple[int, float], ...] = ()


def cost_basis(config) -> CostBasis:
    """The cost basis of a ``SimConfig``: its engine's GPUs per instance and its
    ``metrics.gpu_price_per_hour`` (the hardware's default price when None; an explicit
    price is every GPU's)."""
    def price_of(hardware: str) -> float:
        given = config.metrics.gpu_price_per_hour
        return float(gpu_price_per_hour(hardware) if given is None else given)

    engine = config.engine
    basis = CostBasis(int(engine.total_gpus), price_of(config.hardware))
    pd = config.cluster.pd
    if not pd.has_overrides:
        return basis
    per_instance = []
    for role in slot_roles(config):
        own = pd.overrides_for(role)
        pool = dataclasses.replace(engine, tensor_parallel_size=own.tensor_parallel_size
                                   or engine.tensor_parallel_size)
        per_instance.append((int(pool.total_gpus), price_of(own.hardware or config.hardware)))
    return basis._replace(per_instance=tuple(per_instance))


def instance_us(result: RunResult) -> int:
    """Instance-microseconds held over the run."""
    if result.lifecycle is not None:
        return int(np.sum(np.asarray(result.lifecycle.replica_us, dtype=np.int64)))
    return int(result.num_instances) * int(result.sim_ended_us)


def cost_metrics(result: RunResult, basis: CostBasis) -> dict[str, float]:
    """``gpu_hours`` and ``cost`` of one run."""
    if basis.per_instance:  # instances of mixed pools: each held its own time
        held = ([int(result.sim_ended_us)] * len(basis.per_instance)
                if result.lifecycle is None
                else [int(x) for x in np.asarray(result.lifecycle.replica_us)])
        gpu_us = sum(h * gpus for h, (gpus, _) in zip(held, basis.per_instance, strict=True))
        cost_us = sum(float(h * gpus) * price
                      for h, (gpus, price) in zip(held, basis.per_instance, strict=True))
        return {"gpu_hours": float(gpu_us) / US_PER_HOUR, "cost": cost_us / US_PER_HOUR}
    gpu_hours = float(instance_us(result) * basis.gpus_per_instance) / US_PER_HOUR
    return {"gpu_hours": gpu_hours, "cost": gpu_hours * basis.gpu_price_per_hour}
