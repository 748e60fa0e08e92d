"""JAX engine vs reference engine: every request's timestamps and every run counter identical.

Expected values are the reference engine's (the oracle), itself pinned by hand-computed tests
and BLIS's golden outputs.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import numpy as np
import pytest

from blisjax.config import (
    AdmissionConfig,
    PriorityConfig,
    RoutingConfig,
    ScorerWeight,
    SimConfig,
    apply_blis_flag_values,
    resolve_config,
)
from blisjax.config.codes import Scorer, TieBreak
from blisjax.engine import (
    params_from_config,
    set_knob,
    simulate,
    simulate_population,
    stack_params,
)
from blisjax.engine.parity import first_divergence
from blisjax.engine.static_lanes import for_runs
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from blisjax.workload import read_trace
from tests.engine.static_like import static_like
from tests.paths import GOLDEN_DIR
from tests.reference.conftest import make_resolved, make_workload

# Golden cases whose KV cache is small enough for a test; each is one ~35 s compile, so the
# default tier keeps case 0 (the JAX engine against BLIS itself) and the slow tier (-m slow)
# adds the others.
SMALL_GOLDEN = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", SMALL_GOLDEN)
def test_golden_case_parity(case):
    path = GOLDEN_DIR / f"golden_case{case}.json"
    flags = json.loads(path.read_text())["flags"]
    resolved = resolve_config(apply_blis_flag_values(SimConfig(), flags))
    w = read_trace(GOLDEN_DIR / "header.yaml", GOLDEN_DIR / f"golden_case{case}.csv")
    # decode stretches forced on (by default short outputs run without them): the golden
    # case's long decodes end at every kind of event
    got = simulate(resolved, w, decode_stretches=True)
    assert first_divergence(reference(resolved, w), got, w.request_id) is None


EDGE_ROWS = [  # simultaneous arrivals, ties, long prompts, a shared prefix, deadlines, zero outputs
    dict(arrival=0, input=40, output=6, group=0, prefix=32, tenant="a", slo="critical"),
    dict(arrival=0, input=40, output=3, group=0, prefix=32, tenant="b"),
    dict(arrival=0, input=9, output=0, tenant="a", slo="batch"),
    dict(arrival=500, input=130, output=12, deadline=9_000, tenant="b"),
    dict(arrival=500, input=35, output=25, group=0, prefix=32, tenant="a"),
    dict(arrival=1200, input=70, output=1, deadline=1300, tenant="a", slo="critical"),
    dict(arrival=4000, input=64, output=30, tenant="b", slo="batch"),
    dict(arrival=4000, input=37, output=8, group=0, prefix=32, deadline=60_000, tenant="a"),
    dict(arrival=9000, input=200, output=5, tenant="b"),
    dict(arrival=9001, input=48, output=40, group=0, prefix=32, tenant="a"),
    # under max-model-len 120 it finishes exactly at the cap (pi = 119): completed, not capped
    dict(arrival=9500, input=100, output=20, tenant="b"),
]

EDGE_CASES = {
    "preemption-storm": dict(block_size=4, kv_blocks=30, max_running=6),
    "chunked-budget": dict(threshold=24, max_tokens=48, instances=2),
    "full-kv-priority-preemption": dict(block_size=4, kv_blocks=26, preemption="priority",
                                        priority=PriorityConfig(policy="slo-class"),
                                        scheduler="priority-fcfs", horizon_us=400_000),
    "max-model-len": dict(max_model_len=120, instances=2, routing=RoutingConfig(
        policy="least-loaded")),
    "horizon-cut": dict(horizon_us=20_000, instances=2),
    "token-bucket": dict(admission=AdmissionConfig(policy="token-bucket",
                                                   token_bucket_capacity=150.0,
                                                   token_bucket_refill_rate=20_000.0)),
    "stale-snapshots-weighted": dict(instances=3, refresh_us=2000, alpha=(120.5, 1.5, 30.0),
                                     routing=RoutingConfig(policy="weighted")),
    # routing decided 700 µs after admission (other arrivals and steps interleave; an
    # admission is never fused with its routing), admission itself 300 µs after arrival
    "cluster-latencies": dict(instances=2, admission_latency_us=300, routing_latency_us=700,
                              alpha=(95.5, 1.25, 21.7),
                              routing=RoutingConfig(policy="least-loaded")),
}


# Every case's features are also covered in the default tier: by the population test (chunked
# prefill under a token budget, token-bucket admission, weighted routing over periodic
# snapshots, a horizon cut, and admission and routing latencies among its random policies), by
# the narrow-program test (the preemption storm at every step width) or by the decode-stretch
# scenario (tests/engine/test_stretches.py: a request ending exactly at the max-model-len cap,
# priority preemption with the KV cache full). Each case compiles its own program (~45 s on 2
# cores), so all of them run in the slow tier.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_case_parity(name):
    resolved = make_resolved(**EDGE_CASES[name])
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    got = simulate(resolved, w, decode_stretches=True)
    assert first_divergence(reference(resolved, w), got) is None


# The hand cases below (and the preemption storm's narrow programs, the long queue's
# schedulers) run on one compiled program (``static_lanes.for_runs``): blocks of 4 tokens,
# their KV caches, running caps and token budgets each lane's own, spare request rows, step
# programs from width 2 up. Each case runs HAND_LANES lanes: a lockstep block of at least
# ``lanes.FLAT_MIN_LANES``, so completions queue their releases.
HAND_LANES, HAND_TENANTS, HAND_GROUPS = 16, ("a", "b"), ("g",)


def _final_token_case():
    rows = [dict(arrival=0, input=8, output=1), dict(arrival=0, input=8, output=1),
            dict(arrival=5000, input=12, output=3)]
    return (make_resolved(block_size=4, kv_blocks=5, max_running=4),
            make_workload(rows, HAND_TENANTS, HAND_GROUPS))


def _many_completions_case():
    rows = [dict(arrival=0, input=6 + k % 3, output=4, **({"group": 0, "prefix": 4}
                                                           if k % 2 else {}))
            for k in range(20)]  # half share a prefix block: freed at its last holder
    rows += [dict(arrival=50_000 + 10 * k, input=9, output=2) for k in range(20)]
    return (make_resolved(block_size=4, kv_blocks=64, max_running=32),
            make_workload(rows, HAND_TENANTS, HAND_GROUPS))


def _tenant_quota_case():
    rows = [dict(arrival=0, input=8, output=1, tenant="a") for _ in range(3)]
    rows += [dict(arrival=100_000, input=8, output=1, tenant="a") for _ in range(3)]
    admission = AdmissionConfig(policy="tenant-quota", default_tenant_max_in_flight=3)
    return (make_resolved(block_size=4, kv_blocks=20, max_running=4, admission=admission),
            make_workload(rows, HAND_TENANTS, HAND_GROUPS))


def _storm_case():
    return (make_resolved(**EDGE_CASES["preemption-storm"]),
            make_workload(EDGE_ROWS, HAND_TENANTS, HAND_GROUPS))


def _long_queue_case():
    return (make_resolved(max_running=2, max_tokens=64, kv_blocks=400, block_size=4),
            make_workload(_long_queue_rows(160, seed=11), HAND_TENANTS, HAND_GROUPS))


@cache
def _hand_program():
    """The hand cases' program; running width 2: steps run programs of width 2, 4, 8, 16 or
    32 (the narrowest that running + queued fits), each of which must give the reference."""
    cases = (_final_token_case, _many_completions_case, _tenant_quota_case, _storm_case,
             _long_queue_case)
    return for_runs([case() for case in cases], running_width=2)


def _hand_lanes(resolved, w, configs) -> list:
    """Each of ``configs`` run on the hand cases' program (repeated to HAND_LANES lanes)."""
    params = stack_params([params_from_config(configs[k % len(configs)], w.tenant_names)
                           for k in range(HAND_LANES)])
    return simulate_population(resolved, w, params, static=_hand_program())[:len(configs)]


def test_the_hand_cases_share_one_program():
    st = _hand_program()
    assert (st.shapes.num_requests, st.shapes.kv_blocks, st.shapes.batch_slots) == (160, 400, 32)
    assert st.features.lane_settings and st.tuning.running_width == 2


# three hand cases of one configuration: a burst on one instance's worth of KV, a lone long
# request, and a trickle whose last arrival is past a short horizon
SPARE_ROW_CASES = (
    [dict(arrival=k * 10, input=40 + 8 * k, output=6 + k % 3) for k in range(9)],
    [dict(arrival=0, input=300, output=20)],
    [dict(arrival=k * 4_000, input=24, output=30, deadline=9_000 if k == 2 else 0)
     for k in range(5)],
)


def _spare_rows_resolved(horizon_us: int):
    return make_resolved(block_size=4, kv_blocks=60, max_running=4, max_tokens=128,
                         horizon_us=horizon_us)


def test_hand_cases_of_other_sizes_and_horizons_share_one_program():
    """Workloads of fewer requests than the program's 160 rows leave the rest spare (they
    never arrive); the horizon is a value of the run, not of the program."""
    cfg = _spare_rows_resolved(2**63 - 1).config
    lanes = [cfg, set_knob(cfg, "scheduler.policy", "sjf")]
    cut = 0
    for horizon_us in (2**63 - 1, 10_000):
        for rows in SPARE_ROW_CASES:
            w = make_workload(rows, HAND_TENANTS, HAND_GROUPS)
            configs = [dataclasses.replace(c, horizon_us=horizon_us) for c in lanes]
            got = _hand_lanes(_spare_rows_resolved(horizon_us), w, configs)
            for k, c in enumerate(configs):
                want = reference(resolve_config(c), w)
                assert first_divergence(want, got[k]) is None, (horizon_us, w.num_requests, k)
                assert len(got[k].status) == w.num_requests
                assert got[k].horizon_us == horizon_us
                cut += int(np.sum(want.status == records.UNFINISHED))
    assert cut > 0  # the short horizon ends some run with requests in flight
    assert _hand_program().shapes.num_requests == 160


def test_final_token_block_after_a_release_in_the_same_step():
    """Two requests finish in one step, each needing a fresh block for its final token, and
    the second finds the free list empty until the first has released its blocks: 5 blocks
    of 4 tokens, two prompts of 8 (2 blocks each, one block left); A's final token takes it,
    A's release frees 3, and B's final token takes one of those. The engine queues
    completions' releases, so it must run them before B's allocation (cache misses and the
    free list's order would differ otherwise; a third request reuses the freed blocks)."""
    resolved, w = _final_token_case()
    ref = reference(resolved, w)
    assert ref.cache_misses[0] == 2 + 2 + 1 + 1 + 4  # prompts, both final tokens, the third
    _queued_release_lanes_match(resolved, w, ref)


def test_more_completions_in_one_step_than_the_release_queue_holds():
    """20 requests admitted together finish in the same step: more than the 8 releases a
    lane queues (``state.DEFERRED_RELEASES``), so the lane runs its queue itself and queues
    again. A second wave needs 60 of the 64 blocks: a release lost on the way would
    make it wait or preempt."""
    resolved, w = _many_completions_case()
    _queued_release_lanes_match(resolved, w, reference(resolved, w))


def test_completions_of_one_step_at_once_free_their_tenants_quota():
    """Three requests of one tenant finish in the same step (so a lockstep block of lanes
    completes them in one pass, ``completion.complete_planned``), each final token taking a
    fresh block (prompts of exactly 2 blocks of 4). The tenant may have 3 requests in flight:
    the next three arrivals are admitted only if all three completions left the count, and are
    rejected if the pass decremented it once per step instead of once per request.
    (An instance whose batch empties is idle at once — BLIS accounts completions at the step's
    start — so the second wave's arrivals, all at one tick, share one step too.)"""
    resolved, w = _tenant_quota_case()
    want = reference(resolved, w)
    assert want.rejected_admission == 0
    assert want.cache_misses[0] == 2 * (3 * 2 + 3)  # two waves: prompts, then final tokens
    _queued_release_lanes_match(resolved, w, want)


def _queued_release_lanes_match(resolved, w, want):
    """HAND_LANES lanes of one policy (a lockstep block of >= ``lanes.FLAT_MIN_LANES`` lanes
    on one or two devices, so completions queue their releases) each equal to the reference
    run."""
    for k, lane in enumerate(_hand_lanes(resolved, w, [resolved.config] * HAND_LANES)):
        assert first_divergence(want, lane) is None, k


def _random_policy_configs(base: SimConfig, tenants, count: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        adm = rng.choice(["always-admit", "token-bucket", "rate-limit", "tenant-quota",
                          "reject-all"], p=[0.4, 0.2, 0.15, 0.2, 0.05])
        admission = AdmissionConfig(
            policy=str(adm), token_bucket_capacity=float(rng.uniform(50, 3000)),
            token_bucket_refill_rate=float(rng.uniform(1e3, 1e5)),
            rate_limit_rps=float(rng.uniform(50, 2000)), rate_limit_burst=float(rng.uniform(1, 6)),
            tenant_max_in_flight=((tenants[0], int(rng.integers(1, 4))),),
            default_tenant_max_in_flight=int(rng.integers(1, 6)))
        priority = PriorityConfig(policy=str(rng.choice(
            ["constant", "slo-based", "slo-class", "tenant-priority", "deadline-aware"])),
            age_weight=float(rng.choice([1.0, -0.5, 2.5])),
            tenant_scores=((tenants[1], float(rng.uniform(-2, 2))),))
        names = list(rng.permutation(Scorer.labels())[: int(rng.integers(1, 5))])
        routing = RoutingConfig(
            policy=str(rng.choice(["round-robin", "least-loaded", "always-busiest", "weighted"],
                                  p=[0.2, 0.2, 0.1, 0.5])),
            scorers=tuple(ScorerWeight(str(n), float(rng.uniform(0.1, 3))) for n in names),
            tie_break=str(rng.choice(TieBreak.labels(), p=[0.75, 0.25])))
        policy = base.policy.__class__(admission=admission, priority=priority, routing=routing,
                                       scheduler=base.policy.scheduler.__class__(
                                           policy=str(rng.choice(["fcfs", "priority-fcfs",
                                                                  "sjf"]))))
        engine = base.engine.__class__(**{**base.engine.__dict__, "preemption_policy": str(
            rng.choice(["fcfs", "priority"]))})
        out.append(base.__class__(**{**base.__dict__, "policy": policy, "engine": engine}))
    return out


def test_population_lanes_match_independent_reference_runs(edge_population):
    # What a search runs: one compiled program, 16 distinct random policies in two lockstep
    # blocks of 8 lanes — enough lanes that completions queue their releases for one flat pass
    # across the block (``lanes.release_queued``) and complete in one planned pass
    # (``completion.complete_planned``). Each lane must equal its own reference run. The
    # scenario (tests/engine/conftest.py) has chunked prefill, periodic snapshots, a stale copy
    # of the caches for the cache scorers, a horizon cut, and admission and routing latencies;
    # its program also serves test_population.py's shared-program and evaluate_population tests.
    from blisjax.engine.lanes import FLAT_MIN_LANES

    pop = edge_population
    assert pop.lane_block >= FLAT_MIN_LANES  # else the blocks release in place
    w, configs, lanes = pop.workloads[0], pop.configs, pop.lanes[0]
    assert len(lanes) == len(configs) == 16
    assert len({(c.policy, c.engine.preemption_policy) for c in configs}) == len(configs)
    assert {"token-bucket", "rate-limit", "tenant-quota"} <= {c.policy.admission.policy
                                                             for c in configs}
    assert "weighted" in {c.policy.routing.policy for c in configs}  # over stale snapshots
    routings = [c.policy.routing for c in configs]
    # ties broken both ways, and BLIS HEAD's scorers among the weighted lanes
    assert {"blis-random", "lowest-index"} == {r.tie_break for r in routings
                                               if r.policy in ("least-loaded", "weighted")}
    used = {w.name for r in routings if r.policy == "weighted" for w in r.scorers}
    assert used == set(Scorer.labels()), used
    assert {"fcfs", "priority-fcfs", "sjf"} == {c.policy.scheduler.policy for c in configs}
    assert {"fcfs", "priority"} == {c.engine.preemption_policy for c in configs}
    unfinished = stale_routes = late_routes = preemptions = 0
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, lanes[k]) is None, (k, cfg.policy)
        unfinished += int(np.sum(want.status == records.UNFINISHED))
        preemptions += int(np.sum(want.preemption_count))
        live = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster,
                                                                    cache_signal_delay_us=0))
        stale_routes += not np.array_equal(reference(resolve_config(live), w).instance,
                                           want.instance)
        at_once = dataclasses.replace(cfg, cluster=dataclasses.replace(
            cfg.cluster, admission_latency_us=0, routing_latency_us=0))
        late_routes += not np.array_equal(reference(resolve_config(at_once), w).ttft_us,
                                          want.ttft_us)
    assert unfinished > 0  # some lane is cut off by the horizon with requests in flight
    assert stale_routes > 0  # the cache copy's staleness changes some lane's routing
    assert late_routes == len(configs)  # the cluster latencies change every lane's run
    assert preemptions > 0


@pytest.mark.parametrize(("narrowest", "slots", "per_octave", "widths"), [
    (64, 256, 1, (64, 128, 256)), (2, 6, 1, (2, 4, 6)), (2, 8, 1, (2, 4, 8)),
    (64, 64, 1, (64,)), (64, 16, 1, (16,)),
    (64, 256, 2, (64, 96, 128, 192, 256)), (2, 6, 2, (2, 3, 4, 6)), (2, 8, 2, (2, 3, 4, 6, 8)),
    (1, 3, 2, (1, 2, 3)), (64, 64, 2, (64,))])
def test_step_widths_grow_from_the_narrowest_to_batch_slots(narrowest, slots, per_octave,
                                                            widths):
    from blisjax.engine.instance import step_widths
    st = static_like(running_width=narrowest, batch_slots=slots, narrow_programs=True)
    assert step_widths(st, per_octave) == widths


@pytest.mark.parametrize(("table", "widths"), [
    (85, (32, 64, 85)), (64, (32, 64)), (20, (20,)), (33, (32, 33)), (0, (1,))])
def test_release_widths_double_up_to_block_table(table, widths):
    from blisjax.engine.kvcache import release_widths
    assert release_widths(static_like(max_blocks_per_request=table,
                                      narrow_programs=True)) == widths


@pytest.mark.parametrize(("prompt_blocks", "group_blocks", "sessions", "widths"), [
    (85, 8, False, (8, 85)), (8, 8, False, (8,)), (5, 8, False, (5,)), (0, 1, False, (1,)),
    (85, 8, True, (85,))])
def test_prefix_widths_narrow_to_the_prefix_groups(prompt_blocks, group_blocks, sessions,
                                                   widths):
    # a never-preempted request's cached chain is at most the prefix groups' block count;
    # with closed-loop sessions a follow-up's chain may be its whole prompt
    from blisjax.engine.kvcache import prefix_widths
    st = static_like(max_prompt_blocks=prompt_blocks, group_blocks_max=group_blocks,
                     sessions=sessions)
    assert prefix_widths(st) == widths


@pytest.mark.parametrize("name", ["preemption-storm",
                                  pytest.param("full-kv-priority-preemption",
                                               marks=pytest.mark.slow)])
def test_narrow_step_program_parity(name):
    # running_width 2 < 6 batch slots: steps run programs of width 2, 4 or 6 (the narrowest
    # that running + queued fits); every one must reproduce the reference exactly. (The
    # default tier runs the preemption storm only here, on the hand cases' program: widths
    # 2, 4 and 8.)
    if name == "preemption-storm":
        resolved, w = _storm_case()
        got = _hand_lanes(resolved, w, [resolved.config])[0]
    else:
        resolved = make_resolved(**EDGE_CASES[name])
        w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
        got = simulate(resolved, w, running_width=2, narrow_programs=True)
    assert first_divergence(reference(resolved, w), got) is None


def test_without_narrow_programs_each_family_has_its_widest_width_only():
    from blisjax.engine.instance import step_widths
    from blisjax.engine.kvcache import release_widths
    st = static_like(running_width=64, batch_slots=256, max_blocks_per_request=85,
                     narrow_programs=False)
    assert step_widths(st, 2) == (256,)
    assert release_widths(st) == (85,)


def test_enqueue_paired_with_the_event_before_it_is_a_whole_event():
    # The cheap-event loop handles an enqueue in the same pass as the event before it
    # (cluster.lane_advance); that enqueue must do an event's bookkeeping too. Here it is the
    # run's last event: r1 is routed at 5,000 µs and enqueued after the 500 µs α delay, while
    # r0's first step (500 µs + 1,000 + 10 × 1,000 µs) ends after the 8,000 µs horizon, so the
    # run ends at that enqueue's time.
    resolved = make_resolved(alpha=(500.0, 0.0, 0.0), horizon_us=8_000)
    w = make_workload([dict(arrival=0, input=1000, output=4),
                       dict(arrival=5_000, input=10, output=2)])
    want = reference(resolved, w)
    assert want.sim_ended_us == 5_500 and want.still_queued.tolist() == [1]
    assert first_divergence(want, simulate(resolved, w)) is None


def _long_queue_rows(count: int, seed: int) -> list[dict]:
    """A burst of ``count`` requests within 2 ms for one instance that runs two at a time:
    the wait queue grows far past one scan chunk (``queues.Q_CHUNK``), lengths vary (sjf),
    slo classes vary (priority) and a third have deadlines that expire mid-queue."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(count):
        row = dict(arrival=int(rng.integers(0, 2000)), input=int(rng.integers(4, 60)),
                   output=int(rng.integers(1, 4)),
                   slo=str(rng.choice(["critical", "standard", "batch", ""])))
        if k % 3 == 0:
            row["deadline"] = row["arrival"] + int(rng.integers(20_000, 400_000))
        rows.append(row)
    return sorted(rows, key=lambda r: r["arrival"])


def _max_waiting(result, workload) -> int:
    """Most requests waiting at once: completed requests between arrival and scheduling."""
    done = result.status == records.COMPLETED
    start = workload.arrival_us[done]
    end = start + result.scheduling_delay_us[done]
    events = sorted([(int(t), 1) for t in start] + [(int(t), -1) for t in end])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_long_queue_schedulers_match_reference():
    # Queue scans (priority-fcfs, sjf), middle removals and timeouts fold over the queue a
    # chunk at a time; with ~150 queued requests every multi-chunk path runs.
    base, w = _long_queue_case()
    configs = [set_knob(set_knob(base.config, "scheduler.policy", scheduler),
                        "priority.policy", priority)
               for scheduler, priority in [("fcfs", "constant"), ("sjf", "constant"),
                                           ("priority-fcfs", "slo-class"),
                                           ("priority-fcfs", "deadline-aware")]]
    lanes = _hand_lanes(base, w, configs)
    orders, wants = set(), []
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, lanes[k]) is None, (k, cfg.policy.scheduler)
        wants.append(want)
        orders.add(tuple(np.argsort(want.scheduling_delay_us, kind="stable")))
    fcfs = wants[0]
    assert _max_waiting(fcfs, w) > 100
    assert int(np.sum(fcfs.timed_out)) > 0  # deadlines expire while requests wait mid-queue
    assert len(orders) == len(configs)  # the schedulers really order the queue differently
