"""blisjax's engines on BLIS's anchor trace, as one table: the reference engine's run and JAX
populations of distinct weighted-routing policies, under the roofline and blackbox latency
models, in one process.

The anchor trace (``bench_jax.anchor``): 10,000 requests on 4 instances, Poisson 8 req/s per
instance, BLIS's default Gaussian lengths (512 ± 256 tokens in and out), llama-3.1-8b-instruct
/ H100 / TP 1; blackbox with BLIS's golden-dataset coefficients, roofline with the model's
and GPU's constants; weighted routing (the reference runs the configuration's weights, each
JAX lane random weights). Per model: the reference run's wall time, then for each population
size its compile time, first call and second call; *per simulation* is the second call's wall
time over the lanes, *vs reference* the reference run's time over that.

    python benchmarks/bench_anchor_table.py --cpu-devices 2            # P = 64 and 256
    python benchmarks/bench_anchor_table.py --requests 1000 --lanes 8  # a quick look

Prints one JSON line per run, then the table in Markdown. BLIS's own times on this trace
(Go, measured elsewhere) are quoted in docs/performance.md, not measured here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from blisjax.devices import use_cpu_cores  # noqa: E402  (imports no JAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--lanes", default="64,256", help="population sizes, comma-separated")
    ap.add_argument("--models", default="roofline,blackbox",
                    help="latency models, comma-separated (roofline, blackbox)")
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="split the CPU into this many JAX devices (lanes sharded over them)")
    args = ap.parse_args()
    lanes = [int(x) for x in args.lanes.split(",")]
    models = args.models.split(",")
    if args.requests < 1 or args.instances < 1 or min(lanes) < 1 or args.cpu_devices < 1:
        ap.error("--requests, --instances, --lanes and --cpu-devices must be >= 1")
    if not set(models) <= {"roofline", "blackbox"}:
        ap.error(f"--models: roofline or blackbox, got {args.models}")
    use_cpu_cores(args.cpu_devices)

    import jax  # noqa: E402
    from bench_jax import anchor, population  # noqa: E402

    from blisjax.config import LatencyConfig, resolve_config  # noqa: E402
    from blisjax.engine.consts import build_consts  # noqa: E402
    from blisjax.engine.run import compile_lanes  # noqa: E402
    from blisjax.engine.static import build_static  # noqa: E402
    from blisjax.reference import simulate as reference  # noqa: E402

    print(json.dumps({"jax": jax.__version__, "devices": len(jax.local_devices()),
                      "requests": args.requests, "instances": args.instances}), flush=True)
    rows = []
    for model in models:
        resolved, workload = anchor(args.requests, args.instances)
        if model == "roofline":
            resolved = resolve_config(dataclasses.replace(
                resolved.config, latency=LatencyConfig(model="roofline")))
        start = time.perf_counter()
        reference(resolved, workload)
        ref_s = time.perf_counter() - start
        line = {"model": model, "engine": "reference", "lanes": 1, "per_sim_s": round(ref_s, 3)}
        print(json.dumps(line), flush=True)
        rows.append(line)
        st = build_static(resolved, workload)
        consts = build_consts(resolved, workload, st)
        for p in lanes:
            params = population(resolved.config, workload.tenant_names, p)
            start = time.perf_counter()
            run = compile_lanes(st, consts, params)
            compile_s = time.perf_counter() - start
            calls = []
            for _ in range(2):
                start = time.perf_counter()
                jax.block_until_ready(run(consts, params))
                calls.append(time.perf_counter() - start)
            line = {"model": model, "engine": "jax", "lanes": p, "compile_s": round(compile_s, 1),
                    "first_call_s": round(calls[0], 2), "second_call_s": round(calls[1], 2),
                    "per_sim_s": round(calls[1] / p, 4),
                    "vs_reference": round(ref_s / (calls[1] / p), 1)}
            print(json.dumps(line), flush=True)
            rows.append(line)
    print()
    print("| model | engine | lanes | compile | first call | per simulation | vs reference |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["engine"] == "reference":
            print(f"| {r['model']} | reference | 1 | – | {r['per_sim_s']} s | "
                  f"{r['per_sim_s']} s | 1 |")
        else:
            print(f"| {r['model']} | JAX | {r['lanes']} | {r['compile_s']} s | "
                  f"{r['first_call_s']} s | {r['per_sim_s']} s | {r['vs_reference']}× |")


if __name__ == "__main__":
    main()
