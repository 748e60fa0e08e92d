"""Policy programs in both engines: hand-computed decisions, programs equivalent to templates,
and a population of 64 structurally distinct random programs (routing, admission and priority
at once) in one compiled call, each lane equal to its own reference run
(docs/policy-programs.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import (
    AdmissionConfig,
    PriorityConfig,
    RoutingConfig,
    ScorerWeight,
    resolve_config,
)
from blisjax.config.codes import Scorer
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.metrics import records
from blisjax.program import compile_program, to_text
from blisjax.program.observables import RECENT_SIGNALS, scorer_name
from blisjax.reference import simulate as reference
from blisjax.reference.program import RecentSignals, recent_arrivals
from tests.engine.conftest import edge_engine, edge_rows_twice, room_for_a_program
from tests.engine.test_parity import EDGE_ROWS
from tests.program.random_programs import random_program
from tests.reference.conftest import make_resolved, make_workload

# Four requests a microsecond apart, long enough to stay in flight past the last arrival.
SPREAD = [dict(arrival=k, input=20, output=50) for k in range(4)]


def _with(resolved, **sections):
    policy = dataclasses.replace(resolved.config.policy, **sections)
    return resolve_config(dataclasses.replace(resolved.config, policy=policy))


def test_hand_computed_routing_and_admission():
    base = make_resolved(instances=2)
    w = make_workload(SPREAD)
    # least in flight, ties to the lowest index: 0 (0,0), 1 (1,0), 0 (1,1), 1 (2,1)
    fewest = _with(base, routing=RoutingConfig(policy="program", program="-in_flight",
                                               tie_break="lowest-index"))
    assert reference(fewest, w).instance.tolist() == [0, 1, 0, 1]
    # the most in flight: every request joins instance 0 once it has one
    most = _with(base, routing=RoutingConfig(policy="program", program="in_flight",
                                             tie_break="lowest-index"))
    assert reference(most, w).instance.tolist() == [0, 0, 0, 0]
    # admit while fewer than 3 of the tenant's requests are in flight: the fourth is rejected
    quota = _with(base, admission=AdmissionConfig(policy="program",
                                                  program="tenant_in_flight < 3"))
    status = reference(quota, w).status.tolist()
    assert status == [records.COMPLETED] * 3 + [records.REJECTED]


def test_recent_signals_by_hand():
    # windows of 1 s: [0, 1 s), [1 s, 2 s), ...; a reading covers the current and previous one
    recent = RecentSignals()
    recent.record(100_000, RecentSignals.TTFT, 30_000, 1)  # 30 ms
    recent.record(900_000, RecentSignals.TTFT, 50_000, 1)  # 50 ms
    recent.record(900_000, RecentSignals.HIT, 32, 64)
    assert recent.values(950_000)["recent_ttft_ms"] == 40.0
    assert recent.values(950_000)["recent_hit_rate"] == 0.5
    assert recent.values(1_500_000)["recent_ttft_ms"] == 40.0  # the previous window
    recent.record(1_200_000, RecentSignals.TTFT, 10_000, 2)  # two first tokens, 10 ms in all
    assert recent.values(1_200_000)["recent_ttft_ms"] == 90_000 / 4 / 1000  # both windows
    assert recent.values(2_100_000)["recent_ttft_ms"] == 5.0  # [1 s, 2 s) only
    assert recent.values(2_100_000)["recent_hit_rate"] == 0.0  # no admission since 1 s
    assert recent.values(3_000_000)["recent_ttft_ms"] == 0.0  # nothing in [2 s, 4 s)
    recent.record(3_500_000, RecentSignals.ITL, 7_000, 2)  # two windows after: both reset
    assert recent.values(3_600_000) == {"recent_ttft_ms": 0.0, "recent_itl_ms": 3.5,
                                        "estimated_wait_ms": 0.0, "recent_hit_rate": 0.0}
    arrivals = [0, 10, 1_000_000, 1_000_010, 2_500_000]  # in (now - 1 s, now]:
    assert recent_arrivals(arrivals, 1_000_010) == 2  # 1_000_000 and 1_000_010 (10 is not)
    assert recent_arrivals(arrivals, 999_999) == 2  # 0 and 10
    assert recent_arrivals(arrivals, 2_600_000) == 1


def test_a_priority_program_of_minus_the_prompt_is_sjf():
    # priority-fcfs orders by (priority desc, arrival, index); with priority = -input_tokens
    # that is sjf's (input asc, arrival, index)
    base = make_resolved(instances=1, max_running=1)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    sjf = reference(make_resolved(instances=1, max_running=1, scheduler="sjf"), w)
    program = reference(make_resolved(
        instances=1, max_running=1, scheduler="priority-fcfs",
        priority=PriorityConfig(policy="program", program="-input_tokens")), w)
    assert first_divergence(sjf, program) is None
    assert not np.array_equal(sjf.ttft_us, reference(base, w).ttft_us)  # the order matters


@pytest.mark.parametrize("scorer", list(Scorer), ids=Scorer.labels())
def test_each_scorer_alone_is_weighted_routing_with_that_scorer(scorer):
    # the weighted total of one scorer of weight 1 is its clamped value times 1.0
    base = make_resolved(instances=3, refresh_us=500, cache_delay_us=700)
    later = [dict(r, arrival=r["arrival"] + 9500) for r in EDGE_ROWS]
    w = make_workload(EDGE_ROWS + later, ("a", "b"), ("g",))
    weighted = _with(base, routing=RoutingConfig(policy="weighted",
                                                 scorers=(ScorerWeight(scorer.label, 1.0),)))
    program = _with(base, routing=RoutingConfig(policy="program", program=scorer_name(scorer)))
    assert first_divergence(reference(weighted, w), reference(program, w)) is None


def _drawn_rows(rng: np.random.Generator, count: int, gap_us: float = 400.0) -> list[dict]:
    """A drawn workload: Poisson arrivals ``gap_us`` apart on average, prompts sharing a
    prefix or not, two tenants, every SLO class, some deadlines."""
    arrival = np.cumsum(rng.exponential(gap_us, count)).astype(int)
    rows = []
    for k in range(count):
        shared = rng.random() < 0.4
        rows.append(dict(arrival=int(arrival[k]), input=int(rng.integers(33, 160)) if shared
                         else int(rng.integers(4, 160)), output=int(rng.integers(0, 30)),
                         group=0 if shared else -1, prefix=32 if shared else 0,
                         tenant=str(rng.choice(["a", "b"])),
                         slo=str(rng.choice(["", "critical", "standard", "sheddable", "batch",
                                             "background"])),
                         deadline=int(arrival[k] + rng.integers(2000, 40000))
                         if rng.random() < 0.2 else 0))
    return rows


def _program_configs(base, count: int, seed: int):
    """``count`` configurations whose routing, admission and priority are random programs
    (admission programs shifted to admit most requests), with random parameters, schedulers
    and tie-breaks; every routing program distinct."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < count:
        node = random_program(rng, "routing", depth=5)
        text = to_text(node)
        if text in seen:
            continue
        seen.add(text)
        w = float(rng.normal(0, 2))
        routing = RoutingConfig(policy="program", program=f"{text} + w * in_flight",
                                params={"w": w}, tie_break=str(rng.choice(
                                    ["blis-random", "lowest-index"])))
        admit = to_text(random_program(rng, "admission", depth=3))
        admission = AdmissionConfig(policy="program", program=f"({admit}) + 0.5 > 0.25 * "
                                    "(cluster_in_flight > 6)") if rng.random() < 0.7 \
            else AdmissionConfig()
        priority = PriorityConfig(policy="program", program=to_text(
            random_program(rng, "priority", depth=4))) if rng.random() < 0.8 \
            else PriorityConfig(policy="slo-based")
        scheduler = dataclasses.replace(base.policy.scheduler, policy=str(rng.choice(
            ["fcfs", "priority-fcfs", "priority-fcfs"])))
        policy = dataclasses.replace(base.policy, routing=routing, admission=admission,
                                     priority=priority, scheduler=scheduler)
        engine = dataclasses.replace(base.engine, preemption_policy=str(rng.choice(
            ["fcfs", "priority"])))
        out.append(dataclasses.replace(base, policy=policy, engine=engine))
    return out


@pytest.fixture(scope="module")
def program_population():
    """64 random program lanes on three workloads (the edge rows twice; a drawn one of the
    same size; a drawn one spread over ~3 s, so the recent signals' 1 s windows roll), one
    compiled program, lockstep blocks of 8."""
    room_for_a_program()
    base = edge_engine(instances=3)
    rows = edge_rows_twice()
    drawn = _drawn_rows(np.random.default_rng(11), len(rows))
    spread = _drawn_rows(np.random.default_rng(12), len(rows), gap_us=150_000.0)
    workloads = tuple(make_workload(r, ("a", "b"), ("g",)) for r in (rows, drawn, spread))
    configs = _program_configs(base.config, 64, seed=3)
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, list(workloads))
    lanes = tuple(simulate_population(base, w, params, static=static, lane_block=8)
                  for w in workloads)
    return workloads, configs, lanes


def test_random_program_population_matches_reference_runs(program_population):
    workloads, configs, lanes = program_population
    texts = {c.policy.routing.program for c in configs}
    assert len(texts) == 64  # structurally distinct
    reads = set().union(*(compile_program("routing", program=c.policy.routing.program,
                                          params=dict(c.policy.routing.params)).reads
                          for c in configs))
    assert {"cached_blocks", scorer_name(Scorer.PREFIX_AFFINITY),
            scorer_name(Scorer.NO_HIT_LRU), "age_ms", "cluster_kv_utilization",
            "arrival_rate", *RECENT_SIGNALS} <= reads
    rejected = preempted = 0
    targets = set()
    for w, run in zip(workloads, lanes, strict=True):
        for k, cfg in enumerate(configs):
            want = reference(resolve_config(cfg), w)
            assert first_divergence(want, run[k]) is None, (k, cfg.policy)
            rejected += int(np.sum(want.status == records.REJECTED))
            preempted += int(np.sum(want.preemption_count))
            targets.add(tuple(want.instance.tolist()))
    assert rejected > 0 and preempted > 0  # admission programs reject, KV pressure preempts
    assert len(targets) > 32  # the programs route differently
