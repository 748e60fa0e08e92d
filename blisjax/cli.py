"""`blisjax` command line: run | replay | trace | parity | fit-latency | sweep | search.

Thin by design: parse arguments, build a validated configuration and workload, call an engine,
print aggregate metrics JSON on stdout (logs go to stderr). Flags use BLIS's names and units so a
BLIS command line works with ``blis`` replaced by ``blisjax``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from blisjax import __version__
from blisjax.config import (
    ConfigError,
    SimConfig,
    add_blis_flags,
    apply_blis_flags,
    load_config,
    resolve_config,
)
from blisjax.devices import use_cpu_cores
from blisjax.metrics import aggregate_metrics, kv_cache_summary, per_request_rows, write_json_atomic
from blisjax.workload import (
    distribution_spec,
    generate_workload,
    parse_workload_spec,
    read_trace,
    write_trace,
)

ENGINES = ("reference", "jax")


def default_config_path() -> Path:
    """The shipped default experiment (package data, so it works from any install)."""
    return Path(str(resources.files("blisjax") / "data" / "default.yaml"))


class Capacity(NamedTuple):
    """A fixed capacity of the JAX engine that the command line can set."""

    flag: str  # the command-line flag
    field: str  # the ``EngineStatic`` field and ``build_static`` argument
    holds: str  # what it holds, for help and error messages
    default: str  # how the default is chosen


#: Capacities by their name in ``RunResult.overflow``.
CAPACITIES = {
    "queue": Capacity("--queue-slots", "queue_slots", "wait-queue slots per instance",
                      "the request count, which cannot overflow"),
    "pending": Capacity("--pending-slots", "pending_slots",
                        "requests between routing and enqueue (the alpha delay) per instance",
                        "the most whose alpha delays overlap, which cannot overflow"),
    "deadline": Capacity("--deadline-window", "deadline_window",
                         "requests sharing one deadline microsecond", "8"),
    "blocks": Capacity("--max-blocks-per-request", "max_blocks_per_request",
                       "KV blocks one request can hold",
                       "the longest request's, which cannot overflow"),
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _log(msg: str) -> None:
    print(f"blisjax: {msg}", file=sys.stderr)


# ---- argument parsing ---------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="blisjax YAML experiment (default for `run`: the shipped default.yaml)")
    p.add_argument("--engine", choices=ENGINES, default="reference",
                   help="simulation engine: reference (default) or jax (bit-identical, compiled)")
    p.add_argument("--results-path", metavar="FILE",
                   help="write per-request results (JSON array sorted by request_id)")
    p.add_argument("--metrics-path", metavar="FILE",
                   help="also write the aggregate metrics JSON to FILE")
    add_blis_flags(p)
    _add_capacity_flags(p)


def _add_capacity_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "JAX engine capacities (a run that exceeds one fails, naming its flag)")
    for cap in CAPACITIES.values():
        g.add_argument(cap.flag, type=_positive_int, metavar="N", dest=cap.field,
                       help=f"{cap.holds} (default: {cap.default})")


def _add_distribution_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("BLIS --workload distribution")
    g.add_argument("--workload", choices=("distribution",),
                   help="synthesize a single-client workload from the flags below")
    g.add_argument("--rate", type=float, help="requests per second (constant arrivals)")
    g.add_argument("--num-requests", type=int, help="number of requests")
    for name, default in (("prompt-tokens", 512), ("output-tokens", 512)):
        g.add_argument(f"--{name}", type=float, help=f"mean (default {default})")
        g.add_argument(f"--{name}-stdev", type=float, help="standard deviation (default 256)")
        g.add_argument(f"--{name}-min", type=int, help="minimum (default 2)")
        g.add_argument(f"--{name}-max", type=int, help="maximum (default 7000)")
    g.add_argument("--prefix-tokens", type=int, help="shared prefix length (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blisjax",
        description="Simulate LLM-inference serving clusters (BLIS-compatible).")
    parser.add_argument("--version", action="version", version=f"blisjax {__version__}")
    parser.add_argument("--cpu-devices", type=_positive_int, metavar="N",
                        help="split the CPU into N XLA devices for the JAX engine, which runs "
                             "one event loop per device (default: one per usable core; 1 keeps "
                             "XLA's single device; an XLA_FLAGS device count takes precedence)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="simulate a generated workload (default: shipped experiment)")
    _add_common(run)
    run.add_argument("--workload-spec", metavar="FILE", help="BLIS workload-spec v2 YAML")
    _add_distribution_flags(run)

    replay = sub.add_parser("replay", help="replay a BLIS TraceV2 trace exactly")
    _add_common(replay)
    replay.add_argument("--trace-header", required=True, metavar="FILE")
    replay.add_argument("--trace-data", required=True, metavar="FILE")

    parity = sub.add_parser("parity", help="run both engines and report the first divergence")
    _add_common(parity)
    parity.add_argument("--workload-spec", metavar="FILE", help="BLIS workload-spec v2 YAML")
    parity.add_argument("--trace-header", metavar="FILE")
    parity.add_argument("--trace-data", metavar="FILE")
    _add_distribution_flags(parity)

    trace = sub.add_parser("trace", help="generate a workload and write it as a TraceV2 trace")
    trace.add_argument("--config", metavar="FILE")
    trace.add_argument("--workload-spec", metavar="FILE")
    trace.add_argument("--seed", type=int)
    _add_distribution_flags(trace)
    trace.add_argument("--out-header", required=True, metavar="FILE")
    trace.add_argument("--out-data", required=True, metavar="FILE")

    fit = sub.add_parser(
        "fit-latency",
        help="fit physics (and blackbox) latency coefficients from step/journey tables, or "
             "export such tables from a simulation (--export-from-config)")
    fit.add_argument("--steps", metavar="FILE", help="step table (CSV or JSON lines)")
    fit.add_argument("--journeys", metavar="FILE", help="request-journey table (CSV or JSONL)")
    fit.add_argument("--config", metavar="FILE",
                     help="experiment YAML describing the traced deployment (model, hardware, "
                          "TP, engine knobs; default: the shipped default.yaml)")
    fit.add_argument("--out", metavar="FILE", help="write the coefficient YAML (atomically)")
    fit.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    fit.add_argument("--lambdas", nargs="+", metavar="X",
                     help="ridge λ grid (default 0.001 0.01 0.1 1 10 100)")
    fit.add_argument("--gammas", nargs="+", metavar="G",
                     help="preemption-EMA γ grid (default 0.1 0.3 0.5)")
    fit.add_argument("--folds", type=int, default=5, help="CV folds (default 5)")
    fit.add_argument("--holdout", type=float, default=0.2,
                     help="share of each instance's samples held out, in time (default 0.2)")
    fit.add_argument("--warmup-steps", type=int, default=10,
                     help="steps per instance excluded from the beta fit (default 10)")
    fit.add_argument("--outlier-factor", type=float, default=5.0,
                     help="drop samples with target > factor x median (default 5; 0 = off)")
    fit.add_argument("--alpha-target", choices=("queued", "scheduled"), default="queued",
                     help="alpha target: queued = ts.QUEUED - ts.ARRIVED (blisjax's α delay, "
                          "default); scheduled = ts.SCHEDULED - ts.QUEUED (vLLM's queue wait)")
    fit.add_argument("--export-from-config", metavar="CONFIG",
                     help="instead of fitting: simulate CONFIG (reference engine) and write "
                          "its tables to --out-steps and --out-journeys")
    fit.add_argument("--out-steps", metavar="FILE", help="export: step table path (.csv/.jsonl)")
    fit.add_argument("--out-journeys", metavar="FILE", help="export: journey table path")
    fit.add_argument("--trace-start", metavar="ISO",
                     help="export: wall-clock time of simulated t=0 (e.g. 2026-01-15T00:00:00Z); "
                          "default: none (timestamps count from 0 ns)")
    _add_search_parsers(sub)
    return parser


def _add_search_parsers(sub) -> None:
    """`sweep` and `search` (the policy-search package ``search/``)."""
    from search.cli import add_search_parser, add_sweep_parser

    add_sweep_parser(sub)
    add_search_parser(sub)


# ---- configuration and workload ---------------------------------------------------------------


def _config_from_args(args, default_to_shipped: bool) -> SimConfig:
    if args.config:
        cfg = load_config(args.config)
    elif default_to_shipped:
        cfg = load_config(default_config_path())
    else:
        cfg = SimConfig()
    return apply_blis_flags(cfg, args) if hasattr(args, "routing_policy") else cfg


def _distribution_requested(args) -> bool:
    return getattr(args, "workload", None) == "distribution"


def _distribution_from_args(args):
    if args.rate is None or args.num_requests is None:
        raise ConfigError("--workload distribution: needs --rate (> 0) and --num-requests (>= 1)")
    kw = {}
    for flag, key in (("prompt_tokens", "prompt_mean"), ("prompt_tokens_stdev", "prompt_std"),
                      ("prompt_tokens_min", "prompt_min"), ("prompt_tokens_max", "prompt_max"),
                      ("output_tokens", "output_mean"), ("output_tokens_stdev", "output_std"),
                      ("output_tokens_min", "output_min"), ("output_tokens_max", "output_max"),
                      ("prefix_tokens", "prefix_tokens")):
        value = getattr(args, flag)
        if value is not None:
            kw[key] = value
    return distribution_spec(args.rate, args.num_requests, **kw)


def _generated_workload(args, cfg: SimConfig):
    """Workload precedence: --workload-spec, then --workload distribution, then the config."""
    if getattr(args, "workload_spec", None):
        spec = parse_workload_spec(args.workload_spec)
    elif _distribution_requested(args):
        spec = _distribution_from_args(args)
    elif cfg.workload is not None:
        spec = parse_workload_spec(cfg.workload)
    else:
        raise ConfigError("workload: none given (use --workload-spec FILE, --workload "
                          "distribution, or a `workload:` section in --config)")
    return generate_workload(spec, seed=cfg.seed)


# ---- commands ---------------------------------------------------------------------------------


def _engine(name: str):
    """The ``simulate(resolved, workload, **capacities)`` of an engine (imported only when
    needed; the reference engine has no capacities)."""
    if name == "jax":
        from blisjax.engine import simulate
    else:
        from blisjax.reference import simulate
    return simulate


def _capacities(args) -> dict[str, int]:
    """The JAX engine capacities given on the command line (``build_static`` arguments)."""
    return {cap.field: getattr(args, cap.field) for cap in CAPACITIES.values()
            if getattr(args, cap.field, None) is not None}


def _check_capacities_used(args) -> None:
    if args.engine != "jax":
        for cap in CAPACITIES.values():
            if getattr(args, cap.field, None) is not None:
                raise ConfigError(cap.flag, "is a JAX engine capacity: only used with "
                                  "--engine jax")


def _run_jax(resolved, workload, capacities: dict[str, int]):
    """The JAX engine's result; a run that exceeded a capacity raises ``ConfigError`` naming
    each exceeded capacity, its size and the flag that raises it (its numbers are not valid,
    so none are returned)."""
    from blisjax.engine.static import build_static

    result = _engine("jax")(resolved, workload, **capacities)
    if not result.overflow:
        return result
    static = build_static(resolved, workload, **capacities)
    parts = []
    for name, times in result.overflow.items():
        cap = CAPACITIES[name]
        size = getattr(static, cap.field)
        parts.append(f"{cap.holds}: {size} exceeded {times} time(s); raise it with {cap.flag} "
                     f"(> {size})")
    raise ConfigError("JAX engine capacity exceeded, so this run's numbers are not valid and "
                      "none are reported: " + "; ".join(parts))


def _simulate(args, cfg: SimConfig, workload) -> int:
    _check_capacities_used(args)
    resolved = resolve_config(cfg)
    start = time.perf_counter()
    if args.engine == "jax":
        result = _run_jax(resolved, workload, _capacities(args))
    else:
        result = _engine(args.engine)(resolved, workload)
    wall_s = time.perf_counter() - start
    metrics = aggregate_metrics(result, workload, cfg.metrics,
                                scheduler=cfg.policy.scheduler.policy)
    if args.results_path:
        write_json_atomic(args.results_path, per_request_rows(result, workload))
    if args.metrics_path:
        write_json_atomic(args.metrics_path, metrics)
    summary = kv_cache_summary(result)
    if summary:
        print(summary, file=sys.stderr)
    _log(f"{workload.num_requests} requests, {cfg.cluster.num_instances} instance(s), "
         f"engine {args.engine}: {wall_s:.3f} s wall")
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_run(args) -> int:
    cfg = _config_from_args(args, default_to_shipped=args.config is None
                            and not args.workload_spec and not _distribution_requested(args))
    return _simulate(args, cfg, _generated_workload(args, cfg))


def cmd_replay(args) -> int:
    cfg = _config_from_args(args, default_to_shipped=False)
    return _simulate(args, cfg, read_trace(args.trace_header, args.trace_data))


def cmd_parity(args) -> int:
    """Reference vs JAX engine on one configuration: "identical" or the first divergence."""
    if args.trace_header or args.trace_data:
        if not (args.trace_header and args.trace_data):
            raise ConfigError("parity: give both --trace-header and --trace-data")
        cfg = _config_from_args(args, default_to_shipped=False)
        workload = read_trace(args.trace_header, args.trace_data)
    else:
        cfg = _config_from_args(args, default_to_shipped=args.config is None
                                and not args.workload_spec and not _distribution_requested(args))
        workload = _generated_workload(args, cfg)
    from blisjax.engine.parity import first_divergence

    resolved = resolve_config(cfg)
    ref = _engine("reference")(resolved, workload)
    jx = _run_jax(resolved, workload, _capacities(args))
    diff = first_divergence(ref, jx, workload.request_id)
    print(json.dumps({"requests": workload.num_requests,
                      "result": "identical" if diff is None else "divergent",
                      "first_divergence": diff}, indent=2))
    return 0 if diff is None else 1


def cmd_trace(args) -> int:
    cfg = load_config(args.config) if args.config else SimConfig()
    if args.seed is not None:
        cfg = SimConfig(**{**cfg.__dict__, "seed": args.seed})
    workload = _generated_workload(args, cfg)
    write_trace(workload, args.out_header, args.out_data)
    _log(f"wrote {workload.num_requests} requests to {args.out_header} + {args.out_data}")
    return 0


def _number_list(flag: str, values: list[str] | None) -> tuple[float, ...] | None:
    if values is None:
        return None
    out = []
    for token in values:
        for part in token.split(","):
            if not part.strip():
                continue
            try:
                out.append(float(part))
            except ValueError:
                raise ConfigError(flag, f"must be numbers, got {part!r}") from None
    if not out:
        raise ConfigError(flag, "needs at least one value")
    return tuple(out)


def _fit_export(args) -> int:
    import datetime

    from blisjax.latency.fit_export import export_latency_tables

    for flag, value in (("--out-steps", args.out_steps), ("--out-journeys", args.out_journeys)):
        if not value:
            raise ConfigError(flag, "is required with --export-from-config")
    for flag in ("steps", "journeys", "out", "report"):
        if getattr(args, flag):
            raise ConfigError(f"--{flag}", "cannot be combined with --export-from-config")
    start_ns = 0
    if args.trace_start:
        try:
            t = datetime.datetime.fromisoformat(args.trace_start.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("--trace-start", f"must be an ISO date/time, got "
                              f"{args.trace_start!r}") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=datetime.timezone.utc)
        start_ns = int(round(t.timestamp())) * 10**9
    cfg = load_config(args.export_from_config)
    workload = _generated_workload(args, cfg)
    n_steps, n_journeys, _ = export_latency_tables(
        resolve_config(cfg), workload, args.out_steps, args.out_journeys, start_ns=start_ns)
    _log(f"wrote {n_steps} steps to {args.out_steps} and {n_journeys} journeys to "
         f"{args.out_journeys}")
    return 0


def cmd_fit_latency(args) -> int:
    """Fit latency coefficients (JSON report on stdout), or export tables from a simulation."""
    if args.export_from_config:
        return _fit_export(args)
    from blisjax.latency.fit import (
        FitOptions,
        coefficients_yaml,
        fit_latency,
        physics_config_from_sim,
        read_journey_table,
        read_step_table,
        write_text_atomic,
    )

    for flag, value in (("--steps", args.steps), ("--journeys", args.journeys)):
        if not value:
            raise ConfigError(flag, "is required (or use --export-from-config)")
    for flag in ("out_steps", "out_journeys", "trace_start"):
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')}", "is only used with "
                              "--export-from-config")
    kw = {}
    lambdas = _number_list("--lambdas", args.lambdas)
    gammas = _number_list("--gammas", args.gammas)
    if lambdas is not None:
        kw["lambdas"] = lambdas
    if gammas is not None:
        kw["gammas"] = gammas
    options = FitOptions(folds=args.folds, holdout=args.holdout, warmup_steps=args.warmup_steps,
                         outlier_factor=args.outlier_factor, alpha_target=args.alpha_target, **kw)
    config_path = args.config or str(default_config_path())
    pc, model, hardware, tp = physics_config_from_sim(load_config(config_path))
    start = time.perf_counter()
    steps = read_step_table(args.steps)
    journeys = read_journey_table(args.journeys)
    sources = {"steps": args.steps, "journeys": args.journeys, "config": config_path}
    result = fit_latency(steps, journeys, pc, model=model, hardware=hardware, tp=tp,
                         options=options, sources=sources)
    report = {**result.report, "output": args.out}
    if args.out:
        write_text_atomic(args.out, coefficients_yaml(result))
    if args.report:
        write_json_atomic(args.report, report)
    _log(f"fit {len(steps)} steps, {len(journeys)} journeys in "
         f"{time.perf_counter() - start:.2f} s; v1 acceptance: "
         f"{'pass' if report['acceptance']['pass'] else 'FAIL'}")
    print(json.dumps(report, indent=2))
    return 0


def cmd_sweep(args) -> int:
    """Evaluate a grid of policy knobs (``search.cli.cmd_sweep``)."""
    from search.cli import cmd_sweep as sweep

    return sweep(args)


def cmd_search(args) -> int:
    """Population-based policy search (``search.cli.cmd_search``)."""
    from search.cli import cmd_search as search

    return search(args)


COMMANDS = {"run": cmd_run, "replay": cmd_replay, "trace": cmd_trace, "parity": cmd_parity,
            "fit-latency": cmd_fit_latency, "sweep": cmd_sweep, "search": cmd_search}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    use_cpu_cores(args.cpu_devices)  # before any command imports JAX
    try:
        return COMMANDS[args.command](args)
    except (ConfigError, ValueError, FileNotFoundError, OSError) as exc:
        print(f"blisjax: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
