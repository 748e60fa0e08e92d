"""What the JAX engine does differently on an accelerator, checked on a CPU: lanes per lockstep
loop by platform, the device-memory check of a population, and ``--device``."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from blisjax.cli import main as cli_main
from blisjax.devices import use_platform
from blisjax.engine import params_from_config, progcache, stack_params
from blisjax.engine.consts import build_consts
from blisjax.engine.run import (
    ACCELERATOR_LANE_BLOCK,
    CPU_LONE_LANE_COPIES,
    LANE_BLOCK,
    MEMORY_PER_STATE,
    TIERED_LANE_BLOCK,
    _initial_states,
    _lane_order,
    _placement,
    _run_sharded,
    check_memory,
    check_program_memory,
    default_lane_block,
    program_bytes,
    state_bytes_per_lane,
)
from blisjax.engine.static import build_static
from tests.engine.static_like import static_like
from tests.engine.test_parity import EDGE_ROWS
from tests.reference.conftest import make_resolved, make_workload


def _device(platform: str):
    return types.SimpleNamespace(platform=platform)


def test_cpu_devices_run_lanes_in_blocks_and_an_accelerator_runs_all_in_one_loop():
    assert default_lane_block() == LANE_BLOCK == 64  # this machine's CPU devices
    assert default_lane_block([_device("cpu"), _device("cpu")]) == 64
    assert default_lane_block([_device("gpu")]) == ACCELERATOR_LANE_BLOCK
    assert ACCELERATOR_LANE_BLOCK >= 65_536
    # a program with a CPU tier, 100 GPU blocks per instance: lanes whose tiers can thrash run
    # in small blocks on CPUs; lanes of no tier or tiers of the GPU cache's size at least not
    tiered = static_like(tiered=True, kv_blocks=100)
    for tiers, block in (((0, 99), TIERED_LANE_BLOCK), ((0, 100, 300), LANE_BLOCK),
                         ((1,), TIERED_LANE_BLOCK)):
        lanes = types.SimpleNamespace(kv_cpu_blocks=np.array(tiers))
        assert default_lane_block([_device("cpu")], tiered, lanes) == block, tiers
        assert default_lane_block([_device("gpu")], tiered, lanes) == ACCELERATOR_LANE_BLOCK
    assert default_lane_block([_device("cpu")], tiered) == TIERED_LANE_BLOCK < LANE_BLOCK


def test_lanes_with_cpu_tiers_are_cut_into_blocks_in_the_order_of_their_tier_sizes():
    lanes = types.SimpleNamespace(kv_cpu_blocks=np.array([300, 0, 24, 0, 1200], np.int32))
    order = _lane_order(types.SimpleNamespace(tiered=True), lanes)
    assert np.asarray(order).tolist() == [1, 3, 2, 0, 4]  # equal sizes keep their order
    assert _lane_order(types.SimpleNamespace(tiered=False), lanes) is None


def test_a_placement_on_one_device_keeps_every_lane_in_one_block_when_asked():
    base = make_resolved(instances=2)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    params = stack_params([params_from_config(base.config, w.tenant_names)] * 200)
    st = build_static(base, w)
    placed = _placement(st, params, jax.local_devices()[:1], ACCELERATOR_LANE_BLOCK)
    assert placed.lane_block == 200 and placed.lanes == 200
    blocked = _placement(st, params, jax.local_devices()[:1], None)  # a CPU: blocks of 64
    assert blocked.lane_block == 64
    assert int(blocked.params.admission.policy.shape[0]) == 200  # 4 blocks of 50, no padding


def test_a_lone_cpu_lane_runs_beside_a_copy_unless_its_program_is_cached(tmp_path,
                                                                         monkeypatch):
    st, params = _population(1)
    cpu = jax.local_devices()[:1]
    placed = _placement(st, params, cpu, None)
    assert (placed.lanes, placed.lane_block) == (1, CPU_LONE_LANE_COPIES) == (1, 2)
    assert int(placed.params.admission.policy.shape[0]) == 2
    alone = _placement(st, params, cpu, 1)  # blocks of one lane, as asked
    assert (alone.lane_block, int(alone.params.admission.policy.shape[0])) == (1, 1)
    two = _placement(st, stack_params([params_from_config(make_resolved(instances=2).config,
                                                          ("a", "b"))] * 2), cpu, None)
    assert (two.lanes, int(two.params.admission.policy.shape[0])) == (2, 2)  # no copy
    monkeypatch.setattr(progcache, "_chosen", None)
    monkeypatch.setattr(progcache, "_chosen_set", False)
    progcache.use_program_cache(tmp_path)
    try:  # a program later runs load from the cache keeps its one lane
        cached = _placement(st, params, cpu, None)
    finally:
        progcache.use_program_cache(None)
    assert (cached.lane_block, int(cached.params.admission.policy.shape[0])) == (1, 1)


def _population(lanes: int):
    base = make_resolved(instances=2, block_size=4, kv_blocks=40)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    params = stack_params([params_from_config(base.config, w.tenant_names)] * lanes)
    return build_static(base, w), params


def test_state_size_per_lane_counts_every_array_of_a_lanes_state():
    st, params = _population(3)
    states = jax.jit(lambda p: _initial_states(st, p))(params)
    measured = sum(x.nbytes for x in jax.tree_util.tree_leaves(states)) // 3
    assert state_bytes_per_lane(st, params) == measured > 0


def test_a_population_whose_states_cannot_fit_in_device_memory_is_refused_before_compiling():
    st, params = _population(10)
    placed = _placement(st, params, jax.local_devices()[:1], None)
    per_lane = state_bytes_per_lane(st, params)
    # room for exactly 10 lanes' states: accepted; one byte less: refused, naming what fits (9)
    check_memory(st, placed, limit_bytes=10 * per_lane)
    with pytest.raises(ValueError, match=r"population: 10 lanes need .* at most 9 lanes fit"
                                         r".*XLA_PYTHON_CLIENT_MEM_FRACTION"):
        check_memory(st, placed, limit_bytes=10 * per_lane - 1)
    check_memory(st, placed)  # a CPU reports no device memory: nothing is checked
    # where jit compiles and runs at once: MEMORY_PER_STATE times the states
    room = int(np.ceil(MEMORY_PER_STATE * per_lane * 10))
    check_memory(st, placed, limit_bytes=room, factor=MEMORY_PER_STATE)
    with pytest.raises(ValueError, match=rf"{MEMORY_PER_STATE}× .* at most 9 lanes fit"):
        check_memory(st, placed, limit_bytes=room - 1, factor=MEMORY_PER_STATE)


def _analysis(**sizes):
    stats = types.SimpleNamespace(**sizes)
    return types.SimpleNamespace(memory_analysis=lambda: stats)


def test_a_compiled_program_that_cannot_fit_in_device_memory_is_refused_before_it_runs():
    st, params = _population(10)
    placed = _placement(st, params, jax.local_devices()[:1], None)
    # arguments 100 + outputs 1,000 + temporaries 50 - 30 bytes the outputs share with the
    # arguments = 1,120 bytes
    program = _analysis(argument_size_in_bytes=100, output_size_in_bytes=1_000,
                        temp_size_in_bytes=50, alias_size_in_bytes=30)
    assert program_bytes(program) == 1_120
    check_program_memory(program, st, placed, limit_bytes=1_120)
    with pytest.raises(ValueError, match=r"10 lanes need .* states and temporaries.* at most 9 "
                                         r"lanes fit"):
        check_program_memory(program, st, placed, limit_bytes=1_119)
    # no analysis from XLA: MEMORY_PER_STATE times the states
    room = int(np.ceil(MEMORY_PER_STATE * state_bytes_per_lane(st, params) * 10))
    silent = types.SimpleNamespace(memory_analysis=lambda: None)
    assert program_bytes(silent) is None
    check_program_memory(silent, st, placed, limit_bytes=room)
    with pytest.raises(ValueError, match="at most 9 lanes fit"):
        check_program_memory(silent, st, placed, limit_bytes=room - 1)


def test_a_compiled_programs_footprint_holds_at_least_its_lanes_final_states():
    st, params = _population(3)
    placed = _placement(st, params, jax.local_devices()[:1], None)
    consts = build_consts(make_resolved(instances=2, block_size=4, kv_blocks=40),
                          make_workload(EDGE_ROWS, ("a", "b"), ("g",)), st)
    compiled = _run_sharded.lower(st, consts, placed.params, placed.devices,
                                  placed.lane_block).compile()
    need = program_bytes(compiled)
    assert need is not None and need >= 3 * state_bytes_per_lane(st, params)


def test_device_flag_names_the_platforms_and_the_gpu_install(capsys):
    with pytest.raises(ValueError, match="--device: one of cpu, gpu, got 'tpu'"):
        use_platform("tpu")
    assert use_platform(None) is None
    assert use_platform("cpu") == "cpu"  # JAX already runs on the CPU here
    if jax.default_backend() == "cpu":
        with pytest.raises(ValueError, match=r"--device gpu: JAX finds no GPU.*\[cuda13\]"):
            use_platform("gpu")
        assert cli_main(["--device", "gpu", "run"]) == 2
        assert "--device gpu: JAX finds no GPU" in capsys.readouterr().err
