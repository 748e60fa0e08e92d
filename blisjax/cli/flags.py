"""Argument groups shared by the commands' parsers, and the flag tables they are built from
(JAX engine capacities, BLIS's ``--workload distribution`` flags)."""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

from blisjax.cli.common import ENGINES
from blisjax.trace.reflect import STRATEGIES as SUMMARY_STRATEGIES


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
    "events": Capacity("--max-events", "max_events",
                       "events one simulation handles (a run that would never end, e.g. an "
                       "instance stepping empty without a horizon, stops there)",
                       "64 per prompt and output token and per request, plus the horizon "
                       "in µs"),
}
#: Overflows that are not capacities of the program: what to do instead.
NOT_CAPACITIES = {
    "instance_slots": "with --blis-quirks every new instance takes a fresh slot (BLIS never "
                      "reuses one) and {times} scale-up instance(s) found none; raise "
                      "policy.autoscaler.max_replicas",
    "lifecycle_draws": "a random lifecycle delay stream needed more than its 64 stored draws "
                       "{times} time(s); run it with --engine reference",
    "session_rounds": "a concurrency user would have sent more requests than the workload "
                      "holds for it ({times} time(s)); raise its client's rounds_per_user in "
                      "the workload spec, or bound the run (num_requests, a horizon)",
}
#: The setting each overflow a reference run can flag is about, for its error.
NOT_CAPACITY_FIELDS = {"instance_slots": "policy.autoscaler.max_replicas",
                       "session_rounds": "workload.clients[].rounds_per_user"}


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


def add_global_options(p: argparse.ArgumentParser, top: bool) -> None:
    """Options accepted both before and after the subcommand. On a subcommand they default to
    SUPPRESS, so one given before the subcommand is not reset by the subcommand's parser."""
    def default(value: Any) -> dict[str, Any]:
        return {"default": value if top else argparse.SUPPRESS}

    g = p.add_argument_group("global options (before or after the command)")
    g.add_argument("--cpu-devices", type=_positive_int, metavar="N", **default(None),
                   help="split the CPU into N XLA devices for the JAX engine, which runs one "
                        "event loop per device (default: one per usable core; 1 keeps XLA's "
                        "single device; an XLA_FLAGS device count takes precedence)")
    g.add_argument("--device", choices=("cpu", "gpu"), **default(None),
                   help="where the JAX engine runs: cpu, or gpu (JAX's CUDA plugin: pip install "
                        "-e '.[cuda13]'); default: what JAX finds, a GPU first")
    g.add_argument("--quiet", action="store_true", **default(False),
                   help="no progress line and no informational logs on stderr (warnings and "
                        "errors still print)")
    g.add_argument("--no-compile-cache", action="store_true", **default(False),
                   help="do not keep compiled JAX programs on disk (default: kept in "
                        "$XDG_CACHE_HOME/blisjax/{xla,programs} or ~/.cache/blisjax/...; also "
                        "BLISJAX_COMPILE_CACHE=0; an explicit JAX_COMPILATION_CACHE_DIR wins)")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="blisjax YAML experiment (default: the shipped default experiment, "
                        "configs/default.yaml)")


def add_outputs(p: argparse.ArgumentParser) -> None:
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




def add_trace_flags(p: argparse.ArgumentParser) -> None:
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


def add_engine_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="reference",
                   help="simulation engine: reference (default) or jax (bit-identical, compiled)")


def add_physics_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-placeholder-coefficients", action="store_true",
                   help="run --latency-model physics with the shipped illustrative all-zero "
                        "coefficients (refused otherwise: its latencies are meaningless)")


def add_capacity_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "JAX engine capacities (a run that exceeds one fails, naming its flag)")
    for cap in CAPACITIES.values():
        g.add_argument(cap.flag, type=_positive_int, metavar="N", dest=cap.field,
                       help=f"{cap.holds} (default: {cap.default})")


def add_workload_spec_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload-spec", metavar="FILE",
                   help="BLIS workload-spec v2 YAML; replaces the base configuration's workload")


def add_distribution_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "BLIS --workload distribution (its flags are only used with --workload distribution)")
    g.add_argument("--workload", choices=("distribution",),
                   help="synthesize a single-client workload from the flags below; replaces "
                        "the base configuration's workload")
    for f in DISTRIBUTION_FLAGS:
        g.add_argument(f.flag, dest=f.dest, type=f.kind, help=f.help,
                       metavar="N" if f.kind is int else "X")


def add_trace_inputs(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--trace-header", required=required, metavar="FILE",
                   help="TraceV2 header YAML (trace_version 2 or 3, time_unit microseconds)")
    p.add_argument("--trace-data", required=required, metavar="FILE",
                   help="TraceV2 CSV, one request per row (BLIS's columns)")
    p.add_argument("--session-mode", choices=("fixed", "closed-loop"), default="fixed",
                   help="fixed: every row arrives at its own time (default); closed-loop: a "
                        "session's round 0 arrives from the trace and each later round a think "
                        "time after its predecessor completes, its prompt the conversation so "
                        "far (header session_context_growth: accumulate)")
    p.add_argument("--think-time-ms", type=int, metavar="MS",
                   help="closed-loop: every follow-up's think time, ms (default: the trace's "
                        "think_time_us column, else its arrival gaps)")
    p.add_argument("--think-time-dist", metavar="SPEC",
                   help="closed-loop: follow-ups' think times drawn from a distribution, "
                        "e.g. lognormal:mu=2.0,sigma=0.6,min=3s,max=30s or "
                        "constant:value=500ms (not with --think-time-ms)")


def add_adapter_scoring(p: argparse.ArgumentParser, objective: str) -> None:
    p.add_argument("--seeds", metavar="S1,S2,...",
                   help="workload seeds (default: the experiment's seed)")
    p.add_argument("--objective", default=objective, metavar="EXPR",
                   help=f"the score, higher is better: an expression over the metrics "
                        f"(default {objective})")
