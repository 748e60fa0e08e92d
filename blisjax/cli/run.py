"""The simulating commands: `run`, `replay`, `parity` and `trace`."""

from __future__ import annotations

import json
from typing import Any

from blisjax.cli.common import log_line, warn
from blisjax.cli.compile_cache import announce_compile_cache
from blisjax.cli.config_args import (
    base_config,
    capacities_from_args,
    check_capacities_used,
    check_latency_model,
    check_workload_flags,
    config_from_args,
    generated_workload,
    trace_workload,
)
from blisjax.cli.files import check_output_dir, check_outputs
from blisjax.cli.simulate import (
    check_capacity_for_workload,
    engine_named,
    run_jax,
    simulate_and_report,
)
from blisjax.config import ConfigError, SimConfig, resolve_config
from blisjax.progress import Progress
from blisjax.workload import write_trace


def _check_run_flags(args: Any) -> None:
    """Checks of `run` and `replay` that need no configuration (before any file is read)."""
    check_capacities_used(args)
    check_outputs(args, ("results_path", "metrics_path", "timeline_path", "timeline_plot"))
    _check_trace_flags(args)


def _check_trace_flags(args: Any) -> None:
    """The trace flags: what needs a trace level, and the engine that records traces."""
    if args.counterfactual_k < 0:
        raise ConfigError("--counterfactual-k", f"must be >= 0, got {args.counterfactual_k}")
    traced = args.trace_level != "none"
    for flag, value in (("--trace-out", args.trace_out),
                        ("--summary-strategy", args.summary_strategy)):
        if value is not None and not traced:
            raise ConfigError(flag, "needs --trace-level decisions or full (nothing is "
                                    "recorded without a trace level)")
    if not traced:  # BLIS accepts these without a trace and does nothing
        if args.summarize_trace:
            warn("--summarize-trace without --trace-level: no trace, no summary")
        if args.counterfactual_k:
            warn("--counterfactual-k without --trace-level: no trace, no candidates")
        return
    if args.engine == "jax":
        raise ConfigError("--trace-level", "traces are recorded by the reference engine "
                                           "(--engine reference); any JAX lane replays there bit "
                                           "for bit (`blisjax explain` re-runs a searched one)")
    if args.trace_out:
        check_output_dir("--trace-out", args.trace_out)


def cmd_run(args: Any) -> int:
    check_workload_flags(args)
    _check_run_flags(args)
    cfg, base = config_from_args(args)
    return simulate_and_report(args, cfg, generated_workload(args, cfg), base)


def cmd_replay(args: Any) -> int:
    _check_run_flags(args)
    cfg, base = config_from_args(args)
    return simulate_and_report(args, cfg, trace_workload(args, cfg.seed), base)


def cmd_parity(args: Any) -> int:
    """Reference vs JAX engine on one configuration: "identical" or the first divergence."""
    trace_given = bool(args.trace_header or args.trace_data)
    check_workload_flags(args, trace_given)
    if trace_given and not (args.trace_header and args.trace_data):
        missing = "--trace-data" if args.trace_header else "--trace-header"
        raise ConfigError(missing, "is required with "
                          f"{'--trace-header' if args.trace_header else '--trace-data'}")
    cfg, base = config_from_args(args)
    choice = trace_workload(args, cfg.seed) if trace_given else generated_workload(args, cfg)
    workload = choice.workload
    check_latency_model(args, cfg)
    from blisjax.engine.parity import first_divergence

    resolved = resolve_config(cfg)
    log_line(args, f"base configuration: {base}; workload: {choice.source}")
    check_capacity_for_workload(resolved, workload)
    announce_compile_cache(args)
    with Progress(enabled=not args.quiet) as progress:
        progress.phase(f"simulating {workload.num_requests} requests (reference engine)")
        ref = engine_named("reference")(resolved, workload)
        jx = run_jax(resolved, workload, capacities_from_args(args), progress)
        progress.phase("comparing the two engines' results")
        diff = first_divergence(ref, jx, workload.request_id)
    print(json.dumps({"requests": workload.num_requests,
                      "result": "identical" if diff is None else "divergent",
                      "first_divergence": diff}, indent=2))
    return 0 if diff is None else 1


def cmd_trace(args: Any) -> int:
    check_workload_flags(args)
    check_outputs(args, ("out_header", "out_data"))
    cfg, base = base_config(args)
    if args.seed is not None:
        cfg = SimConfig(**{**cfg.__dict__, "seed": args.seed})
    choice = generated_workload(args, cfg)
    log_line(args, f"base configuration: {base}; workload: {choice.source}")
    write_trace(choice.workload, args.out_header, args.out_data)
    log_line(args, f"wrote {choice.workload.num_requests} requests to {args.out_header} + "
               f"{args.out_data}")
    return 0
