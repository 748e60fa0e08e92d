"""A decode instance that can admit nothing with nothing running (Decision 22): every lane of a
JAX population equals its own reference run (the hand cases of
``tests/reference/test_pd_stall.py``), lanes that wait for an event beside a lane whose
time-varying priorities keep it stepping empty until the horizon."""

from __future__ import annotations

import dataclasses

from blisjax.config import PriorityConfig, SchedulerConfig, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload
from tests.reference.test_pd_stall import PD, _rows

HORIZON_US = 20_000


def test_stalled_decode_instances_match_the_reference():
    base = make_resolved(instances=2, kv_blocks=2, horizon_us=HORIZON_US)
    base = resolve_config(dataclasses.replace(
        base.config, cluster=dataclasses.replace(base.config.cluster, pd=PD)))
    workloads = [make_workload(_rows()), make_workload(_rows(deadline_b=5000))]
    static = build_static_shared(base, workloads)
    cfg = base.config
    ageing = dataclasses.replace(cfg.policy, scheduler=SchedulerConfig(policy="priority-fcfs"),
                                 priority=PriorityConfig(policy="slo-based"))
    lanes = [cfg,  # FCFS: waits for an event
             dataclasses.replace(cfg, policy=dataclasses.replace(
                 cfg.policy, scheduler=SchedulerConfig(policy="sjf"))),  # constant priority
             dataclasses.replace(cfg, policy=ageing)]  # its order may change: steps on
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    for w in workloads:
        results = simulate_population(base, w, params, static=static)
        steps = []
        for k, c in enumerate(lanes):
            want = reference(resolve_config(c), w)
            assert first_divergence(want, results[k]) is None, (k, w.deadline_us)
            steps.append(int(results[k].step_count[1]))
        if not w.deadline_us.any():  # the stall case: one empty step, or empty steps to the end
            assert steps[:2] == [1, 1] and steps[2] > 10


def test_a_lane_that_would_step_empty_forever_stops_at_its_event_bound():
    """Without a horizon the ageing lane would step empty forever (the reference engine and
    BLIS never end): it stops at its event bound, flagged, while the lanes that wait for an
    event end as their reference runs. The bound (``consts.events_bound``): 64 × (tokens +
    8 × requests + 64) = 64 × (42 + 16 + 64) = 7,808 events."""
    base = make_resolved(instances=2, kv_blocks=2)
    base = resolve_config(dataclasses.replace(
        base.config, cluster=dataclasses.replace(base.config.cluster, pd=PD)))
    cfg = base.config
    lanes = [cfg, dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, scheduler=SchedulerConfig(policy="priority-fcfs"),
        priority=PriorityConfig(policy="slo-based")))]
    w = make_workload(_rows())
    results = simulate_population(base, w, stack_params([params_from_config(c, ("",))
                                                         for c in lanes]))
    assert not results[0].overflow
    assert first_divergence(reference(resolve_config(cfg), w), results[0]) is None
    assert results[1].overflow == {"events": 1}
    assert int(results[1].step_count.sum()) > 7_000  # nearly every event an empty step
