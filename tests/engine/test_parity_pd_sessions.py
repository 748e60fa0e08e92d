"""Closed-loop sessions with P/D pools (docs/semantics.md §5.10, §8.5): a disaggregated round
completes when its decode sub-request does, and only then is its follow-up created (at the
end of that step; with ``--blis-quirks`` at its start plus the post-decode overhead, as
BLIS's ``detectDecodeCompletions``); its sub-requests name their KV blocks by the
conversation. Random policies and random pool splits over session workloads (accumulating
and not, follow-up timeouts, drops past the length limit), each lane of one JAX program
equal to its own reference run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import PDConfig, ScorerWeight, resolve_config
from blisjax.config.pd import PoolOverrides
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from blisjax.workload.generate import generate_workload
from blisjax.workload.spec import parse_workload_spec
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, Workload
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, edge_engine, room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.engine.test_parity_pd_lifecycle import LANES as PD_LIFECYCLE_LANES
from tests.engine.test_parity_sessions import random_session_workload
from tests.reference.conftest import make_resolved
from tests.workload.test_concurrency import _mixed_spec

SPLITS = (
    PDConfig(prefill_instances=1, decode_instances=2, decider="always"),
    PDConfig(prefill_instances=1, decode_instances=1, shared_instances=1,
             decider="prefix-threshold", prefix_threshold_tokens=8,
             transfer_bandwidth_gbps=0.5, transfer_base_latency_ms=0.1),
    PDConfig(prefill_instances=2, decode_instances=1, decider="always",
             transfer_contention=True,
             decode_scorers=(ScorerWeight("prefix-affinity", 2.0),
                             ScorerWeight("queue-depth", 1.0))),
    PDConfig(),  # co-located lanes in the same program
)


def _base(quirks: bool):
    edge = edge_engine(instances=3).config
    cfg = dataclasses.replace(
        edge, engine=dataclasses.replace(edge.engine, max_model_len=80),
        cluster=dataclasses.replace(edge.cluster, pd=SPLITS[0]),
        compat=dataclasses.replace(edge.compat, blis_quirks=quirks))
    return resolve_config(cfg)


def _lanes(base, tenants, count: int, seed: int) -> list:
    policies = _random_policy_configs(base.config, tenants, count, seed=seed)
    return [dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, pd=SPLITS[k % len(SPLITS)])) for k, cfg in enumerate(policies)]


def _check(quirks: bool, seeds: tuple[int, ...], count: int) -> list:
    room_for_a_program()
    base = _base(quirks)
    workloads = [random_session_workload(s, accumulate=s % 2 == 1) for s in seeds]
    configs = _lanes(base, workloads[0].tenant_names, count, seed=11)
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, workloads).replace(cache_scorers=True)
    assert static.features.pd and static.features.sessions
    wants = []
    for w in workloads:
        lanes = simulate_population(base, w, params, static=static)
        for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
            want = reference(dataclasses.replace(base, config=cfg), w)
            assert first_divergence(want, got, w.request_id) is None, (k, cfg.cluster.pd)
            wants.append((w, cfg, want))
    return wants


def test_sessions_with_pools_match_reference():
    wants = _check(False, (1, 2), 8)
    # disaggregated rounds create follow-ups that complete, time out and are dropped
    seen = np.concatenate([np.asarray(want.status)[w.follow_up] for w, cfg, want in wants
                           if cfg.cluster.pd.enabled])
    for outcome in (records.COMPLETED, records.TIMED_OUT, records.DROPPED):
        assert np.any(seen == outcome), outcome
    split = sum(int(np.sum(want.pd.prefill_instance[w.follow_up] >= 0))
                for w, cfg, want in wants if want.pd is not None)
    assert split > 0  # follow-ups disaggregated


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
def test_sessions_with_pools_match_reference_slow(quirks):
    _check(quirks, (3, 4, 5, 6), 16)


def _two_rounds(think_us: int) -> Workload:
    """One conversation of two rounds: 20 prompt tokens, then a 6-token message; 5 outputs
    each."""
    col = lambda *xs: np.array(xs, dtype=np.int64)  # noqa: E731
    return Workload(
        request_id=col(0, 1), arrival_us=col(1000, FOLLOW_UP_ARRIVAL_US),
        input_tokens=col(20, 6), output_tokens=col(5, 5), prefix_group=col(-1, -1),
        prefix_length=col(0, 0), tenant=col(0, 0), client=col(0, 0), slo_class=col(0, 0),
        deadline_us=col(0, 0), tenant_names=("a",), prefix_group_names=(),
        session=col(0, 0), round_index=col(0, 1), think_time_us=col(0, think_us),
        session_names=("s0",), session_accumulate=True)


@pytest.mark.parametrize("quirks", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_disaggregated_rounds_follow_up_arrives_after_its_decode(quirks):
    """Hand case (blackbox β = (1000, 10, 100), no α, no cluster latencies, 1 prefill and
    2 decode instances, every request disaggregated): round 0 (20 prompt tokens, 5 outputs)
    ends with a decode step of its decode sub-request alone, 1000 + 100·1 = 1,100 µs. Its
    follow-up arrives 700 µs after that step ends — arrival + E2E, BLIS's projected E2E of a
    disaggregated request — or, with ``--blis-quirks``, 700 µs after it starts (BLIS's
    ``detectDecodeCompletions``; the post-decode overhead is 0). Its prompt is the
    conversation: 20 + (5 − 1) + 6 = 30 tokens."""
    resolved = make_resolved(instances=3, quirks=quirks)
    cfg = dataclasses.replace(resolved.config, cluster=dataclasses.replace(
        resolved.config.cluster, pd=PDConfig(prefill_instances=1, decode_instances=2,
                                             decider="always")))
    resolved = resolve_config(cfg)
    w = _two_rounds(700)
    want = reference(resolved, w)
    assert list(want.status) == [records.COMPLETED, records.COMPLETED]
    assert want.pd.prefill_instance[1] == 0  # the follow-up is disaggregated too
    last_step_us = 1100 if quirks else 0
    assert int(want.sessions.arrival_us[1]) == 1000 + int(want.e2e_us[0]) - last_step_us + 700
    assert int(want.sessions.prompt_tokens[1]) == 30
    got = simulate_population(resolved, w, stack_params([params_from_config(cfg, ("a",))]),
                              static=build_static(resolved, w))[0]
    assert first_divergence(want, got, w.request_id) is None
    assert np.array_equal(got.sessions.arrival_us, want.sessions.arrival_us)


def _capped_conversations() -> Workload:
    """Two conversations of two rounds: s0 opens with 20 prompt tokens and 30 outputs, s1 with
    45 and 5; each then sends a 6-token message answered by 5 outputs."""
    col = lambda *xs: np.array(xs, dtype=np.int64)  # noqa: E731
    return Workload(
        request_id=col(0, 1, 2, 3),
        arrival_us=col(1000, 2000, FOLLOW_UP_ARRIVAL_US, FOLLOW_UP_ARRIVAL_US),
        input_tokens=col(20, 45, 6, 6), output_tokens=col(30, 5, 5, 5),
        prefix_group=col(-1, -1, -1, -1), prefix_length=col(0, 0, 0, 0),
        tenant=col(0, 0, 0, 0), client=col(0, 0, 0, 0), slo_class=col(0, 0, 0, 0),
        deadline_us=col(0, 0, 0, 0), tenant_names=("a",), prefix_group_names=(),
        session=col(0, 1, 0, 1), round_index=col(0, 0, 1, 1), think_time_us=col(0, 0, 500, 500),
        session_names=("s0", "s1"), session_accumulate=True)


def test_conversations_on_a_decode_pool_of_a_smaller_max_model_len():
    """Hand case: a max-model-len of 80, the decode pool's own 40, every round disaggregated.
    Rounds complete on the decode pool, so its cap assembles the conversations: s0's first
    round decodes up to 39 tokens in all (19 of its 30 outputs enter the conversation), and
    s1's 45-token prompt passes the prefill instance's guard (45 + 5 <= 80) while its decode
    sub-request, which no guard stops, decodes one token. The follow-ups' prompts are
    20 + 19 + 6 = 45 and 45 + 1 + 6 = 52 tokens, in both engines."""
    resolved = make_resolved(instances=3, max_model_len=80)
    cfg = dataclasses.replace(resolved.config, cluster=dataclasses.replace(
        resolved.config.cluster, pd=PDConfig(prefill_instances=1, decode_instances=2,
                                             decider="always",
                                             decode=PoolOverrides(max_model_len=40))))
    resolved = resolve_config(cfg)
    w = _capped_conversations()
    want = reference(resolved, w)
    assert list(want.status) == [records.COMPLETED] * 4
    assert np.asarray(want.sessions.prompt_tokens).tolist() == [20, 45, 45, 52]
    assert np.asarray(want.length_capped).tolist() == [True, True, True, True]
    static = build_static(resolved, w)
    assert static.conversation_max_model_len == 40
    got = simulate_population(resolved, w, stack_params([params_from_config(cfg, ("a",))]),
                              static=static)[0]
    assert first_divergence(want, got, w.request_id) is None
    assert np.array_equal(got.sessions.prompt_tokens, want.sessions.prompt_tokens)


def test_a_pools_prefix_affinity_scorer_indexes_the_conversations():
    """The cluster routes round-robin; only the pools' own routers score prefix affinity.
    Their indexes hold the conversations' blocks in both engines (a program built for this
    lane alone, and one whose base routes otherwise)."""
    base = _base(False)
    pools = PDConfig(prefill_instances=1, decode_instances=1, shared_instances=1,
                     decider="always",
                     decode_scorers=(ScorerWeight("prefix-affinity", 3.0),
                                     ScorerWeight("queue-depth", 1.0)),
                     prefill_scorers=(ScorerWeight("prefix-affinity", 1.0),
                                      ScorerWeight("kv-utilization", 1.0)))
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=pools), policy=dataclasses.replace(
        base.config.policy, routing=dataclasses.replace(base.config.policy.routing,
                                                        policy="round-robin", scorers=())))
    resolved = resolve_config(cfg)
    w = random_session_workload(7)
    want = reference(resolved, w)
    params = stack_params([params_from_config(cfg, w.tenant_names)])
    for program_base in (resolved, base):
        static = build_static(program_base, w)
        got = simulate_population(program_base, w, params, static=static)[0]
        assert first_divergence(want, got, w.request_id) is None, program_base is base


def test_concurrency_users_with_pools_match_reference():
    """Closed-loop users (BLIS ``concurrency``) beside conversations and a rate client, with
    the pool splits above: each lane equal to its own reference run."""
    room_for_a_program()
    base = make_resolved(instances=3, block_size=4, kv_blocks=60, max_running=3, max_tokens=48,
                         threshold=24, refresh_us=1500, alpha=(80.25, 0.75, 12.5),
                         horizon_us=130_000, admission_latency_us=200, routing_latency_us=300)
    base = resolve_config(dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=SPLITS[0])))
    w = generate_workload(parse_workload_spec(_mixed_spec(1)))
    configs = _lanes(base, w.tenant_names, 4, seed=5)
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    lanes = simulate_population(base, w, params, static=build_static(base, w))
    disaggregated = 0
    for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
        want = reference(dataclasses.replace(base, config=cfg), w)
        assert first_divergence(want, got, w.request_id) is None, (k, cfg.cluster.pd)
        if want.pd is not None:
            disaggregated += int(np.sum((want.pd.prefill_instance >= 0) & w.follow_up
                                        & (np.asarray(want.status) == records.COMPLETED)))
    assert disaggregated > 0


def _autoscaled(quirks: bool = False):
    """The P/D autoscaling lanes of ``test_parity_pd_lifecycle`` (each pool scaled on its
    own; cold instances; a prefill pool draining its only routable instance), on sessions."""
    return [dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, max_model_len=80))
            for cfg in PD_LIFECYCLE_LANES]


@pytest.mark.parametrize("seeds", [(1, 2), pytest.param((3, 4, 5), marks=pytest.mark.slow)])
def test_sessions_with_pools_under_autoscaling_match_reference(seeds):
    """Conversations (follow-up timeouts, a completed round's timeouts pending on both of its
    instances) on autoscaled P/D pools: each lane equal to its own reference run, lifecycle
    counters and timeline included."""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)
    lanes = _autoscaled()
    base = resolve_config(lanes[0])
    workloads = [random_session_workload(s, accumulate=s % 2 == 1) for s in seeds]
    static = build_static_shared(base, workloads)
    assert static.features.pd and static.features.lifecycle and static.features.sessions
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in lanes])
    for w in workloads:
        got = simulate_population(base, w, params, static=static)
        for k, cfg in enumerate(lanes):
            want = reference(resolve_config(cfg), w)
            assert first_divergence(want, got[k], w.request_id) is None, (k, w.session_accumulate)
