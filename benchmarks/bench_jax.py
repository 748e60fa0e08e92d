"""Throughput of the JAX engine on populations of policies, next to the reference engine.

Scenario S: 4 instances, 2,000 requests, blackbox llama-3.1-8b-instruct / H100 (``SimConfig()``
defaults with BLIS's golden-dataset coefficients, ``bench_reference.GOLDEN_DATASET_LATENCY``; KV
capacity computed as BLIS does), weighted routing, one shared prefix group, constant
arrivals; prompts 256 ± 256 tokens (+128 shared prefix tokens), outputs 64 ± 16. Each lane gets
its own random scorer weights, so lanes are distinct policies. Load is the arrival rate over the
saturation throughput (``--saturation`` measures it with the reference engine: ~132 completions/s
per instance), so the default 106 req/s per instance is ~80 % load. ``--targets`` runs the
per-simulation target scenarios (BLIS's anchor workload: Poisson 8 req/s per instance,
512 ± 256 tokens) at 1k/1, 10k/4 and 100k/16. Prints one JSON line per run:

* compile_s: lowering + XLA compilation (once per shapes, reported apart);
* run_s: wall time of the first call of the compiled program; s_per_sim: run_s / lanes
  (amortized per simulation); lane_events: events summed over lanes;
* warm_run_s, warm_requests_per_s: ``--warm-calls`` further calls of the same program (default
  2) and the throughput of their median — what each generation of a search loop costs after
  the first. On the benchmark machine (a VM) the first call at P = 1,024 took 5–9 s longer
  than the next ones, at P = 64 ~0.15 s; the cause is not pinned down (the calls make the same
  number of page faults, ~1.1 million);
* us_per_lane_event, evals_per_s (policy evaluations = lanes per second), requests_per_s
  (simulated requests per wall-second, summed over lanes);
* state_bytes_per_lane, peak_rss_mb (process high-water mark so far), busy (load: busy time /
  simulated time, lane 0);
* with ``--end-to-end``: first_call_s (compile + run + results) and call_s (the second call) of
  ``simulate_population`` — the engine run plus one ``RunResult`` per lane.

    python benchmarks/bench_jax.py                     # scenario S at P = 1, 64, 256, 1024
    python benchmarks/bench_jax.py --lanes 1,64 --reference
    python benchmarks/bench_jax.py --scaling           # vs N (1k, 10k, 100k), instances (1, 4, 16)
    python benchmarks/bench_jax.py --cpu-devices 2     # both cores: lanes sharded over 2 devices
    python benchmarks/bench_jax.py --targets --cpu-devices 2  # P = 64, 64, 2
    python benchmarks/bench_jax.py --end-to-end --cpu-devices 2 --lanes 1024
                                                       # whole calls: engine + per-lane results
    python benchmarks/bench_jax.py --saturation        # reference throughput at overload
    python benchmarks/bench_jax.py --tiered-preempt --lanes 1 --full-width-only
                                                       # BLIS's tiered replay with 63 preemptions
    python benchmarks/bench_jax.py --cpu-devices 2 --kv-blocks 500 --lanes 64,256 --reference
                                                       # a small KV cache: steps preempt
    python benchmarks/bench_jax.py --anchor --cpu-devices 2 --lanes 64,256
                                                       # BLIS's anchor workload (10k / 4) against
                                                       # one reference run, in one process
    python benchmarks/bench_jax.py --cpu-tier --cpu-devices 2 --lanes 64
                                                       # a CPU tier of the KV cache: lanes of
                                                       # distinct tier sizes vs one reference run
    python benchmarks/bench_jax.py --pd --cpu-devices 2 --lanes 64 --requests 500
                                                       # P/D pools: lanes of distinct splits,
                                                       # thresholds and decode-pool weights

``--anchor`` prints the reference engine's wall time on the same workload first, then for each
population ``speedup_vs_reference`` = reference seconds / JAX seconds per simulation (first
call); ``--no-stretches`` runs every decode step as its own iteration (for comparison).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path

from blisjax.devices import use_cpu_cores  # imports no JAX

if "--cpu-devices" in sys.argv:  # must come before JAX starts: split the CPU into N devices
    use_cpu_cores(int(sys.argv[sys.argv.index("--cpu-devices") + 1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from blisjax.config import (  # noqa: E402
    ClusterConfig,
    RoutingConfig,
    ScorerWeight,
    SimConfig,
    load_config,
    resolve_config,
)
from blisjax.engine.consts import build_consts  # noqa: E402
from blisjax.engine.params import params_from_config, stack_params  # noqa: E402
from blisjax.engine.run import compile_lanes, lane_result, simulate_population  # noqa: E402
from blisjax.engine.static import build_static  # noqa: E402
from blisjax.reference import simulate as reference  # noqa: E402
from blisjax.workload import (  # noqa: E402
    distribution_spec,
    generate_workload,
    parse_workload_spec,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_reference  # noqa: E402

SCORERS = ("prefix-affinity", "queue-depth", "kv-utilization", "load-balance")


def scenario(num_requests: int, instances: int, rate_per_instance: float,
             horizon_s: float | None = None, kv_blocks: int | None = None):
    """Scenario S; ``kv_blocks``: KV blocks per instance instead of the model's (a small cache
    makes steps preempt: 500 blocks give ~75 preemptions per instance)."""
    cfg = SimConfig(cluster=ClusterConfig(num_instances=instances), seed=42,
                    latency=bench_reference.GOLDEN_DATASET_LATENCY,
                    **({"horizon_us": int(horizon_s * 1e6)} if horizon_s else {}))
    if kv_blocks:
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine,
                                                                  total_kv_blocks=kv_blocks))
    cfg = _with_routing(cfg, (3.0, 2.0, 2.0, 1.0))
    spec = distribution_spec(rate_per_instance * instances, num_requests, prompt_mean=256,
                             prompt_std=256, output_mean=64, output_std=16, prefix_tokens=128)
    return resolve_config(cfg), generate_workload(spec, seed=42)


def _with_routing(cfg: SimConfig, weights) -> SimConfig:
    routing = RoutingConfig(policy="weighted", scorers=tuple(
        ScorerWeight(n, float(w)) for n, w in zip(SCORERS, weights, strict=True)),
        tie_break=cfg.policy.routing.tie_break)
    policy = cfg.policy.__class__(**{**cfg.policy.__dict__, "routing": routing})
    return cfg.__class__(**{**cfg.__dict__, "policy": policy})


def population_configs(cfg: SimConfig, lanes: int, seed: int = 0) -> list[SimConfig]:
    """The lanes' configurations: ``cfg`` with random weights of its four routing scorers."""
    rng = np.random.default_rng(seed)
    return [_with_routing(cfg, rng.uniform(0.1, 3.0, size=4)) for _ in range(lanes)]


def population(cfg: SimConfig, tenants, lanes: int, seed: int = 0):
    return stack_params([params_from_config(c, tenants)
                         for c in population_configs(cfg, lanes, seed)])


def anchor(num_requests: int, instances: int):
    """BLIS's anchor workload (``bench_reference``) with weighted routing (lanes vary weights)."""
    resolved, workload = bench_reference.scenario(num_requests, instances, 8.0)
    return resolve_config(_with_routing(resolved.config, (3.0, 2.0, 2.0, 1.0))), workload


TIER_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "search",
                           "cpu-tier.yaml")
TIER_MAX_BLOCKS = 1024  # the CPU tier's capacity in the program (lanes draw sizes up to it)


def cpu_tier(num_requests: int):
    """The CPU-tier example (configs/search/cpu-tier.yaml) with ``num_requests`` requests and a
    384-block tier (every prefix routed to an instance fits)."""
    cfg = load_config(TIER_CONFIG)
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kv_cpu_blocks=384))
    cfg = dataclasses.replace(cfg, workload={**cfg.workload, "num_requests": num_requests})
    return resolve_config(cfg), generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)


def tier_population(cfg: SimConfig, tenants, lanes: int, seed: int = 0):
    """Lanes of distinct CPU-tier sizes (0 .. ``TIER_MAX_BLOCKS``) and prefix-affinity weights."""
    rng = np.random.default_rng(seed)
    configs = []
    for _ in range(lanes):
        engine = dataclasses.replace(cfg.engine,
                                     kv_cpu_blocks=int(rng.integers(0, TIER_MAX_BLOCKS + 1)))
        routing = dataclasses.replace(cfg.policy.routing, scorers=(
            ScorerWeight("prefix-affinity", float(rng.uniform(0.1, 2.0))),
            ScorerWeight("load-balance", 1.0)))
        policy = dataclasses.replace(cfg.policy, routing=routing)
        configs.append(dataclasses.replace(cfg, engine=engine, policy=policy))
    return stack_params([params_from_config(c, tenants) for c in configs])


TIERED_PREEMPT = os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                              "blis-golden-next", "kv_tiered_preempt.json")


def tiered_preempt():
    """BLIS's ``kv_tiered_preempt`` replay with ``--blis-quirks`` (its exact command line):
    600 requests on 1 instance, 448 GPU blocks, a 2,500-block CPU tier, 63 preemptions."""
    from blisjax.cli import build_parser
    from blisjax.cli.config_args import config_from_args, trace_workload

    case = json.loads(Path(TIERED_PREEMPT).read_text())
    folder = Path(TIERED_PREEMPT).parent
    argv = shlex.split(case["command"])[1:]
    i = argv.index("--results-path")
    argv = [str(folder / a) if a.endswith((".yaml", ".csv")) else a
            for a in argv[:i] + argv[i + 2:]]
    args = build_parser().parse_args([*argv, "--blis-quirks"])
    cfg, _ = config_from_args(args)
    return resolve_config(cfg), trace_workload(args).workload


def tiered_preempt_population(cfg: SimConfig, tenants, lanes: int, seed: int = 0):
    """The replay's own policy in every lane."""
    del seed
    return stack_params([params_from_config(cfg, tenants)] * lanes)


PD_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "search", "pd-split.yaml")


def pd_split(num_requests: int):
    """The P/D example (configs/search/pd-split.yaml) with ``num_requests`` requests."""
    cfg = load_config(PD_CONFIG)
    cfg = dataclasses.replace(cfg, workload={**cfg.workload, "num_requests": num_requests})
    return resolve_config(cfg), generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)


def pd_population(cfg: SimConfig, tenants, lanes: int, seed: int = 0):
    """Lanes of distinct P/D splits (1–3 prefill instances of 4), prefix thresholds (0–4,096
    tokens) and decode-pool weights, as the example's search draws them."""
    rng = np.random.default_rng(seed)
    configs = []
    for _ in range(lanes):
        k, n = int(rng.integers(1, 4)), cfg.cluster.num_instances
        pd = dataclasses.replace(
            cfg.cluster.pd, prefill_instances=k, decode_instances=n - k,
            prefix_threshold_tokens=int(rng.integers(0, 4097)),
            decode_scorers=(ScorerWeight("kv-utilization", float(rng.uniform(0.1, 2.0))),
                            ScorerWeight("queue-depth", 1.0)))
        configs.append(dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, pd=pd)))
    return stack_params([params_from_config(c, tenants) for c in configs])


def run_jax(resolved, workload, lanes: int, warm_calls: int = 2,
            decode_stretches: bool | None = None, narrow_programs: bool = True,
            draw=None, lane_block: int | None = None, **capacities) -> dict:
    """``draw(config, tenants, lanes)``: the population (default: scenario S's routing weights,
    ``population``); ``lane_block``: lanes per lockstep loop (None: the engine's default; 1:
    solo lanes); ``capacities``: ``build_static``'s."""
    st = build_static(resolved, workload, decode_stretches=decode_stretches,
                      narrow_programs=narrow_programs, **capacities)
    consts = build_consts(resolved, workload, st)
    params = (draw or population)(resolved.config, workload.tenant_names, lanes)
    start = time.perf_counter()
    compiled = compile_lanes(st, consts, params, lane_block=lane_block)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    final = compiled(consts, params)
    jax.block_until_ready(final)
    run_s = time.perf_counter() - start
    events = int(np.asarray(final.run.iters).sum())
    final_stretched = final.run.stretched
    first = lane_result(st, consts, final, 0)
    state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(final)) // lanes
    del final  # the warm calls must not hold two populations' states at once (peak RSS)
    warm = []
    for _ in range(warm_calls):
        start = time.perf_counter()
        jax.block_until_ready(compiled(consts, params))
        warm.append(time.perf_counter() - start)
    warm_s = float(np.median(warm)) if warm else float("nan")
    return {
        "engine": "jax", "requests": st.shapes.num_requests, "instances": st.shapes.num_instances,
        "lanes": lanes, "devices": jax.local_device_count(), "compile_s": round(compile_s, 2),
        "decode_stretches": st.stretches, "narrow_programs": st.tuning.narrow_programs,
        "run_s": round(run_s, 3), "s_per_sim": round(run_s / lanes, 4), "lane_events": events,
        "stretched_steps": int(np.asarray(final_stretched).sum()),
        "us_per_lane_event": round(run_s / events * 1e6, 2),
        "evals_per_s": round(lanes / run_s, 2),
        "requests_per_s": round(lanes * st.shapes.num_requests / run_s, 1),
        "warm_run_s": [round(x, 3) for x in warm],
        "warm_requests_per_s": round(lanes * st.shapes.num_requests / warm_s, 1) if warm else None,
        "state_bytes_per_lane": int(state_bytes),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "completed_lane0": int(first.completed.sum()),
        "busy": round(float(first.busy_time_us.mean()) / max(first.sim_ended_us, 1), 3),
    }


def run_end_to_end(resolved, workload, lanes: int) -> dict:
    """A whole population call as a user makes it (``simulate_population``: engine run and one
    ``RunResult`` per lane), called twice: the first compiles, the second is timed."""
    params = population(resolved.config, workload.tenant_names, lanes)
    start = time.perf_counter()
    simulate_population(resolved, workload, params)
    first = time.perf_counter() - start
    start = time.perf_counter()
    simulate_population(resolved, workload, params)
    wall = time.perf_counter() - start
    return {"engine": "jax-end-to-end", "devices": jax.local_device_count(), "lanes": lanes,
            "first_call_s": round(first, 2), "call_s": round(wall, 3),
            "requests_per_s": round(lanes * workload.num_requests / wall, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def saturation(instances: int = 4, rate_per_instance: float = 300.0) -> dict:
    """Completions per second per instance of scenario S under overload (reference engine)."""
    resolved, workload = scenario(2_000, instances, rate_per_instance)
    result = reference(resolved, workload)
    per_instance = workload.num_requests / (result.sim_ended_us / 1e6) / instances
    return {"saturation_per_instance": round(per_instance, 1),
            "rate_for_80pct": round(0.8 * per_instance, 1)}


def run_reference(resolved, workload) -> dict:
    start = time.perf_counter()
    result = reference(resolved, workload)
    wall = time.perf_counter() - start
    n = workload.num_requests
    return {"engine": "reference", "requests": n, "instances": resolved.config.cluster.num_instances,
            "lanes": 1, "run_s": round(wall, 3), "evals_per_s": round(1 / wall, 3),
            "requests_per_s": round(n / wall, 1), "completed": int(result.completed.sum()),
            "preemptions": int(result.preemption_count.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="1,64,256,1024", help="population sizes for scenario S")
    ap.add_argument("--requests", type=int, default=2_000)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--rate-per-instance", type=float, default=106.0,
                    help="arrivals per second per instance (106: ~80%% of saturation)")
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="split the CPU into this many JAX devices (lanes sharded over them)")
    ap.add_argument("--reference", action="store_true", help="also time the reference engine")
    ap.add_argument("--kv-blocks", type=int, default=None,
                    help="scenario S with this many KV blocks per instance (500: preemptions)")
    ap.add_argument("--horizon-s", type=float, default=None,
                    help="stop each simulation at this simulated time (memory checks at large P)")
    ap.add_argument("--scaling", action="store_true",
                    help="P = --scaling-lanes at N = --scaling-n (4 instances) and instances 1/16 "
                         "(N = 2k)")
    ap.add_argument("--scaling-lanes", type=int, default=64)
    ap.add_argument("--scaling-n", default="1000,10000,100000",
                    help="request counts of the N sweep (4 instances)")
    ap.add_argument("--targets", action="store_true",
                    help="per-simulation target scenarios 1k/1, 10k/4, 100k/16 "
                         "(anchor workload)")
    ap.add_argument("--target-lanes", default="64,64,2",
                    help="P for each target scenario (0 skips it)")
    ap.add_argument("--end-to-end", action="store_true",
                    help="scenario S as whole simulate_population calls (engine + per-lane "
                         "results)")
    ap.add_argument("--anchor", action="store_true",
                    help="BLIS's anchor workload, 10,000 requests / 4 instances, weighted "
                         "routing: the reference engine once, then the populations of --lanes")
    ap.add_argument("--no-stretches", action="store_true",
                    help="with --anchor: every decode step its own iteration "
                         "(decode_stretches=False; default: the workload decides)")
    ap.add_argument("--full-width-only", action="store_true",
                    help="compile each step and release program at full width only "
                         "(narrow_programs=False: smaller program, faster compile)")
    ap.add_argument("--warm-calls", type=int, default=2,
                    help="timed calls after the first (same compiled program, warm memory)")
    ap.add_argument("--lane-block", type=int, default=None,
                    help="lanes per lockstep loop with --anchor or --cpu-tier (default: the "
                         "engine's; 1: solo lanes, each running only the handlers and trips it "
                         "needs)")
    ap.add_argument("--cpu-tier", action="store_true",
                    help="the CPU-tier example (configs/search/cpu-tier.yaml, --requests "
                         "requests): one reference run, then populations of distinct tier "
                         "sizes, in one process")
    ap.add_argument("--tiered-preempt", action="store_true",
                    help="BLIS's kv_tiered_preempt replay with --blis-quirks (600 requests, a "
                         "CPU tier, 63 preemptions): the reference engine, then the JAX engine "
                         "on the same policy in --lanes lanes (--full-width-only: the program "
                         "a single `blisjax replay --engine jax` compiles)")
    ap.add_argument("--pd", action="store_true",
                    help="the P/D example (configs/search/pd-split.yaml, --requests of it): "
                         "the reference engine on its configuration, then populations of "
                         "distinct splits, thresholds and decode-pool weights")
    ap.add_argument("--saturation", action="store_true",
                    help="measure scenario S's saturation throughput (reference engine)")
    args = ap.parse_args()
    if args.warm_calls < 0:
        ap.error(f"--warm-calls must be >= 0, got {args.warm_calls}")
    print(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                      "jax": jax.__version__, "devices": jax.local_device_count()}), flush=True)
    if args.saturation:
        print(json.dumps(saturation(args.instances)), flush=True)
        return
    if args.anchor:
        resolved, workload = anchor(10_000, 4)
        ref = run_reference(resolved, workload)
        print(json.dumps({"workload": "anchor", **ref}), flush=True)
        for p in args.lanes.split(","):
            row = run_jax(resolved, workload, int(p), args.warm_calls,
                          False if args.no_stretches else None, not args.full_width_only,
                          lane_block=args.lane_block)
            row["lane_block"] = args.lane_block
            row["speedup_vs_reference"] = round(ref["run_s"] / row["s_per_sim"], 2)
            print(json.dumps({"workload": "anchor", **row}), flush=True)
        return
    if args.cpu_tier:
        resolved, workload = cpu_tier(args.requests)
        ref = run_reference(resolved, workload)
        print(json.dumps({"workload": "cpu-tier", **ref}), flush=True)
        for p in args.lanes.split(","):
            row = run_jax(resolved, workload, int(p), args.warm_calls, draw=tier_population,
                          lane_block=args.lane_block, cpu_tier_blocks=TIER_MAX_BLOCKS)
            row["lane_block"] = args.lane_block
            row["speedup_vs_reference"] = round(ref["run_s"] / row["s_per_sim"], 2)
            print(json.dumps({"workload": "cpu-tier", **row}), flush=True)
        return
    if args.tiered_preempt:
        resolved, workload = tiered_preempt()
        ref = run_reference(resolved, workload)
        print(json.dumps({"workload": "kv_tiered_preempt", **ref}), flush=True)
        for p in args.lanes.split(","):
            row = run_jax(resolved, workload, int(p), args.warm_calls,
                          narrow_programs=not args.full_width_only,
                          draw=tiered_preempt_population)
            row["speedup_vs_reference"] = round(ref["run_s"] / row["s_per_sim"], 2)
            print(json.dumps({"workload": "kv_tiered_preempt", **row}), flush=True)
        return
    if args.pd:
        resolved, workload = pd_split(args.requests)
        ref = run_reference(resolved, workload)
        print(json.dumps({"workload": "pd-split", **ref}), flush=True)
        for p in args.lanes.split(","):
            row = run_jax(resolved, workload, int(p), args.warm_calls, draw=pd_population)
            row["speedup_vs_reference"] = round(ref["run_s"] / row["s_per_sim"], 2)
            print(json.dumps({"workload": "pd-split", **row}), flush=True)
        return
    if args.targets:
        lanes = [int(p) for p in args.target_lanes.split(",")]
        for (n, inst), p in zip(bench_reference.SCENARIOS, lanes, strict=True):
            if p < 1:  # 0 skips a scenario
                continue
            resolved, workload = anchor(n, inst)
            print(json.dumps({"workload": "anchor", **run_jax(resolved, workload, p, args.warm_calls)}),
                             flush=True)
        return
    if args.end_to_end:
        resolved, workload = scenario(args.requests, args.instances, args.rate_per_instance)
        for p in args.lanes.split(","):
            print(json.dumps(run_end_to_end(resolved, workload, int(p))), flush=True)
        return
    runs = [(args.requests, args.instances, int(p)) for p in args.lanes.split(",")]
    if args.scaling:
        p = args.scaling_lanes
        runs = [(int(n), 4, p) for n in args.scaling_n.split(",")]
        runs += [(2_000, 1, p), (2_000, 16, p)]
    kv = {"kv_blocks": args.kv_blocks} if args.kv_blocks else {}
    for n, inst, lanes in runs:
        resolved, workload = scenario(n, inst, args.rate_per_instance, args.horizon_s,
                                      args.kv_blocks)
        print(json.dumps({"rate_per_instance": args.rate_per_instance, **kv,
                          **run_jax(resolved, workload, lanes, args.warm_calls,
                                    narrow_programs=not args.full_width_only)}), flush=True)
    if args.reference:
        resolved, workload = scenario(args.requests, args.instances, args.rate_per_instance,
                                      kv_blocks=args.kv_blocks)
        print(json.dumps({**kv, **run_reference(resolved, workload)}), flush=True)


if __name__ == "__main__":
    main()
