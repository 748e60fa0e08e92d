"""A workload without requests: the JAX engine answers at once, without compiling a program,
with the reference engine's result (no event happens: every counter 0, the run ends at 0 µs)."""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.cli import main
from blisjax.config import resolve_config
from blisjax.engine import params_from_config, run, simulate, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.reference import simulate as reference
from blisjax.workload import write_trace
from tests.reference.conftest import make_resolved, make_workload

CONFIGS = {
    "one-instance": dict(),
    "three-instances-latencies": dict(instances=3, refresh_us=1500, admission_latency_us=300,
                                      routing_latency_us=700, horizon_us=50_000),
}


@pytest.fixture
def no_compile(monkeypatch):
    """Every JAX engine run goes through ``run._run_sharded`` (the jitted program): refuse it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the JAX engine compiled a program for a run without requests")

    monkeypatch.setattr(run, "_run_sharded", refuse)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_simulate_returns_the_reference_result_without_compiling(no_compile, name):
    resolved = make_resolved(**CONFIGS[name])
    empty = make_workload([])
    want, got = reference(resolved, empty), simulate(resolved, empty)
    assert first_divergence(want, got) is None
    for field in ("status", "instance", "ttft_us", "e2e_us", "itl_entries_us", "completed",
                  "cache_hits", "busy_time_us", "peak_kv_blocks_used"):
        x, y = getattr(want, field), getattr(got, field)
        assert x.dtype == y.dtype and x.shape == y.shape, field
    assert (got.sim_ended_us, got.horizon_us, got.num_instances, got.overflow) == \
        (0, resolved.config.horizon_us, resolved.config.cluster.num_instances, {})


def test_population_of_a_zero_request_workload_has_one_empty_result_per_lane(no_compile):
    resolved = make_resolved(instances=2)
    empty = make_workload([])
    params = stack_params([params_from_config(resolved.config, empty.tenant_names)] * 3)
    lanes = simulate_population(resolved, empty, params)
    assert len(lanes) == 3
    want = reference(resolve_config(resolved.config), empty)
    assert all(first_divergence(want, lane) is None for lane in lanes)
    assert all(np.array_equal(lane.completed, [0, 0]) for lane in lanes)
    with pytest.raises(ValueError, match="lane_block must be >= 1"):
        simulate_population(resolved, empty, params, lane_block=0)


def test_cli_jax_run_of_an_empty_trace_prints_the_reference_output(no_compile, tmp_path, capsys):
    header, data = tmp_path / "h.yaml", tmp_path / "d.csv"
    write_trace(make_workload([]), header, data)
    argv = ["replay", "--trace-header", str(header), "--trace-data", str(data),
            "--model", "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1"]
    assert main([*argv, "--results-path", str(tmp_path / "ref.json")]) == 0
    want = capsys.readouterr().out
    assert '"completed_requests": 0' in want
    assert main([*argv, "--engine", "jax", "--results-path", str(tmp_path / "jax.json")]) == 0
    assert capsys.readouterr().out == want
    assert (tmp_path / "jax.json").read_text() == (tmp_path / "ref.json").read_text() == "[]\n"
