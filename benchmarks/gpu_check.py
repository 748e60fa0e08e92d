"""One-shot check of the JAX engine on an accelerator: exactness against the reference engine,
throughput per simulation by population size, compile times and peak device memory.

Workload: BLIS's anchor workload (``bench_jax.anchor``: Poisson 8 req/s per instance, 4
instances, BLIS's default lengths, llama-3.1-8b-instruct / H100), its first ``--requests``
requests for the population sizes and the whole 10,000-request trace at the largest size where
time allows. Lanes are distinct weighted-routing policies (random weights of four scorers).

Stages, most important first. Their programs compile at once (threads: a GPU compile takes
minutes and the host's cores share the work), then each stage runs as soon as its program is
ready, unless a call estimated from the stages before it (by requests, and by lanes with the
growth measured between sizes) would overrun ``--budget-s``:

1. roofline at the smallest population: two calls; ``--parity-lanes`` random lanes compared
   request by request with independent reference runs (computed meanwhile on the host's cores
   in worker processes);
2. blackbox, the same;
3. roofline at the other population sizes (two calls; the lanes compared in stage 1 must
   give the same results in a larger population);
4. roofline on the whole anchor trace at the largest population, a few lanes compared with
   reference runs of the whole trace;
5. (GPU only) stage 1 again in a child process under XLA flags that put while loops and
   conditionals into CUDA graphs: time, and each lane's results against stage 1.

A line says how many programs were still compiling while its calls ran (they share the host).
Prints one JSON line per stage and a Markdown table last; with ``--out DIR`` (default: $OUT
when set) the lines go to DIR/gpu_check.jsonl as well, each written as soon as it is known.

    python benchmarks/gpu_check.py                           # on a GPU (< 8 min)
    python benchmarks/gpu_check.py --small                   # on a CPU: 2 instances, 4 lanes
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# XLA flags of stage 3: while loops and conditionals run inside CUDA graphs (conditional
# nodes), so a loop iteration needs no round trip to the host for its predicate.
GRAPH_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
               "CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1")
FULL_TRACE = 10_000


@dataclasses.dataclass(frozen=True)
class Case:
    """One population run: latency model, requests of the anchor trace, lanes, instances."""

    model: str
    requests: int
    lanes: int
    instances: int


def resolved_case(case: Case):
    """(resolved configuration, workload) of ``case`` (imports the engines' shared config)."""
    from bench_jax import anchor

    from blisjax.config import LatencyConfig, resolve_config

    resolved, workload = anchor(case.requests, case.instances)
    if case.model == "roofline":
        resolved = resolve_config(dataclasses.replace(
            resolved.config, latency=LatencyConfig(model="roofline")))
    return resolved, workload


def lane_config(case: Case, k: int):
    """Lane k's configuration (``bench_jax.population_configs``, seed 0)."""
    from bench_jax import population_configs

    resolved, _ = resolved_case(case)
    return population_configs(resolved.config, k + 1)[k]


def reference_run(case: Case, k: int):
    """Lane k of ``case`` run by the reference engine (in a worker process)."""
    os.environ["JAX_PLATFORMS"] = "cpu"  # a worker never touches the accelerator
    from blisjax.config import resolve_config
    from blisjax.reference import simulate

    _, workload = resolved_case(case)
    return simulate(resolve_config(lane_config(case, k)), workload)


def fingerprint(result) -> str:
    """A digest of every field the parity check compares."""
    import numpy as np

    from blisjax.engine import parity

    h = hashlib.sha256()
    for f in (*parity.REQUEST_FIELDS, *parity.RUN_FIELDS):
        x = np.asarray(getattr(result, f))
        h.update(np.sort(x).tobytes() if f == "itl_entries_us" else x.tobytes())
    return h.hexdigest()[:16]


def parity_lanes(lanes: int, count: int) -> list[int]:
    """``count`` distinct lanes of ``lanes``, drawn at random (always lane 0 and the last)."""
    import numpy as np

    if count >= lanes:
        return list(range(lanes))
    rest = np.random.default_rng(7).choice(np.arange(1, lanes - 1), count - 2, replace=False)
    return sorted({0, lanes - 1, *(int(x) for x in rest)})


def device_memory() -> dict:
    """Peak and limit of device 0's memory in GiB (empty on a CPU, which reports none)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    gib = 1 << 30
    return {k: round(stats[s] / gib, 2) for k, s in (("peak_gib", "peak_bytes_in_use"),
                                                     ("limit_gib", "bytes_limit")) if s in stats}


@dataclasses.dataclass
class Compiled:
    """A case's compiled program and what its calls take."""

    case: Case
    run: Any  # run(consts, params) -> final states
    st: Any
    consts: Any
    params: Any
    compile_s: float


def compile_case(case: Case) -> Compiled:
    """Build and compile ``case``'s program (thread-safe: several compile at once)."""
    from bench_jax import population

    from blisjax.engine.consts import build_consts
    from blisjax.engine.latency_rows import for_hardware
    from blisjax.engine.run import compile_lanes
    from blisjax.engine.static import build_static

    resolved, workload = resolved_case(case)
    params = population(resolved.config, workload.tenant_names, case.lanes)
    st = for_hardware(build_static(resolved, workload), resolved, workload, params)
    consts = build_consts(resolved, workload, st)
    start = time.perf_counter()
    run = compile_lanes(st, consts, params)
    return Compiled(case, run, st, consts, params, time.perf_counter() - start)


def run_compiled(prog: Compiled, calls: int, lanes_checked: list[int],
                 seconds_left=lambda: float("inf")) -> tuple[dict, dict]:
    """Call ``prog`` up to ``calls`` times (a further call only while ``seconds_left()``
    exceeds 1.5 calls); returns (measurements, {lane: RunResult} of ``lanes_checked``)."""
    import jax
    import numpy as np

    from blisjax.engine.run import HostLanes, lane_result

    case, st, consts = prog.case, prog.st, prog.consts
    times, final = [], None
    for _ in range(calls):
        if times and seconds_left() < 1.5 * times[-1]:
            break
        final = None  # two populations' states are never held at once
        start = time.perf_counter()
        final = jax.block_until_ready(prog.run(consts, prog.params))
        times.append(time.perf_counter() - start)
    events = int(np.asarray(final.run.iters).sum())
    state = sum(x.nbytes for x in jax.tree_util.tree_leaves(final)) // case.lanes
    # only the checked lanes travel to the host
    picked = jax.tree_util.tree_map(lambda x: x[np.asarray(lanes_checked, dtype=np.int64)], final)
    host = HostLanes(picked)
    results = {k: lane_result(st, consts, host, j) for j, k in enumerate(lanes_checked)}
    best = min(times)
    line = {**dataclasses.asdict(case), "compile_s": round(prog.compile_s, 1),
            "calls_s": [round(t, 3) for t in times], "per_sim_ms": round(best / case.lanes * 1e3, 3),
            "us_per_lane_event": round(best / events * 1e6, 4), "lane_events": events,
            "state_mb_per_lane": round(state / 1e6, 2), **device_memory()}
    return line, results


def parity_line(results: dict, pending: dict) -> dict:
    """Each checked lane against its reference run (waits for the runs)."""
    from blisjax.engine.parity import first_divergence

    bad = {}
    for k, future in pending.items():
        why = first_divergence(future.result(), results[k])
        if why is not None:
            bad[k] = why
    return {"parity_lanes": len(pending), "parity_identical": len(pending) - len(bad),
            "parity_first_divergences": dict(list(bad.items())[:3])}


def child_stage(spec: str) -> None:
    """Stage 3's child: run the case in ``spec`` and print its line with lane fingerprints."""
    job = json.loads(spec)
    case = Case(**job["case"])
    line, results = run_compiled(compile_case(case), job["calls"], job["lanes"])
    line["fingerprints"] = {str(k): fingerprint(r) for k, r in results.items()}
    print("CHILD " + json.dumps(line), flush=True)


class Report:
    """JSON lines to stdout and, if given, to ``DIR/gpu_check.jsonl`` as they come."""

    def __init__(self, out: str | None) -> None:
        self.rows: list[dict] = []
        self.path = Path(out) / "gpu_check.jsonl" if out else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def __call__(self, row: dict) -> None:
        self.rows.append(row)
        text = json.dumps(row)
        print(text, flush=True)
        if self.path:
            with self.path.open("a") as f:
                f.write(text + "\n")


def environment() -> dict:
    import jax

    dev = jax.local_devices()[0]
    env = {"stage": "environment", "python": platform.python_version(), "jax": jax.__version__,
           "backend": jax.default_backend(), "device": dev.device_kind,
           "devices": jax.local_device_count(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "host_cores": os.cpu_count()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        env["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def main() -> None:  # noqa: C901 -- one script, stage after stage
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true",
                    help="a CPU-sized check: 2 instances, 40 requests, 4 lanes, 4 compared")
    ap.add_argument("--lanes", help="population sizes, comma-separated; the smallest is "
                                     "compared with the reference (default 256,1024,4096; "
                                     "with --small 4)")
    ap.add_argument("--requests", type=int, default=1_000,
                    help="requests of the anchor trace for the population sizes")
    ap.add_argument("--parity-lanes", type=int, default=64)
    ap.add_argument("--full-parity-lanes", type=int, default=12,
                    help="lanes compared on the whole anchor trace (stage 5)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting stages that would end later than this")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.jsonl")
    ap.add_argument("--stages", default="roofline,blackbox,sizes,full-trace,cuda-graphs",
                    help="the stages to run, comma-separated")
    ap.add_argument("--compile-workers", type=int, default=0,
                    help="programs compiled at once (default: all of them on a GPU, one on a "
                         "CPU)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_stage(args.child)
        return
    t0 = time.perf_counter()
    instances = 4
    lanes = [int(x) for x in (args.lanes or ("4" if args.small else "256,1024,4096")).split(",")]
    if args.small:
        instances, args.requests = 2, 40
        args.parity_lanes = args.full_parity_lanes = 4
    if min(lanes) < 1 or args.requests < 1 or args.parity_lanes < 2:
        ap.error("--lanes and --requests must be >= 1, --parity-lanes >= 2")
    report = Report(args.out)
    # Reference runs start first, in worker processes that never import JAX's accelerator
    # backend ("spawn": nothing of this process's JAX is inherited).
    workers = max(1, min(12, (os.cpu_count() or 2) - 2))
    pool = futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    checked = parity_lanes(min(lanes), args.parity_lanes)
    full = Case("roofline", FULL_TRACE if not args.small else 2 * args.requests, min(lanes),
                instances)
    full_checked = parity_lanes(min(lanes), args.full_parity_lanes)
    cases = {m: Case(m, args.requests, min(lanes), instances) for m in ("roofline", "blackbox")}
    pending = {m: {k: pool.submit(reference_run, c, k) for k in checked} for m, c in cases.items()}
    pending["full"] = {k: pool.submit(reference_run, full, k) for k in full_checked}

    import jax

    env = environment()
    report(env)
    gpu = env["backend"] == "gpu"
    want = set(args.stages.split(","))
    small_p, big_p = min(lanes), max(lanes)
    plan: list[tuple[str, Case, int, list[int], dict]] = []
    if "roofline" in want:
        plan.append(("roofline", cases["roofline"], 2, checked, pending["roofline"]))
    if "blackbox" in want:
        plan.append(("blackbox", cases["blackbox"], 2, checked, pending["blackbox"]))
    for p in sorted(set(lanes) - {small_p}) if "sizes" in want else []:
        plan.append((f"roofline-{p}", Case("roofline", args.requests, p, instances), 2,
                     [k for k in checked if k < p], {}))
    if "full-trace" in want:
        plan.append(("roofline-full-trace", dataclasses.replace(full, lanes=big_p), 1,
                     full_checked, pending["full"]))
    # Every program compiles at once (the host's cores work on them together; a GPU compile is
    # minutes); the stages then run in order as their programs are ready.
    compile_workers = args.compile_workers or (len(plan) if gpu else 1)
    compiler = futures.ThreadPoolExecutor(max(1, compile_workers))
    programs = [compiler.submit(compile_case, case) for _, case, *_ in plan]
    measured: dict[tuple, float] = {}  # (model, requests, lanes) -> fastest call, s

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t0)

    def estimate(case: Case) -> float | None:
        """A call of ``case`` from the measured calls of the same model: scaled by requests,
        and by lanes with the growth seen between the two largest sizes measured (linear in
        lanes from a single size)."""
        same = sorted((p, t) for (m, r, p), t in measured.items()
                      if m == case.model and r == args.requests)
        if not same:
            return None
        (p1, t1) = same[-1]
        growth, ratio = 1.0, case.lanes / p1
        if ratio > 1 and len(same) >= 2:  # the power law through the two largest sizes
            p0, t_p0 = same[-2]
            growth = ratio ** (math.log(t1 / t_p0) / math.log(p1 / p0))
        elif ratio > 1:
            growth = ratio
        return t1 * growth * case.requests / args.requests

    first = None
    for (name, case, calls, lanes_checked, refs), future in zip(plan, programs, strict=True):
        print(f"[{time.perf_counter() - t0:6.1f} s] {name}: {case}", file=sys.stderr, flush=True)
        try:
            prog = future.result(timeout=max(1.0, left()))
        except futures.TimeoutError:
            report({"stage": name, "skipped": "its program was still compiling at the budget"})
            continue
        except Exception as exc:  # report and go on: later stages may still run
            report({"stage": name, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:]})
            continue
        guess = estimate(case)
        if guess is not None and 1.1 * guess > left():
            report({"stage": name, "skipped": f"a call estimated at {guess:.0f} s, "
                                              f"{left():.0f} s left"})
            continue
        compiling = sum(not f.done() for f in programs)
        try:
            line, results = run_compiled(prog, calls, lanes_checked, left)
        except Exception as exc:
            report({"stage": name, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:]})
            continue
        measured[(case.model, case.requests, case.lanes)] = min(line["calls_s"])
        line.update(stage=name, compiles_in_flight=compiling)
        if refs:
            line.update(parity_line(results, refs))
        line["fingerprints"] = {str(k): fingerprint(r) for k, r in results.items()}
        if first is not None and name.startswith("roofline-") and case.requests == args.requests:
            same = sum(line["fingerprints"][k] == first["fingerprints"].get(k)
                       for k in line["fingerprints"])
            line["lanes_as_in_roofline_stage"] = f"{same}/{len(line['fingerprints'])}"
        if name == "roofline":
            first = line
        report(line)
        del prog, results
    base = measured.get(("roofline", args.requests, small_p))
    if "cuda-graphs" in want and gpu and first is not None and base is not None:
        if 200 + 2 * base > left():
            report({"stage": "cuda-graphs", "skipped": f"{left():.0f} s left"})
        else:
            job = {"case": dataclasses.asdict(cases["roofline"]), "calls": 2, "lanes": checked}
            env_child = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                                                    f"{GRAPH_FLAGS}".strip()}
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)],
                                      capture_output=True, text=True, env=env_child,
                                      timeout=max(30.0, left()))
                rows = [ln[6:] for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
                if rows:
                    line = json.loads(rows[-1])
                    same = sum(line["fingerprints"][str(k)] == first["fingerprints"][str(k)]
                               for k in checked)
                    line.update(stage="cuda-graphs", xla_flags=GRAPH_FLAGS,
                                lanes_as_in_roofline_stage=f"{same}/{len(checked)}")
                    del line["fingerprints"]
                    report(line)
                else:
                    report({"stage": "cuda-graphs", "error": proc.stderr[-3000:]})
            except subprocess.TimeoutExpired:
                report({"stage": "cuda-graphs", "error": "timed out"})
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()  # reference runs of skipped stages are not waited for
    report({"stage": "end", "wall_s": round(time.perf_counter() - t0, 1)})
    print()
    print("| stage | model | requests | lanes | compile s | calls s | per simulation ms | "
          "identical lanes | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report.rows:
        if "calls_s" in r:
            ident = (f"{r['parity_identical']}/{r['parity_lanes']}" if "parity_lanes" in r
                     else r.get("lanes_as_in_roofline_stage", "–"))
            print(f"| {r['stage']} | {r['model']} | {r['requests']} | {r['lanes']} | "
                  f"{r['compile_s']} | {r['calls_s']} | {r['per_sim_ms']} | {ident} | "
                  f"{r.get('peak_gib', '–')} |")
    del jax
    sys.stdout.flush()
    os._exit(0)  # worker processes still running references of skipped stages are dropped


if __name__ == "__main__":
    main()
