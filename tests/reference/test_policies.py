"""Hand-computed checks of every admission, priority, routing and scheduler template."""

from types import SimpleNamespace

import pytest

from blisjax.config import AdmissionConfig, PriorityConfig, RoutingConfig, ScorerWeight
from blisjax.config.codes import SchedulerPolicy, Scorer
from blisjax.gorand import blis_subsystem_rand
from blisjax.metrics.records import COMPLETED, REJECTED
from blisjax.reference.policies import (
    PrefixIndex,
    Priority,
    Router,
    Snapshot,
    TokenBucket,
    normalized_weights,
    reorder_wait_queue,
)
from tests.reference.conftest import run

# ---- admission ------------------------------------------------------------------------------


def test_token_bucket_refill_arithmetic():
    # capacity 100, 1000 tokens/s; costs 60 @0 (100 → 40), 60 @10 ms (40 + 10 = 50 → reject),
    # 60 @30 ms (50 + 20 = 70 → admit, 10 left).
    b = TokenBucket(100.0, 1000.0)
    assert b.try_take(60.0, 0)
    assert not b.try_take(60.0, 10_000)
    assert b.try_take(60.0, 30_000)
    assert b.tokens == pytest.approx(10.0)


def test_token_bucket_admission_in_cluster():
    rows = [dict(arrival=0, input=60), dict(arrival=10_000, input=60), dict(arrival=30_000, input=60)]
    adm = AdmissionConfig(policy="token-bucket", token_bucket_capacity=100.0,
                          token_bucket_refill_rate=1000.0)
    res, _ = run(rows, admission=adm)
    assert list(res.status) == [COMPLETED, REJECTED, COMPLETED]
    assert res.rejected_admission == 1 and res.instance[1] == -1


def test_rate_limit_counts_requests():
    # burst 2, 10 req/s: three at t=0 → third rejected; one at 100 ms → +1 token → admitted.
    rows = [dict(arrival=0), dict(arrival=0), dict(arrival=0), dict(arrival=100_000)]
    adm = AdmissionConfig(policy="rate-limit", rate_limit_rps=10.0, rate_limit_burst=2.0)
    res, _ = run(rows, admission=adm)
    assert list(res.status) == [COMPLETED, COMPLETED, REJECTED, COMPLETED]


def test_reject_all():
    res, _ = run([dict(arrival=0), dict(arrival=5)], admission=AdmissionConfig(policy="reject-all"))
    assert list(res.status) == [REJECTED, REJECTED] and res.sim_ended_us == 0


def test_tenant_quota_limits_in_flight_per_tenant():
    # tenant a may have 1 request in flight: its second request at t=0 is rejected, b's is not;
    # a's third request arrives after the first completed (2000 µs) and is admitted.
    rows = [dict(arrival=0, input=100, tenant="a"), dict(arrival=0, input=100, tenant="a"),
            dict(arrival=0, input=100, tenant="b"), dict(arrival=50_000, input=100, tenant="a")]
    adm = AdmissionConfig(policy="tenant-quota", tenant_max_in_flight=(("a", 1),),
                          default_tenant_max_in_flight=5)
    res, _ = run(rows, tenants=("a", "b"), admission=adm)
    assert list(res.status) == [COMPLETED, REJECTED, COMPLETED, COMPLETED]


# ---- priority -------------------------------------------------------------------------------


def _req(**kw):
    base = dict(arrival_us=0, slo_class=0, tenant=0, deadline_us=0, input_tokens=10, index=0,
                priority=0.0)
    base.update(kw)
    return SimpleNamespace(**base)


def test_priority_templates():
    now = 2_500_000
    assert Priority(PriorityConfig(policy="constant"), ("",)).score(_req(), now) == 0.0
    slo = Priority(PriorityConfig(policy="slo-based"), ("",))
    assert slo.score(_req(arrival_us=500_000), now) == 2.0  # +1 per second of age
    cls = Priority(PriorityConfig(policy="slo-class"), ("",))
    assert cls.score(_req(slo_class=1), now) == 4.0  # critical
    assert cls.score(_req(slo_class=0), now) == 3.0  # "" behaves as standard
    assert cls.score(_req(slo_class=5), now) == -3.0  # background
    ten = Priority(PriorityConfig(policy="tenant-priority", tenant_scores=(("gold", 7.0),),
                                  default_tenant_score=1.0), ("gold", "free"))
    assert ten.score(_req(tenant=0), now) == 7.0 and ten.score(_req(tenant=1), now) == 1.0
    dl = Priority(PriorityConfig(policy="deadline-aware", no_deadline_slack_s=100.0), ("",))
    assert dl.score(_req(deadline_us=3_500_000), now) == -1.0  # 1 s of slack left
    assert dl.score(_req(deadline_us=0), now) == -100.0


def test_scheduler_orders():
    a = _req(index=0, arrival_us=5, input_tokens=30, priority=1.0)
    b = _req(index=1, arrival_us=3, input_tokens=10, priority=1.0)
    c = _req(index=2, arrival_us=9, input_tokens=10, priority=2.0)
    q = [a, b, c]
    assert reorder_wait_queue(SchedulerPolicy.FCFS, q) == [a, b, c]
    assert reorder_wait_queue(SchedulerPolicy.PRIORITY_FCFS, q) == [c, b, a]
    assert reorder_wait_queue(SchedulerPolicy.SJF, q) == [b, c, a]


def test_priority_fcfs_with_slo_class_admits_critical_first():
    rows = [dict(arrival=0, input=100, output=2), dict(arrival=10, input=100, slo="batch"),
            dict(arrival=20, input=100, slo="critical")]
    res, _ = run(rows, max_running=1, scheduler="priority-fcfs",
                 priority=PriorityConfig(policy="slo-class"))
    assert res.scheduling_delay_us[2] < res.scheduling_delay_us[1]


def test_slo_classes_missing_from_the_score_table_score_as_standard():
    # Only "critical" is listed (1.0): every other class, "" included, scores 3.0 — BLIS scores
    # unknown classes as "standard" (docs/semantics.md §5.5) — not 0.0 or the "" entry.
    cls = Priority(PriorityConfig(policy="slo-class", slo_class_scores={"critical": 1.0}), ("",))
    assert [cls.score(_req(slo_class=code), 0) for code in range(6)] == [
        3.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    listed_empty = PriorityConfig(policy="slo-class", slo_class_scores={"": -5.0})
    assert Priority(listed_empty, ("",)).score(_req(slo_class=4), 0) == 3.0  # batch


def test_unlisted_slo_class_outranks_a_lower_listed_one():
    # One slot; request 0 runs first. Then a batch request (unlisted: 3.0) and a critical one
    # (listed at 1.0) wait: priority-fcfs must take the batch request first.
    rows = [dict(arrival=0, input=100, output=2), dict(arrival=10, input=100, slo="critical"),
            dict(arrival=20, input=100, slo="batch")]
    res, _ = run(rows, max_running=1, scheduler="priority-fcfs",
                 priority=PriorityConfig(policy="slo-class", slo_class_scores={"critical": 1.0}))
    assert res.scheduling_delay_us[2] < res.scheduling_delay_us[1]


# ---- routing --------------------------------------------------------------------------------


def _router(policy="weighted", scorers=(), n=3, bs=16, tie_break="lowest-index"):
    return Router(RoutingConfig(policy=policy, scorers=tuple(ScorerWeight(*s) for s in scorers)
                                if scorers else RoutingConfig().scorers, tie_break=tie_break),
                  n, bs, 10_000, seed=42)


def _snap(qd, bs=None, kv=None, inflight=None, cached=None) -> Snapshot:
    n = len(qd)
    return Snapshot(list(qd), list(bs or [0] * n), list(kv or [0.0] * n),
                    list(inflight or [0] * n), lambda: list(cached or [0] * n))


def _scorer(r, scorer, req, snap, hashes=(), cold=False):
    load = [q + b + f for q, b, f in zip(snap.queue_depth, snap.batch_size, snap.in_flight,
                                         strict=True)]
    every = list(range(len(load)))
    return r.scorer(scorer, req, list(hashes), snap, every, load, snap.cached_blocks(), cold)


def test_scorers_by_hand():
    r = _router(scorers=(("queue-depth", 1.0),))
    req = _req(input_tokens=48)
    assert _scorer(r, Scorer.QUEUE_DEPTH, req, _snap([3, 1, 2])) == [0.0, 1.0, 0.5]
    assert _scorer(r, Scorer.QUEUE_DEPTH, req, _snap([2, 2, 2])) == [1.0] * 3
    assert _scorer(r, Scorer.KV_UTILIZATION, req, _snap([0] * 3, kv=[0.25, 0.5, 1.0])) == \
        [0.75, 0.5, 0.0]
    assert _scorer(r, Scorer.LOAD_BALANCE, req, _snap([0] * 3, inflight=[0, 3, 1])) == \
        [1.0, 0.25, 0.5]


def test_head_scorers_by_hand():
    """BLIS HEAD's scorers (docs/semantics.md §5.6), values computed by hand."""
    r = _router(scorers=(("queue-depth", 1.0),), n=4)
    req = _req(input_tokens=48)
    # precise-prefix-cache: min-max of cached blocks, higher is better; all equal → 1.0
    assert _scorer(r, Scorer.PRECISE_PREFIX_CACHE, req, _snap([0] * 4, cached=[0, 4, 2, 1])) == \
        [0.0, 1.0, 0.5, 0.25]
    assert _scorer(r, Scorer.PRECISE_PREFIX_CACHE, req, _snap([0] * 4, cached=[3] * 4)) == [1.0] * 4
    # load-aware: 0.5 for an empty queue, else 0.5·(1 − min(q, 128)/128)
    assert _scorer(r, Scorer.LOAD_AWARE, req, _snap([0, 64, 128, 500])) == [0.5, 0.25, 0.0, 0.0]
    assert _scorer(r, Scorer.LOAD_AWARE, req, _snap([1, 0, 0, 0]))[0] == 0.5 * (1.0 - 1 / 128)
    # active-requests: (max − c)/max on in-flight; 1.0 for an idle instance
    assert _scorer(r, Scorer.ACTIVE_REQUESTS, req, _snap([0] * 4, inflight=[0, 4, 2, 1])) == \
        [1.0, 0.0, 0.5, 0.75]
    assert _scorer(r, Scorer.ACTIVE_REQUESTS, req, _snap([0] * 4, inflight=[2] * 4)) == [0.0] * 4
    # running-requests: inverted min-max of batch sizes
    assert _scorer(r, Scorer.RUNNING_REQUESTS, req, _snap([0] * 4, bs=[1, 3, 5, 5])) == \
        [1.0, 0.5, 0.0, 0.0]
    # vllm-dp: inverted min-max of 4·queue + batch = [4, 2, 8, 12]
    assert _scorer(r, Scorer.VLLM_DP, req, _snap([1, 0, 2, 0], bs=[0, 2, 0, 12])) == \
        [0.8, 1.0, 0.4, 0.0]
    # no-hit-lru: warm (cached anywhere) → 0.5 each
    assert _scorer(r, Scorer.NO_HIT_LRU, req, _snap([0] * 4), cold=False) == [0.5] * 4


def test_no_hit_lru_ranks_cold_requests_least_recently_used_first():
    r = _router(policy="weighted", scorers=(("no-hit-lru", 1.0),), n=3)
    cold = _snap([0, 0, 0], cached=[0, 0, 0])
    # nothing used yet: instance order 0, 1, 2 → scores 1, 0.5, 0 → instance 0
    assert r.route(_req(), [], cold) == 0
    # 0 used: never-used 1, 2 first, then 0 → [0, 1, 0.5] → instance 1
    assert r.route(_req(), [], cold) == 1
    assert r.route(_req(), [], cold) == 2
    # a warm request (cached on instance 1) scores 0.5 everywhere: a tie, and the LRU stays
    assert r.route(_req(), [], _snap([0, 0, 0], cached=[0, 2, 0])) == 0
    assert r.cold_recency == [2, 1, 0]
    # all used, the least recent (0) first
    assert r.route(_req(), [], cold) == 0


def test_prefix_affinity_scorer_and_observer():
    r = _router(scorers=(("prefix-affinity", 1.0),), n=2)
    req = _req(input_tokens=48)  # 3 full blocks of 16
    hashes = [11, 12, 13]
    assert r.route(req, hashes, _snap([0, 0])) == 0  # tie → lowest index
    # instance 0 now holds all 3 hashes; a request sharing the first two scores 2/3 there.
    assert _scorer(r, Scorer.PREFIX_AFFINITY, req, _snap([0, 0]), [11, 12, 99]) == [2 / 3, 0.0]
    assert _scorer(r, Scorer.PREFIX_AFFINITY, _req(input_tokens=10), _snap([0, 0])) == [0.0, 0.0]


def test_prefix_index_lru_eviction():
    idx = PrefixIndex(capacity_blocks=3)
    idx.touch([1, 2, 3])
    idx.touch([1, 4])  # 1 → MRU; 4 evicts the LRU (2)
    assert list(idx.lru) == [3, 1, 4]
    assert idx.match_length([1, 2]) == 1 and idx.match_length([3, 1, 4]) == 3


def test_weighted_normalization_and_argmax():
    assert normalized_weights([3.0, 2.0, 2.0]) == [3 / 7, 2 / 7, 2 / 7]
    r = _router(scorers=(("queue-depth", 1.0), ("load-balance", 1.0)))
    # queue-depth [0, 1, 0.5]; load-balance with load = qd + bs + inflight = [3, 1, 2]
    scores = r.weighted_scores(_req(), [], _snap([3, 1, 2]), [0, 1, 2], [3, 1, 2], None, False)
    assert scores == [0.0 * 0.5 + 0.25 * 0.5, 1.0 * 0.5 + 0.5 * 0.5, 0.5 * 0.5 + (1 / 3) * 0.5]
    assert r.route(_req(), [], _snap([3, 1, 2])) == 1


def test_simple_routers_in_cluster():
    rows = [dict(arrival=0, input=100, output=50) for _ in range(5)]
    rr, _ = run(rows, instances=2, routing=RoutingConfig(policy="round-robin"))
    assert list(rr.instance) == [0, 1, 0, 1, 0]
    ll, _ = run(rows, instances=2, routing=RoutingConfig(policy="least-loaded",
                                                          tie_break="lowest-index"))
    assert list(ll.instance) == [0, 1, 0, 1, 0]  # in-flight is live; ties → lowest index
    busy, _ = run(rows, instances=2, routing=RoutingConfig(policy="always-busiest"))
    assert list(busy.instance) == [0, 0, 0, 0, 0]


def test_least_loaded_ties_draw_from_the_router_stream():
    """Five requests at t = 0 on two instances: requests 0, 2 and 4 see equal loads (in-flight
    is live), so each draws Intn(2) from BLIS's "router" stream of seed 42; requests 1 and 3
    go to the other instance. The draws come from ``gorand`` (checked against Go's own
    sequences in tests/test_gorand.py)."""
    rows = [dict(arrival=0, input=100, output=50) for _ in range(5)]
    ll, _ = run(rows, instances=2, routing=RoutingConfig(policy="least-loaded"))
    rng = blis_subsystem_rand(42, "router")
    want = []
    for k in range(5):
        want.append(rng.intn(2) if k % 2 == 0 else 1 - want[-1])
    assert list(ll.instance) == want


def test_cache_signal_delay_reads_a_periodic_copy_empty_until_the_first_refresh():
    """precise-prefix-cache over load-balance, two instances. r0 (group g) → instance 0 (all
    even: lowest index), r1 (group h) at 100 µs → instance 1 (less loaded). At 9 ms both
    still run (equal loads) and only instance 1 holds h's prefix blocks: the live query sends
    r2 (group h) there; a 10 ms delay's copy is still the empty one taken at the start, every
    count ties and r2 goes to instance 0. r3 (group h) at 12 ms refreshes the copy first (12 ms
    − 0 >= 10 ms), which now shows h on instance 1 — where the lighter load sends it too."""
    rows = [dict(arrival=0, input=40, output=20, group=0, prefix=32),
            dict(arrival=100, input=40, output=20, group=1, prefix=32),
            dict(arrival=9000, input=40, output=20, group=1, prefix=32),
            dict(arrival=12_000, input=40, output=20, group=1, prefix=32)]
    routing = RoutingConfig(policy="weighted", scorers=(ScorerWeight("precise-prefix-cache", 1.0),
                                                        ScorerWeight("load-balance", 1.0)),
                            tie_break="lowest-index")
    live, _ = run(rows, instances=2, routing=routing, groups=("g", "h"))
    assert list(live.instance) == [0, 1, 1, 1]
    stale, sim = run(rows, instances=2, routing=routing, groups=("g", "h"), cache_delay_us=10_000)
    assert list(stale.instance) == [0, 1, 0, 1]
    assert sim._cache_last_refresh_us == 12_000


def test_periodic_snapshots_are_stale_until_first_refresh():
    # queue-depth only. Requests at 0..4 ms on 2 instances with max 1 running, so queues build.
    # Periodic refresh (50 ms): snapshots read all zeros before t = 50 ms → every score ties →
    # instance 0 every time. Immediate snapshots see the queue and alternate.
    rows = [dict(arrival=1000 * i, input=500, output=20) for i in range(5)]
    routing = RoutingConfig(policy="weighted", scorers=(ScorerWeight("queue-depth", 1.0),),
                            tie_break="lowest-index")
    stale, _ = run(rows, instances=2, routing=routing, max_running=1, refresh_us=50_000)
    assert list(stale.instance) == [0, 0, 0, 0, 0]
    live, _ = run(rows, instances=2, routing=routing, max_running=1, refresh_us=0)
    assert len(set(live.instance.tolist())) == 2
