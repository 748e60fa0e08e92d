"""BLIS workload-spec v2: typed, validated description of a synthetic workload.

A spec lists clients; each client has a share of the aggregate request rate, an arrival process,
input/output token-length distributions, an optional shared-prefix group, a tenant, an SLO class
and an optional timeout. ``parse_workload_spec`` reads BLIS YAML (docs/semantics.md §8.1);
``distribution_spec`` builds the spec of BLIS's ``--workload distribution`` CLI mode.

Units: rates in requests/second, times in integer microseconds, lengths in tokens.
Every value is validated when a ``WorkloadSpec`` is built; errors name the field path, e.g.
``clients[1].arrival.cv: must be > 0``.

Supported subset: rate-based clients (``blisjax.workload.clients``), optionally active only
inside lifecycle windows (``lifecycle.windows``) and optionally sending multi-turn
conversations (``reasoning.multi_turn``: closed-loop follow-up rounds), and blisjax's
``adversarial`` patterns (``blisjax.workload.adversarial``) added on top of the clients'
traffic, and closed-loop concurrency clients (``concurrency``: users that each wait for
their answer, think and send again). BLIS features that change request generation otherwise
(cohorts, ``closed_loop``, per-window overrides of a lifecycle window, multimodal, network,
ServeGen/inference-perf sources) are rejected with a clear error rather than silently ignored.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from blisjax.workload.adversarial import (
    ADVERSARIAL_CLASSES,
    ADVERSARIAL_TYPES,
    DEFAULT_FLOOD_ID,
    AdversarialPattern,
    LongPromptFlood,
    SynchronizedBurst,
    TenantSurge,
    check_targets,
)
from blisjax.workload.clients import (
    CATEGORIES,
    DEFAULT_PARETO_ALPHA,
    DEFAULT_PREFIX_LENGTH,
    V1_SLO_CLASSES,
    ActiveWindow,
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    LifecycleSpec,
    MultiTurnSpec,
    check_choice,
    check_number,
    check_str,
    gaussian_dist,
    is_number,
)


@dataclass(frozen=True)
class WorkloadSpec:
    """A whole synthetic workload (validated on construction).

    Attributes:
      version: always "2" (v1 specs are upgraded by the parser).
      seed: spec seed; the ``seed`` argument of ``generate_workload`` overrides it.
      category: "", language, multimodal or reasoning (informational).
      clients: at least one ``ClientSpec``.
      aggregate_rate: total request rate in requests/second (> 0).
      horizon_us: stop generating at arrival >= horizon (None = no time limit).
      num_requests: keep the first N requests by arrival (None = no count limit).
        Generation needs at least one of horizon_us / num_requests, unless every client has a
        lifecycle (its last window then ends its arrivals).
      goodput_slo_targets: BLIS ``goodput_slo_targets`` mapping, carried unchanged.
      adversarial: patterns whose requests are added to the clients' (``SynchronizedBurst``,
        ``LongPromptFlood``, ``TenantSurge``); generated from the same seed.
    """

    version: str = "2"
    seed: int | None = None
    category: str = ""
    clients: tuple[ClientSpec, ...] = ()
    aggregate_rate: float = 1.0
    horizon_us: int | None = None
    num_requests: int | None = None
    goodput_slo_targets: Mapping[str, Any] | None = None
    adversarial: tuple[AdversarialPattern, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", tuple(self.clients))
        object.__setattr__(self, "adversarial", tuple(self.adversarial))
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the first invalid field (e.g. ``clients[1].arrival.cv``)."""
        if self.version != "2":
            raise ValueError(f"version: must be '2', got {self.version!r}")
        if self.seed is not None:
            check_number("seed", self.seed, integral=True)
        check_choice("category", self.category, CATEGORIES)
        if not self.clients:
            raise ValueError("clients: at least one client is required")
        for i, client in enumerate(self.clients):
            if not isinstance(client, ClientSpec):
                raise ValueError(f"clients[{i}]: must be a ClientSpec")
            client.check(f"clients[{i}]")
        check_number("aggregate_rate", self.aggregate_rate, gt=0)
        if self.horizon_us is not None:
            check_number("horizon", self.horizon_us, ge=1, integral=True)
        if self.num_requests is not None:
            check_number("num_requests", self.num_requests, ge=1, integral=True)
        if self.goodput_slo_targets is not None and not isinstance(
            self.goodput_slo_targets, Mapping
        ):
            raise ValueError("goodput_slo_targets: must be a mapping")
        for j, pattern in enumerate(self.adversarial):
            self._check_pattern(f"adversarial[{j}]", pattern)
        growth = {c.multi_turn.context_growth for c in self.clients
                  if c.multi_turn is not None and c.multi_turn.max_rounds > 1}
        if len(growth) > 1:
            i = next(i for i, c in enumerate(self.clients) if c.multi_turn is not None)
            raise ValueError(f"clients[{i}].reasoning.multi_turn.context_growth: every "
                             "multi-turn client of a workload must use the same one")
        self._check_users()

    def _check_users(self) -> None:
        """Concurrency clients: their users' rounds are bounded by ``num_requests`` or their
        own ``rounds_per_user``; a user's requests carry no conversation, so they share a
        workload with non-accumulating conversations only (one context growth per
        workload)."""
        users = [i for i, c in enumerate(self.clients) if c.concurrency]
        if not users:
            return
        for i in users:
            if self.num_requests is None and self.clients[i].rounds_per_user is None:
                raise ValueError(f"clients[{i}].rounds_per_user: a concurrency client of a "
                                 "workload without num_requests needs it (the most requests "
                                 "one user sends)")
        if any(c.multi_turn is not None and c.multi_turn.max_rounds > 1
               and c.multi_turn.context_growth == "accumulate" for c in self.clients):
            raise ValueError(f"clients[{users[0]}].concurrency: concurrency users' requests do "
                             "not accumulate a conversation; they cannot share a workload with "
                             "accumulating conversations (context_growth: accumulate)")

    def _check_pattern(self, path: str, pattern: Any) -> None:
        if not isinstance(pattern, ADVERSARIAL_CLASSES):
            raise ValueError(
                f"{path}: must be a SynchronizedBurst, LongPromptFlood or TenantSurge"
            )
        pattern.check(path)
        if isinstance(pattern, LongPromptFlood):
            return
        check_targets(path, pattern, self.clients)
        if isinstance(pattern, SynchronizedBurst) and pattern.repeats and (
            pattern.count is None and pattern.end_us is None and self.horizon_us is None
        ):
            raise ValueError(
                f"{path}.count: a repeating burst needs count or end_us (or the workload's horizon)"
            )


# --------------------------------------------------------------------------- CLI distribution


def distribution_spec(
    rate: float,
    num_requests: int,
    prompt_mean: float = 512,
    prompt_std: float = 256,
    prompt_min: int = 2,
    prompt_max: int = 7000,
    output_mean: float = 512,
    output_std: float = 256,
    output_min: int = 2,
    output_max: int = 7000,
    prefix_tokens: int = 0,
) -> WorkloadSpec:
    """The spec of BLIS ``--workload distribution``: one client at ``rate`` req/s.

    Arrivals are ``constant`` (what BLIS's ``--rate`` uses); prompt and output lengths are
    clamped Gaussians; ``prefix_tokens`` > 0 adds one shared prefix group named "shared" (as in
    BLIS traces) whose tokens are prepended to every prompt. No deadline (docs/semantics.md Decision 11).
    """
    check_number("prefix_tokens", prefix_tokens, ge=0, integral=True)
    client = ClientSpec(
        arrival=ArrivalSpec("constant"),
        input_distribution=gaussian_dist(prompt_mean, prompt_std, prompt_min, prompt_max),
        output_distribution=gaussian_dist(output_mean, output_std, output_min, output_max),
        prefix_group="shared" if prefix_tokens > 0 else "",
        prefix_length=int(prefix_tokens) if prefix_tokens > 0 else DEFAULT_PREFIX_LENGTH,
    )
    return WorkloadSpec(
        category="language", clients=(client,), aggregate_rate=rate, num_requests=num_requests
    )


# --------------------------------------------------------------------------- YAML parsing

_TOP_KEYS = frozenset(
    {"version", "seed", "category", "clients", "aggregate_rate", "horizon", "num_requests",
     "goodput_slo_targets", "cohorts", "servegen_data", "inference_perf", "adversarial"}
)  # fmt: skip
_CLIENT_KEYS = frozenset(
    {"id", "tenant_id", "slo_class", "rate_fraction", "arrival", "input_distribution",
     "output_distribution", "prefix_group", "prefix_length", "timeout", "slo_target_us",
     "model", "streaming", "concurrency", "think_time_us", "closed_loop", "lifecycle",
     "multimodal", "reasoning", "network", "rounds_per_user"}
)  # fmt: skip
#: BLIS client features that change what is generated; blisjax rejects them when set
#: (``reasoning`` only for its ``multi_turn`` part, ``_parse_reasoning``).
_UNSUPPORTED_CLIENT_KEYS = ("multimodal", "network")
_REASONING_KEYS = frozenset({"reason_ratio_distribution", "multi_turn"})
_MULTI_TURN_KEYS = frozenset({"max_rounds", "think_time_us", "context_growth"})
_LIFECYCLE_KEYS = frozenset({"windows"})
_WINDOW_KEYS = frozenset(
    {"start_us", "end_us", "trace_rate", "arrival", "input_distribution", "output_distribution"}
)
#: BLIS per-window overrides; any of them switches BLIS to a different (time-varying) generator.
_UNSUPPORTED_WINDOW_KEYS = ("trace_rate", "arrival", "input_distribution", "output_distribution")
_ARRIVAL_KEYS = frozenset(
    {"process", "cv", "shape", "scale", "period_us", "jitter_us", "pareto_alpha"}
)
_DIST_KEYS = frozenset({"type", "params", "file", "bins", "probabilities"})


def _check_keys(path: str, data: Any, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{path or 'workload spec'}: must be a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ValueError(f"{where}: unknown key; allowed keys: {', '.join(sorted(allowed))}")
    return data


def _opt_int(path: str, value: Any) -> int | None:
    """None stays None; integral numbers (YAML may give 3.0e8) become int."""
    if value is None:
        return None
    check_number(path, value, integral=True)
    return int(value)


def _opt_str(path: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML `id: 7` is meant as the name "7"
    check_str(path, value)
    return value


def _parse_arrival(path: str, data: Any) -> ArrivalSpec:
    data = _check_keys(path, data, _ARRIVAL_KEYS)
    if "process" not in data:
        raise ValueError(f"{path}.process: required")
    return ArrivalSpec(
        process=data["process"],
        cv=data.get("cv"),
        shape=data.get("shape"),
        scale=data.get("scale"),
        period_us=_opt_int(f"{path}.period_us", data.get("period_us")),
        jitter_us=_opt_int(f"{path}.jitter_us", data.get("jitter_us")) or 0,
        pareto_alpha=data.get("pareto_alpha", DEFAULT_PARETO_ALPHA),
    )


def _parse_empirical(path: str, data: Mapping[str, Any]) -> DistSpec:
    """BLIS inline PDF ``params: {"128": 0.5, ...}`` or explicit ``bins``/``probabilities``."""
    params = data.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{path}.params: must be a mapping")
    bins = list(data.get("bins") or [])
    probs = list(data.get("probabilities") or [])
    if params and bins:
        raise ValueError(f"{path}.params: give either an inline PDF in params or bins, not both")
    for key, prob in params.items():
        try:
            bins.append(int(str(key).strip()))
        except ValueError:
            raise ValueError(f"{path}.params.{key}: empirical bin must be an integer") from None
        probs.append(prob)
    return DistSpec("empirical", {}, tuple(bins), tuple(probs))


def _parse_dist(path: str, data: Any) -> DistSpec:
    if data is None:
        raise ValueError(f"{path}: required")
    data = _check_keys(path, data, _DIST_KEYS)
    if data.get("file"):
        raise ValueError(f"{path}.file: file-based distributions are not supported")
    if "type" not in data:
        raise ValueError(f"{path}.type: required")
    if data["type"] == "empirical":
        return _parse_empirical(path, data)
    if "bins" in data or "probabilities" in data:
        raise ValueError(f"{path}.bins: only used by the 'empirical' type")
    params = data.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{path}.params: must be a mapping")
    return DistSpec(data["type"], dict(params))


def _parse_lifecycle(path: str, data: Any) -> LifecycleSpec | None:
    """BLIS ``lifecycle: {windows: [{start_us, end_us}, ...]}``; absent or null = always active.

    ``start_us`` defaults to 0 (BLIS's zero value); ``end_us`` is required.
    """
    if data is None:
        return None
    data = _check_keys(path, data, _LIFECYCLE_KEYS)
    windows = data.get("windows")
    if not isinstance(windows, list) or not windows:
        raise ValueError(f"{path}.windows: must be a non-empty list of {{start_us, end_us}}")
    parsed = []
    for i, w in enumerate(windows):
        wpath = f"{path}.windows[{i}]"
        w = _check_keys(wpath, w, _WINDOW_KEYS)
        for key in _UNSUPPORTED_WINDOW_KEYS:
            if w.get(key) is not None:
                raise ValueError(
                    f"{wpath}.{key}: per-window overrides are not supported by blisjax"
                )
        if w.get("end_us") is None:
            raise ValueError(f"{wpath}.end_us: required")
        start = _opt_int(f"{wpath}.start_us", w.get("start_us"))
        end = _opt_int(f"{wpath}.end_us", w["end_us"])
        parsed.append(ActiveWindow(start if start is not None else 0, end))
    return LifecycleSpec(tuple(parsed))


def _reject_unsupported_client(path: str, data: Mapping[str, Any]) -> None:
    for key in _UNSUPPORTED_CLIENT_KEYS:
        if data.get(key):
            raise ValueError(f"{path}.{key}: not supported by blisjax")
    if data.get("closed_loop"):
        raise ValueError(f"{path}.closed_loop: closed-loop sessions are not supported")
    if data.get("model") is not None:
        check_str(f"{path}.model", data["model"])
    if data.get("streaming") is not None and not isinstance(data["streaming"], bool):
        raise ValueError(f"{path}.streaming: must be true or false")


def _parse_client(path: str, data: Any, v1: bool) -> ClientSpec:
    data = _check_keys(path, data, _CLIENT_KEYS)
    _reject_unsupported_client(path, data)
    slo_class = _opt_str(f"{path}.slo_class", data.get("slo_class"))
    if v1:
        slo_class = V1_SLO_CLASSES.get(slo_class, slo_class)
    elif slo_class in V1_SLO_CLASSES:
        raise ValueError(
            f"{path}.slo_class: {slo_class!r} is a v1 name; use {V1_SLO_CLASSES[slo_class]!r}"
        )
    prefix_group = _opt_str(f"{path}.prefix_group", data.get("prefix_group"))
    prefix_length = _opt_int(f"{path}.prefix_length", data.get("prefix_length"))
    if not prefix_length and prefix_group:
        prefix_length = DEFAULT_PREFIX_LENGTH  # BLIS: absent or 0 means the default
    users = _opt_int(f"{path}.concurrency", data.get("concurrency")) or 0
    if "arrival" not in data and not users:
        raise ValueError(f"{path}.arrival: required")
    return ClientSpec(
        id=_opt_str(f"{path}.id", data.get("id")),
        tenant_id=_opt_str(f"{path}.tenant_id", data.get("tenant_id")),
        slo_class=slo_class,
        rate_fraction=data.get("rate_fraction", 0.0 if users else 1.0),
        arrival=(_parse_arrival(f"{path}.arrival", data["arrival"]) if "arrival" in data
                 else ArrivalSpec()),
        input_distribution=_parse_dist(
            f"{path}.input_distribution", data.get("input_distribution")
        ),
        output_distribution=_parse_dist(
            f"{path}.output_distribution", data.get("output_distribution")
        ),
        prefix_group=prefix_group,
        prefix_length=prefix_length if prefix_length is not None else DEFAULT_PREFIX_LENGTH,
        timeout_us=_opt_int(f"{path}.timeout", data.get("timeout")),
        slo_target_us=_opt_int(f"{path}.slo_target_us", data.get("slo_target_us")),
        lifecycle=_parse_lifecycle(f"{path}.lifecycle", data.get("lifecycle")),
        multi_turn=_parse_reasoning(f"{path}.reasoning", data.get("reasoning")),
        concurrency=users,
        think_time_us=_opt_int(f"{path}.think_time_us", data.get("think_time_us")) or 0,
        rounds_per_user=_opt_int(f"{path}.rounds_per_user", data.get("rounds_per_user")),
    )


def _parse_reasoning(path: str, data: Any) -> MultiTurnSpec | None:
    """BLIS's ``reasoning`` section: its ``multi_turn`` conversations; a reasoning ratio
    other than 0 (BLIS's reasoning tokens) is not modelled."""
    if not data:
        return None
    data = _check_keys(path, data, _REASONING_KEYS)
    ratio = data.get("reason_ratio_distribution")
    if ratio is not None:
        params = (ratio.get("params") or {}) if isinstance(ratio, Mapping) else None
        if not isinstance(params, Mapping) or any(
                is_number(v) and v != 0 for v in params.values()):
            raise ValueError(f"{path}.reason_ratio_distribution: not supported by blisjax "
                             "(reasoning tokens are not modelled); only a ratio of 0 is accepted")
    turns = data.get("multi_turn")
    if turns is None:
        return None
    turns = _check_keys(f"{path}.multi_turn", turns, _MULTI_TURN_KEYS)
    spec = MultiTurnSpec(max_rounds=turns.get("max_rounds", 1),
                         think_time_us=turns.get("think_time_us", 0),
                         context_growth=turns.get("context_growth", "") or "")
    spec.check(f"{path}.multi_turn")
    return spec


#: Keys of each adversarial pattern type, and those it requires.
_ADVERSARIAL_KEYS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "synchronized_burst": (
        frozenset({"type", "period_us", "size", "start_us", "count", "end_us", "spread_us",
                   "clients", "tenants"}),
        ("size",),
    ),
    "long_prompt_flood": (
        frozenset({"type", "start_us", "end_us", "rate", "input_distribution",
                   "output_distribution", "arrival", "id", "tenant_id", "slo_class", "timeout"}),
        ("end_us", "rate", "input_distribution", "output_distribution"),
    ),
    "tenant_surge": (
        frozenset({"type", "start_us", "end_us", "factor", "clients", "tenants", "arrival"}),
        ("end_us", "factor"),
    ),
}  # fmt: skip


def _parse_names(path: str, data: Any) -> tuple[str, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ValueError(f"{path}: must be a list of names, got {data!r}")
    return tuple(_opt_str(f"{path}[{i}]", name) for i, name in enumerate(data))


def _parse_pattern(path: str, data: Any) -> AdversarialPattern:
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: must be a mapping with a type, got {data!r}")
    if "type" not in data:
        raise ValueError(f"{path}.type: required")
    check_choice(f"{path}.type", data["type"], ADVERSARIAL_TYPES)
    allowed, required = _ADVERSARIAL_KEYS[data["type"]]
    data = _check_keys(path, data, allowed)
    for key in required:
        if data.get(key) is None:
            raise ValueError(f"{path}.{key}: required for {data['type']!r}")
    start = _opt_int(f"{path}.start_us", data.get("start_us")) or 0
    end = _opt_int(f"{path}.end_us", data.get("end_us"))
    arrival = (
        _parse_arrival(f"{path}.arrival", data["arrival"])
        if data.get("arrival") is not None else ArrivalSpec()
    )  # fmt: skip
    if data["type"] == "synchronized_burst":
        return SynchronizedBurst(
            period_us=_opt_int(f"{path}.period_us", data.get("period_us")),
            size=_opt_int(f"{path}.size", data["size"]),
            start_us=start,
            count=_opt_int(f"{path}.count", data.get("count")),
            end_us=end,
            spread_us=_opt_int(f"{path}.spread_us", data.get("spread_us")) or 0,
            clients=_parse_names(f"{path}.clients", data.get("clients")),
            tenants=_parse_names(f"{path}.tenants", data.get("tenants")),
        )
    if data["type"] == "long_prompt_flood":
        return LongPromptFlood(
            start_us=start,
            end_us=end,
            rate=data["rate"],
            input_distribution=_parse_dist(
                f"{path}.input_distribution", data["input_distribution"]
            ),
            output_distribution=_parse_dist(
                f"{path}.output_distribution", data["output_distribution"]
            ),
            arrival=arrival,
            id=_opt_str(f"{path}.id", data.get("id", DEFAULT_FLOOD_ID)),
            tenant_id=_opt_str(f"{path}.tenant_id", data.get("tenant_id")),
            slo_class=_opt_str(f"{path}.slo_class", data.get("slo_class")),
            timeout_us=_opt_int(f"{path}.timeout", data.get("timeout")),
        )
    return TenantSurge(
        start_us=start,
        end_us=end,
        factor=data["factor"],
        clients=_parse_names(f"{path}.clients", data.get("clients")),
        tenants=_parse_names(f"{path}.tenants", data.get("tenants")),
        arrival=arrival,
    )


def _parse_adversarial(data: Any) -> tuple[AdversarialPattern, ...]:
    """The ``adversarial`` list (absent or null = none); each entry a mapping with a ``type``."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ValueError(f"adversarial: must be a list of patterns, got {data!r}")
    return tuple(_parse_pattern(f"adversarial[{j}]", p) for j, p in enumerate(data))


def _parse_version(value: Any) -> bool:
    """Return True for a v1 spec (which gets its SLO class names upgraded)."""
    if value is None or value == "" or str(value) == "1":
        return True
    if str(value) == "2":
        return False
    raise ValueError(f"version: must be '1' or '2', got {value!r}")


def _load_mapping(source: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    with open(source, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, Mapping):
        raise ValueError(f"workload spec {os.fspath(source)!r}: top level must be a mapping")
    return data


def parse_workload_spec(source: Mapping[str, Any] | str | os.PathLike[str]) -> WorkloadSpec:
    """Parse a BLIS workload-spec YAML file (path) or an already-loaded mapping.

    Keys follow BLIS (``timeout`` and ``horizon`` in µs, ``aggregate_rate`` in req/s); blisjax
    adds ``arrival.period_us``, ``arrival.jitter_us``, ``arrival.pareto_alpha``, empirical
    ``bins``/``probabilities`` and the ``adversarial`` list of patterns. Unknown keys and unsupported BLIS features raise ValueError
    naming the key; every value is validated (see ``WorkloadSpec.check``).
    """
    data = _check_keys("", _load_mapping(source), _TOP_KEYS)
    for key in ("cohorts", "servegen_data", "inference_perf"):
        if data.get(key):
            raise ValueError(f"{key}: not supported by blisjax")
    v1 = _parse_version(data.get("version"))
    clients = data.get("clients")
    if not isinstance(clients, list) or not clients:
        raise ValueError("clients: must be a non-empty list")
    num_requests = _opt_int("num_requests", data.get("num_requests"))
    return WorkloadSpec(
        version="2",
        seed=_opt_int("seed", data.get("seed")),
        category=_opt_str("category", data.get("category")),
        clients=tuple(_parse_client(f"clients[{i}]", c, v1) for i, c in enumerate(clients)),
        aggregate_rate=data.get("aggregate_rate", 0.0),
        horizon_us=_opt_int("horizon", data.get("horizon")),
        num_requests=num_requests or None,  # BLIS: 0 means unlimited
        goodput_slo_targets=data.get("goodput_slo_targets"),
        adversarial=_parse_adversarial(data.get("adversarial")),
    )
