"""The default backend: every unit in this process, one JAX population call each."""

from __future__ import annotations

from collections.abc import Sequence

from search.backends.job import LaneOutcome, PopulationJob, Unit, run_lanes

__all__ = ["LocalBackend"]


class LocalBackend:
    """Runs units one after the other on this process's devices (each call padded to
    ``width`` lanes, so a whole search runs one compiled program)."""

    def run(self, job: PopulationJob, units: Sequence[Unit], width: int
            ) -> list[list[LaneOutcome]]:
        """Per unit, one outcome per knob set."""
        return [run_lanes(job, u.seed, u.lane_sets, width) for u in units]

    def close(self) -> None:
        """Nothing to release."""
