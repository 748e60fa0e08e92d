"""Population evaluation on a Ray cluster: lane blocks spread over long-lived actors.

:class:`RayBackend` connects to a cluster (``"local"`` starts one on this machine, ``"auto"``
joins the one ``ray start`` runs here or ``RAY_ADDRESS`` names, anything else is an address
for ``ray.init``), starts its workers (``search.backends.ray_worker.PopulationWorker``) and
checks that they run the driver's code. ``run(job, units, width)`` splits each unit's knob sets
into tasks of ``lanes_per_task`` lanes and hands a task to each idle worker until all are done.

Results are bit-identical to a local run: each task is a ``run_lanes`` call, and a lane's result
does not depend on which lanes share its call or on the devices that run it.

Faults: a worker that dies (process killed, node lost, out of memory) has its task run again by
another worker and, while ``max_replacements`` allows, is replaced by a new actor; the event is
logged and kept in ``events``. When no worker is left, :class:`RayWorkersLost` is raised; a
search's checkpoint then holds every finished generation (``--resume``).
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from blisjax.config import ConfigError
from blisjax.devices import DEVICE_COUNT_FLAG, usable_cores, with_device_count
from blisjax.engine import progcache
from search.backends.job import LaneOutcome, PopulationJob, Unit
from search.backends.ray_worker import PopulationWorker, WorkerInfo, code_fingerprint

__all__ = ["RayBackend", "RayWorkersLost", "Task", "start_local_ray", "task_lanes",
           "worker_xla_flags"]

#: Environment variables a worker inherits from the driver: where compiled programs are kept
#: (the same path on every node; a shared filesystem shares the entries).
FORWARDED_ENV = (progcache.ENV_DIRECTORY, "JAX_COMPILATION_CACHE_DIR")

#: What a dead worker's task raises on ``ray.get``: the actor process or its node is gone.
_WORKER_FAULTS = tuple(getattr(ray.exceptions, name) for name in (
    "RayActorError", "ActorUnschedulableError", "WorkerCrashedError", "NodeDiedError",
    "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError")
    if hasattr(ray.exceptions, name))


class RayWorkersLost(RuntimeError):
    """No worker is left to run the remaining tasks (the cluster or its nodes are gone)."""


class Task(NamedTuple):
    """Lanes ``start .. start + len(lane_sets) - 1`` of unit ``unit`` (workload ``seed``)."""

    unit: int
    start: int
    seed: int
    lane_sets: tuple[dict, ...]

    def describe(self) -> str:
        return f"seed {self.seed}, lanes {self.start}-{self.start + len(self.lane_sets) - 1}"


def task_lanes(width: int, seeds: int, workers: int) -> int:
    """Default lanes per task: a unit of ``width`` lanes is split into as many equal tasks as
    it takes for every worker to get one when each of the ``seeds`` seeds is a unit. The
    number depends only on the problem and the worker count, so a worker compiles one program
    for a whole search."""
    per_seed = max(1, math.ceil(workers / max(1, seeds)))
    return max(1, math.ceil(width / per_seed))


def worker_xla_flags(driver_flags: str, devices: int) -> str:
    """The driver's ``XLA_FLAGS`` with its CPU device count replaced by ``devices`` (none when
    1: XLA's default), so a worker runs one lockstep loop per CPU it holds."""
    kept = " ".join(f for f in driver_flags.split() if not f.startswith(DEVICE_COUNT_FLAG))
    return with_device_count(kept, devices) or kept


@dataclass
class _Slot:
    """One worker position: its actor, how it is placed, and its state."""

    number: int
    cpus: int
    node_id: str | None  # pinned to a node (one worker per node), else spread
    actor: Any = None
    info: WorkerInfo | None = None
    hello: Any = None  # the start-up call while starting
    programs: set = field(default_factory=set)  # (job key, lanes) it has compiled or is compiling

    def label(self) -> str:
        where = f" (pid {self.info.pid} on {self.info.host})" if self.info else ""
        return f"worker {self.number}{where}"


class RayBackend:
    """Evaluate lane blocks on Ray actors.

    Args:
      address: ``"local"`` (start a Ray instance on this machine with its usable cores),
        ``"auto"`` (the cluster ``ray start`` runs on this machine, or ``RAY_ADDRESS``), or a
        cluster address (``"head-host:6379"``, ``"ray://head-host:10001"``). An already
        initialised Ray (``ray.init`` by the caller) is used as it is.
      workers: actors to start; default one per node, holding all of the node's CPUs.
      worker_cpus: CPUs (and XLA devices) per actor; default the node's CPUs (one per node) or
        the cluster's CPUs divided evenly among ``workers``.
      lanes_per_task: lanes per engine call on a worker; default ``task_lanes``.
      max_replacements: dead workers replaced by new actors over the backend's life (default:
        as many as there are workers); beyond it the remaining workers carry on alone.
      start_timeout_s: how long a worker may take to start before it counts as lost.
      log: where fault and start-up events go (default: the ``search.backends.ray`` logger).
      on_dispatch: called with the worker's info and the task after every task is sent
        (monitoring; the fault tests kill a worker from it).
    """

    def __init__(self, address: str = "local", *, workers: int | None = None,
                 worker_cpus: int | None = None, lanes_per_task: int | None = None,
                 max_replacements: int | None = None, start_timeout_s: float = 300.0,
                 log: Callable[[str], None] | None = None,
                 on_dispatch: Callable[[WorkerInfo, Task], None] | None = None) -> None:
        for name, value in (("workers", workers), ("worker_cpus", worker_cpus),
                            ("lanes_per_task", lanes_per_task)):
            if value is not None and value < 1:
                raise ConfigError(f"ray {name}", f"must be >= 1, got {value}")
        if max_replacements is not None and max_replacements < 0:
            raise ConfigError("ray max_replacements", f"must be >= 0, got {max_replacements}")
        self.address = address
        self.lanes_per_task = lanes_per_task
        self.start_timeout_s = float(start_timeout_s)
        self.events: list[str] = []
        self._log = log if log is not None else logging.getLogger("search.backends.ray").warning
        self._on_dispatch = on_dispatch
        self._owns_ray = False
        self._published: dict[str, list] = {}
        self._code = code_fingerprint()
        self._connect(address)
        try:
            self._slots = self._plan_slots(workers, worker_cpus)
            self.replacements_left = (len(self._slots) if max_replacements is None
                                      else max_replacements)
            for slot in self._slots:
                self._start(slot)
            self._await_start()
        except BaseException:
            self.close()
            raise

    # ---- cluster and workers ------------------------------------------------------------

    def _connect(self, address: str) -> None:
        if ray.is_initialized():
            return
        if address == "local":
            start_local_ray()
        else:
            ray.init(address=address, **_INIT_OPTIONS)
        self._owns_ray = True

    def _plan_slots(self, workers: int | None, worker_cpus: int | None) -> list[_Slot]:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive") and
                        n.get("Resources", {}).get("CPU", 0) >= 1), key=lambda n: n["NodeID"])
        total = sum(int(n["Resources"]["CPU"]) for n in nodes)
        if not nodes:
            raise ConfigError("--ray", f"the cluster at {self.address!r} has no node with a CPU")
        if workers is None:
            smallest = min(int(n["Resources"]["CPU"]) for n in nodes)
            if worker_cpus is not None and worker_cpus > smallest:
                raise ConfigError("--ray-worker-cpus", f"one worker per node needs at most "
                                  f"{smallest} CPUs (the smallest node's), got {worker_cpus}")
            return [_Slot(i, worker_cpus or int(n["Resources"]["CPU"]), n["NodeID"])
                    for i, n in enumerate(nodes)]
        cpus = worker_cpus or max(1, total // workers)
        if workers * cpus > total:
            raise ConfigError("--ray-workers", f"{workers} workers of {cpus} CPUs need "
                              f"{workers * cpus} CPUs; the cluster has {total}")
        return [_Slot(i, cpus, None) for i in range(workers)]

    def _start(self, slot: _Slot, replacing: bool = False) -> None:
        """Create ``slot``'s actor (a replacement may go to any node) and ask it to report."""
        env = {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}
        env["XLA_FLAGS"] = worker_xla_flags(os.environ.get("XLA_FLAGS", ""), slot.cpus)
        options: dict[str, Any] = {"num_cpus": slot.cpus, "runtime_env": {"env_vars": env}}
        if slot.node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                slot.node_id, soft=replacing)
        else:
            options["scheduling_strategy"] = "SPREAD"
        slot.info = None
        slot.programs = set()
        slot.actor = ray.remote(PopulationWorker).options(**options).remote()
        slot.hello = slot.actor.hello.remote()

    def _started(self, slot: _Slot) -> None:
        """``slot``'s start-up report arrived: check its code, or raise."""
        info: WorkerInfo = ray.get(slot.hello)
        slot.hello = None
        if info.code != self._code:
            differ = [f"{w} (driver: {d})" for w, d in zip(info.code, self._code, strict=True)
                      if w != d]
            raise ConfigError("--ray", f"worker on {info.host} runs other code than this "
                              f"process: {', '.join(differ)}; install the same blisjax, jax, "
                              "jaxlib and numpy on every node")
        slot.info = info

    def _await_start(self) -> None:
        pending = {slot.hello: slot for slot in self._slots}
        ready, late = ray.wait(list(pending), num_returns=len(pending),
                               timeout=self.start_timeout_s)
        if late:
            raise RayWorkersLost(f"{len(late)} of {len(pending)} Ray workers did not start "
                                 f"within {self.start_timeout_s:g} s (cluster resources: "
                                 f"{ray.cluster_resources()})")
        for ref in ready:
            self._started(pending[ref])
        nodes = len({s.info.node_id for s in self._slots})
        self._note(f"{len(self._slots)} worker{'s' if len(self._slots) != 1 else ''} on "
                   f"{nodes} node{'s' if nodes != 1 else ''} "
                   f"({', '.join(f'{s.cpus} CPU' for s in self._slots)})", warn=False)

    @property
    def workers(self) -> list[WorkerInfo]:
        """The running workers' reports (not those still starting)."""
        return [s.info for s in self._slots if s.info is not None]

    @property
    def worker_count(self) -> int:
        """Workers running or starting (a replacement joins when it has started)."""
        return len(self._slots)

    def _note(self, message: str, warn: bool = True) -> None:
        self.events.append(message)
        if warn:
            self._log(message)
        else:
            logging.getLogger("search.backends.ray").info(message)

    # ---- evaluation ---------------------------------------------------------------------

    def _publish(self, job: PopulationJob) -> list:
        """The job in Ray's object store, boxed so a call passes the reference itself (a
        worker fetches the job once and keeps it)."""
        if job.key not in self._published:
            self._published[job.key] = [ray.put(job)]
        return self._published[job.key]

    def run(self, job: PopulationJob, units: Sequence[Unit], width: int
            ) -> list[list[LaneOutcome]]:
        """Per unit, one outcome per knob set (see the module docstring)."""
        size = self.lanes_per_task or task_lanes(width, len(job.workloads), len(self._slots))
        size = min(size, width)
        tasks = [Task(u, start, unit.seed, tuple(unit.lane_sets[start:start + size]))
                 for u, unit in enumerate(units) for start in range(0, len(unit.lane_sets), size)]
        done = self._run_tasks(job, tasks, size)
        out: list[list[LaneOutcome]] = [[] for _ in units]
        for task, outcomes in zip(tasks, done, strict=True):  # tasks are in lane order
            out[task.unit].extend(outcomes)
        return out

    def _run_tasks(self, job: PopulationJob, tasks: Sequence[Task], size: int) -> list:
        box = self._publish(job)
        pending = deque(range(len(tasks)))
        running: dict[Any, tuple[_Slot, int]] = {}
        done: dict[int, list] = {}
        while pending or running:
            busy = {id(s) for s, _ in running.values()}
            for slot in self._slots:
                if not pending:
                    break
                if slot.info is None or id(slot) in busy:
                    continue
                i = pending.popleft()
                t = tasks[i]
                running[slot.actor.run.remote(job.key, box, t.seed, t.lane_sets, size)] = (slot, i)
                slot.programs.add((job.key, size))
                if self._on_dispatch is not None:
                    self._on_dispatch(slot.info, t)
            if not pending:
                self._warm(job, box, size)
            starting = {s.hello: s for s in self._slots if s.hello is not None}
            if not running and not starting:
                raise RayWorkersLost(f"every Ray worker was lost; {len(pending)} of "
                                     f"{len(tasks)} tasks of this call were not run")
            ready, _ = ray.wait([*running, *starting], num_returns=1,
                                timeout=None if running else self.start_timeout_s)
            if not ready:
                raise RayWorkersLost(f"no Ray worker started within {self.start_timeout_s:g} s "
                                     f"to run the {len(pending)} remaining tasks")
            ref = ready[0]
            if ref in starting:
                slot = starting[ref]
                try:
                    self._started(slot)
                except _WORKER_FAULTS as err:
                    self._lost(slot, "while starting", err)
                continue
            slot, i = running.pop(ref)
            try:
                done[i] = ray.get(ref)
            except _WORKER_FAULTS as err:
                pending.appendleft(i)
                self._lost(slot, f"while simulating {tasks[i].describe()} (it runs again)", err)
        return [done[i] for i in range(len(tasks))]

    def _warm(self, job: PopulationJob, box: list, size: int) -> None:
        """Have every started worker without this program build it now, while the call's
        tasks run elsewhere: a worker's first task would otherwise wait for its compile
        (tens of seconds) in a later generation. The warm-up is one base-policy lane, its
        result dropped; the worker runs it before any later task."""
        seed = next(iter(job.workloads))
        for slot in self._slots:
            if slot.info is not None and (job.key, size) not in slot.programs:
                slot.actor.run.remote(job.key, box, seed, ({},), size)
                slot.programs.add((job.key, size))

    def _lost(self, slot: _Slot, during: str, err: BaseException) -> None:
        """Log a dead worker and replace it while replacements are left, else drop it."""
        cause = type(err).__name__
        if self.replacements_left > 0:
            self.replacements_left -= 1
            self._note(f"{slot.label()} died {during} ({cause}); starting a replacement "
                       f"({self.replacements_left} more allowed)")
            self._start(slot, replacing=True)
        else:
            self._note(f"{slot.label()} died {during} ({cause}); no replacement left, "
                       f"{len(self._slots) - 1} worker(s) carry on")
            self._slots.remove(slot)

    def close(self) -> None:
        """Stop the workers, and Ray itself when this backend started it."""
        for slot in getattr(self, "_slots", []):
            if slot.actor is not None:
                ray.kill(slot.actor)
                slot.actor = None
        self._published.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> RayBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_INIT_OPTIONS: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}


def start_local_ray(num_cpus: int | None = None) -> None:
    """``ray.init`` of a Ray instance on this machine with ``num_cpus`` CPUs (default: the
    usable cores), whose workers import the same ``blisjax`` and ``search`` as this process
    (wherever they were imported from: a checkout, a virtual environment)."""
    import blisjax

    root = str(Path(blisjax.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    with warnings.catch_warnings():
        # Ray starts its daemons with subprocess (fork + exec), which JAX's warning about
        # fork in a multithreaded process does not concern: the child runs nothing before exec.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        ray.init(num_cpus=num_cpus or usable_cores(),
                 runtime_env={"env_vars": {"PYTHONPATH": path}}, **_INIT_OPTIONS)
