"""Cluster and instance policy templates of the reference engine (plain Python).

Every knob is a plain number from ``blisjax.config.PolicyConfig`` so the JAX engine can carry the
same knobs as arrays; templates are the codes of ``blisjax.config.codes``, as in the JAX engine.
Conventions (docs/semantics.md Decisions 5, 6 and 13): priority scores are float64 with higher =
more urgent; routing ties are broken by BLIS's "router" random stream (or the lowest index).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from blisjax.config.codes import (
    CACHE_SCORERS,
    LOAD_AWARE_QUEUE_THRESHOLD,
    AdmissionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.gorand import blis_subsystem_rand
from blisjax.program.observables import scorer_name
from blisjax.reference import program as programs
from blisjax.reference.code_policy import (
    CodePolicyError,
    InstanceInfo,
    checked_priority,
    checked_scores,
)
from blisjax.rules import normalized_weights

# ---------------------------------------------------------------------------------------------
# Admission
# ---------------------------------------------------------------------------------------------


class TokenBucket:
    """BLIS token bucket: starts full; refills ``rate_per_s`` per second at decision times."""

    def __init__(self, capacity: float, rate_per_s: float) -> None:
        self.capacity = capacity
        self.rate_per_s = rate_per_s
        self.tokens = capacity
        self.last_refill_us = 0

    def try_take(self, cost: float, now_us: int) -> bool:
        elapsed = now_us - self.last_refill_us
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + float(elapsed) * self.rate_per_s / 1e6)
            self.last_refill_us = now_us
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


class Admission:
    """Admission templates: always-admit, reject-all, token-bucket, rate-limit, tenant-quota.

    * ``token-bucket``: cost = input tokens (BLIS).
    * ``rate-limit``: the same bucket counted in requests: capacity ``rate_limit_burst``,
      refill ``rate_limit_rps`` per second, cost 1.
    * ``tenant-quota``: reject when the tenant already has ``quota`` admitted requests that have
      not yet completed, timed out or been dropped (per-tenant override, else the default).
    * ``program``: admit iff the program's value is > 0 (request and cluster observables).
    * ``load-shed``: admit iff the routable instances' queued requests (snapshots, summed) are
      fewer than ``shed_queue_depth`` and their mean KV utilization is below
      ``shed_kv_utilization`` (a limit of 0 is not checked).
    * ``tenant-bucket``: ``token-bucket`` with one bucket per tenant (its own capacity and
      refill, else the defaults); each starts full.
    """

    def __init__(self, cfg, tenant_names: tuple[str, ...]) -> None:
        self.policy = AdmissionPolicy.of(cfg.policy)
        self.bucket = None
        if self.policy == AdmissionPolicy.TOKEN_BUCKET:
            self.bucket = TokenBucket(cfg.token_bucket_capacity, cfg.token_bucket_refill_rate)
        elif self.policy == AdmissionPolicy.RATE_LIMIT:
            self.bucket = TokenBucket(cfg.rate_limit_burst, cfg.rate_limit_rps)
        self.tenant_quota = cfg.max_in_flight_table(tenant_names)
        self.program = cfg.compiled() if self.policy == AdmissionPolicy.PROGRAM else None
        self.shed_queue_depth = cfg.shed_queue_depth
        self.tenant_buckets = [TokenBucket(cap, rate) for cap, rate
                               in cfg.tenant_bucket_table(tenant_names)] \
            if self.policy == AdmissionPolicy.TENANT_BUCKET else []
        self.shed_kv_utilization = cfg.shed_kv_utilization

    @property
    def reads_cluster(self) -> bool:
        """Its decision reads the cluster observables (a program, or load-shed)."""
        return self.policy in (AdmissionPolicy.PROGRAM, AdmissionPolicy.LOAD_SHED)

    def admit(self, req, now_us: int, tenant_in_flight: list[int],
              cluster: dict[str, float] | None = None) -> bool:
        """Whether ``req`` is admitted; ``cluster``: the cluster observables (programs)."""
        p = self.policy
        if p == AdmissionPolicy.PROGRAM:
            seen = {**programs.request_observables(req, now_us, tenant_in_flight), **cluster}
            return programs.run(self.program, seen) > 0.0
        if p == AdmissionPolicy.ALWAYS_ADMIT:
            return True
        if p == AdmissionPolicy.REJECT_ALL:
            return False
        if p == AdmissionPolicy.TOKEN_BUCKET:
            return self.bucket.try_take(float(req.input_tokens), now_us)
        if p == AdmissionPolicy.RATE_LIMIT:
            return self.bucket.try_take(1.0, now_us)
        if p == AdmissionPolicy.TENANT_BUCKET:
            return self.tenant_buckets[req.tenant].try_take(float(req.input_tokens), now_us)
        if p == AdmissionPolicy.LOAD_SHED:
            queued = cluster["cluster_queue_depth"]
            kv = cluster["cluster_kv_utilization"]
            return ((self.shed_queue_depth == 0 or queued < self.shed_queue_depth)
                    and (self.shed_kv_utilization == 0.0 or kv < self.shed_kv_utilization))
        # tenant-quota
        return tenant_in_flight[req.tenant] < self.tenant_quota[req.tenant]


# ---------------------------------------------------------------------------------------------
# Priority (recomputed for queued requests at the start of every step)
# ---------------------------------------------------------------------------------------------


class Priority:
    """Priority templates; ``score(req, now)`` is float64, higher = more urgent.

    * ``constant``: 0.
    * ``slo-based``: ``age_weight · (0 + 1e-6·age_us)`` — BLIS's +1 per second of age when the
      weight is 1 (``1.0·x == x`` exactly, so BLIS's values are reproduced bit for bit).
    * ``slo-class``: a static score per SLO class (default critical 4, standard/"" 3, batch -1,
      sheddable -2, background -3).
    * ``tenant-priority``: a static score per tenant (``default_tenant_score`` otherwise).
    * ``deadline-aware``: ``-(1e-6·(deadline_us - now_us))``, i.e. minus the remaining slack in
      seconds (negative once overdue → even more urgent); requests without a deadline get
      ``-no_deadline_slack_s``.
    * ``program``: the program's value (request observables; ``tenant_in_flight`` is the
      cluster's list, set by the cluster).
    """

    def __init__(self, cfg, tenant_names: tuple[str, ...]) -> None:
        self.policy = PriorityPolicy.of(cfg.policy)
        self.program = cfg.compiled() if self.policy == PriorityPolicy.PROGRAM else None
        self.tenant_in_flight: list[int] = [0] * len(tenant_names)
        self.age_weight = cfg.age_weight
        self.class_score = cfg.slo_class_score_table()
        self.tenant_score = cfg.tenant_score_table(tenant_names)
        self.no_deadline_score = -float(cfg.no_deadline_slack_s)
        # a code policy's priority function and the request view it reads (code_policy.py)
        self.code: Callable | None = None
        self.describe: Callable | None = None

    @property
    def is_constant(self) -> bool:
        return self.policy == PriorityPolicy.CONSTANT and self.code is None

    def score(self, req, now_us: int) -> float:
        if self.code is not None:
            return call_code("priority", checked_priority, self.code, self.describe(req),
                             now_us)
        p = self.policy
        if p == PriorityPolicy.PROGRAM:
            return programs.run(self.program, programs.request_observables(
                req, now_us, self.tenant_in_flight))
        if p == PriorityPolicy.CONSTANT:
            return 0.0
        if p == PriorityPolicy.SLO_BASED:
            return self.age_weight * (0.0 + 1e-6 * float(now_us - req.arrival_us))
        if p == PriorityPolicy.SLO_CLASS:
            return self.class_score[req.slo_class]
        if p == PriorityPolicy.TENANT_PRIORITY:
            return self.tenant_score[req.tenant]
        # deadline-aware
        if req.deadline_us > 0:
            return -(1e-6 * float(req.deadline_us - now_us))
        return self.no_deadline_score


# ---------------------------------------------------------------------------------------------
# Instance scheduler: wait-queue order before batch formation (stable sorts)
# ---------------------------------------------------------------------------------------------


def reorder_wait_queue(policy: SchedulerPolicy, queue: list) -> list:
    """Return the wait queue in scheduling order.

    ``fcfs`` keeps enqueue order (preempted requests sit at the front); ``priority-fcfs`` sorts by
    (priority desc, arrival asc, index asc); ``sjf`` by (input length asc, arrival asc, index asc).
    """
    if policy == SchedulerPolicy.FCFS:
        return queue
    if policy == SchedulerPolicy.PRIORITY_FCFS:
        return sorted(queue, key=lambda r: (-r.priority, r.arrival_us, r.index))
    # sjf
    return sorted(queue, key=lambda r: (r.input_tokens, r.arrival_us, r.index))


# ---------------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------------


def call_code(name: str, check: Callable, fn: Callable, *args):
    """``check(fn(*args))``; anything the function raises becomes a ``CodePolicyError``."""
    try:
        raw = fn(*args)
    except Exception as e:  # the policy's own bug, reported as its own
        raise CodePolicyError(f"{name} raised {type(e).__name__}: {e}") from e
    return check(raw)


def leading_present(hashes: list[int], present) -> int:
    """How many of ``hashes``, from the first, are in ``present`` (a set or mapping)."""
    n = 0
    for h in hashes:
        if h not in present:
            break
        n += 1
    return n


class PrefixIndex:
    """Router-side approximate prefix cache of one instance: an LRU of block hashes."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()  # first = least recently used

    def match_length(self, hashes: list[int]) -> int:
        """Consecutive hashes from the start that are present (does not refresh recency)."""
        return leading_present(hashes, self.lru)

    def touch(self, hashes: list[int]) -> None:
        """Record a routed request's blocks, in order: present → MRU; new → insert, evict LRU."""
        for h in hashes:
            if h in self.lru:
                self.lru.move_to_end(h)
            else:
                self.lru[h] = None
                if len(self.lru) > self.capacity:
                    self.lru.popitem(last=False)






def min_max_inverted(values: list[int]) -> list[float]:
    """(max - v) / (max - min) per value; 1.0 for all when every value is equal (BLIS's
    queue-depth, running-requests and vllm-dp normalisation)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        return [1.0] * len(values)
    return [float(hi - v) / float(hi - lo) for v in values]


class Snapshot(NamedTuple):
    """What the router reads about each instance at a decision ([I] lists).

    ``queue_depth``, ``batch_size`` and ``kv_util`` are the (live or periodic) snapshots,
    ``in_flight`` is always live, and ``cached_blocks()`` returns the live prefix-cache query
    (consecutive cached prompt blocks of the request per instance), evaluated only by the
    scorers that need it. ``tenant_in_flight`` (per tenant), ``now_us``, ``recent()`` and
    ``arrivals``: what a routing program's other observables read.
    """

    queue_depth: list[int]
    batch_size: list[int]
    kv_util: list[float]
    in_flight: list[int]
    cached_blocks: Callable[[], list[int]]
    tenant_in_flight: list[int] | None = None
    now_us: int = 0
    recent: Callable[[], list[dict[str, float]]] | None = None  # each instance's signals
    arrivals: int = 0  # requests that arrived in the last RECENT_WINDOW_US (routing programs)


class Routed(NamedTuple):
    """A routing decision: the target instance, and the policy's score per candidate instance
    (``None`` for the templates that do not score: round-robin, least-loaded, busiest)."""

    target: int
    scores: dict[int, float] | None


class Router:
    """Routing templates: round-robin, least-loaded, always-busiest, weighted (with scorers).

    Effective load = queue depth + batch size + in-flight. Least-loaded and weighted routing
    break ties as BLIS does (``tie_break: blis-random``): only when more than one instance
    ties, ``tied[Intn(len(tied))]`` over the tied instances in instance order, drawn from Go's
    generator for BLIS's stream ``stream`` ("router"; a P/D pool's own scorers use
    "prefill-router" / "decode-router", ``blisjax.gorand``); ``lowest-index`` takes the first.
    Always-busiest takes the first (BLIS).

    A decision is among ``candidates`` (instance indices in increasing order; default all):
    a P/D pool routes among its instances only (docs/semantics.md Decision 15), every scorer
    normalising over them. Round-robin counts decisions per ``counter`` key (one per pool by
    default; BLIS shares one counter between both pools).
    """

    def __init__(self, cfg, num_instances: int, block_size_tokens: int,
                 prefix_index_capacity_blocks: int, seed: int, stream: str = "router") -> None:
        self.policy = RoutingPolicy.of(cfg.policy)
        self.num_instances = num_instances
        self.block_size = block_size_tokens
        self.counters: dict[str, int] = {}
        self.scorers = [Scorer.of(s.name) for s in cfg.scorers]
        self.weights = normalized_weights([float(s.weight) for s in cfg.scorers])
        self.rng = (blis_subsystem_rand(seed, stream)
                    if TieBreak.of(cfg.tie_break) == TieBreak.BLIS_RANDOM else None)
        weighted = self.policy == RoutingPolicy.WEIGHTED
        self.program = cfg.compiled() if self.policy == RoutingPolicy.PROGRAM else None
        # the scorers a program reads (its score_<scorer> observables), in code order
        read = set(self.program.reads) if self.program is not None else set()
        self.program_scorers = [x for x in Scorer if scorer_name(x) in read]
        self.prefix_index = None
        if (weighted and Scorer.PREFIX_AFFINITY in self.scorers) \
                or Scorer.PREFIX_AFFINITY in self.program_scorers:
            self.prefix_index = [PrefixIndex(prefix_index_capacity_blocks)
                                 for _ in range(num_instances)]
        self.reads_caches = (weighted and any(x in CACHE_SCORERS for x in self.scorers)) \
            or bool(read & ({"cached_blocks"} | {scorer_name(x) for x in CACHE_SCORERS}))
        # no-hit-lru: instances that took a cold request, most recent first, recorded when
        # the weighted scorers or the program read its scorer
        self.cold_recency: list[int] = []
        self.records_cold = (weighted and Scorer.NO_HIT_LRU in self.scorers) \
            or Scorer.NO_HIT_LRU in self.program_scorers
        # a code policy's route_scores and the request view it reads (code_policy.py)
        self.code: Callable | None = None
        self.describe: Callable | None = None

    def forget_instance(self, i: int) -> None:
        """A new instance took slot ``i``: the router knows nothing of it yet."""
        if self.prefix_index is not None:
            self.prefix_index[i] = PrefixIndex(self.prefix_index[i].capacity)
        if i in self.cold_recency:
            self.cold_recency.remove(i)

    def _pick(self, tied: list[int]) -> int:
        if len(tied) > 1 and self.rng is not None:
            return tied[self.rng.intn(len(tied))]
        return tied[0]

    def route(self, req, prompt_hashes: list[int], snap: Snapshot,
              candidates: list[int] | None = None, counter: str = "") -> int:
        """Target instance for ``req`` among ``candidates``; ``prompt_hashes`` are its full
        prompt blocks' hashes."""
        return self.decide(req, prompt_hashes, snap, candidates, counter).target

    def decide(self, req, prompt_hashes: list[int], snap: Snapshot,
               candidates: list[int] | None = None, counter: str = "") -> Routed:
        """``route``, with the policy's scores (weighted and program routing only, as BLIS's
        decisions carry the weighted ones)."""
        idx = list(range(self.num_instances)) if candidates is None else candidates
        n = len(idx)
        if self.code is not None:
            return self._code_decision(req, snap, idx)
        p = self.policy
        if p == RoutingPolicy.ROUND_ROBIN:
            count = self.counters.get(counter, 0)
            self.counters[counter] = count + 1
            return Routed(idx[count % n], None)
        load = [snap.queue_depth[i] + snap.batch_size[i] + snap.in_flight[i] for i in idx]
        if p == RoutingPolicy.ALWAYS_BUSIEST:
            return Routed(idx[min(range(n), key=lambda k: (-load[k], k))], None)
        if p == RoutingPolicy.LEAST_LOADED:
            least = min(load)
            return Routed(self._pick([idx[k] for k in range(n) if load[k] == least]), None)
        cached = None
        if self.reads_caches:
            every = snap.cached_blocks()
            cached = [every[i] for i in idx]
        cold = cached is not None and not any(c > 0 for c in cached)
        scoring = self.program_scores if p == RoutingPolicy.PROGRAM else self.weighted_scores
        scores = scoring(req, prompt_hashes, snap, idx, load, cached, cold)
        best = max(scores)  # weighted scores are >= 0: BLIS's start from -1 changes nothing
        target = self._pick([idx[k] for k in range(n) if scores[k] == best])
        # observers: the prefix index records the request; no-hit-lru a cold request's target
        if self.prefix_index is not None:
            self.prefix_index[target].touch(prompt_hashes)
        if cold and self.records_cold:
            if target in self.cold_recency:
                self.cold_recency.remove(target)
            self.cold_recency.insert(0, target)
        return Routed(target, dict(zip(idx, scores, strict=True)))

    def program_scores(self, req, prompt_hashes, snap: Snapshot, idx: list[int], load, cached,
                       cold: bool) -> list[float]:
        """The routing program's value for each candidate ``idx[k]`` (``load``, ``cached``: per
        candidate), from the observables it reads."""
        scorer_values = {
            scorer_name(x): self.scorer(x, req, prompt_hashes, snap, idx, load, cached, cold)
            for x in self.program_scorers}
        common = {**programs.request_observables(req, snap.now_us, snap.tenant_in_flight),
                  **programs.cluster_observables(snap.queue_depth, snap.in_flight,
                                                 snap.kv_util, idx, snap.arrivals)}
        recent = snap.recent()
        scores = []
        for k, i in enumerate(idx):
            seen = dict(common)
            seen.update(recent[i])
            seen.update(queue_depth=float(snap.queue_depth[i]),
                        batch_size=float(snap.batch_size[i]),
                        in_flight=float(snap.in_flight[i]), kv_utilization=snap.kv_util[i],
                        cached_blocks=float(cached[k]) if cached is not None else 0.0)
            for name, values in scorer_values.items():
                seen[name] = min(1.0, max(0.0, values[k]))
            scores.append(programs.run(self.program, seen))
        return scores

    def _code_decision(self, req, snap: Snapshot, idx: list[int]) -> Routed:
        """A code policy's decision: the highest score, the first candidate on a tie."""
        cached = snap.cached_blocks()
        infos = [InstanceInfo(i, snap.queue_depth[i], snap.batch_size[i], snap.in_flight[i],
                              snap.kv_util[i], cached[i]) for i in idx]
        scores = call_code("route_scores", lambda raw: checked_scores(raw, len(idx)), self.code,
                           self.describe(req), infos)
        best = max(scores)
        return Routed(idx[scores.index(best)], dict(zip(idx, scores, strict=True)))

    def weighted_scores(self, req, prompt_hashes, snap: Snapshot, idx: list[int], load, cached,
                        cold: bool) -> list[float]:
        """Weighted score of each candidate ``idx[k]`` (``load``, ``cached``: per candidate)."""
        total = [0.0] * len(idx)
        for scorer, w in zip(self.scorers, self.weights, strict=True):
            s = self.scorer(scorer, req, prompt_hashes, snap, idx, load, cached, cold)
            for k in range(len(idx)):
                total[k] += min(1.0, max(0.0, s[k])) * w
        return total

    def scorer(self, scorer: Scorer, req, prompt_hashes, snap: Snapshot, idx: list[int], load,
               cached, cold: bool) -> list[float]:
        """One scorer's values per candidate (docs/semantics.md §5.6), before clamping."""
        n = len(idx)
        if scorer == Scorer.QUEUE_DEPTH:
            return min_max_inverted([snap.queue_depth[i] for i in idx])
        if scorer == Scorer.KV_UTILIZATION:
            return [1.0 - snap.kv_util[i] for i in idx]
        if scorer == Scorer.LOAD_BALANCE:
            return [1.0 / float(1 + x) for x in load]
        if scorer == Scorer.PREFIX_AFFINITY:
            full_blocks = req.input_tokens // self.block_size
            if full_blocks == 0:
                return [0.0] * n
            return [float(self.prefix_index[i].match_length(prompt_hashes)) / float(full_blocks)
                    for i in idx]
        if scorer == Scorer.PRECISE_PREFIX_CACHE:  # more cached blocks → higher
            lo, hi = min(cached), max(cached)
            if lo == hi:
                return [1.0] * n
            return [float(c - lo) / float(hi - lo) for c in cached]
        if scorer == Scorer.LOAD_AWARE:
            cap = LOAD_AWARE_QUEUE_THRESHOLD
            return [0.5 if q == 0 else 0.5 * (1.0 - float(min(q, cap)) / float(cap))
                    for q in (snap.queue_depth[i] for i in idx)]
        if scorer == Scorer.ACTIVE_REQUESTS:
            flights = [snap.in_flight[i] for i in idx]
            most = max(flights)
            return [1.0 if c == 0 or most == 0 else float(most - c) / float(most)
                    for c in flights]
        if scorer == Scorer.RUNNING_REQUESTS:
            return min_max_inverted([snap.batch_size[i] for i in idx])
        if scorer == Scorer.VLLM_DP:
            return min_max_inverted([4 * snap.queue_depth[i] + snap.batch_size[i] for i in idx])
        # no-hit-lru: a warm request (cached somewhere) is neutral; a cold one ranks instances
        # never given a cold request first (instance order), then the least recently given
        if not cold:
            return [0.5] * n
        if n == 1:
            return [1.0]
        recent = [i for i in self.cold_recency if i in idx]
        order = [i for i in idx if i not in recent] + recent[::-1]
        rank = {i: k for k, i in enumerate(order)}
        return [1.0 - float(rank[i]) / float(n - 1) for i in idx]
