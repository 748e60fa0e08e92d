"""Physics-normalized latency model against the golden fixture (docs/latency-models.md §P).

``tests/data/physics_features_golden.json`` holds inputs and expected values computed by the
independent exact oracle of ``test_physics_oracle.py`` (see the fixture's ``provenance``).
"""

from __future__ import annotations

import json
import math
from decimal import Context, Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from blisjax.config import ConfigError, HardwareConfig, load_hardware, load_model_config
from blisjax.config.hardware import available_hardware
from blisjax.latency.base import StepBatch
from blisjax.latency.physics import (
    DEFAULT_HARDWARE_EXTRAS,
    NUM_ALPHA_FEATURES,
    NUM_BETA_FEATURES,
    PhysicsCoefficients,
    PhysicsConfig,
    PhysicsHardwareExtras,
    PhysicsLatency,
    PhysicsQueueInputs,
    PhysicsStepInputs,
    VLLMKnobs,
    alpha_features,
    beta_features,
    congestion_gate,
    default_hardware_extras,
    load_physics_coefficients,
    log1p_int,
    parse_physics_coefficients,
    pow_int,
    queueing_delay_from_features,
    shipped_physics_coefficients,
    step_time_from_features,
    update_preemption_ema,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "physics_features_golden.json"
# (Absent only while test_physics_oracle.py --write regenerates it from scratch.)
GOLDEN = (
    json.loads(FIXTURE.read_text())
    if FIXTURE.exists()
    else {"test_cases": [], "tolerance_relative": 1e-10, "tolerance_absolute_zero": 1e-15}
)
CASES = GOLDEN["test_cases"]
REL = GOLDEN["tolerance_relative"]
ABS_ZERO = GOLDEN["tolerance_absolute_zero"]
IDS = [c["id"] for c in CASES]


# --------------------------------------------------------------------------- helpers


def build_physics_config(config: dict) -> PhysicsConfig:
    """The implementation's PhysicsConfig for a fixture config (shipped model and GPU)."""
    hw = config["hardware"]
    if hw["name"] in available_hardware():
        hardware = load_hardware(hw["name"])
    else:  # the worked example's GPU (TFlopsPeak 989); MFU and memory are unused here
        hardware = HardwareConfig(
            name=hw["name"],
            tflops_peak=hw["TFlopsPeak"],
            tflops_fp8=0.0,
            bw_peak_tbs=hw["BwPeakTBs"],
            mfu_prefill=0.5,
            mfu_decode=0.5,
            memory_gib=80.0,
        )
    extras = PhysicsHardwareExtras(
        pcie_bandwidth_gb_s=hw["pcie_bandwidth_gb_s"],
        interconnect_bandwidth_gb_s=hw["interconnect_bandwidth_gb_s"],
        pcie_efficiency=hw["pcie_efficiency"],
    )
    return PhysicsConfig.build(
        load_model_config(config["model"]),
        hardware,
        config["tp"],
        VLLMKnobs(**config["vllm"]),
        extras,
    )


def queue_inputs_of(case: dict) -> PhysicsQueueInputs:
    return PhysicsQueueInputs(**case["alpha_input"])


def step_inputs_of(case: dict) -> PhysicsStepInputs:
    fields = dict(case["beta_input"])
    fields.pop("scheduled_tokens")
    return PhysicsStepInputs(**fields)


def close(actual: float, expected: float) -> bool:
    if expected == 0.0:
        return abs(actual) <= ABS_ZERO
    return abs(actual - expected) <= REL * abs(expected)


def assert_all_close(actual, expected, what: str) -> None:
    assert len(actual) == len(expected), what
    bad = [
        (i + 1, a, e)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True))
        if not close(a, e)
    ]
    assert not bad, f"{what}: (feature, actual, expected) {bad}"


# --------------------------------------------------------------------------- fixture shape


def test_fixture_coverage():
    assert len(CASES) >= 50
    assert len(set(IDS)) == len(IDS)
    groups = {c["group"] for c in CASES}
    for needed in (
        "worked example",
        "pure prefill",
        "pure decode",
        "mixed",
        "chunked prefill",
        "empty batch",
        "full KV",
        "MoE activation",
        "CPU offload on",
        "CPU offload off",
        "transcendental boundaries",
        "oversubscribed gate",
    ):
        assert needed in groups, needed
    models = {c["config"]["model"] for c in CASES}
    assert {
        "meta-llama/llama-3.1-8b-instruct",
        "meta-llama/llama-2-7b-hf",
        "mistralai/mixtral-8x7b-v0.1",
    } <= models
    assert {c["config"]["hardware"]["name"] for c in CASES} >= {"H100", "A100-SXM"}
    assert {c["config"]["tp"] for c in CASES} >= {1, 2, 4}
    worked = [c for c in CASES if c["provenance"] == "worked example"]
    assert len(worked) == 1 and "printed_worked_example" in worked[0]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fixture_is_the_oracle_output(case):
    """The stored expected values are the independent oracle's, not the implementation's."""
    import test_physics_oracle as oracle

    recomputed = oracle.oracle_case(case)
    for key, value in recomputed.items():
        assert case[key] == value, key


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_model_dims_match_shipped_config(case):
    model = load_model_config(case["config"]["model"])
    dims = case["config"]["model_dims"]
    assert model.num_layers == dims["num_hidden_layers"]
    assert model.hidden_dim == dims["hidden_size"]
    assert model.num_heads == dims["num_attention_heads"]
    assert model.num_kv_heads == dims["num_key_value_heads"]
    assert model.vocab_size == dims["vocab_size"]
    assert model.bytes_per_param == dims["bytes_per_param"]
    assert model.num_local_experts == dims["num_experts"]
    cfg = build_physics_config(case["config"])
    assert cfg.intermediate_size == dims["intermediate_size"]
    assert cfg.n_mlp_proj == dims["n_mlp_proj"]
    assert cfg.top_k == dims["top_k"]


# --------------------------------------------------------------------------- golden values


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_physics_config_constants(case):
    cfg = build_physics_config(case["config"])
    for name, expected in case["expected_physics_config"].items():
        assert close(getattr(cfg, name), expected), (name, getattr(cfg, name), expected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_alpha_features_golden(case):
    cfg = build_physics_config(case["config"])
    feats = alpha_features(cfg, queue_inputs_of(case))
    assert len(feats) == NUM_ALPHA_FEATURES
    assert_all_close(feats, case["expected_alpha_features"], case["id"])
    assert all(0.0 <= f <= 100.0 for f in feats)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_beta_features_golden(case):
    cfg = build_physics_config(case["config"])
    inputs = step_inputs_of(case)
    assert inputs.scheduled_tokens == case["beta_input"]["scheduled_tokens"]
    feats = beta_features(cfg, inputs)
    assert len(feats) == NUM_BETA_FEATURES
    assert_all_close(feats, case["expected_beta_features"], case["id"])
    assert all(0.0 <= f <= 100.0 for f in feats)


@pytest.mark.parametrize(
    "case", [c for c in CASES if "batch" in c], ids=[c["id"] for c in CASES if "batch" in c]
)
def test_step_inputs_from_batch(case):
    b = case["batch"]
    batch = StepBatch(
        new_tokens=b["new_tokens"],
        progress_index=b["progress_index"],
        input_tokens=b["input_tokens"],
        output_tokens=b["output_tokens"],
    )
    bi = case["beta_input"]
    got = PhysicsStepInputs.from_batch(
        batch,
        block_size_tokens=case["config"]["vllm"]["block_size_tokens"],
        preemption_ema=bi["preemption_ema"],
        prefix_cached_tokens=b["prefix_cached_tokens"],
        transfer_blocks=bi["transfer_blocks"],
        cpu_resident_read_blocks=bi["cpu_resident_read_blocks"],
    )
    assert got == step_inputs_of(case)


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if "coefficients" in c],
    ids=[c["id"] for c in CASES if "coefficients" in c],
)
def test_queueing_delay_and_step_time(case):
    cfg = build_physics_config(case["config"])
    co = case["coefficients"]
    coeffs = PhysicsCoefficients(alpha=co["alpha"], beta=co["beta"], model="m", hardware="h", tp=1)
    latency = PhysicsLatency(cfg, coeffs)
    assert latency.queueing_delay_us(queue_inputs_of(case)) == case["expected_queueing_delay_us"]
    assert latency.step_time_us(step_inputs_of(case)) == case["expected_step_time_us"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_regression_bits(case):
    """Regression-only: the exact float64 results the JAX engine must reproduce."""
    cfg = build_physics_config(case["config"])
    alpha = alpha_features(cfg, queue_inputs_of(case))
    beta = beta_features(cfg, step_inputs_of(case))
    bits = case["regression_bits"]
    assert [x.hex() for x in alpha] == bits["alpha"]
    assert [x.hex() for x in beta] == bits["beta"]
    if "coefficients" in case:
        co = case["coefficients"]
        assert queueing_delay_from_features(co["alpha"], alpha) == bits["queueing_delay_us"]
        assert step_time_from_features(co["beta"], beta) == bits["step_time_us"]


# ------------------------------------------------ worked example (docs/latency-models.md §P.11)

WORKED = next((c for c in CASES if c["provenance"] == "worked example"), {})
PRINTED = WORKED.get("printed_worked_example", {})


def _half_unit_of_last_digit(printed: float) -> float:
    text = f"{printed!r}"
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def _check_printed(entry: dict, actual: float) -> None:
    printed, status = entry["printed"], entry["status"]
    if status == "exact":
        assert close(actual, float(printed)), (entry, actual)
    elif status == "rounded":
        assert abs(actual - printed) <= _half_unit_of_last_digit(printed), (entry, actual)
    else:
        assert status == "printed_arithmetic_error"
        assert abs(actual - printed) > _half_unit_of_last_digit(printed), (entry, actual)


def test_worked_example_constants():
    cfg = build_physics_config(WORKED["config"])
    for entry in PRINTED["constants"]:
        _check_printed(entry, getattr(cfg, entry["name"]))
    _check_printed(
        PRINTED["roofline_weight_branch"], cfg.weight_bytes_total / cfg.hw_peak_bandwidth
    )
    # The exact values asserted to 1e-10 (stated in §P.11, not just the oracle).
    assert cfg.kv_dim == 1024 and cfg.kv_bytes_per_token == 262_144
    assert cfg.flops_attn_linear == 83_886_080 == cfg.weight_bytes_attn
    assert cfg.hw_peak_flops == 9.89e14 and cfg.hw_peak_bandwidth == 3.35e12
    assert cfg.comm_bytes_per_token == 0.0


def test_worked_example_printed_slips_are_not_ours():
    """Each value marked printed_arithmetic_error is reproduced from the printed arithmetic."""
    wrong_flops, wrong_roofline = 15_025_995_776, 0.12435
    assert 7.778e-3 <= 512 * wrong_flops / 9.89e14 < 7.779e-3  # 7.7789e-3, truncated
    assert 0.74625 * math.log(9) * wrong_roofline == pytest.approx(0.20389, abs=5e-6)
    assert 32 * (83_886_080 + 352_845_824) + 1_050_574_848 == wrong_flops
    assert 3 * 2 * 4096 * 14336 != 352_845_824 and 2 * 4096 * 128256 != 1_050_574_848
    assert 68_719_476_736 / 9.89e14 == pytest.approx(6.948e-5, abs=5e-9)


def test_worked_example_features():
    cfg = build_physics_config(WORKED["config"])
    q = queue_inputs_of(WORKED)
    gate = PRINTED["gate"]
    s = min(1.0, q.running_depth / cfg.max_num_seqs)
    assert close(s, gate["s"]) and close(q.kv_usage_ratio, gate["m"])
    assert close(congestion_gate(cfg, q.running_depth, q.kv_usage_ratio), gate["g"])
    alpha = alpha_features(cfg, q)
    for entry in PRINTED["alpha"]:
        _check_printed(entry, alpha[entry["index"] - 1])
    beta = beta_features(cfg, step_inputs_of(WORKED))
    for entry in PRINTED["beta"]:
        _check_printed(entry, beta[entry["index"] - 1])
    exact = [e for e in PRINTED["alpha"] + PRINTED["beta"] if e["status"] == "exact"]
    assert len(exact) == 20  # + 2 rounded + 5 printed_arithmetic_error = 27


def test_chunk_differs_from_full_prefill():
    """§P.4: a 512 chunk at 1024 has attention work 1536·512, not 4096²."""
    by_id = {c["id"]: c for c in CASES}
    full = by_id["worked_example_config_prefill_full_4096"]
    chunk = by_id["worked_example_config_prefill_chunk_512_at_1024"]
    assert full["beta_input"]["sum_prefill_attn_work"] == 4096 * 4096
    assert chunk["beta_input"]["sum_prefill_attn_work"] == 1536 * 512
    assert full["expected_beta_features"][1] > 20 * chunk["expected_beta_features"][1]


# --------------------------------------------------------------------------- primitives


@pytest.mark.parametrize("w", [0, 1, 2, 3, 8, 9, 100, 999, 1000, 4095, 65535, 10**6, 2**40])
def test_log1p_int_accuracy(w):
    exact = Fraction(Decimal(1 + w).ln(Context(prec=60)))
    got = log1p_int(w)
    assert abs(Fraction(got) - exact) <= Fraction(2) * Fraction(math.ulp(got) if got else 0)


def test_log1p_int_boundaries():
    assert log1p_int(0) == 0.0
    assert log1p_int(1) == math.log(2.0)
    assert log1p_int(1000) == pytest.approx(6.9087547793152204, rel=1e-15)


def test_pow_int_boundaries():
    assert pow_int(0.75, 0) == 1.0
    assert pow_int(0.75, 1) == 0.75
    assert pow_int(0.75, 50) == pytest.approx(float(Fraction(3, 4) ** 50), rel=1e-14)
    assert pow_int(0.75, 2048) == pytest.approx(float(Fraction(3, 4) ** 2048), rel=1e-13)
    assert 1.0 - pow_int(0.75, 2048) == 1.0
    assert pow_int(0.75, 8192) == 0.0


def test_update_preemption_ema():
    assert update_preemption_ema(0.0, 0, 10, 0.3) == 0.0
    assert update_preemption_ema(0.0, 2, 8, 0.3) == 0.3 * 0.25
    ema = update_preemption_ema(0.5, 1, 0, 0.3)  # running_depth 0 -> denominator 1
    assert ema == 0.3 * 1.0 + 0.7 * 0.5


def test_queue_inputs_from_state():
    cfg = build_physics_config(WORKED["config"])
    cfg_prefix = build_physics_config(
        {**WORKED["config"], "vllm": {**WORKED["config"]["vllm"], "prefix_caching_enabled": True}}
    )
    q = PhysicsQueueInputs.from_state(
        cfg_prefix,
        running_depth=3,
        waiting_depth=2,
        kv_used_blocks=1000,
        prompt_tokens=100,
        prefix_cached_blocks=4,
        preemption_ema=0.1,
    )
    assert q.kv_usage_ratio == 0.25
    assert q.prefix_hit_ratio == 64 / 100
    assert q.kv_free_bytes == 4000 * cfg.block_size_bytes * 0.75
    full = PhysicsQueueInputs.from_state(
        cfg,
        running_depth=3,
        waiting_depth=2,
        kv_used_blocks=4000,
        prompt_tokens=100,
        prefix_cached_blocks=4,
        preemption_ema=0.0,
    )
    assert full.prefix_hit_ratio == 0.0  # prefix caching off in the worked example
    assert full.kv_free_bytes == 4000 * cfg.block_size_bytes * 1e-6


def test_physics_latency_end_to_end_with_shipped_placeholder():
    coeffs = shipped_physics_coefficients()["illustrative-placeholder.yaml"]
    assert coeffs.status == "illustrative"
    model = load_model_config("meta-llama/llama-3.1-8b-instruct")
    knobs = VLLMKnobs(max_num_seqs=256, max_num_batched_tokens=2048, total_kv_blocks_gpu=7463)
    latency = PhysicsLatency.build(model, load_hardware("H100"), 1, knobs, coeffs)
    batch = StepBatch(
        new_tokens=[512, 1],
        progress_index=[0, 600],
        input_tokens=[512, 600],
        output_tokens=[10, 10],
    )
    step = latency.step_inputs(batch, preemption_ema=0.0)
    assert step.prefill_tokens == 512 and step.decode_tokens == 1
    assert step.sum_decode_kv_blocks == math.ceil(601 / 16)
    assert latency.step_time_us(step) == 1  # all-zero placeholder: the 1 µs minimum
    q = PhysicsQueueInputs(
        running_depth=1,
        waiting_depth=0,
        kv_usage_ratio=0.1,
        prompt_tokens=100,
        prefix_hit_ratio=0.0,
        kv_free_bytes=1e9,
        preemption_ema=0.0,
    )
    assert latency.queueing_delay_us(q) == 0
    assert latency.output_token_processing_us == 0 and latency.post_decode_overhead_us == 0
    assert latency.update_preemption_ema(0.0, 1, 4) == 0.3 * 0.25
    warnings = coeffs.compatibility_warnings("meta-llama/llama-3.1-8b-instruct", "A100-SXM", 2)
    assert len(warnings) == 3  # illustrative, hardware, tp


def test_default_extras_match_fixture_values():
    for case in CASES:
        hw = case["config"]["hardware"]
        if hw["name"] in DEFAULT_HARDWARE_EXTRAS:
            extras = default_hardware_extras(hw["name"])
            assert (
                extras.pcie_bandwidth_gb_s,
                extras.pcie_efficiency,
                extras.interconnect_bandwidth_gb_s,
            ) == (
                hw["pcie_bandwidth_gb_s"],
                hw["pcie_efficiency"],
                hw["interconnect_bandwidth_gb_s"],
            )


# --------------------------------------------------------------------------- validation errors

LLAMA = load_model_config("meta-llama/llama-3.1-8b-instruct")


def _knobs(**kw):
    base = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "total_kv_blocks_gpu": 100}
    base.update(kw)
    return VLLMKnobs(**base)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", -5),
        ("max_num_seqs", 0),
        ("total_kv_blocks_gpu", 0),
        ("block_size_tokens", 0),
        ("total_kv_blocks_cpu", -1),
        ("gpu_memory_utilization", 1.5),
        ("cpu_offloading", "yes"),
    ],
)
def test_vllm_knobs_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^vllm_knobs\.{field}: "):
        _knobs(**{field: value})


def test_physics_config_errors():
    with pytest.raises(ConfigError, match=r"^tp: "):
        PhysicsConfig.build(LLAMA, load_hardware("H100"), 0, _knobs())
    with pytest.raises(ConfigError, match=r"^hardware_extras: .*L40S"):
        PhysicsConfig.build(LLAMA, load_hardware("L40S"), 1, _knobs())
    with pytest.raises(ConfigError, match=r"^hardware_extras\.pcie_efficiency: "):
        PhysicsHardwareExtras(64.0, 900.0, 0.0)
    with pytest.raises(ConfigError, match=r"^model\.vocab_size: "):
        PhysicsConfig.build(
            load_model_config("meta-llama/llama-2-7b-hf").__class__(
                name="x",
                num_layers=2,
                hidden_dim=8,
                num_heads=2,
                intermediate_dim=8,
                bytes_per_param=2.0,
            ),
            load_hardware("H100"),
            1,
            _knobs(),
        )
    # L40S works with explicit extras.
    cfg = PhysicsConfig.build(
        LLAMA, load_hardware("L40S"), 1, _knobs(), PhysicsHardwareExtras(32.0, 32.0)
    )
    assert cfg.hw_pcie_bandwidth_eff == 32e9 * 0.75


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"running_depth": -1}, "running_depth"),
        ({"waiting_depth": 1.5}, "waiting_depth"),
        ({"kv_usage_ratio": float("nan")}, "kv_usage_ratio"),
        ({"prefix_hit_ratio": 1.5}, "prefix_hit_ratio"),
        ({"kv_free_bytes": -1.0}, "kv_free_bytes"),
        ({"preemption_ema": float("inf")}, "preemption_ema"),
    ],
)
def test_queue_inputs_errors(kwargs, field):
    base = {
        "running_depth": 1,
        "waiting_depth": 0,
        "kv_usage_ratio": 0.1,
        "prompt_tokens": 10,
        "prefix_hit_ratio": 0.0,
        "kv_free_bytes": 1.0,
        "preemption_ema": 0.0,
    }
    with pytest.raises(ConfigError, match=rf"^queue_inputs\.{field}: "):
        PhysicsQueueInputs(**{**base, **kwargs})


def test_step_inputs_errors():
    base = {
        "prefill_tokens": 0,
        "decode_tokens": 0,
        "num_prefill_reqs": 0,
        "num_decode_reqs": 0,
        "sum_prefill_attn_work": 0,
        "decode_context_tokens": 0,
        "sum_decode_kv_blocks": 0,
        "preemption_ema": 0.0,
    }
    with pytest.raises(ConfigError, match=r"^step_inputs\.transfer_blocks: "):
        PhysicsStepInputs(**base, transfer_blocks=-1)
    with pytest.raises(ConfigError, match=r"^step_inputs\.preemption_ema: "):
        PhysicsStepInputs(**{**base, "preemption_ema": -0.1})
    with pytest.raises(ConfigError, match=r"^step_inputs\.prefill_tokens: "):
        PhysicsStepInputs(**{**base, "prefill_tokens": True})


def _doc(**changes):
    body = {
        "spec_version": "1.0",
        "status": "trained",
        "trained_on": {"model": "m", "hardware": "H100", "tp": 1, "gamma": 0.3},
        "alpha_coefficients": [1.0] * 11,
        "beta_coefficients": [1.0] * 16,
    }
    body.update(changes)
    return {"physics_coefficients": body}


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (
            {"alpha_coefficients": [1.0] * 10},
            r"alpha_coefficients: must have exactly 11 values, got 10",
        ),
        (
            {"beta_coefficients": [1.0] * 17},
            r"beta_coefficients: must have exactly 16 values, got 17",
        ),
        (
            {"alpha_coefficients": [1.0] * 10 + [float("nan")]},
            r"alpha_coefficients\[10\]: .*finite",
        ),
        ({"beta_coefficients": [float("inf")] + [1.0] * 15}, r"beta_coefficients\[0\]: .*finite"),
        ({"beta_coefficients": ["1"] + [1.0] * 15}, r"beta_coefficients\[0\]: "),
        ({"alpha_coefficients": "1,2"}, r"alpha_coefficients: must be a list"),
        ({"spec_version": "2.0"}, r"spec_version: must be '1.0'"),
        ({"status": "guessed"}, r"status: must be one of"),
        ({"extra": 1}, r"physics_coefficients\.extra: unknown key"),
        ({"trained_on": {"model": "m", "hardware": "H100"}}, r"trained_on\.tp: is required"),
        ({"trained_on": {"model": "m", "hardware": "H100", "tp": 0}}, r"trained_on\.tp: "),
        (
            {"trained_on": {"model": "m", "hardware": "H100", "tp": 1, "gamma": 0}},
            r"trained_on\.gamma: ",
        ),
        (
            {"trained_on": {"model": "m", "hardware": "H100", "tp": 1, "lambda_beta": -1}},
            r"trained_on\.lambda_beta: ",
        ),
        (
            {"trained_on": {"model": "m", "hardware": "H100", "tp": 1, "colour": "red"}},
            r"trained_on\.colour: unknown key",
        ),
    ],
)
def test_coefficient_validation_errors_name_the_field(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_physics_coefficients(_doc(**changes))


def test_coefficient_missing_fields():
    doc = _doc()
    del doc["physics_coefficients"]["beta_coefficients"]
    with pytest.raises(ConfigError, match=r"physics_coefficients\.beta_coefficients: is required"):
        parse_physics_coefficients(doc)
    with pytest.raises(ConfigError, match=r"single key"):
        parse_physics_coefficients({"coefficients": {}})


def test_coefficient_file_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "physics_coefficients:\n"
        "  spec_version: '1.0'\n  status: trained\n  source: unit test\n"
        "  trained_on: {model: m, hardware: H100, tp: 2, training_date: 2026-02-17,\n"
        "               n_samples_beta: 12000, hold_out_rmse_beta: 45.2, gamma: 0.1}\n"
        f"  alpha_coefficients: {[0.5] * 11}\n  beta_coefficients: {[2.0] * 16}\n"
    )
    c = load_physics_coefficients(path)
    assert c.tp == 2 and c.gamma == 0.1 and c.alpha == (0.5,) * 11
    assert dict(c.metadata) == {
        "training_date": "2026-02-17",
        "n_samples_beta": 12000,
        "hold_out_rmse_beta": 45.2,
    }
    path.write_text("physics_coefficients:\n  alpha_coefficients: [.nan\n")
    with pytest.raises(ConfigError, match=r"invalid YAML"):
        load_physics_coefficients(path)
    with pytest.raises(ConfigError, match=r"cannot read"):
        load_physics_coefficients(tmp_path / "missing.yaml")


def test_physics_coefficients_constructor_validates():
    with pytest.raises(ConfigError, match=r"^alpha_coefficients: must have exactly 11"):
        PhysicsCoefficients(alpha=(1.0,), beta=(1.0,) * 16, model="m", hardware="h", tp=1)
    with pytest.raises(ConfigError, match=r"^trained_on\.gamma: "):
        PhysicsCoefficients(
            alpha=(1.0,) * 11, beta=(1.0,) * 16, model="m", hardware="h", tp=1, gamma=1.5
        )


def test_vllm_knobs_from_engine_config():
    from blisjax.config import EngineConfig

    engine = EngineConfig(
        max_num_running_reqs=64,
        max_num_scheduled_tokens=4096,
        block_size_tokens=32,
        enable_prefix_caching=False,
    )
    knobs = VLLMKnobs.from_engine(engine, total_kv_blocks_gpu=1234)
    assert (knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.block_size_tokens) == (
        64,
        4096,
        32,
    )
    assert knobs.total_kv_blocks_gpu == 1234 and not knobs.prefix_caching_enabled
    assert knobs.chunked_prefill_enabled and not knobs.cpu_offloading
