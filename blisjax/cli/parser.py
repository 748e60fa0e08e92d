"""``build_parser``: the top-level parser and each command's parser."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from blisjax import __version__
from blisjax.cli.common import BASE_RULE, LLMD_API_VERSIONS, LLMD_DEFAULT_API_VERSION
from blisjax.cli.flags import (
    add_adapter_scoring,
    add_capacity_flags,
    add_config_flag,
    add_distribution_flags,
    add_engine_flag,
    add_global_options,
    add_outputs,
    add_physics_flags,
    add_trace_flags,
    add_trace_inputs,
    add_workload_spec_flag,
)
from blisjax.config import add_blis_flags
from blisjax.trace.reflect import STRATEGIES as SUMMARY_STRATEGIES
from search.adapters.core import ENGINES as ADAPTER_ENGINES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blisjax",
        description="Simulate LLM-inference serving clusters (BLIS-compatible).",
        epilog=BASE_RULE)
    parser.add_argument("--version", action="version", version=f"blisjax {__version__}")
    add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=BASE_RULE)
        add_global_options(p, top=False)
        return p

    run = command("run", "simulate a generated workload (default: the shipped experiment)")
    add_config_flag(run)
    add_engine_flag(run)
    add_outputs(run)
    add_trace_flags(run)
    add_workload_spec_flag(run)
    add_physics_flags(run)
    add_blis_flags(run)
    add_distribution_flags(run)
    add_capacity_flags(run)

    replay = command("replay", "replay a BLIS TraceV2 trace exactly")
    add_trace_inputs(replay, required=True)
    add_config_flag(replay)
    add_engine_flag(replay)
    add_outputs(replay)
    add_trace_flags(replay)
    add_physics_flags(replay)
    add_blis_flags(replay)
    _set_help(replay, "--seed", "master seed: the routers' random tie-breaks and think times "
                                "drawn from --think-time-dist (the trace fixes every request)")
    add_capacity_flags(replay)

    parity = command("parity", "run both engines on one configuration and report "
                               "\"identical\" or the first divergent request and field")
    add_config_flag(parity)
    add_trace_inputs(parity, required=False)
    add_workload_spec_flag(parity)
    add_physics_flags(parity)
    add_blis_flags(parity)
    add_distribution_flags(parity)
    add_capacity_flags(parity)

    trace = command("trace", "generate a workload and write it as a TraceV2 trace (header "
                             "YAML + CSV) that `replay` and BLIS read")
    add_config_flag(trace)
    add_workload_spec_flag(trace)
    trace.add_argument("--seed", type=int,
                       help="workload seed (default: the base configuration's seed)")
    add_distribution_flags(trace)
    trace.add_argument("--out-header", required=True, metavar="FILE",
                       help="write the trace header YAML here")
    trace.add_argument("--out-data", required=True, metavar="FILE",
                       help="write the trace CSV here")

    export = command("export-llmd", "write a configuration's routing as an llm-d "
                                    "EndpointPickerConfig (what `search` writes as "
                                    "endpoint_picker.yaml)")
    add_config_flag(export)
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
                      help="the candidate: a BLIS policy bundle (as `run --policy-config`; "
                           "program sections, policy: program, run as JAX lanes)")
    gepa.add_argument("--config", action="append", metavar="FILE",
                      help="an experiment to score it on (repeatable; default the shipped "
                           "default experiment)")
    add_adapter_scoring(gepa, "fitness")
    gepa.add_argument("--engine", choices=ADAPTER_ENGINES, default="auto",
                      help="auto (default): the JAX engine when the policy is a set of "
                           "per-lane knobs of the experiment, else the reference engine")
    gepa.add_argument("--feedback-strategy", choices=SUMMARY_STRATEGIES,
                      default=SUMMARY_STRATEGIES[0], help="default issue_focused")

    evolve = command("openevolve-evaluate", "score a candidate file as the OpenEvolve "
                                            "evaluator does (policy programs: JAX runs; "
                                            "Python: sandboxed reference runs), with its "
                                            "summary artifact")
    evolve.add_argument("program", metavar="PROGRAM",
                        help="a programs file (YAML: routing / admission / priority, each a "
                             "policy program) or a Python file defining policy() (a policy "
                             "bundle) or route_scores() / priority() (a code policy)")
    evolve.add_argument("--config", required=True, metavar="FILE", help="the experiment")
    add_adapter_scoring(evolve, "slo_attainment")
    evolve.add_argument("--holdout-seeds", metavar="S1,S2,...",
                        help="stage 2 also scores these seeds (reported apart)")
    evolve.add_argument("--stage", type=int, choices=(1, 2), default=2,
                        help="1: the first requests of one seed (the cascade's cheap filter); "
                             "2 (default): the full workload on every seed")
    evolve.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                        help="wall seconds the sandboxed run may take (default 60)")
    evolve.add_argument("--kind", choices=("auto", "bundle", "code", "programs"),
                        default="auto", help="what PROGRAM is; auto (default): a YAML mapping "
                                             "naming a site is a programs file, else Python")
    evolve.add_argument("--engine", choices=ADAPTER_ENGINES, default="auto",
                        help="programs files: auto (default) and jax run the JAX engine, "
                             "reference the reference engine")

    _add_fit_parser(command("fit-latency",
                            "fit physics (and blackbox) latency coefficients from step/journey "
                            "tables, or export such tables from a simulation "
                            "(--export-from-config)"))
    _add_search_parsers(sub, command)
    return parser


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
FIT_ONLY = ("steps", "journeys", "config", "out", "report", "lambdas", "gammas", "folds",
             "holdout", "warmup_steps", "outlier_factor", "alpha_target")
#: fit-latency flags used only with --export-from-config.
EXPORT_ONLY = ("out_steps", "out_journeys", "trace_start")


def _add_search_parsers(sub: Any, command: Callable[[str, str], Any]) -> None:
    """`sweep` and `search` (the policy-search package ``search/``)."""
    from search.cli import add_search_parser, add_sweep_parser

    for add in (add_sweep_parser, add_search_parser):
        p = add(sub)
        add_global_options(p, top=False)
