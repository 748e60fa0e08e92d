"""`sweep` and `search` (the ``search`` package), `plot` (a trace's plots) and `explain` (a
searched candidate re-run traced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from blisjax.cli.common import log_line
from blisjax.cli.compile_cache import announce_compile_cache
from blisjax.cli.files import (
    check_input_file,
    check_output_dir,
    check_output_path,
    check_text_file,
    reading,
)
from blisjax.config import ConfigError


def cmd_sweep(args: Any) -> int:
    """Evaluate a grid of policy knobs (``search.cli.cmd_sweep``)."""
    from search.cli import cmd_sweep as sweep

    check_text_file("CONFIG", args.config)
    check_output_dir("--out", args.out)
    announce_compile_cache(args)
    return sweep(args)


def cmd_search(args: Any) -> int:
    """Population-based policy search (``search.cli.cmd_search``)."""
    from search.cli import cmd_search as search

    check_text_file("CONFIG", args.config)
    check_text_file("--space", args.space)
    check_output_dir("--out", args.out)
    announce_compile_cache(args)
    return search(args)


def cmd_plot(args: Any) -> int:
    """Per-instance series of a trace (and its timeline) as PNG."""
    from blisjax.trace import read_jsonl
    from blisjax.trace.outputs import TRACE_FILE
    from blisjax.trace.plots import plot_instances, plot_timeline

    path = Path(args.trace)
    if path.is_dir():
        path = path / TRACE_FILE
    check_input_file("TRACE", str(path))
    out = args.out or str(path.parent / "instances.png")
    check_output_path("--out", out)
    if args.timeline_png:
        check_output_path("--timeline-png", args.timeline_png)
    elif args.start_s is not None or args.end_s is not None:
        raise ConfigError("--start-s", "only used with --timeline-png")
    for flag, value in (("--start-s", args.start_s), ("--end-s", args.end_s)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise ConfigError(flag, f"must be a finite number of seconds >= 0, got {value}")
    if args.start_s is not None and args.end_s is not None and args.end_s <= args.start_s:
        raise ConfigError("--end-s", f"must be after --start-s ({args.start_s}), got "
                                     f"{args.end_s}")
    with reading("TRACE", str(path)):
        lines = read_jsonl(path)
    plot_instances(lines, out)
    written = [out]
    if args.timeline_png:
        def us(s):
            return None if s is None else round(s * 1e6)

        plot_timeline(lines, args.timeline_png, us(args.start_s), us(args.end_s))
        written.append(args.timeline_png)
    log_line(args, f"wrote {', '.join(written)}")
    return 0


def cmd_explain(args: Any) -> int:
    """Re-run a searched candidate traced (``search.explain``); the text summary on stdout."""
    from search.trace_candidate import explain

    if args.counterfactual_k < 0:
        raise ConfigError("--counterfactual-k", f"must be >= 0, got {args.counterfactual_k}")
    if args.config:
        check_text_file("--config", args.config)
    if args.out:
        check_output_dir("--out", args.out)
    if not Path(args.results).is_dir():
        raise ConfigError("RESULTS_DIR", f"{args.results!r} is not a directory")
    done = explain(args.results, args.candidate, args.seed, args.config, args.out,
                   args.trace_level, args.counterfactual_k, args.summary_strategy)
    log_line(args, f"candidate {done.candidate} ({', '.join(f'{k}={v!r}' for k, v in done.knobs.items())}), "
               f"workload seed {done.seed}: wrote "
               + ", ".join(str(p) for p in done.files.values()))
    print(done.text, end="")
    return 0
