"""Parity on workloads and policies drawn by ``hypothesis``: every lane of a population equals its
own reference run, request by request.

Each test fixes an engine configuration and a request count, so all of its examples share one
compiled program: the capacities come from an *envelope* workload that bounds every drawn one
(all requests at once, longest prompts and outputs, both prefix groups, every deadline inside
the horizon), and each example checks that its workload needs no more (``static ==``), so a
strategy that outgrew the envelope fails loudly instead of recompiling. Hypothesis draws the
workload (arrival gaps with simultaneous arrivals, prompt and output lengths, prefix groups and
their lengths, tenants, SLO classes, deadlines) and one policy per lane (admission with its
bucket sizes and rates or quotas, priority, routing with a subset of the weighted scorers and
either tie-break rule, scheduler, preemption order, and the settings that are per-lane knobs:
running requests, token budget, long-prefill threshold, admission and routing latency,
snapshot refresh interval). The default tier runs a few examples of one engine; the slow tier
(``-m slow``) runs 3 engines × 100 examples × 4 lanes = 1,200 cases.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import (
    AdmissionConfig,
    PriorityConfig,
    RoutingConfig,
    ScorerWeight,
    resolve_config,
)
from blisjax.config.codes import Scorer, TieBreak
from blisjax.config.fields import KNOB_MAGNITUDE
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload

REQUESTS, LANES = 12, 4
MAX_PREFIX, MAX_EXTRA, MAX_OUTPUT = 40, 120, 30
HORIZON_US = 2_000_000  # priority preemption with stale priorities can thrash: bound every run
TENANTS, GROUPS = ("a", "b"), ("g0", "g1")
SCORERS = Scorer.labels()

ENGINES = {
    "small-blocks": dict(instances=2, block_size=4, kv_blocks=48, max_running=4, max_tokens=64,
                         threshold=20, refresh_us=3000, alpha=(95.5, 1.25, 21.7)),
    "one-instance-tight": dict(instances=1, block_size=4, kv_blocks=30, max_running=3,
                               max_tokens=24, admission_latency_us=250),
    "three-instances": dict(instances=3, block_size=16, kv_blocks=40, max_running=8,
                            max_tokens=512, routing_latency_us=400, refresh_us=0,
                            beta=(5752.705191348184, 17.25, 5.999143920128404)),
}


def _envelope():
    rows = [dict(arrival=0, input=MAX_PREFIX + MAX_EXTRA, output=MAX_OUTPUT, group=k % 2,
                 prefix=MAX_PREFIX, tenant=TENANTS[k % 2], deadline=1 + k)
            for k in range(REQUESTS)]
    return make_workload(rows, TENANTS, GROUPS)


@st.composite
def workloads(draw):
    prefix = [draw(st.integers(1, MAX_PREFIX)) for _ in GROUPS]  # one length per group
    rows, t = [], 0
    for _ in range(REQUESTS):
        t += draw(st.one_of(st.just(0), st.integers(1, 4000)))
        group = draw(st.sampled_from([-1, 0, 1]))
        pre = prefix[group] if group >= 0 else 0
        rows.append(dict(
            arrival=t, input=pre + draw(st.integers(1, MAX_EXTRA)),
            output=draw(st.integers(0, MAX_OUTPUT)), group=group, prefix=pre,
            tenant=draw(st.sampled_from(TENANTS)), slo=draw(st.sampled_from(["", "critical",
                                                                           "batch"])),
            deadline=draw(st.one_of(st.just(0), st.integers(t + 500, t + 60_000)))))
    return make_workload(rows, TENANTS, GROUPS)


def knobs(low: float, high: float):
    """Policy floats in [low, high]: 0, the smallest allowed magnitude, or anything between
    (magnitudes below ``KNOB_MAGNITUDE`` are refused by the configuration; the engine flushes
    subnormal floats to zero)."""
    tiny = KNOB_MAGNITUDE[0]
    edges = [x for x in (tiny, -tiny) if low <= x <= high]
    values = st.floats(low, high).map(lambda x: 0.0 if abs(x) < tiny else x)
    return st.one_of(values, st.sampled_from(edges)) if edges else values


@st.composite
def policies(draw, base):
    """One ``SimConfig``: ``base`` with a drawn policy and preemption order."""
    admission = AdmissionConfig(
        policy=draw(st.sampled_from(["always-admit", "token-bucket", "rate-limit",
                                     "tenant-quota", "reject-all"])),
        token_bucket_capacity=draw(knobs(50, 3000)),
        token_bucket_refill_rate=draw(knobs(1e3, 1e5)),
        rate_limit_rps=draw(knobs(50, 2000)), rate_limit_burst=draw(knobs(1, 6)),
        tenant_max_in_flight=((TENANTS[0], draw(st.integers(1, 4))),),
        default_tenant_max_in_flight=draw(st.integers(1, 6)))
    priority = PriorityConfig(
        policy=draw(st.sampled_from(["constant", "slo-based", "slo-class", "tenant-priority",
                                     "deadline-aware"])),
        age_weight=draw(knobs(-3, 3)),
        tenant_scores=((TENANTS[1], draw(knobs(-2, 2))),))
    names = draw(st.lists(st.sampled_from(SCORERS), min_size=1, max_size=4, unique=True))
    routing = RoutingConfig(
        policy=draw(st.sampled_from(["round-robin", "least-loaded", "always-busiest",
                                     "weighted"])),
        scorers=tuple(ScorerWeight(n, draw(knobs(0, 3) if k else knobs(KNOB_MAGNITUDE[0], 3)))
                      for k, n in enumerate(names)),  # not all 0
        tie_break=draw(st.sampled_from(TieBreak.labels())))
    scheduler = base.policy.scheduler.__class__(
        policy=draw(st.sampled_from(["fcfs", "priority-fcfs", "sjf"])))
    policy = dataclasses.replace(base.policy, admission=admission, priority=priority,
                                 routing=routing, scheduler=scheduler)
    engine = dataclasses.replace(base.engine, preemption_policy=draw(
        st.sampled_from(["fcfs", "priority"])))
    return dataclasses.replace(base, policy=policy, engine=engine)


@st.composite
def lane_settings(draw, cfg):
    """``cfg`` with the settings that are per-lane knobs drawn: running requests and a token
    budget up to its own, a long-prefill threshold, admission and routing latencies, a
    snapshot refresh interval and a GPU cache of up to its own KV blocks."""
    budget = draw(st.integers(8, cfg.engine.max_num_scheduled_tokens))
    blocks = cfg.engine.total_kv_blocks
    engine = dataclasses.replace(
        cfg.engine, max_num_scheduled_tokens=budget,
        total_kv_blocks=draw(st.sampled_from([blocks, blocks, max(blocks // 2, 1)])),
        max_num_running_reqs=draw(st.integers(1, cfg.engine.max_num_running_reqs)),
        long_prefill_token_threshold=draw(st.integers(0, budget)))
    cluster = dataclasses.replace(
        cfg.cluster, admission_latency_us=draw(st.integers(0, 3000)),
        routing_latency_us=draw(st.integers(0, 3000)),
        snapshot_refresh_interval_us=draw(st.integers(0, 6000)))
    return dataclasses.replace(cfg, engine=engine, cluster=cluster)


def _check(engine: dict, data) -> None:
    base = make_resolved(horizon_us=HORIZON_US, **engine)
    # one program for all examples, the cache query and the lanes' own settings compiled in
    # whatever the lanes draw
    static = build_static(base, _envelope(), decode_stretches=True).replace(
        cache_scorers=True, lane_settings=True)
    w = data.draw(workloads(), label="workload")
    assert build_static_shared(base, [_envelope(), w], decode_stretches=True).replace(
        cache_scorers=True, lane_settings=True) == static
    configs = [data.draw(policies(base.config).flatmap(lane_settings), label=f"lane {k}")
               for k in range(LANES)]
    params = stack_params([params_from_config(c, TENANTS) for c in configs])
    lanes = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, lanes[k]) is None, (k, cfg.policy, cfg.engine)


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=8, **_SETTINGS)
@given(data=st.data())
def test_drawn_workloads_and_policies_match_reference(data):
    _check(ENGINES["small-blocks"], data)


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
@settings(max_examples=100, **_SETTINGS)
@given(data=st.data())
def test_drawn_workloads_and_policies_match_reference_slow(engine, data):
    _check(ENGINES[engine], data)
