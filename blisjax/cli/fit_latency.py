"""`fit-latency`: fit latency coefficients from step/journey tables, or export such tables from
a simulation."""

from __future__ import annotations

import json
import time
from typing import Any

from blisjax.atomicio import write_text_atomic
from blisjax.cli.common import default_config_path, flag_name, log_line
from blisjax.cli.config_args import generated_workload
from blisjax.cli.files import check_input_file, check_outputs, reading
from blisjax.cli.parser import EXPORT_ONLY, FIT_ONLY
from blisjax.config import ConfigError, load_config, resolve_config
from blisjax.metrics import write_json_atomic
from blisjax.progress import Progress


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


def _fit_export(args: Any) -> int:
    import datetime

    from blisjax.latency.fit_export import export_latency_tables

    for dest in FIT_ONLY:
        if getattr(args, dest) is not None:
            raise ConfigError(flag_name(dest), "cannot be combined with --export-from-config "
                                           "(it is only used when fitting)")
    for dest in ("out_steps", "out_journeys"):
        if not getattr(args, dest):
            raise ConfigError(flag_name(dest), "is required with --export-from-config")
    check_outputs(args, ("out_steps", "out_journeys"))
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
    with reading("--export-from-config", args.export_from_config):
        cfg = load_config(args.export_from_config)
    args.config = args.export_from_config
    workload = generated_workload(args, cfg).workload
    with Progress(enabled=not args.quiet) as progress:
        progress.phase(f"simulating {workload.num_requests} requests and writing the tables")
        n_steps, n_journeys, _ = export_latency_tables(
            resolve_config(cfg), workload, args.out_steps, args.out_journeys, start_ns=start_ns)
    log_line(args, f"wrote {n_steps} steps to {args.out_steps} and {n_journeys} journeys to "
               f"{args.out_journeys}")
    return 0


def cmd_fit_latency(args: Any) -> int:
    """Fit latency coefficients (JSON report on stdout), or export tables from a simulation."""
    if args.export_from_config:
        return _fit_export(args)
    from blisjax.latency.fit import (
        FitOptions,
        coefficients_yaml,
        fit_latency,
        physics_config_from_sim,
    )
    from blisjax.latency.fit_tables import read_journey_table, read_step_table

    for dest in EXPORT_ONLY:
        if getattr(args, dest):
            raise ConfigError(flag_name(dest), "is only used with --export-from-config")
    for dest in ("steps", "journeys"):
        if not getattr(args, dest):
            raise ConfigError(flag_name(dest), "is required (or use --export-from-config)")
        check_input_file(flag_name(dest), getattr(args, dest))
    check_outputs(args, ("out", "report"))
    kw: dict[str, Any] = {}
    lambdas = _number_list("--lambdas", args.lambdas)
    gammas = _number_list("--gammas", args.gammas)
    if lambdas is not None:
        kw["lambdas"] = lambdas
    if gammas is not None:
        kw["gammas"] = gammas
    for dest in ("folds", "holdout", "warmup_steps", "outlier_factor", "alpha_target"):
        if getattr(args, dest) is not None:
            kw[dest] = getattr(args, dest)
    options = FitOptions(**kw)
    config_path = args.config or str(default_config_path())
    with reading("--config", config_path):
        sim = load_config(config_path)
    pc, model, hardware, tp = physics_config_from_sim(sim)
    start = time.perf_counter()
    with Progress(enabled=not args.quiet) as progress:
        progress.phase("reading the tables")
        with reading("--steps", args.steps):
            steps = read_step_table(args.steps)
        with reading("--journeys", args.journeys):
            journeys = read_journey_table(args.journeys)
        sources = {"steps": args.steps, "journeys": args.journeys, "config": config_path}
        progress.phase(f"fitting {len(steps)} steps and {len(journeys)} journeys")
        result = fit_latency(steps, journeys, pc, model=model, hardware=hardware, tp=tp,
                             options=options, sources=sources)
        report = {**result.report, "output": args.out}
        if args.out:
            progress.phase(f"writing {args.out}")
            write_text_atomic(args.out, coefficients_yaml(result))
        if args.report:
            write_json_atomic(args.report, report)
    log_line(args, f"fit {len(steps)} steps, {len(journeys)} journeys in "
               f"{time.perf_counter() - start:.2f} s; v1 acceptance: "
               f"{'pass' if report['acceptance']['pass'] else 'FAIL'}")
    print(json.dumps(report, indent=2))
    return 0
