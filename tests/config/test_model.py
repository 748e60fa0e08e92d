"""HF config.json parsing (docs/roofline.md §1.1–§1.3) and contract BC-1 validation
(docs/semantics.md §11)."""

from __future__ import annotations

import json
import math

import pytest

from blisjax.config import ConfigError, ModelConfig, UnknownModelError, load_model_config
from blisjax.config.model import (
    hf_int,
    shipped_models,
    weight_bytes_from_model_name,
    weight_bytes_from_quantization,
)

LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"


def _dense(**overrides) -> ModelConfig:
    """Llama-3.1-8B-shaped config built by hand (its published dimensions)."""
    fields = dict(
        num_layers=32,
        hidden_dim=4096,
        num_heads=32,
        num_kv_heads=8,
        vocab_size=128256,
        intermediate_dim=14336,
        bytes_per_param=2.0,
        hidden_act="silu",
    )
    fields.update(overrides)
    return ModelConfig(**fields)


# ----------------------------------------------------------------------------- dense and MoE models


def test_load_dense_llama_config():
    m = load_model_config(LLAMA_8B)
    assert m.model_type == "llama"
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.num_kv_heads) == (32, 4096, 32, 8)
    assert m.intermediate_dim == 14336 and m.vocab_size == 128256
    assert m.bytes_per_param == 2.0 and m.weight_bytes_per_param == 0.0
    assert m.max_position_embeddings == 131072
    assert not m.is_moe and m.moe is None
    assert m.head_dim == 128
    m.validate()


def test_load_moe_mixtral_config():
    m = load_model_config("mistralai/mixtral-8x7b-v0.1")
    assert m.is_moe
    assert m.moe.num_local_experts == 8
    assert m.moe.num_experts_per_tok == 2
    # No moe_intermediate_size: experts use the dense intermediate size (Mixtral convention).
    assert m.moe.expert_intermediate_size == 14336
    m.validate()


def test_kv_cache_bytes_per_token_scenario():
    assert _dense().kv_cache_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


def test_kv_cache_identical_for_dense_and_moe_with_same_attention():
    dense = load_model_config(LLAMA_8B)
    moe = load_model_config("mixtral-8x7b-v0.1")
    assert dense.kv_cache_bytes_per_token == moe.kv_cache_bytes_per_token == 131072


def test_active_parameters_less_than_total_for_moe():
    m = load_model_config("mixtral-8x7b-v0.1")
    # Public figures for Mixtral-8x7B: 46.7B total, 12.9B active (2 of 8 experts).
    assert m.total_parameters == 46_702_792_704
    assert m.active_parameters_per_token == 12_879_925_248
    assert m.active_parameters_per_token < m.total_parameters


def test_dense_active_equals_total_and_matches_blis_weight_count():
    m = load_model_config(LLAMA_8B)
    # docs/roofline.md §5: params = 8030261248 for Llama-3.1-8B.
    assert m.total_parameters == m.active_parameters_per_token == 8_030_261_248


def test_mla_kv_bytes_use_latent_width():
    m = load_model_config("deepseek-v2-lite")
    assert m.is_mla and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert m.kv_cache_bytes_per_token == 27 * (512 + 64) * 2


# ----------------------------------------------------------------------------- BC-1 rejections


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"num_kv_heads": 40}, "model.num_kv_heads"),
        ({"num_kv_heads": -1}, "model.num_kv_heads"),
        ({"num_layers": 0}, "model.num_layers"),
        ({"hidden_dim": 0}, "model.hidden_dim"),
        ({"num_heads": 0}, "model.num_heads"),
        ({"hidden_dim": 4100}, "model.hidden_dim"),
        ({"bytes_per_param": 0.0}, "model.bytes_per_param"),
        ({"bytes_per_param": 3.0}, "model.bytes_per_param"),
        ({"weight_bytes_per_param": -0.5}, "model.weight_bytes_per_param"),
        ({"weight_bytes_per_param": math.inf}, "model.weight_bytes_per_param"),
        ({"num_local_experts": 8, "num_experts_per_tok": 0}, "model.num_experts_per_tok"),
        ({"num_local_experts": 8, "num_experts_per_tok": 9}, "model.num_experts_per_tok"),
        ({"num_experts_per_tok": 2}, "model.num_experts_per_tok"),
        ({"num_local_experts": -2}, "model.num_local_experts"),
        (
            {"num_local_experts": 8, "num_experts_per_tok": 2, "moe_expert_ffn_dim": -1},
            "model.moe_expert_ffn_dim",
        ),
    ],
)
def test_invalid_model_rejected_naming_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        _dense(**overrides).validate()
    assert err.value.path == field
    assert str(err.value).startswith(f"{field}: must ")


def test_explicit_head_dim_allows_indivisible_hidden():
    _dense(hidden_dim=4100, config_head_dim=128).validate()


def test_every_shipped_model_parses_and_is_valid():
    names = shipped_models()
    assert "llama-3.1-8b-instruct" in names and len(names) == 13
    for name in names:
        load_model_config(name).validate()


# ----------------------------------------------------------------------------- parsing rules


def test_get_int_semantics():
    hf = {"a": 3.9, "b": -2.7, "c": "7", "d": True, "e": None, "f": {"x": 1}, "g": 12}
    assert [hf_int(hf, k) for k in "abcdefg"] == [3, -2, 0, 0, 0, 0, 12]
    assert hf_int(hf, "missing") == 0


def test_kv_head_fallbacks_and_mha_default():
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8}
    assert ModelConfig.from_hf({**base, "num_kv_heads": 2}).num_kv_heads == 2
    assert ModelConfig.from_hf({**base, "multi_query_group_num": 4}).num_kv_heads == 4
    assert (
        ModelConfig.from_hf({**base, "num_key_value_heads": 0, "num_kv_heads": 1}).num_kv_heads == 1
    )
    assert ModelConfig.from_hf(base).num_kv_heads == 8


def test_intermediate_fallback_to_ffn_hidden_size():
    assert ModelConfig.from_hf({"ffn_hidden_size": 1000}).intermediate_dim == 1000
    assert ModelConfig.from_hf({"intermediate_size": 5, "ffn_hidden_size": 9}).intermediate_dim == 5


def test_expert_count_resolution_order_and_single_expert_is_dense():
    assert ModelConfig.from_hf({"num_local_experts": 8, "num_experts": 4}).num_local_experts == 4
    assert ModelConfig.from_hf({"num_experts": 1, "n_routed_experts": 64}).num_local_experts == 64
    single = ModelConfig.from_hf({"num_local_experts": 1})
    assert single.num_local_experts == 0 and not single.is_moe


@pytest.mark.parametrize(
    "hf, bpp",
    [
        ({"torch_dtype": "bfloat16"}, 2.0),
        ({"torch_dtype": "float32"}, 4.0),
        ({"torch_dtype": "float16"}, 2.0),
        ({"torch_dtype": "int4"}, 1.0),
        ({"dtype": "float16"}, 2.0),
        ({"torch_dtype": "float8_e4m3fn", "dtype": "bfloat16"}, 0.0),  # no fall back to dtype
        ({"torch_dtype": "BFloat16"}, 0.0),  # case-sensitive
        ({"torch_dtype": 2, "dtype": "float32"}, 4.0),  # non-string torch_dtype is ignored
        ({}, 0.0),
    ],
)
def test_dtype_bytes(hf, bpp):
    assert ModelConfig.from_hf(hf).bytes_per_param == bpp


def test_text_config_pivot_llama4_scout():
    m = load_model_config("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic")
    assert (m.num_layers, m.hidden_dim, m.num_heads, m.num_kv_heads) == (48, 5120, 40, 8)
    assert m.moe.num_local_experts == 16 and m.moe.num_experts_per_tok == 1
    assert m.interleave_moe_layer_step == 1 and m.dense_intermediate_dim == 16384
    assert m.weight_bytes_per_param == 1.0  # compressed-tensors, weights num_bits 8
    assert m.bytes_per_param == 2.0


def test_glm_dtype_key_and_fp8_quant_method():
    m = load_model_config("zai-org/glm-5.2-fp8")
    assert m.bytes_per_param == 2.0 and m.weight_bytes_per_param == 1.0
    assert m.head_dim == 192  # explicit head_dim, while hidden/heads = 96


@pytest.mark.parametrize(
    "quant, wbpp",
    [
        ({"bits": 4}, 0.5),
        ({"bits": "8"}, 1.0),
        ({"bits": "+4"}, 0.5),
        ({"bits": "4bit", "quant_method": "fp8"}, 1.0),  # Atoi fails -> 0 -> quant_method
        ({"bits": 0, "quant_method": "FP8"}, 1.0),
        ({"quant_method": "awq"}, 0.0),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_b": {"weights": {"num_bits": 8}},
                    "group_a": {"weights": {"num_bits": 4}},
                },
            },
            0.5,
        ),
        (
            {
                "quant_method": "Compressed-Tensors",
                "config_groups": {
                    "g0": {"weights": {"num_bits": 0}},
                    "g1": {"weights": {"num_bits": 8}},
                },
            },
            1.0,
        ),
        ("not an object", 0.0),
    ],
)
def test_weight_bytes_from_quantization(quant, wbpp):
    assert weight_bytes_from_quantization(quant) == wbpp


@pytest.mark.parametrize(
    "name, wbpp",
    [
        ("org/Model-W4A16", 0.5),
        ("neuralmagic/llama-3-8b-w8a8", 1.0),
        ("org/model-fp8", 1.0),
        ("org/model-FP8-dynamic", 1.0),
        ("org/fp8model", 0.0),
        ("org/model-w4a16x", 0.0),
        ("meta-llama/llama-3.1-8b-instruct", 0.0),
    ],
)
def test_weight_bytes_from_model_name(name, wbpp):
    assert weight_bytes_from_model_name(name) == wbpp


def test_name_fallback_only_when_config_has_no_quantization(tmp_path):
    quantized = {"torch_dtype": "bfloat16", "quantization_config": {"bits": 8}}
    assert ModelConfig.from_hf(quantized, name="org/m-w4a16").weight_bytes_per_param == 1.0
    assert (
        ModelConfig.from_hf({"torch_dtype": "bfloat16"}, name="org/m-w4a16").weight_bytes_per_param
        == 0.5
    )


def test_negative_fields_rejected_at_parse():
    for key in ("head_dim", "kv_lora_rank", "qk_rope_head_dim", "first_k_dense_replace"):
        with pytest.raises(ConfigError, match=f"model.{key}: must be >= 0"):
            ModelConfig.from_hf({key: -1})


def test_shared_expert_dims():
    hf = {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "ffn_hidden_size": 300,
    }
    m = ModelConfig.from_hf(hf)
    # Model rule falls back to ffn_hidden_size; the capacity rule reads intermediate_size only.
    assert m.shared_expert_ffn_dim == 600
    assert m.capacity_shared_expert_ffn_dim == 0
    m2 = ModelConfig.from_hf({**hf, "moe_intermediate_size": 50})
    assert m2.shared_expert_ffn_dim == m2.capacity_shared_expert_ffn_dim == 100
    m3 = ModelConfig.from_hf({**hf, "shared_expert_intermediate_size": 77})
    assert m3.shared_expert_ffn_dim == 77


def test_tie_word_embeddings_must_be_json_bool():
    assert ModelConfig.from_hf({"tie_word_embeddings": True}).tie_word_embeddings
    assert not ModelConfig.from_hf({"tie_word_embeddings": 1}).tie_word_embeddings


# ----------------------------------------------------------------------------- loading


def test_name_resolution_variants():
    by_id = load_model_config("Meta-Llama/Llama-3.1-8B-Instruct")
    by_name = load_model_config("llama-3.1-8b-instruct")
    assert by_id == ModelConfig(**{**by_name.__dict__, "name": by_id.name})
    assert by_id.name == "Meta-Llama/Llama-3.1-8B-Instruct"


def test_load_from_file_and_directory(tmp_path):
    hf = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "torch_dtype": "float16",
    }
    d = tmp_path / "tiny-fp8"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf))
    from_dir = load_model_config(d)
    from_file = load_model_config(str(d / "config.json"))
    assert from_dir == from_file
    assert from_dir.num_layers == 2 and from_dir.bytes_per_param == 2.0
    assert from_dir.weight_bytes_per_param == 1.0  # name hint "fp8" from the directory name


def test_unknown_model_lists_shipped():
    with pytest.raises(UnknownModelError) as err:
        load_model_config("nobody/no-such-model")
    assert "llama-3.1-8b-instruct" in str(err.value) and "mixtral-8x7b-v0.1" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_directory_without_config_json(tmp_path):
    with pytest.raises(UnknownModelError, match="no config.json"):
        load_model_config(tmp_path)


def test_invalid_json_rejected(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": NaN}')
    with pytest.raises(ValueError, match="invalid config.json"):
        load_model_config(p)
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_model_config(p)


def test_model_config_is_hashable():
    m = load_model_config(LLAMA_8B)
    assert hash(m) == hash(load_model_config(LLAMA_8B))
