"""A population spread over worker processes, one per CPU core, each pinned to its core.

Why processes: XLA:CPU runs the engine's loop bodies with a dataflow executor that hands
independent kernels to an intra-op thread pool sized by the CPUs the process may use. With
one CPU device per core in one process (``--xla_force_host_platform_device_count``), both
devices' executors and the shared pool compete for the same cores. A process pinned to one
core gets a one-thread pool and runs its kernels inline. Measured on scenario S (2-core
machine): 64 lanes on one pinned core took 7.5–8.0 s against 9.2 s unpinned; two pinned
processes of 64 lanes each ran side by side in 7.7 s each, where one process with two
devices needed 9.2 s for the same 128 lanes.

Each worker runs ``simulate_population`` on its share of the lanes and sends back one
``RunResult`` per lane, so results are exactly those of an in-process run (lanes are
independent). Workers keep their compiled programs between calls: a search loop pays the
compilation once per worker and shape.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (all of ``os.cpu_count()`` where affinity is not
    available)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def single_device_flags(xla_flags: str) -> str:
    """``XLA_FLAGS`` without a forced CPU device count (a worker uses one device)."""
    return " ".join(_DEVICE_COUNT_FLAG.sub("", xla_flags).split())


def _worker_env() -> dict:
    """The caller's environment, with this package importable the way the caller imports it
    (an installed package or a source checkout on ``sys.path``)."""
    import blisjax  # noqa: PLC0415

    root = os.path.dirname(os.path.dirname(os.path.abspath(blisjax.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def split_lanes(lanes: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [start, stop) ranges covering ``lanes``, sizes differing by at most
    one, none empty (fewer ranges than ``parts`` when there are fewer lanes)."""
    if lanes < 1 or parts < 1:
        raise ValueError(f"need lanes >= 1 and parts >= 1, got {lanes} and {parts}")
    parts = min(parts, lanes)
    base, extra = divmod(lanes, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _worker_main(core: int | None) -> None:
    """Serve population runs over stdin/stdout: pin to ``core`` before JAX creates its CPU
    client (the intra-op pool is sized then), use one CPU device, and keep the message
    channel apart from anything printed (fd 1 goes to stderr)."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    flags = single_device_flags(os.environ.get("XLA_FLAGS", ""))
    if flags:
        os.environ["XLA_FLAGS"] = flags
    else:  # XLA reads a value that is not a flag as a file name and aborts
        os.environ.pop("XLA_FLAGS", None)
    inbox = Connection(os.dup(0), writable=False)
    outbox = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    from blisjax.engine.run import simulate_population  # noqa: PLC0415  (after pinning)

    while True:
        try:
            msg = inbox.recv()
        except EOFError:
            break
        if msg is None:
            break
        resolved, workload, params, static, lane_block, capacities = msg
        try:
            start = time.perf_counter()
            results = simulate_population(resolved, workload, params, static=static,
                                          lane_block=lane_block, **capacities)
            outbox.send(("ok", results, time.perf_counter() - start))
        except Exception as err:  # sent back and raised in the caller, not lost in the worker
            outbox.send(("error", f"{type(err).__name__}: {err}", 0.0))


@dataclass
class _Worker:
    process: subprocess.Popen
    inbox: Connection  # the worker's results
    outbox: Connection  # requests to the worker
    core: int | None


class WorkerPool:
    """Worker processes that evaluate a population's lanes side by side.

    ``workers``: number of processes (default: one per usable core); worker k is pinned to
    the k-th usable core (``pin=False`` leaves placement to the OS). Use as a context manager,
    or call ``close()``. ``last_worker_s`` holds each worker's own time for the last call
    (engine run and result conversion, without inter-process transfer).
    """

    def __init__(self, workers: int | None = None, pin: bool = True) -> None:
        cores = usable_cores()
        count = len(cores) if workers is None else int(workers)
        if count < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._workers: list[_Worker] = []
        for k in range(count):
            core = cores[k % len(cores)] if pin else None
            # a fresh interpreter (no JAX state inherited, the caller's script not re-run)
            proc = subprocess.Popen([sys.executable, "-m", "blisjax.engine.workers",
                                     "" if core is None else str(core)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    env=_worker_env())
            inbox = Connection(os.dup(proc.stdout.fileno()), writable=False)
            outbox = Connection(os.dup(proc.stdin.fileno()), readable=False)
            proc.stdout.close()
            proc.stdin.close()
            self._workers.append(_Worker(proc, inbox, outbox, core))
        self.last_worker_s: list[float] = []

    @property
    def size(self) -> int:
        return len(self._workers)

    def simulate_population(self, resolved, workload, params, static=None,
                            lane_block: int | None = None, **capacities) -> list:
        """``blisjax.engine.run.simulate_population`` with the lanes split over the workers
        (contiguous shares, in lane order); returns one ``RunResult`` per lane."""
        import jax  # noqa: PLC0415  (the caller's process already uses JAX)

        from blisjax.engine.run import LANE_BLOCK  # noqa: PLC0415

        if not self._workers:
            raise RuntimeError("the worker pool is closed")
        lanes = int(np.shape(params.admission)[0])
        shares = split_lanes(lanes, self.size)
        for (start, stop), w in zip(shares, self._workers, strict=False):
            part = jax.tree_util.tree_map(lambda x, a=start, b=stop: np.asarray(x)[a:b], params)
            try:
                w.outbox.send((resolved, workload, part, static,
                               LANE_BLOCK if lane_block is None else lane_block, capacities))
            except OSError as err:
                raise RuntimeError(f"worker process {w.process.pid} is gone (exit code "
                                   f"{w.process.poll()}); see its stderr above") from err
        results, times, errors = [], [], []
        for _, w in zip(shares, self._workers, strict=False):
            try:
                status, payload, seconds = w.inbox.recv()
            except (EOFError, OSError):
                status, payload, seconds = "error", f"worker process {w.process.pid} died", 0.0
            if status == "ok":
                results.extend(payload)
            else:
                errors.append(payload)
            times.append(seconds)
        self.last_worker_s = times
        if errors:
            raise RuntimeError(f"worker failed: {errors[0]}")
        return results

    def close(self) -> None:
        for w in self._workers:
            try:
                w.outbox.send(None)
            except OSError:
                pass
        for w in self._workers:
            try:
                w.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
            w.inbox.close()
            w.outbox.close()
        self._workers = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None)
