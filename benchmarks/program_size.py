"""Where the JAX engine's program size comes from: StableHLO operations by engine function.

XLA:CPU's compile time follows the size of the lowered program (docs/performance.md, Test
tiers), so code that is traced several times — once per width program (``lockstep.by_width``),
once per call site — or that unrolls a Python loop shows up here long before it shows up in a
profile. This script lowers one case (no compile, no run) and counts the program's operations,
each attributed to every engine function on its source stack (inclusive counts: a function's
count includes what it calls).

    python benchmarks/program_size.py                           # scenario S, P = 64
    python benchmarks/program_size.py --anchor 1000 --roofline  # BLIS's anchor, roofline
    python benchmarks/program_size.py --anchor 1000 --top 60
    python benchmarks/program_size.py --cpu-tier 300 --lanes 16  # configs/search/cpu-tier.yaml

Prints the total, then the functions with the most operations.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ALIAS = re.compile(r"^(#loc\d+) = loc\((.*)\)$", re.M)
_FILE_LINE = re.compile(r'"([^"]+\.py)":(\d+)')
PACKAGE = ROOT / "blisjax"
_OP_LOC = re.compile(r" loc\((#loc\d+)\)\s*$")


@functools.lru_cache(None)
def _functions(path: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, name) of every function and lambda in a source file."""
    tree = ast.parse(Path(path).read_text())
    return tuple((node.lineno, node.end_lineno or node.lineno, getattr(node, "name", "<lambda>"))
                 for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.Lambda))


def _function_at(path: str, line: int) -> str:
    """The innermost function of ``path`` containing ``line``."""
    spans = [(a, name) for a, b, name in _functions(path) if a <= line <= b]
    return max(spans)[1] if spans else "<module>"


def count_by_function(text: str, package: Path = PACKAGE) -> tuple[int, collections.Counter]:
    """(operations, inclusive count per ``module.py:function`` of the source files under
    ``package``) of a lowered program's text printed with its debug locations."""
    alias = dict(_ALIAS.findall(text))
    prefix = f"{Path(package).resolve()}/"

    @functools.lru_cache(None)
    def frames(key: str, depth: int = 0) -> tuple[tuple[str, str], ...]:
        loc = alias.get(key, key)
        found = tuple((path, n) for path, n in _FILE_LINE.findall(loc)
                      if path.startswith(prefix))
        if depth < 64:
            for ref in re.findall(r"#loc\d+", loc):
                found += frames(ref, depth + 1)
        return found

    counts: collections.Counter = collections.Counter()
    total = 0
    for line in text.splitlines():
        m = _OP_LOC.search(line)
        if not m or not line.lstrip().startswith(("%", '"', "stablehlo")):
            continue
        total += 1
        names = {f"{path[len(prefix):]}:{_function_at(path, int(n))}"
                 for path, n in frames(m.group(1))}
        counts.update(names)
    return total, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--anchor", type=int, default=0, metavar="N",
                    help="BLIS's anchor workload with N requests on 4 instances instead of "
                         "scenario S")
    ap.add_argument("--cpu-tier", type=int, default=0, metavar="N",
                    help="configs/search/cpu-tier.yaml with N requests, lanes of distinct "
                         "CPU-tier sizes (bench_jax.py --cpu-tier's population)")
    ap.add_argument("--roofline", action="store_true",
                    help="the roofline latency model instead of the configuration's")
    ap.add_argument("--top", type=int, default=40, help="functions to list")
    args = ap.parse_args()
    if args.lanes < 1 or args.anchor < 0 or args.cpu_tier < 0 or args.top < 0:
        ap.error("--lanes must be >= 1, --anchor, --cpu-tier and --top >= 0")
    if args.anchor and args.cpu_tier:
        ap.error("--anchor and --cpu-tier are two cases: give one")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from bench_jax import TIER_MAX_BLOCKS, anchor, cpu_tier, population, scenario, tier_population

    from blisjax.config import LatencyConfig, resolve_config
    from blisjax.engine import run
    from blisjax.engine.consts import build_consts
    from blisjax.engine.static import build_static

    draw, capacities = population, {}
    if args.anchor:
        resolved, wl = anchor(args.anchor, 4)
    elif args.cpu_tier:
        resolved, wl = cpu_tier(args.cpu_tier)
        draw, capacities = tier_population, {"cpu_tier_blocks": TIER_MAX_BLOCKS}
    else:
        resolved, wl = scenario(2_000, 4, 106.0)
    if args.roofline:
        resolved = resolve_config(dataclasses.replace(
            resolved.config, latency=LatencyConfig(model="roofline")))
    st = build_static(resolved, wl, **capacities)
    consts = build_consts(resolved, wl, st)
    params = draw(resolved.config, wl.tenant_names, args.lanes)
    st = run.for_lanes(st, params)
    placed = run._placement(st, run._fit_instances(st, params), None, None)
    lowered = run._run_sharded.lower(st, consts, placed.params, placed.devices, placed.lane_block)
    total, counts = count_by_function(lowered.as_text(debug_info=True))
    print(f"{total} operations")
    for name, n in counts.most_common(args.top):
        print(f"{n:8d} {100 * n / max(total, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main()
