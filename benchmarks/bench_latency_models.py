"""Population throughput of the JAX engine with each latency model, in one process.

The default experiment (``configs/default.yaml``: llama-3.1-8b-instruct / H100, 4 instances,
1,000 requests) with its blackbox model (decode stretches on, as the workload's 128-token mean
output decides, and off), then with the roofline model (``latency.model: roofline``) computed in
the compiled program, with decode stretches and without, and (``--host-roofline``) with the same
roofline model evaluated on the host by the reference's Python code through a callback per step
(``EngineStatic.features.latency`` set). Then the physics model with the latency-fitting sample's
coefficients (``configs/latency/sample-config.yaml``, fitted for the same model and GPU) in the
compiled program, with decode stretches and without, and (``--host-physics``) through the host
callback. Each lane is a weighted-routing policy with its own random scorer weights.
All variants run in this process, alternating, so machine drift hits them alike; each is
compiled once (compile_s, reported apart) and timed ``--rounds`` times (run_s: the median).
Prints one JSON line per variant and population size: times, the ratio to the first variant
(blackbox by default), and the simulated steps (those inside decode stretches apart).

    python benchmarks/bench_latency_models.py                        # P = 64
    python benchmarks/bench_latency_models.py --lanes 64,256 --host-roofline --host-physics
    python benchmarks/bench_latency_models.py --cpu-devices 2 --lanes 256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from blisjax.devices import use_cpu_cores  # imports no JAX

if "--cpu-devices" in sys.argv:  # must come before JAX starts: split the CPU into N devices
    use_cpu_cores(int(sys.argv[sys.argv.index("--cpu-devices") + 1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from blisjax.config import LatencyConfig, ScorerWeight, load_config, resolve_config  # noqa: E402
from blisjax.engine.consts import build_consts  # noqa: E402
from blisjax.engine.params import params_from_config, stack_params  # noqa: E402
from blisjax.engine.run import compile_lanes  # noqa: E402
from blisjax.engine.static import build_static  # noqa: E402
from blisjax.latency.factory import make_latency_model  # noqa: E402
from blisjax.workload import generate_workload, parse_workload_spec  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
PHYSICS_SAMPLE = DEFAULT.parent / "latency" / "sample-config.yaml"


def population(cfg, tenants, lanes: int, seed: int = 0):
    """``lanes`` policies: the default's weighted scorers, each with random weights."""
    rng = np.random.default_rng(seed)
    routing = cfg.policy.routing
    configs = []
    for _ in range(lanes):
        scorers = tuple(ScorerWeight(s.name, float(w)) for s, w in
                        zip(routing.scorers, rng.uniform(0.1, 3.0, len(routing.scorers)),
                            strict=True))
        policy = dataclasses.replace(cfg.policy,
                                     routing=dataclasses.replace(routing, scorers=scorers))
        configs.append(dataclasses.replace(cfg, policy=policy))
    return stack_params([params_from_config(c, tenants) for c in configs])


# Each variant after the first of its model, and the variant whose results it must repeat.
SAME_RESULTS_AS = {"blackbox-no-stretches": "blackbox", "roofline-no-stretches": "roofline",
                   "roofline-host": "roofline", "physics-no-stretches": "physics",
                   "physics-host": "physics"}


def variants(host_roofline: bool, host_physics: bool):
    """(name, resolved config, workload, static) of each variant."""
    cfg = load_config(DEFAULT)
    workload = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    blackbox = resolve_config(cfg)
    roofline = resolve_config(dataclasses.replace(cfg, latency=LatencyConfig(model="roofline")))
    out = [("blackbox", blackbox, workload, build_static(blackbox, workload)),
           ("blackbox-no-stretches", blackbox, workload,
            build_static(blackbox, workload, decode_stretches=False)),
           ("roofline", roofline, workload, build_static(roofline, workload)),
           ("roofline-no-stretches", roofline, workload,
            build_static(roofline, workload, decode_stretches=False))]
    if host_roofline:
        st = out[3][3].replace(latency=make_latency_model(roofline))
        out.append(("roofline-host", roofline, workload, st))
    physics = resolve_config(dataclasses.replace(cfg, latency=load_config(PHYSICS_SAMPLE).latency))
    out.append(("physics", physics, workload, build_static(physics, workload)))
    no_stretches = build_static(physics, workload, decode_stretches=False)
    out.append(("physics-no-stretches", physics, workload, no_stretches))
    if host_physics:
        st = no_stretches.replace(latency=make_latency_model(physics))
        out.append(("physics-host", physics, workload, st))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="64", help="population sizes")
    ap.add_argument("--rounds", type=int, default=3, help="timed calls per variant")
    ap.add_argument("--host-roofline", action="store_true",
                    help="also the roofline model through a host callback per step")
    ap.add_argument("--only", default="",
                    help="comma-separated variant names to run (default: all; the first is "
                         "the base of the ratios)")
    ap.add_argument("--host-physics", action="store_true",
                    help="also the physics model through a host callback per step")
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="split the CPU into this many JAX devices (lanes sharded over them)")
    args = ap.parse_args()
    print(json.dumps({"jax": jax.__version__, "devices": jax.local_device_count()}), flush=True)
    for lanes in (int(p) for p in args.lanes.split(",")):
        runs = []
        only = set(filter(None, args.only.split(",")))
        for name, resolved, workload, st in variants(args.host_roofline, args.host_physics):
            if only and name not in only:
                continue
            consts = build_consts(resolved, workload, st)
            params = population(resolved.config, workload.tenant_names, lanes)
            start = time.perf_counter()
            compiled = compile_lanes(st, consts, params)
            runs.append({"name": name, "compiled": compiled, "consts": consts,
                         "params": params, "compile_s": time.perf_counter() - start,
                         "times": [], "requests": st.shapes.num_requests})
        first = {}
        for _ in range(max(args.rounds, 1)):  # alternate: drift hits every variant alike
            for r in runs:
                start = time.perf_counter()
                final = jax.block_until_ready(r["compiled"](r["consts"], r["params"]))
                r["times"].append(time.perf_counter() - start)
                first.setdefault(r["name"], final)
        base = float(np.median(runs[0]["times"]))  # the first variant run (blackbox by default)
        ttft = {name: np.asarray(f.ttft)[..., :-1] for name, f in first.items()}
        for r in runs:
            run_s = float(np.median(r["times"]))
            row = {"variant": r["name"], "lanes": lanes, "compile_s": round(r["compile_s"], 1),
                   "run_s": [round(t, 2) for t in r["times"]], "median_s": round(run_s, 2),
                   "s_per_sim": round(run_s / lanes, 4),
                   "requests_per_s": round(lanes * r["requests"] / run_s, 1),
                   # simulated instance steps over all lanes, and those inside decode stretches
                   "steps": int(np.asarray(first[r["name"]].steps).sum()),
                   "stretched_steps": int(np.asarray(first[r["name"]].stretched).sum()),
                   f"time_vs_{runs[0]['name']}": round(run_s / base, 2)}
            twin = SAME_RESULTS_AS.get(r["name"])
            if twin in ttft:  # variants of one model give the same results
                row[f"same_ttft_as_{twin}"] = bool(np.array_equal(ttft[twin], ttft[r["name"]]))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
