"""Population evaluation on a Ray cluster: the same bytes as a local search, workers killed
mid-generation, a lost cluster resumed from its checkpoint.

One local Ray instance with 2 CPUs serves the module and is shut down at its end. The searches
run the tiny experiment with a population of 8 on 2 workers, so each task holds 4 lanes: the
shape the search tests compile. The driver's first run stores its program in a program cache
the workers share (``BLISJAX_PROGRAM_CACHE_DIR`` is forwarded to them), so a worker loads it
instead of compiling. The local baselines split the population into chunks of 4 lanes
(``SimulationProblem(lanes=4)``) for the same reason: a lane's result does not depend on the
lanes beside it, so the files are those of an 8-lane local search (``test_cli_search`` runs
that path).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from blisjax.cli import main  # noqa: E402
from blisjax.config import ConfigError  # noqa: E402
from search.api import execute, prepare, search_capacities  # noqa: E402
from search.backends.ray_cluster import (  # noqa: E402
    RayBackend,
    RayWorkersLost,
    start_local_ray,
    task_lanes,
    worker_xla_flags,
)
from search.evaluate import SimulationProblem  # noqa: E402
from tests.search.conftest import TINY_CONFIG, TINY_LANES, TINY_SPACE  # noqa: E402

POPULATION = 2 * TINY_LANES
SEARCH = ["search", str(TINY_CONFIG), "--space", str(TINY_SPACE), "--strategy", "cma",
          "--population", str(POPULATION), "--generations", "2", "--quiet"]


def _plan(out: Path, resume: bool = False):
    return prepare("search", TINY_CONFIG, space=TINY_SPACE, strategy="cma",
                   population=POPULATION, generations=2, out_dir=out, resume=resume)


def _local(plan) -> dict:
    """The plan run in this process, in engine calls of TINY_LANES lanes."""
    problem = SimulationProblem(plan.resolved, plan.seeds, plan.scoring, TINY_LANES,
                                capacities=search_capacities(plan.space))
    return execute(plan, progress=False, problem=problem)


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("history.csv", "summary.json",
                                                          "best_policy.yaml")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A 2-CPU local Ray instance and a program cache shared by the driver and the workers
    (``blisjax`` commands keep theirs under XDG_CACHE_HOME)."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.setenv("BLISJAX_COMPILE_CACHE", "1")
        mp.setenv("BLISJAX_PROGRAM_CACHE_DIR", str(cache / "blisjax" / "programs"))
        mp.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
        start_local_ray(num_cpus=2)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def baseline(cluster, tmp_path_factory) -> dict[str, bytes]:
    """The search's files without Ray."""
    out = tmp_path_factory.mktemp("local") / "run"
    _local(_plan(out))
    return _files(out)


def test_default_task_size_gives_every_worker_a_task():
    assert task_lanes(8, seeds=1, workers=2) == 4
    assert task_lanes(8, seeds=2, workers=2) == 8  # one seed per worker
    assert task_lanes(8, seeds=1, workers=3) == 3  # 3 + 3 + 2
    assert task_lanes(5, seeds=2, workers=4) == 3
    assert task_lanes(1, seeds=1, workers=8) == 1


def test_workers_get_one_xla_device_per_cpu():
    flag = "--xla_force_host_platform_device_count"
    assert worker_xla_flags(f"--xla_cpu_foo=1 {flag}=4", 1) == "--xla_cpu_foo=1"
    assert worker_xla_flags(f"{flag}=4", 3) == f"{flag}=3"
    assert worker_xla_flags("", 1) == ""


@pytest.mark.parametrize("extra, match", [
    (["--ray-workers", "2"], "--ray-workers: only used with --ray"),
    (["--ray-lanes", "4"], "--ray-lanes: only used with --ray"),
    (["--ray", "local", "--ray-workers", "0"], "--ray-workers: must be an integer in [1, "),
    (["--ray", "local", "--ray-worker-cpus", "x"], "--ray-worker-cpus: must be an integer"),
    (["--ray", " "], "--ray: must be local, auto or a cluster address"),
])
def test_ray_flags_are_validated_before_anything_starts(tmp_path, capsys, extra, match):
    out = tmp_path / "never"
    assert main(SEARCH + ["--out", str(out), *extra]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_worker_plans_beyond_the_cluster_are_refused(cluster):
    with pytest.raises(ConfigError, match="3 workers of 1 CPUs need 3 CPUs; the cluster has 2"):
        RayBackend(workers=3)
    with pytest.raises(ConfigError, match="one worker per node needs at most 2 CPUs"):
        RayBackend(worker_cpus=3)


def test_workers_running_other_code_are_refused(cluster, monkeypatch):
    """A driver whose code fingerprint differs from its workers' (here: another jax) gets an
    error naming what differs, and no worker is left running."""
    from search.backends import ray_cluster

    real = ray_cluster.code_fingerprint()
    monkeypatch.setattr(ray_cluster, "code_fingerprint",
                        lambda: tuple("jax 0.0.1" if p.startswith("jax ") else p for p in real))
    with pytest.raises(ConfigError, match=r"runs other code than this process: jax \S+ "
                                          r"\(driver: jax 0\.0\.1\)"):
        RayBackend(workers=1)
    _assert_cpus_released()


def _assert_cpus_released(timeout_s: float = 30.0) -> None:
    """Every CPU of the instance is free again (killed actors release theirs shortly after)."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_search_with_ray_writes_the_local_search_bytes(baseline, tmp_path, capsys):
    """`blisjax search --ray local --ray-workers 2` (the module's Ray instance is used as it
    is) writes the local run's history, summary and policy byte for byte."""
    out = tmp_path / "ray"
    assert main(SEARCH + ["--out", str(out), "--ray", "local", "--ray-workers", "2"]) == 0
    capsys.readouterr()
    assert _files(out) == baseline
    assert ray.is_initialized()  # not shut down: the backend did not start it


def test_a_worker_killed_mid_generation_is_replaced(baseline, tmp_path):
    """SIGKILL a worker right after it is sent the first task of generation 0: the task runs
    again, a replacement starts, the search's files are unchanged and the event is logged."""
    sent: list = []
    logged: list[str] = []

    def kill_second_task(worker, task):
        sent.append((worker.pid, task))
        if len(sent) == 2:  # the first is the baseline's one-lane task
            os.kill(worker.pid, signal.SIGKILL)

    out = tmp_path / "killed"
    with RayBackend(workers=2, log=logged.append, on_dispatch=kill_second_task) as backend:
        execute(_plan(out), progress=False, backend=backend)
        pids = {w.pid for w in backend.workers}
        assert backend.worker_count == 2  # the replacement may still be starting
    assert _files(out) == baseline
    killed, task = sent[1]
    assert killed not in pids
    assert len(logged) == 1
    assert f"died while simulating {task.describe()} (it runs again)" in logged[0]
    assert "starting a replacement (1 more allowed)" in logged[0]
    assert sum(t == task for _, t in sent) == 2  # sent twice: to the dead worker and again


def test_losing_every_worker_stops_the_search_resumably(baseline, tmp_path):
    """Both workers die in generation 1 with no replacement allowed: the search stops with
    RayWorkersLost, its checkpoint holds generation 0, and resuming it without Ray ends with
    the uninterrupted search's files."""
    sent: list = []
    logged: list[str] = []
    tasks_per_generation = POPULATION // TINY_LANES

    def kill_in_generation_1(worker, task):
        sent.append(task)
        if len(sent) > 1 + tasks_per_generation:
            os.kill(worker.pid, signal.SIGKILL)

    out = tmp_path / "lost"
    with RayBackend(workers=2, max_replacements=0, log=logged.append,
                    on_dispatch=kill_in_generation_1) as backend, \
            pytest.raises(RayWorkersLost, match="every Ray worker was lost"):
        execute(_plan(out), progress=False, backend=backend)
    assert len(logged) == 2 and all("no replacement left" in m for m in logged)
    assert (out / "checkpoint.npz").exists()
    rows = (out / "history.csv").read_text().splitlines()
    assert len(rows) == 1 + POPULATION  # header + generation 0
    _local(_plan(out, resume=True))
    assert _files(out) == baseline
