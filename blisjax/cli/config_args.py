"""The configuration and workload a command's flags ask for, and the checks of flags that would
have no effect in the given combination."""

from __future__ import annotations

from typing import Any, NamedTuple

from blisjax.cli.common import default_config_path, flag_name, warn
from blisjax.cli.files import check_input_file, reading
from blisjax.cli.flags import CAPACITIES, DISTRIBUTION_FLAGS
from blisjax.config import ConfigError, SimConfig, apply_blis_flags, load_config
from blisjax.workload import (
    distribution_spec,
    generate_workload,
    parse_workload_spec,
    read_trace,
    section_traces,
    workload_from_section,
)


def base_config(args: Any) -> tuple[SimConfig, str]:
    """(the base configuration, how it was chosen) by ``BASE_RULE``."""
    if args.config:
        with reading("--config", args.config):
            return load_config(args.config), f"--config {args.config}"
    return load_config(default_config_path()), "the shipped default experiment " \
                                               "(configs/default.yaml)"


def config_from_args(args: Any) -> tuple[SimConfig, str]:
    """The base configuration with --policy-config and the BLIS flags applied."""
    cfg, base = base_config(args)
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
            raise ConfigError(flag_name(dest), f"only used with --admission-policy token-bucket "
                                           f"(the admission policy here is {admission!r})")
    routing = cfg.policy.routing.policy
    if getattr(args, "routing_scorers", None) is not None and routing != "weighted":
        raise ConfigError("--routing-scorers", f"only used with --routing-policy weighted (the "
                                               f"routing policy here is {routing!r})")
    if getattr(args, "routing_tie_break", None) is not None and routing not in (
            "least-loaded", "weighted", "program"):
        raise ConfigError("--routing-tie-break", "only used with --routing-policy least-loaded, "
                                                 f"weighted or program (the routing policy here "
                                                 f"is {routing!r})")
    for site in ("routing", "admission", "priority"):
        policy = getattr(cfg.policy, site).policy
        if getattr(args, f"{site}_program", None) is not None and policy != "program":
            raise ConfigError(f"--{site}-program", f"only used with --{site}-policy program "
                                                   f"(the {site} policy here is {policy!r})")
    if not cfg.cluster.pd.enabled:
        for dest in ("pd_decider", "pd_prefix_threshold", "pd_transfer_bandwidth",
                     "pd_transfer_base_latency", "pd_transfer_contention",
                     "prefill_routing_scorers", "decode_routing_scorers"):
            if getattr(args, dest, None) is not None:
                raise ConfigError(flag_name(dest), "only used with P/D pools (--prefill-instances "
                                               "and --decode-instances, or "
                                               "--prefill-decode-instances)")


def _distribution_requested(args: Any) -> bool:
    return getattr(args, "workload", None) == "distribution"


def check_workload_flags(args: Any, trace_given: bool = False) -> None:
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


def generated_workload(args: Any, cfg: SimConfig) -> WorkloadChoice:
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


def trace_workload(args: Any, seed: int = 42) -> WorkloadChoice:
    """The trace of ``--trace-header``/``--trace-data``, replayed as ``--session-mode`` says;
    ``seed`` (the configuration's) seeds think times drawn from ``--think-time-dist``."""
    with reading("--trace-header", args.trace_header):
        from blisjax.workload.trace import read_trace_header

        read_trace_header(args.trace_header)
    mode = getattr(args, "session_mode", "fixed")
    think_ms = getattr(args, "think_time_ms", None)
    if think_ms is not None and (mode != "closed-loop" or think_ms < 0):
        raise ConfigError("--think-time-ms", "needs --session-mode closed-loop and a value "
                          f">= 0, got {think_ms}")
    dist_spec = getattr(args, "think_time_dist", None)
    dist = None
    if dist_spec is not None:
        if mode != "closed-loop" or think_ms is not None:
            raise ConfigError("--think-time-dist", "needs --session-mode closed-loop and no "
                              "--think-time-ms")
        from blisjax.workload.think import parse_think_time_dist

        try:
            dist = parse_think_time_dist(dist_spec)
        except ValueError as err:
            raise ConfigError("--think-time-dist", str(err)) from None
    with reading("--trace-data", args.trace_data):
        workload = read_trace(args.trace_header, args.trace_data, session_mode=mode,
                              think_time_us=None if think_ms is None else think_ms * 1000,
                              think_time_dist=dist, seed=seed)
    if workload.num_requests == 0:
        warn(f"--trace-data {args.trace_data}: the trace has no requests (a header line "
              "only); every count below is 0")
    return WorkloadChoice(workload, f"the trace {args.trace_data}")


def capacities_from_args(args: Any) -> dict[str, int]:
    """The JAX engine capacities given on the command line (``build_static`` arguments)."""
    return {cap.field: getattr(args, cap.field) for cap in CAPACITIES.values()
            if getattr(args, cap.field, None) is not None}


def check_capacities_used(args: Any) -> None:
    if getattr(args, "engine", "jax") != "jax":
        for cap in CAPACITIES.values():
            if getattr(args, cap.field, None) is not None:
                raise ConfigError(cap.flag, "is a JAX engine capacity: only used with "
                                  "--engine jax")


def check_latency_model(args: Any, cfg: SimConfig) -> None:
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
        warn("physics latency with the shipped all-zero placeholder coefficients: every "
              "latency below is meaningless")
