"""Roofline and physics latency in the JAX engine: bit parity with the reference engine.

Roofline step times are computed in the compiled program (``blisjax.engine.roofline``, checked
formula by formula in test_roofline_graph.py); physics runs the reference's own Python formulas
through a host callback (``blisjax.engine.hostlatency``). These tests pin the plumbing: the
batch each step reads (order, progress at the step start, cached prefix tokens of newly admitted
requests), the preemption EMA (count and running depth per step), the physics α inputs at
routing time, and roofline's α queueing delay. The shipped latency-fitting sample is used
because its small KV cache causes preemptions (the EMA moves).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import LatencyConfig, load_config, resolve_config
from blisjax.engine import simulate
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.reference import simulate as reference
from blisjax.workload import generate_workload, parse_workload_spec
from tests.engine.conftest import room_for_a_program
from tests.paths import REPO

SAMPLE = REPO / "configs" / "latency" / "sample-config.yaml"


def _sample(model: str, num_requests: int = 60):
    cfg = load_config(SAMPLE)
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
    pending = max(build_static(*sample).pending_slots for sample in samples.values())
    return {model: simulate(*sample, pending_slots=pending) for model, sample in samples.items()}


@pytest.mark.parametrize("model", ["roofline", "roofline-moe", "physics"])
def test_latency_model_parity(model, request):
    resolved, workload = _sample(model)
    ref = reference(resolved, workload)
    assert int(np.sum(ref.preemption_count)) > 0  # the EMA and re-admission paths are exercised
    assert int(np.sum(ref.cache_hits)) > 0
    got = (request.getfixturevalue("roofline_runs")[model] if model in SHARED_ROOFLINE
           else simulate(resolved, workload))
    assert first_divergence(ref, got) is None
