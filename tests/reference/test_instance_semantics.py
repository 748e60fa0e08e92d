"""Hand-computed single-instance timelines (blackbox β = (1000, 10, 100): 1000 µs + 10 µs per
prefill token + 100 µs per decode token). Each expected number is derived in the comments."""

from blisjax.metrics.records import COMPLETED, DROPPED, TIMED_OUT, UNFINISHED
from tests.reference.conftest import run


def test_single_request_timeline():
    # step 1 @0: prefill 100 → d = 2000, TTFT = 2000; steps 2, 3: decode → d = 1100 each.
    # Completes when PI = 100 + 3 - 1 = 102, at the start of step 3 (t = 3100); leaves at 4200.
    res, _ = run([dict(arrival=0, input=100, output=3)])
    assert res.status[0] == COMPLETED
    assert res.ttft_us[0] == 2000
    assert res.e2e_us[0] == 2000 + 1100 + 1100
    assert res.itl_count[0] == 2 and res.itl_sum_us[0] == 2200
    assert list(res.itl_entries_us) == [1100, 1100]
    assert res.scheduling_delay_us[0] == 0
    assert res.sim_ended_us == 4200
    assert res.output_tokens_done[0] == 3


def test_alpha_terms_enter_metrics():
    # α = (300, 2, 50): q = 300 + 2·100 = 500 delays enqueue; α2 = 50 is added to TTFT and to
    # each ITL entry but never moves the clock.
    res, _ = run([dict(arrival=0, input=100, output=3)], alpha=(300.0, 2.0, 50.0))
    assert res.scheduling_delay_us[0] == 500
    assert res.ttft_us[0] == 500 + 2000 + 50
    assert res.e2e_us[0] == 2550 + 1150 + 1150  # N_out · α2 = 150 in total
    assert res.sim_ended_us == 500 + 4200


def test_single_output_token_completes_in_prefill_step():
    res, _ = run([dict(arrival=0, input=100, output=1)])
    assert res.ttft_us[0] == 2000 and res.e2e_us[0] == 2000 and res.itl_count[0] == 0


def test_chunked_prefill_by_threshold():
    # threshold 40: chunks 40, 40, 20 → d = 1400, 1400, 1200; TTFT at the end of the third.
    res, _ = run([dict(arrival=0, input=100, output=1)], threshold=40)
    assert res.ttft_us[0] == 1400 + 1400 + 1200


def test_token_budget_splits_prefill_and_decode_waits_for_prefill_end():
    # budget 64, A and B (50 tokens, 2 outputs) at t = 0.
    # step 1 @0: A 50, B 14 → d = 1000 + 640 = 1640; A's TTFT = 1640.
    # step 2 @1640: A decodes (1), B prefills 36 → d = 1000 + 360 + 100 = 1460; A completes,
    #   E2E(A) = 1640 + 1460; B's prefill ends → TTFT(B) = 3100.
    # step 3 @3100: B decodes → d = 1100, E2E(B) = 3100 + 1100.
    res, _ = run([dict(arrival=0, input=50, output=2), dict(arrival=0, input=50, output=2)],
                 max_tokens=64)
    assert list(res.ttft_us) == [1640, 3100]
    assert list(res.e2e_us) == [3100, 4200]
    assert list(res.scheduling_delay_us) == [0, 0]


def test_arrival_during_step_waits_for_step_boundary():
    # A @0 runs a 2000 µs prefill step; B arrives @500 and joins at the next boundary (2000):
    # step 2: A decodes, B prefills 100 → d = 1000 + 1000 + 100 = 2100. TTFT(B) = 4100 - 500.
    res, _ = run([dict(arrival=0, input=100, output=2), dict(arrival=500, input=100, output=1)])
    assert res.scheduling_delay_us[1] == 1500
    assert res.ttft_us[1] == 2000 + 2100 - 500


def test_max_running_requests_limits_phase_two():
    # max 1 running: B waits for A to leave the batch (A completes at the start of step 2 @2000,
    # whose batch is formed before completion, so B is admitted at step 3 @3100).
    res, _ = run([dict(arrival=0, input=100, output=2), dict(arrival=0, input=100, output=1)],
                 max_running=1)
    assert res.scheduling_delay_us[1] == 2000 + 1100
    assert res.ttft_us[1] == 3100 + 2000


def test_prefix_cache_hit_shortens_prefill():
    # bs 16, shared prefix 32 tokens (2 blocks). A: 40 tokens → d = 1400. B (same group, later):
    # 2 cached blocks → only 8 new tokens → d = 1080. Blocks: A allocates 3 (misses), B claims 2
    # (hits) + 1 fresh (miss); the final-token slot fits in the partial block (no miss).
    rows = [dict(arrival=0, input=40, output=1, group=0, prefix=32),
            dict(arrival=10_000, input=40, output=1, group=0, prefix=32)]
    res, _ = run(rows, groups=("g",))
    assert list(res.ttft_us) == [1400, 1080]
    assert res.cache_hits[0] == 2 and res.cache_misses[0] == 4


def test_prefix_caching_off():
    rows = [dict(arrival=0, input=40, output=1, group=0, prefix=32),
            dict(arrival=10_000, input=40, output=1, group=0, prefix=32)]
    res, _ = run(rows, groups=("g",), prefix_caching=False)
    assert list(res.ttft_us) == [1400, 1400]


def test_preemption_tail_victim_loses_progress():
    # bs 4, 5 blocks. A and B: 8 prompt tokens (2 blocks each), 3 outputs.
    # step 1 @0: both prefill → d = 1000 + 160 = 1160; TTFT = 1160 for both; 1 block left.
    # step 2 @1160: A's decode takes the last block; B's decode finds none → B (the tail) is
    #   evicted: back to the queue front, progress lost, blocks freed (hashes kept); phase 2 is
    #   skipped. d = 1100.
    # step 3 @2260: A decodes (fits in its partial block) and completes (PI 10 = 8 + 3 - 1).
    #   B is re-admitted: its 2 prompt blocks are still cached, so n = 0 (fully cached,
    #   block-aligned) and it joins with no tokens. d = 1100 → B's TTFT is re-recorded as
    #   2260 + 1100 = 3360; its scheduling delay is the last admission (2260).
    # steps 4, 5 @3360, @4460: B decodes twice (d = 1100 each) and completes.
    rows = [dict(arrival=0, input=8, output=3), dict(arrival=0, input=8, output=3)]
    res, _ = run(rows, block_size=4, kv_blocks=5)
    assert list(res.ttft_us) == [1160, 3360]
    assert list(res.e2e_us) == [1160 + 1100 + 1100, 3360 + 1100 + 1100]
    assert list(res.scheduling_delay_us) == [0, 2260]
    assert list(res.preemptions) == [0, 1] and res.preemption_count[0] == 1
    assert list(res.itl_entries_us) == [1100, 1100, 1100, 1100]  # B's pre-preemption ITLs: none
    assert all(res.status == COMPLETED)


def test_preemption_storm_conserves_and_completes():
    # Many long decoders on a tiny cache: repeated preemptions must never lose or duplicate work.
    rows = [dict(arrival=10 * i, input=8, output=12) for i in range(6)]
    res, _ = run(rows, block_size=4, kv_blocks=8)
    assert res.preemption_count[0] > 3
    assert all(res.status == COMPLETED)
    assert list(res.output_tokens_done) == [12] * 6
    assert list(res.itl_count) == [11] * 6  # only the final, uninterrupted run's ITL entries


def test_unservable_requests_are_dropped():
    rows = [dict(arrival=0, input=60, output=1),   # L_in >= max_model_len 50
            dict(arrival=0, input=40, output=20),  # 40 + 20 > 50
            dict(arrival=0, input=40, output=5)]   # fits
    res, _ = run(rows, max_model_len=50)
    assert list(res.status) == [DROPPED, DROPPED, COMPLETED]
    assert res.dropped_unservable[0] == 2
    assert res.total_input_tokens[0] == 40  # dropped requests never count as input


def test_unlimited_length_is_still_bounded_by_kv_capacity():
    # 15 blocks of 4 = 60 tokens. 40 + 30 = 70 > 60 can never complete → dropped at enqueue;
    # 30 + 30 = 60 fits (it needs ceil(59/4) = 15 blocks alone) and completes.
    rows = [dict(arrival=0, input=40, output=30), dict(arrival=0, input=30, output=30)]
    res, _ = run(rows, block_size=4, kv_blocks=15)
    assert list(res.status) == [DROPPED, COMPLETED]


def test_kv_capacity_guard_drops():
    res, _ = run([dict(arrival=0, input=40, output=1)], block_size=16, kv_blocks=2)
    assert res.status[0] == DROPPED


def test_deadline_past_due_at_enqueue_times_out_but_counts_input():
    # q = 500 µs, deadline 100 µs after arrival → already due when enqueued.
    res, _ = run([dict(arrival=0, input=100, output=3, deadline=100)], alpha=(500.0, 0.0, 0.0))
    assert res.status[0] == TIMED_OUT and res.total_input_tokens[0] == 100
    assert res.ttft_us[0] == -1


def test_timeout_while_running_keeps_ttft():
    # TTFT @2000; deadline 2500 falls in step 2 [2000, 3100): the request times out at 2500.
    res, _ = run([dict(arrival=0, input=100, output=3, deadline=2500)])
    assert res.status[0] == TIMED_OUT
    assert res.ttft_us[0] == 2000 and res.e2e_us[0] == -1
    assert res.timed_out[0] == 1


def test_completion_wins_over_timeout_in_last_step():
    # Completion is accounted at the start of the last step (3100); a deadline at 3500 (inside
    # that step) is lazily cancelled.
    res, _ = run([dict(arrival=0, input=100, output=3, deadline=3500)])
    assert res.status[0] == COMPLETED


def test_horizon_cuts_off_and_reports_unfinished():
    # Step 2 starts at 2000 <= horizon 2500; step 3 (3100) is past it and never executed.
    res, _ = run([dict(arrival=0, input=100, output=3)], horizon_us=2500)
    assert res.status[0] == UNFINISHED
    assert res.ttft_us[0] == 2000
    assert res.still_running[0] == 1
    assert res.sim_ended_us == 2000


def test_sjf_orders_waiting_requests_by_length():
    # A occupies the only slot; B (300 tokens) and C (100 tokens) wait; SJF admits C first.
    rows = [dict(arrival=0, input=100, output=2), dict(arrival=10, input=300, output=1),
            dict(arrival=20, input=100, output=1)]
    res, _ = run(rows, max_running=1, scheduler="sjf")
    assert res.scheduling_delay_us[2] < res.scheduling_delay_us[1]
    res_fcfs, _ = run(rows, max_running=1, scheduler="fcfs")
    assert res_fcfs.scheduling_delay_us[1] < res_fcfs.scheduling_delay_us[2]
