"""One compiled population program shared by several engine tests.

``edge_population`` runs what a search runs, three times on one compiled program (one
``EngineStatic``, 16 lanes in lockstep blocks of 8): 16 random policies on the edge-case
workload, the same 16 policies on a second workload of the same size (shorter prompts, longer
outputs, other deadlines; the program's capacities cover both, ``build_static_shared``), and a
16-point knob grid through ``evaluate_population``. Its consumers are test_parity.py's population
test and test_population.py's shared-program and ``evaluate_population`` tests (~1 min of
compiling on 2 cores for all three).

``room_for_a_program``: tests that share a program call it before compiling it, so that the
mapping guard does not drop the program between them.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from blisjax.config import LatencyConfig, resolve_config
from blisjax.engine import (
    evaluate_population,
    grid,
    params_from_config,
    run,
    simulate_population,
    stack_params,
)
from blisjax.engine.static import build_static_shared
from tests.engine.test_parity import EDGE_ROWS, _random_policy_configs
from tests.reference.conftest import make_resolved, make_workload

POPULATION_LANES, POPULATION_LANE_BLOCK = 16, 8


# The latency-fitting sample's physics coefficients (configs/latency/sample-config.yaml), but
# a base queueing delay of 30 ms (150 µs there): longer than the gaps between the tests'
# arrivals (test_stretches: routing decisions then read KV use while an earlier arrival's
# instance is mid-stretch with its steps up to that arrival applied)
PHYSICS = LatencyConfig(
    model="physics", preemption_ema_gamma=0.3,
    alpha_coeffs=(300.0, 200.0, 500000.0, 30000.0, 20000.0, 1000.0, 100.0, 40.0, 3000.0, 0.0,
                  400.0),
    beta_coeffs=(1600000.0, 2000000.0, 1100000.0, 3000000.0, 1500000.0, 400.0, 150.0, 0.0, 0.0,
                 200.0, 300.0, 2000.0, 0.0, 0.0, 250.0, 800.0))


#: Memory mappings a compiled program keeps, about: most of the tests' programs, and a large
#: one — a CPU tier, or lifecycles beside P/D pools or sessions (measured: docs/performance.md,
#: Test tiers).
PROGRAM_MAPPINGS, LARGE_PROGRAM_MAPPINGS = 3_000, 8_000


def room_for_a_program(mappings: int = PROGRAM_MAPPINGS) -> None:
    """Drop this process's compiled programs now if compiling one more (``mappings`` memory
    mappings) could take it past the mapping guard's threshold (``run.mapping_headroom_guard``,
    run before every engine run and after every test: half of ``vm.max_map_count``, 65,530 by
    default). The tests sharing the program compiled next then find it in memory, instead of
    the guard dropping it between them and the next test compiling it again."""
    run.mapping_headroom_guard(fraction=0.5 - mappings / 65_530)


def _shorter_prompts_longer_outputs(rows: list[dict]) -> list[dict]:
    """The second workload: the same requests with about half the prompt (never below the
    shared prefix), two more output tokens and no deadline but one."""
    other = [dict(r, input=max(r["input"] // 2 + 3, r.get("prefix", 0)), output=r["output"] + 2,
                  deadline=0) for r in rows]
    other[4] = dict(other[4], deadline=7_000)
    return other


def edge_engine(instances: int):
    """The edge scenario's engine (``edge_population``): blocks of 4 tokens, 40 per instance,
    4 running requests, a 64-token budget chunking prefills past 32 tokens, a 150 ms horizon,
    snapshots every 1.5 ms, a 3 ms old cache copy, α delays, admission and routing latencies."""
    return make_resolved(instances=instances, block_size=4, kv_blocks=40, max_running=4,
                         max_tokens=64, threshold=32, horizon_us=150_000, refresh_us=1500,
                         alpha=(80.25, 0.75, 12.5), cache_delay_us=3000,
                         admission_latency_us=300, routing_latency_us=700)


def edge_rows_twice() -> list[dict]:
    """The edge-case rows, then the same rows 9.5 ms later (22 requests)."""
    later = [dict(r, arrival=r["arrival"] + 9500,
                  deadline=r["deadline"] + 9500 if r.get("deadline") else 0) for r in EDGE_ROWS]
    return EDGE_ROWS + later


@pytest.fixture(scope="session")
def edge_population():
    """base: 2 instances of 40 blocks of 4 tokens, 4 running requests, a 64-token budget with
    chunked prefill past 32 tokens, a 150 ms horizon, snapshots refreshed every 1.5 ms, the
    cache scorers reading a copy of the instances' caches 3 ms old (the live query is covered
    by tests/test_golden_next.py), α delays, and cluster latencies: admission 300 µs after
    arrival, routing 700 µs after admission (other arrivals and steps interleave; an admission
    is never fused with its routing). workloads: the edge-case rows twice, 9.5 ms apart (22
    requests), and ``_shorter_prompts_longer_outputs`` of them. lanes[w][k]: policy k on
    workload w. evaluated: ``evaluate_population`` of a routing × admission grid on
    workload 0, with a fitness configured."""
    room_for_a_program()
    base = edge_engine(instances=2)
    rows = edge_rows_twice()
    workloads = tuple(make_workload(r, ("a", "b"), ("g",))
                      for r in (rows, _shorter_prompts_longer_outputs(rows)))
    configs = _random_policy_configs(base.config, workloads[0].tenant_names, POPULATION_LANES,
                                     seed=4)
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    # The random policies list the cache scorers, so their program has the cache query
    # (``static_lanes.for_lanes``); the grid's do not: compiled in for all, one program serves both.
    static = build_static_shared(base, list(workloads),
                                 decode_stretches=True).replace(cache_scorers=True)
    lanes = tuple(simulate_population(base, w, params, static=static,
                                      lane_block=POPULATION_LANE_BLOCK) for w in workloads)
    metrics = dataclasses.replace(base.config.metrics, fitness_weights=(("p99_ttft", 1.0),))
    fitness_base = resolve_config(dataclasses.replace(base.config, metrics=metrics))
    knobs = grid(**{"routing.policy": ["round-robin", "least-loaded", "always-busiest",
                                       "weighted"],
                    "admission.policy": ["always-admit", "tenant-quota", "token-bucket",
                                         "rate-limit"]})
    evaluated = evaluate_population(fitness_base, workloads[0], knobs, static=static,
                                    lane_block=POPULATION_LANE_BLOCK)
    return SimpleNamespace(base=base, workloads=workloads, configs=configs, static=static,
                           lane_block=POPULATION_LANE_BLOCK, lanes=lanes, knobs=knobs,
                           evaluated=evaluated)
