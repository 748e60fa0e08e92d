"""Lanes run through the reference engine, one simulation each, in this process.

For small questions: a handful of candidates costs a few reference runs, against a minute or
more to compile the JAX program. The engines agree request by request (every parity test), so
a lane's metrics here are the same bits as in a JAX population call, and a search writes the
same files on either engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from blisjax.config import resolve_config
from blisjax.engine.population import apply_knobs
from blisjax.metrics import config_metrics
from blisjax.reference import simulate
from search.backends.job import LaneOutcome, PopulationJob, Unit

__all__ = ["ReferenceBackend"]


class ReferenceBackend:
    """Runs every lane of every unit as its own reference-engine simulation."""

    def run(self, job: PopulationJob, units: Sequence[Unit], width: int
            ) -> list[list[LaneOutcome]]:
        """Per unit, one outcome per knob set (``width`` is not needed: nothing is padded)."""
        del width
        return [[self._lane(job, u.seed, knobs) for knobs in u.lane_sets] for u in units]

    @staticmethod
    def _lane(job: PopulationJob, seed: int, knobs: dict) -> LaneOutcome:
        cfg = apply_knobs(job.resolved.config, knobs)
        workload = job.workloads[seed]
        result = simulate(resolve_config(cfg), workload)
        metrics = config_metrics(result, workload, cfg)
        return LaneOutcome(metrics, dict(result.overflow))

    def close(self) -> None:
        """Nothing to release."""
