"""Where a search's lanes run: this process (``LocalBackend``, JAX populations;
``ReferenceBackend``, one reference-engine run per lane) or a Ray cluster (``RayBackend``).

A backend has ``run(job, units, width) -> outcomes`` (see ``search.backends.job``) and
``close()``. ``SimulationProblem`` hands it every engine call of a generation at once, so a
distributed backend can spread them. ``RayBackend`` needs the ``ray`` extra and is imported
only when asked for.
"""

from __future__ import annotations

from typing import Any

from search.backends.job import LaneOutcome, PopulationJob, Unit, run_lanes
from search.backends.local import LocalBackend
from search.backends.reference import ReferenceBackend

__all__ = ["LaneOutcome", "LocalBackend", "PopulationJob", "RayBackend", "RayWorkersLost",
           "ReferenceBackend", "Unit", "run_lanes"]


def __getattr__(name: str) -> Any:
    if name in ("RayBackend", "RayWorkersLost"):
        from search.backends import ray_cluster

        return getattr(ray_cluster, name)
    raise AttributeError(f"module 'search.backends' has no attribute {name!r}")
