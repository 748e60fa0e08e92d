"""Closed-loop sessions: trace reading, prompt assembly, block identity, and a run computed by
hand (``blisjax.workload.sessions``; docs/semantics.md §1.8)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.blockhash import block_code
from blisjax.metrics.records import COMPLETED, DROPPED, TIMED_OUT, UNFINISHED
from blisjax.reference.cluster import simulate
from blisjax.workload.sessions import content_tokens, next_round, produced_tokens, prompt_tokens
from blisjax.workload.trace import read_trace
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, Workload
from tests.paths import GOLDEN_NEXT_DIR
from tests.reference.conftest import make_resolved

HEADER, DATA = GOLDEN_NEXT_DIR / "sessions_chat.yaml", GOLDEN_NEXT_DIR / "sessions_chat.csv"


def _golden(**kw) -> Workload:
    return read_trace(HEADER, DATA, session_mode="closed-loop", **kw)


def test_closed_loop_trace_has_round_zero_rows_first_then_follow_ups_by_session():
    w = _golden()
    assert w.num_requests == 432 and len(w.session_names) == 108
    assert w.session_accumulate
    assert not w.follow_up[:108].any() and w.follow_up[108:].all()
    assert (w.arrival_us[108:] == FOLLOW_UP_ARRIVAL_US).all()
    first = np.flatnonzero(w.session == w.session[0])  # sess_4187093735911720450
    assert w.request_id[first].tolist() == [0, 3, 16, 35]
    # think = gaps between the rows' arrival_time_us (notes §2.3): 1,136,902 − 2,349, …
    assert w.think_time_us[first[1]] == 1_136_902 - 2_349


def test_accumulated_prompts_follow_blis_notes():
    """notes §2.5: 140; 140 + 107 + 377 = 624; 624 + 66 + 738 = 1,428; 1,428 + 117 + 1,039."""
    w = _golden()
    first = np.flatnonzero(w.session == w.session[0])
    assert prompt_tokens(w, 4096)[first].tolist() == [140, 624, 1428, 2584]
    assert int(prompt_tokens(w, 4096).sum()) == 571_700  # BLIS's total_input_tokens


def test_fixed_mode_keeps_every_row_open_loop():
    w = read_trace(HEADER, DATA)
    assert w.num_requests == 432 and not w.has_sessions
    assert (w.session == -1).all() and np.all(np.diff(w.arrival_us) >= 0)


def test_think_time_constant_overrides_the_gaps():
    w = _golden(think_time_us=250_000)
    assert set(w.think_time_us[w.follow_up].tolist()) == {250_000}
    with pytest.raises(ValueError, match="think_time_us"):
        read_trace(HEADER, DATA, think_time_us=1)  # fixed mode


def test_non_consecutive_rounds_are_refused(tmp_path):
    text = DATA.read_text().splitlines()
    # round 1 of the first session becomes round 2
    text[4] = text[4].replace(",sess_4187093735911720450,1,", ",sess_4187093735911720450,2,")
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match="non-consecutive rounds"):
        read_trace(HEADER, bad, session_mode="closed-loop")


def test_produced_tokens_drop_the_last_and_stop_at_the_length_cap():
    assert produced_tokens(100, 10, 0) == 9
    assert produced_tokens(100, 0, 0) == 0
    assert produced_tokens(100, 10, 105) == 4  # capped at PI = 104
    assert produced_tokens(200, 10, 105) == 0


def _session_workload(accumulate=True, deadline0=0) -> Workload:
    """One session of three rounds: (message, output, think) = (20, 3, –), (12, 2, 5 ms),
    (8, 1, 0)."""
    return Workload(
        request_id=np.arange(3), arrival_us=[0, FOLLOW_UP_ARRIVAL_US, FOLLOW_UP_ARRIVAL_US],
        input_tokens=[20, 12, 8], output_tokens=[3, 2, 1], prefix_group=[-1] * 3,
        prefix_length=[0] * 3, tenant=[0] * 3, client=[0] * 3, slo_class=[0] * 3,
        deadline_us=[deadline0, 0, 0], session=[0] * 3, round_index=[0, 1, 2],
        think_time_us=[0, 5_000, 0], session_names=("s",), session_accumulate=accumulate)


def test_session_blocks_are_shared_by_the_conversation_only():
    w = _session_workload()
    prompts = prompt_tokens(w, 0)
    assert prompts.tolist() == [20, 34, 43] and next_round(w).tolist() == [1, 2, -1]
    shared = content_tokens(w, prompts)
    assert shared.tolist() == [22, 35, 43]  # L + max(N_out, 1) − 1
    # block 0 of rounds 0 and 1 is the same content; block 1 of round 0 holds its last token
    assert block_code(0, -1, 0, 0, 16, 0, 22) == block_code(1, -1, 0, 0, 16, 0, 35)
    assert block_code(0, -1, 0, 1, 16, 0, 22) != block_code(1, -1, 0, 1, 16, 0, 35)
    assert content_tokens(_session_workload(accumulate=False), prompts).tolist() == [0, 0, 0]


def test_a_session_runs_closed_loop_as_computed_by_hand():
    """Blackbox step = 1000 + 10·prefill + 100·decode µs, block size 16. Round 0 (20 tokens,
    3 out): steps 0–1200 (prefill), –2300, –3400; it completes at 3,400. Round 1 arrives at
    3,400 + 5,000 = 8,400 with 20 + 2 + 12 = 34 tokens, finds block 0 cached and prefills 18:
    1,180 µs, then one decode step: done at 10,680. Round 2 arrives at once with
    34 + 1 + 8 = 43 tokens, finds 2 blocks and prefills 11: TTFT = E2E = 1,110."""
    r = simulate(make_resolved(), _session_workload())
    assert r.status.tolist() == [COMPLETED] * 3
    assert r.sessions.arrival_us.tolist() == [0, 8_400, 10_680]
    assert r.sessions.prompt_tokens.tolist() == [20, 34, 43]
    assert r.ttft_us.tolist() == [1_200, 1_180, 1_110]
    assert r.e2e_us.tolist() == [3_400, 2_280, 1_110]
    assert int(r.cache_hits.sum()) == 3  # blocks: 1 for round 1, 2 for round 2


def test_without_accumulate_a_follow_up_sends_only_its_message():
    r = simulate(make_resolved(), _session_workload(accumulate=False))
    assert r.sessions.prompt_tokens.tolist() == [20, 12, 8]
    assert int(r.cache_hits.sum()) == 0
    assert r.sessions.arrival_us.tolist() == [0, 8_400, 8_400 + 1_120 + 1_100]


def test_a_round_that_ends_badly_ends_its_session():
    # round 0 times out at 2,000 µs (mid-decode): no follow-up is created
    r = simulate(make_resolved(), _session_workload(deadline0=2_000))
    assert r.status.tolist() == [TIMED_OUT, UNFINISHED, UNFINISHED]
    assert r.sessions.arrival_us[1:].tolist() == [FOLLOW_UP_ARRIVAL_US] * 2
    # max_model_len 40: round 2's 43-token prompt is unservable and dropped
    r = simulate(make_resolved(max_model_len=40), _session_workload())
    assert r.status.tolist() == [COMPLETED, COMPLETED, DROPPED]


def test_a_follow_up_past_the_horizon_is_not_created():
    r = simulate(make_resolved(horizon_us=8_000), _session_workload())
    assert r.status.tolist() == [COMPLETED, UNFINISHED, UNFINISHED]
    assert r.sessions.arrival_us[1] == FOLLOW_UP_ARRIVAL_US


def test_session_workloads_are_validated():
    w = _session_workload()
    with pytest.raises(ValueError, match="round_index"):
        dataclasses.replace(w, round_index=np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="share one timeout"):
        dataclasses.replace(w, deadline_us=np.array([0, 5_000, 6_000]))
    with pytest.raises(ValueError, match="after every other request"):
        dataclasses.replace(w, session=np.array([0, 0, -1]), round_index=np.array([0, 1, 0]),
                            arrival_us=np.array([0, FOLLOW_UP_ARRIVAL_US, 5]))


def test_head_keeps_the_conversations_of_the_first_requests():
    w = _golden()
    first = w.head(3)  # three round 0s, each with its three later rounds
    assert first.num_requests == 12 and len(first.session_names) == 3
    assert first.session_names == w.session_names[:3]
    assert first.request_id[:3].tolist() == w.request_id[:3].tolist()
    assert first.session[3:].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert int(prompt_tokens(first, 4096)[first.session == 0].sum()) == 140 + 624 + 1428 + 2584
