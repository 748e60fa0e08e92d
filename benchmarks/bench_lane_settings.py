"""What reading the cluster's settings per lane costs (``EngineStatic.features.lane_settings``:
running requests, token budget, long-prefill threshold, admission and routing latency,
snapshot refresh interval, GPU KV blocks as knobs). Scenario S (2,000 requests, 4
instances), one population of P lanes three ways, in one process:

- ``base``: the lanes keep the base configuration's settings (the program holds them);
- ``per_lane``: the same lanes, the program reading each lane's settings (forced on): the
  cost of the feature alone, the lanes' runs being the same;
- ``distinct``: lanes with settings of their own (drawn), as a search over them runs.

    python benchmarks/bench_lane_settings.py --lanes 64 --rounds 3

Prints one JSON line: the median warm run of each (s) and ``per_lane / base``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
from bench_jax import population_configs, scenario  # noqa: E402

from blisjax.engine.consts import build_consts  # noqa: E402
from blisjax.engine.params import params_from_config, stack_params  # noqa: E402
from blisjax.engine.run import compile_lanes  # noqa: E402
from blisjax.engine.static import build_static  # noqa: E402


def _drawn(cfg, rng):
    """``cfg`` with settings of its own: a token budget of 256–2,048 with a threshold, and
    admission, routing and refresh latencies of 0–2 ms."""
    budget = int(rng.integers(256, cfg.engine.max_num_scheduled_tokens + 1))
    return dataclasses.replace(
        cfg, engine=dataclasses.replace(cfg.engine, max_num_scheduled_tokens=budget,
                                        long_prefill_token_threshold=int(budget // 2)),
        cluster=dataclasses.replace(
            cfg.cluster, admission_latency_us=int(rng.integers(0, 2000)),
            routing_latency_us=int(rng.integers(0, 2000)),
            snapshot_refresh_interval_us=int(rng.integers(0, 2000))))


def _timed(st, consts, params, rounds: int) -> float:
    run = compile_lanes(st, consts, params)
    jax.block_until_ready(run(consts, params))  # the first call
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(run(consts, params))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.lanes < 1 or args.rounds < 1:
        ap.error("--lanes and --rounds must be >= 1")
    resolved, wl = scenario(2_000, 4, 106.0)
    st = build_static(resolved, wl)
    consts = build_consts(resolved, wl, st)
    configs = population_configs(resolved.config, args.lanes)
    base = stack_params([params_from_config(c, wl.tenant_names) for c in configs])
    rng = np.random.default_rng(0)
    distinct = stack_params([params_from_config(_drawn(c, rng), wl.tenant_names)
                             for c in configs])
    out = {"lanes": args.lanes, "rounds": args.rounds,
           "base_s": _timed(st, consts, base, args.rounds),
           "per_lane_s": _timed(st.replace(lane_settings=True), consts, base, args.rounds),
           "distinct_s": _timed(st, consts, distinct, args.rounds)}
    out["per_lane_over_base"] = round(out["per_lane_s"] / out["base_s"], 3)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
