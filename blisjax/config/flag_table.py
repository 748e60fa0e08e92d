"""The table of BLIS-named command-line flags: each flag's names, destination, parser, the
configuration field it sets and its help (``BLIS_FLAGS``), and BLIS's flow-control flags that
blisjax refuses unless left at their defaults (``UNMODELLED_FLOW_CONTROL``). ``flags`` adds
them to a parser and applies their values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blisjax.config._checks import ConfigError
from blisjax.config.fields import (
    ADMISSION_POLICIES,
    LATENCY_MODELS,
    PREEMPTION_POLICIES,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    SCHEDULER_POLICIES,
    TIE_BREAKS,
)
from blisjax.config.pd import PD_DECIDERS
from blisjax.config.policy import ScorerWeight
from blisjax.config.yaml_io import (
    BLIS_INVERTED_SLO,
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


def parse_int(flag: str, v: Any) -> int:
    return _parse_number(flag, v, int)


def parse_float(flag: str, v: Any) -> float:
    return _parse_number(flag, v, float)


def parse_str(flag: str, v: Any) -> str:
    return str(v)


def _offload_threshold(flag: str, v: Any) -> float:
    """BLIS's ``--kv-offload-threshold``: checked (a fraction in [0, 1]) and then ignored, as
    BLIS ignores it (docs/semantics.md §3.8)."""
    value = _parse_number(flag, v, float)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(flag, f"must be in [0, 1], got {value}")
    return value


def parse_switch(flag: str, v: Any) -> bool:
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


#: BLIS's per-pool P/D settings: flag suffix, ``PoolOverrides`` field, parser, what it sets.
PER_POOL_FLAGS = (
    ("tp", "tensor_parallel_size", parse_int, "tensor parallelism (GPUs per instance)"),
    ("hardware", "hardware", parse_str, "GPU"),
    ("latency-model", "latency_model", parse_str, "latency model"),
    ("max-model-len", "max_model_len", parse_int, "max input + output tokens per request"),
)


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
            value = parse_switch(flag, v)
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
        parse_str,
        "model",
        "model id (org/Name), shipped name or config.json path",
    ),
    BlisFlag(("--hardware",), "hardware", parse_str, "hardware", "GPU name in hardware_config.json"),
    BlisFlag(("--tp",), "tp", parse_int, "engine.tensor_parallel_size", "tensor parallelism"),
    BlisFlag(
        ("--max-num-running-reqs", "--max-num-seqs"),
        "max_num_running_reqs",
        parse_int,
        "engine.max_num_running_reqs",
        "max requests in the running batch",
    ),
    BlisFlag(
        ("--max-num-scheduled-tokens", "--max-num-batched-tokens"),
        "max_num_scheduled_tokens",
        parse_int,
        "engine.max_num_scheduled_tokens",
        "token budget per step",
    ),
    BlisFlag(
        ("--total-kv-blocks",),
        "total_kv_blocks",
        parse_int,
        "engine.total_kv_blocks",
        "KV blocks per instance",
    ),
    BlisFlag(
        ("--block-size-in-tokens",),
        "block_size_in_tokens",
        parse_int,
        "engine.block_size_tokens",
        "tokens per KV block",
    ),
    BlisFlag(
        ("--long-prefill-token-threshold",),
        "long_prefill_token_threshold",
        parse_int,
        "engine.long_prefill_token_threshold",
        "max prefill tokens per request per step (0 = off)",
    ),
    BlisFlag(
        ("--max-model-len",),
        "max_model_len",
        parse_int,
        "engine.max_model_len",
        "max tokens per request (0 = unlimited)",
    ),
    BlisFlag(
        ("--gpu-memory-utilization",),
        "gpu_memory_utilization",
        parse_float,
        "engine.gpu_memory_utilization",
        "HBM fraction for vLLM, in (0, 1]",
    ),
    BlisFlag(
        ("--kv-cpu-blocks",),
        "kv_cpu_blocks",
        parse_int,
        "engine.kv_cpu_blocks",
        "CPU-tier KV blocks per instance (0 = no CPU tier)",
    ),
    BlisFlag(
        ("--kv-transfer-bandwidth",),
        "kv_transfer_bandwidth",
        parse_float,
        "engine.kv_transfer_bandwidth",
        "CPU→GPU reload bandwidth, tokens per µs",
    ),
    BlisFlag(
        ("--kv-transfer-base-latency",),
        "kv_transfer_base_latency",
        parse_int,
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
        parse_str,
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
        parse_str,
        "latency.vllm_version",
        "blackbox: vLLM image of the shipped coefficients (e.g. vllm/vllm-openai:v0.8.4)",
        "IMAGE",
    ),
    BlisFlag(
        ("--coefficients-file",),
        "coefficients_file",
        parse_str,
        "latency.coefficients_file",
        "physics coefficient YAML (from `blisjax fit-latency --out`)",
        "FILE",
    ),
    BlisFlag(
        ("--num-instances",),
        "num_instances",
        parse_int,
        "cluster.num_instances",
        "instances behind the router",
    ),
    BlisFlag(
        ("--admission-latency",),
        "admission_latency",
        parse_int,
        "cluster.admission_latency_us",
        "admission delay, µs",
    ),
    BlisFlag(
        ("--routing-latency",),
        "routing_latency",
        parse_int,
        "cluster.routing_latency_us",
        "routing delay, µs",
    ),
    BlisFlag(
        ("--snapshot-refresh-interval",),
        "snapshot_refresh_interval",
        parse_int,
        "cluster.snapshot_refresh_interval_us",
        "router signal refresh interval, µs (0 = live)",
    ),
    BlisFlag(
        ("--model-autoscaler-interval-us",),
        "model_autoscaler_interval_us",
        parse_float,
        "",
        "autoscaler tick period, µs (BLIS's; > 0 runs blis-saturation unless the "
        "configuration names another autoscaler; 0 = none)",
    ),
    BlisFlag(
        ("--cache-signal-delay",),
        "cache_signal_delay",
        parse_int,
        "cluster.cache_signal_delay_us",
        "prefix-cache signal staleness for precise-prefix-cache/no-hit-lru, µs (0 = live)",
    ),
    BlisFlag(
        ("--routing-policy",),
        "routing_policy",
        parse_str,
        "policy.routing.policy",
        "routing policy",
        choices=ROUTING_POLICIES,
    ),
    BlisFlag(
        ("--routing-program",),
        "routing_program",
        parse_str,
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
        parse_str,
        "policy.routing.tie_break",
        "ties of least-loaded/weighted routing (blisjax; BLIS draws randomly)",
        choices=TIE_BREAKS,
    ),
    BlisFlag(
        ("--admission-policy",),
        "admission_policy",
        parse_str,
        "policy.admission.policy",
        "admission policy",
        choices=ADMISSION_POLICIES,
    ),
    BlisFlag(
        ("--admission-program",),
        "admission_program",
        parse_str,
        "policy.admission.program",
        "with --admission-policy program: admit iff this expression is > 0 (blisjax)",
        "EXPR",
    ),
    BlisFlag(
        ("--token-bucket-capacity",),
        "token_bucket_capacity",
        parse_float,
        "policy.admission.token_bucket_capacity",
        "token-bucket size, tokens",
    ),
    BlisFlag(
        ("--token-bucket-refill-rate",),
        "token_bucket_refill_rate",
        parse_float,
        "policy.admission.token_bucket_refill_rate",
        "token-bucket refill, tokens/s",
    ),
    BlisFlag(
        ("--priority-policy",),
        "priority_policy",
        parse_str,
        "policy.priority.policy",
        "priority policy (inverted-slo = slo-based with a negative age weight)",
        choices=tuple(PRIORITY_POLICIES) + (BLIS_INVERTED_SLO,),
    ),
    BlisFlag(
        ("--priority-program",),
        "priority_program",
        parse_str,
        "policy.priority.program",
        "with --priority-policy program: the priority, an expression (blisjax)",
        "EXPR",
    ),
    BlisFlag(
        ("--scheduler",),
        "scheduler",
        parse_str,
        "policy.scheduler.policy",
        "instance scheduler",
        choices=SCHEDULER_POLICIES,
    ),
    BlisFlag(
        ("--preemption-policy",),
        "preemption_policy",
        parse_str,
        "engine.preemption_policy",
        "preemption victim",
        choices=PREEMPTION_POLICIES,
    ),
    BlisFlag(
        ("--prefill-instances",),
        "prefill_instances",
        parse_int,
        "cluster.pd.prefill_instances",
        "P/D: prefill-pool instances (the first ones by index)",
    ),
    BlisFlag(
        ("--decode-instances",),
        "decode_instances",
        parse_int,
        "cluster.pd.decode_instances",
        "P/D: decode-pool instances (after the prefill ones)",
    ),
    BlisFlag(
        ("--prefill-decode-instances",),
        "prefill_decode_instances",
        parse_int,
        "cluster.pd.shared_instances",
        "P/D: instances in both pools (after the decode ones)",
    ),
    BlisFlag(
        ("--pd-decider",),
        "pd_decider",
        parse_str,
        "cluster.pd.decider",
        "P/D: which requests are disaggregated",
        choices=PD_DECIDERS,
    ),
    BlisFlag(
        ("--pd-prefix-threshold",),
        "pd_prefix_threshold",
        parse_int,
        "cluster.pd.prefix_threshold_tokens",
        "P/D: uncached prompt tokens above which prefix-threshold disaggregates",
    ),
    BlisFlag(
        ("--pd-transfer-bandwidth",),
        "pd_transfer_bandwidth",
        parse_float,
        "cluster.pd.transfer_bandwidth_gbps",
        "P/D: KV transfer bandwidth, GB/s",
    ),
    BlisFlag(
        ("--pd-transfer-base-latency",),
        "pd_transfer_base_latency",
        parse_float,
        "cluster.pd.transfer_base_latency_ms",
        "P/D: fixed latency per KV transfer, ms",
    ),
    BlisFlag(
        ("--pd-transfer-contention",),
        "pd_transfer_contention",
        parse_switch,
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
    *(BlisFlag((f"--{pool}-{suffix}",), f"{pool}_{suffix.replace('-', '_')}",
               parser,
               f"cluster.pd.{pool}.{field}", f"P/D: the {pool} pool's {what}",
               choices=LATENCY_MODELS if field == "latency_model" else None)
      for pool in ("prefill", "decode") for suffix, field, parser, what in PER_POOL_FLAGS),
    BlisFlag(
        ("--flow-control",),
        "flow_control",
        parse_switch,
        "cluster.gateway.enabled",
        "gateway queue with saturation-gated dispatch (BLIS flow control)",
    ),
    BlisFlag(
        ("--saturation-detector",),
        "saturation_detector",
        parse_str,
        "cluster.gateway.saturation_detector",
        "gateway saturation detector",
        choices=("never", "utilization", "concurrency"),
    ),
    BlisFlag(
        ("--queue-depth-threshold",),
        "queue_depth_threshold",
        parse_float,
        "cluster.gateway.queue_depth_threshold",
        "utilization detector: queue depth per instance at saturation",
    ),
    BlisFlag(
        ("--kv-cache-util-threshold",),
        "kv_cache_util_threshold",
        parse_float,
        "cluster.gateway.kv_cache_util_threshold",
        "utilization detector: KV utilization at saturation",
    ),
    BlisFlag(
        ("--max-concurrency",),
        "max_concurrency",
        parse_int,
        "cluster.gateway.max_concurrency",
        "concurrency detector: in-flight requests per instance at saturation",
    ),
    BlisFlag(
        ("--dispatch-order",),
        "dispatch_order",
        parse_str,
        "cluster.gateway.dispatch_order",
        "gateway queue dispatch order",
        choices=("fifo", "priority"),
    ),
    BlisFlag(
        ("--max-gateway-queue-depth",),
        "max_gateway_queue_depth",
        parse_int,
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
        parse_switch,
        "compat.blis_quirks",
        "reproduce BLIS's own behaviour where it departs from a real cluster (README)",
    ),
    BlisFlag(("--seed",), "seed", parse_int, "seed", "master seed"),
    BlisFlag(("--horizon",), "horizon", parse_int, "horizon_us", "simulation horizon, µs"),
    BlisFlag(("--policy-config",), "policy_config", parse_str, "", "BLIS policy bundle YAML", "PATH"),
)
