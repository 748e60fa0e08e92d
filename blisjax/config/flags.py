"""BLIS-named command-line flags and how they override a :class:`SimConfig`.

All flags default to None so "not given" is detectable. Precedence, as in BLIS: the config file,
then ``--policy-config`` (a BLIS policy bundle), then the explicit flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blisjax.config._checks import ConfigError, check_float
from blisjax.config.sim import (
    ADMISSION_POLICIES,
    LATENCY_MODELS,
    PD_DECIDERS,
    PREEMPTION_POLICIES,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    SCHEDULER_POLICIES,
    TIE_BREAKS,
    ScorerWeight,
    SimConfig,
)
from blisjax.config.yaml_io import (
    BLIS_INVERTED_SLO,
    apply_blis_bundle,
    blis_priority_overrides,
)


def _parse_number(flag: str, text: Any, kind: type) -> Any:
    if isinstance(text, kind) and not isinstance(text, bool):
        return text
    try:
        return kind(str(text).strip())
    except ValueError:
        raise ConfigError(
            flag, f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def _parse_coeffs(flag: str, text: Any) -> tuple[float, ...]:
    if isinstance(text, (list, tuple)):
        return tuple(_parse_number(flag, x, float) for x in text)
    parts = str(text).split(",")
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(
            flag, f"expected comma-separated numbers like 1.5,2,0, got {text!r}"
        ) from None


def _parse_scorers(flag: str, text: Any) -> tuple[ScorerWeight, ...]:
    usage = f"expected name:weight pairs like queue-depth:2,kv-utilization:1, got {text!r}"
    out = []
    for item in str(text).split(","):
        name, sep, weight_text = item.partition(":")
        try:
            weight = float(weight_text)
        except ValueError:
            raise ConfigError(flag, usage) from None
        if not sep:
            raise ConfigError(flag, usage)
        try:
            out.append(ScorerWeight(name.strip(), weight))
        except ConfigError as err:
            raise ConfigError(flag, f"{err.path}: {err.problem}") from err
    return tuple(out)


@dataclass(frozen=True)
class BlisFlag:
    """One BLIS flag: its spellings, argparse dest, value parser and the config field it sets.

    ``target`` is the dotted SimConfig path (``engine.tensor_parallel_size``); "" means special.
    """

    names: tuple[str, ...]
    dest: str
    parse: Callable[[str, Any], Any]
    target: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return self.names[0]


def _int(flag: str, v: Any) -> int:
    return _parse_number(flag, v, int)


def _float(flag: str, v: Any) -> float:
    return _parse_number(flag, v, float)


def _str(flag: str, v: Any) -> str:
    return str(v)


def _offload_threshold(flag: str, v: Any) -> float:
    """BLIS's ``--kv-offload-threshold``: checked (a fraction in [0, 1]) and then ignored, as
    BLIS ignores it (docs/semantics.md §3.8)."""
    value = _parse_number(flag, v, float)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(flag, f"must be in [0, 1], got {value}")
    return value


def _switch(flag: str, v: Any) -> bool:
    """A bare boolean flag: present means on (True or "true" as a value, as BLIS's JSON
    records write it)."""
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise ConfigError(flag, f"expected true or false, got {v!r}")


#: BLIS's per-pool P/D overrides (``--prefill-tp``, ``--decode-hardware``, ...): refused.
PER_POOL_OVERRIDES = ("tp", "hardware", "latency-model", "max-model-len")


def _per_pool_override(flag: str, v: Any) -> Any:
    raise ConfigError(flag, "per-pool TP, hardware, latency model and max-model-len are not "
                            "modelled: every instance uses the global settings (--tp, "
                            "--hardware, --latency-model, --max-model-len)")


def _tick_interval(flag: str, v: Any) -> int:
    """BLIS's ``--dispatch-tick-interval``: µs, >= 0; 0 means BLIS's default of 1000."""
    value = _parse_number(flag, v, int)
    if value < 0:
        raise ConfigError(flag, f"must be >= 0 (0 = 1000 µs, BLIS's default), got {value}")
    return value or 1000


def _unmodelled(default: Any, what: str) -> Callable[[str, Any], Any]:
    """A BLIS flow-control flag blisjax does not model: its default value is accepted (and
    changes nothing), any other is refused naming what is missing."""
    def parse(flag: str, v: Any) -> Any:
        value = v
        if isinstance(default, bool):
            value = _switch(flag, v)
        elif isinstance(default, float):
            value = _parse_number(flag, v, float)
        elif isinstance(default, int):
            value = _parse_number(flag, v, int)
        else:
            value = str(v).strip()
        if value != default:
            raise ConfigError(flag, f"{what} is not modelled (docs/limitations.md); only "
                              f"{default!r} is accepted, got {v!r}")
        return value
    parse.is_switch = isinstance(default, bool)  # a bare flag, as BLIS's
    return parse


#: BLIS's flow-control flags blisjax does not model: (flag, default, what).
UNMODELLED_FLOW_CONTROL = (
    ("--per-band-capacity", 0, "a per-priority-band capacity"),
    ("--usage-limit-threshold", 1.0, "per-band head-of-line ceilings"),
    ("--fairness-policy", "global-strict", "round-robin fairness among tenants"),
    ("--request-ttl", 0, "a gateway-queue TTL"),
    ("--queue-shedding", False, "cross-band shedding at a full gateway queue"),
    ("--in-flight-eviction", False, "in-flight eviction of sheddable requests"),
    ("--slo-targets", "", "slo-deadline dispatch targets"),
)


BLIS_FLAGS: tuple[BlisFlag, ...] = (
    BlisFlag(
        ("--model",),
        "model",
        _str,
        "model",
        "model id (org/Name), shipped name or config.json path",
    ),
    BlisFlag(("--hardware",), "hardware", _str, "hardware", "GPU name in hardware_config.json"),
    BlisFlag(("--tp",), "tp", _int, "engine.tensor_parallel_size", "tensor parallelism"),
    BlisFlag(
        ("--max-num-running-reqs", "--max-num-seqs"),
        "max_num_running_reqs",
        _int,
        "engine.max_num_running_reqs",
        "max requests in the running batch",
    ),
    BlisFlag(
        ("--max-num-scheduled-tokens", "--max-num-batched-tokens"),
        "max_num_scheduled_tokens",
        _int,
        "engine.max_num_scheduled_tokens",
        "token budget per step",
    ),
    BlisFlag(
        ("--total-kv-blocks",),
        "total_kv_blocks",
        _int,
        "engine.total_kv_blocks",
        "KV blocks per instance",
    ),
    BlisFlag(
        ("--block-size-in-tokens",),
        "block_size_in_tokens",
        _int,
        "engine.block_size_tokens",
        "tokens per KV block",
    ),
    BlisFlag(
        ("--long-prefill-token-threshold",),
        "long_prefill_token_threshold",
        _int,
        "engine.long_prefill_token_threshold",
        "max prefill tokens per request per step (0 = off)",
    ),
    BlisFlag(
        ("--max-model-len",),
        "max_model_len",
        _int,
        "engine.max_model_len",
        "max tokens per request (0 = unlimited)",
    ),
    BlisFlag(
        ("--gpu-memory-utilization",),
        "gpu_memory_utilization",
        _float,
        "engine.gpu_memory_utilization",
        "HBM fraction for vLLM, in (0, 1]",
    ),
    BlisFlag(
        ("--kv-cpu-blocks",),
        "kv_cpu_blocks",
        _int,
        "engine.kv_cpu_blocks",
        "CPU-tier KV blocks per instance (0 = no CPU tier)",
    ),
    BlisFlag(
        ("--kv-transfer-bandwidth",),
        "kv_transfer_bandwidth",
        _float,
        "engine.kv_transfer_bandwidth",
        "CPU→GPU reload bandwidth, tokens per µs",
    ),
    BlisFlag(
        ("--kv-transfer-base-latency",),
        "kv_transfer_base_latency",
        _int,
        "engine.kv_transfer_base_latency_us",
        "fixed cost per reloaded block, µs",
    ),
    BlisFlag(
        ("--kv-offload-threshold",),
        "kv_offload_threshold",
        _offload_threshold,
        "",
        "accepted in [0, 1] and ignored, as BLIS ignores it",
    ),
    BlisFlag(
        ("--latency-model",),
        "latency_model",
        _str,
        "latency.model",
        "latency model",
        choices=LATENCY_MODELS,
    ),
    BlisFlag(
        ("--alpha-coeffs",),
        "alpha_coeffs",
        _parse_coeffs,
        "latency.alpha_coeffs",
        "α coefficients",
        "A,B,C",
    ),
    BlisFlag(
        ("--beta-coeffs",),
        "beta_coeffs",
        _parse_coeffs,
        "latency.beta_coeffs",
        "β coefficients",
        "A,B,C",
    ),
    BlisFlag(
        ("--vllm-version",),
        "vllm_version",
        _str,
        "latency.vllm_version",
        "blackbox: vLLM image of the shipped coefficients (e.g. vllm/vllm-openai:v0.8.4)",
        "IMAGE",
    ),
    BlisFlag(
        ("--coefficients-file",),
        "coefficients_file",
        _str,
        "latency.coefficients_file",
        "physics coefficient YAML (from `blisjax fit-latency --out`)",
        "FILE",
    ),
    BlisFlag(
        ("--num-instances",),
        "num_instances",
        _int,
        "cluster.num_instances",
        "instances behind the router",
    ),
    BlisFlag(
        ("--admission-latency",),
        "admission_latency",
        _int,
        "cluster.admission_latency_us",
        "admission delay, µs",
    ),
    BlisFlag(
        ("--routing-latency",),
        "routing_latency",
        _int,
        "cluster.routing_latency_us",
        "routing delay, µs",
    ),
    BlisFlag(
        ("--snapshot-refresh-interval",),
        "snapshot_refresh_interval",
        _int,
        "cluster.snapshot_refresh_interval_us",
        "router signal refresh interval, µs (0 = live)",
    ),
    BlisFlag(
        ("--model-autoscaler-interval-us",),
        "model_autoscaler_interval_us",
        _float,
        "",
        "autoscaler tick period, µs (BLIS's; > 0 runs blis-saturation unless the "
        "configuration names another autoscaler; 0 = none)",
    ),
    BlisFlag(
        ("--cache-signal-delay",),
        "cache_signal_delay",
        _int,
        "cluster.cache_signal_delay_us",
        "prefix-cache signal staleness for precise-prefix-cache/no-hit-lru, µs (0 = live)",
    ),
    BlisFlag(
        ("--routing-policy",),
        "routing_policy",
        _str,
        "policy.routing.policy",
        "routing policy",
        choices=ROUTING_POLICIES,
    ),
    BlisFlag(
        ("--routing-program",),
        "routing_program",
        _str,
        "policy.routing.program",
        "with --routing-policy program: each candidate's score, an expression (blisjax; "
        "docs/policy-programs.md)",
        "EXPR",
    ),
    BlisFlag(
        ("--routing-scorers",),
        "routing_scorers",
        _parse_scorers,
        "policy.routing.scorers",
        "weighted-routing scorers",
        "NAME:W,...",
    ),
    BlisFlag(
        ("--routing-tie-break",),
        "routing_tie_break",
        _str,
        "policy.routing.tie_break",
        "ties of least-loaded/weighted routing (blisjax; BLIS draws randomly)",
        choices=TIE_BREAKS,
    ),
    BlisFlag(
        ("--admission-policy",),
        "admission_policy",
        _str,
        "policy.admission.policy",
        "admission policy",
        choices=ADMISSION_POLICIES,
    ),
    BlisFlag(
        ("--admission-program",),
        "admission_program",
        _str,
        "policy.admission.program",
        "with --admission-policy program: admit iff this expression is > 0 (blisjax)",
        "EXPR",
    ),
    BlisFlag(
        ("--token-bucket-capacity",),
        "token_bucket_capacity",
        _float,
        "policy.admission.token_bucket_capacity",
        "token-bucket size, tokens",
    ),
    BlisFlag(
        ("--token-bucket-refill-rate",),
        "token_bucket_refill_rate",
        _float,
        "policy.admission.token_bucket_refill_rate",
        "token-bucket refill, tokens/s",
    ),
    BlisFlag(
        ("--priority-policy",),
        "priority_policy",
        _str,
        "policy.priority.policy",
        "priority policy (inverted-slo = slo-based with a negative age weight)",
        choices=tuple(PRIORITY_POLICIES) + (BLIS_INVERTED_SLO,),
    ),
    BlisFlag(
        ("--priority-program",),
        "priority_program",
        _str,
        "policy.priority.program",
        "with --priority-policy program: the priority, an expression (blisjax)",
        "EXPR",
    ),
    BlisFlag(
        ("--scheduler",),
        "scheduler",
        _str,
        "policy.scheduler.policy",
        "instance scheduler",
        choices=SCHEDULER_POLICIES,
    ),
    BlisFlag(
        ("--preemption-policy",),
        "preemption_policy",
        _str,
        "engine.preemption_policy",
        "preemption victim",
        choices=PREEMPTION_POLICIES,
    ),
    BlisFlag(
        ("--prefill-instances",),
        "prefill_instances",
        _int,
        "cluster.pd.prefill_instances",
        "P/D: prefill-pool instances (the first ones by index)",
    ),
    BlisFlag(
        ("--decode-instances",),
        "decode_instances",
        _int,
        "cluster.pd.decode_instances",
        "P/D: decode-pool instances (after the prefill ones)",
    ),
    BlisFlag(
        ("--prefill-decode-instances",),
        "prefill_decode_instances",
        _int,
        "cluster.pd.shared_instances",
        "P/D: instances in both pools (after the decode ones)",
    ),
    BlisFlag(
        ("--pd-decider",),
        "pd_decider",
        _str,
        "cluster.pd.decider",
        "P/D: which requests are disaggregated",
        choices=PD_DECIDERS,
    ),
    BlisFlag(
        ("--pd-prefix-threshold",),
        "pd_prefix_threshold",
        _int,
        "cluster.pd.prefix_threshold_tokens",
        "P/D: uncached prompt tokens above which prefix-threshold disaggregates",
    ),
    BlisFlag(
        ("--pd-transfer-bandwidth",),
        "pd_transfer_bandwidth",
        _float,
        "cluster.pd.transfer_bandwidth_gbps",
        "P/D: KV transfer bandwidth, GB/s",
    ),
    BlisFlag(
        ("--pd-transfer-base-latency",),
        "pd_transfer_base_latency",
        _float,
        "cluster.pd.transfer_base_latency_ms",
        "P/D: fixed latency per KV transfer, ms",
    ),
    BlisFlag(
        ("--pd-transfer-contention",),
        "pd_transfer_contention",
        _switch,
        "cluster.pd.transfer_contention",
        "P/D: concurrent KV transfers share the bandwidth",
    ),
    BlisFlag(
        ("--prefill-routing-scorers",),
        "prefill_routing_scorers",
        _parse_scorers,
        "cluster.pd.prefill_scorers",
        "P/D: weighted-routing scorers of the prefill pool",
        "NAME:W,...",
    ),
    BlisFlag(
        ("--decode-routing-scorers",),
        "decode_routing_scorers",
        _parse_scorers,
        "cluster.pd.decode_scorers",
        "P/D: weighted-routing scorers of the decode pool",
        "NAME:W,...",
    ),
    *(BlisFlag((f"--{pool}-{what}",), f"{pool}_{what.replace('-', '_')}", _per_pool_override,
               "", f"P/D: per-pool {what} (not modelled: refused)")
      for pool in ("prefill", "decode") for what in PER_POOL_OVERRIDES),
    BlisFlag(
        ("--flow-control",),
        "flow_control",
        _switch,
        "cluster.gateway.enabled",
        "gateway queue with saturation-gated dispatch (BLIS flow control)",
    ),
    BlisFlag(
        ("--saturation-detector",),
        "saturation_detector",
        _str,
        "cluster.gateway.saturation_detector",
        "gateway saturation detector",
        choices=("never", "utilization", "concurrency"),
    ),
    BlisFlag(
        ("--queue-depth-threshold",),
        "queue_depth_threshold",
        _float,
        "cluster.gateway.queue_depth_threshold",
        "utilization detector: queue depth per instance at saturation",
    ),
    BlisFlag(
        ("--kv-cache-util-threshold",),
        "kv_cache_util_threshold",
        _float,
        "cluster.gateway.kv_cache_util_threshold",
        "utilization detector: KV utilization at saturation",
    ),
    BlisFlag(
        ("--max-concurrency",),
        "max_concurrency",
        _int,
        "cluster.gateway.max_concurrency",
        "concurrency detector: in-flight requests per instance at saturation",
    ),
    BlisFlag(
        ("--dispatch-order",),
        "dispatch_order",
        _str,
        "cluster.gateway.dispatch_order",
        "gateway queue dispatch order",
        choices=("fifo", "priority"),
    ),
    BlisFlag(
        ("--max-gateway-queue-depth",),
        "max_gateway_queue_depth",
        _int,
        "cluster.gateway.max_queue_depth",
        "gateway queue capacity, requests (0 = unlimited); a full queue rejects",
    ),
    BlisFlag(
        ("--dispatch-tick-interval",),
        "dispatch_tick_interval",
        _tick_interval,
        "cluster.gateway.dispatch_tick_interval_us",
        "period of gateway dispatch ticks, µs (0 = 1000)",
        "N",
    ),
    *(BlisFlag((flag,), flag.lstrip("-").replace("-", "_"), _unmodelled(default, what), "",
               f"flow control: {what} (not modelled: only {default!r})")
      for flag, default, what in UNMODELLED_FLOW_CONTROL),
    BlisFlag(
        ("--blis-quirks",),
        "blis_quirks",
        _switch,
        "compat.blis_quirks",
        "reproduce BLIS's own behaviour where it departs from a real cluster (README)",
    ),
    BlisFlag(("--seed",), "seed", _int, "seed", "master seed"),
    BlisFlag(("--horizon",), "horizon", _int, "horizon_us", "simulation horizon, µs"),
    BlisFlag(("--policy-config",), "policy_config", _str, "", "BLIS policy bundle YAML", "PATH"),
)
_BY_NAME = {name.lstrip("-"): f for f in BLIS_FLAGS for name in f.names}
_BY_NAME.update({f.dest: f for f in BLIS_FLAGS})
_BY_TARGET = {f.target: f for f in BLIS_FLAGS if f.target}


_METAVARS = {int: "N", float: "X"}


def add_blis_flags(parser: argparse.ArgumentParser) -> None:
    """Add the BLIS flags (all defaulting to None) to ``parser``.

    Policy names are listed in the help and checked by the configuration (so an unknown name is
    reported like any other bad value, naming the flag and the choices). Numbers are parsed by
    argparse (a malformed ``--tp x`` exits with argparse's usage error);
    lists (``--alpha-coeffs``, ``--routing-scorers``) are parsed by :func:`apply_blis_flags`.
    """
    group = parser.add_argument_group("BLIS-compatible flags")
    for f in BLIS_FLAGS:
        if f.parse is _switch or getattr(f.parse, "is_switch", False):
            group.add_argument(*f.names, dest=f.dest, action="store_const", const=True,
                               default=None, help=f.help)
            continue
        kind = {_int: int, _float: float}.get(f.parse, str)
        help_text = f.help
        if f.choices:
            help_text += ": " + " | ".join(f.choices)
        group.add_argument(
            *f.names,
            dest=f.dest,
            type=kind,
            default=None,
            help=help_text,
            metavar=f.metavar or ("NAME" if f.choices else _METAVARS.get(kind)),
        )


def _override_tree(values: Mapping[str, Any]) -> dict[str, Any]:
    """Nested {section: {field: value}} of the given flag values (parsed)."""
    tree: dict[str, Any] = {}
    for key, raw in values.items():
        flag = _BY_NAME.get(key.lstrip("-"))
        if flag is None:
            raise ConfigError(
                key, f"unknown BLIS flag; known: {', '.join(f.flag for f in BLIS_FLAGS)}"
            )
        if raw is None:
            continue
        value = flag.parse(flag.flag, raw)  # checked even when nothing takes it
        if not flag.target:
            continue
        node = tree
        *sections, leaf = flag.target.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree


def _latency_overrides(cfg: SimConfig, given: dict[str, Any]) -> dict[str, Any]:
    # Coefficients belong to one latency model: switching model drops inherited ones.
    if given.get("model", cfg.latency.model) != cfg.latency.model:
        given = {"alpha_coeffs": None, "beta_coeffs": None, "coefficients_file": None,
                 "vllm_version": None, **given}
    # --vllm-version asks for an entry of the shipped table, so it replaces coefficients
    # inherited from the file unless --alpha-coeffs/--beta-coeffs are given too.
    if "vllm_version" in given and "alpha_coeffs" not in given and "beta_coeffs" not in given:
        given = {"alpha_coeffs": None, "beta_coeffs": None, **given}
    return given


def _apply_tree(cfg: SimConfig, tree: dict[str, Any]) -> SimConfig:
    policy_tree = tree.pop("policy", {})
    if "priority" in policy_tree:
        policy_tree["priority"] = blis_priority_overrides(
            policy_tree["priority"], cfg.policy.priority
        )
    policy = dataclasses.replace(
        cfg.policy,
        **{
            name: dataclasses.replace(getattr(cfg.policy, name), **v)
            for name, v in policy_tree.items()
        },
    )
    if "latency" in tree:
        tree["latency"] = _latency_overrides(cfg, tree["latency"])
    for nested in ("pd", "gateway"):  # nested sections: the flags given update them
        if nested in tree.get("cluster", {}):
            tree["cluster"][nested] = dataclasses.replace(getattr(cfg.cluster, nested),
                                                          **tree["cluster"][nested])
    sections = {
        name: dataclasses.replace(getattr(cfg, name), **tree.pop(name))
        for name in ("engine", "latency", "cluster", "compat")
        if name in tree
    }
    return dataclasses.replace(cfg, policy=policy, **sections, **tree)


def _blame_flag(err: ConfigError) -> ConfigError:
    target = err.path.split("[")[0]
    while target and target not in _BY_TARGET:
        target = target.rpartition(".")[0]
    flag = _BY_TARGET.get(target)
    return ConfigError(flag.flag, f"{err.path}: {err.problem}") if flag else err


def apply_blis_flag_values(cfg: SimConfig, values: Mapping[str, Any]) -> SimConfig:
    """Override ``cfg`` with BLIS flag values keyed by flag name (``"tp"``, ``"--tp"``) or dest.

    Values may be typed (``4``) or text as on a command line (``"4"``, ``"1.5,2,0"``); None means
    not given. ``policy-config`` (a bundle path) is applied before the other flags.

    Raises:
      ConfigError: naming the flag whose value is malformed or invalid.
    """
    bundle = next(
        (v for k, v in values.items() if k.lstrip("-") in ("policy-config", "policy_config")), None
    )
    if bundle is not None:
        cfg = apply_blis_bundle(cfg, str(bundle))
    tree = _override_tree(values)
    try:
        cfg = _apply_tree(cfg, tree)
    except ConfigError as err:
        raise _blame_flag(err) from err
    given = {k.lstrip("-").replace("_", "-") for k, v in values.items() if v is not None}
    if "model-autoscaler-interval-us" in given:  # overrides the bundle's interval (BLIS)
        cfg = _autoscaler_interval(cfg, next(v for k, v in values.items() if k.lstrip("-")
                                             .replace("_", "-") == "model-autoscaler-interval-us"))
    if cfg.cluster.gateway.enabled and "admission-policy" in given \
            and cfg.policy.admission.policy != "always-admit":
        raise ConfigError("--admission-policy", "BLIS's --flow-control replaces the admission "
                          "policy by the gateway queue (blisjax composes them, docs/semantics.md "
                          "Decision 21): give only --flow-control, or set policy.admission in a "
                          "configuration file")
    if "pd-prefix-threshold" in given and cfg.cluster.pd.decider != "prefix-threshold":
        raise ConfigError("--pd-prefix-threshold", "is only used with --pd-decider "
                          f"prefix-threshold (the decider is {cfg.cluster.pd.decider!r})")
    return cfg


def _autoscaler_interval(cfg: SimConfig, raw: Any) -> SimConfig:
    """BLIS's ``--model-autoscaler-interval-us``: the tick period (truncated to µs); 0 turns
    the autoscaler off, a positive period turns BLIS's (blis-saturation) on when none is
    configured."""
    flag = "--model-autoscaler-interval-us"
    value = check_float(flag, _float(flag, raw), min_value=0)
    a = cfg.policy.autoscaler
    if int(value) == 0:
        a = dataclasses.replace(a, policy="none")
    else:
        a = dataclasses.replace(a, interval_us=int(value),
                                policy=a.policy if a.enabled else "blis-saturation")
    try:
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, autoscaler=a))
    except ConfigError as err:
        raise ConfigError(flag, f"{err.path}: {err.problem}") from err


def apply_blis_flags(cfg: SimConfig, ns: argparse.Namespace) -> SimConfig:
    """A new config with the flags given in ``ns`` (from :func:`add_blis_flags`) applied."""
    values = {f.dest: getattr(ns, f.dest, None) for f in BLIS_FLAGS}
    return apply_blis_flag_values(cfg, values)
