"""The same policy search in this process and on a local Ray cluster: Ray's overhead, and the
per-worker throughput a scaling estimate starts from.

Scenario: ``configs/search/prefix-affinity.yaml`` with ``--requests`` requests, searched over
its space (CMA-ES, objective ``-ttft_mean_ms``), ``--population`` lanes per seed for
``--generations`` generations. Runs, in one process, one after the other:

* ``local``: the search in this process, one XLA device per usable core;
* ``ray-1x{C}``: a local Ray instance with the usable cores and one worker holding all of them
  (``--ray local``'s default: one worker per node);
* ``ray-{C}x1``: the same instance with one single-CPU worker per core
  (``--ray local --ray-workers C``).

Every run compiles its own programs (no program cache), and its history must be the local run's
bytes. Prints one JSON line per run:

* start_s: starting Ray and its workers (0 for local);
* first_call_s: the baseline call (one task: one worker compiles while the others build the
  same program in the background);
* first_generation_s: generation 0 (may wait for a worker's compile to end);
* per_generation_s: the mean of the generations after it;
* lane_sims_per_s: lane simulations (candidates x seeds) per second, compile excluded, and
  per_worker_lane_sims_per_s the same divided by the workers (the scaling estimate's unit);
* overhead_vs_local: per_generation_s / local's.

    python benchmarks/bench_ray.py                      # P=16, G=4, 1,000 requests
    python benchmarks/bench_ray.py --population 32 --requests 2000
"""

from __future__ import annotations

import os

from blisjax.devices import usable_cores, use_cpu_cores

use_cpu_cores()  # before JAX loads: the local run uses every core, as `blisjax search` does

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_search import CONFIG, SPACE, TimedProblem  # noqa: E402

from blisjax.config import load_config  # noqa: E402
from search.api import execute, prepare  # noqa: E402


def run(label: str, population: int, generations: int, requests: int, seeds: str,
        backend_factory) -> tuple[dict, bytes]:
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, workload=dict(cfg.workload, num_requests=requests))
    with tempfile.TemporaryDirectory() as tmp:
        plan = prepare("search", cfg, space=SPACE, strategy="cma", population=population,
                       generations=generations, seeds=seeds, objectives=["-ttft_mean_ms"],
                       out_dir=Path(tmp) / "run")
        start = time.perf_counter()
        backend = backend_factory()
        start_s = time.perf_counter() - start
        try:
            problem = TimedProblem(plan.resolved, plan.seeds, plan.scoring, plan.population,
                                   backend=backend)
            execute(plan, progress=False, problem=problem)
            workers = getattr(backend, "worker_count", 0)
        finally:
            if backend is not None:
                backend.close()
        history = (Path(tmp) / "run" / "history.csv").read_bytes()
    first, first_generation, rest = problem.times[0], problem.times[1], problem.times[2:]
    per_generation = sum(rest) / len(rest)
    sims = population * len(plan.seeds) / per_generation
    return ({"run": label, "population": population, "generations": generations,
             "requests": requests, "seeds": len(plan.seeds), "workers": workers,
             "start_s": round(start_s, 2), "first_call_s": round(first, 2),
             "first_generation_s": round(first_generation, 2),
             "per_generation_s": round(per_generation, 3),
             "lane_sims_per_s": round(sims, 2),
             "per_worker_lane_sims_per_s": round(sims / max(workers, 1), 2),
             "machine": f"{platform.machine()} {usable_cores()} cores "
                        f"{platform.python_version()}"}, history)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--generations", type=int, default=4, help="at least 2")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--seeds", default="1", help="workload seeds, e.g. 1,2")
    args = p.parse_args()
    for name in ("BLISJAX_PROGRAM_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR"):
        os.environ.pop(name, None)  # every run compiles: the workers as a first run would

    import ray

    from search.backends.ray_cluster import RayBackend, start_local_ray

    cores = usable_cores()
    common = (args.population, args.generations, args.requests, args.seeds)
    local, want = run("local", *common, lambda: None)
    print(json.dumps(local), flush=True)

    def on_ray(**kwargs):
        def factory():
            if not ray.is_initialized():
                start_local_ray()
            return RayBackend(**kwargs)
        return factory

    for label, kwargs in ((f"ray-1x{cores}", {}), (f"ray-{cores}x1", {"workers": cores})):
        row, history = run(label, *common, on_ray(**kwargs))
        row["identical_history"] = history == want
        row["overhead_vs_local"] = round(row["per_generation_s"] / local["per_generation_s"], 3)
        print(json.dumps(row), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
