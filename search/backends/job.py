"""What a backend evaluates: a job (configuration, workloads, engine program) and lane tasks.

A :class:`PopulationJob` is everything a worker needs to simulate lanes of one search problem:
the resolved base configuration, one workload per seed and the ``EngineStatic`` every seed
shares (so a worker compiles one program per lane count). A :class:`Unit` is one engine call's
worth of knob sets on one seed. :func:`run_lanes` is the one computation every backend runs —
locally or in a Ray actor — so a lane's metrics are the same bits wherever it ran: lanes of the
JAX engine are independent, and a lane's result does not depend on its neighbours or on how many
lanes share its call.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from blisjax.engine.population import evaluate_population

__all__ = ["LaneOutcome", "PopulationJob", "Unit", "run_lanes"]

_job_numbers = itertools.count()


def _job_key() -> str:
    """A name for a job, unique within the driver process that made it (workers keep jobs by
    it, so a job's workloads cross the network once per worker)."""
    return f"{os.getpid()}-{next(_job_numbers)}"


@dataclass(frozen=True)
class PopulationJob:
    """A search problem as workers see it.

    resolved: ``resolve_config(base)``; lanes' knobs modify its policy.
    workloads: seed → generated workload.
    static: the ``EngineStatic`` shared by every seed (one compiled program per lane count),
      or seed → ``EngineStatic`` when the seeds' workloads cannot share one (traces of
      different sizes: a program per size).
    key: the job's name on workers (made at construction).
    """

    resolved: Any
    workloads: Mapping[int, Any]
    static: Any
    key: str = field(default_factory=_job_key, compare=False)


@dataclass(frozen=True)
class Unit:
    """Knob sets of one engine call on workload ``seed`` (without padding lanes)."""

    seed: int
    lane_sets: tuple[dict, ...]


class LaneOutcome(NamedTuple):
    """One lane's aggregate metrics (``blisjax.metrics.aggregate_metrics``) and the engine
    capacities it overflowed (name → times; empty when none)."""

    metrics: dict
    overflow: dict


def run_lanes(job: PopulationJob, seed: int, lane_sets: Sequence[Mapping[str, Any]],
              width: int) -> list[LaneOutcome]:
    """Simulate ``lane_sets`` on ``job``'s workload ``seed`` in one population call padded to
    ``width`` lanes with the base configuration; returns one outcome per knob set (padding
    lanes are dropped)."""
    if not 0 < len(lane_sets) <= width:
        raise ValueError(f"a call holds 1 .. {width} lanes, got {len(lane_sets)}")
    lanes = [dict(k) for k in lane_sets] + [{}] * (width - len(lane_sets))
    static = job.static[seed] if isinstance(job.static, Mapping) else job.static
    pop = evaluate_population(job.resolved, job.workloads[seed], lanes, static=static)
    return [LaneOutcome(pop.metrics[k], dict(pop.results[k].overflow))
            for k in range(len(lane_sets))]
