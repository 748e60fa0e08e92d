"""P/D pools: every lane of a JAX population equals its own reference run, request by request,
with the P/D counters (docs/semantics.md §5.10).

All examples of a test share one compiled program (four instances, a small KV cache, chunked
prefill; the capacities from an envelope workload, as in ``test_parity_hypothesis``). Each lane
draws its own split of the instances into prefill, decode and shared pools (or none), its
decider and threshold, the transfer's bandwidth, base latency and contention, its routing, its
wait-queue order and priorities, and each pool's own scorers (any of them: a pool with its own scorers is a router of its own, with
its prefix index and no-hit-lru recency), so one population mixes disaggregated and co-located
lanes. Workloads
draw simultaneous arrivals, prefix groups and deadlines; the small cache makes decode-side
reservations fail and requests preempt. The default tier runs a few examples without
``--blis-quirks``; the slow tier runs both modes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import (
    PDConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
    ScorerWeight,
    resolve_config,
)
from blisjax.config.codes import Scorer
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload

REQUESTS, LANES, INSTANCES = 12, 4, 4
MAX_PREFIX, MAX_EXTRA, MAX_OUTPUT = 32, 80, 12
HORIZON_US = 2_000_000  # decode instances full of reservations step empty: bound every run
GROUPS = ("g0", "g1")
ENGINE = dict(instances=INSTANCES, block_size=16, kv_blocks=20, max_running=3, max_tokens=64,
              horizon_us=HORIZON_US)
# the base configuration's pools only make the program model P/D; every lane has its own
BASE_PD = PDConfig(prefill_instances=1, decode_instances=1, shared_instances=1,
                   decider="always")
SCORERS = Scorer.labels()


def _envelope():
    rows = [dict(arrival=0, input=MAX_PREFIX + MAX_EXTRA, output=MAX_OUTPUT, group=k % 2,
                 prefix=MAX_PREFIX, deadline=1 + k) for k in range(REQUESTS)]
    return make_workload(rows, groups=GROUPS)


@st.composite
def workloads(draw):
    rows, t = [], 0
    for _ in range(REQUESTS):
        t += draw(st.one_of(st.just(0), st.integers(1, 3000)))
        group = draw(st.sampled_from([-1, 0, 1]))
        pre = MAX_PREFIX if group >= 0 else 0
        rows.append(dict(arrival=t, input=pre + draw(st.integers(1, MAX_EXTRA)),
                         output=draw(st.integers(0, MAX_OUTPUT)), group=group, prefix=pre,
                         deadline=draw(st.one_of(st.just(0), st.integers(t + 1, t + 40_000)))))
    return make_workload(rows, groups=GROUPS)


@st.composite
def pools(draw) -> PDConfig:
    """A split of the instances (or none), a decider and a transfer model."""
    shared = draw(st.integers(0, INSTANCES - 1))
    if draw(st.integers(0, 5)) == 0:
        prefill = decode = shared = 0  # no pools: co-located serving in the same program
    else:
        prefill = draw(st.integers(1, INSTANCES - shared - 1)) if INSTANCES - shared >= 2 else 0
        decode = draw(st.integers(1, INSTANCES - shared - prefill)) if prefill else 0
        shared = max(shared, 1) if prefill + decode == 0 else shared
    decider = "never" if prefill == 0 else draw(st.sampled_from(
        ["never", "always", "prefix-threshold"]))
    scorers = st.lists(st.tuples(st.sampled_from(SCORERS), st.integers(1, 3)),
                       max_size=2, unique_by=lambda x: x[0])
    pooled = prefill + decode + shared > 0
    return PDConfig(
        prefill_instances=prefill, decode_instances=decode, shared_instances=shared,
        decider=decider, prefix_threshold_tokens=draw(st.integers(0, 64)),
        transfer_bandwidth_gbps=draw(st.sampled_from([0.5, 5.0, 50.0])),
        transfer_base_latency_ms=draw(st.sampled_from([0.0, 0.1, 2.0])),
        transfer_contention=pooled and draw(st.booleans()),
        prefill_scorers=tuple(ScorerWeight(n, w) for n, w in draw(scorers)) if pooled else (),
        decode_scorers=tuple(ScorerWeight(n, w) for n, w in draw(scorers)) if pooled else ())


@st.composite
def lanes(draw, base):
    routing = RoutingConfig(
        policy=draw(st.sampled_from(["round-robin", "least-loaded", "always-busiest",
                                     "weighted"])),
        scorers=tuple(ScorerWeight(n, 1.0 + k) for k, n in enumerate(draw(st.lists(
            st.sampled_from(SCORERS), min_size=1, max_size=3, unique=True)))),
        tie_break=draw(st.sampled_from(["blis-random", "lowest-index"])))
    budget = draw(st.integers(8, base.engine.max_num_scheduled_tokens))
    engine = dataclasses.replace(
        base.engine, max_num_scheduled_tokens=budget,
        max_num_running_reqs=draw(st.integers(1, base.engine.max_num_running_reqs)),
        long_prefill_token_threshold=draw(st.integers(0, budget)))
    cluster = dataclasses.replace(  # with settings of the lane's own
        base.cluster, pd=draw(pools()), admission_latency_us=draw(st.integers(0, 1500)),
        routing_latency_us=draw(st.integers(0, 1500)),
        snapshot_refresh_interval_us=draw(st.integers(0, 4000)))
    # wait-queue orders: a P/D sub-request ties on its parent's index (Decision 22: a lane
    # whose order changes with time steps on where the others wait for an event)
    policy = dataclasses.replace(
        base.policy, routing=routing,
        scheduler=SchedulerConfig(policy=draw(st.sampled_from(["fcfs", "priority-fcfs",
                                                                 "sjf"]))),
        priority=PriorityConfig(policy=draw(st.sampled_from(["constant", "slo-class",
                                                               "slo-based"]))))
    return dataclasses.replace(base, cluster=cluster, policy=policy, engine=engine)


def _base(quirks: bool):
    resolved = make_resolved(quirks=quirks, **ENGINE)
    cfg = resolved.config
    return resolve_config(dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, pd=BASE_PD)))


def _check(quirks: bool, data) -> None:
    base = _base(quirks)
    # one program for every example: the lanes' own settings compiled in whatever they draw
    static = build_static(base, _envelope(), decode_stretches=True).replace(lane_settings=True)
    assert static.features.pd
    w = data.draw(workloads(), label="workload")
    assert build_static_shared(base, [_envelope(), w], decode_stretches=True).replace(
        lane_settings=True) == static
    configs = [data.draw(lanes(base.config), label=f"lane {k}") for k in range(LANES)]
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, (k, cfg.cluster.pd, cfg.policy.routing)


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=10, **_SETTINGS)
@given(data=st.data())
def test_drawn_pools_match_reference(data):
    _check(False, data)


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
@settings(max_examples=150, **_SETTINGS)
@given(data=st.data())
def test_drawn_pools_match_reference_slow(quirks, data):
    _check(quirks, data)


def test_population_mixes_splits_deciders_and_co_located_lanes():
    """One program, lanes that differ only in their P/D knobs, against the reference; and the
    knobs act (a co-located lane disaggregates nothing, an always lane everything)."""
    base = _base(False)
    rows = [dict(arrival=700 * k, input=40 + 6 * k, output=6 + k % 5, group=k % 3 - 1,
                 prefix=MAX_PREFIX if k % 3 else 0) for k in range(REQUESTS)]
    w = make_workload(rows, groups=GROUPS)
    splits = [PDConfig(),  # co-located
              PDConfig(prefill_instances=1, decode_instances=3, decider="always"),
              PDConfig(prefill_instances=2, decode_instances=2, decider="prefix-threshold",
                       prefix_threshold_tokens=40, transfer_contention=True,
                       decode_scorers=(ScorerWeight("prefix-affinity", 2.0),
                                       ScorerWeight("kv-utilization", 1.0)),
                       prefill_scorers=(ScorerWeight("no-hit-lru", 1.0),
                                        ScorerWeight("queue-depth", 1.0))),
              PDConfig(prefill_instances=3, decode_instances=1, decider="always",
                       transfer_bandwidth_gbps=0.5)]
    configs = [dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=pd)) for pd in splits]
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    # the drawn pools' program (its lanes' own settings compiled in)
    static = build_static(base, _envelope(), decode_stretches=True).replace(lane_settings=True)
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
    assert results[0].pd is None  # co-located: no P/D counters, as the reference's
    split = [int(np.sum(r.pd.prefill_instance >= 0)) for r in results[1:]]
    assert split[0] == REQUESTS and 0 < split[1] < REQUESTS and split[2] == REQUESTS
    assert list(results[3].pd.role) == [1, 1, 1, 2]


# The hand-computed timelines of tests/reference/test_pd.py (the reference engine matches the
# hand values there; here the JAX engine matches the reference on each): one request, a
# chunked prefill, a failed decode-side reservation, a decode sub-request timing out, and the
# never decider with an unpooled instance. Each compiles its own program: slow tier.
HAND_PD = dict(prefill_instances=1, decode_instances=1, decider="always",
               transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)
HAND_CASES = {
    "one-request": (dict(), [dict(arrival=0, input=160, output=3)]),
    "chunked-prefill": (dict(max_tokens=64), [dict(arrival=0, input=160, output=3)]),
    "reservation-drop": (dict(kv_blocks=14), [dict(arrival=0, input=160, output=50),
                                              dict(arrival=0, input=160, output=3)]),
    "decode-timeout": (dict(), [dict(arrival=0, input=160, output=10, deadline=6000)]),
    "never-with-unpooled": (dict(instances=3, pd=dict(prefill_instances=1, decode_instances=1,
                                                      decider="never")),
                            [dict(arrival=k * 10, input=32, output=2) for k in range(4)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
@pytest.mark.parametrize("case", sorted(HAND_CASES))
def test_hand_timelines_match_reference(case, quirks):
    from blisjax.engine import simulate

    engine, rows = HAND_CASES[case]
    engine = dict(engine)
    pd = PDConfig(**engine.pop("pd", HAND_PD))
    base = make_resolved(instances=engine.pop("instances", 2), quirks=quirks, **engine)
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(base.config.cluster,
                                                                       pd=pd))
    resolved, w = resolve_config(cfg), make_workload(rows)
    got = simulate(resolved, w)
    assert got.pd is not None and first_divergence(reference(resolved, w), got) is None


@pytest.mark.slow
def test_pd_capacities_are_flagged_when_exceeded():
    """Two transfer slots and two reservation slots. Four requests arrive at once on one
    prefill and one decode instance that each run one request at a time, so the prefills take
    one step each; a prefill's transfer is pending from its step's start and reserves KV from
    its own start. With a slow transfer (2 s) the first two are in flight when the third
    prefill completes: its transfer (and the fourth's) is refused. With a fast one the first
    decode sub-request runs its 50 tokens while the next two wait with their reserved KV, so
    the fourth finds no reservation slot."""
    base = make_resolved(instances=2, max_running=1)
    pools = dict(prefill_instances=1, decode_instances=1, decider="always")
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=PDConfig(**pools)))
    resolved = resolve_config(cfg)
    w = make_workload([dict(arrival=0, input=16, output=50) for _ in range(4)])
    lanes = [dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, pd=PDConfig(
        **pools, transfer_bandwidth_gbps=gbps))) for gbps in (0.001, 50.0)]
    static = build_static(resolved, w, pd_transfer_slots=2, pd_reserve_slots=2)
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    slow, fast = simulate_population(resolved, w, params, static=static)
    assert set(slow.overflow) == {"pd_transfers"} and slow.overflow["pd_transfers"] == 2
    assert fast.overflow == {"pd_reserve": 1}


TWICE_PD = PDConfig(prefill_instances=1, decode_instances=1, shared_instances=1,
                    decider="always")
TWICE_ROUTERS = [  # prefix-affinity routers shared by both pools (no scorers of their own)
    RoutingConfig(policy="weighted", scorers=(ScorerWeight("prefix-affinity", 2.0),
                                              ScorerWeight("queue-depth", 1.0)),
                  tie_break="lowest-index"),
    RoutingConfig(policy="weighted", scorers=(ScorerWeight("prefix-affinity", 1.0),
                                              ScorerWeight("load-balance", 1.0)),
                  tie_break="lowest-index"),
    RoutingConfig(policy="weighted", scorers=(ScorerWeight("prefix-affinity", 1.0),),
                  tie_break="blis-random"),
    RoutingConfig(policy="weighted"),  # BLIS's default scorers
]


# requests of their own prompts only but for a few of the groups' (arrivals in µs)
OWN_PROMPTS = [dict(arrival=400 * k, input=48 + 8 * (k % 6), output=2 + k % 4,
                    group=(k // 2) % 2 if k % 2 else -1, prefix=MAX_PREFIX if k % 2 else 0)
               for k in range(REQUESTS)]
# the groups' blocks, touched on the shared instance before a request indexed there twice,
# are matched again later (simultaneous arrivals; drawn, then kept)
RETOUCHED = [dict(arrival=a, input=i, output=o, group=g, prefix=MAX_PREFIX if g >= 0 else 0)
             for a, i, o, g in [(0, 94, 5, -1), (300, 49, 6, 0), (350, 81, 7, 0), (400, 64, 1, 1),
                                (700, 72, 10, 1), (700, 87, 5, 1), (1000, 59, 1, 1),
                                (1300, 47, 7, 1), (1600, 85, 4, -1), (1600, 79, 2, 0),
                                (1600, 44, 5, 0), (2600, 103, 5, 1)]]


@pytest.mark.parametrize(("capacity", "rows"), [(10_000, OWN_PROMPTS), (6, RETOUCHED)],
                         ids=["own-prompts", "small-index"])
def test_prefill_routing_matches_the_blocks_its_decode_routing_indexed(capacity, rows):
    """Shared instances, both pools routed by the lane's router with prefix-affinity: a
    disaggregated request's decode routing indexes its whole prompt on its decode instance,
    so its prefill routing finds all of it there when that instance is shared (BLIS's
    ``PrefixIndex`` sees the request twice), and touching it there again moves its own
    entries rather than adding them. Requests of their own prompts make the first matter
    (without it every prefill instance scores alike); a 6-block index makes the second
    matter (counted twice, older entries leave the index early: lane 2 diverges)."""
    resolved = make_resolved(**{**ENGINE, "instances": 3})
    cfg = dataclasses.replace(resolved.config, cluster=dataclasses.replace(
        resolved.config.cluster, pd=TWICE_PD, prefix_index_capacity_blocks=capacity))
    base = resolve_config(cfg)
    w = make_workload(rows, groups=GROUPS)
    configs = [dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, routing=rt))
               for rt in TWICE_ROUTERS]
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    results = simulate_population(base, w, params)
    shared_prefills = 0
    for k, lane in enumerate(configs):
        want = reference(resolve_config(lane), w)
        assert first_divergence(want, results[k]) is None, (k, lane.policy.routing)
        shared_prefills += int(np.sum(results[k].pd.prefill_instance == 2))
    assert shared_prefills > 0  # prefill sub-requests went to the shared instance
