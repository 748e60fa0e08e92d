"""A CPU tier with instance lifecycles and autoscaling (docs/semantics.md §3.8, Decision 16):
every lane of a JAX population equals its own reference run, request by request, with the
tier's and the lifecycle's counters.

All examples share one compiled program: two initial instances, up to four slots, a 24-block
GPU cache that cannot hold the three 96-token prefixes beside the requests' own blocks, so
prefixes are evicted from the GPU and reloaded from the tier. Lanes differ in their tier (none,
a thrashing one, larger ones), autoscaler and lifecycle. A new instance in a reused slot starts
with an empty tier (``Instance.restart``), and a request redirected from a draining instance
finds none of its blocks in the old instance's tier.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blisjax.config import AutoscalerConfig, resolve_config
from blisjax.engine import params_from_config, run, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.run import TIERED_LANE_BLOCK
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, room_for_a_program
from tests.engine.test_parity_lifecycle import BASE_AUTOSCALER, MAX_OUTPUT, autoscalers, lifecycles
from tests.reference.conftest import make_resolved, make_workload

REQUESTS, PREFIX, MAX_EXTRA = 24, 96, 40
GROUPS = ("g0", "g1", "g2")
CPU_BLOCKS = (0, 6, 24, 200)  # per lane


def _base(quirks: bool):
    resolved = make_resolved(quirks=quirks, instances=2, block_size=16, kv_blocks=24,
                             max_running=3, max_tokens=128, cpu_blocks=max(CPU_BLOCKS))
    cfg = resolved.config
    return resolve_config(dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, autoscaler=BASE_AUTOSCALER)))


def _envelope():
    return make_workload([dict(arrival=0, input=PREFIX + MAX_EXTRA, output=MAX_OUTPUT,
                               group=k % 3, prefix=PREFIX, deadline=1 + k)
                          for k in range(REQUESTS)], groups=GROUPS)


@cache
def _static(quirks: bool):
    return build_static(_base(quirks), _envelope(), decode_stretches=True)


@st.composite
def workloads(draw):
    """Bursts separated by quiet spells (instances scale up and down), most requests sharing
    one of three prefixes."""
    rows, t = [], 0
    for _ in range(REQUESTS):
        t += draw(st.sampled_from([0, 0, 500, 2_000, 30_000, 120_000]))
        group = draw(st.sampled_from([-1, 0, 1, 2]))
        pre = PREFIX if group >= 0 else 0
        rows.append(dict(arrival=t, input=pre + draw(st.integers(1, MAX_EXTRA)), group=group,
                         prefix=pre, output=draw(st.integers(1, MAX_OUTPUT)),
                         deadline=draw(st.one_of(st.just(0), st.integers(t + 1, t + 80_000)))))
    return make_workload(rows, groups=GROUPS)


def _lane(base, cpu_blocks: int, autoscaler, life=None):
    cfg = base.config
    return dataclasses.replace(
        cfg, engine=dataclasses.replace(cfg.engine, kv_cpu_blocks=cpu_blocks),
        policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler),
        cluster=dataclasses.replace(cfg.cluster, lifecycle=life or cfg.cluster.lifecycle))


def _compare(quirks: bool, workload, configs):
    """Each lane against its reference run; returns the reference runs."""
    base = _base(quirks)
    static = _static(quirks)
    assert static.features.lifecycle and static.tiered
    assert build_static_shared(base, [_envelope(), workload], decode_stretches=True) == static
    params = stack_params([params_from_config(c, ("",)) for c in configs])
    # blocks of two lanes whatever the lanes' tiers: one program for every test of the module
    results = simulate_population(base, workload, params, static=static,
                                  lane_block=TIERED_LANE_BLOCK)
    refs = []
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), workload)
        refs.append(want)
        if want.overflow:  # --blis-quirks ran out of fresh slots: both engines say so
            assert results[k].overflow == want.overflow, k
            continue
        assert first_divergence(want, results[k]) is None, (
            k, first_divergence(want, results[k]), cfg.policy.autoscaler, cfg.cluster.lifecycle)
    return refs


def _reused_slot_case():
    """Three bursts of the same prefixes; the threshold autoscaler drains an instance after
    the first (its tier holds seven blocks then) and places a new one in its slot for the
    next. Lanes: tiers of 200 and 24 blocks, draining by waiting or redirecting, no tier."""
    rows = [dict(arrival=burst * 400_000 + k * 300, input=PREFIX + 10 + 3 * k, output=20 + k,
                 group=(k + burst) % 3, prefix=PREFIX) for burst in range(3) for k in range(8)]
    workload = make_workload(rows, groups=GROUPS)
    base = _base(False)

    def scaler(drain):
        return AutoscalerConfig(
            policy="threshold", max_replicas=3, min_replicas=1, interval_us=50_000,
            scale_up_utilization=0.3, scale_down_utilization=0.05, drain_policy=drain,
            max_scale_up_step=2, max_scale_down_step=2)

    configs = [_lane(base, 200, scaler("wait")), _lane(base, 24, scaler("wait")),
               _lane(base, 200, scaler("redirect")), _lane(base, 0, scaler("wait"))]
    return workload, configs


def test_a_reused_slot_starts_with_an_empty_tier():
    """The new instance in the drained one's slot reloads from its own tier only."""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)  # the drawn autoscalers below run the same program
    refs = _compare(False, *_reused_slot_case())
    reused = refs[0].lifecycle.placements[0]
    assert reused == 2 and refs[0].kv_tier.reloads[0] > 0, (reused, refs[0].kv_tier)
    assert refs[3].kv_tier is None
    assert int(np.sum(refs[1].kv_tier.reloads)) > 0


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(quirks: bool, data) -> None:
    base = _base(quirks)
    workload = data.draw(workloads(), label="workload")
    top = _static(quirks).shapes.num_instances
    configs = [_lane(base, CPU_BLOCKS[k], data.draw(autoscalers(top), label=f"autoscaler {k}"),
                     data.draw(lifecycles(), label=f"lifecycle {k}"))
               for k in range(len(CPU_BLOCKS))]
    _compare(quirks, workload, configs)


@settings(max_examples=4, **_SETTINGS)
@given(data=st.data())
def test_drawn_autoscalers_with_tiers_match_reference(data):
    _check(False, data)


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
@settings(max_examples=40, **_SETTINGS)
@given(data=st.data())
def test_drawn_autoscalers_with_tiers_match_reference_slow(quirks, data):
    _check(quirks, data)


def test_the_long_run_program_matches_the_reference_too(monkeypatch):
    """Runs this small are compiled as short runs (``run.short_run``: without XLA's
    loop-invariant code motion and loop simplifier); the same case compiled as a long run,
    with XLA's default passes, gives every lane its reference run as well. (Last in the
    module: it drops the compiled programs first, and the tests above share theirs.)"""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)
    monkeypatch.setattr(run, "SHORT_RUN_REQUEST_LANES", 0)
    before = run._run_sharded._long._cache_size()
    _compare(False, *_reused_slot_case())
    assert run._run_sharded._long._cache_size() == before + 1
