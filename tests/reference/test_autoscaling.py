"""Instance lifecycle and autoscaling in the reference engine, on timelines computed by hand
(docs/semantics.md Decision 16, docs/autoscaling.md).

Every step takes 10 ms (blackbox β = (10000, 0, 0), α = 0: no queueing delay, output-token
processing or post-decode overhead). A request with 100 output tokens admitted at t runs 100
steps: its first token at t + 10 ms, then 99 more, so it leaves at t + 1 s and its last step
starts at t + 990 ms. KV: 1,000 blocks of 16 tokens per instance, so a 32-token prompt with k
tokens decoded holds ceil((32 + k) / 16) blocks and KV utilization stays small.
"""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import (
    AutoscalerConfig,
    ConfigError,
    DelaySpec,
    LifecycleConfig,
    NodePool,
    resolve_config,
)
from blisjax.config.codes import InstanceState
from blisjax.metrics import aggregate_metrics, per_request_rows, replica_timeline
from blisjax.metrics.records import COMPLETED, DROPPED, REJECTED
from blisjax.reference import ClusterSimulator
from blisjax.reference.autoscaler import (
    Reading,
    Variant,
    queue_depth_delta,
    saturation_decision,
    target_utilization_delta,
    threshold_delta,
)
from tests.reference.conftest import make_resolved, make_workload

STEP_US = 10_000
FLAT = dict(beta=(float(STEP_US), 0.0, 0.0), kv_blocks=1000)
BURST = [dict(arrival=100_000, input=32, output=100) for _ in range(4)]


def _run(rows, *, autoscaler: AutoscalerConfig, lifecycle=None, pools=(), instances=1,
         quirks=False, **engine):
    base = make_resolved(instances=instances, quirks=quirks, **{**FLAT, **engine})
    cfg = base.config
    cfg = dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler),
        cluster=dataclasses.replace(cfg.cluster, lifecycle=lifecycle or LifecycleConfig(),
                                    node_pools=tuple(pools)))
    w = make_workload(rows)
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    return result, aggregate_metrics(result, w), per_request_rows(result, w)


def _changes(result) -> list[tuple[int, int, str]]:
    return [(x["time_us"], x["instance"], x["state"]) for x in replica_timeline(result)]


def _reading(used, total=(1000,), queue=None, batch=None, pending=0, live=None) -> Reading:
    n = len(used)
    return Reading(list(used), list(total) * n if len(total) == 1 else list(total),
                   list(queue or [0] * n), list(batch or [0] * n), [0] * n, pending,
                   n if live is None else live)


# ---- the seed templates' formulas ---------------------------------------------------------

def test_threshold_steps_one_replica_on_the_mean_kv_utilization():
    assert threshold_delta(_reading([900, 800]), up=0.8, down=0.3) == 1  # mean 0.85
    assert threshold_delta(_reading([800, 800]), up=0.8, down=0.3) == 0  # not above 0.8
    assert threshold_delta(_reading([100, 400]), up=0.8, down=0.3) == -1  # mean 0.25
    assert threshold_delta(_reading([]), up=0.8, down=0.3) == -1  # none routable: mean 0


def test_target_utilization_is_the_hpa_rule():
    # mean 0.9, target 0.6: ceil(3 · 0.9 / 0.6) = ceil(4.5) = 5 replicas, 2 more than 3 live
    assert target_utilization_delta(_reading([900, 900, 900]), 0.6, 0.1) == 2
    # mean 0.3: ceil(4 · 0.3 / 0.6) = 2 of 4 live (the one loading counts)
    assert target_utilization_delta(_reading([300, 300, 300], live=4), 0.6, 0.1) == -2
    # within the tolerance: |0.65 / 0.6 - 1| = 0.083 <= 0.1
    assert target_utilization_delta(_reading([650, 650]), 0.6, 0.1) == 0
    assert target_utilization_delta(_reading([]), 0.6, 0.1) == 0


def test_queue_depth_sizes_for_requests_per_replica():
    # 7 + 3 + 6 + 4 = 20 requests queued or running, 4 per replica: 5 replicas of 2
    assert queue_depth_delta(_reading([0, 0], queue=[7, 6], batch=[3, 4]), 4.0) == 3
    assert queue_depth_delta(_reading([0, 0], queue=[0, 0], batch=[1, 0]), 4.0) == -1
    assert queue_depth_delta(_reading([]), 4.0) == 0


def test_saturation_decisions_by_hand():
    """BLIS's analyzer with the golden case's settings (threshold 0.75, up 0.85, boundary
    0.35, 1024 average input tokens, 3,500 blocks of 16 tokens: supply 42,000 tokens per
    replica)."""
    v = [Variant(12.0, "H100", 1)]
    args = (v, 16, 0.75, 0.85, 0.35, 1024.0)
    idle = Reading([0, 0], [3500, 3500], [0, 0], [0, 0], [0, 0], 0, 2)
    # spare = 84,000 − 0 > 0 and 84,000 − 42,000 > 0: remove floor(84,000 / 42,000) = 2
    assert saturation_decision(idle, *args) == (-2, 0)
    # demand 3,000·16 + 20·1024 = 68,480 per replica: 161,129.4 / 0.85 − 84,000 > 0 needs
    # ceil(77,129.4 / 42,000) = 2 more
    busy = Reading([3000, 3000], [3500, 3500], [20, 20], [0, 0], [0, 0], 0, 2)
    assert saturation_decision(busy, *args).delta == 2
    # the same demand with one replica's capacity loading: required 35,129.4 → 1 more
    assert saturation_decision(busy._replace(pending_kv_tokens=56_000), *args).delta == 1
    # one replica never scales down
    assert saturation_decision(Reading([0], [3500], [0], [0], [0], 0, 1), *args).delta == 0


# ---- timelines ----------------------------------------------------------------------------

def test_scale_up_lands_after_the_burst():
    """Threshold policy, one instance, ticks every 0.5 s. The 4-request burst at 0.1 s lifts
    KV utilization to 0.02 by the 0.5 s tick (> 0.01): the decision is actuated 0.25 s later
    and the new instance loads for 1 s, so it is Active at 1.75 s, after the burst left at
    1.1 s. Ticks stop at 1.5 s (nothing left to do), the run ends with the load at 1.75 s:
    replica-seconds 1.75 + 1.0."""
    auto = AutoscalerConfig(policy="threshold", interval_us=500_000, max_replicas=2,
                            scale_up_utilization=0.01, scale_down_utilization=0.0,
                            cooldown_us=10_000_000, actuation_delay=DelaySpec(0.25))
    life = LifecycleConfig(loading_delay=DelaySpec(1.0), cost_per_hour=2.0)
    result, metrics, rows = _run(BURST, autoscaler=auto, lifecycle=life)
    assert [(r["instance"], r["ttft_us"], r["e2e_us"]) for r in rows] == [(0, 10_000, 1_000_000)] * 4
    assert _changes(result) == [(0, 0, "active"), (750_000, 1, "loading"),
                                (1_750_000, 1, "active")]
    a = metrics["autoscaling"]
    assert (a["scale_ups"], a["instances_added"], a["scale_downs"]) == (1, 1, 0)
    assert a["end_s"] == 1.75 and a["replica_seconds"] == 2.75
    assert a["mean_replicas"] == 2.75 / 1.75 and a["peak_replicas"] == 2
    assert a["cost"] == pytest.approx(2.75 / 3600 * 2.0, rel=1e-15)


def _drain_scenario(policy: str, quirks: bool = False):
    """Two instances, one request at a time each (max_running 1), round-robin: r0, r2 on
    instance 0, r1, r3 on instance 1, each 50 output tokens (0.5 s). Threshold's scale-down
    (utilization below 0.5, always) passes at the 0 s tick; 0.25 s later it drains the oldest
    Active instance, instance 0 (both placed at 0), running r0 with r2 queued."""
    auto = AutoscalerConfig(policy="threshold", interval_us=200_000, max_replicas=2,
                            scale_up_utilization=1.0, scale_down_utilization=0.5,
                            actuation_delay=DelaySpec(0.25), drain_policy=policy)
    rows = [dict(arrival=100_000, input=16, output=50) for _ in range(4)]
    return _run(rows, autoscaler=auto, instances=2, max_running=1, quirks=quirks)


@pytest.mark.parametrize("quirks", [False, True])
def test_drain_wait_serves_the_queue_then_terminates(quirks):
    """wait: r0 runs to 0.6 s, r2 from 0.6 s to 1.1 s; instance 0 terminates after the
    event that empties it, r2's last step at 1.09 s (BLIS's rule as well)."""
    result, metrics, rows = _drain_scenario("wait", quirks)
    assert [(r["instance"], r["e2e_us"]) for r in rows] == [
        (0, 500_000), (1, 500_000), (0, 1_000_000), (1, 1_000_000)]
    assert _changes(result)[2:] == [(250_000, 0, "draining"), (1_090_000, 0, "terminated")]
    assert metrics["autoscaling"]["scale_downs"] == 1


def test_drain_immediate_drops_everything_it_holds():
    result, metrics, rows = _drain_scenario("immediate")
    assert [r["status"] for r in rows] == ["dropped", "completed", "dropped", "completed"]
    assert _changes(result)[2:] == [(250_000, 0, "draining"), (250_000, 0, "terminated")]
    assert metrics["autoscaling"]["dropped_at_drain"] == 2
    assert result.status.tolist() == [DROPPED, COMPLETED, DROPPED, COMPLETED]


def test_drain_redirect_routes_the_queue_again():
    """redirect: r2 leaves instance 0's queue at 0.25 s for instance 1, where it queues
    behind r3 (arrived 0.1 s): r3 runs 0.6–1.1 s, r2 1.1–1.6 s (E2E 1.5 s from its arrival).
    r0 finishes on instance 0, which terminates after r0's last step (0.59 s)."""
    result, metrics, rows = _drain_scenario("redirect")
    assert [(r["instance"], r["e2e_us"]) for r in rows] == [
        (0, 500_000), (1, 500_000), (1, 1_500_000), (1, 1_000_000)]
    assert _changes(result)[2:] == [(250_000, 0, "draining"), (590_000, 0, "terminated")]
    assert metrics["autoscaling"]["redirected_requests"] == 1


def _oscillating(quirks: bool, max_replicas: int, pools=()):
    """Threshold with a 10 s cooldown over two idle instances: the 0 s tick drains instance 0
    (utilization 0 < 0.005; it terminates at once, idle); the burst at 0.1 s lands on
    instance 1, whose utilization 0.02 > 0.01 at the 0.5 s tick adds an instance: a scale
    against the previous one within the cooldown, one oscillation. Later signals are held by
    the cooldown."""
    auto = AutoscalerConfig(policy="threshold", interval_us=500_000, max_replicas=max_replicas,
                            scale_up_utilization=0.01, scale_down_utilization=0.005,
                            cooldown_us=10_000_000)
    return _run(BURST, autoscaler=auto, instances=2, quirks=quirks, pools=pools)


def test_oscillation_is_counted_and_the_slot_reused():
    result, metrics, rows = _oscillating(False, 2)
    a = metrics["autoscaling"]
    assert (a["scale_downs"], a["scale_ups"], a["scale_oscillations"]) == (1, 1, 1)
    # the new instance takes instance 0's slot, which has held two instances
    assert _changes(result) == [(0, 0, "active"), (0, 1, "active"), (0, 0, "draining"),
                                (0, 0, "terminated"), (500_000, 0, "loading"),
                                (500_000, 0, "active")]
    assert metrics["instances"]["0"]["placements"] == 2
    assert [r["instance"] for r in rows] == [1] * 4


def test_oscillation_under_quirks_appends_the_new_instance():
    """BLIS never reuses an instance: with --blis-quirks the new one takes slot 2 (on the
    node pool's third GPU). An idle drained instance never terminates in BLIS, so instance 0
    stays draining."""
    pool = NodePool(name="p", gpus_per_node=4, initial_nodes=1, max_nodes=1)
    result, metrics, _ = _oscillating(True, 3, [pool])
    assert _changes(result) == [(0, 0, "active"), (0, 1, "active"), (0, 0, "draining"),
                                (500_000, 2, "loading"), (500_000, 2, "active")]
    assert result.lifecycle.final_state.tolist()[:3] == [
        InstanceState.DRAINING, InstanceState.ACTIVE, InstanceState.ACTIVE]


def test_blis_places_nothing_without_node_pools():
    """BLIS's scale-up without node pools only logs "PlacementManager not available": with
    --blis-quirks the 0.5 s scale-up of the oscillation scenario places nothing."""
    result, metrics, _ = _oscillating(True, 3)
    assert metrics["autoscaling"]["refused_no_room"] == 1
    assert metrics["autoscaling"]["scale_ups"] == 0
    assert [x[2] for x in _changes(result)] == ["active", "active", "draining"]


def test_requests_finding_no_routable_instance_are_rejected():
    """Cold initial instances (loading 1 s) cannot take the burst at 0.1 s."""
    life = LifecycleConfig(loading_delay=DelaySpec(1.0), warm_start_initial_instances=False)
    result, metrics, rows = _run(BURST, autoscaler=AutoscalerConfig(), lifecycle=life)
    assert result.status.tolist() == [REJECTED] * 4
    assert metrics["rejected_routing"] == 4 == metrics["autoscaling"]["rejected_routing"]
    assert _changes(result) == [(0, 0, "loading"), (1_000_000, 0, "active")]


def test_warm_up_slows_the_first_steps():
    """warm_up_requests 2, factor 1.5: steps take 15 ms until two requests completed. Four
    requests admitted together finish together, so every step of the burst is slow."""
    life = LifecycleConfig(warm_up_requests=2, warm_up_factor=1.5)
    _, _, rows = _run(BURST, autoscaler=AutoscalerConfig(), lifecycle=life)
    assert [r["e2e_us"] for r in rows] == [1_500_000] * 4


def test_node_pools_bound_and_provision_placements():
    """One 2-GPU node (TP 1) ready, a second provisioned on demand in 3 s: the scale-up at the
    0.5 s tick places on the ready node's free GPU; the one at the 1.0 s tick (cooldown 0)
    waits for a new node (Scheduling until 4.0 s)."""
    pool = NodePool(name="p", gpu_type="H100", gpus_per_node=2, initial_nodes=1, max_nodes=2,
                    provisioning_delay=DelaySpec(3.0), cost_per_hour=1.0)
    auto = AutoscalerConfig(policy="threshold", interval_us=500_000, scale_up_utilization=0.01,
                            scale_down_utilization=0.0, cooldown_us=0)
    rows = [dict(arrival=100_000, input=32, output=300) for _ in range(4)]
    result, metrics, _ = _run(rows, autoscaler=auto, pools=[pool])
    changes = _changes(result)
    assert changes[:3] == [(0, 0, "active"), (500_000, 1, "loading"), (500_000, 1, "active")]
    assert (1_000_000, 2, "scheduling") in changes and (4_000_000, 2, "active") in changes
    assert metrics["autoscaling"]["peak_replicas"] == 4  # the pools' 4 GPUs


def test_configuration_errors_name_the_field():
    with pytest.raises(ConfigError, match="policy.autoscaler.scale_down_utilization"):
        AutoscalerConfig(scale_up_utilization=0.3, scale_down_utilization=0.5)
    with pytest.raises(ConfigError, match="policy.autoscaler.saturation_down_boundary"):
        AutoscalerConfig(saturation_up_threshold=0.4, saturation_down_boundary=0.4)
    with pytest.raises(ConfigError, match="cluster.node_pools"):
        _run(BURST, autoscaler=AutoscalerConfig(), instances=3,
             pools=[NodePool(name="p", gpus_per_node=2, initial_nodes=1, max_nodes=1)])
    with pytest.raises(ConfigError, match="max_replicas"):
        _run(BURST, autoscaler=AutoscalerConfig(policy="threshold", max_replicas=1), instances=2)
    with pytest.raises(ConfigError, match="loading_delay.mean_s"):
        LifecycleConfig(loading_delay={"mean_s": -1.0})
