"""Instance variants of their own speed: an instance placed on a node pool of a GPU the
hardware table knows runs at that GPU's speed (``rules.speed_gpu``; docs/semantics.md
Decision 16), in both engines alike.

Roofline latency for llama-3.1-8b; one 512-token prompt is one prefill step of 44,636 µs on
an A100-80 and 11,884 µs on the H100 (BLIS's values, shared notes roofline.md §5–§6).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import (
    AutoscalerConfig,
    DelaySpec,
    LatencyConfig,
    NodePool,
    resolve_config,
)
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.reference import ClusterSimulator
from blisjax.reference import simulate as reference
from tests.engine.conftest import PHYSICS
from tests.reference.conftest import make_resolved, make_workload

H100 = NodePool(name="h", gpu_type="H100", gpus_per_node=1, initial_nodes=1, max_nodes=2,
                provisioning_delay=DelaySpec(0.004), cost_per_hour=3.0)
A100 = NodePool(name="a", gpu_type="A100-80", gpus_per_node=1, initial_nodes=0, max_nodes=2,
                provisioning_delay=DelaySpec(0.002), cost_per_hour=1.0)


def _config(pools, *, quirks=False, autoscaler=None, instances=1):
    cfg = make_resolved(instances=instances, quirks=quirks, kv_blocks=400, max_running=4,
                        max_tokens=1024).config
    return dataclasses.replace(
        cfg, latency=LatencyConfig(model="roofline"),
        cluster=dataclasses.replace(cfg.cluster, node_pools=pools),
        policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler or AutoscalerConfig()))


@pytest.mark.parametrize("quirks, step_us", [(False, 44636), (True, 11884)])
def test_an_instance_on_an_a100_node_runs_at_its_speed(quirks, step_us):
    """The instance's one step; BLIS keeps the configuration's GPU (--blis-quirks)."""
    pool = dataclasses.replace(A100, initial_nodes=1)
    w = make_workload([dict(arrival=0, input=512, output=1)])
    result = ClusterSimulator(resolve_config(_config((pool,), quirks=quirks)), w).run()
    assert result.busy_time_us[0] == step_us


def _bursts():
    rows = [dict(arrival=(k // 4) * 40_000 + 50 * (k % 4), input=200 + 40 * (k % 5),
                 output=30 + 5 * (k % 3)) for k in range(16)]
    return make_workload(rows)


def test_scaled_up_a100_instances_match_reference():
    """Scale-ups onto the cheaper A100-80 pool: each lane of one program equals its own
    reference run; the A100 instances run at their own speed (the H100 rows alone give
    other times)."""
    scaler = AutoscalerConfig(policy="threshold", interval_us=5_000, max_replicas=0,
                              scale_up_utilization=0.05, scale_down_utilization=0.0,
                              cooldown_us=0)
    lanes = [_config((H100, A100), autoscaler=scaler),
             _config((H100, A100), autoscaler=dataclasses.replace(
                 scaler, drain_policy="immediate", scale_down_utilization=0.02))]
    base = resolve_config(lanes[0])
    w = _bursts()
    static = build_static(base, w)
    assert static.features.variant_speed and static.settings.gpus == ("H100", "A100-80")
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(lanes):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
    life = results[0].lifecycle
    assert life.scale_ups > 0 and int(np.sum(np.asarray(life.placements)[1:])) > 0
    # the same pool under a label the hardware table does not know runs at the H100's speed
    label = dataclasses.replace(A100, gpu_type="A100")
    other = reference(resolve_config(_config((H100, label), autoscaler=scaler)), w)
    assert not np.array_equal(other.e2e_us, results[0].e2e_us)


def test_physics_variants_of_another_speed_match_reference():
    """Physics latency (fitted coefficients): the A100 instances step and delay arrivals with
    the A100-80's physics constants, in both engines alike; the H100's alone give other
    times."""
    scaler = AutoscalerConfig(policy="threshold", interval_us=5_000, max_replicas=0,
                              scale_up_utilization=0.05, scale_down_utilization=0.0,
                              cooldown_us=0)
    cfg = dataclasses.replace(_config((H100, A100), autoscaler=scaler), latency=PHYSICS)
    base = resolve_config(cfg)
    w = _bursts()
    static = build_static(base, w)
    assert static.features.variant_speed and static.settings.gpus == ("H100", "A100-80")
    results = simulate_population(base, w, stack_params([params_from_config(cfg, ("",))]),
                                  static=static)
    want = reference(base, w)
    assert first_divergence(want, results[0]) is None
    assert int(np.sum(np.asarray(results[0].lifecycle.placements)[1:])) > 0
    label = dataclasses.replace(A100, gpu_type="A100")
    other = reference(resolve_config(dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, node_pools=(H100, label)))), w)
    assert not np.array_equal(other.e2e_us, want.e2e_us)
