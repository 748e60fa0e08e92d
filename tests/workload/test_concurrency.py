"""Concurrency clients (BLIS ``concurrency``): a fixed number of users, each sending a request,
waiting for it to complete, thinking and sending the next, until the workload's request count
(the follow-up budget) or the horizon stops it. Spec validation, generation, hand-computed runs
and a population of random policies in the JAX engine equal to the reference
(``blisjax.workload.generate._with_users``, docs/semantics.md Decision 20)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from blisjax.workload.clients import ClientSpec, DistSpec
from blisjax.workload.generate import generate_workload
from blisjax.workload.sessions import prompt_tokens
from blisjax.workload.spec import WorkloadSpec, parse_workload_spec
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US
from tests.engine.conftest import room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.reference.conftest import make_resolved


def _const(value: int) -> dict:
    return {"type": "constant", "params": {"value": value}}


def _users(**over) -> dict:
    return {"id": "chat", "concurrency": 4, "think_time_us": 3000,
            "input_distribution": _const(40), "output_distribution": _const(6), **over}


def _spec(*clients, **top) -> dict:
    return {"version": "2", "seed": 5, "aggregate_rate": 20, "num_requests": 30,
            "clients": list(clients), **top}


@pytest.mark.parametrize(("client", "top", "message"), [
    (dict(rate_fraction=1.0), {}, r"clients\[0\]\.rate_fraction: must be 0"),
    (dict(concurrency=-1, rate_fraction=0), {}, r"clients\[0\]\.concurrency: must be >= 0"),
    (dict(think_time_us=-5), {}, r"clients\[0\]\.think_time_us: must be >= 0"),
    (dict(rounds_per_user=1), {}, r"clients\[0\]\.rounds_per_user: must be >= 2"),
    (dict(reasoning={"multi_turn": {"max_rounds": 2}}), {},
     r"clients\[0\]\.reasoning\.multi_turn: a concurrency client"),
    (dict(lifecycle={"windows": [{"start_us": 0, "end_us": 10}]}), {},
     r"clients\[0\]\.lifecycle: activity windows"),
    ({}, {"num_requests": None, "horizon": 10_000},
     r"clients\[0\]\.rounds_per_user: a concurrency client of a workload without num_requests"),
])
def test_bad_concurrency_settings_name_the_field(client, top, message):
    with pytest.raises(ValueError, match=message):
        parse_workload_spec(_spec(_users(**client), **top))


def test_users_do_not_share_a_workload_with_accumulating_conversations():
    talk = {"id": "talk", "arrival": {"process": "poisson"}, "input_distribution": _const(9),
            "output_distribution": _const(3),
            "reasoning": {"multi_turn": {"max_rounds": 2, "context_growth": "accumulate"}}}
    with pytest.raises(ValueError, match=r"clients\[0\]\.concurrency: .*accumulate"):
        parse_workload_spec(_spec(_users(), talk))


def test_users_send_their_first_requests_staggered_over_the_think_time():
    w = generate_workload(parse_workload_spec(_spec(_users(
        prefix_group="sys", prefix_length=16, timeout=50_000))))
    first = ~w.follow_up
    # user u at u · 3000 / 4 µs
    assert w.arrival_us[first].tolist() == [0, 750, 1500, 2250]
    assert w.session[first].tolist() == [0, 1, 2, 3]
    assert w.session_names == tuple(f"concurrency_chat_user_{u}" for u in range(4))
    assert w.session_unbounded == (True,) * 4
    # 30 requests in all: 26 follow-ups; 2 · ⌈26 / 4⌉ + 2 = 16 rows per user
    assert w.follow_up_budget == 26
    assert np.bincount(w.session).tolist() == [16] * 4
    assert (w.think_time_us == 3000).all()  # every row: the user's think time
    assert (w.deadline_us[w.follow_up] == 50_000).all()  # relative to each arrival
    assert w.deadline_us[first].tolist() == [50_000, 50_750, 51_500, 52_250]
    assert (w.arrival_us[w.follow_up] == FOLLOW_UP_ARRIVAL_US).all()
    # no conversation: every request is the prefix and its own 40 tokens
    assert (prompt_tokens(w, 0) == 56).all() and not w.session_accumulate
    assert generate_workload(parse_workload_spec(_spec(_users()))).content_equal(
        generate_workload(parse_workload_spec(_spec(_users()))))


def test_users_are_seeded_while_the_request_count_leaves_room():
    # the rate client sends three requests (constant arrivals, 20 req/s: an interval of
    # trunc(1e6 / 20 − ε) = 49,999 µs, until 0.16 s)
    rated = {"id": "api", "rate_fraction": 1, "arrival": {"process": "constant"},
             "input_distribution": _const(30), "output_distribution": _const(4)}
    w = generate_workload(parse_workload_spec(_spec(rated, _users(), num_requests=5,
                                                    horizon=160_000)))
    # two of the four users fit; no request is left for a follow-up
    assert w.num_requests == 5 and w.follow_up_budget == 0 and not w.has_sessions
    assert w.arrival_us.tolist() == [0, 750, 49_999, 99_998, 149_997]
    assert w.session.tolist() == [0, 1, -1, -1, -1]


# ---- runs computed by hand: a blackbox whose every step takes 1 ms, no α delays ---------------

def _hand_run(users: int, think_us: int, *, rounds: int | None = None,
              num_requests: int | None = None, horizon_us: int = 2**63 - 1):
    spec = WorkloadSpec(clients=(ClientSpec(
        id="u", rate_fraction=0.0, concurrency=users, think_time_us=think_us,
        rounds_per_user=rounds, input_distribution=DistSpec("constant", {"value": 16}),
        output_distribution=DistSpec("constant", {"value": 3})),),
        num_requests=num_requests, horizon_us=None if num_requests else horizon_us)
    w = generate_workload(spec)
    base = make_resolved(instances=1, alpha=(0, 0, 0), beta=(1000, 0, 0), horizon_us=horizon_us)
    return w, reference(base, w)


def test_a_user_sends_its_next_request_a_think_time_after_each_completion():
    # each request: a prefill step and two decode steps, 3 ms; then 0.5 ms of thinking
    w, run = _hand_run(1, 500, num_requests=4)
    assert run.sessions.arrival_us.tolist() == [0, 3500, 7000, 10_500]
    assert (np.asarray(run.status) == records.COMPLETED).all()
    assert run.e2e_us.tolist() == [3000] * 4 and not run.overflow


def test_the_follow_up_budget_is_spent_in_batch_order():
    # three users at 0 µs complete together at 3 ms; 5 requests leave 2 follow-ups: the first
    # two in batch order send again, the third user stops
    w, run = _hand_run(3, 0, num_requests=5)
    arrival = run.sessions.arrival_us
    created = w.follow_up & (arrival < FOLLOW_UP_ARRIVAL_US)
    assert w.session[created].tolist() == [0, 1]
    assert arrival[created].tolist() == [3000, 3000]
    assert int(np.sum(np.asarray(run.status) == records.COMPLETED)) == 5


def test_a_user_out_of_rows_is_flagged_unless_the_horizon_stops_it():
    # two rows: arrivals at 0 and 3.5 ms, completions at 3 and 6.5 ms; a third request would
    # arrive at 7 ms
    _, run = _hand_run(1, 500, rounds=2, horizon_us=20_000)
    assert run.overflow == {"session_rounds": 1}
    _, run = _hand_run(1, 500, rounds=2, horizon_us=6_800)
    assert not run.overflow


# ---- the JAX engine --------------------------------------------------------------------------

def _mixed_spec(seed: int) -> dict:
    """Two concurrency clients (3 users thinking 2 ms, with a prefix and a 4 ms timeout; 2
    users thinking 0; rows for every follow-up the budget allows, so no user runs out), a rate client and a client of non-accumulating conversations of 3
    rounds (20 req/s each, constant: 2 requests each in 0.1 s): 40 requests, so 31 follow-ups
    shared by the users and the conversations."""
    gauss = {"type": "gaussian", "params": {"mean": 40, "std_dev": 20, "min": 4, "max": 90}}
    short = {"type": "gaussian", "params": {"mean": 6, "std_dev": 4, "min": 1, "max": 16}}
    return {"version": "2", "seed": seed, "aggregate_rate": 40, "num_requests": 40,
            "horizon": 100_000, "clients": [
                _users(id="chat", tenant_id="a", concurrency=3, think_time_us=2000,
                       prefix_group="sys", prefix_length=12, timeout=4000, rounds_per_user=32,
                       input_distribution=gauss, output_distribution=short),
                _users(id="agent", tenant_id="b", concurrency=2, think_time_us=0,
                       rounds_per_user=32, input_distribution=gauss,
                       output_distribution=short),
                {"id": "api", "tenant_id": "a", "rate_fraction": 1, "arrival": {"process": "constant"},
                 "input_distribution": gauss, "output_distribution": short},
                {"id": "talk", "tenant_id": "b", "rate_fraction": 1, "arrival": {"process": "constant"},
                 "input_distribution": gauss, "output_distribution": short,
                 "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 700}}}]}


def test_concurrency_populations_match_reference_runs():
    room_for_a_program()
    base = make_resolved(instances=2, block_size=4, kv_blocks=60, max_running=3, max_tokens=48,
                         threshold=24, refresh_us=1500, alpha=(80.25, 0.75, 12.5),
                         horizon_us=130_000, admission_latency_us=200, routing_latency_us=300)
    workloads = [generate_workload(parse_workload_spec(_mixed_spec(s))) for s in (1, 2)]
    w0 = workloads[0]
    assert w0.follow_up_budget == 31 and any(w0.session_unbounded)
    configs = _random_policy_configs(base.config, w0.tenant_names, 8, seed=3)
    params = stack_params([params_from_config(c, w0.tenant_names) for c in configs])
    static = build_static_shared(base, workloads)
    seen = []
    for w in workloads:
        lanes = simulate_population(base, w, params, static=static, lane_block=8)
        for k, (config, got) in enumerate(zip(configs, lanes, strict=True)):
            want = reference(dataclasses.replace(base, config=config), w)
            assert not want.overflow and not got.overflow, (k, want.overflow, got.overflow)
            assert first_divergence(want, got, w.request_id) is None, k
            created = int(np.sum(w.follow_up & (want.sessions.arrival_us
                                                < FOLLOW_UP_ARRIVAL_US)))
            seen.append((created, np.asarray(want.status)))
    # the budget stops some lanes, the horizon others; users time out (their sessions end)
    assert any(n == 31 for n, _ in seen) and any(n < 31 for n, _ in seen)
    assert any(np.any(s == records.TIMED_OUT) for _, s in seen)


def test_a_user_out_of_rows_is_flagged_alike_in_both_engines():
    w, want = _hand_run(2, 500, rounds=3, horizon_us=40_000)
    base = make_resolved(instances=1, alpha=(0, 0, 0), beta=(1000, 0, 0), horizon_us=40_000)
    got = simulate_population(base, w, stack_params([params_from_config(base.config,
                                                                        w.tenant_names)]))[0]
    assert want.overflow == {"session_rounds": 2} and got.overflow == want.overflow


def test_the_shipped_concurrency_workload():
    from tests.paths import REPO

    w = generate_workload(parse_workload_spec(REPO / "configs/workloads/concurrency.yaml"))
    bench = w.client_names.index("bench")
    first = ~w.follow_up
    users = first & (w.client == bench)
    # 32 users over 0.2 s of think time: one every 6,250 µs
    assert np.sort(w.arrival_us[users]).tolist() == [6250 * u for u in range(32)]
    api = int(np.count_nonzero(first & (w.client != bench)))
    assert w.follow_up_budget == 2000 - api - 32 > 0
    assert len(w.session_names) == 32 and all(w.session_unbounded)
