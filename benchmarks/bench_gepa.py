"""Wall time of GEPA's batched evaluation: one JAX population call against sequential runs.

Scenario: ``configs/search/prefix-affinity.yaml`` (200 requests, 2 instances), workload seed
``--case-seed``, objective ``slo_attainment``. ``--candidates`` policies differ only in their
routing weights (prefix-affinity and load-balance, log-uniform in [0.05, 20], both > 0 so every
candidate is valid and a set of per-lane knobs). Prints one JSON line:

* compile_s: the warm-up ``batch_evaluate`` (lowering + XLA compile for that many lanes + one
  run; paid once per workload shape and lane count);
* batch_evaluate_s: one ``BlisjaxGEPAAdapter(engine="auto").batch_evaluate`` of every candidate
  on the case, after the warm-up: one JAX population call;
* sequential_reference_s: one ``evaluate(engine="reference")`` call per candidate;
* speedup: sequential_reference_s / batch_evaluate_s; scores_match: both gave the same scores
  (the engines agree bit for bit);
* load_avg_1m (before, after) and cpus: the machine's state, for reading the numbers.

    python benchmarks/bench_gepa.py                  # 64 candidates
    python benchmarks/bench_gepa.py --candidates 16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import time
from pathlib import Path

from search.adapters.core import seed_candidate
from search.adapters.gepa_adapter import BlisjaxGEPAAdapter, load_cases

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "search" / "prefix-affinity.yaml"
OBJECTIVE = "slo_attainment"


def routing_candidates(base: dict[str, str], n: int, rng: random.Random) -> list[dict[str, str]]:
    """``n`` candidates: ``base`` with random prefix-affinity / load-balance weights (same
    scorer order as the experiment, so each is a lane of its JAX program)."""

    def weight() -> float:
        return round(math.exp(rng.uniform(math.log(0.05), math.log(20.0))), 4)

    return [dict(base, routing=(
        "routing:\n  policy: weighted\n  scorers:\n"
        f"  - {{name: prefix-affinity, weight: {weight()}}}\n"
        f"  - {{name: load-balance, weight: {weight()}}}\n  tie_break: lowest-index\n"))
        for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--case-seed", type=int, default=1, help="workload seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()

    case = load_cases([CONFIG], [args.case_seed])[0]
    base = seed_candidate(case.config)
    rng = random.Random(args.seed)
    warmup = routing_candidates(base, args.candidates, rng)
    candidates = routing_candidates(base, args.candidates, rng)
    load_before = os.getloadavg()[0]

    batched = BlisjaxGEPAAdapter(objective=OBJECTIVE, engine="auto")
    t0 = time.perf_counter()
    batched.batch_evaluate([(c, [case]) for c in warmup])
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = batched.batch_evaluate([(c, [case]) for c in candidates])
    batch_s = time.perf_counter() - t0

    reference = BlisjaxGEPAAdapter(objective=OBJECTIVE, engine="reference")
    t0 = time.perf_counter()
    sequential = [reference.evaluate([case], c, capture_traces=True) for c in candidates]
    sequential_s = time.perf_counter() - t0

    engines = sorted({o["engine"] for r in batch for o in r.outputs}, key=str)
    print(json.dumps({
        "benchmark": "gepa_batch_evaluate", "case": case.name, "candidates": args.candidates,
        "requests": case.config.workload["num_requests"], "engines": engines,
        "compile_s": round(compile_s, 3), "batch_evaluate_s": round(batch_s, 3),
        "sequential_reference_s": round(sequential_s, 3),
        "speedup": round(sequential_s / batch_s, 2),
        "scores_match": [r.scores for r in batch] == [r.scores for r in sequential],
        "mean_score": sum(r.scores[0] for r in batch) / len(batch),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(), "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()
