"""One simulation of a configuration and workload in either engine, with its outputs (shared by
`run` and `replay`; `parity` uses the engine helpers)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from blisjax.atomicio import write_text_atomic
from blisjax.cli.common import log_line, warn
from blisjax.cli.compile_cache import announce_compile_cache
from blisjax.cli.config_args import WorkloadChoice, capacities_from_args, check_latency_model
from blisjax.cli.flags import CAPACITIES, NOT_CAPACITIES, NOT_CAPACITY_FIELDS
from blisjax.config import ConfigError, SimConfig, resolve_config
from blisjax.metrics import (
    config_metrics,
    kv_cache_summary,
    per_request_rows,
    timeline_csv,
    write_json_atomic,
)
from blisjax.metrics.sessions import session_metrics_text
from blisjax.progress import Progress
from blisjax.trace.reflect import STRATEGIES as SUMMARY_STRATEGIES


def engine_named(name: str):
    """The ``simulate(resolved, workload, **capacities)`` of an engine (imported only when
    needed; the reference engine has no capacities)."""
    if name == "jax":
        from blisjax.engine import simulate
    else:
        from blisjax.reference import simulate
    return simulate


def check_capacity_for_workload(resolved: Any, workload: Any) -> None:
    """Warn when requests cannot be served at all by the configured KV cache / length cap."""
    from blisjax.metrics.records import unservable

    if workload.num_requests == 0:
        return
    block = resolved.engine.block_size_tokens
    never = unservable(np.asarray(workload.input_tokens), np.asarray(workload.output_tokens),
                       resolved.max_model_len, resolved.total_kv_blocks, block)
    count = int(np.sum(never))
    if count:
        cap = (f"max_model_len {resolved.max_model_len}, " if resolved.max_model_len else "")
        warn(f"{count} of {workload.num_requests} requests can never be served ({cap}KV cache "
              f"{resolved.total_kv_blocks} blocks x {block} tokens per instance): they are "
              "dropped as unservable")


def _warn_degenerate(metrics: dict, num_requests: int) -> None:
    if num_requests and not metrics.get("completed_requests"):
        parts = [f"{metrics.get(key, 0)} {what}" for key, what in (
            ("rejected_requests", "rejected"), ("dropped_unservable", "dropped as unservable"),
            ("timed_out_requests", "timed out"), ("still_queued", "still queued"),
            ("still_running", "still running")) if metrics.get(key)]
        warn(f"no request completed: of {num_requests} requests, "
              f"{', '.join(parts) or 'none finished'}")


def run_jax(resolved: Any, workload: Any, capacities: dict[str, int],
             progress: Progress | None = None):
    """The JAX engine's result; a run that exceeded a capacity raises ``ConfigError`` naming
    each exceeded capacity, its size and the flag that raises it (its numbers are not valid,
    so none are returned)."""
    from blisjax.engine.static import build_static

    hooks = {}
    if progress is not None and progress.enabled:
        progress.phase("preparing the JAX engine")
        hooks["phase"] = progress.phase  # told when compiling and running start
    result = engine_named("jax")(resolved, workload, **hooks, **capacities)
    if not result.overflow:
        return result
    static = build_static(resolved, workload, **capacities)
    parts = []
    for name, times in result.overflow.items():
        if name in NOT_CAPACITIES:  # not a capacity: a case the program does not model
            parts.append(NOT_CAPACITIES[name].format(times=times))
            continue
        cap = CAPACITIES[name]
        size = static.field(cap.field) or _derived_capacity(
            name, static, workload, int(resolved.config.horizon_us))
        parts.append(f"{cap.holds}: {size} exceeded {times} time(s); raise it with {cap.flag} "
                     f"(> {size})")
    raise ConfigError("JAX engine capacity exceeded, so this run's numbers are not valid and "
                      "none are reported: " + "; ".join(parts))


def _derived_capacity(name: str, static, workload, horizon_us: int) -> int:
    """A capacity the run derives from its workload rather than the program (``max_events``)."""
    if name != "events":
        return 0
    from blisjax.engine.consts import events_bound
    from blisjax.engine.request_rows import engine_workload

    return events_bound(engine_workload(workload, static.conversation_max_model_len,
                                         pd=static.features.pd), horizon_us)


def simulate_and_report(args: Any, cfg: SimConfig, choice: WorkloadChoice, base: str) -> int:
    workload = choice.workload
    check_latency_model(args, cfg)
    resolved = resolve_config(cfg)
    log_line(args, f"base configuration: {base}; workload: {choice.source}")
    check_capacity_for_workload(resolved, workload)
    if args.engine == "jax":
        announce_compile_cache(args)
    trace = None
    with Progress(enabled=not args.quiet) as progress:
        start = time.perf_counter()
        if args.engine == "jax":
            result = run_jax(resolved, workload, capacities_from_args(args), progress)
        else:
            progress.phase(f"simulating {workload.num_requests} requests (reference engine)")
            if args.trace_level != "none":
                from blisjax.trace import simulate_traced

                result, trace = simulate_traced(resolved, workload, args.trace_level,
                                                args.counterfactual_k)
            else:
                result = engine_named(args.engine)(resolved, workload)
            if result.overflow:  # instance slots under --blis-quirks, a user out of rows
                name = next(iter(result.overflow))
                raise ConfigError(NOT_CAPACITY_FIELDS[name], "; ".join(
                    NOT_CAPACITIES[name].format(times=times)
                    for name, times in result.overflow.items()))
        wall_s = time.perf_counter() - start
        metrics = config_metrics(result, workload, cfg)
        rows = (per_request_rows(result, workload)
                if args.results_path or (trace is not None and args.trace_out) else None)
        if trace is not None:
            metrics["trace_summary"] = trace.summary().as_json()
            if args.trace_out:
                from blisjax.trace.outputs import write_trace_outputs

                progress.phase(f"writing the trace to {args.trace_out}")
                write_trace_outputs(Path(args.trace_out), trace, metrics, cfg,
                                    args.summary_strategy or SUMMARY_STRATEGIES[0], rows)
        if args.results_path:
            progress.phase(f"writing {args.results_path}")
            write_json_atomic(args.results_path, rows)
        if args.metrics_path:
            progress.phase(f"writing {args.metrics_path}")
            write_json_atomic(args.metrics_path, metrics)
        if args.timeline_path:
            progress.phase(f"writing {args.timeline_path}")
            write_text_atomic(args.timeline_path, timeline_csv(result))
        if args.timeline_plot:
            from blisjax.metrics.plots import plot_replicas

            progress.phase(f"writing {args.timeline_plot}")
            plot_replicas([("this run", result)], workload.arrival_us, args.timeline_plot)
    summary = kv_cache_summary(result)
    if summary and not args.quiet:
        print(summary, file=sys.stderr)
    if "sessions" in metrics and not args.quiet:
        print("=== Session Metrics ===\n" + session_metrics_text(metrics["sessions"]),
              file=sys.stderr)
    if trace is not None and args.summarize_trace:
        print(trace.summary().blis_text(), end="", file=sys.stderr)
    _warn_degenerate(metrics, workload.num_requests)
    log_line(args, f"{workload.num_requests} requests, {cfg.cluster.num_instances} instance(s), "
               f"engine {args.engine}: {wall_s:.3f} s wall")
    print(json.dumps(metrics, indent=2))
    return 0
