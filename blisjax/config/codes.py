"""Policy templates, routing scorers and request stages as integer codes.

One enumeration per choice, shared by the configuration (which accepts and reports the names),
the reference engine (which branches on the members) and the JAX engine (whose per-lane knobs
are the codes, so one compiled program evaluates any mix of templates). A member's *label* is the
name used in YAML files, on the command line and in BLIS policy bundles: the member name in
lower case with ``_`` written as ``-`` (``AdmissionPolicy.TOKEN_BUCKET`` is ``token-bucket``).
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    """An integer code with a configuration label."""

    @property
    def label(self) -> str:
        """The configuration name of this member (``TOKEN_BUCKET`` → ``token-bucket``)."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        """Every label, in code order."""
        return tuple(member.label for member in cls)

    @classmethod
    def of(cls, label: str) -> Code:
        """The member whose label is ``label``; ``ValueError`` naming the choices otherwise."""
        for member in cls:
            if member.label == label:
                return member
        raise ValueError(f"{label!r} is not one of {', '.join(cls.labels())}")


class AdmissionPolicy(Code):
    """Admission templates (docs/semantics.md §5.3)."""

    ALWAYS_ADMIT = 0
    TOKEN_BUCKET = 1
    REJECT_ALL = 2
    RATE_LIMIT = 3
    TENANT_QUOTA = 4
    LOAD_SHED = 5  # admit while the cluster's queued requests and KV use are below limits
    TENANT_BUCKET = 6  # a token bucket per tenant (cost = input tokens)
    PROGRAM = 7  # a policy program (blisjax.program): admit iff its value is > 0


class SaturationDetector(Code):
    """The gateway queue's saturation detectors (docs/semantics.md §5.11; BLIS HEAD's
    ``--saturation-detector``)."""

    NEVER = 0
    UTILIZATION = 1
    CONCURRENCY = 2


class PriorityPolicy(Code):
    """Priority templates (docs/semantics.md §5.5, Part B B.2, Decision 5)."""

    CONSTANT = 0
    SLO_BASED = 1
    SLO_CLASS = 2
    TENANT_PRIORITY = 3
    DEADLINE_AWARE = 4
    PROGRAM = 5  # a policy program's value


class RoutingPolicy(Code):
    """Routing templates (docs/semantics.md §5.6)."""

    ROUND_ROBIN = 0
    LEAST_LOADED = 1
    ALWAYS_BUSIEST = 2
    WEIGHTED = 3
    PROGRAM = 4  # a policy program's score per candidate, the highest wins


class Scorer(Code):
    """Scorers of the weighted routing policy (docs/semantics.md §5.6). The first four are the
    blackbox-era BLIS's; the others are BLIS HEAD's (f90a1e3a)."""

    PREFIX_AFFINITY = 0
    QUEUE_DEPTH = 1
    KV_UTILIZATION = 2
    LOAD_BALANCE = 3
    PRECISE_PREFIX_CACHE = 4
    LOAD_AWARE = 5
    ACTIVE_REQUESTS = 6
    RUNNING_REQUESTS = 7
    NO_HIT_LRU = 8
    VLLM_DP = 9


#: Queue depth at which the load-aware scorer reaches 0 (BLIS HEAD's, after llm-d's default).
LOAD_AWARE_QUEUE_THRESHOLD = 128

#: Scorers that read the instances' prefix caches at routing (BLIS HEAD's cache query).
CACHE_SCORERS = frozenset({Scorer.PRECISE_PREFIX_CACHE, Scorer.NO_HIT_LRU})


class TieBreak(Code):
    """How least-loaded and weighted routing choose among equally good instances
    (docs/semantics.md Decisions 6 and 13): BLIS's draw from its "router" random stream, or
    the lowest instance index."""

    BLIS_RANDOM = 0
    LOWEST_INDEX = 1


class PDDecider(Code):
    """Which requests P/D pools disaggregate (docs/semantics.md §5.10, Decision 15)."""

    NEVER = 0
    ALWAYS = 1
    PREFIX_THRESHOLD = 2


class PDRole(Code):
    """What an instance serves under P/D pools: a bit mask (prefill 1, decode 2)."""

    NONE = 0  # past the pools: never routed to
    PREFILL = 1
    DECODE = 2
    SHARED = 3  # PREFILL | DECODE


class SchedulerPolicy(Code):
    """Instance wait-queue orders (docs/semantics.md §5.9)."""

    FCFS = 0
    PRIORITY_FCFS = 1
    SJF = 2


class PreemptionPolicy(Code):
    """Which running request a step evicts when KV blocks run out (docs/semantics.md §2.5)."""

    FCFS = 0
    PRIORITY = 1


class AutoscalerPolicy(Code):
    """Autoscaling templates (docs/semantics.md Decision 16; docs/autoscaling.md)."""

    NONE = 0
    THRESHOLD = 1
    TARGET_UTILIZATION = 2
    QUEUE_DEPTH = 3
    BLIS_SATURATION = 4


class DrainPolicy(Code):
    """What a draining instance does with the requests it holds (Decision 16)."""

    WAIT = 0  # serve everything it holds, then terminate
    IMMEDIATE = 1  # drop everything it holds and terminate at once
    REDIRECT = 2  # route its not-yet-running requests again, serve the running ones


class InstanceState(Code):
    """An instance slot's lifecycle state (Decision 16). Only WARMING_UP and ACTIVE are
    routable; UNUSED slots have never held an instance."""

    UNUSED = 0
    SCHEDULING = 1  # placed, waiting for its node to be provisioned
    LOADING = 2  # loading the model
    WARMING_UP = 3
    ACTIVE = 4
    DRAINING = 5  # not routable, serving what it holds
    TERMINATED = 6


#: States in which an instance holds its slot (and its GPUs, and costs).
HOLDING_STATES = frozenset({InstanceState.SCHEDULING, InstanceState.LOADING,
                            InstanceState.WARMING_UP, InstanceState.ACTIVE,
                            InstanceState.DRAINING})
#: States the router sends requests to.
ROUTABLE_STATES = frozenset({InstanceState.WARMING_UP, InstanceState.ACTIVE})


class TraceLevel(Code):
    """What a decision trace records (docs/semantics.md Decision 17; docs/tracing.md)."""

    NONE = 0  # no trace (no collector: an untraced run pays nothing)
    DECISIONS = 1  # every policy decision with its context, and the anomalies
    FULL = 2  # the decisions and every executed event


#: Every fitness key BLIS accepts (``metrics.fitness_weights``; their formulas:
#: ``blisjax.metrics.formulas.fitness_components``).
FITNESS_KEYS: tuple[str, ...] = (
    "throughput",
    "tokens_per_sec",
    "p99_ttft",
    "p50_ttft",
    "mean_ttft",
    "p99_e2e",
    "p50_e2e",
    "mean_e2e",
)
