"""resolve_config: model + hardware + KV blocks + coefficients, and what needs them."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from blisjax.config import (
    ConfigError,
    EngineConfig,
    LatencyConfig,
    ResolvedConfig,
    SimConfig,
    resolve_config,
)
from blisjax.config.resolve import BLIS_FALLBACK_TOTAL_KV_BLOCKS

# What BLIS 4e179804 picks by itself for llama-3.1-8b-instruct / H100 / TP 1 (its vLLM v0.11.0
# entry; blis-golden-next README, "Blackbox coefficients").
LLAMA_ALPHA = (10326.268121600151, 0.0, 0.0)
LLAMA_BETA = (6472.007648778123, 19.79721387814611, 304.4021040302657)


def test_defaults_resolve():
    r = resolve_config(SimConfig())
    assert isinstance(r, ResolvedConfig)
    assert r.total_kv_blocks == 26312
    assert r.max_model_len == 0
    assert (r.alpha, r.beta) == (LLAMA_ALPHA, LLAMA_BETA)
    assert r.model_config.num_layers == 32 and r.hardware_config.name == "H100"
    assert r.engine is r.config.engine and r.policy is r.config.policy
    assert hash(r) == hash(resolve_config(SimConfig()))


def test_resolved_configs_pickle_with_a_read_only_raw_model_mapping():
    # for user code that sends configurations to other processes (multiprocessing)
    r = resolve_config(SimConfig())
    copy = pickle.loads(pickle.dumps(r))
    assert copy == r and hash(copy) == hash(r)
    assert dict(copy.model_config.raw) == dict(r.model_config.raw) and copy.model_config.raw
    with pytest.raises(TypeError):
        copy.model_config.raw["num_hidden_layers"] = 1


def test_explicit_values_win():
    cfg = SimConfig(
        engine=EngineConfig(total_kv_blocks=7463, max_model_len=4096),
        latency=LatencyConfig(alpha_coeffs=(1.0, 2.0, 3.0), beta_coeffs=(4.0, 5.0, 6.0)),
    )
    r = resolve_config(cfg)
    assert (r.total_kv_blocks, r.max_model_len) == (7463, 4096)
    assert (r.alpha, r.beta) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))


def test_kv_blocks_follow_engine_knobs():
    cfg = SimConfig(
        model="mixtral-8x7b-v0.1",
        engine=EngineConfig(tensor_parallel_size=2),
        latency=LatencyConfig(model="roofline"),
    )
    assert resolve_config(cfg).total_kv_blocks == 48956


def test_max_model_len_must_fit_computed_blocks():
    ok = SimConfig(engine=EngineConfig(max_model_len=26312 * 16))
    assert resolve_config(ok).max_model_len == 26312 * 16
    too_long = SimConfig(engine=EngineConfig(max_model_len=26312 * 16 + 1))
    with pytest.raises(ConfigError) as err:
        resolve_config(too_long)
    assert err.value.path == "engine.max_model_len" and "26313" in str(err.value)


def test_unshipped_model_needs_explicit_blocks_and_coefficients():
    explicit = SimConfig(
        model="ibm-granite/granite-3.1-8b-instruct",
        engine=EngineConfig(tensor_parallel_size=2, total_kv_blocks=105497),
        latency=LatencyConfig(alpha_coeffs=(1.0, 2.0, 3.0), beta_coeffs=(4.0, 5.0, 6.0)),
    )
    r = resolve_config(explicit)
    assert r.model_config is None and r.total_kv_blocks == 105497
    for change in (
        {"engine": EngineConfig(tensor_parallel_size=2)},
        {"latency": LatencyConfig()},
        {"latency": LatencyConfig(model="roofline")},
    ):
        with pytest.raises(ConfigError) as err:
            resolve_config(dataclasses.replace(explicit, **change))
        assert err.value.path == "model" and "llama-3.1-8b-instruct" in str(err.value)


def test_missing_shipped_coefficients_say_to_pass_alpha_beta():
    cfg = SimConfig(engine=EngineConfig(tensor_parallel_size=2))
    with pytest.raises(ConfigError) as err:
        resolve_config(cfg)
    assert err.value.path == "latency.alpha_coeffs"
    assert "alpha_coeffs" in str(err.value) and "beta_coeffs" in str(err.value)


def test_half_given_coefficients_rejected():
    cfg = SimConfig(latency=LatencyConfig(alpha_coeffs=(1.0, 2.0, 3.0)))
    with pytest.raises(ConfigError, match=r"^latency\.beta_coeffs: give both"):
        resolve_config(cfg)


def test_roofline_and_physics_coefficients():
    roof = resolve_config(SimConfig(latency=LatencyConfig(model="roofline")))
    assert (roof.alpha, roof.beta) == ((0.0, 0.0, 0.0), ())
    phys = resolve_config(SimConfig(latency=LatencyConfig(model="physics", beta_coeffs=(1.0, 2.0))))
    assert (phys.alpha, phys.beta) == ((), (1.0, 2.0))


def test_invalid_model_rejected_by_bc1(tmp_path):
    d = tmp_path / "bad-model"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 8,
                "torch_dtype": "bfloat16",
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        )
    )
    with pytest.raises(ConfigError) as err:
        resolve_config(SimConfig(model=str(d), latency=LatencyConfig(model="roofline")))
    assert err.value.path == "model.num_kv_heads"


def test_kv_capacity_failure_is_a_config_error():
    cfg = SimConfig(
        model="glm-5.2-fp8",
        hardware="H100",
        engine=EngineConfig(tensor_parallel_size=8),
        latency=LatencyConfig(model="roofline"),
    )
    with pytest.raises(ConfigError) as err:
        resolve_config(cfg)
    assert err.value.path == "engine.total_kv_blocks" and "does not fit" in str(err.value)


def test_unknown_gpu():
    with pytest.raises(ConfigError, match="unknown GPU 'B300'"):
        resolve_config(SimConfig(hardware="B300"))


def test_gpu_without_memory_falls_back_like_blis(tmp_path):
    path = tmp_path / "hw.json"
    path.write_text(
        json.dumps(
            {"H100": {"TFlopsPeak": 989.5, "BwPeakTBs": 3.35, "mfuPrefill": 0.45, "mfuDecode": 0.3}}
        )
    )
    with pytest.warns(UserWarning, match="1000000"):
        r = resolve_config(SimConfig(), hardware_path=path)
    assert r.total_kv_blocks == BLIS_FALLBACK_TOTAL_KV_BLOCKS == 1_000_000


def test_not_a_sim_config():
    with pytest.raises(ConfigError, match="must be a SimConfig"):
        resolve_config({"model": "x"})  # type: ignore[arg-type]
