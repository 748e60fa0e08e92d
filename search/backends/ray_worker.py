"""The Ray actor that simulates lane blocks: it keeps its jobs and compiled programs.

A worker process starts with ``XLA_FLAGS`` asking for one XLA CPU device per CPU it was given
(set in its Ray ``runtime_env`` before JAX loads), so its lockstep loops use its cores as a local
run uses the machine's. Its first task of a job loads the job (configuration, workloads,
``EngineStatic``) from Ray's object store and keeps it; its first block of a given lane count
compiles the engine program (or loads it from the program cache) and keeps it, so later
generations cost a run each.

This module is imported by Ray workers: it must not need anything a worker node lacks beyond
an installation of blisjax with the ``ray`` extra.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["PopulationWorker", "WorkerInfo", "code_fingerprint"]


class WorkerInfo(NamedTuple):
    """What a worker reports when it starts (checked against the driver's)."""

    pid: int
    host: str
    node_id: str
    devices: int
    code: tuple[str, ...]


def code_fingerprint() -> tuple[str, ...]:
    """What fixes a lane's numbers besides its inputs: the blisjax and search sources and the
    versions of jax, jaxlib and numpy. Workers whose fingerprint differs from the driver's are
    refused (their lanes could differ from a local run's)."""
    import jax
    import jaxlib
    import numpy

    import search
    from blisjax.engine.progcache import source_hash, tree_hash

    return (f"blisjax {source_hash()[:16]}",
            f"search {tree_hash(Path(search.__file__).resolve().parent)[:16]}",
            f"jax {jax.__version__}", f"jaxlib {jaxlib.__version__}",
            f"numpy {numpy.__version__}")


class PopulationWorker:
    """Ray actor body (wrapped with ``ray.remote`` by the backend)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Any] = {}

    def hello(self) -> WorkerInfo:
        """This worker's identity, device count and code fingerprint."""
        import jax
        import ray

        return WorkerInfo(os.getpid(), socket.gethostname(),
                          ray.get_runtime_context().get_node_id(), jax.device_count(),
                          code_fingerprint())

    def run(self, key: str, job_box: list, seed: int, lane_sets: Sequence[Mapping[str, Any]],
            width: int) -> list:
        """``run_lanes`` of job ``key`` (fetched from ``job_box[0]``, an object reference, the
        first time this worker sees the key)."""
        import ray

        from search.backends.job import run_lanes

        job = self._jobs.get(key)
        if job is None:
            job = self._jobs[key] = ray.get(job_box[0])
        return run_lanes(job, seed, lane_sets, width)
