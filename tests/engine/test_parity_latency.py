"""Roofline and physics latency in the JAX engine: bit parity with the reference engine.

Roofline and physics step times (and physics queueing delays) are computed in the compiled
program (``blisjax.engine.roofline`` and ``blisjax.engine.physics``, checked formula by formula
in test_roofline_graph.py and test_physics_graph.py), or by the reference's own Python formulas
through a host callback (``blisjax.engine.hostlatency``, slow tier). These tests pin the
plumbing: the batch each step reads (order, progress at the step start, cached prefix tokens of
newly admitted requests), the preemption EMA (count and running depth per step), the physics α
inputs at routing time, and roofline's α queueing delay. The shipped latency-fitting sample is
used because its small KV cache causes preemptions (the EMA moves).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import ClusterConfig, LatencyConfig, SimConfig, load_config, resolve_config
from blisjax.engine import params_from_config, simulate, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.latency.factory import make_latency_model
from blisjax.reference import simulate as reference
from blisjax.workload import (
    ArrivalSpec,
    ClientSpec,
    WorkloadSpec,
    generate_workload,
    parse_workload_spec,
)
from tests.engine.conftest import room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.paths import REPO

SAMPLE = REPO / "configs" / "latency" / "sample-config.yaml"


def _sample(model: str, num_requests: int = 60):
    cfg = load_config(SAMPLE)
    if model == "physics-default":  # the default experiment with the sample's physics model
        cfg = dataclasses.replace(load_config(REPO / "configs" / "default.yaml"),
                                  latency=cfg.latency)
    if model == "roofline":
        cfg = dataclasses.replace(cfg, latency=LatencyConfig(model="roofline"))
    if model == "roofline-moe":  # MoE weights depend on the step's tokens; TP 2; α delays
        cfg = dataclasses.replace(
            cfg, model="qwen/qwen3-30b-a3b", hardware="L40S",
            engine=dataclasses.replace(cfg.engine, tensor_parallel_size=2),
            latency=LatencyConfig(model="roofline", alpha_coeffs=(1500.0, 7.25, 0.0)))
    spec = parse_workload_spec({**cfg.workload, "num_requests": num_requests})
    return resolve_config(cfg), generate_workload(spec, seed=cfg.seed)


# The roofline cases differ only in the pending window (the MoE case's α delays): raised to
# cover both, they run one compiled program (the models' tables are inputs of the program).
SHARED_ROOFLINE = ("roofline", "roofline-moe")


@pytest.fixture(scope="module")
def roofline_runs():
    """Both roofline samples' JAX runs, one after the other on one compiled program."""
    room_for_a_program()
    samples = {model: _sample(model) for model in SHARED_ROOFLINE}
    pending = max(build_static(*sample).shapes.pending_slots for sample in samples.values())
    return {model: simulate(*sample, pending_slots=pending) for model, sample in samples.items()}


@pytest.mark.parametrize("model", SHARED_ROOFLINE)
def test_latency_model_parity(model, roofline_runs):
    resolved, workload = _sample(model)
    ref = reference(resolved, workload)
    assert int(np.sum(ref.preemption_count)) > 0  # the EMA and re-admission paths are exercised
    assert int(np.sum(ref.cache_hits)) > 0
    assert first_divergence(ref, roofline_runs[model]) is None


def _most_running(result, arrival_us) -> int:
    """The most requests of a run that were between admission and completion at once
    (completed requests, from their scheduling delay and E2E)."""
    done = result.e2e_us > 0
    start = (arrival_us + result.scheduling_delay_us)[done]
    end = (arrival_us + result.e2e_us)[done]
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(start.size, np.int64), -np.ones(end.size, np.int64)])
    order = np.lexsort((steps, times))  # at a tie a completion goes first
    return int(np.max(np.cumsum(steps[order])))


@pytest.mark.slow
def test_roofline_step_time_at_every_running_width():
    """The roofline step time is evaluated at the narrowest of the step's widths (64, 128,
    256) that holds the lanes' running batches (``instance.roofline_step_us``). BLIS's anchor
    request lengths on one instance at 80 requests/s run batches of more than 128 requests, so
    every width's program runs; each lane (FCFS, SJF) equals its own reference run."""
    cfg = SimConfig(cluster=ClusterConfig(num_instances=1), seed=42,
                    latency=LatencyConfig(model="roofline"))
    spec = WorkloadSpec(clients=(ClientSpec(arrival=ArrivalSpec("poisson")),),
                        aggregate_rate=80.0, num_requests=400)
    workload = generate_workload(spec, seed=42)
    sjf = dataclasses.replace(cfg.policy, scheduler=dataclasses.replace(
        cfg.policy.scheduler, policy="sjf"))
    configs = [cfg, dataclasses.replace(cfg, policy=sjf)]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    st = build_static(resolve_config(configs[0]), workload)
    assert st.shapes.batch_slots == 256 and st.tuning.narrow_programs
    room_for_a_program()
    lanes = simulate_population(resolve_config(configs[0]), workload, params, static=st)
    for k, c in enumerate(configs):
        want = reference(resolve_config(c), workload)
        assert first_divergence(want, lanes[k]) is None, k
        if k == 0:
            assert _most_running(want, np.asarray(workload.arrival_us)) > 128


@pytest.mark.parametrize(("case", "where"), [
    ("physics-default", "program"),
    pytest.param("physics", "program", marks=pytest.mark.slow),
    pytest.param("physics", "host", marks=pytest.mark.slow)])
def test_physics_population_parity(case, where):
    """A configuration's own policy and seven random ones (admission, priority, routing,
    scheduler, preemption) in one population, physics in the program (with decode stretches)
    or through the host callback; every lane equals its own reference run. The default experiment (300 requests) routes by KV use among four
    instances while queueing delays of milliseconds overlap other arrivals; the sample
    preempts (the EMA moves)."""
    resolved, workload = _sample(case, num_requests=60 if case == "physics" else 300)
    configs = [resolved.config, *_random_policy_configs(resolved.config, workload.tenant_names,
                                                        7, seed=11)]
    if any(c.engine.preemption_policy == "priority" for c in configs):
        # priority preemption can thrash forever; the horizon is shared by all lanes
        configs = [dataclasses.replace(c, horizon_us=60_000_000) for c in configs]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    # one program per step part (narrow_programs=False): half the compile
    st = build_static(resolve_config(configs[0]), workload, decode_stretches=True,
                      narrow_programs=False)
    assert st.stateful_latency and (st.features.latency is None) and st.stretches
    if where == "host":
        st = st.replace(latency=make_latency_model(resolved))
    room_for_a_program()
    lanes = simulate_population(resolve_config(configs[0]), workload, params, static=st)
    preempted = 0
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), workload)
        preempted += int(np.sum(want.preemption_count))
        assert first_divergence(want, lanes[k]) is None, (k, cfg.policy, cfg.engine)
    assert preempted > 0 or case != "physics"  # the sample's EMA moves


def test_physics_alpha_reads_each_lanes_cpu_tier():
    """α feature 10 is the lane's own CPU tier over its GPU KV cache (docs/latency-models.md
    §P.2): the sample with α10's coefficient at 40,000 µs per unit and lanes of 300, 60 and 0
    tier blocks (the program sized for 300), physics in the program; each lane equals its own
    reference run, whose delays α10 changes."""
    resolved, workload = _sample("physics", num_requests=60)
    alpha = list(resolved.config.latency.alpha_coeffs)
    alpha[9] = 40_000.0
    base = dataclasses.replace(resolved.config, latency=dataclasses.replace(
        resolved.config.latency, alpha_coeffs=tuple(alpha)))
    configs = [dataclasses.replace(base, engine=dataclasses.replace(base.engine,
                                                                    kv_cpu_blocks=blocks))
               for blocks in (300, 60, 0)]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    st = build_static(resolve_config(configs[0]), workload, narrow_programs=False)
    room_for_a_program()
    lanes = simulate_population(resolve_config(configs[0]), workload, params, static=st)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), workload)
        assert first_divergence(want, lanes[k]) is None, k
    without = dataclasses.replace(configs[0], latency=resolved.config.latency)
    assert not np.array_equal(reference(resolve_config(without), workload).ttft_us,
                              reference(resolve_config(configs[0]), workload).ttft_us)
