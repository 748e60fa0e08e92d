"""blisjax's adversarial load patterns, added on top of a workload's clients: synchronized
bursts, long-prompt floods and tenant surges (docs/semantics.md §8.1). Each is generated from
the workload's seed like the clients' traffic (``blisjax.workload.generate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blisjax.workload.clients import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    check_choice,
    check_number,
    check_str,
    default_dist,
)
from blisjax.workload.types import SLO_CLASSES

#: ``adversarial`` pattern types (blisjax extension of the BLIS spec; docs/configuration.md).
ADVERSARIAL_TYPES = ("synchronized_burst", "long_prompt_flood", "tenant_surge")
#: Client id of a long-prompt flood's requests when it names none.
DEFAULT_FLOOD_ID = "long-prompt-flood"

def _check_names(path: str, value: Any) -> None:
    if not isinstance(value, tuple):
        raise ValueError(f"{path}: must be a list of names, got {value!r}")
    for i, name in enumerate(value):
        check_str(f"{path}[{i}]", name)


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
    check_number(f"{path}.start_us", start_us, ge=0, integral=True)
    check_number(f"{path}.end_us", end_us, integral=True)
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
            check_number(f"{path}.period_us", self.period_us, ge=1, integral=True)
        check_number(f"{path}.size", self.size, ge=1, integral=True)
        check_number(f"{path}.start_us", self.start_us, ge=0, integral=True)
        if self.count is not None:
            check_number(f"{path}.count", self.count, ge=1, integral=True)
            if self.period_us is None and self.count > 1:
                raise ValueError(f"{path}.period_us: required when count > 1")
        if self.end_us is not None:
            _check_window(path, self.start_us, self.end_us)
        check_number(f"{path}.spread_us", self.spread_us, ge=0, integral=True)
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
    input_distribution: DistSpec = field(default_factory=default_dist)
    output_distribution: DistSpec = field(default_factory=default_dist)
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    id: str = DEFAULT_FLOOD_ID
    tenant_id: str = ""
    slo_class: str = ""
    timeout_us: int | None = None

    def check(self, path: str) -> None:
        """Raise ValueError naming the first invalid field under ``path``."""
        _check_window(path, self.start_us, self.end_us)
        check_number(f"{path}.rate", self.rate, gt=0)
        for name in ("input_distribution", "output_distribution"):
            dist = getattr(self, name)
            if not isinstance(dist, DistSpec):
                raise ValueError(f"{path}.{name}: must be a DistSpec")
            dist.check(f"{path}.{name}")
        _check_rate_arrival(f"{path}.arrival", self.arrival)
        for name in ("id", "tenant_id"):
            check_str(f"{path}.{name}", getattr(self, name))
        check_choice(f"{path}.slo_class", self.slo_class, SLO_CLASSES)
        if self.timeout_us is not None:
            check_number(f"{path}.timeout", self.timeout_us, ge=0, integral=True)

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
        check_number(f"{path}.factor", self.factor, gt=1)
        _check_names(f"{path}.clients", self.clients)
        _check_names(f"{path}.tenants", self.tenants)
        if not self.clients and not self.tenants:
            raise ValueError(f"{path}.tenants: name at least one tenant (or client) that surges")
        _check_rate_arrival(f"{path}.arrival", self.arrival)


#: One entry of ``WorkloadSpec.adversarial``.
AdversarialPattern = SynchronizedBurst | LongPromptFlood | TenantSurge
ADVERSARIAL_CLASSES = (SynchronizedBurst, LongPromptFlood, TenantSurge)


def pattern_targets(
    pattern: SynchronizedBurst | TenantSurge, clients: tuple[ClientSpec, ...]
) -> list[int]:
    """Indices of the rate-based clients a burst or surge targets (every one when it names
    none; a concurrency client's users send at their own pace)."""
    if not pattern.clients and not pattern.tenants:
        return [i for i, c in enumerate(clients) if not c.concurrency]
    return [
        i for i, c in enumerate(clients)
        if (c.id in pattern.clients or c.tenant_id in pattern.tenants) and not c.concurrency
    ]  # fmt: skip


def check_targets(path: str, pattern: SynchronizedBurst | TenantSurge,
                   clients: tuple[ClientSpec, ...]) -> None:
    for key, attr in (("clients", "id"), ("tenants", "tenant_id")):
        known = [getattr(c, attr) for c in clients]
        for i, name in enumerate(getattr(pattern, key)):
            if name not in known:
                allowed = ", ".join(repr(n) for n in dict.fromkeys(known))
                raise ValueError(f"{path}.{key}[{i}]: no client has {attr} {name!r}; "
                                 f"known: {allowed}")
