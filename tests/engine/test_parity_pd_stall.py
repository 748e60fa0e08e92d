"""A decode instance that can admit nothing with nothing running (Decision 22): every lane of a
JAX population equals its own reference run (the hand cases of
``tests/reference/test_pd_stall.py``), lanes that wait for an event beside a lane whose
time-varying priorities keep it stepping empty until the horizon."""

from __future__ import annotations

import dataclasses
from functools import cache

from blisjax.config import PriorityConfig, SchedulerConfig, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload
from tests.reference.test_pd_stall import PD, _rows

HORIZON_US = 20_000  # both tests run one compiled program: the horizon is not part of it


def _base(horizon_us: int = 2**63 - 1):
    base = make_resolved(instances=2, kv_blocks=2, horizon_us=horizon_us)
    return resolve_config(dataclasses.replace(
        base.config, cluster=dataclasses.replace(base.config.cluster, pd=PD)))


@cache
def _program():
    return build_static_shared(_base(), [make_workload(_rows()),
                                         make_workload(_rows(deadline_b=5000))])


def test_stalled_decode_instances_match_the_reference():
    base = _base(HORIZON_US)
    workloads = [make_workload(_rows()), make_workload(_rows(deadline_b=5000))]
    static = _program()
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
    base = _base()
    cfg = base.config
    sjf = dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, scheduler=SchedulerConfig(policy="sjf")))
    lanes = [cfg, dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, scheduler=SchedulerConfig(policy="priority-fcfs"),
        priority=PriorityConfig(policy="slo-based"))), sjf]
    w = make_workload(_rows())
    results = simulate_population(base, w, stack_params([params_from_config(c, ("",))
                                                         for c in lanes]), static=_program())
    for k in (0, 2):
        assert not results[k].overflow
        assert first_divergence(reference(resolve_config(lanes[k]), w), results[k]) is None
    assert results[1].overflow == {"events": 1}
    assert int(results[1].step_count.sum()) > 7_000  # nearly every event an empty step
