"""`blisjax` command line: run | replay | trace | parity | fit-latency | sweep | search.

Thin by design: parse arguments, build a validated configuration and workload, call an engine,
print aggregate metrics JSON on stdout (logs, warnings and the progress line go to stderr). Flags
use BLIS's names and units so a BLIS command line works with ``blis`` replaced by ``blisjax``.

Every input is checked before anything is simulated or written: flags that would have no effect
in the given combination, unreadable input files and unwritable output paths are errors (exit
status 2) naming the flag and the value given. Ctrl-C exits with status 130 and one line.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from blisjax import __version__
from blisjax.atomicio import write_text_atomic
from blisjax.config import (
    ConfigError,
    SimConfig,
    add_blis_flags,
    apply_blis_flags,
    load_config,
    resolve_config,
)
from blisjax.devices import use_cpu_cores
from blisjax.metrics import (
    config_metrics,
    kv_cache_summary,
    per_request_rows,
    timeline_csv,
    write_json_atomic,
)
from blisjax.progress import Progress
from blisjax.trace.reflect import STRATEGIES as SUMMARY_STRATEGIES
from blisjax.workload import (
    distribution_spec,
    generate_workload,
    parse_workload_spec,
    read_trace,
    section_traces,
    workload_from_section,
    write_trace,
)
from search.adapters.core import ENGINES as ADAPTER_ENGINES

ENGINES = ("reference", "jax")
#: apiVersion values of ``export-llmd`` (``search.llmd``'s, named here so the parser does not
#: import the search package).
LLMD_API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
LLMD_DEFAULT_API_VERSION = LLMD_API_VERSIONS[0]
#: Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Exit status of invalid input.
EXIT_INVALID = 2

#: The rule every simulating command follows for its starting configuration.
BASE_RULE = ("Base configuration: --config FILE if given, else the shipped default experiment "
             "(configs/default.yaml: 4 instances, weighted routing, two tenants). A workload "
             "given by --workload-spec, --workload distribution or a trace replaces only the "
             "base's workload; --policy-config and the flags then override single fields. A "
             "trace written by `trace` and replayed by `replay` with the same --config "
             "reproduces `run` exactly.")


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
    "offchain": Capacity("--offchain-generations", "offchain_generations",
                         "distinct held predecessors of one block content whose off-chain "
                         "CPU-tier hashes a lane tells apart (a CPU tier)",
                         "8"),
    "kv_hold": Capacity("--kv-hold-slots", "kv_hold_slots",
                        "queued requests per instance holding KV blocks after a failed tiered "
                        "admission (a CPU tier with --blis-quirks)", "8"),
    "pd_transfers": Capacity("--pd-transfer-slots", "pd_transfer_slots",
                             "P/D KV transfers pending or in flight at once",
                             "the request count, which cannot overflow"),
    "pd_reserve": Capacity("--pd-reserve-slots", "pd_reserve_slots",
                           "P/D decode sub-requests waiting with reserved KV per instance",
                           "the request count or the KV blocks, whichever is fewer, which "
                           "cannot overflow"),
    "actuations": Capacity("--actuation-slots", "actuation_slots",
                           "scale actuations pending at once (instance lifecycles)", "8"),
    "timeline": Capacity("--timeline-slots", "timeline_slots",
                         "instance state changes recorded (instance lifecycles)",
                         "64 per instance slot + 64"),
}
#: Overflows that are not capacities of the program: what to do instead.
NOT_CAPACITIES = {
    "instance_slots": "with --blis-quirks every new instance takes a fresh slot (BLIS never "
                      "reuses one) and {times} scale-up instance(s) found none; raise "
                      "policy.autoscaler.max_replicas",
    "lifecycle_draws": "a random lifecycle delay stream needed more than its 64 stored draws "
                       "{times} time(s); run it with --engine reference",
}


class DistributionFlag(NamedTuple):
    """A flag of BLIS's ``--workload distribution`` synthesiser."""

    flag: str
    dest: str
    kind: type
    spec_arg: str  # the ``distribution_spec`` argument it sets ("" for --rate/--num-requests)
    spec_path: str  # where the workload-spec parser reports an invalid value of it
    help: str


DISTRIBUTION_FLAGS = (
    DistributionFlag("--rate", "rate", float, "", "aggregate_rate",
                     "requests per second (constant arrivals), > 0"),
    DistributionFlag("--num-requests", "num_requests", int, "", "num_requests",
                     "number of requests, >= 1"),
    DistributionFlag("--prompt-tokens", "prompt_tokens", float, "prompt_mean",
                     "clients[0].input_distribution.params.mean",
                     "mean prompt length, tokens (default 512)"),
    DistributionFlag("--prompt-tokens-stdev", "prompt_tokens_stdev", float, "prompt_std",
                     "clients[0].input_distribution.params.std_dev",
                     "prompt length standard deviation, tokens (default 256)"),
    DistributionFlag("--prompt-tokens-min", "prompt_tokens_min", int, "prompt_min",
                     "clients[0].input_distribution.params.min",
                     "shortest prompt, tokens (default 2)"),
    DistributionFlag("--prompt-tokens-max", "prompt_tokens_max", int, "prompt_max",
                     "clients[0].input_distribution.params.max",
                     "longest prompt, tokens (default 7000)"),
    DistributionFlag("--output-tokens", "output_tokens", float, "output_mean",
                     "clients[0].output_distribution.params.mean",
                     "mean output length, tokens (default 512)"),
    DistributionFlag("--output-tokens-stdev", "output_tokens_stdev", float, "output_std",
                     "clients[0].output_distribution.params.std_dev",
                     "output length standard deviation, tokens (default 256)"),
    DistributionFlag("--output-tokens-min", "output_tokens_min", int, "output_min",
                     "clients[0].output_distribution.params.min",
                     "shortest output, tokens (default 2)"),
    DistributionFlag("--output-tokens-max", "output_tokens_max", int, "output_max",
                     "clients[0].output_distribution.params.max",
                     "longest output, tokens (default 7000)"),
    DistributionFlag("--prefix-tokens", "prefix_tokens", int, "prefix_tokens", "prefix_tokens",
                     "shared prefix prepended to every prompt, tokens (default 0)"),
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _log(args: Any, msg: str) -> None:
    """An informational stderr line (silenced by --quiet)."""
    if not getattr(args, "quiet", False):
        print(f"blisjax: {msg}", file=sys.stderr)


def _warn(msg: str) -> None:
    """A warning on stderr (always shown; the exit status is unchanged)."""
    print(f"blisjax: warning: {msg}", file=sys.stderr)


# ---- argument parsing ---------------------------------------------------------------------------


def _add_global_options(p: argparse.ArgumentParser, top: bool) -> None:
    """Options accepted both before and after the subcommand. On a subcommand they default to
    SUPPRESS, so one given before the subcommand is not reset by the subcommand's parser."""
    def default(value: Any) -> dict[str, Any]:
        return {"default": value if top else argparse.SUPPRESS}

    g = p.add_argument_group("global options (before or after the command)")
    g.add_argument("--cpu-devices", type=_positive_int, metavar="N", **default(None),
                   help="split the CPU into N XLA devices for the JAX engine, which runs one "
                        "event loop per device (default: one per usable core; 1 keeps XLA's "
                        "single device; an XLA_FLAGS device count takes precedence)")
    g.add_argument("--quiet", action="store_true", **default(False),
                   help="no progress line and no informational logs on stderr (warnings and "
                        "errors still print)")
    g.add_argument("--no-compile-cache", action="store_true", **default(False),
                   help="do not keep compiled JAX programs on disk (default: kept in "
                        "$XDG_CACHE_HOME/blisjax/{xla,programs} or ~/.cache/blisjax/...; also "
                        "BLISJAX_COMPILE_CACHE=0; an explicit JAX_COMPILATION_CACHE_DIR wins)")


def _add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="blisjax YAML experiment (default: the shipped default experiment, "
                        "configs/default.yaml)")


def _add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-path", metavar="FILE",
                   help="write per-request results (JSON array sorted by request_id)")
    p.add_argument("--metrics-path", metavar="FILE",
                   help="also write the aggregate metrics JSON to FILE")
    p.add_argument("--timeline-path", metavar="FILE",
                   help="write the instances' lifecycle state changes as CSV (time_us, "
                        "instance, state, replicas held and routable after the change)")
    p.add_argument("--timeline-plot", metavar="PNG",
                   help="plot the instances held and routable over time against the arrival "
                        "rate")




def _add_trace_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decision trace (reference engine; docs/tracing.md)")
    g.add_argument("--trace-level", choices=("none", "decisions", "full"), default="none",
                   help="record every policy decision with its context (decisions), and every "
                        "event too (full); default none (no collector, no cost)")
    g.add_argument("--counterfactual-k", type=int, default=0, metavar="K",
                   help="keep the K best-scored candidates of each routing decision and its "
                        "regret (BLIS's; default 0: none, regret 0)")
    g.add_argument("--summarize-trace", action="store_true",
                   help="print BLIS's \"Trace Summary\" block (on stderr; the metrics JSON "
                        "gets trace_summary whenever a trace is recorded)")
    g.add_argument("--trace-out", metavar="DIR",
                   help="write trace.jsonl (the records), timeline.json (Chrome/Perfetto "
                        "trace events) and summary.txt (a text summary for reflection) to DIR")
    g.add_argument("--summary-strategy", choices=SUMMARY_STRATEGIES, default=None,
                   help="what summary.txt dwells on (default issue_focused)")


def _add_engine_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="reference",
                   help="simulation engine: reference (default) or jax (bit-identical, compiled)")


def _add_physics_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-placeholder-coefficients", action="store_true",
                   help="run --latency-model physics with the shipped illustrative all-zero "
                        "coefficients (refused otherwise: its latencies are meaningless)")


def _add_capacity_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "JAX engine capacities (a run that exceeds one fails, naming its flag)")
    for cap in CAPACITIES.values():
        g.add_argument(cap.flag, type=_positive_int, metavar="N", dest=cap.field,
                       help=f"{cap.holds} (default: {cap.default})")


def _add_workload_spec_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload-spec", metavar="FILE",
                   help="BLIS workload-spec v2 YAML; replaces the base configuration's workload")


def _add_distribution_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "BLIS --workload distribution (its flags are only used with --workload distribution)")
    g.add_argument("--workload", choices=("distribution",),
                   help="synthesize a single-client workload from the flags below; replaces "
                        "the base configuration's workload")
    for f in DISTRIBUTION_FLAGS:
        g.add_argument(f.flag, dest=f.dest, type=f.kind, help=f.help,
                       metavar="N" if f.kind is int else "X")


def _add_trace_inputs(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--trace-header", required=required, metavar="FILE",
                   help="TraceV2 header YAML (trace_version 2 or 3, time_unit microseconds)")
    p.add_argument("--trace-data", required=required, metavar="FILE",
                   help="TraceV2 CSV, one request per row (BLIS's columns)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blisjax",
        description="Simulate LLM-inference serving clusters (BLIS-compatible).",
        epilog=BASE_RULE)
    parser.add_argument("--version", action="version", version=f"blisjax {__version__}")
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=BASE_RULE)
        _add_global_options(p, top=False)
        return p

    run = command("run", "simulate a generated workload (default: the shipped experiment)")
    _add_config_flag(run)
    _add_engine_flag(run)
    _add_outputs(run)
    _add_trace_flags(run)
    _add_workload_spec_flag(run)
    _add_physics_flags(run)
    add_blis_flags(run)
    _add_distribution_flags(run)
    _add_capacity_flags(run)

    replay = command("replay", "replay a BLIS TraceV2 trace exactly")
    _add_trace_inputs(replay, required=True)
    _add_config_flag(replay)
    _add_engine_flag(replay)
    _add_outputs(replay)
    _add_trace_flags(replay)
    _add_physics_flags(replay)
    add_blis_flags(replay)
    _set_help(replay, "--seed", "accepted so BLIS replay command lines run unchanged; it changes "
                                "nothing here (the trace fixes every request, and blisjax's "
                                "engines draw no random numbers)")
    _add_capacity_flags(replay)

    parity = command("parity", "run both engines on one configuration and report "
                               "\"identical\" or the first divergent request and field")
    _add_config_flag(parity)
    _add_trace_inputs(parity, required=False)
    _add_workload_spec_flag(parity)
    _add_physics_flags(parity)
    add_blis_flags(parity)
    _add_distribution_flags(parity)
    _add_capacity_flags(parity)

    trace = command("trace", "generate a workload and write it as a TraceV2 trace (header "
                             "YAML + CSV) that `replay` and BLIS read")
    _add_config_flag(trace)
    _add_workload_spec_flag(trace)
    trace.add_argument("--seed", type=int,
                       help="workload seed (default: the base configuration's seed)")
    _add_distribution_flags(trace)
    trace.add_argument("--out-header", required=True, metavar="FILE",
                       help="write the trace header YAML here")
    trace.add_argument("--out-data", required=True, metavar="FILE",
                       help="write the trace CSV here")

    export = command("export-llmd", "write a configuration's routing as an llm-d "
                                    "EndpointPickerConfig (what `search` writes as "
                                    "endpoint_picker.yaml)")
    _add_config_flag(export)
    add_blis_flags(export)
    export.add_argument("--out", required=True, metavar="FILE",
                        help="write the EndpointPickerConfig YAML here")
    export.add_argument("--llmd-api-version", default=LLMD_DEFAULT_API_VERSION, metavar="V",
                        help=f"apiVersion: {' | '.join(LLMD_API_VERSIONS)} (default "
                             f"{LLMD_DEFAULT_API_VERSION}; the second writes integer weights)")
    export.add_argument("--allow-approximation", action="store_true",
                        help="write the file even when a scorer with a nonzero weight has no "
                             "llm-d plugin (it is left out, so llm-d routes differently; "
                             "without this flag that is an error naming the scorer)")

    plot = command("plot", "plot a trace's per-instance queue depth, batch size and KV "
                           "utilization over time (PNG), and optionally its timeline")
    plot.add_argument("trace", metavar="TRACE",
                      help="a --trace-out directory or its trace.jsonl")
    plot.add_argument("--out", metavar="PNG",
                      help="write the plot here (default: instances.png beside the trace)")
    plot.add_argument("--timeline-png", metavar="PNG",
                      help="also draw the timeline's tracks (steps, routing, request flows) "
                           "over --start-s .. --end-s")
    plot.add_argument("--start-s", type=float, metavar="S",
                      help="timeline window start, seconds of simulated time")
    plot.add_argument("--end-s", type=float, metavar="S",
                      help="timeline window end, seconds of simulated time")

    explain = command("explain", "re-run a candidate of a `search`/`sweep` results directory "
                                 "in the reference engine with a decision trace; print its "
                                 "text summary, write its trace, timeline and plots")
    explain.add_argument("results", metavar="RESULTS_DIR",
                         help="a `blisjax search` or `sweep` --out directory")
    explain.add_argument("--candidate", "--lane", type=int, metavar="N", dest="candidate",
                         help="the candidate: its history.csv row from 0 (a sweep's grid point "
                              "= its lane); default: the best")
    explain.add_argument("--seed", type=int, metavar="S",
                         help="workload seed (default: the run's first)")
    explain.add_argument("--config", metavar="FILE",
                         help="the experiment (default: RESULTS_DIR/best_config.yaml, whose "
                              "knobs the candidate's replace)")
    explain.add_argument("--out", metavar="DIR",
                         help="output directory (default RESULTS_DIR/explain/"
                              "candidate-N-seed-S)")
    explain.add_argument("--trace-level", choices=("decisions", "full"), default="decisions",
                         help="default decisions")
    explain.add_argument("--counterfactual-k", type=int, default=3, metavar="K",
                         help="candidates kept per routing decision (default 3)")
    explain.add_argument("--summary-strategy", choices=SUMMARY_STRATEGIES,
                         default=SUMMARY_STRATEGIES[0], help="default issue_focused")

    gepa = command("gepa-evaluate", "score a policy bundle as the GEPA adapter scores a "
                                    "candidate (per experiment and seed), with the feedback "
                                    "its reflection LM reads")
    gepa.add_argument("--policy-config", required=True, metavar="FILE",
                      help="the candidate: a BLIS policy bundle (as `run --policy-config`)")
    gepa.add_argument("--config", action="append", metavar="FILE",
                      help="an experiment to score it on (repeatable; default the shipped "
                           "default experiment)")
    _add_adapter_scoring(gepa, "fitness")
    gepa.add_argument("--engine", choices=ADAPTER_ENGINES, default="auto",
                      help="auto (default): the JAX engine when the policy is a set of "
                           "per-lane knobs of the experiment, else the reference engine")
    gepa.add_argument("--feedback-strategy", choices=SUMMARY_STRATEGIES,
                      default=SUMMARY_STRATEGIES[0], help="default issue_focused")

    evolve = command("openevolve-evaluate", "score a program as the OpenEvolve evaluator "
                                            "does (sandboxed reference runs), with its "
                                            "summary artifact")
    evolve.add_argument("program", metavar="PROGRAM",
                        help="a Python file defining policy() (a policy bundle) or "
                             "route_scores() / priority() (a code policy)")
    evolve.add_argument("--config", required=True, metavar="FILE", help="the experiment")
    _add_adapter_scoring(evolve, "slo_attainment")
    evolve.add_argument("--holdout-seeds", metavar="S1,S2,...",
                        help="stage 2 also scores these seeds (reported apart)")
    evolve.add_argument("--stage", type=int, choices=(1, 2), default=2,
                        help="1: the first requests of one seed (the cascade's cheap filter); "
                             "2 (default): the full workload on every seed")
    evolve.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                        help="wall seconds the sandboxed run may take (default 60)")

    _add_fit_parser(command("fit-latency",
                            "fit physics (and blackbox) latency coefficients from step/journey "
                            "tables, or export such tables from a simulation "
                            "(--export-from-config)"))
    _add_search_parsers(sub, command)
    return parser


def _add_adapter_scoring(p: argparse.ArgumentParser, objective: str) -> None:
    p.add_argument("--seeds", metavar="S1,S2,...",
                   help="workload seeds (default: the experiment's seed)")
    p.add_argument("--objective", default=objective, metavar="EXPR",
                   help=f"the score, higher is better: an expression over the metrics "
                        f"(default {objective})")


def _set_help(parser: argparse.ArgumentParser, option: str, text: str) -> None:
    next(a for a in parser._actions if option in a.option_strings).help = text


def _add_fit_parser(fit: argparse.ArgumentParser) -> None:
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
    fit.add_argument("--folds", type=int, help="CV folds (default 5)")
    fit.add_argument("--holdout", type=float,
                     help="share of each instance's samples held out, in time (default 0.2)")
    fit.add_argument("--warmup-steps", type=int,
                     help="steps per instance excluded from the beta fit (default 10)")
    fit.add_argument("--outlier-factor", type=float,
                     help="drop samples with target > factor x median (default 5; 0 = off)")
    fit.add_argument("--alpha-target", choices=("queued", "scheduled"),
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


#: fit-latency flags used only when fitting (not with --export-from-config).
_FIT_ONLY = ("steps", "journeys", "config", "out", "report", "lambdas", "gammas", "folds",
             "holdout", "warmup_steps", "outlier_factor", "alpha_target")
#: fit-latency flags used only with --export-from-config.
_EXPORT_ONLY = ("out_steps", "out_journeys", "trace_start")


def _add_search_parsers(sub: Any, command: Callable[[str, str], Any]) -> None:
    """`sweep` and `search` (the policy-search package ``search/``)."""
    from search.cli import add_search_parser, add_sweep_parser

    for add in (add_sweep_parser, add_search_parser):
        p = add(sub)
        _add_global_options(p, top=False)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# ---- input files and output paths ---------------------------------------------------------------


def check_input_file(flag: str, path: str) -> None:
    """``path`` (given with ``flag``) is a readable regular file, else ``ConfigError``."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(flag, f"no such file: {path!r}")
    if p.is_dir():
        raise ConfigError(flag, f"{path!r} is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(flag, f"cannot read {path!r}: permission denied")


def check_text_file(flag: str, path: str) -> None:
    """``check_input_file``, and the file is UTF-8 text."""
    check_input_file(flag, path)
    try:
        Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path!r} is not UTF-8 text") from None


@contextlib.contextmanager
def reading(flag: str, path: str, prefix: str = "") -> Iterator[None]:
    """Report any failure to read or parse ``path`` as a ``ConfigError`` naming ``flag`` and
    ``path``; messages about the file's content get ``prefix`` (e.g. ``workload.``)."""
    check_input_file(flag, path)
    try:
        yield
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path!r} is not UTF-8 text") from None
    except OSError as err:
        raise ConfigError(flag, f"cannot read {path!r}: {err.strerror or err}") from None
    except ValueError as err:  # ConfigError is a ValueError; YAML errors are wrapped as one
        text = " ".join(str(err).split())
        if prefix and not text.startswith(prefix):
            text = prefix + text
        raise ConfigError(flag, f"{path}: {text}") from None


def check_output_path(flag: str, path: str) -> None:
    """``path`` (a file to write, given with ``flag``) can be written: it is not a directory,
    its directory exists (missing directories are created, as for a results directory) and a
    file can be created there (tried: permissions alone do not tell, e.g. in /proc). Checked
    before any simulation."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, f"{path!r} is a directory; give a file path")
    parent = p.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(flag, f"{path!r}: {str(existing)!r} is not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(flag, f"{path!r} cannot be written: "
                          f"{(err.strerror or str(err)).lower()}") from None


def check_output_dir(flag: str, path: str) -> None:
    """``path`` (a results directory, created with its parents if missing) can be written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(flag, f"{path!r} exists and is not a directory")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(flag, f"{path!r}: {str(existing)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{path!r}: permission denied")


def _check_outputs(args: Any, flags: tuple[str, ...]) -> None:
    for dest in flags:
        value = getattr(args, dest, None)
        if value:
            check_output_path(_flag(dest), value)


# ---- configuration and workload ---------------------------------------------------------------


def _base_config(args: Any) -> tuple[SimConfig, str]:
    """(the base configuration, how it was chosen) by ``BASE_RULE``."""
    if args.config:
        with reading("--config", args.config):
            return load_config(args.config), f"--config {args.config}"
    return load_config(default_config_path()), "the shipped default experiment " \
                                               "(configs/default.yaml)"


def _config_from_args(args: Any) -> tuple[SimConfig, str]:
    """The base configuration with --policy-config and the BLIS flags applied."""
    cfg, base = _base_config(args)
    if getattr(args, "coefficients_file", None):
        check_input_file("--coefficients-file", args.coefficients_file)
    if getattr(args, "policy_config", None):
        check_input_file("--policy-config", args.policy_config)
    if hasattr(args, "routing_policy"):
        try:
            cfg = apply_blis_flags(cfg, args)
        except UnicodeDecodeError:
            raise ConfigError("--policy-config", f"{args.policy_config!r} is not UTF-8 text") \
                from None
        except ConfigError as err:
            if err.path == "policy-config":
                raise ConfigError("--policy-config", f"{args.policy_config}: {err.problem}") \
                    from None
            raise
    _check_policy_flags(args, cfg)
    return cfg, base


def _check_policy_flags(args: Any, cfg: SimConfig) -> None:
    """Policy parameters given for a policy that does not use them are errors."""
    admission = cfg.policy.admission.policy
    for dest in ("token_bucket_capacity", "token_bucket_refill_rate"):
        if getattr(args, dest, None) is not None and admission != "token-bucket":
            raise ConfigError(_flag(dest), f"only used with --admission-policy token-bucket "
                                           f"(the admission policy here is {admission!r})")
    routing = cfg.policy.routing.policy
    if getattr(args, "routing_scorers", None) is not None and routing != "weighted":
        raise ConfigError("--routing-scorers", f"only used with --routing-policy weighted (the "
                                               f"routing policy here is {routing!r})")
    if getattr(args, "routing_tie_break", None) is not None and routing not in (
            "least-loaded", "weighted"):
        raise ConfigError("--routing-tie-break", "only used with --routing-policy least-loaded "
                                                 f"or weighted (the routing policy here is "
                                                 f"{routing!r})")
    if not cfg.cluster.pd.enabled:
        for dest in ("pd_decider", "pd_prefix_threshold", "pd_transfer_bandwidth",
                     "pd_transfer_base_latency", "pd_transfer_contention",
                     "prefill_routing_scorers", "decode_routing_scorers"):
            if getattr(args, dest, None) is not None:
                raise ConfigError(_flag(dest), "only used with P/D pools (--prefill-instances "
                                               "and --decode-instances, or "
                                               "--prefill-decode-instances)")


def _distribution_requested(args: Any) -> bool:
    return getattr(args, "workload", None) == "distribution"


def _check_workload_flags(args: Any, trace_given: bool = False) -> None:
    """At most one workload source; distribution flags only with --workload distribution."""
    if not _distribution_requested(args):
        for f in DISTRIBUTION_FLAGS:
            if getattr(args, f.dest, None) is not None:
                raise ConfigError(f.flag, "only used with --workload distribution")
    sources = [name for name, given in (
        ("--trace-header/--trace-data", trace_given),
        ("--workload-spec", bool(getattr(args, "workload_spec", None))),
        ("--workload distribution", _distribution_requested(args))) if given]
    if len(sources) > 1:
        raise ConfigError(sources[1].split()[0].split("/")[0],
                          f"cannot be combined with {sources[0]} (each gives the whole workload)")


def _distribution_from_args(args: Any):
    for f in DISTRIBUTION_FLAGS[:2]:
        if getattr(args, f.dest) is None:
            raise ConfigError(f.flag, "is required with --workload distribution "
                                      "(--rate > 0, --num-requests >= 1)")
    kw = {f.spec_arg: getattr(args, f.dest) for f in DISTRIBUTION_FLAGS[2:]
          if getattr(args, f.dest) is not None}
    try:
        return distribution_spec(args.rate, args.num_requests, **kw)
    except ValueError as err:
        raise _blame_distribution_flag(err) from None


def _blame_distribution_flag(err: ValueError) -> ConfigError:
    """The distribution flag whose value the workload-spec validator refused."""
    text = str(err)
    for f in DISTRIBUTION_FLAGS:
        if text.startswith(f.spec_path + ":"):
            return ConfigError(f.flag, text[len(f.spec_path) + 1:].strip())
    return ConfigError("--workload distribution", text)


class WorkloadChoice(NamedTuple):
    """A workload and a description of where it came from (for the base-configuration log)."""

    workload: Any
    source: str


def _generated_workload(args: Any, cfg: SimConfig) -> WorkloadChoice:
    """Workload by ``BASE_RULE``: --workload-spec, else --workload distribution, else the base
    configuration's ``workload`` section."""
    if getattr(args, "workload_spec", None):
        with reading("--workload-spec", args.workload_spec, "workload."):
            spec = parse_workload_spec(args.workload_spec)
            return WorkloadChoice(generate_workload(spec, seed=cfg.seed),
                                  f"--workload-spec {args.workload_spec}")
    if _distribution_requested(args):
        spec = _distribution_from_args(args)
        try:
            return WorkloadChoice(generate_workload(spec, seed=cfg.seed),
                                  "--workload distribution")
        except ValueError as err:
            raise _blame_distribution_flag(err) from None
    if cfg.workload is None:
        raise ConfigError("workload", "none given (use --workload-spec FILE, --workload "
                                      "distribution, or a `workload:` section in --config)")
    try:
        if section_traces(cfg.workload) is not None:  # a search's traces: run the first
            return WorkloadChoice(workload_from_section(cfg.workload, 0),
                                  "the first trace of its workload.traces")
        spec = parse_workload_spec(cfg.workload)
        return WorkloadChoice(generate_workload(spec, seed=cfg.seed), "its own workload section")
    except ValueError as err:
        text = " ".join(str(err).split())
        text = text if text.startswith("workload") else "workload." + text
        raise ConfigError("--config", f"{args.config}: {text}") if args.config \
            else ConfigError(text) from None


def _trace_workload(args: Any) -> WorkloadChoice:
    with reading("--trace-header", args.trace_header):
        from blisjax.workload.trace import read_trace_header

        read_trace_header(args.trace_header)
    with reading("--trace-data", args.trace_data):
        workload = read_trace(args.trace_header, args.trace_data)
    if workload.num_requests == 0:
        _warn(f"--trace-data {args.trace_data}: the trace has no requests (a header line "
              "only); every count below is 0")
    return WorkloadChoice(workload, f"the trace {args.trace_data}")


# ---- commands ---------------------------------------------------------------------------------


def _engine(name: str):
    """The ``simulate(resolved, workload, **capacities)`` of an engine (imported only when
    needed; the reference engine has no capacities)."""
    if name == "jax":
        from blisjax.engine import simulate
    else:
        from blisjax.reference import simulate
    return simulate


def _capacities(args: Any) -> dict[str, int]:
    """The JAX engine capacities given on the command line (``build_static`` arguments)."""
    return {cap.field: getattr(args, cap.field) for cap in CAPACITIES.values()
            if getattr(args, cap.field, None) is not None}


def _check_capacities_used(args: Any) -> None:
    if getattr(args, "engine", "jax") != "jax":
        for cap in CAPACITIES.values():
            if getattr(args, cap.field, None) is not None:
                raise ConfigError(cap.flag, "is a JAX engine capacity: only used with "
                                  "--engine jax")


def _check_latency_model(args: Any, cfg: SimConfig) -> None:
    """Physics latency needs fitted coefficients: the shipped set is an all-zero placeholder."""
    lat = cfg.latency
    placeholder = (lat.model == "physics" and not lat.coefficients_file
                   and lat.alpha_coeffs is None and lat.beta_coeffs is None)
    allowed = getattr(args, "allow_placeholder_coefficients", False)
    if allowed and lat.model != "physics":
        raise ConfigError("--allow-placeholder-coefficients", "only used with --latency-model "
                                                              "physics")
    if placeholder and not allowed:
        raise ConfigError("--latency-model", "physics needs fitted coefficients: give "
                          "--coefficients-file FILE (from `blisjax fit-latency`), or "
                          "--allow-placeholder-coefficients to run the shipped all-zero "
                          "placeholder (its latencies are meaningless)")
    if placeholder:
        _warn("physics latency with the shipped all-zero placeholder coefficients: every "
              "latency below is meaningless")


def _check_capacity_for_workload(resolved: Any, workload: Any) -> None:
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
        _warn(f"{count} of {workload.num_requests} requests can never be served ({cap}KV cache "
              f"{resolved.total_kv_blocks} blocks x {block} tokens per instance): they are "
              "dropped as unservable")


def _warn_degenerate(metrics: dict, num_requests: int) -> None:
    if num_requests and not metrics.get("completed_requests"):
        parts = [f"{metrics.get(key, 0)} {what}" for key, what in (
            ("rejected_requests", "rejected"), ("dropped_unservable", "dropped as unservable"),
            ("timed_out_requests", "timed out"), ("still_queued", "still queued"),
            ("still_running", "still running")) if metrics.get(key)]
        _warn(f"no request completed: of {num_requests} requests, "
              f"{', '.join(parts) or 'none finished'}")


def _run_jax(resolved: Any, workload: Any, capacities: dict[str, int],
             progress: Progress | None = None):
    """The JAX engine's result; a run that exceeded a capacity raises ``ConfigError`` naming
    each exceeded capacity, its size and the flag that raises it (its numbers are not valid,
    so none are returned)."""
    from blisjax.engine.static import build_static

    hooks = {}
    if progress is not None and progress.enabled:
        progress.phase("preparing the JAX engine")
        hooks["phase"] = progress.phase  # told when compiling and running start
    result = _engine("jax")(resolved, workload, **hooks, **capacities)
    if not result.overflow:
        return result
    static = build_static(resolved, workload, **capacities)
    parts = []
    for name, times in result.overflow.items():
        if name in NOT_CAPACITIES:  # not a capacity: a case the program does not model
            parts.append(NOT_CAPACITIES[name].format(times=times))
            continue
        cap = CAPACITIES[name]
        size = getattr(static, cap.field)
        parts.append(f"{cap.holds}: {size} exceeded {times} time(s); raise it with {cap.flag} "
                     f"(> {size})")
    raise ConfigError("JAX engine capacity exceeded, so this run's numbers are not valid and "
                      "none are reported: " + "; ".join(parts))


def _simulate(args: Any, cfg: SimConfig, choice: WorkloadChoice, base: str) -> int:
    workload = choice.workload
    _check_latency_model(args, cfg)
    resolved = resolve_config(cfg)
    _log(args, f"base configuration: {base}; workload: {choice.source}")
    _check_capacity_for_workload(resolved, workload)
    if args.engine == "jax":
        _announce_compile_cache(args)
    trace = None
    with Progress(enabled=not args.quiet) as progress:
        start = time.perf_counter()
        if args.engine == "jax":
            result = _run_jax(resolved, workload, _capacities(args), progress)
        else:
            progress.phase(f"simulating {workload.num_requests} requests (reference engine)")
            if args.trace_level != "none":
                from blisjax.trace import simulate_traced

                result, trace = simulate_traced(resolved, workload, args.trace_level,
                                                args.counterfactual_k)
            else:
                result = _engine(args.engine)(resolved, workload)
            if result.overflow:  # the instance slots under --blis-quirks
                raise ConfigError("policy.autoscaler.max_replicas", "; ".join(
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
    if trace is not None and args.summarize_trace:
        print(trace.summary().blis_text(), end="", file=sys.stderr)
    _warn_degenerate(metrics, workload.num_requests)
    _log(args, f"{workload.num_requests} requests, {cfg.cluster.num_instances} instance(s), "
               f"engine {args.engine}: {wall_s:.3f} s wall")
    print(json.dumps(metrics, indent=2))
    return 0


def _check_run_flags(args: Any) -> None:
    """Checks of `run` and `replay` that need no configuration (before any file is read)."""
    _check_capacities_used(args)
    _check_outputs(args, ("results_path", "metrics_path", "timeline_path", "timeline_plot"))
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
            _warn("--summarize-trace without --trace-level: no trace, no summary")
        if args.counterfactual_k:
            _warn("--counterfactual-k without --trace-level: no trace, no candidates")
        return
    if args.engine == "jax":
        raise ConfigError("--trace-level", "traces are recorded by the reference engine "
                                           "(--engine reference); any JAX lane replays there bit "
                                           "for bit (`blisjax explain` re-runs a searched one)")
    if args.trace_out:
        check_output_dir("--trace-out", args.trace_out)


def cmd_run(args: Any) -> int:
    _check_workload_flags(args)
    _check_run_flags(args)
    cfg, base = _config_from_args(args)
    return _simulate(args, cfg, _generated_workload(args, cfg), base)


def cmd_replay(args: Any) -> int:
    _check_run_flags(args)
    cfg, base = _config_from_args(args)
    return _simulate(args, cfg, _trace_workload(args), base)


def cmd_parity(args: Any) -> int:
    """Reference vs JAX engine on one configuration: "identical" or the first divergence."""
    trace_given = bool(args.trace_header or args.trace_data)
    _check_workload_flags(args, trace_given)
    if trace_given and not (args.trace_header and args.trace_data):
        missing = "--trace-data" if args.trace_header else "--trace-header"
        raise ConfigError(missing, "is required with "
                          f"{'--trace-header' if args.trace_header else '--trace-data'}")
    cfg, base = _config_from_args(args)
    choice = _trace_workload(args) if trace_given else _generated_workload(args, cfg)
    workload = choice.workload
    _check_latency_model(args, cfg)
    from blisjax.engine.parity import first_divergence

    resolved = resolve_config(cfg)
    _log(args, f"base configuration: {base}; workload: {choice.source}")
    _check_capacity_for_workload(resolved, workload)
    _announce_compile_cache(args)
    with Progress(enabled=not args.quiet) as progress:
        progress.phase(f"simulating {workload.num_requests} requests (reference engine)")
        ref = _engine("reference")(resolved, workload)
        jx = _run_jax(resolved, workload, _capacities(args), progress)
        progress.phase("comparing the two engines' results")
        diff = first_divergence(ref, jx, workload.request_id)
    print(json.dumps({"requests": workload.num_requests,
                      "result": "identical" if diff is None else "divergent",
                      "first_divergence": diff}, indent=2))
    return 0 if diff is None else 1


def cmd_trace(args: Any) -> int:
    _check_workload_flags(args)
    _check_outputs(args, ("out_header", "out_data"))
    cfg, base = _base_config(args)
    if args.seed is not None:
        cfg = SimConfig(**{**cfg.__dict__, "seed": args.seed})
    choice = _generated_workload(args, cfg)
    _log(args, f"base configuration: {base}; workload: {choice.source}")
    write_trace(choice.workload, args.out_header, args.out_data)
    _log(args, f"wrote {choice.workload.num_requests} requests to {args.out_header} + "
               f"{args.out_data}")
    return 0


def cmd_export_llmd(args: Any) -> int:
    """The base configuration's routing (after the BLIS flags) as an llm-d
    EndpointPickerConfig; a policy with no llm-d counterpart is an error saying why."""
    from search.llmd import check_api_version, endpoint_picker_config

    check_api_version(args.llmd_api_version)
    _check_outputs(args, ("out",))
    cfg, base = _config_from_args(args)
    export = endpoint_picker_config(cfg, args.llmd_api_version,
                                    header=[f"blisjax export-llmd of {base}"])
    if export.text is None:
        raise ConfigError("policy.routing", f"no llm-d EndpointPickerConfig: {export.reason}")
    if export.left_out and not args.allow_approximation:
        raise ConfigError("policy.routing.scorers", f"{export.refusal()} (pass "
                          "--allow-approximation to write it anyway)")
    write_text_atomic(args.out, export.text)
    if export.left_out:
        print(f"blisjax export-llmd: warning: {args.out} is an approximation: "
              f"{'; '.join(export.left_out)}", file=sys.stderr)
    _log(args, f"wrote {args.out}")
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


def _fit_export(args: Any) -> int:
    import datetime

    from blisjax.latency.fit_export import export_latency_tables

    for dest in _FIT_ONLY:
        if getattr(args, dest) is not None:
            raise ConfigError(_flag(dest), "cannot be combined with --export-from-config "
                                           "(it is only used when fitting)")
    for dest in ("out_steps", "out_journeys"):
        if not getattr(args, dest):
            raise ConfigError(_flag(dest), "is required with --export-from-config")
    _check_outputs(args, ("out_steps", "out_journeys"))
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
    workload = _generated_workload(args, cfg).workload
    with Progress(enabled=not args.quiet) as progress:
        progress.phase(f"simulating {workload.num_requests} requests and writing the tables")
        n_steps, n_journeys, _ = export_latency_tables(
            resolve_config(cfg), workload, args.out_steps, args.out_journeys, start_ns=start_ns)
    _log(args, f"wrote {n_steps} steps to {args.out_steps} and {n_journeys} journeys to "
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
        read_journey_table,
        read_step_table,
    )

    for dest in _EXPORT_ONLY:
        if getattr(args, dest):
            raise ConfigError(_flag(dest), "is only used with --export-from-config")
    for dest in ("steps", "journeys"):
        if not getattr(args, dest):
            raise ConfigError(_flag(dest), "is required (or use --export-from-config)")
        check_input_file(_flag(dest), getattr(args, dest))
    _check_outputs(args, ("out", "report"))
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
    _log(args, f"fit {len(steps)} steps, {len(journeys)} journeys in "
               f"{time.perf_counter() - start:.2f} s; v1 acceptance: "
               f"{'pass' if report['acceptance']['pass'] else 'FAIL'}")
    print(json.dumps(report, indent=2))
    return 0


def cmd_sweep(args: Any) -> int:
    """Evaluate a grid of policy knobs (``search.cli.cmd_sweep``)."""
    from search.cli import cmd_sweep as sweep

    check_text_file("CONFIG", args.config)
    check_output_dir("--out", args.out)
    _announce_compile_cache(args)
    return sweep(args)


def cmd_search(args: Any) -> int:
    """Population-based policy search (``search.cli.cmd_search``)."""
    from search.cli import cmd_search as search

    check_text_file("CONFIG", args.config)
    check_text_file("--space", args.space)
    check_output_dir("--out", args.out)
    _announce_compile_cache(args)
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
    _log(args, f"wrote {', '.join(written)}")
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
    _log(args, f"candidate {done.candidate} ({', '.join(f'{k}={v!r}' for k, v in done.knobs.items())}), "
               f"workload seed {done.seed}: wrote "
               + ", ".join(str(p) for p in done.files.values()))
    print(done.text, end="")
    return 0


def _adapter_seeds(args: Any, config_path: str) -> tuple[int, ...]:
    from search.api import parse_seed_list

    if args.seeds is not None:
        return parse_seed_list("--seeds", args.seeds)
    return (load_config(config_path).seed,)


def cmd_gepa_evaluate(args: Any) -> int:
    """The GEPA adapter's score and feedback for one policy bundle (``search.adapters.gepa_adapter``);
    JSON on stdout, the feedback text also on stderr."""
    from search.adapters.gepa_adapter import gepa_evaluate

    check_text_file("--policy-config", args.policy_config)
    configs = args.config or [str(default_config_path())]
    for path in configs:
        check_text_file("--config", path)
    report = gepa_evaluate(args.policy_config, configs, _adapter_seeds(args, configs[0]),
                           args.objective, args.engine,
                           feedback_strategy=args.feedback_strategy)
    if not args.quiet:
        print(report.feedback, end="", file=sys.stderr)
    print(json.dumps({"cases": list(report.cases), "scores": list(report.scores),
                      "engines": list(report.engines), "errors": list(report.errors),
                      "mean_score": report.mean_score, "feedback_case": report.feedback_case,
                      "feedback": report.feedback}, indent=2, ensure_ascii=False))
    return 0


def cmd_openevolve_evaluate(args: Any) -> int:
    """The OpenEvolve evaluator's metrics and summary for one program
    (``search.adapters.openevolve_evaluator``); JSON on stdout, the summary also on stderr."""
    from search.adapters.openevolve_evaluator import openevolve_evaluate
    from search.api import parse_seed_list

    check_text_file("PROGRAM", args.program)
    check_text_file("--config", args.config)
    if not args.time_limit > 0:
        raise ConfigError("--time-limit", f"must be > 0 seconds, got {args.time_limit}")
    holdout = (parse_seed_list("--holdout-seeds", args.holdout_seeds)
               if args.holdout_seeds else ())
    report = openevolve_evaluate(args.program, args.config, _adapter_seeds(args, args.config),
                                 args.objective, args.stage, holdout_seeds=holdout,
                                 time_limit_s=args.time_limit)
    if not args.quiet and report.summary:
        print(report.summary, end="", file=sys.stderr)
    print(json.dumps({"metrics": report.metrics, "error": report.error,
                      "summary": report.summary}, indent=2, ensure_ascii=False))
    return 0


COMMANDS = {"run": cmd_run, "replay": cmd_replay, "trace": cmd_trace, "parity": cmd_parity,
            "fit-latency": cmd_fit_latency, "sweep": cmd_sweep, "search": cmd_search,
            "export-llmd": cmd_export_llmd, "plot": cmd_plot, "explain": cmd_explain,
            "gepa-evaluate": cmd_gepa_evaluate, "openevolve-evaluate": cmd_openevolve_evaluate}


# ---- JAX compile cache --------------------------------------------------------------------------

# Read by ``blisjax.engine.progcache`` (named here so the command need not import JAX to set it).
# ``blisjax.engine.progcache.ENV_DIRECTORY``, named again here: importing that module starts
# JAX, which must not happen before ``--cpu-devices`` is applied.
PROGRAM_CACHE_ENV = "BLISJAX_PROGRAM_CACHE_DIR"


def compile_cache_dir() -> Path:
    """Where compiled JAX programs are kept: ``$XDG_CACHE_HOME/blisjax/xla`` (default
    ``~/.cache/blisjax/xla``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "blisjax" / "xla"


def program_cache_dir() -> Path:
    """Where whole compiled engine programs are kept (``blisjax.engine.progcache``):
    ``programs`` next to ``compile_cache_dir()``."""
    return compile_cache_dir().parent / "programs"


class CompileCache(NamedTuple):
    """The compile-cache setting of this process."""

    path: Path | None  # None = off
    created: bool  # the directory was made by this process (its location is then logged)


def enable_compile_cache(disabled: bool) -> CompileCache:
    """Turn JAX's persistent compilation cache on (before JAX is imported) in
    ``compile_cache_dir()``, or in ``JAX_COMPILATION_CACHE_DIR`` when the user set it; off when
    ``disabled`` (``--no-compile-cache``) or ``BLISJAX_COMPILE_CACHE=0``, which win over that
    variable. The directory is private (mode 700): it holds executable code. The engine's
    program cache (``BLISJAX_PROGRAM_CACHE_DIR``, default ``program_cache_dir()``) follows the
    same switch."""
    if disabled or os.environ.get("BLISJAX_COMPILE_CACHE", "1").strip() in ("0", "", "off"):
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the opt-out wins
        os.environ.pop(PROGRAM_CACHE_ENV, None)
        return CompileCache(None, False)
    os.environ.setdefault(PROGRAM_CACHE_ENV, str(program_cache_dir()))
    chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if chosen:
        return CompileCache(Path(chosen), False)
    path = compile_cache_dir()
    created = not path.exists()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        os.environ.pop(PROGRAM_CACHE_ENV, None)
        return CompileCache(None, False)  # an unwritable home: run without the cache
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    return CompileCache(path, created)


_compile_cache = CompileCache(None, False)


def _announce_compile_cache(args: Any) -> None:
    """Print the compile cache's location the first time it is created."""
    if _compile_cache.created and not args.quiet:
        _log(args, f"keeping compiled JAX programs in {_compile_cache.path} and "
                   f"{os.environ.get(PROGRAM_CACHE_ENV)} (turn off with --no-compile-cache or "
                   "BLISJAX_COMPILE_CACHE=0)")


# ---- entry point --------------------------------------------------------------------------------


def _interrupted() -> int:
    """The exit status after Ctrl-C (the one-line message is already printed)."""
    if "jax" in sys.modules:
        # XLA's compile and run threads may still be working; a normal interpreter exit would
        # tear JAX down under them (observed: a segmentation fault after Ctrl-C during a
        # compile), so leave at once. Outputs are written atomically: none is half-written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    global _compile_cache
    try:
        args = build_parser().parse_args(argv)
        use_cpu_cores(args.cpu_devices)  # before any command imports JAX
        _compile_cache = enable_compile_cache(args.no_compile_cache)
        code = COMMANDS[args.command](args)
        return _interrupted() if code == EXIT_INTERRUPTED else code
    except KeyboardInterrupt:
        print("blisjax: interrupted", file=sys.stderr)
        return _interrupted()
    except BrokenPipeError:  # stdout closed early (`blisjax run | head`): nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- so the exit flush cannot fail
        return 1
    except (ConfigError, ValueError, FileNotFoundError, OSError) as exc:
        print(f"blisjax: error: {exc}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
