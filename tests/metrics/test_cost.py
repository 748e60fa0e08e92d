"""The ``gpu_hours`` and ``cost`` metrics, computed by hand from their definition
(docs/semantics.md §6.5): instances × simulated duration × GPUs per instance × price."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import ConfigError, EngineConfig, MetricsConfig, SimConfig
from blisjax.metrics import CostBasis, aggregate_metrics, cost_basis, cost_metrics
from blisjax.metrics.records import LifecycleCounters
from blisjax.reference import simulate
from tests.reference.conftest import make_resolved, make_workload

HOUR_US = 3_600_000_000


def _run(instances: int):
    resolved = make_resolved(instances=instances)
    workload = make_workload([{"arrival": 0, "input": 32, "output": 4}])
    return simulate(resolved, workload), workload


def test_fixed_cluster_holds_every_instance_for_the_whole_run():
    result, _ = _run(3)
    two_hours = dataclasses.replace(result, sim_ended_us=2 * HOUR_US)
    # 3 instances x 2 h x 2 GPUs = 12 GPU-hours, at 3.0 per GPU-hour 36.0
    assert cost_metrics(two_hours, CostBasis(2, 3.0)) == {"gpu_hours": 12.0, "cost": 36.0}
    assert cost_metrics(result, CostBasis(1, 1.0))["gpu_hours"] == \
        3 * result.sim_ended_us / HOUR_US


def test_lifecycles_count_each_instance_held_time():
    result, _ = _run(2)
    held = LifecycleCounters(*[None] * len(LifecycleCounters._fields))._replace(
        replica_us=[HOUR_US, HOUR_US // 2, 0])
    with_life = dataclasses.replace(result, lifecycle=held, sim_ended_us=10 * HOUR_US)
    assert cost_metrics(with_life, CostBasis(4, 2.5)) == {"gpu_hours": 6.0, "cost": 15.0}


def test_basis_from_the_configuration():
    cfg = SimConfig(hardware="H100", engine=EngineConfig(tensor_parallel_size=2))
    assert cost_basis(cfg) == CostBasis(2, 3.0)
    a100 = dataclasses.replace(cfg, hardware="A100-80",
                               metrics=MetricsConfig(gpu_price_per_hour=0.75))
    assert cost_basis(a100) == CostBasis(2, 0.75)
    with pytest.raises(ConfigError, match="metrics.gpu_price_per_hour"):
        MetricsConfig(gpu_price_per_hour=-1.0)


def test_aggregate_reports_cost_when_given_a_basis():
    result, workload = _run(2)
    plain = aggregate_metrics(result, workload)
    assert "cost" not in plain and "gpu_hours" not in plain
    priced = aggregate_metrics(result, workload, cost=CostBasis(1, 2.0))
    assert priced["gpu_hours"] == 2 * result.sim_ended_us / HOUR_US
    assert priced["cost"] == priced["gpu_hours"] * 2.0
