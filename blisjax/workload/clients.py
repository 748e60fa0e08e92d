"""The clients of a BLIS workload spec v2 and the checks the spec's records share.

A client has a share of the aggregate request rate, an arrival process (``ArrivalSpec``),
input and output token-length distributions (``DistSpec``), an optional shared-prefix group, a
tenant, an SLO class, an optional timeout, optional lifecycle windows (``LifecycleSpec``) and
optional multi-turn conversations (``MultiTurnSpec``). Units: rates in requests/second, times
in integer microseconds, lengths in tokens. Each record's ``check(path)`` raises ValueError
naming the field path, e.g. ``clients[1].arrival.cv: must be > 0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(
    path: str,
    value: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    integral: bool = False,
) -> None:
    """Raise ValueError naming ``path`` unless ``value`` is a finite number within the bounds."""
    if not is_number(value):
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


def check_str(path: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{path}: must be a string, got {value!r}")


def check_choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
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
        check_choice(f"{path}.process", self.process, ARRIVAL_PROCESSES)
        if self.cv is not None:
            check_number(f"{path}.cv", self.cv, gt=0)
            if self.process == "weibull":
                lo, hi = WEIBULL_CV_RANGE
                check_number(f"{path}.cv", self.cv, ge=lo, le=hi)
        if self.shape is not None:
            check_number(f"{path}.shape", self.shape, gt=0)
        if self.scale is not None:
            check_number(f"{path}.scale", self.scale, gt=0)
        if self.period_us is not None:
            check_number(f"{path}.period_us", self.period_us, ge=1, integral=True)
        check_number(f"{path}.jitter_us", self.jitter_us, ge=0, integral=True)
        check_number(f"{path}.pareto_alpha", self.pareto_alpha, gt=1)


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
        check_choice(f"{path}.type", self.type, DIST_TYPES)
        required, optional = DIST_PARAMS[self.type]
        for name in self.params:
            if name not in required and name not in optional:
                raise ValueError(f"{path}.params.{name}: unknown parameter for {self.type!r}")
        for name in required:
            if name not in self.params:
                raise ValueError(f"{path}.params.{name}: required for {self.type!r}")
        for name, value in self.params.items():
            check_number(f"{path}.params.{name}", value)
        _TYPE_CHECKS[self.type](self, path)
        if self.type != "empirical" and (self.bins or self.probabilities):
            raise ValueError(f"{path}.bins: only used by the 'empirical' type")


def _check_min_max(d: DistSpec, path: str) -> None:
    for name in ("min", "max"):
        if name in d.params:
            check_number(f"{path}.params.{name}", d.params[name], ge=0, integral=True)
    if "min" in d.params and "max" in d.params and d.params["min"] > d.params["max"]:
        raise ValueError(f"{path}.params.min: must be <= max ({d.params['max']!r})")


def _check_gaussian(d: DistSpec, path: str) -> None:
    check_number(f"{path}.params.std_dev", d.params["std_dev"], ge=0)
    _check_min_max(d, path)


def _check_exponential(d: DistSpec, path: str) -> None:
    check_number(f"{path}.params.mean", d.params["mean"], gt=0)
    _check_min_max(d, path)


def _check_lognormal(d: DistSpec, path: str) -> None:
    check_number(f"{path}.params.sigma", d.params["sigma"], ge=0)
    _check_min_max(d, path)


def _check_constant(d: DistSpec, path: str) -> None:
    check_number(f"{path}.params.value", d.params["value"], ge=0, integral=True)


def _check_pareto_lognormal(d: DistSpec, path: str) -> None:
    check_number(f"{path}.params.alpha", d.params["alpha"], gt=0)
    check_number(f"{path}.params.xm", d.params["xm"], gt=0)
    check_number(f"{path}.params.sigma", d.params["sigma"], ge=0)
    check_number(f"{path}.params.mix_weight", d.params["mix_weight"], ge=0, le=1)


def _check_empirical(d: DistSpec, path: str) -> None:
    if not d.bins:
        raise ValueError(f"{path}.bins: empirical distribution needs at least one bin")
    if len(d.bins) != len(d.probabilities):
        raise ValueError(
            f"{path}.probabilities: length {len(d.probabilities)} differs from bins ({len(d.bins)})"
        )
    for i, b in enumerate(d.bins):
        check_number(f"{path}.bins[{i}]", b, ge=0, integral=True)
    if len(set(d.bins)) != len(d.bins):
        raise ValueError(f"{path}.bins: values must be distinct")
    for i, p in enumerate(d.probabilities):
        check_number(f"{path}.probabilities[{i}]", p, ge=0)
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


def default_dist() -> DistSpec:
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
        check_number(f"{path}.start_us", self.start_us, ge=0, integral=True)
        check_number(f"{path}.end_us", self.end_us, integral=True)
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
        check_number(f"{path}.max_rounds", self.max_rounds, ge=1, integral=True)
        check_number(f"{path}.think_time_us", self.think_time_us, ge=0, integral=True)
        check_choice(f"{path}.context_growth", self.context_growth, CONTEXT_GROWTH)


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
      concurrency: > 0: a closed-loop client of this many users instead of a rate (BLIS
        ``concurrency``; ``rate_fraction`` must then be 0 and ``arrival`` is unused): each user
        sends a request, waits for it to complete, thinks ``think_time_us`` and sends the
        next, until the workload's request count or the horizon ends it
        (``generate._with_users``).
      think_time_us: a concurrency user's µs between a completion and its next request, >= 0;
        user u's first request is sent at u · think_time_us / concurrency.
      rounds_per_user: most requests one concurrency user sends, >= 2 (its rows in the
        workload; a capacity, not a behaviour: a run in which a user would send more is
        refused, naming it). None: 2 · ⌈(num_requests − first requests) / users⌉ + 2; a
        workload without ``num_requests`` must set it.
    """

    id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    rate_fraction: float = 1.0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_distribution: DistSpec = field(default_factory=default_dist)
    output_distribution: DistSpec = field(default_factory=default_dist)
    prefix_group: str = ""
    prefix_length: int = DEFAULT_PREFIX_LENGTH
    timeout_us: int | None = None
    slo_target_us: int | None = None
    lifecycle: LifecycleSpec | None = None
    multi_turn: MultiTurnSpec | None = None
    concurrency: int = 0
    think_time_us: int = 0
    rounds_per_user: int | None = None

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        check_number(f"{path}.concurrency", self.concurrency, ge=0, integral=True)
        check_number(f"{path}.think_time_us", self.think_time_us, ge=0, integral=True)
        if self.rounds_per_user is not None:
            check_number(f"{path}.rounds_per_user", self.rounds_per_user, ge=2, integral=True)
        if self.concurrency:
            self._check_users(path)
        if self.multi_turn is not None:
            if not isinstance(self.multi_turn, MultiTurnSpec):
                raise ValueError(f"{path}.reasoning.multi_turn: must be a MultiTurnSpec")
            self.multi_turn.check(f"{path}.reasoning.multi_turn")
        for name in ("id", "tenant_id", "prefix_group"):
            check_str(f"{path}.{name}", getattr(self, name))
        check_choice(f"{path}.slo_class", self.slo_class, SLO_CLASSES)
        if not self.concurrency:
            check_number(f"{path}.rate_fraction", self.rate_fraction, gt=0)
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
        check_number(f"{path}.prefix_length", self.prefix_length, ge=min_prefix, integral=True)
        # Errors use the YAML key names ("timeout" is in µs there too).
        for name, key in (("timeout_us", "timeout"), ("slo_target_us", "slo_target_us")):
            value = getattr(self, name)
            if value is not None:
                check_number(f"{path}.{key}", value, ge=0, integral=True)
        if self.lifecycle is not None:
            if not isinstance(self.lifecycle, LifecycleSpec):
                raise ValueError(f"{path}.lifecycle: must be a LifecycleSpec")
            self.lifecycle.check(f"{path}.lifecycle")

    def _check_users(self, path: str) -> None:
        """A concurrency client sends at its users' pace: no rate share, no conversations,
        no activity windows (BLIS: concurrency and rate_fraction are mutually exclusive)."""
        if self.rate_fraction != 0:
            raise ValueError(f"{path}.rate_fraction: must be 0 (or absent) with concurrency "
                             f"{self.concurrency}: a concurrency client sends at its users' "
                             f"pace, got {self.rate_fraction!r}")
        if self.multi_turn is not None:
            raise ValueError(f"{path}.reasoning.multi_turn: a concurrency client's users send "
                             "single requests; give conversations to a rate-based client")
        if self.lifecycle is not None:
            raise ValueError(f"{path}.lifecycle: activity windows apply to rate-based "
                             "clients, not to a concurrency client's users")
