"""Wall time of the reference engine on BLIS's anchor scenarios.

Scenarios (blackbox llama-3.1-8b-instruct / H100 / TP1 with BLIS's golden-dataset coefficients,
pinned in ``GOLDEN_DATASET_LATENCY``; round-robin
routing, Poisson arrivals at ~8 req/s per instance, BLIS's default Gaussian lengths 512 ± 256):
1,000 requests / 1 instance, 10,000 / 4, 100,000 / 16. Prints one JSON line per scenario with
wall seconds and simulated requests per wall-second; figures in docs/performance.md.

    python benchmarks/bench_reference.py [--only 1000x1,10000x4] [--rate-per-instance 8]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from blisjax.config import ClusterConfig, LatencyConfig, SimConfig, resolve_config
from blisjax.reference import simulate
from blisjax.workload import ArrivalSpec, ClientSpec, WorkloadSpec, generate_workload

SCENARIOS = ((1_000, 1), (10_000, 4), (100_000, 16))

#: BLIS's golden-dataset coefficients for llama-3.1-8b-instruct / H100 / TP 1 (goldendataset.json
#: at BLIS 4e179804). Pinned rather than left to the shipped table's choice (the vLLM v0.11.0
#: fit) so that the benchmark scenarios, their documented figures and A/B runs against older
#: commits simulate the same requests.
GOLDEN_DATASET_LATENCY = LatencyConfig(
    model="blackbox",
    alpha_coeffs=(232.46191091038054, 1.752360364195244, 3357.4400353290152),
    beta_coeffs=(5752.705191348184, 17.25086436834028, 5.999143920128404),
)


def scenario(num_requests: int, instances: int, rate_per_instance: float):
    cfg = SimConfig(cluster=ClusterConfig(num_instances=instances), seed=42,
                    latency=GOLDEN_DATASET_LATENCY)
    spec = WorkloadSpec(clients=(ClientSpec(arrival=ArrivalSpec("poisson")),),
                        aggregate_rate=rate_per_instance * instances, num_requests=num_requests)
    return resolve_config(cfg), generate_workload(spec, seed=42)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated NxI scenarios, e.g. 1000x1,10000x4")
    ap.add_argument("--rate-per-instance", type=float, default=8.0)
    args = ap.parse_args()
    chosen = SCENARIOS
    if args.only:
        chosen = tuple(tuple(int(x) for x in s.split("x")) for s in args.only.split(","))
    print(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                      "processor": platform.processor() or "unknown"}))
    for n, inst in chosen:
        resolved, workload = scenario(n, inst, args.rate_per_instance)
        start = time.perf_counter()
        result = simulate(resolved, workload)
        wall = time.perf_counter() - start
        print(json.dumps({
            "engine": "reference", "requests": n, "instances": inst,
            "completed": int((result.status == 0).sum()),
            "simulated_s": result.sim_ended_us / 1e6, "wall_s": round(wall, 3),
            "requests_per_wall_s": round(n / wall, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
