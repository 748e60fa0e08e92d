"""A/B wall time of the JAX engine against a git revision of itself, in one process.

A shared or virtual machine's speed can drift by up to ~30 % within an hour (measured on the
2-core benchmark VM), so timings from separate processes cannot resolve changes of a few
percent. This script exports the base
revision's ``blisjax`` package from git under another name (``blisjax_base``), compiles scenario
S (``bench_jax.py``) with both engines in the same process, checks that both produce the same
per-request results, and then alternates timed calls (A B, B A, …) so drift hits both alike.
Prints one JSON line: each side's wall times, medians, and the per-round ratios new / base.

    python benchmarks/ab_engine.py --base HEAD~1             # P = 64, 6 rounds, one device
    taskset -c 0 python benchmarks/ab_engine.py --base main --lanes 64 --rounds 8
    python benchmarks/ab_engine.py --base main --cpu-devices 2 --lanes 256 --rounds 5
    python benchmarks/ab_engine.py --base main --anchor 50000 --lanes 4 --rounds 3
    python benchmarks/ab_engine.py --base main --anchor 1000 --roofline   # roofline steps
    python benchmarks/ab_engine.py --base main --anchor 1000 --cpu-blocks 4000 --lanes 8

Confirm a change with ``--cpu-devices 2``, the configuration of the headline benchmark: that
program goes through XLA's SPMD partitioner and is fused differently. Removing a whole-array
copy of the per-slot block counts from the release program gave 0.955 with one device and
0.995–1.014 with two, where XLA never made that copy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

from blisjax.devices import use_cpu_cores  # imports no JAX

if "--cpu-devices" in sys.argv:  # must come before JAX starts: split the CPU into N devices
    use_cpu_cores(int(sys.argv[sys.argv.index("--cpu-devices") + 1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# per-request state compared between the two engines (the last row is a write sink); E2E,
# output tokens done and ITL counts are derived from these (results._completion_fields)
OUTPUT_FIELDS = ("status", "ttft", "sched", "itl_sum", "preempt", "pi")


def timed(run, consts, params) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(run(consts, params))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare the working tree with")
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--lane-block", type=int, default=64)
    ap.add_argument("--kv-blocks", type=int, default=0,
                    help="KV blocks per instance instead of the model's (e.g. 500: preemptions)")
    ap.add_argument("--cpu-blocks", type=int, default=0,
                    help="a CPU tier of this many KV blocks per instance in every lane "
                         "(tiered programs: the mirror pass after every step)")
    ap.add_argument("--tie-break", choices=("blis-random", "lowest-index"), default=None,
                    help="routing.tie_break of every lane (default: the configuration's); "
                         "lowest-index routes as revisions before random tie-breaks did")
    ap.add_argument("--cpu-devices", type=int, default=1,
                    help="split the CPU into this many devices; lanes are sharded over them")
    ap.add_argument("--anchor", type=int, default=0, metavar="N",
                    help="BLIS's anchor workload with N requests on 4 instances (512-token "
                         "outputs: decode stretches) instead of scenario S")
    ap.add_argument("--roofline", action="store_true",
                    help="the roofline latency model (the model's and GPU's constants) instead "
                         "of the configuration's")
    args = ap.parse_args()
    if args.lanes < 1 or args.rounds < 1 or args.cpu_devices < 1 or args.kv_blocks < 0 \
            or args.cpu_blocks < 0:
        ap.error("--lanes, --rounds and --cpu-devices must be >= 1, --kv-blocks and "
                 "--cpu-blocks >= 0")
    if len(jax.local_devices()) != args.cpu_devices:
        ap.error(f"--cpu-devices {args.cpu_devices}: JAX sees {len(jax.local_devices())} "
                 "devices (is XLA_FLAGS already setting a device count?)")

    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from base_revision import BASE_NAME, export_base, own_config, own_resolved  # noqa: E402
    from bench_jax import anchor, population_configs, scenario  # noqa: E402

    if args.anchor and args.kv_blocks:
        ap.error("--kv-blocks applies to scenario S, not --anchor")
    resolved, wl = (anchor(args.anchor, 4) if args.anchor else
                    scenario(2_000, 4, 106.0, kv_blocks=args.kv_blocks))
    if args.roofline:
        import dataclasses

        from blisjax.config import LatencyConfig, resolve_config  # noqa: E402

        resolved = resolve_config(dataclasses.replace(
            resolved.config, latency=LatencyConfig(model="roofline")))
    if args.cpu_blocks:
        from blisjax.config import resolve_config  # noqa: E402
        from blisjax.engine.population import set_knob  # noqa: E402

        resolved = resolve_config(set_knob(resolved.config, "engine.kv_cpu_blocks",
                                           args.cpu_blocks))
    if args.tie_break is not None:
        from blisjax.config import resolve_config  # noqa: E402
        from blisjax.engine.population import set_knob  # noqa: E402

        resolved = resolve_config(set_knob(resolved.config, "routing.tie_break",
                                           args.tie_break))
    configs = population_configs(resolved.config, args.lanes)
    with tempfile.TemporaryDirectory() as tmp:
        export_base(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        # each side's program, constants and knobs built by its own code (the records' layout
        # may differ)
        params, consts, runs = {}, {}, {}
        for name in (BASE_NAME, "blisjax"):
            # each side reads the configurations with its own classes: a configuration record
            # of the other package never equals one of its own (a base given the working
            # tree's records took the default lifecycle for a configured one and compiled
            # lifecycles in)
            side_configs = [own_config(c, name, Path(tmp)) for c in configs]
            side = own_resolved(resolved, name, Path(tmp))
            module = importlib.import_module(f"{name}.engine.params")
            params[name] = module.stack_params([module.params_from_config(c, wl.tenant_names)
                                                for c in side_configs])
            st = importlib.import_module(f"{name}.engine.static").build_static(side, wl)
            consts[name] = importlib.import_module(f"{name}.engine.consts").build_consts(
                side, wl, st)
            runs[name] = importlib.import_module(f"{name}.engine.run").compile_lanes(
                st, consts[name], params[name], lane_block=args.lane_block)
        finals = {name: run(consts[name], params[name]) for name, run in runs.items()}
    same = all(np.array_equal(np.asarray(getattr(finals[BASE_NAME], f))[:, :-1],
                              np.asarray(getattr(finals["blisjax"], f))[:, :-1])
               for f in OUTPUT_FIELDS)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(args.rounds):
        for name in (list(runs) if k % 2 == 0 else list(runs)[::-1]):
            walls[name].append(timed(runs[name], consts[name], params[name]))
    base, new = walls[BASE_NAME], walls["blisjax"]
    print(json.dumps({
        "base": args.base, "anchor_requests": args.anchor or None, "lanes": args.lanes,
        "roofline": args.roofline,
        "devices": args.cpu_devices,
        "kv_blocks": args.kv_blocks or None, "cpu_blocks": args.cpu_blocks or None,
        "tie_break": args.tie_break,
        "same_results": bool(same),
        "base_s": [round(x, 3) for x in base], "new_s": [round(x, 3) for x in new],
        "base_median_s": round(float(np.median(base)), 3),
        "new_median_s": round(float(np.median(new)), 3),
        "ratio_new_over_base_median": round(float(np.median(new) / np.median(base)), 3),
        "ratio_per_round": [round(b / a, 3) for a, b in zip(base, new, strict=True)]}))


if __name__ == "__main__":
    main()
