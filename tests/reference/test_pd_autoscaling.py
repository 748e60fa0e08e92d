"""Instance lifecycles and the autoscaler with P/D pools in the reference engine, on timelines
computed by hand (docs/autoscaling.md "P/D pools").

The blackbox model of ``conftest`` (step = 1000 + 10·prefill tokens + 100·decode tokens µs,
α = 0), 16-token blocks and llama-3.1-8b's 131,072 KV bytes per token: a 160-token prompt's
transfer at 20 GB/s plus 0.1 ms takes 1149 µs (tests/reference/test_pd.py).
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
from blisjax.config.codes import PDRole
from blisjax.config.pd import PDConfig, PoolOverrides
from blisjax.metrics import aggregate_metrics, per_request_rows, replica_timeline
from blisjax.metrics.cost import cost_basis
from blisjax.metrics.records import COMPLETED, REJECTED
from blisjax.reference import ClusterSimulator
from blisjax.reference.lifecycle import scaling_groups
from blisjax.rules import slot_roles
from tests.reference.conftest import make_resolved, make_workload

TRANSFER_US = 1149
PD = dict(prefill_instances=1, decode_instances=1, decider="always",
          transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)


def _config(*, autoscaler: AutoscalerConfig, lifecycle=None, pd=None, pools=(), quirks=False,
            **engine):
    pd = PDConfig(**{**PD, **(pd or {})})
    base = make_resolved(instances=pd.pooled_instances, quirks=quirks, **engine)
    cfg = base.config
    return dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, autoscaler=autoscaler),
        cluster=dataclasses.replace(cfg.cluster, pd=pd, lifecycle=lifecycle or LifecycleConfig(),
                                    node_pools=tuple(pools)))


def _run(rows, **kw):
    cfg = _config(**kw)
    w = make_workload(rows)
    sim = ClusterSimulator(resolve_config(cfg), w, check_invariants=True)
    result = sim.run()
    return sim, result, aggregate_metrics(result, w), per_request_rows(result, w)


def _changes(result) -> list[tuple[int, int, str]]:
    return [(x["time_us"], x["instance"], x["state"]) for x in replica_timeline(result)]


def test_each_pool_grows_into_slots_of_its_role():
    """max_replicas bounds each pool: 2 prefill + 3 decode initial instances and a maximum of
    4 give two prefill slots, then one decode slot, after the initial ones."""
    cfg = _config(autoscaler=AutoscalerConfig(policy="queue-depth", max_replicas=4),
                  pd=dict(prefill_instances=2, decode_instances=3))
    P, D = PDRole.PREFILL, PDRole.DECODE
    roles = slot_roles(cfg)
    assert roles == [P, P, D, D, D, P, P, D]
    assert scaling_groups(roles, 8, True) == [[0, 1, 5, 6], [2, 3, 4, 7]]
    assert scaling_groups(roles, 8, False) == [list(range(8))]
    # max_replicas 0: each pool at most its initial instances (it may shrink and regrow)
    cfg = _config(autoscaler=AutoscalerConfig(policy="queue-depth"),
                  pd=dict(prefill_instances=2, decode_instances=3))
    assert slot_roles(cfg) == [P, P, D, D, D]


def test_pools_scale_on_their_own():
    """queue-depth, one request per replica, ticks every 2 ms, cooldown 5 ms, nothing to load;
    a 160-token step budget, so one prompt per prefill step of 2600 µs. r0..r2 (160 tokens
    in, 30 out) arrive at 0, all bound for decode instance 1, all prefilled on instance 0:
    [0, 2600), [2600, 5200), [5200, 7800) — a request leaves its instance at the start of its
    last step (BLIS) —, transfers end 3749, 6349, 8949. Decode steps on instance 1 take
    1000 + 100 µs per request: r0 alone 3749..7049, then with r1 from 7049, with r2 from
    9449 (1300 µs); r0's last step starts 39,349, r1's 43,049 and r2's 45,349 (alone, 1100).

    Prefill pool: at 2 ms two prompts queue on one replica: slot 2 (the prefill pool's) is
    added; at 4 and 6 ms the signal is down but its last scale is within the 5 ms cooldown;
    at 8 ms (0 queued) the oldest, instance 0, drains and terminates at once. Decode pool:
    at 8 ms two decoding on one replica — its own cooldown clock has never run — slot 3 is
    added; at 44 ms one request on two replicas drains the oldest, instance 1, which
    terminates once r2 leaves it (45,349). A tick with transfers in flight is not idle: the
    ticks go on until 46 ms."""
    auto = AutoscalerConfig(policy="queue-depth", interval_us=2000, max_replicas=2,
                            target_queue_depth=1.0, cooldown_us=5000)
    rows = [dict(arrival=0, input=160, output=30) for _ in range(3)]
    sim, result, metrics, out = _run(rows, autoscaler=auto, max_tokens=160)
    assert [(r["status"], r["instance"]) for r in out] == [("completed", 1)] * 3
    assert result.pd.prefill_instance.tolist() == [0, 0, 0]
    assert result.pd.transfer_end_us.tolist() == [x + TRANSFER_US for x in (2600, 5200, 7800)]
    assert result.e2e_us.tolist() == [39_349 + 1300, 43_049 + 1200, 45_349 + 1100]
    assert _changes(result) == [
        (0, 0, "active"), (0, 1, "active"),
        (2000, 2, "loading"), (2000, 2, "active"),
        (8000, 0, "draining"), (8000, 0, "terminated"),
        (8000, 3, "loading"), (8000, 3, "active"),
        (44_000, 1, "draining"), (45_349, 1, "terminated")]
    a = metrics["autoscaling"]
    assert (a["scale_ups"], a["instances_added"], a["scale_downs"], a["instances_drained"],
            a["scale_oscillations"]) == (2, 2, 2, 2, 0)
    assert a["end_s"] == 0.046  # the last tick
    assert sim.pd.headed == [0, 0, 0, 0]


def test_a_draining_decode_instance_waits_for_the_requests_bound_for_it():
    """Two decode instances, nothing running at the 0 ms tick: the decode pool drains one,
    0.5 ms later, the oldest — instance 1, which round-robin had just picked for r0 (160 in,
    3 out). r0's prefill runs [0, 2600) on instance 0, its transfer to 3749, its two decode
    steps of 1100 µs on instance 1 to 5949: instance 1 stays Draining, though it held no
    request when drained, until r0 leaves it at the start of its last step (4849)."""
    auto = AutoscalerConfig(policy="queue-depth", interval_us=1000, target_queue_depth=1.0,
                            cooldown_us=0, actuation_delay=DelaySpec(0.0005))
    sim, result, metrics, out = _run([dict(arrival=0, input=160, output=3)], autoscaler=auto,
                                     pd=dict(decode_instances=2))
    assert (out[0]["status"], out[0]["instance"]) == ("completed", 1)
    assert result.e2e_us[0] == 2600 + TRANSFER_US + 2 * 1100
    assert _changes(result) == [(0, 0, "active"), (0, 1, "active"), (0, 2, "active"),
                                (500, 1, "draining"), (4849, 1, "terminated")]


def test_a_draining_decode_instance_ends_when_its_request_fails_elsewhere():
    """As above, but r0 (320 tokens in, deadline 2 ms) prefills in two 160-token chunks and
    times out on the prefill instance at 2 ms, during its first chunk [0, 2600): nothing is
    bound for instance 1 any more, which terminates then; the 2 ms tick still saw r0 bound
    for it, the 3 ms tick finds the run idle and is the last."""
    auto = AutoscalerConfig(policy="queue-depth", interval_us=1000, target_queue_depth=1.0,
                            cooldown_us=0, actuation_delay=DelaySpec(0.0005))
    sim, result, metrics, out = _run([dict(arrival=0, input=320, output=3, deadline=2000)],
                                     autoscaler=auto, pd=dict(decode_instances=2),
                                     max_tokens=160)
    assert out[0]["status"] == "timed-out"
    assert _changes(result) == [(0, 0, "active"), (0, 1, "active"), (0, 2, "active"),
                                (500, 1, "draining"), (2000, 1, "terminated")]
    assert metrics["autoscaling"]["end_s"] == 0.003
    assert sim.pd.headed == [0, 0, 0]


def test_no_routable_decode_instance_rejects_the_request():
    """Cold initial instances (loading 1 ms): a request at 0 finds no routable decode
    instance; one at 2 ms is served."""
    life = LifecycleConfig(loading_delay=DelaySpec(0.001), warm_start_initial_instances=False)
    rows = [dict(arrival=0, input=160, output=3), dict(arrival=2000, input=160, output=3)]
    sim, result, metrics, _ = _run(rows, autoscaler=AutoscalerConfig(), lifecycle=life)
    assert result.status.tolist() == [REJECTED, COMPLETED]
    assert metrics["rejected_routing"] == 1
    assert _changes(result) == [(0, 0, "loading"), (0, 1, "loading"),
                                (1000, 0, "active"), (1000, 1, "active")]


def test_pool_instances_cost_their_own_gpus_while_held():
    """A prefill pool of TP 2 (two GPUs per instance) beside TP-1 decode instances: each slot's
    held time is priced at its pool's GPUs."""
    auto = AutoscalerConfig(policy="queue-depth", interval_us=2000, max_replicas=2,
                            target_queue_depth=1.0, cooldown_us=5000)
    rows = [dict(arrival=0, input=160, output=30) for _ in range(3)]
    cfg = _config(autoscaler=auto, max_tokens=160)
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, pd=dataclasses.replace(
        cfg.cluster.pd, prefill=PoolOverrides(tensor_parallel_size=2))))
    w = make_workload(rows)
    result = ClusterSimulator(resolve_config(cfg), w).run()
    held = result.lifecycle.replica_us.tolist()
    gpus = [2, 1, 2, 1]  # slots: prefill, decode, prefill, decode
    m = aggregate_metrics(result, w, cfg.metrics, cost=cost_basis(cfg))
    gpu_us = sum(h * g for h, g in zip(held, gpus, strict=True))
    assert m["gpu_hours"] == pytest.approx(gpu_us / 3.6e9, rel=1e-12)


@pytest.mark.parametrize("change, field", [
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth", drain_policy="redirect")),
     "policy.autoscaler.drain_policy"),
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth", max_replicas=1),
          pd=dict(decode_instances=2)), "policy.autoscaler.max_replicas"),
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth", min_replicas=0)),
     "policy.autoscaler.min_replicas"),
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth", min_replicas=2, max_replicas=2),
          pd=dict(decode_instances=2)), None),
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth"),
          pd=dict(prefill_instances=0, decode_instances=0, shared_instances=2,
                  decider="never")), "cluster.pd"),
    (dict(autoscaler=AutoscalerConfig(policy="queue-depth"), quirks=True),
     "compat.blis_quirks"),
    (dict(autoscaler=AutoscalerConfig(), pools=[NodePool(name="n", gpus_per_node=4)],
          pd=dict(prefill=PoolOverrides(hardware="A100-80"))), "cluster.pd.prefill.hardware"),
])
def test_configuration_errors_name_the_field(change, field):
    if field is None:  # within the bounds: accepted
        _config(**change)
        return
    with pytest.raises(ConfigError, match=field):
        _config(**change)
