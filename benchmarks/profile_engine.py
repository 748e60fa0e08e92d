"""Where the JAX engine's time goes: kernel time and kernel counts attributed to engine source.

Runs scenario S (``bench_jax.py``) once under JAX's profiler and attributes every executed XLA
kernel to the Python call stack that produced it. XLA keeps that stack in the compiled module
(``stack_frame_id`` in each instruction's metadata, resolved by the module's stack-frame index;
the HLO text prints only the id), so the module proto is decoded here by hand — no XLA protos
are needed. Prints two tables:

* innermost engine line: exclusive kernel time by the deepest frame in ``blisjax/engine``;
* inclusive by function: kernels and time under each engine function (a kernel counts once for
  every function on its stack), e.g. ``completion.py:complete`` = the completion loop with all
  it calls.

The kernel counts are exact. Times are not: tracing adds a fixed cost to every kernel (a
profiled call takes about twice the plain one), which overweights code made of many tiny
kernels; use the time split as a pointer and decide with ``ab_engine.py``. Needs the
``xprof`` package (``pip install xprof``) to read the trace.

    python benchmarks/profile_engine.py                      # P = 64, one device, 600 requests
    python benchmarks/profile_engine.py --cpu-devices 2 --lanes 128 --top 60
    python benchmarks/profile_engine.py --anchor --requests 1000   # 512-token outputs
    python benchmarks/profile_engine.py --cpu-tier --lanes 4 --requests 300
    python benchmarks/profile_engine.py --pd --lanes 16 --requests 500
    python benchmarks/profile_engine.py --anchor --roofline --requests 1000  # roofline stretches
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from blisjax.devices import use_cpu_cores  # imports no JAX

if "--cpu-devices" in sys.argv:  # must come before JAX starts: split the CPU into N devices
    use_cpu_cores(int(sys.argv[sys.argv.index("--cpu-devices") + 1]))

import jax  # noqa: E402

from blisjax.config import LatencyConfig, resolve_config  # noqa: E402
from blisjax.engine import run as engine_run  # noqa: E402
from blisjax.engine.consts import build_consts  # noqa: E402
from blisjax.engine.static import build_static  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_jax  # noqa: E402

# every module of the JAX engine (a frame in another file is not the engine's)
ENGINE_FILES = tuple(sorted(p.name for p in Path(engine_run.__file__).parent.glob("*.py")))
# HloModuleProto field numbers (xla/service/hlo.proto): the module's stack_frame_index, and
# inside it file_names, function_names, file_locations, stack_frames.
_MODULE_STACK_INDEX, _FILES, _FUNCS, _LOCATIONS, _FRAMES = 17, 1, 2, 3, 4


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message, in order (wire format)."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def stack_resolver(module_proto: bytes):
    """``stack(frame_id) -> [(file, function, line), ...]`` innermost first, from a serialized
    HloModuleProto's stack-frame index (ids are 1-based; 0 = no frame)."""
    index = next(v for n, v in _fields(module_proto) if n == _MODULE_STACK_INDEX)
    files, funcs, locations, frames = [], [], [], []
    for number, value in _fields(index):
        if number == _FILES:
            files.append(value.decode())
        elif number == _FUNCS:
            funcs.append(value.decode())
        elif number == _LOCATIONS:
            loc = dict(_fields(value))
            locations.append((loc.get(1, 0), loc.get(2, 0), loc.get(3, 0)))
        elif number == _FRAMES:
            frame = dict(_fields(value))
            frames.append((frame.get(1, 0), frame.get(2, 0)))

    def stack(frame_id: int) -> list[tuple[str, str, int]]:
        out = []
        while frame_id:
            location, frame_id = frames[frame_id - 1]
            file_id, func_id, line = locations[location - 1]
            out.append((os.path.basename(files[file_id - 1]), funcs[func_id - 1], line))
        return out

    return stack


def exclusive_times(events: list[dict]) -> tuple[collections.Counter, collections.Counter]:
    """(exclusive µs, count) per event name: nested events (a loop and the kernels it runs, on
    one thread) are subtracted from their parent."""
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    excl, count = collections.Counter(), collections.Counter()
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        open_events: list[tuple[float, float, str]] = []
        for e in thread:
            start, dur = e["ts"], e.get("dur", 0)
            while open_events and open_events[-1][0] + open_events[-1][1] <= start:
                open_events.pop()
            if open_events:
                excl[open_events[-1][2]] -= dur
            excl[e["name"]] += dur
            count[e["name"]] += 1
            open_events.append((start, dur, e["name"]))
    return excl, count


def _trace_events(trace_dir: str) -> list[dict]:
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        sys.exit("profile_engine.py needs the xprof package: pip install xprof")
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "trace_viewer", {})
    return [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"]


def attribute(events, hlo_text: str, stack):
    """(exclusive µs by innermost engine line, inclusive µs by engine function, kernels by
    engine function, kernels in all) over the kernels of ``hlo_text``; a loop counts only
    its own time, and not as a kernel."""
    frame_of = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*?stack_frame_id=(\d+)", hlo_text, re.M)}
    excl, count = exclusive_times(events)
    lines, funcs, kernels = collections.Counter(), collections.Counter(), collections.Counter()
    n_kernels = 0
    for name, us in excl.items():
        if name not in frame_of:
            continue
        n_kernels += 0 if name.startswith("while") else count[name]
        engine = [f for f in stack(frame_of[name]) if f[0] in ENGINE_FILES]
        lines[":".join(map(str, engine[0])) if engine else "outside the engine"] += us
        for file, func in dict.fromkeys((f[0], f[1]) for f in engine):
            funcs[f"{file}:{func}"] += us
            if not name.startswith("while"):
                kernels[f"{file}:{func}"] += count[name]
    return lines, funcs, kernels, n_kernels


def add_case_arguments(ap: argparse.ArgumentParser) -> None:
    """The workload options shared with ``hlo_copies.py``."""
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--cpu-devices", type=int, default=1)
    ap.add_argument("--kv-blocks", type=int, default=None)
    ap.add_argument("--anchor", action="store_true",
                    help="BLIS's anchor workload (bench_jax.anchor, 4 instances) instead of "
                         "scenario S")
    ap.add_argument("--no-stretches", action="store_true",
                    help="every decode step its own iteration (default: the workload decides "
                         "whether decode stretches are compiled in)")
    ap.add_argument("--cpu-tier", action="store_true",
                    help="the CPU-tier example (bench_jax.cpu_tier): lanes draw tier sizes up to "
                         "bench_jax.TIER_MAX_BLOCKS")
    ap.add_argument("--tiered-preempt", action="store_true",
                    help="BLIS's kv_tiered_preempt replay with --blis-quirks "
                         "(bench_jax.tiered_preempt; --requests is ignored)")
    ap.add_argument("--pd", action="store_true",
                    help="the P/D example (bench_jax.pd_split): lanes draw splits, thresholds "
                         "and decode-pool weights")
    ap.add_argument("--roofline", action="store_true",
                    help="the case's model and GPU under the roofline latency model (with "
                         "--anchor: roofline decode stretches)")


class Case(NamedTuple):
    """A compiled engine program and its inputs."""

    static: Any
    consts: Any
    params: Any  # padded to the lane blocks of ``devices``
    devices: tuple
    compiled: Any


def compile_case(args) -> Case:
    """The case the ``add_case_arguments`` options name, compiled."""
    tiers = {}
    draw = bench_jax.population
    if args.pd:
        resolved, workload = bench_jax.pd_split(args.requests)
        draw = bench_jax.pd_population
    elif args.tiered_preempt:
        resolved, workload = bench_jax.tiered_preempt()
        draw = bench_jax.tiered_preempt_population
    elif args.cpu_tier:
        resolved, workload = bench_jax.cpu_tier(args.requests)
        tiers = {"cpu_tier_blocks": bench_jax.TIER_MAX_BLOCKS}
        draw = bench_jax.tier_population
    elif args.anchor:
        resolved, workload = bench_jax.anchor(args.requests, 4)
    else:
        resolved, workload = bench_jax.scenario(args.requests, 4, 106.0,
                                                kv_blocks=args.kv_blocks)
    if args.roofline:
        resolved = resolve_config(dataclasses.replace(
            resolved.config, latency=LatencyConfig(model="roofline")))
    st = build_static(resolved, workload, decode_stretches=False if args.no_stretches else None,
                      **tiers)
    consts = build_consts(resolved, workload, st)
    params = draw(resolved.config, workload.tenant_names, args.lanes)
    placed = engine_run._placement(st, params, None, None)
    devices, padded = placed.devices, placed.params
    compiled = engine_run._run_sharded.lower(st, consts, padded, devices,
                                              placed.lane_block).compile()
    return Case(st, consts, padded, devices, compiled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_arguments(ap)
    ap.add_argument("--top", type=int, default=40, help="rows per table")
    args = ap.parse_args()
    _, consts, padded, devices, compiled = compile_case(args)
    module = compiled.runtime_executable().hlo_modules()[0]
    jax.block_until_ready(compiled(consts, padded))  # warm
    start = time.perf_counter()
    jax.block_until_ready(compiled(consts, padded))
    plain_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        jax.block_until_ready(compiled(consts, padded))
        jax.profiler.stop_trace()
        events = _trace_events(trace_dir)
    lines, funcs, kernels, n_kernels = attribute(events, module.to_string(),
                                      stack_resolver(module.as_serialized_hlo_module_proto()))
    total = sum(lines.values())
    print(json.dumps({"lanes": args.lanes, "requests": args.requests,
                      "devices": len(devices), "plain_run_s": round(plain_s, 3),
                      "profiled_kernel_s": round(total / 1e6, 3),
                      "kernels": n_kernels}))
    print("== exclusive time by innermost engine line")
    for key, us in lines.most_common(args.top):
        print(f"{us / 1e3:9.1f} ms {100 * us / total:5.1f} %  {key}")
    print("== inclusive by engine function (kernels, time)")
    for key, us in funcs.most_common(args.top):
        print(f"{kernels[key]:9d} {us / 1e3:9.1f} ms {100 * us / total:5.1f} %  {key}")


if __name__ == "__main__":
    main()
