"""The GPU type as a per-lane knob (``hardware``): a population mixing GPUs, each lane equal to
the reference run of its configuration with that GPU (resolved again: its blackbox
coefficients, or the roofline's FLOP rates and bandwidth), step times hand-checked for a known
GPU, the cost at each lane's GPU price, and the configuration errors (docs/configuration.md,
"Per-lane GPU types")."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest

from blisjax.config import ConfigError, LatencyConfig, load_config, resolve_config
from blisjax.config.hardware import hardware_code
from blisjax.engine import (
    evaluate_population,
    params_from_config,
    run_lanes,
    simulate_population,
    stack_params,
)
from blisjax.engine.consts import build_consts
from blisjax.engine.latency_rows import for_hardware
from blisjax.engine.parity import first_divergence
from blisjax.engine.population import apply_knobs, set_knob
from blisjax.engine.static import build_static
from blisjax.engine.static_lanes import for_runs
from blisjax.reference import simulate as reference
from blisjax.workload import generate_workload, parse_workload_spec
from tests.engine.conftest import room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.paths import REPO
from tests.reference.conftest import make_workload

SAMPLE = REPO / "configs" / "latency" / "sample-config.yaml"
# BLIS's table has llama-3.1-8b blackbox coefficients for both GPUs at TP 2 for this version
V084 = "vllm/vllm-openai:v0.8.4"


def _base(latency: LatencyConfig, tp: int = 1, **engine):
    """The latency-fitting sample (llama-3.1-8b on H100, 2 instances, 200 KV blocks of 16
    tokens, preemptions) with ``latency``."""
    cfg = load_config(SAMPLE)
    return dataclasses.replace(cfg, latency=latency, engine=dataclasses.replace(
        cfg.engine, tensor_parallel_size=tp, **engine))


def _workload(cfg, num_requests: int = 60):
    return generate_workload(parse_workload_spec({**cfg.workload, "num_requests": num_requests}),
                             seed=cfg.seed)


def _mixed_population(cfg, gpus, workload, seed: int):
    """Random policies, lane k on ``gpus[k]``; the last two lanes share one policy on the
    first two GPUs."""
    configs = _random_policy_configs(cfg, workload.tenant_names, len(gpus) - 1, seed=seed)
    configs.append(configs[-1])
    return [apply_knobs(c, {"hardware": g}) for c, g in zip(configs, gpus, strict=True)]


LANES = 6  # every test here runs its model's population program, on this many lanes


def _model_base(model: str):
    if model == "blackbox":
        return _base(LatencyConfig(model="blackbox", vllm_version=V084), tp=2)
    if model == "roofline":
        return _base(LatencyConfig(model="roofline"))
    cfg = load_config(SAMPLE)  # the sample's fitted physics coefficients
    assert cfg.latency.model == "physics"
    return cfg


@cache
def _population(model: str):
    """(configuration, workload, the lanes' configurations): random policies, each lane on a
    GPU of its own (the physics model: each GPU's FLOP rate and bandwidth)."""
    gpus = {"blackbox": ["H100", "A100-80", "A100-80", "H100", "H100", "A100-80"],
            "roofline": ["L40S", "H100", "A100-80", "A100-SXM", "H100", "L40S"],
            "physics": ["A100-80", "H100", "A100-SXM", "A100-SXM", "H100", "A100-80"]}[model]
    cfg = _model_base(model)
    workload = _workload(cfg)
    return cfg, workload, _mixed_population(cfg, gpus, workload, seed=11)


@cache
def _program(model: str):
    """The population's program (decode stretches compiled in), which the one-request cases
    below run too (``static_lanes.for_runs``)."""
    cfg, workload, configs = _population(model)
    resolved = resolve_config(cfg)
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    one = _one_request(workload.tenant_names, 512, 2)
    st = for_runs([(resolved, workload, params), (resolved, one)], decode_stretches=True)
    return for_hardware(st, resolved, workload, params)


def _check_population(model: str) -> None:
    """Every lane equals the reference run of its own configuration resolved with its GPU;
    decode stretches compiled in (their steps read the lane's step times and output-token
    time too). The same policy on another GPU runs other step times."""
    room_for_a_program()  # each model's tests follow its population test: they share its program
    cfg, workload, configs = _population(model)
    resolved = resolve_config(cfg)
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    got = simulate_population(resolved, workload, params, static=_program(model))
    wants = []
    for k, (c, lane) in enumerate(zip(configs, got, strict=True)):
        want = reference(resolve_config(c), workload)
        assert first_divergence(want, lane, workload.request_id) is None, (k, c.hardware)
        wants.append(want)
    # the shared policy on two GPUs: other step times, so other latencies
    assert not np.array_equal(wants[-1].e2e_us, wants[-2].e2e_us)
    assert int(np.sum(wants[-1].preemption_count)) + int(np.sum(wants[-2].preemption_count)) > 0


def test_mixed_gpu_blackbox_population_matches_reference_runs():
    _check_population("blackbox")


def test_population_reports_cost_at_each_lanes_gpu_price():
    """``evaluate_population`` with the knob: the lanes' metrics price their GPU-hours at their
    own GPU's price (H100 3.0, A100-80 2.0 per GPU-hour by default). The hand-checked
    blackbox case below, on the blackbox population's program."""
    cfg = _model_base("blackbox")
    resolved = resolve_config(cfg)
    workload = _one_request(_population("blackbox")[1].tenant_names, 100, 2)
    knobs = [{"hardware": "H100"}, {"hardware": "A100-80"}]
    pop = evaluate_population(resolved, workload, knobs * (LANES // 2),
                              static=_program("blackbox"))
    for knobs, cfg_k, result, metrics in list(zip(pop.knobs, pop.configs, pop.results,
                                                  pop.metrics, strict=True))[:2]:
        assert cfg_k.hardware == knobs["hardware"]
        assert first_divergence(reference(resolve_config(cfg_k), workload), result) is None
        price = {"H100": 3.0, "A100-80": 2.0}[knobs["hardware"]]
        hours = 2 * 2 * result.sim_ended_us / 3.6e9  # 2 instances of TP 2 over the run
        assert metrics["gpu_hours"] == pytest.approx(hours)
        assert metrics["cost"] == pytest.approx(hours * price)
    # the run ends with the decode step (the α2 output-token times count in the latencies,
    # not in the clock): 1952 + 8677 + 6913 on H100, 3158 + 10637 + 8016 on A100-80
    assert [r.sim_ended_us for r in pop.results[:2]] == [17542, 21811]


def _one_request(tenants, input_tokens: int, output_tokens: int):
    return make_workload([dict(arrival=0, input=input_tokens, output=output_tokens)], tenants)


def _one_request_on_gpus(model: str, input_tokens: int, output_tokens: int,
                         gpus=("H100", "A100-80")):
    """One request of ``model``'s configuration on each GPU of ``gpus``, one lane each
    (``hardware`` knob; repeated to LANES lanes on the model's population program)."""
    cfg = _model_base(model)
    workload = _one_request(_population(model)[1].tenant_names, input_tokens, output_tokens)
    configs = [set_knob(cfg, "hardware", gpus[k % len(gpus)]) for k in range(LANES)]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    return simulate_population(resolve_config(cfg), workload, params,
                               static=_program(model))[:len(gpus)]


def test_blackbox_step_times_per_gpu_by_hand():
    """BLIS's llama-3.1-8b coefficients at TP 2 (vLLM v0.8.4), one request of 100 input and 2
    output tokens: TTFT = α delay + prefill step + α2, the ITL = decode step + α2.
    H100: α (1601.350510688092, 3.512476196805965, 1805.5430360826988),
      β (6910.420479880494, 17.67057489844186, 2.8377471109943855):
      delay trunc(1601.35 + 351.25) = 1952, prefill trunc(6910.42 + 1767.06) = 8677, α2 1805
      → TTFT 12434; decode trunc(6910.42 + 2.84) = 6913 → ITL 8718, E2E 21152.
    A100-80: α (2943.6134268743335, 2.151286397723518, 14229.18244730705),
      β (8001.630597822392, 26.362876080324924, 14.969035206354745):
      delay trunc(2943.61 + 215.13) = 3158, prefill trunc(8001.63 + 2636.29) = 10637,
      α2 14229 → TTFT 28024; decode trunc(8001.63 + 14.97) = 8016 → ITL 22245, E2E 50269."""
    got = _one_request_on_gpus("blackbox", 100, 2)
    assert [int(r.ttft_us[0]) for r in got] == [12434, 28024]
    assert [int(r.itl_sum_us[0]) for r in got] == [8718, 22245]
    assert [int(r.e2e_us[0]) for r in got] == [21152, 50269]


def test_mixed_gpu_roofline_population_matches_reference_runs():
    _check_population("roofline")


def test_roofline_step_times_per_gpu_by_hand():
    """docs/roofline.md §5, example 1 (llama-3.1-8b, TP 1, one prefill of 512 tokens from
    s = 0): 5292069486592 FLOPs over peak·mfuPrefill — H100 989.5e12·0.45 → 11884 µs, A100-80
    312e12·0.38 = 1.1856e14 → 0.0446361... s → 44636 µs (compute-bound on both; α = 0). A
    single-token output completes with its first token: TTFT = E2E = the step."""
    got = _one_request_on_gpus("roofline", 512, 1)
    assert [int(r.ttft_us[0]) for r in got] == [11884, 44636]
    assert [int(r.e2e_us[0]) for r in got] == [11884, 44636]


def test_mixed_gpu_physics_population_matches_reference_runs():
    _check_population("physics")


# ---- what compiles, and the errors (no program is compiled below) ------------------------------


def _static_and_params(cfg, gpus, workload):
    resolved = resolve_config(cfg)
    configs = [set_knob(cfg, "hardware", g) for g in gpus]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    return resolved, build_static(resolved, workload), params


def test_lanes_on_the_configurations_gpu_compile_nothing_per_lane():
    cfg = _base(LatencyConfig(model="roofline"))
    workload = _workload(cfg, 12)
    resolved, st, params = _static_and_params(cfg, ["H100", "H100"], workload)
    assert st.settings.gpus == () and for_hardware(st, resolved, workload, params) is st
    consts = build_consts(resolved, workload, st)
    assert np.asarray(consts.step_prefill).ndim == 1
    assert np.asarray(consts.roofline.bandwidth).ndim == 0
    # lanes all on another GPU than the configuration's: its rows per lane
    _, _, other = _static_and_params(cfg, ["A100-80"], workload)
    wide = for_hardware(st, resolved, workload, other)
    assert wide.settings.gpus == ("H100", "A100-80")
    consts = build_consts(resolved, workload, wide)
    bandwidth = np.asarray(consts.roofline.bandwidth)
    assert bandwidth[hardware_code("A100-80")] == 2.039 * 1e12  # BwPeakTBs·1e12, as the model
    assert bandwidth[hardware_code("H100")] == 3.35 * 1e12
    assert sorted(np.asarray(consts.gpu_rows).tolist()) == sorted(
        hardware_code(x) for x in ("H100", "A100-80"))


def test_blackbox_rows_hold_each_gpus_coefficients():
    cfg = _base(LatencyConfig(model="blackbox", vllm_version=V084), tp=2)
    workload = _one_request(("",), 100, 2)
    resolved, st, params = _static_and_params(cfg, ["H100", "A100-80"], workload)
    st = for_hardware(st, resolved, workload, params)
    c = build_consts(resolved, workload, st)
    a100, h100 = hardware_code("A100-80"), hardware_code("H100")
    assert np.asarray(c.queue_delay_us)[[h100, a100], 0].tolist() == [1952, 3158]
    assert np.asarray(c.otp_us)[[h100, a100]].tolist() == [1805, 14229]
    assert np.asarray(c.step_prefill)[a100, 100] == 8001.630597822392 + 26.362876080324924 * 100.0


def test_hardware_knob_errors_name_the_field():
    cfg = _base(LatencyConfig(model="roofline"))
    with pytest.raises(ConfigError, match="^hardware: unknown GPU 'B200'.*known: H100"):
        set_knob(cfg, "hardware", "B200")
    with pytest.raises(ConfigError, match="knob 'hardware'.*GPU name"):
        set_knob(cfg, "hardware", 3)


def test_gpus_without_coefficients_or_of_another_kv_size_are_refused():
    workload = _workload(load_config(SAMPLE), 12)
    # no blackbox coefficients for llama-3.1-8b on L40S
    cfg = _base(LatencyConfig(model="blackbox", vllm_version=V084), tp=2)
    resolved, st, params = _static_and_params(cfg, ["L40S"], workload)
    with pytest.raises(ConfigError, match="^hardware: GPU 'L40S'.*alpha_coeffs"):
        for_hardware(st, resolved, workload, params)
    # KV blocks sized from the GPU's memory: 48 GiB on L40S, 80 on H100
    cfg = _base(LatencyConfig(model="roofline"), total_kv_blocks=None)
    resolved, st, params = _static_and_params(cfg, ["L40S", "H100"], workload)
    with pytest.raises(ConfigError, match="^hardware: GPU 'L40S' gives .* KV blocks.*"
                                          "engine.total_kv_blocks"):
        for_hardware(st, resolved, workload, params)


def test_constants_without_the_lanes_gpus_are_refused():
    """Low-level runs: constants built for the configuration's GPU alone, lanes on another."""
    cfg = _base(LatencyConfig(model="roofline"))
    workload = _workload(cfg, 12)
    resolved, st, params = _static_and_params(cfg, ["H100", "A100-80"], workload)
    consts = build_consts(resolved, workload, st)
    with pytest.raises(ConfigError, match="^hardware: lanes run GPU types .*A100-80"):
        run_lanes(st, consts, params)
