"""BLIS workload-spec v2: typed, validated description of a synthetic workload.

A spec lists clients; each client has a share of the aggregate request rate, an arrival process,
input/output token-length distributions, an optional shared-prefix group, a tenant, an SLO class
and an optional timeout. ``parse_workload_spec`` reads BLIS YAML (docs/semantics.md §8.1);
``distribution_spec`` builds the spec of BLIS's ``--workload distribution`` CLI mode.

Units: rates in requests/second, times in integer microseconds, lengths in tokens.
Every value is validated when a ``WorkloadSpec`` is built; errors name the field path, e.g.
``clients[1].arrival.cv: must be > 0``.

Supported subset: open-loop, rate-based clients, optionally active only inside lifecycle windows
(``lifecycle.windows``; ``LifecycleSpec``), and blisjax's ``adversarial`` patterns: synchronized
bursts, long-prompt floods and tenant surges added on top of the clients' traffic
(``SynchronizedBurst``, ``LongPromptFlood``, ``TenantSurge``). BLIS features that change request generation (cohorts,
concurrency/closed-loop sessions, per-window overrides of a lifecycle window, multimodal,
reasoning, network, ServeGen/inference-perf sources) are rejected with a clear error rather than
silently ignored.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from blisjax.workload.types import SLO_CLASSES

ARRIVAL_PROCESSES = ("poisson", "constant", "gamma", "weibull", "bursty", "periodic")
DIST_TYPES = (
    "gaussian",
    "exponential",
    "uniform",
    "lognormal",
    "constant",
    "empirical",
    "pareto_lognormal",
)
CATEGORIES = ("", "language", "multimodal", "reasoning")
#: ``adversarial`` pattern types (blisjax extension of the BLIS spec; docs/configuration.md).
ADVERSARIAL_TYPES = ("synchronized_burst", "long_prompt_flood", "tenant_surge")
#: Client id of a long-prompt flood's requests when it names none.
DEFAULT_FLOOD_ID = "long-prompt-flood"
#: v1 SLO class names and their v2 equivalents (BLIS ``UpgradeV1ToV2``).
V1_SLO_CLASSES = {"realtime": "critical", "interactive": "standard"}
#: Shared-prefix length when a client names a prefix group but no length (BLIS default).
DEFAULT_PREFIX_LENGTH = 50
#: Pareto tail index of ``bursty`` arrivals when not given (must be > 1 for a finite mean).
DEFAULT_PARETO_ALPHA = 1.5
#: BLIS accepts Weibull CVs only in this range (the bisection for k covers it).
WEIBULL_CV_RANGE = (0.01, 10.4)

#: Distribution parameters: (required, optional) names per type. Empirical uses bins/probabilities.
DIST_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gaussian": (("mean", "std_dev", "min", "max"), ()),
    "exponential": (("mean",), ("min", "max")),
    "uniform": (("min", "max"), ()),
    "lognormal": (("mu", "sigma"), ("min", "max")),
    "constant": (("value",), ()),
    "empirical": ((), ()),
    "pareto_lognormal": (("alpha", "xm", "mu", "sigma", "mix_weight"), ()),
}


# --------------------------------------------------------------------------- value checks


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(
    path: str,
    value: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    integral: bool = False,
) -> None:
    """Raise ValueError naming ``path`` unless ``value`` is a finite number within the bounds."""
    if not _is_number(value):
        raise ValueError(f"{path}: must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{path}: must be finite, got {value!r}")
    if integral and value != int(value):
        raise ValueError(f"{path}: must be an integer, got {value!r}")
    if gt is not None and not value > gt:
        raise ValueError(f"{path}: must be > {gt:g}, got {value!r}")
    if ge is not None and not value >= ge:
        raise ValueError(f"{path}: must be >= {ge:g}, got {value!r}")
    if le is not None and not value <= le:
        raise ValueError(f"{path}: must be <= {le:g}, got {value!r}")


def _check_str(path: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{path}: must be a string, got {value!r}")


def _check_choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{path}: unknown value {value!r}; allowed: {allowed}")


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class ArrivalSpec:
    """Inter-arrival-time (IAT) process of one client; IATs are integer µs >= 1.

    Attributes:
      process: poisson | constant | gamma | weibull | bursty | periodic.
      cv: coefficient of variation of the IAT (gamma, weibull); None = 1.
      shape: explicit gamma shape / Weibull k, overriding the value derived from ``cv``.
      scale: explicit gamma / Weibull scale in µs; None = chosen so the mean IAT is 1/rate.
      period_us: periodic base IAT in µs; None = 1/rate (the client's rate).
      jitter_us: periodic IAT jitter half-width in µs (IAT = period + U(-jitter, +jitter)).
      pareto_alpha: bursty Pareto tail index (> 1); the mean IAT stays 1/rate.
    """

    process: str = "poisson"
    cv: float | None = None
    shape: float | None = None
    scale: float | None = None
    period_us: int | None = None
    jitter_us: int = 0
    pareto_alpha: float = DEFAULT_PARETO_ALPHA

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_choice(f"{path}.process", self.process, ARRIVAL_PROCESSES)
        if self.cv is not None:
            _check_number(f"{path}.cv", self.cv, gt=0)
            if self.process == "weibull":
                lo, hi = WEIBULL_CV_RANGE
                _check_number(f"{path}.cv", self.cv, ge=lo, le=hi)
        if self.shape is not None:
            _check_number(f"{path}.shape", self.shape, gt=0)
        if self.scale is not None:
            _check_number(f"{path}.scale", self.scale, gt=0)
        if self.period_us is not None:
            _check_number(f"{path}.period_us", self.period_us, ge=1, integral=True)
        _check_number(f"{path}.jitter_us", self.jitter_us, ge=0, integral=True)
        _check_number(f"{path}.pareto_alpha", self.pareto_alpha, gt=1)


@dataclass(frozen=True)
class DistSpec:
    """Token-length distribution; samples are integers >= 1 (BLIS sampler contract).

    ``params`` by type (``min``/``max`` clamp the float sample before rounding):
      gaussian{mean, std_dev, min, max}; exponential{mean, min?, max?}; uniform{min, max}
      (integers, inclusive); lognormal{mu, sigma, min?, max?}; constant{value};
      pareto_lognormal{alpha, xm, mu, sigma, mix_weight}.
    ``empirical`` uses ``bins`` (token counts) with ``probabilities`` (normalised on use) and
    no params. ``params`` is a plain dict, so a DistSpec is comparable but not hashable.
    """

    type: str
    params: Mapping[str, float] = field(default_factory=dict)
    bins: tuple[int, ...] = ()
    probabilities: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "bins", tuple(self.bins))
        object.__setattr__(self, "probabilities", tuple(self.probabilities))

    def param(self, name: str, default: float | None = None) -> float | None:
        """The value of a parameter, or ``default`` when absent."""
        return self.params.get(name, default)

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_choice(f"{path}.type", self.type, DIST_TYPES)
        required, optional = DIST_PARAMS[self.type]
        for name in self.params:
            if name not in required and name not in optional:
                raise ValueError(f"{path}.params.{name}: unknown parameter for {self.type!r}")
        for name in required:
            if name not in self.params:
                raise ValueError(f"{path}.params.{name}: required for {self.type!r}")
        for name, value in self.params.items():
            _check_number(f"{path}.params.{name}", value)
        _TYPE_CHECKS[self.type](self, path)
        if self.type != "empirical" and (self.bins or self.probabilities):
            raise ValueError(f"{path}.bins: only used by the 'empirical' type")


def _check_min_max(d: DistSpec, path: str) -> None:
    for name in ("min", "max"):
        if name in d.params:
            _check_number(f"{path}.params.{name}", d.params[name], ge=0, integral=True)
    if "min" in d.params and "max" in d.params and d.params["min"] > d.params["max"]:
        raise ValueError(f"{path}.params.min: must be <= max ({d.params['max']!r})")


def _check_gaussian(d: DistSpec, path: str) -> None:
    _check_number(f"{path}.params.std_dev", d.params["std_dev"], ge=0)
    _check_min_max(d, path)


def _check_exponential(d: DistSpec, path: str) -> None:
    _check_number(f"{path}.params.mean", d.params["mean"], gt=0)
    _check_min_max(d, path)


def _check_lognormal(d: DistSpec, path: str) -> None:
    _check_number(f"{path}.params.sigma", d.params["sigma"], ge=0)
    _check_min_max(d, path)


def _check_constant(d: DistSpec, path: str) -> None:
    _check_number(f"{path}.params.value", d.params["value"], ge=0, integral=True)


def _check_pareto_lognormal(d: DistSpec, path: str) -> None:
    _check_number(f"{path}.params.alpha", d.params["alpha"], gt=0)
    _check_number(f"{path}.params.xm", d.params["xm"], gt=0)
    _check_number(f"{path}.params.sigma", d.params["sigma"], ge=0)
    _check_number(f"{path}.params.mix_weight", d.params["mix_weight"], ge=0, le=1)


def _check_empirical(d: DistSpec, path: str) -> None:
    if not d.bins:
        raise ValueError(f"{path}.bins: empirical distribution needs at least one bin")
    if len(d.bins) != len(d.probabilities):
        raise ValueError(
            f"{path}.probabilities: length {len(d.probabilities)} differs from bins ({len(d.bins)})"
        )
    for i, b in enumerate(d.bins):
        _check_number(f"{path}.bins[{i}]", b, ge=0, integral=True)
    if len(set(d.bins)) != len(d.bins):
        raise ValueError(f"{path}.bins: values must be distinct")
    for i, p in enumerate(d.probabilities):
        _check_number(f"{path}.probabilities[{i}]", p, ge=0)
    if not sum(d.probabilities) > 0:
        raise ValueError(f"{path}.probabilities: must have a positive sum")


_TYPE_CHECKS = {
    "gaussian": _check_gaussian,
    "exponential": _check_exponential,
    "uniform": _check_min_max,
    "lognormal": _check_lognormal,
    "constant": _check_constant,
    "empirical": _check_empirical,
    "pareto_lognormal": _check_pareto_lognormal,
}


def gaussian_dist(mean: float, std_dev: float, min_tokens: int, max_tokens: int) -> DistSpec:
    """A clamped Gaussian length distribution (BLIS CLI style)."""
    params = {"mean": mean, "std_dev": std_dev, "min": min_tokens, "max": max_tokens}
    return DistSpec("gaussian", params)


def _default_dist() -> DistSpec:
    # BLIS CLI defaults for prompt and output lengths (docs/semantics.md §8.3).
    return gaussian_dist(512, 256, 2, 7000)


@dataclass(frozen=True)
class ActiveWindow:
    """One activity window of a client: the half-open interval [start_us, end_us) in µs.

    Attributes:
      start_us: first microsecond of the window (integer >= 0).
      end_us: first microsecond after the window (integer > start_us).
    """

    start_us: int
    end_us: int

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_number(f"{path}.start_us", self.start_us, ge=0, integral=True)
        _check_number(f"{path}.end_us", self.end_us, integral=True)
        if not self.end_us > self.start_us:
            raise ValueError(
                f"{path}.end_us: must be > start_us ({self.start_us!r}), got {self.end_us!r}"
            )


@dataclass(frozen=True)
class LifecycleSpec:
    """When a client is active (BLIS ``lifecycle``): the union of its windows.

    A client with a lifecycle draws its arrivals exactly as without one (from time 0, at its
    rate) and keeps only those inside a window; it stops at the first arrival at or after the
    largest ``end_us`` (docs/configuration.md, ``workload``). Windows may overlap and come in any
    order. ``windows`` accepts ``ActiveWindow`` objects or ``(start_us, end_us)`` pairs.
    """

    windows: tuple[ActiveWindow, ...] = ()

    def __post_init__(self) -> None:
        windows = tuple(
            w if isinstance(w, ActiveWindow) or not isinstance(w, (tuple, list))
            else ActiveWindow(*w)
            for w in self.windows
        )  # fmt: skip
        object.__setattr__(self, "windows", windows)

    @property
    def end_us(self) -> int:
        """The largest ``end_us``: no arrival at or after it is kept."""
        return max(w.end_us for w in self.windows)

    def contains(self, times_us: Any) -> Any:
        """Boolean mask: which of ``times_us`` (a numpy integer array) fall inside a window."""
        inside = times_us < 0  # all False, same shape
        for w in self.windows:
            inside |= (times_us >= w.start_us) & (times_us < w.end_us)
        return inside

    def overlaps(self, other: LifecycleSpec) -> bool:
        """True when some window of ``self`` and some window of ``other`` share a microsecond."""
        return any(
            a.start_us < b.end_us and b.start_us < a.end_us
            for a in self.windows
            for b in other.windows
        )

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        if not self.windows:
            raise ValueError(f"{path}.windows: at least one window is required")
        for i, w in enumerate(self.windows):
            if not isinstance(w, ActiveWindow):
                raise ValueError(f"{path}.windows[{i}]: must be an ActiveWindow")
            w.check(f"{path}.windows[{i}]")


#: ``MultiTurnSpec.context_growth`` values: "" (each round sends the shared prefix and its own
#: message) or "accumulate" (the conversation so far, then its message).
CONTEXT_GROWTH = ("", "accumulate")


@dataclass(frozen=True)
class MultiTurnSpec:
    """A client's conversations (BLIS ``reasoning.multi_turn``; ``blisjax.workload.sessions``):
    each request the client's arrival process sends is round 0 of a conversation of
    ``max_rounds`` rounds; round k ≥ 1 is sent ``think_time_us`` after round k − 1 completes,
    its message and output lengths drawn from the client's distributions.

    Attributes:
      max_rounds: rounds per conversation, >= 1.
      think_time_us: µs between a round's completion and the next round, >= 0.
      context_growth: "accumulate" or "" (see ``CONTEXT_GROWTH``).
    """

    max_rounds: int = 1
    think_time_us: int = 0
    context_growth: str = ""

    def check(self, path: str) -> None:
        _check_number(f"{path}.max_rounds", self.max_rounds, ge=1, integral=True)
        _check_number(f"{path}.think_time_us", self.think_time_us, ge=0, integral=True)
        _check_choice(f"{path}.context_growth", self.context_growth, CONTEXT_GROWTH)


@dataclass(frozen=True)
class ClientSpec:
    """One client: a rate share, arrival process, length distributions and request labels.

    Attributes:
      id, tenant_id: names (empty string is a valid name).
      slo_class: one of ``SLO_CLASSES`` ("" = none).
      rate_fraction: > 0; the client's rate is aggregate_rate * fraction / S, S = the sum of
        the fractions of the clients whose lifecycle overlaps this one's (all clients when
        there are no lifecycles; ``generate.client_rates_per_us``).
      arrival: inter-arrival process.
      input_distribution, output_distribution: token lengths (the input excludes the prefix).
      prefix_group: shared-prefix group name ("" = none).
      prefix_length: tokens of shared prefix prepended to each input (only with prefix_group).
        All clients of a group share the length of the group's first client (BLIS).
      timeout_us: per-request timeout; deadline = arrival + timeout. None or 0 = no deadline.
      slo_target_us: per-request TTFT target in µs carried as metadata (None = no target).
      lifecycle: activity windows (None = always active); see ``LifecycleSpec``.
      multi_turn: each request the client sends starts a closed-loop conversation
        (``MultiTurnSpec``; BLIS ``reasoning.multi_turn``); None = single requests.
    """

    id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    rate_fraction: float = 1.0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_distribution: DistSpec = field(default_factory=_default_dist)
    output_distribution: DistSpec = field(default_factory=_default_dist)
    prefix_group: str = ""
    prefix_length: int = DEFAULT_PREFIX_LENGTH
    timeout_us: int | None = None
    slo_target_us: int | None = None
    lifecycle: LifecycleSpec | None = None
    multi_turn: MultiTurnSpec | None = None

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        if self.multi_turn is not None:
            if not isinstance(self.multi_turn, MultiTurnSpec):
                raise ValueError(f"{path}.reasoning.multi_turn: must be a MultiTurnSpec")
            self.multi_turn.check(f"{path}.reasoning.multi_turn")
        for name in ("id", "tenant_id", "prefix_group"):
            _check_str(f"{path}.{name}", getattr(self, name))
        _check_choice(f"{path}.slo_class", self.slo_class, SLO_CLASSES)
        _check_number(f"{path}.rate_fraction", self.rate_fraction, gt=0)
        if not isinstance(self.arrival, ArrivalSpec):
            raise ValueError(f"{path}.arrival: must be an ArrivalSpec")
        self.arrival.check(f"{path}.arrival")
        for name in ("input_distribution", "output_distribution"):
            dist = getattr(self, name)
            if not isinstance(dist, DistSpec):
                raise ValueError(f"{path}.{name}: must be a DistSpec")
            dist.check(f"{path}.{name}")
        # A group with an empty prefix would make the group meaningless; BLIS maps 0 to 50.
        min_prefix = 1 if self.prefix_group else 0
        _check_number(f"{path}.prefix_length", self.prefix_length, ge=min_prefix, integral=True)
        # Errors use the YAML key names ("timeout" is in µs there too).
        for name, key in (("timeout_us", "timeout"), ("slo_target_us", "slo_target_us")):
            value = getattr(self, name)
            if value is not None:
                _check_number(f"{path}.{key}", value, ge=0, integral=True)
        if self.lifecycle is not None:
            if not isinstance(self.lifecycle, LifecycleSpec):
                raise ValueError(f"{path}.lifecycle: must be a LifecycleSpec")
            self.lifecycle.check(f"{path}.lifecycle")


# --------------------------------------------------------------------------- adversarial patterns


def _check_names(path: str, value: Any) -> None:
    if not isinstance(value, tuple):
        raise ValueError(f"{path}: must be a list of names, got {value!r}")
    for i, name in enumerate(value):
        _check_str(f"{path}[{i}]", name)


def _check_rate_arrival(path: str, arrival: Any) -> None:
    """An adversarial pattern's arrival process: its rate comes from the pattern, so parameters
    that fix the mean inter-arrival time on their own (``period_us``, ``scale``) are refused."""
    if not isinstance(arrival, ArrivalSpec):
        raise ValueError(f"{path}: must be an ArrivalSpec")
    arrival.check(path)
    for name in ("period_us", "scale"):
        if getattr(arrival, name) is not None:
            raise ValueError(
                f"{path}.{name}: not allowed here; the pattern's rate sets the mean "
                "inter-arrival time"
            )


def _check_window(path: str, start_us: Any, end_us: Any) -> None:
    _check_number(f"{path}.start_us", start_us, ge=0, integral=True)
    _check_number(f"{path}.end_us", end_us, integral=True)
    if not end_us > start_us:
        raise ValueError(f"{path}.end_us: must be > start_us ({start_us!r}), got {end_us!r}")


@dataclass(frozen=True)
class SynchronizedBurst:
    """Every targeted client fires ``size`` extra requests at the same instants.

    Burst instants are ``start_us + k * period_us`` for k = 0, 1, …, while k < ``count``, the
    instant is < ``end_us`` and < the workload's horizon (each bound optional; a repeating burst
    needs at least one). ``period_us`` None = a single burst at ``start_us``. With ``spread_us``
    > 0 each request arrives at its instant plus an integer offset drawn uniformly from
    [0, spread_us]; 0 = all at the instant. The requests carry the client's labels, lengths
    from its distributions and its timeout; a client with a lifecycle keeps only those inside
    its windows.

    Attributes:
      period_us: µs between bursts (integer >= 1) or None (one burst).
      size: requests per targeted client per burst (integer >= 1).
      start_us: first burst instant (integer >= 0).
      count: number of bursts (integer >= 1) or None (until ``end_us`` / horizon).
      end_us: no burst instant at or after it (integer > start_us) or None.
      spread_us: arrival offset range within a burst (integer >= 0).
      clients, tenants: targets by client id / tenant id; both empty = every client.
    """

    type: ClassVar[str] = "synchronized_burst"
    period_us: int | None = None
    size: int = 1
    start_us: int = 0
    count: int | None = None
    end_us: int | None = None
    spread_us: int = 0
    clients: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("clients", "tenants"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def repeats(self) -> bool:
        """Whether more than one burst may fire."""
        return self.period_us is not None and self.count != 1

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        if self.period_us is not None:
            _check_number(f"{path}.period_us", self.period_us, ge=1, integral=True)
        _check_number(f"{path}.size", self.size, ge=1, integral=True)
        _check_number(f"{path}.start_us", self.start_us, ge=0, integral=True)
        if self.count is not None:
            _check_number(f"{path}.count", self.count, ge=1, integral=True)
            if self.period_us is None and self.count > 1:
                raise ValueError(f"{path}.period_us: required when count > 1")
        if self.end_us is not None:
            _check_window(path, self.start_us, self.end_us)
        _check_number(f"{path}.spread_us", self.spread_us, ge=0, integral=True)
        _check_names(f"{path}.clients", self.clients)
        _check_names(f"{path}.tenants", self.tenants)


@dataclass(frozen=True)
class LongPromptFlood:
    """Extra requests with long prompts at ``rate`` req/s inside [start_us, end_us).

    The flood is a client of its own (``id``, ``tenant_id``, ``slo_class``; no shared prefix):
    its first arrival is one inter-arrival time after ``start_us``, the next ones follow from
    ``arrival`` at ``rate``, and it stops at the first arrival >= ``end_us`` (or the horizon).
    Naming an existing client or tenant merges the labels (the flood then counts in that
    tenant's metrics). Its rate is added to ``aggregate_rate``, not taken from it.

    Attributes:
      start_us, end_us: the window in µs (integers, 0 <= start_us < end_us).
      rate: requests/second inside the window (> 0).
      input_distribution, output_distribution: token lengths (e.g. uniform 6000..8000 prompts).
      arrival: inter-arrival process (default poisson); ``period_us`` / ``scale`` are refused.
      id, tenant_id, slo_class: request labels.
      timeout_us: per-request timeout (None or 0 = no deadline).
    """

    type: ClassVar[str] = "long_prompt_flood"
    start_us: int = 0
    end_us: int = 0
    rate: float = 0.0
    input_distribution: DistSpec = field(default_factory=_default_dist)
    output_distribution: DistSpec = field(default_factory=_default_dist)
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    id: str = DEFAULT_FLOOD_ID
    tenant_id: str = ""
    slo_class: str = ""
    timeout_us: int | None = None

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_window(path, self.start_us, self.end_us)
        _check_number(f"{path}.rate", self.rate, gt=0)
        for name in ("input_distribution", "output_distribution"):
            dist = getattr(self, name)
            if not isinstance(dist, DistSpec):
                raise ValueError(f"{path}.{name}: must be a DistSpec")
            dist.check(f"{path}.{name}")
        _check_rate_arrival(f"{path}.arrival", self.arrival)
        for name in ("id", "tenant_id"):
            _check_str(f"{path}.{name}", getattr(self, name))
        _check_choice(f"{path}.slo_class", self.slo_class, SLO_CLASSES)
        if self.timeout_us is not None:
            _check_number(f"{path}.timeout", self.timeout_us, ge=0, integral=True)

    def as_client(self) -> ClientSpec:
        """The flood's labels and lengths as a client (its rate fraction is not used)."""
        return ClientSpec(
            id=self.id,
            tenant_id=self.tenant_id,
            slo_class=self.slo_class,
            arrival=self.arrival,
            input_distribution=self.input_distribution,
            output_distribution=self.output_distribution,
            timeout_us=self.timeout_us,
        )


@dataclass(frozen=True)
class TenantSurge:
    """Targeted clients send ``factor`` times their fair share inside [start_us, end_us).

    Each targeted client keeps its own arrivals and adds a second stream at ``(factor - 1)``
    times its rate (``aggregate_rate`` · fraction / S) inside the window, so its rate there is
    ``factor`` times its share (exactly a Poisson process at that rate for Poisson arrivals).
    The extra stream's first arrival is one inter-arrival time after ``start_us``; its requests
    carry the client's labels, lengths from its distributions and its timeout; a client with a
    lifecycle keeps only those inside its windows.

    Attributes:
      start_us, end_us: the window in µs (integers, 0 <= start_us < end_us).
      factor: the client's rate multiple inside the window (> 1).
      clients, tenants: targets by client id / tenant id (at least one name in all).
      arrival: the extra stream's process (default poisson); ``period_us`` / ``scale`` refused.
    """

    type: ClassVar[str] = "tenant_surge"
    start_us: int = 0
    end_us: int = 0
    factor: float = 2.0
    clients: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)

    def __post_init__(self) -> None:
        for name in ("clients", "tenants"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_window(path, self.start_us, self.end_us)
        _check_number(f"{path}.factor", self.factor, gt=1)
        _check_names(f"{path}.clients", self.clients)
        _check_names(f"{path}.tenants", self.tenants)
        if not self.clients and not self.tenants:
            raise ValueError(f"{path}.tenants: name at least one tenant (or client) that surges")
        _check_rate_arrival(f"{path}.arrival", self.arrival)


#: One entry of ``WorkloadSpec.adversarial``.
AdversarialPattern = SynchronizedBurst | LongPromptFlood | TenantSurge
_ADVERSARIAL_CLASSES = (SynchronizedBurst, LongPromptFlood, TenantSurge)


def pattern_targets(
    pattern: SynchronizedBurst | TenantSurge, clients: tuple[ClientSpec, ...]
) -> list[int]:
    """Indices of the clients a burst or surge targets (every client when it names none)."""
    if not pattern.clients and not pattern.tenants:
        return list(range(len(clients)))
    return [
        i for i, c in enumerate(clients)
        if c.id in pattern.clients or c.tenant_id in pattern.tenants
    ]  # fmt: skip


def _check_targets(path: str, pattern: SynchronizedBurst | TenantSurge,
                   clients: tuple[ClientSpec, ...]) -> None:
    for key, attr in (("clients", "id"), ("tenants", "tenant_id")):
        known = [getattr(c, attr) for c in clients]
        for i, name in enumerate(getattr(pattern, key)):
            if name not in known:
                allowed = ", ".join(repr(n) for n in dict.fromkeys(known))
                raise ValueError(f"{path}.{key}[{i}]: no client has {attr} {name!r}; "
                                 f"known: {allowed}")


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
            _check_number("seed", self.seed, integral=True)
        _check_choice("category", self.category, CATEGORIES)
        if not self.clients:
            raise ValueError("clients: at least one client is required")
        for i, client in enumerate(self.clients):
            if not isinstance(client, ClientSpec):
                raise ValueError(f"clients[{i}]: must be a ClientSpec")
            client.check(f"clients[{i}]")
        _check_number("aggregate_rate", self.aggregate_rate, gt=0)
        if self.horizon_us is not None:
            _check_number("horizon", self.horizon_us, ge=1, integral=True)
        if self.num_requests is not None:
            _check_number("num_requests", self.num_requests, ge=1, integral=True)
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

    def _check_pattern(self, path: str, pattern: Any) -> None:
        if not isinstance(pattern, _ADVERSARIAL_CLASSES):
            raise ValueError(
                f"{path}: must be a SynchronizedBurst, LongPromptFlood or TenantSurge"
            )
        pattern.check(path)
        if isinstance(pattern, LongPromptFlood):
            return
        _check_targets(path, pattern, self.clients)
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
    _check_number("prefix_tokens", prefix_tokens, ge=0, integral=True)
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
     "multimodal", "reasoning", "network"}
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
    _check_number(path, value, integral=True)
    return int(value)


def _opt_str(path: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML `id: 7` is meant as the name "7"
    _check_str(path, value)
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
    if data.get("concurrency"):
        raise ValueError(f"{path}.concurrency: closed-loop concurrency clients are not supported")
    if data.get("closed_loop"):
        raise ValueError(f"{path}.closed_loop: closed-loop sessions are not supported")
    think = data.get("think_time_us")
    if think is not None:
        _check_number(f"{path}.think_time_us", think, ge=0, integral=True)
    if data.get("model") is not None:
        _check_str(f"{path}.model", data["model"])
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
    if "arrival" not in data:
        raise ValueError(f"{path}.arrival: required")
    return ClientSpec(
        id=_opt_str(f"{path}.id", data.get("id")),
        tenant_id=_opt_str(f"{path}.tenant_id", data.get("tenant_id")),
        slo_class=slo_class,
        rate_fraction=data.get("rate_fraction", 1.0),
        arrival=_parse_arrival(f"{path}.arrival", data["arrival"]),
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
                _is_number(v) and v != 0 for v in params.values()):
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
    _check_choice(f"{path}.type", data["type"], ADVERSARIAL_TYPES)
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
