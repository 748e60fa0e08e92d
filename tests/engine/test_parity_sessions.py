"""Closed-loop sessions in both engines: a population of random policies over random session
workloads (accumulating and not; follow-up timeouts, drops past the length limit, a horizon
cut, think times of 0 that make follow-ups tie with other arrivals), each lane equal to its
own reference run (blisjax.workload.sessions, docs/semantics.md §1.8)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import RoutingConfig, ScorerWeight, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, Workload
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, edge_engine, room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.engine.test_parity_lane_settings import random_settings
from tests.reference.conftest import make_resolved


def random_session_workload(seed: int, *, sessions: int = 10, loose: int = 8,
                            accumulate: bool = True,
                            thinks: tuple[int, ...] = (0, 0, 250, 1000, 4000)) -> Workload:
    """``sessions`` conversations of 1–4 rounds (messages of 3–24 tokens, 1–12 outputs, think
    times from ``thinks`` (µs), a third of the conversations' follow-ups with a 1–6 ms
    timeout, some round 0s in prefix group "g" of 8 tokens) and ``loose`` requests outside sessions; arrivals within 12 ms on a
    500 µs grid, so equal times are common. The rounds per session depend on ``sessions``
    only, so workloads of one size share a compiled program."""
    rng = np.random.default_rng(seed)
    rounds = np.random.default_rng(sessions).integers(1, 5, size=sessions)
    rows: list[dict] = []
    follow: list[dict] = []
    for k in range(sessions):
        grouped = rng.random() < 0.4
        head = dict(arrival=int(rng.integers(0, 25)) * 500, input=int(rng.integers(3, 25)),
                    output=int(rng.integers(1, 13)), session=k, round=0, think=0,
                    group=0 if grouped else -1, prefix=8 if grouped else 0,
                    tenant=int(rng.integers(0, 2)), deadline=0)
        if grouped:
            head["input"] += 8
        rows.append(head)
        # a third of the conversations time their later rounds out after 1–6 ms
        timeout = int(rng.integers(1, 7)) * 1000 if rng.random() < 0.33 else 0
        for j in range(1, int(rounds[k])):
            follow.append(dict(arrival=FOLLOW_UP_ARRIVAL_US, input=int(rng.integers(3, 25)),
                               output=int(rng.integers(1, 13)), session=k, round=j,
                               think=int(rng.choice(thinks)),
                               group=head["group"], prefix=head["prefix"],
                               tenant=head["tenant"],
                               deadline=timeout))
    for _ in range(loose):
        rows.append(dict(arrival=int(rng.integers(0, 25)) * 500, input=int(rng.integers(3, 40)),
                         output=int(rng.integers(1, 13)), session=-1, round=0, think=0,
                         group=-1, prefix=0, tenant=int(rng.integers(0, 2)),
                         deadline=0))
    rows.sort(key=lambda r: r["arrival"])  # stable: sessions' round 0s first at equal times
    rows += follow

    def col(key):
        return np.array([r[key] for r in rows], dtype=np.int64)

    return Workload(
        request_id=np.arange(len(rows)), arrival_us=col("arrival"), input_tokens=col("input"),
        output_tokens=col("output"), prefix_group=col("group"), prefix_length=col("prefix"),
        tenant=col("tenant"), client=np.zeros(len(rows)), slo_class=np.zeros(len(rows)),
        deadline_us=col("deadline"), tenant_names=("a", "b"), prefix_group_names=("g",),
        session=col("session"), round_index=col("round"), think_time_us=col("think"),
        session_names=tuple(f"s{k}" for k in range(sessions)),
        session_accumulate=accumulate)


def _with_prefix_affinity(config):
    """``config`` routing by weights with the prefix-affinity scorer first (weight 3)."""
    routing = config.policy.routing
    scorers = (ScorerWeight("prefix-affinity", 3.0),
               *(w for w in routing.scorers if w.name != "prefix-affinity"))
    return dataclasses.replace(config, policy=dataclasses.replace(
        config.policy, routing=dataclasses.replace(routing, policy="weighted",
                                                   scorers=scorers)))


@pytest.fixture(scope="module")
def session_population():
    room_for_a_program()
    edge = edge_engine(instances=3).config  # 40 blocks of 4 tokens per instance
    # prompts that grow past 80 tokens are dropped, ending their sessions; the router's
    # prefix index holds 24 blocks per instance, so conversations evict each other's blocks
    base = resolve_config(dataclasses.replace(
        edge, engine=dataclasses.replace(edge.engine, max_model_len=80),
        cluster=dataclasses.replace(edge.cluster, prefix_index_capacity_blocks=24)))
    # the last has fewer conversations and rows: it leaves request rows and sessions spare
    workloads = (random_session_workload(1), random_session_workload(2, accumulate=False),
                 random_session_workload(3), random_session_workload(4, sessions=6, loose=3))
    rng = np.random.default_rng(31)
    configs = [_with_prefix_affinity(c) if k % 3 == 0 else c for k, c in enumerate(
        _random_policy_configs(base.config, workloads[0].tenant_names, 16, seed=7))]
    # settings of their own: follow-ups admitted and routed after other latencies
    configs = [random_settings(c, rng) if k % 4 == 1 else c for k, c in enumerate(configs)]
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, list(workloads)).replace(cache_scorers=True)
    lanes = tuple(simulate_population(base, w, params, static=static, lane_block=8)
                  for w in workloads)
    return base, workloads, configs, lanes


def test_session_population_lanes_match_reference_runs(session_population):
    base, workloads, configs, lanes = session_population
    assert workloads[-1].num_requests < workloads[0].num_requests  # spare rows and sessions
    assert len(workloads[-1].session_names) < len(workloads[0].session_names)
    statuses = []
    for w, results in zip(workloads, lanes, strict=True):
        for k, (config, got) in enumerate(zip(configs, results, strict=True)):
            resolved = resolve_config(config)  # the lane's KV blocks resolved anew
            want = reference(resolved, w)
            assert first_divergence(want, got, w.request_id) is None, (k, w.session_accumulate)
            statuses.append(np.asarray(want.status)[w.follow_up])
    # the scenario reaches what it is for: follow-ups created, completed, timed out, never
    # created (cancelled sessions, the horizon) and dropped
    seen = np.concatenate(statuses)
    for outcome in (records.COMPLETED, records.TIMED_OUT, records.UNFINISHED,
                    records.DROPPED):
        assert np.any(seen == outcome), outcome


def test_follow_ups_share_their_conversation_blocks_in_both_engines():
    """Prefix-cache hits of accumulating sessions need the session-shared blocks: without
    accumulation the same workload hits fewer blocks (hand-checkable case in
    tests/workload/test_sessions.py)."""
    resolved = make_resolved(instances=2, block_size=4)
    with_context = random_session_workload(5)
    without = dataclasses.replace(with_context, session_accumulate=False)
    hits = []
    st = build_static_shared(resolved, [with_context, without])  # one program for both
    for w in (with_context, without):
        want = reference(resolved, w)
        got = simulate_population(resolved, w, stack_params(
            [params_from_config(resolved.config, w.tenant_names)]), static=st)[0]
        assert first_divergence(want, got) is None
        hits.append(int(np.sum(want.cache_hits)))
    assert hits[0] > hits[1]


# ---- conversations with instance lifecycles and autoscaling ------------------------------------

_SESSION_SEEDS = range(20)


@pytest.fixture(scope="module")
def lifecycle_program():
    """One program for every drawn example: the lifecycle scenario of test_parity_lifecycle
    (two initial instances, four slots) over random conversation workloads of one shape."""
    from tests.engine.test_parity_lifecycle import _base

    room_for_a_program(LARGE_PROGRAM_MAPPINGS)  # every example runs it
    base = _base(False, False).config
    # weighted routing with BLIS's default scorers (prefix-affinity among them): a reused
    # slot's router-side index starts empty
    base = resolve_config(dataclasses.replace(base, policy=dataclasses.replace(
        base.policy, routing=RoutingConfig(policy="weighted"))))
    # think times long enough for instances to drain, terminate and be placed again between
    # a conversation's rounds
    workloads = [random_session_workload(seed, sessions=8, loose=6,
                                         thinks=(0, 2_000, 20_000, 60_000, 150_000))
                 for seed in _SESSION_SEEDS]
    static = build_static_shared(base, workloads, decode_stretches=True)
    return base, workloads, static


_LIFECYCLE_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                           suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])


@settings(max_examples=6, **_LIFECYCLE_SETTINGS)
@given(data=st.data())
def test_conversations_under_autoscaling_match_reference(lifecycle_program, data):
    """Ticks, scale-ups, drains (a redirect drain routes a conversation's round elsewhere; an
    immediate one drops it, ending the conversation) and reused slots, whose caches restart
    empty, interleave with follow-ups; each lane equals its reference run."""
    _check_autoscaled_conversations(lifecycle_program, data)


@pytest.mark.slow
@settings(max_examples=40, **_LIFECYCLE_SETTINGS)
@given(data=st.data())
def test_conversations_under_autoscaling_match_reference_slow(lifecycle_program, data):
    """More examples: among them a conversation's round routed to a slot whose earlier
    instance cached its history (the new instance's cache is empty)."""
    _check_autoscaled_conversations(lifecycle_program, data)


def _check_autoscaled_conversations(lifecycle_program, data) -> None:
    from tests.engine.test_parity_lifecycle import _lane, autoscalers, lifecycles

    base, workloads, static = lifecycle_program
    w = workloads[data.draw(st.integers(0, len(workloads) - 1), label="workload")]
    configs = [_lane(base, data.draw(autoscalers(static.shapes.num_instances),
                                     label=f"autoscaler {k}"),
                     data.draw(lifecycles(), label=f"lifecycle {k}")) for k in range(4)]
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k], w.request_id) is None, (
            k, cfg.policy.autoscaler, cfg.cluster.lifecycle)


# ---- conversations with policy programs ---------------------------------------------------------


def _two_round_session(think_us: int) -> Workload:
    """One conversation of two rounds: round 0 at 0 µs (8 prompt tokens, 1 output), its
    follow-up ``think_us`` after round 0's step ends."""
    return Workload(
        request_id=np.arange(2), arrival_us=np.array([0, FOLLOW_UP_ARRIVAL_US]),
        input_tokens=np.array([8, 4]), output_tokens=np.array([1, 1]),
        prefix_group=np.array([-1, -1]), prefix_length=np.zeros(2, np.int64),
        tenant=np.zeros(2, np.int64), client=np.zeros(2), slo_class=np.zeros(2),
        deadline_us=np.zeros(2, np.int64), tenant_names=("a",), prefix_group_names=(),
        session=np.array([0, 0]), round_index=np.array([0, 1]),
        think_time_us=np.array([0, think_us]), session_names=("s0",), session_accumulate=True)


def test_a_follow_up_counts_in_the_programs_arrival_rate():
    """An admission program admitting while fewer than 1.5 requests arrived in the last second
    (``arrival_rate``, per second over a 1 s window): round 0 sees itself (1.0) and is
    admitted; its follow-up, arriving 1 ms after round 0's step, sees both (2.0) and is
    rejected. A second later than the window, the follow-up sees itself only and is admitted.
    Both engines."""
    from blisjax.config import AdmissionConfig

    room_for_a_program()  # the next test runs the same program
    base = make_resolved(instances=1, admission=AdmissionConfig(
        policy="program", program="arrival_rate < 1.5"))
    for think_us, follow_up in ((1_000, records.REJECTED), (1_500_000, records.COMPLETED)):
        w = _two_round_session(think_us)
        want = reference(base, w)
        assert np.asarray(want.status).tolist() == [records.COMPLETED, follow_up], think_us
        got = simulate_population(base, w, stack_params(
            [params_from_config(base.config, w.tenant_names)]))[0]
        assert first_divergence(want, got, w.request_id) is None, think_us


def test_a_follow_ups_age_counts_from_its_own_arrival():
    """An admission program admitting requests of age ≥ 0 ms: admission comes at arrival, so
    both rounds are admitted and complete (a follow-up's age read from its row's placeholder
    arrival would be negative). Both engines."""
    from blisjax.config import AdmissionConfig

    base = make_resolved(instances=1, admission=AdmissionConfig(
        policy="program", program="age_ms >= 0"))
    w = _two_round_session(1_000)
    want = reference(base, w)
    assert np.asarray(want.status).tolist() == [records.COMPLETED, records.COMPLETED]
    got = simulate_population(base, w, stack_params(
        [params_from_config(base.config, w.tenant_names)]))[0]
    assert first_divergence(want, got, w.request_id) is None


def test_policy_programs_on_conversations_match_reference():
    """Random routing, admission and priority programs (test_parity_program's) over session
    workloads, accumulating and not: a follow-up's age counts from its own arrival and the
    arrival rate counts the follow-ups created; each lane equals its reference run."""
    from tests.engine.test_parity_program import _program_configs

    room_for_a_program()
    edge = edge_engine(instances=3).config
    base = resolve_config(dataclasses.replace(
        edge, engine=dataclasses.replace(edge.engine, max_model_len=80)))
    workloads = (random_session_workload(1), random_session_workload(2, accumulate=False))
    configs = _program_configs(base.config, 8, seed=21)
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, list(workloads))
    for w in workloads:
        lanes = simulate_population(base, w, params, static=static)
        for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
            want = reference(dataclasses.replace(base, config=cfg), w)
            assert first_divergence(want, got, w.request_id) is None, (k, w.session_accumulate)
