"""Cluster and instance policy templates of the reference engine (plain Python).

Every knob is a plain number from ``blisjax.config.PolicyConfig`` so the JAX engine can carry the
<<<<<<< HEAD
same knobs as arrays; templates are the codes of ``blisjax.config.codes``, as in the JAX engine.
Conventions (docs/semantics.md Decisions 5–6): priority scores are float64 with higher = more
urgent; routing ties go to the lowest instance index.
=======
same knobs as arrays. Conventions (docs/semantics.md Decisions 5–6): priority scores are float64 with
higher = more urgent; routing ties go to the lowest instance index.
>>>>>>> wt-docs-sem
"""

from __future__ import annotations

from collections import OrderedDict

from blisjax.config.codes import (
    AdmissionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
)

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
    """

    def __init__(self, cfg, tenant_names: tuple[str, ...]) -> None:
        self.policy = AdmissionPolicy.of(cfg.policy)
        self.bucket = None
        if self.policy == AdmissionPolicy.TOKEN_BUCKET:
            self.bucket = TokenBucket(cfg.token_bucket_capacity, cfg.token_bucket_refill_rate)
        elif self.policy == AdmissionPolicy.RATE_LIMIT:
            self.bucket = TokenBucket(cfg.rate_limit_burst, cfg.rate_limit_rps)
        self.tenant_quota = cfg.max_in_flight_table(tenant_names)

    def admit(self, req, now_us: int, tenant_in_flight: list[int]) -> bool:
        p = self.policy
        if p == AdmissionPolicy.ALWAYS_ADMIT:
            return True
        if p == AdmissionPolicy.REJECT_ALL:
            return False
        if p == AdmissionPolicy.TOKEN_BUCKET:
            return self.bucket.try_take(float(req.input_tokens), now_us)
        if p == AdmissionPolicy.RATE_LIMIT:
            return self.bucket.try_take(1.0, now_us)
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
    """

    def __init__(self, cfg, tenant_names: tuple[str, ...]) -> None:
        self.policy = PriorityPolicy.of(cfg.policy)
        self.age_weight = cfg.age_weight
        self.class_score = cfg.slo_class_score_table()
        self.tenant_score = cfg.tenant_score_table(tenant_names)
        self.no_deadline_score = -float(cfg.no_deadline_slack_s)

    @property
    def is_constant(self) -> bool:
        return self.policy == PriorityPolicy.CONSTANT

    def score(self, req, now_us: int) -> float:
        p = self.policy
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


class PrefixIndex:
    """Router-side approximate prefix cache of one instance: an LRU of block hashes."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()  # first = least recently used

    def match_length(self, hashes: list[int]) -> int:
        """Consecutive hashes from the start that are present (does not refresh recency)."""
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def touch(self, hashes: list[int]) -> None:
        """Record a routed request's blocks, in order: present → MRU; new → insert, evict LRU."""
        for h in hashes:
            if h in self.lru:
                self.lru.move_to_end(h)
            else:
                self.lru[h] = None
                if len(self.lru) > self.capacity:
                    self.lru.popitem(last=False)


def normalized_weights(weights: list[float]) -> list[float]:
    total = 0.0
    for w in weights:
        total += w
    return [w / total for w in weights]


class Router:
    """Routing templates: round-robin, least-loaded, always-busiest, weighted (with scorers).

    Snapshot fields per instance: queue depth, batch size, KV utilisation (periodic or live) and
    in-flight count (always live); effective load = queue depth + batch size + in-flight.
    """

    def __init__(self, cfg, num_instances: int, block_size_tokens: int,
                 prefix_index_capacity_blocks: int) -> None:
        self.policy = RoutingPolicy.of(cfg.policy)
        self.num_instances = num_instances
        self.block_size = block_size_tokens
        self.counter = 0
        self.scorers = [Scorer.of(s.name) for s in cfg.scorers]
        self.weights = normalized_weights([float(s.weight) for s in cfg.scorers])
        self.prefix_index = None
        if self.policy == RoutingPolicy.WEIGHTED and Scorer.PREFIX_AFFINITY in self.scorers:
            self.prefix_index = [PrefixIndex(prefix_index_capacity_blocks)
                                 for _ in range(num_instances)]

    def route(self, req, prompt_hashes: list[int], queue_depth: list[int], batch_size: list[int],
              kv_util: list[float], in_flight: list[int]) -> int:
        """Target instance for ``req``; ``prompt_hashes`` are its full prompt blocks' hashes."""
        n = self.num_instances
        p = self.policy
        if p == RoutingPolicy.ROUND_ROBIN:
            target = self.counter % n
            self.counter += 1
            return target
        load = [queue_depth[i] + batch_size[i] + in_flight[i] for i in range(n)]
        if p == RoutingPolicy.LEAST_LOADED:
            return min(range(n), key=lambda i: (load[i], i))
        if p == RoutingPolicy.ALWAYS_BUSIEST:
            return min(range(n), key=lambda i: (-load[i], i))
        scores = self.weighted_scores(req, prompt_hashes, queue_depth, kv_util, load)
        best, target = -1.0, 0
        for i in range(n):
            if scores[i] > best:  # strict: ties keep the lowest index
                best, target = scores[i], i
        if self.prefix_index is not None:
            self.prefix_index[target].touch(prompt_hashes)
        return target

    def weighted_scores(self, req, prompt_hashes, queue_depth, kv_util, load) -> list[float]:
        n = self.num_instances
        total = [0.0] * n
        for scorer, w in zip(self.scorers, self.weights, strict=True):
            s = self.scorer(scorer, req, prompt_hashes, queue_depth, kv_util, load)
            for i in range(n):
                total[i] += min(1.0, max(0.0, s[i])) * w
        return total

    def scorer(self, scorer: Scorer, req, prompt_hashes, queue_depth, kv_util,
               load) -> list[float]:
        n = self.num_instances
        if scorer == Scorer.QUEUE_DEPTH:
            lo, hi = min(queue_depth), max(queue_depth)
            if lo == hi:
                return [1.0] * n
            return [float(hi - q) / float(hi - lo) for q in queue_depth]
        if scorer == Scorer.KV_UTILIZATION:
            return [1.0 - u for u in kv_util]
        if scorer == Scorer.LOAD_BALANCE:
            return [1.0 / float(1 + x) for x in load]
        # prefix-affinity
        full_blocks = req.input_tokens // self.block_size
        if full_blocks == 0:
            return [0.0] * n
        return [float(self.prefix_index[i].match_length(prompt_hashes)) / float(full_blocks)
                for i in range(n)]
