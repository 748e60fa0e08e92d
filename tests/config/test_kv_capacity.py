"""KV-block capacity: every worked number of docs/roofline.md §5 and §6."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import (
    KVCapacityParamsError,
    ModelConfig,
    compute_total_kv_blocks,
    kv_bytes_per_token_per_gpu,
    load_hardware,
    load_model_config,
    model_weight_bytes,
)

LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"


def test_llama_8b_h100_worked_example():
    model, hw = load_model_config(LLAMA_8B), load_hardware("H100")
    per_token = kv_bytes_per_token_per_gpu(model, 1)
    assert per_token == 131072.0
    assert int(per_token * 16) == 2097152
    assert model.total_parameters == 8030261248
    assert model_weight_bytes(model) == 16060522496
    assert model_weight_bytes(model) / 2**30 == 14.957527160644531
    assert compute_total_kv_blocks(model, hw, tp=1, dp=1, block_size_tokens=16) == 26312


@pytest.mark.parametrize(
    "model_name, gpu, tp, blocks",
    [
        ("mixtral-8x7b-v0.1", "H100", 2, 48956),
        ("qwen3-30b-a3b", "H100", 1, 5276),
        ("llama-4-scout-17b-16e-instruct-fp8-dynamic", "H100", 4, 249660),
        ("deepseek-v2-lite", "A100-80", 1, 74312),
        ("llama-3.1-8b-instruct", "A100-80", 1, 26312),
        ("llama-3.1-70b-instruct", "H100", 4, 121801),
    ],
)
def test_go_verified_table(model_name, gpu, tp, blocks):
    model, hw = load_model_config(model_name), load_hardware(gpu)
    assert compute_total_kv_blocks(model, hw, tp, 1, 16, 0.9) == blocks


def test_glm_on_8_h100_does_not_fit():
    model, hw = load_model_config("glm-5.2-fp8"), load_hardware("H100")
    with pytest.raises(ValueError, match="does not fit") as err:
        compute_total_kv_blocks(model, hw, 8, 1, 16, 0.9)
    assert "tp >=" in str(err.value)


def test_dp_scales_moe_only():
    h100 = load_hardware("H100")
    mixtral = load_model_config("mixtral-8x7b-v0.1")
    assert compute_total_kv_blocks(mixtral, h100, 2, 2, 16) == 2 * 48956
    llama = load_model_config(LLAMA_8B)
    assert compute_total_kv_blocks(llama, h100, 1, 3, 16) == 26312


def test_mla_per_token_not_divided_by_tp():
    model = load_model_config("deepseek-v2-lite")
    assert (
        kv_bytes_per_token_per_gpu(model, 1)
        == kv_bytes_per_token_per_gpu(model, 2)
        == 27 * 576 * 2.0
    )


def test_standard_per_token_divided_by_tp_and_few_kv_heads_accepted():
    model = load_model_config("qwen2.5-7b-instruct")  # 4 KV heads, head dim 3584/28 = 128
    assert kv_bytes_per_token_per_gpu(model, 2) == 28 * 2 * 128 * 4 * 2 / 2
    assert kv_bytes_per_token_per_gpu(model, 8) == 28 * 2 * 128 * 4 * 2 / 8  # kvh < TP: accepted


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"dp": 0}, "dp"),
        ({"tp": 0}, "tp"),
        ({"tp": 3}, "divisible by tp 3"),
    ],
)
def test_input_errors(kwargs, match):
    args = dict(
        model=load_model_config(LLAMA_8B),
        hardware=load_hardware("H100"),
        tp=1,
        dp=1,
        block_size_tokens=16,
        gpu_memory_utilization=0.9,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_total_kv_blocks(**args)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"intermediate_dim": 0}, "intermediate_size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"bytes_per_param": 0.0}, "bytes_per_param"),
        ({"weight_bytes_per_param": -1.0}, "weight_bytes_per_param"),
        ({"hidden_dim": 4100}, "divisible"),
    ],
)
def test_model_errors(change, match):
    model = dataclasses.replace(load_model_config(LLAMA_8B), **change)
    with pytest.raises(ValueError, match=match):
        compute_total_kv_blocks(model, load_hardware("H100"), 1, 1, 16)


def test_situ_and_empty_activation_supported():
    base = load_model_config(LLAMA_8B)
    for act in ("situ", "", "swiglu", "geglu"):
        model = dataclasses.replace(base, hidden_act=act)
        assert compute_total_kv_blocks(model, load_hardware("H100"), 1, 1, 16) == 26312


def test_zero_memory_is_an_error():
    hw = dataclasses.replace(load_hardware("H100"), memory_gib=0.0)
    with pytest.raises(ValueError, match="memory_gib"):
        compute_total_kv_blocks(load_model_config(LLAMA_8B), hw, 1, 1, 16)


def test_moe_hints_without_expert_count():
    model = ModelConfig.from_hf(
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
            "torch_dtype": "bfloat16",
            "n_shared_experts": 1,
        }
    )
    with pytest.raises(KVCapacityParamsError):
        compute_total_kv_blocks(model, load_hardware("H100"), 1, 1, 16)


def test_tied_embeddings_drop_lm_head():
    base = load_model_config(LLAMA_8B)
    tied = dataclasses.replace(base, tie_word_embeddings=True)
    assert base.total_parameters - tied.total_parameters == 128256 * 4096
