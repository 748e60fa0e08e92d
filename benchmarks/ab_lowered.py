"""Whether the working tree's engine program is the base revision's: both lowered (no compile,
no run) for the same scenario and population, their StableHLO compared with source locations
removed. Identical programs run alike, so a change that leaves a scenario's program identical
needs no timing (``ab_engine.py``) to show that scenario did not get slower.

    python benchmarks/ab_lowered.py --base HEAD                 # scenario S
    python benchmarks/ab_lowered.py --base HEAD --anchor 1000   # BLIS's anchor workload

Prints one JSON line: each side's text size and SHA-256, and ``identical``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lowered_digest(run_module, st, consts, params, lane_block: int) -> tuple[int, str]:
    """(characters, SHA-256) of the program ``run_module`` lowers, locations removed."""
    st = run_module.for_lanes(st, params)
    params = run_module._fit_instances(st, params)
    try:
        placed = run_module._placement(st, params, None, lane_block)
    except TypeError:  # a revision whose placement does not take the program
        placed = run_module._placement(params, None, lane_block)
    text = run_module._run_sharded.lower(st, consts, placed.params, placed.devices,
                                         lane_block).as_text()
    text = re.sub(r"loc\([^\n]*", "", text)
    return len(text), hashlib.sha256(text.encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare the working tree with")
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--anchor", type=int, default=0, metavar="N",
                    help="BLIS's anchor workload with N requests on 4 instances instead of "
                         "scenario S")
    args = ap.parse_args()
    if args.lanes < 1 or args.anchor < 0:
        ap.error("--lanes must be >= 1 and --anchor >= 0")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from base_revision import BASE_NAME, export_base, own_config
    from bench_jax import anchor, population_configs, scenario

    from blisjax.engine.consts import build_consts
    from blisjax.engine.static import build_static

    resolved, wl = anchor(args.anchor, 4) if args.anchor else scenario(2_000, 4, 106.0)
    st = build_static(resolved, wl)
    consts = build_consts(resolved, wl, st)
    configs = population_configs(resolved.config, args.lanes)
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        export_base(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        for name in (BASE_NAME, "blisjax"):
            run = importlib.import_module(f"{name}.engine.run")
            module = importlib.import_module(f"{name}.engine.params")  # each side's own knobs
            params = module.stack_params([module.params_from_config(own_config(c, name,
                                                                             Path(tmp)),
                                                                  wl.tenant_names)
                                          for c in configs])
            sides[name] = lowered_digest(run, st, consts, params, args.lanes)
    (base_chars, base_sha), (new_chars, new_sha) = sides[BASE_NAME], sides["blisjax"]
    print(json.dumps({"base": args.base, "anchor_requests": args.anchor or None,
                      "lanes": args.lanes, "base_chars": base_chars, "new_chars": new_chars,
                      "base_sha256": base_sha, "new_sha256": new_sha,
                      "identical": base_sha == new_sha}))


if __name__ == "__main__":
    main()
