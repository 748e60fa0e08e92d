"""Population throughput of policy programs against weighted routing, in one process.

The program-router example (``configs/search/program-router.yaml``: 4 instances, 800
requests, four tenants with long shared prompts) as P lanes of three kinds: weighted routing
with random weights over the four scorers the example's template search uses (the base of the
ratios); routing programs of the GP example's size (random trees of about 13 nodes over the
same scorers and the raw queue, in-flight and KV counts, each lane a different structure); the
same programs with admission and priority programs as well. Each kind is compiled once
(compile_s) and timed ``--rounds`` times, alternating, so machine drift hits them alike. Prints
one JSON line per kind: times, seconds per simulation, the ratio to weighted routing.

    python benchmarks/bench_programs.py                 # P = 64, one device
    python benchmarks/bench_programs.py --lanes 256 --cpu-devices 2
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

from blisjax.config import (  # noqa: E402
    AdmissionConfig,
    PriorityConfig,
    RoutingConfig,
    ScorerWeight,
    load_config,
    resolve_config,
)
from blisjax.engine.consts import build_consts  # noqa: E402
from blisjax.engine.params import params_from_config, stack_params  # noqa: E402
from blisjax.engine.run import compile_lanes  # noqa: E402
from blisjax.engine.static import build_static  # noqa: E402
from blisjax.engine.static_lanes import for_lanes  # noqa: E402
from blisjax.program import Node, to_text  # noqa: E402
from blisjax.program.bytecode import MAX_PROGRAM_LENGTH, assemble  # noqa: E402
from blisjax.workload import workload_from_section  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "search" / "program-router.yaml"
SCORERS = ("prefix-affinity", "load-balance", "queue-depth", "kv-utilization")
ROUTING_NAMES = ("score_prefix_affinity", "score_load_balance", "score_queue_depth",
                 "score_kv_utilization", "queue_depth", "in_flight", "kv_utilization")
OPERATORS = ("add", "sub", "mul", "div", "min", "max", "lt", "gt")


def random_tree(rng, names, nodes: int) -> Node:
    """A random tree of about ``nodes`` nodes over ``names``, binary operators and ``if``."""
    if nodes <= 1:
        if rng.random() < 0.8:
            return Node("name", name=str(rng.choice(names)))
        return Node("const", value=float(np.round(rng.uniform(-10, 10), 2)))
    if rng.random() < 0.15 and nodes >= 4:
        k = (nodes - 1) // 3
        return Node("if", (random_tree(rng, names, k), random_tree(rng, names, k),
                           random_tree(rng, names, nodes - 1 - 2 * k)))
    left = int(rng.integers(1, nodes - 1)) if nodes > 2 else 1
    return Node(str(rng.choice(OPERATORS)), (random_tree(rng, names, left),
                                             random_tree(rng, names, nodes - 1 - left)))


def kinds(cfg, lanes: int, seed: int = 0) -> dict[str, list]:
    """The three populations of configurations (kind → one config per lane)."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {"weighted": [], "routing-program": [], "three-programs": []}
    for _ in range(lanes):
        weights = rng.uniform(0.01, 3.0, len(SCORERS))
        weighted = RoutingConfig(policy="weighted", tie_break="lowest-index", scorers=tuple(
            ScorerWeight(n, float(w)) for n, w in zip(SCORERS, weights, strict=True)))
        while True:
            tree = random_tree(rng, ROUTING_NAMES, 13)
            if len(assemble(tree, {})) <= MAX_PROGRAM_LENGTH:
                break
        program = RoutingConfig(policy="program", program=to_text(tree), tie_break="lowest-index")
        admission = AdmissionConfig(policy="program", program=to_text(random_tree(
            rng, ("cluster_queue_depth", "arrival_rate", "input_tokens", "slo_class_rank"), 7))
            + " or 1")
        priority = PriorityConfig(policy="program", program=to_text(random_tree(
            rng, ("age_ms", "input_tokens", "prefix_tokens", "tenant_in_flight"), 7)))
        for kind, sections in (("weighted", dict(routing=weighted)),
                               ("routing-program", dict(routing=program)),
                               ("three-programs", dict(routing=program, admission=admission,
                                                       priority=priority))):
            policy = dataclasses.replace(cfg.policy, **sections)
            out[kind].append(dataclasses.replace(cfg, policy=policy))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="split the CPU into this many JAX devices (lanes sharded over them)")
    args = ap.parse_args()
    cfg = load_config(EXAMPLE)
    resolved = resolve_config(cfg)
    workload = workload_from_section(cfg.workload, cfg.seed)
    print(json.dumps({"jax": jax.__version__, "devices": jax.local_device_count(),
                      "requests": workload.num_requests, "lanes": args.lanes}), flush=True)
    runs = []
    for kind, configs in kinds(cfg, args.lanes).items():
        params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
        st = for_lanes(build_static(resolved, workload), params)
        consts = build_consts(resolved, workload, st)
        start = time.perf_counter()
        compiled = compile_lanes(st, consts, params)
        runs.append({"kind": kind, "compiled": compiled, "consts": consts, "params": params,
                     "compile_s": time.perf_counter() - start, "times": []})
    for _ in range(max(args.rounds, 1)):  # alternate: drift hits every kind alike
        for r in runs:
            start = time.perf_counter()
            jax.block_until_ready(r["compiled"](r["consts"], r["params"]))
            r["times"].append(time.perf_counter() - start)
    base = float(np.median(runs[0]["times"]))
    for r in runs:
        run_s = float(np.median(r["times"]))
        print(json.dumps({"kind": r["kind"], "compile_s": round(r["compile_s"], 1),
                          "run_s": [round(t, 2) for t in r["times"]],
                          "median_s": round(run_s, 2),
                          "s_per_sim": round(run_s / args.lanes, 4),
                          "vs_weighted": round(run_s / base, 3)}), flush=True)


if __name__ == "__main__":
    main()
