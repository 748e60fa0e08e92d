"""Two ways to run a population's lanes on CPU, on BLIS's anchor workload: in lockstep (one
``while_loop`` over a block of up to 64 vmapped lanes, every handler any lane needs run masked
for all) or solo (blocks of one lane, ``lax.map`` over them: each lane's loops run only the
trips it needs, its handlers only when it needs them). Both run the same engine source; the
style is the lane block (``simulate_population(lane_block=...)``).

Prints one JSON line per (style, P): compile and run seconds, seconds per simulation, lane-events
(``RunControl.iters``) and microseconds per lane-event. Every style gives the same per-lane
results (checked here on each lane's TTFTs). Kernel counts: ``profile_engine.py --anchor
--lanes 1``. Figures: docs/performance.md, "Lockstep or solo lanes".

    python benchmarks/bench_lane_styles.py --requests 1000 --lanes 1,64,256
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from blisjax.engine.consts import build_consts
from blisjax.engine.run import compile_lanes
from blisjax.engine.static import build_static

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_jax  # noqa: E402

STYLES = {"lockstep": 64, "solo": 1}


def run(requests: int, lanes: int, style: str, calls: int) -> tuple[dict, np.ndarray]:
    resolved, workload = bench_jax.anchor(requests, 4)
    st = build_static(resolved, workload)
    consts = build_consts(resolved, workload, st)
    params = bench_jax.population(resolved.config, workload.tenant_names, lanes)
    start = time.perf_counter()
    compiled = compile_lanes(st, consts, params, lane_block=STYLES[style])
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        final = compiled(consts, params)
        jax.block_until_ready(final)
        times.append(time.perf_counter() - start)
    events = int(np.asarray(final.run.iters).sum())
    best = min(times)
    row = {"style": style, "lanes": lanes, "requests": requests, "compile_s": round(compile_s, 1),
           "run_s": [round(t, 2) for t in times], "per_simulation_s": round(best / lanes, 4),
           "lane_events": events, "us_per_lane_event": round(best / events * 1e6, 2)}
    # row N is the masked writes' sink
    return row, np.asarray(final.ttft)[:, :st.shapes.num_requests]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--lanes", default="1,64,256", help="population sizes, comma-separated")
    ap.add_argument("--styles", default="lockstep,solo")
    ap.add_argument("--calls", type=int, default=2, help="timed calls (the best is reported)")
    args = ap.parse_args()
    for lanes in (int(x) for x in args.lanes.split(",")):
        ttfts = {}
        for style in args.styles.split(","):
            row, ttfts[style] = run(args.requests, lanes, style, args.calls)
            print(json.dumps(row), flush=True)
        first = next(iter(ttfts.values()))
        assert all(np.array_equal(first, t) for t in ttfts.values()), "styles disagree"


if __name__ == "__main__":
    main()
