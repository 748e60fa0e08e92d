"""The policy sections of the configuration: admission, priority, routing, scheduler and the
``PolicyConfig`` that holds them with the autoscaler (docs/semantics.md §5)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blisjax.config._checks import (
    ConfigError,
    check_choice,
    check_pairs,
    set_field,
)
from blisjax.config.autoscale import (
    AutoscalerConfig,
    as_autoscaler,
)
from blisjax.config.fields import (
    ADMISSION_POLICIES,
    DEFAULT_SLO_CLASS_SCORES,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    SCHEDULER_POLICIES,
    SCORER_NAMES,
    SLO_CLASS_NAMES,
    SLO_CLASS_SCORE_LIMIT,
    TIE_BREAKS,
    UNKNOWN_SLO_CLASS_SCORE,
    check_knob,
    choice_key,
    ensure_type,
    knob,
    name_key,
    non_negative_int,
)


def _program_section(section: Any, site: str) -> None:
    """Check a section's program fields (``program``, ``tree``, ``params``): a tree becomes
    its expression (``program``), params a tuple of (name, value) pairs; with policy
    ``program`` one of them must be given. The compiled program is ``section.compiled()``."""
    from blisjax.program import compile_program  # the program package imports config

    p = f"policy.{site}"
    params = section.params
    if isinstance(params, Mapping):
        params = tuple(params.items())
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise ConfigError(f"{p}.params", f"must be a mapping of names to numbers, got {params!r}")
    pairs = tuple(params)
    if any(not (isinstance(x, (tuple, list)) and len(x) == 2) for x in pairs):
        raise ConfigError(f"{p}.params", f"must be a mapping of names to numbers, got {params!r}")
    pairs = tuple((k, v) for k, v in pairs)
    if section.tree is not None and section.program:
        raise ConfigError(p, "give program or tree, not both")
    if section.tree is None and not section.program:
        if section.policy == "program":
            raise ConfigError(f"{p}.program", "policy 'program' needs a program (an "
                              "expression) or a tree")
        if pairs:
            raise ConfigError(f"{p}.params", "parameters need a program or a tree")
        set_field(section, "params", ())
        return
    compiled = compile_program(site, program=section.program or None, tree=section.tree,
                               params=dict(pairs), path=p)
    set_field(section, "program", compiled.text)
    set_field(section, "tree", None)
    set_field(section, "params", compiled.params)


def _compiled(section: Any, site: str):
    """The section's ``PolicyProgram`` (None without a program)."""
    if not section.program:
        return None
    from blisjax.program import compile_program

    return compile_program(site, program=section.program, params=dict(section.params),
                           path=f"policy.{site}")


def normalized_weights(weights: list[float]) -> list[float]:
    """Scorer weights over their sum, the sum taken left to right (BLIS's order): the weighted
    router's view, the one formula both engines use (the JAX engine's weights are normalised
    on the host with it)."""
    total = 0.0
    for w in weights:
        total += w
    return [w / total for w in weights]


@dataclass(frozen=True)
class AdmissionConfig:
    """Admission policy (docs/semantics.md §5.3).

    Attributes:
      policy: always-admit | token-bucket | reject-all | rate-limit | tenant-quota.
      token_bucket_capacity: bucket size, input tokens, >= 0 (token-bucket).
      token_bucket_refill_rate: refill, input tokens per second, >= 0 (token-bucket).
      rate_limit_rps: sustained admissions, requests per second, >= 0 (rate-limit).
      rate_limit_burst: burst size, requests, >= 0 (rate-limit).
      tenant_max_in_flight: per-tenant cap on admitted, unfinished requests (tenant-quota).
      default_tenant_max_in_flight: cap for tenants not listed, >= 0.
      program, tree, params: policy ``program`` admits iff the program's value is > 0
        (docs/policy-programs.md): an expression, or a decision tree (stored as its
        expression), and its named parameters (name → number).
      shed_queue_depth: load-shed admits only while the routable instances' queued requests
        (router snapshots, summed) are fewer than this, >= 0 (0: not checked).
      shed_kv_utilization: load-shed admits only while their mean KV utilization (router
        snapshots) is below this, in [0, 1] (0: not checked).
      tenant_bucket_capacity, tenant_bucket_refill_rate: tenant-bucket's per-tenant bucket
        size (input tokens) and refill (input tokens per second), >= 0; tenants not listed get
        ``default_tenant_bucket_capacity`` / ``default_tenant_bucket_refill_rate``.
    """

    policy: str = "always-admit"
    token_bucket_capacity: float = 10000.0
    token_bucket_refill_rate: float = 1000.0
    rate_limit_rps: float = 100.0
    rate_limit_burst: float = 100.0
    tenant_max_in_flight: tuple[tuple[str, int], ...] = ()
    default_tenant_max_in_flight: int = 1000
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()
    shed_queue_depth: int = 0
    shed_kv_utilization: float = 0.0
    tenant_bucket_capacity: tuple[tuple[str, float], ...] = ()
    default_tenant_bucket_capacity: float = 10000.0
    tenant_bucket_refill_rate: tuple[tuple[str, float], ...] = ()
    default_tenant_bucket_refill_rate: float = 1000.0

    def __post_init__(self) -> None:
        p = "policy.admission"
        check_choice(f"{p}.policy", self.policy, ADMISSION_POLICIES)
        _program_section(self, "admission")
        for name in (
            "token_bucket_capacity",
            "token_bucket_refill_rate",
            "rate_limit_rps",
            "rate_limit_burst",
        ):
            set_field(self, name, check_knob(f"{p}.{name}", getattr(self, name), min_value=0))
        limits = check_pairs(
            f"{p}.tenant_max_in_flight", self.tenant_max_in_flight, name_key, non_negative_int
        )
        set_field(self, "tenant_max_in_flight", limits)
        default = non_negative_int(
            f"{p}.default_tenant_max_in_flight", self.default_tenant_max_in_flight
        )
        set_field(self, "default_tenant_max_in_flight", default)
        set_field(self, "shed_queue_depth",
                  non_negative_int(f"{p}.shed_queue_depth", self.shed_queue_depth))
        set_field(self, "shed_kv_utilization",
                  check_knob(f"{p}.shed_kv_utilization", self.shed_kv_utilization,
                             min_value=0, max_value=1))
        for name in ("tenant_bucket_capacity", "tenant_bucket_refill_rate"):
            set_field(self, name, check_pairs(
                f"{p}.{name}", getattr(self, name), name_key,
                lambda path, v: check_knob(path, v, min_value=0)))
            default = f"default_{name}"
            set_field(self, default, check_knob(f"{p}.{default}", getattr(self, default),
                                                min_value=0))

    def compiled(self):
        """The admission ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "admission")

    def max_in_flight(self, tenant: str) -> int:
        """In-flight cap of ``tenant`` under tenant-quota."""
        return dict(self.tenant_max_in_flight).get(tenant, self.default_tenant_max_in_flight)

    def tenant_bucket_table(self, tenants: tuple[str, ...]) -> tuple[tuple[float, float], ...]:
        """tenant-bucket's (capacity, refill per second) of each tenant, indexed by the
        workload's tenant code."""
        cap, rate = dict(self.tenant_bucket_capacity), dict(self.tenant_bucket_refill_rate)
        return tuple((float(cap.get(t, self.default_tenant_bucket_capacity)),
                      float(rate.get(t, self.default_tenant_bucket_refill_rate)))
                     for t in tenants)

    def max_in_flight_table(self, tenants: tuple[str, ...]) -> tuple[int, ...]:
        """``max_in_flight`` of each tenant, indexed by the workload's tenant code."""
        return tuple(self.max_in_flight(t) for t in tenants)


def _slo_score(path: str, value: Any) -> float:
    limit = SLO_CLASS_SCORE_LIMIT
    return check_knob(path, value, min_value=-limit, max_value=limit)


@dataclass(frozen=True)
class PriorityConfig:
    """Request priority, recomputed each step; higher = more urgent (docs/semantics.md Decision 5).

    Attributes:
      policy: constant | slo-based | slo-class | tenant-priority | deadline-aware.
      age_weight: slo-based score per second of age (negative = BLIS's inverted-slo).
      slo_class_scores: slo-class score per SLO class, each in [-100, 100]; classes not listed
        score 3.0 (BLIS: unknown classes score as "standard").
      tenant_scores: tenant-priority score per tenant (finite).
      default_tenant_score: tenant-priority score of tenants not listed.
      no_deadline_slack_s: deadline-aware slack, seconds, assumed for requests without a
        deadline (> 0).
      program, tree, params: policy ``program`` scores a request by the program's value
        (docs/policy-programs.md; see ``AdmissionConfig``).
    """

    policy: str = "constant"
    age_weight: float = 1.0
    slo_class_scores: tuple[tuple[str, float], ...] = DEFAULT_SLO_CLASS_SCORES
    tenant_scores: tuple[tuple[str, float], ...] = ()
    default_tenant_score: float = 0.0
    no_deadline_slack_s: float = 1000.0
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        p = "policy.priority"
        check_choice(f"{p}.policy", self.policy, PRIORITY_POLICIES)
        _program_section(self, "priority")
        set_field(self, "age_weight", knob(f"{p}.age_weight", self.age_weight))
        scores = check_pairs(
            f"{p}.slo_class_scores", self.slo_class_scores, choice_key(SLO_CLASS_NAMES), _slo_score
        )
        set_field(self, "slo_class_scores", scores)
        set_field(
            self,
            "tenant_scores",
            check_pairs(f"{p}.tenant_scores", self.tenant_scores, name_key, knob),
        )
        set_field(
            self,
            "default_tenant_score",
            knob(f"{p}.default_tenant_score", self.default_tenant_score),
        )
        slack = check_knob(
            f"{p}.no_deadline_slack_s", self.no_deadline_slack_s, min_value=0, min_open=True
        )
        set_field(self, "no_deadline_slack_s", slack)

    def compiled(self):
        """The priority ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "priority")

    def slo_class_score(self, slo_class: str) -> float:
        """slo-class score of a class name ("" = no class)."""
        return dict(self.slo_class_scores).get(slo_class, UNKNOWN_SLO_CLASS_SCORE)

    def tenant_score(self, tenant: str) -> float:
        """tenant-priority score of a tenant."""
        return dict(self.tenant_scores).get(tenant, self.default_tenant_score)

    def slo_class_score_table(self) -> tuple[float, ...]:
        """``slo_class_score`` of every SLO class, indexed by its code (``SLO_CLASS_NAMES``)."""
        return tuple(float(self.slo_class_score(c)) for c in SLO_CLASS_NAMES)

    def tenant_score_table(self, tenants: tuple[str, ...]) -> tuple[float, ...]:
        """``tenant_score`` of each tenant, indexed by the workload's tenant code."""
        return tuple(float(self.tenant_score(t)) for t in tenants)


@dataclass(frozen=True)
class ScorerWeight:
    """One scorer of the weighted routing policy and its (un-normalized) weight >= 0."""

    name: str
    weight: float

    def __post_init__(self) -> None:
        check_choice("policy.routing.scorers.name", self.name, SCORER_NAMES)
        set_field(
            self,
            "weight",
            check_knob(f"policy.routing.scorers[{self.name!r}].weight", self.weight, min_value=0),
        )


DEFAULT_SCORERS: tuple[ScorerWeight, ...] = (
    ScorerWeight("prefix-affinity", 3.0),
    ScorerWeight("queue-depth", 2.0),
    ScorerWeight("kv-utilization", 2.0),
)


def as_scorer(value: Any) -> ScorerWeight:
    if isinstance(value, ScorerWeight):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"name", "weight"}
        if unknown or "name" not in value or "weight" not in value:
            raise ConfigError(
                "policy.routing.scorers",
                f"entries need exactly name and weight, got {dict(value)!r}",
            )
        return ScorerWeight(value["name"], value["weight"])
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return ScorerWeight(value[0], value[1])
    raise ConfigError(
        "policy.routing.scorers", f"entries must be ScorerWeight(name, weight), got {value!r}"
    )


@dataclass(frozen=True)
class RoutingConfig:
    """Routing policy (docs/semantics.md §5.6).

    Attributes:
      policy: round-robin | least-loaded | always-busiest | weighted.
      scorers: weighted-policy scorers in evaluation order; weights are normalized to sum 1 by
        the router, so only ratios matter; at least one weight must be > 0.
      tie_break: how least-loaded and weighted routing choose among tied instances:
        blis-random (BLIS's draw from its "router" random stream, seeded from ``seed``; only
        when more than one instance ties) | lowest-index. Also program routing's ties.
      program, tree, params: policy ``program`` scores each candidate instance by the
        program's value, the highest wins (docs/policy-programs.md; see ``AdmissionConfig``).
    """

    policy: str = "round-robin"
    scorers: tuple[ScorerWeight, ...] = DEFAULT_SCORERS
    tie_break: str = "blis-random"
    program: str = ""
    tree: Any = None
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        check_choice("policy.routing.policy", self.policy, ROUTING_POLICIES)
        _program_section(self, "routing")
        check_choice("policy.routing.tie_break", self.tie_break, TIE_BREAKS)
        if isinstance(self.scorers, (str, bytes, Mapping)) or not hasattr(self.scorers, "__iter__"):
            raise ConfigError(
                "policy.routing.scorers", f"must be a list of scorers, got {self.scorers!r}"
            )
        scorers = tuple(as_scorer(s) for s in self.scorers)
        set_field(self, "scorers", scorers)
        if self.policy == "weighted" and not scorers:
            raise ConfigError(
                "policy.routing.scorers", "must list at least one scorer for policy 'weighted'"
            )
        if scorers and all(s.weight == 0 for s in scorers):
            raise ConfigError("policy.routing.scorers", "weights must not all be 0")

    def compiled(self):
        """The routing ``PolicyProgram`` (None without a program)."""
        return _compiled(self, "routing")

    def normalized_weights(self) -> tuple[float, ...]:
        """Scorer weights divided by their sum (the router's view), in scorer order."""
        return tuple(normalized_weights([float(s.weight) for s in self.scorers]))


@dataclass(frozen=True)
class SchedulerConfig:
    """Instance wait-queue order (docs/semantics.md §5.9): fcfs | priority-fcfs | sjf."""

    policy: str = "fcfs"

    def __post_init__(self) -> None:
        check_choice("policy.scheduler.policy", self.policy, SCHEDULER_POLICIES)


@dataclass(frozen=True)
class PolicyConfig:
    """The control policies (a BLIS policy bundle plus our extra knobs)."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)

    def __post_init__(self) -> None:
        set_field(self, "autoscaler", as_autoscaler(self.autoscaler))
        ensure_type("policy.admission", self.admission, AdmissionConfig)
        ensure_type("policy.priority", self.priority, PriorityConfig)
        ensure_type("policy.routing", self.routing, RoutingConfig)
        ensure_type("policy.scheduler", self.scheduler, SchedulerConfig)
