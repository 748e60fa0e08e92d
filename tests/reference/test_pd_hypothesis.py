"""Prefill/decode disaggregation under drawn workloads and pools (reference engine): every event
keeps the engine's invariants (KV conservation, batch limits, bounded event queues), and the
requests' outcomes add up to BLIS's counts (docs/semantics.md §5.10).

Pools, deciders, chunking, small KV caches (preemptions and failed decode-side reservations),
deadlines, shared instances and transfer contention are drawn, with and without
``--blis-quirks``. The checks are consequences of the model, not values from it: every
disaggregated request prefilled on a prefill-pool instance and is handled by a decode-pool one;
a completed one's TTFT is at least its transfer's end minus its arrival plus one decode step
(by default also at least its prefill step's end); the transfers that ended are the
disaggregated count; ``injected_requests`` covers every request once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import PDConfig, RoutingConfig, ScorerWeight, resolve_config
from blisjax.metrics import aggregate_metrics
from blisjax.metrics.records import COMPLETED, DROPPED
from blisjax.reference import ClusterSimulator
from blisjax.reference.pd import Role
from tests.reference.conftest import make_resolved, make_workload

STEP_MIN_US = 1000  # the shortest step of conftest's blackbox model (β0)
# Decode sub-requests waiting with reserved KV can fill a decode instance so that nothing runs
# (as in BLIS): the instance then steps empty until the horizon, which bounds every run.
HORIZON_US = 2_000_000


@st.composite
def cases(draw):
    instances = draw(st.integers(2, 4))
    shared = draw(st.integers(0, instances - 1))
    if shared and draw(st.booleans()):
        prefill = decode = 0
    else:
        prefill = draw(st.integers(1, instances - shared - 1)) if instances - shared >= 2 else 0
        decode = draw(st.integers(1, instances - shared - prefill)) if prefill else 0
    if prefill + decode + shared == 0:
        shared = 1
    decider = "never" if prefill == 0 else draw(st.sampled_from(
        ["never", "always", "prefix-threshold"]))
    scorers = st.lists(st.tuples(st.sampled_from(["queue-depth", "kv-utilization",
                                                  "load-balance", "precise-prefix-cache"]),
                                 st.integers(1, 3)), max_size=2, unique_by=lambda x: x[0])
    pd = PDConfig(prefill_instances=prefill, decode_instances=decode, shared_instances=shared,
                  decider=decider, prefix_threshold_tokens=draw(st.integers(0, 64)),
                  transfer_bandwidth_gbps=draw(st.sampled_from([0.5, 5.0, 50.0])),
                  transfer_base_latency_ms=draw(st.sampled_from([0.0, 0.1, 2.0])),
                  transfer_contention=draw(st.booleans()),
                  prefill_scorers=tuple(ScorerWeight(n, w) for n, w in draw(scorers)),
                  decode_scorers=tuple(ScorerWeight(n, w) for n, w in draw(scorers)))
    rows, t = [], 0
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.integers(0, 3000))
        group = draw(st.sampled_from([-1, 0, 1]))
        pre = 32 if group >= 0 else 0
        rows.append(dict(arrival=t, input=pre + draw(st.integers(1, 80)),
                         output=draw(st.integers(0, 12)), group=group, prefix=pre,
                         deadline=draw(st.one_of(st.just(0), st.integers(t + 1, t + 40_000)))))
    engine = dict(instances=instances, block_size=16, kv_blocks=draw(st.integers(8, 24)),
                  horizon_us=HORIZON_US,
                  max_running=draw(st.integers(1, 4)), max_tokens=draw(st.sampled_from([32, 64,
                                                                                        2048])),
                  quirks=draw(st.booleans()),
                  routing=RoutingConfig(policy=draw(st.sampled_from(
                      ["round-robin", "least-loaded", "weighted"]))))
    return pd, rows, engine


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_drawn_pools_keep_the_invariants(case):
    _check(*case)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_drawn_pools_keep_the_invariants_slow(case):
    _check(*case)


def _check(pd: PDConfig, rows: list[dict], engine: dict) -> None:
    base = make_resolved(**engine)
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(base.config.cluster, pd=pd))
    w = make_workload(rows, groups=("g0", "g1"))
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    m = aggregate_metrics(result, w)
    roles = result.pd.role
    parents = result.pd.prefill_instance >= 0
    n = len(rows)
    assert m["injected_requests"] == n  # every request ends in exactly one count
    for r in range(n):
        inst = int(result.instance[r])
        if inst >= 0:
            assert roles[inst] & Role.DECODE, (r, inst, roles)
        if parents[r]:
            assert roles[result.pd.prefill_instance[r]] & Role.PREFILL
    start, end = result.pd.transfer_start_us, result.pd.transfer_end_us
    assert m["pd_disaggregated_requests"] == int(np.sum(end >= 0))
    assert np.all(end[end >= 0] > start[end >= 0])
    arrival = np.asarray(w.arrival_us)
    # served: BLIS's completed-looking rows (``--blis-quirks``: drops and decode timeouts)
    # have no inter-token gaps
    done = parents & (result.status == COMPLETED) & (end >= 0) & (result.itl_count > 0)
    if not engine["quirks"]:
        assert np.array_equal(done, parents & (result.status == COMPLETED))
    assert np.all(result.ttft_us[done] >= end[done] - arrival[done] + STEP_MIN_US)
    if not engine["quirks"]:  # a transfer starts after its prefill's step, which takes > 1 ms
        started = parents & (start >= 0)
        assert np.all(start[started] - arrival[started] >= 1000)
        assert not np.any(parents & (result.status == COMPLETED) & (end < 0))
    drops = result.pd.dropped_at_decode_kv
    assert int(np.sum(parents & (start >= 0) & (end < 0))) >= drops
    if drops and not engine["quirks"]:
        assert int(np.sum(parents & (result.status == DROPPED))) >= drops
    if pd.decider == "never":
        assert not parents.any()
