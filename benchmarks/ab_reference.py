"""A/B wall time of the reference engine against a git revision of itself, in one process,
with the cost of a decision trace.

Simulates one scenario of ``bench_reference.py`` (default 4,000 requests on 4 instances) with
the base revision's engine, the working tree's engine untraced, and the working tree's engine
traced (``--trace-level decisions``, counterfactual k = 3), alternating the order each round so
that machine drift hits all alike. Checks that the three give the same per-request results,
then prints one JSON line: medians, and the ratios new / base (untraced runs: the cost of the
trace hooks when off) and traced / untraced (the cost of collecting a trace).

    python benchmarks/ab_reference.py --base HEAD~1 [--requests 4000 --instances 4 --rounds 5]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from base_revision import BASE_NAME, export_base, own_resolved  # noqa: E402
from bench_reference import scenario  # noqa: E402

from blisjax.reference import simulate  # noqa: E402
from blisjax.trace import simulate_traced  # noqa: E402

FIELDS = ("status", "instance", "ttft_us", "e2e_us", "itl_sum_us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare the working tree with")
    ap.add_argument("--requests", type=int, default=4_000)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if min(args.requests, args.instances, args.rounds) < 1:
        ap.error("--requests, --instances and --rounds must be >= 1")
    resolved, workload = scenario(args.requests, args.instances, 8.0)
    with tempfile.TemporaryDirectory() as tmp:
        export_base(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        base_module = importlib.import_module(f"{BASE_NAME}.reference")
        base_resolved = own_resolved(resolved, BASE_NAME, Path(tmp))
        runs = {
            "base": lambda: base_module.simulate(base_resolved, workload),
            "new": lambda: simulate(resolved, workload),
            "traced": lambda: simulate_traced(resolved, workload, "decisions", 3)[0],
        }
        results = {name: run() for name, run in runs.items()}
        walls: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for k in range(args.rounds):
            for name in names[k % len(names):] + names[:k % len(names)]:
                t0 = time.perf_counter()
                runs[name]()
                walls[name].append(time.perf_counter() - t0)
    same = all(np.array_equal(np.asarray(getattr(results["base"], f)),
                              np.asarray(getattr(results[name], f)))
               for name in ("new", "traced") for f in FIELDS)
    med = {name: float(np.median(w)) for name, w in walls.items()}
    print(json.dumps({
        "base": args.base, "requests": args.requests, "instances": args.instances,
        "same_results": bool(same),
        **{f"{name}_s": [round(x, 3) for x in w] for name, w in walls.items()},
        **{f"{name}_median_s": round(m, 3) for name, m in med.items()},
        "ratio_new_over_base_median": round(med["new"] / med["base"], 3),
        "ratio_traced_over_untraced_median": round(med["traced"] / med["new"], 3)}))


if __name__ == "__main__":
    main()
