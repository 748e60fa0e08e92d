"""Wall time of a full policy search (population × generations × requests) on the JAX engine.

Scenario: ``configs/search/prefix-affinity.yaml`` (2 instances, two tenants with 1,024-token
shared prompts) with ``--requests`` requests, searched over
``configs/search/prefix-affinity-space.yaml`` (prefix-affinity and load-balance weights, log
scale; scheduler), objective ``-ttft_mean_ms``. Prints one JSON line per run:

* first_call_s: the first engine call (lowering + XLA compile + one run; once per workload
  shape and lane count);
* search_s: every generation after that (ask, P-lane engine call per seed, tell, checkpoint,
  history), excluding the baseline call; per_generation_s = search_s / generations;
* evals_per_s: candidate evaluations (lanes × seeds) per wall-second, compile excluded;
  sim_requests_per_s: simulated requests per wall-second summed over lanes;
* total_s: everything, as a user of ``blisjax search`` waits for it.

    python benchmarks/bench_search.py                               # P=8, G=5, 200 requests
    python benchmarks/bench_search.py --population 16 --generations 10 --requests 400
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

from blisjax.config import load_config
from search.api import execute, prepare
from search.evaluate import SimulationProblem

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "search" / "prefix-affinity.yaml"
SPACE = ROOT / "configs" / "search" / "prefix-affinity-space.yaml"


class TimedProblem(SimulationProblem):
    """A SimulationProblem that records the wall time of every evaluate call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.times: list[float] = []

    def evaluate(self, knob_sets):
        start = time.perf_counter()
        out = super().evaluate(knob_sets)
        self.times.append(time.perf_counter() - start)
        return out


def bench(strategy: str, population: int, generations: int, requests: int, seeds: str,
          instances: int) -> dict:
    cfg = load_config(CONFIG)
    workload = dict(cfg.workload, num_requests=requests)
    cluster = dataclasses.replace(cfg.cluster, num_instances=instances)
    cfg = dataclasses.replace(cfg, workload=workload, cluster=cluster)
    with tempfile.TemporaryDirectory() as tmp:
        plan = prepare("search", cfg, space=SPACE, strategy=strategy, population=population,
                       generations=generations, seeds=seeds, objectives=["-ttft_mean_ms"],
                       out_dir=Path(tmp) / "run")
        problem = TimedProblem(plan.resolved, plan.seeds, plan.scoring, plan.population)
        start = time.perf_counter()
        summary = execute(plan, progress=False, problem=problem)
        total = time.perf_counter() - start
    first, rest = problem.times[0], problem.times[1:]  # call 0 = baseline (compiles)
    n_seeds = len(plan.seeds)
    search_s = sum(rest)
    evals = population * generations * n_seeds
    return {"strategy": strategy, "population": population, "generations": generations,
            "requests": requests, "instances": instances, "seeds": n_seeds,
            "first_call_s": round(first, 2), "search_s": round(search_s, 2),
            "per_generation_s": round(search_s / generations, 3),
            "evals_per_s": round(evals / search_s, 2),
            "sim_requests_per_s": round(evals * requests / search_s, 1),
            "total_s": round(total, 2),
            "best_objective": summary["best"]["objectives"]["-ttft_mean_ms"],
            "baseline_objective": summary["baseline"]["objectives"]["-ttft_mean_ms"],
            "machine": f"{platform.machine()} {platform.python_version()}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="cma", choices=("cma", "openes", "ga", "random"))
    p.add_argument("--population", default="8", help="comma list, e.g. 8,32")
    p.add_argument("--generations", type=int, default=5)
    p.add_argument("--requests", default="200", help="comma list, e.g. 200,400")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--seeds", default="1", help="workload seeds, e.g. 1,2")
    args = p.parse_args()
    for requests in (int(x) for x in args.requests.split(",")):
        for pop in (int(x) for x in args.population.split(",")):
            print(json.dumps(bench(args.strategy, pop, args.generations, requests, args.seeds,
                                   args.instances)), flush=True)


if __name__ == "__main__":
    main()
