"""``blisjax sweep`` and ``blisjax search``: argument parsers and commands.

Every argument is validated (configuration, space, grid, numbers, expressions against the
configuration's metric keys, seeds, results directory, resume settings) before the results
directory is created; an invalid argument exits with status 2 and one message naming it and the
allowed values. The summary JSON goes to stdout, progress and logs to stderr.

Grid axes (``--grid``), one per knob:

* ``knob=lo:hi:n`` — n evenly spaced values from lo to hi (integers when lo and hi are integers
  and every value is whole);
* ``knob=log:lo:hi:n`` — n log-spaced values (lo > 0);
* ``knob=a,b,c`` — a list; numbers become numbers, anything else a string (categorical).

Expressions starting with ``-`` need the ``=`` form: ``--objective=-ttft_p99_ms``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from blisjax.config import ConfigError
from search.llmd import API_VERSIONS, DEFAULT_API_VERSION
from search.objectives import CONSTRAINT_MODES, ROBUST_STATISTICS

__all__ = ["add_search_parser", "add_sweep_parser", "cmd_search", "cmd_sweep", "parse_grid_axis"]

_INT = re.compile(r"^[+-]?\d+$")
#: ``--strategy`` choices (= ``search.strategies.STRATEGIES``, kept here so that building the
#: parser does not import JAX).
STRATEGIES = ("cma", "openes", "ga", "gp", "random")
#: Most points of one grid axis.
MAX_AXIS_POINTS = 100_000


def _scalar(text: str) -> Any:
    """A list item: int, float, or the stripped string."""
    t = text.strip()
    if _INT.match(t):
        return int(t)
    try:
        value = float(t)
    except ValueError:
        return t
    if not math.isfinite(value):
        raise ConfigError("--grid", f"values must be finite, got {text!r}")
    return value


def _grid_number(spec: str, part: str, what: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise ConfigError("--grid", f"{spec!r}: {what} must be a number, got {part!r}") from None
    if not math.isfinite(value):
        raise ConfigError("--grid", f"{spec!r}: {what} must be finite, got {part!r}")
    return value


def parse_grid_axis(spec: str) -> tuple[str, tuple[Any, ...]]:
    """``knob=lo:hi:n`` | ``knob=log:lo:hi:n`` | ``knob=a,b,c`` → (knob, values).

    Raises:
      ConfigError: naming ``--grid``, the axis and what is wrong.
    """
    if "=" not in spec:
        raise ConfigError("--grid", f"{spec!r}: must be knob=lo:hi:n, knob=log:lo:hi:n or "
                          "knob=a,b,c")
    name, _, body = spec.partition("=")
    name, body = name.strip(), body.strip()
    if not name or not body:
        raise ConfigError("--grid", f"{spec!r}: needs a knob name and values")
    log = body.startswith("log:")
    if log or ":" in body:
        parts = body[4:].split(":") if log else body.split(":")
        if len(parts) != 3:
            raise ConfigError("--grid", f"{spec!r}: a range is lo:hi:n or log:lo:hi:n")
        lo = _grid_number(spec, parts[0], "lo")
        hi = _grid_number(spec, parts[1], "hi")
        if not _INT.match(parts[2].strip()) or not 1 <= int(parts[2]) <= MAX_AXIS_POINTS:
            raise ConfigError("--grid", f"{spec!r}: n must be an integer in [1, "
                              f"{MAX_AXIS_POINTS}], got {parts[2]!r}")
        n = int(parts[2])
        if not hi > lo and n > 1:
            raise ConfigError("--grid", f"{spec!r}: hi must be > lo")
        if log and lo <= 0:
            raise ConfigError("--grid", f"{spec!r}: log spacing needs lo > 0, got {lo:g}")
        if n == 1:
            values: list[Any] = [lo]
        elif log:
            values = [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1))
                      for i in range(n)]
            values[0], values[-1] = lo, hi
        else:
            values = [lo + i * (hi - lo) / (n - 1) for i in range(n)]
            values[-1] = hi
        ints = _INT.match(parts[0].strip()) and _INT.match(parts[1].strip())
        if ints and all(float(v).is_integer() for v in values):
            values = [int(v) for v in values]
    else:
        values = [_scalar(p) for p in body.split(",")]
        if any(v == "" for v in values):
            raise ConfigError("--grid", f"{spec!r}: empty list item")
    if len({(type(v), v) for v in values}) != len(values):
        raise ConfigError("--grid", f"{spec!r}: gives repeated values {values}")
    return name, tuple(values)


def _add_scoring(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG", help="blisjax experiment YAML (with a workload "
                   "section)")
    p.add_argument("--traces", metavar="H:D,...",
                   help="recorded TraceV2 traces (header YAML:data CSV, comma-separated) as "
                        "the workloads, instead of the configuration's workload section: "
                        "--seeds and --holdout-seeds then pick traces by index (default 0)")
    p.add_argument("--engine", choices=("auto", "jax", "reference"), default="auto",
                   help="where candidates are simulated: jax (population calls), reference "
                        "(one run per candidate) or auto (default: the reference engine when "
                        "its runs are estimated to take less than compiling the JAX program; "
                        "the same results either way)")
    p.add_argument("--objective", action="append", metavar="EXPR",
                   help="metric expression to maximise (repeat for multi-objective / Pareto "
                        "mode); default 'fitness' (metrics.fitness_weights). Use "
                        "--objective=-e2e_p99_ms for a leading minus")
    p.add_argument("--constraint", action="append", default=[], metavar="EXPR",
                   help="constraint such as 'slo_attainment >= 0.99' (repeatable)")
    p.add_argument("--constraint-mode", default="filter", metavar="MODE",
                   help=f"{' | '.join(CONSTRAINT_MODES)} (default filter: feasible candidates "
                        "always rank first)")
    p.add_argument("--penalty", metavar="W",
                   help="with --constraint-mode penalty: fitness = objective - W x total "
                        "violation (default 1000)")
    p.add_argument("--seeds", metavar="S1,S2,...",
                   help="workload seeds; every candidate is simulated on each (default: the "
                        "config's seed)")
    p.add_argument("--robust", default="mean", metavar="STAT",
                   help=f"combine seeds by {' | '.join(ROBUST_STATISTICS)} (default mean)")
    p.add_argument("--cvar-alpha", metavar="A",
                   help="with --robust cvar: the tail fraction, in (0, 1] (default 0.25)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint")
    p.add_argument("--llmd-api-version", default=DEFAULT_API_VERSION, metavar="V",
                   help=f"apiVersion of endpoint_picker.yaml, the best routing as an llm-d "
                        f"EndpointPickerConfig: {' | '.join(API_VERSIONS)} (default "
                        f"{DEFAULT_API_VERSION}; the other one writes integer weights)")
    _add_ray(p)


def _add_ray(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("running on a Ray cluster (pip install 'blisjax[ray]')")
    g.add_argument("--ray", metavar="WHERE",
                   help="run the simulations on Ray actors: local (start Ray on this machine), "
                        "auto (the cluster `ray start` runs here, or RAY_ADDRESS) or a cluster "
                        "address (host:6379, ray://host:10001). Results are the same bytes as "
                        "without --ray")
    g.add_argument("--ray-workers", metavar="N",
                   help="actors to start (default: one per node, with all its CPUs)")
    g.add_argument("--ray-worker-cpus", metavar="C",
                   help="CPUs, and XLA devices, per actor (default: the node's CPUs, or the "
                        "cluster's CPUs shared evenly among --ray-workers)")
    g.add_argument("--ray-lanes", metavar="N",
                   help="lanes per task sent to an actor (default: each seed's population "
                        "split so that every actor gets a task)")


#: Most Ray actors, or CPUs per actor, a command line may ask for.
MAX_RAY_WORKERS = 4096


def _ray_settings(args: Any) -> dict | None:
    """The RayBackend arguments of ``--ray*``, or None without ``--ray`` (the other ``--ray-*``
    flags are refused then)."""
    from search.api import MAX_POPULATION, check_int

    flags = {"workers": ("--ray-workers", args.ray_workers, MAX_RAY_WORKERS),
             "worker_cpus": ("--ray-worker-cpus", args.ray_worker_cpus, MAX_RAY_WORKERS),
             "lanes_per_task": ("--ray-lanes", args.ray_lanes, MAX_POPULATION)}
    if args.ray is not None and args.engine == "reference":
        raise ConfigError("--engine", "reference runs in this process; --ray runs JAX "
                          "populations on the cluster (use --engine jax or auto)")
    if args.ray is None:
        given = [flag for flag, value, _ in flags.values() if value is not None]
        if given:
            raise ConfigError(given[0], "only used with --ray")
        return None
    if not args.ray.strip():
        raise ConfigError("--ray", "must be local, auto or a cluster address, got ''")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("--ray", "needs Ray: pip install 'blisjax[ray]'") from None
    settings: dict[str, Any] = {"address": args.ray.strip()}
    for name, (flag, value, most) in flags.items():
        if value is not None:
            settings[name] = check_int(flag, value, 1, most)
    return settings


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``blisjax sweep``."""
    p = sub.add_parser("sweep", help="evaluate a grid of policy knobs (JAX engine, lanes in "
                                     "parallel)")
    _add_scoring(p)
    p.add_argument("--grid", action="append", nargs="+", metavar="AXIS",
                   help="knob=lo:hi:n | knob=log:lo:hi:n | knob=a,b,c (one per knob)")
    p.add_argument("--num-instances", metavar="N1,N2,...",
                   help="cluster sizes to sweep, each at most the configuration's "
                        "num_instances (the same as --grid cluster.num_instances=N1,N2,...)")
    p.add_argument("--batch", metavar="N",
                   help="lanes per engine call (default: all points, at most 64)")
    p.add_argument("--out", default="results/sweep", metavar="DIR",
                   help="results directory (default results/sweep)")
    return p


def add_search_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``blisjax search``."""
    p = sub.add_parser("search", help="population-based policy search (JAX engine)")
    _add_scoring(p)
    p.add_argument("--space", required=True, metavar="SPACE.yaml", help="search space YAML")
    p.add_argument("--strategy", required=True, choices=STRATEGIES,
                   help="cma | openes | ga | gp | random (gp: genetic programming over the "
                        "policy program of the space's program section)")
    p.add_argument("--population", required=True, metavar="P",
                   help="candidates per generation = lanes per engine call (>= 2; even for "
                        "openes)")
    p.add_argument("--generations", required=True, metavar="G", help="generations (>= 1)")
    p.add_argument("--seed", default="0", metavar="S", help="strategy seed (default 0)")
    p.add_argument("--holdout-seeds", metavar="S1,S2,...",
                   help="after the search, compare the best policy with the config's policy "
                        "on these workload seeds")
    p.add_argument("--sigma", metavar="X",
                   help="initial step / mutation scale in unit-cube coordinates (cma, openes, "
                        "ga, gp; default cma 0.3, openes 0.1, ga 0.1, gp 0.1)")
    p.add_argument("--learning-rate", metavar="X",
                   help="with --strategy openes: the Adam learning rate (default 0.05)")
    p.add_argument("--out", default="results/search", metavar="DIR",
                   help="results directory (default results/search)")
    return p


#: Defaults of the scoring options that only count in some modes (None on the command line, so
#: that giving one where it has no effect can be refused).
_CVAR_ALPHA_DEFAULT = "0.25"
_PENALTY_DEFAULT = "1000"


def _check_scoring_flags(args: Any) -> None:
    """Options given where they have no effect are errors saying what makes them count."""
    if args.cvar_alpha is not None and args.robust != "cvar":
        raise ConfigError("--cvar-alpha", "only used with --robust cvar")
    if args.penalty is not None and args.constraint_mode != "penalty":
        raise ConfigError("--penalty", "only used with --constraint-mode penalty")


def _common(args: Any) -> dict:
    _check_scoring_flags(args)
    return {"objectives": args.objective, "constraints": args.constraint,
            "seeds": args.seeds, "robust": args.robust,
            "cvar_alpha": _CVAR_ALPHA_DEFAULT if args.cvar_alpha is None else args.cvar_alpha,
            "constraint_mode": args.constraint_mode,
            "penalty": _PENALTY_DEFAULT if args.penalty is None else args.penalty,
            "out_dir": args.out, "resume": args.resume,
            "llmd_api_version": args.llmd_api_version, "engine": args.engine,
            "traces": _trace_pairs(args.traces)}


def _trace_pairs(text: str | None) -> list[tuple[str, str]] | None:
    """``--traces H:D,H:D`` as (header, data) pairs, each file checked readable."""
    if text is None:
        return None
    from blisjax.cli import check_input_file

    pairs = []
    for item in text.split(","):
        header, sep, data = item.partition(":")
        if not sep or not header or not data:
            raise ConfigError("--traces", f"each trace is HEADER.yaml:DATA.csv, got {item!r}")
        for path in (header, data):
            check_input_file("--traces", path)
        pairs.append((header, data))
    return pairs


def _resume_hint(plan: Any, what: str) -> str:
    from search.io import CHECKPOINT

    if plan.out_dir is not None and (Path(plan.out_dir) / CHECKPOINT).is_file():
        return (f"{what}; continue with the same arguments and --resume (checkpoint in "
                f"{plan.out_dir})")
    return f"{what} before the first generation finished (no checkpoint yet: run the " \
           "command again)"


def _open_backend(plan: Any, args: Any, ray: dict | None):
    """The backend of ``--ray`` (None: this process), its start-up reported on stderr."""
    if ray is None:
        return None
    from search.backends.ray_cluster import RayBackend

    def log(message: str) -> None:
        print(f"{plan.kind}: ray: {message}", file=sys.stderr, flush=True)

    if not args.quiet:
        log(f"connecting to {ray['address']} and starting the workers")
    backend = RayBackend(**ray, log=log)
    if not args.quiet:
        log(backend.events[-1])
    return backend


def _workers_lost(ray: dict | None) -> tuple[type[BaseException], ...]:
    """The error of a lost Ray cluster (nothing to catch without --ray)."""
    if ray is None:
        return ()
    from search.backends.ray_cluster import RayWorkersLost

    return (RayWorkersLost,)


def _run(plan: Any, args: Any, ray: dict | None = None) -> int:
    from search.api import execute

    for warning in plan.warnings:
        print(f"blisjax: warning: {warning}", file=sys.stderr)
    backend = None
    try:
        backend = _open_backend(plan, args, ray)
        summary = execute(plan, progress=not args.quiet, backend=backend)
    except KeyboardInterrupt:
        print(f"blisjax: {_resume_hint(plan, 'interrupted')}", file=sys.stderr)
        return 130
    except _workers_lost(ray) as err:
        print(f"blisjax: error: {err}; {_resume_hint(plan, f'the {plan.kind} stopped')}",
              file=sys.stderr)
        return 1
    finally:
        if backend is not None:
            backend.close()
    print(f"blisjax: results in {plan.out_dir}/ ({', '.join(summary['files'].values())})",
          file=sys.stderr)
    program = (summary.get("best") or {}).get("program")
    if program is not None:
        print(f"blisjax: best {program['site']} program ({program['nodes']} nodes):\n"
              + "\n".join(f"  {line}" for line in program["tree"]), file=sys.stderr)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_sweep(args: Any) -> int:
    """``blisjax sweep``: validate, evaluate the grid, write the results directory."""
    specs = [spec for group in args.grid or [] for spec in group]
    if args.num_instances is not None:
        if not re.fullmatch(r"\d+(,\d+)*", args.num_instances):
            raise ConfigError("--num-instances", "must be a comma-separated list of instance "
                              f"counts, e.g. 2,3,4, got {args.num_instances!r}")
        specs.append(f"cluster.num_instances={args.num_instances}")
    if not specs:
        raise ConfigError("--grid", "give at least one axis (--grid knob=... or "
                          "--num-instances)")
    axes = [parse_grid_axis(spec) for spec in specs]
    names = [n for n, _ in axes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError("--grid", f"knob {dupes[0]!r} is given twice")
    from search.api import prepare

    ray = _ray_settings(args)
    plan = prepare("sweep", args.config, grid=axes, batch=args.batch, **_common(args))
    return _run(plan, args, ray)


def cmd_search(args: Any) -> int:
    """``blisjax search``: validate, run the strategy, write the results directory."""
    from search.api import prepare

    if args.learning_rate is not None and args.strategy != "openes":
        raise ConfigError("--learning-rate", "only used with --strategy openes")
    if args.sigma is not None and args.strategy == "random":
        raise ConfigError("--sigma", "only used with --strategy cma, openes, ga or gp")

    ray = _ray_settings(args)
    plan = prepare("search", args.config, space=Path(args.space), strategy=args.strategy,
                   population=args.population, generations=args.generations, seed=args.seed,
                   holdout_seeds=args.holdout_seeds, sigma=args.sigma,
                   learning_rate=args.learning_rate, **_common(args))
    return _run(plan, args, ray)
