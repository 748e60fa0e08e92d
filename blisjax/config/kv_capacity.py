"""KV-cache capacity of one instance, bit-exact with BLIS ``CalculateKVBlocks`` (docs/roofline.md §4).

Every float operation below is one binary64 operation in the order BLIS evaluates it; integer
steps use Python ints (BLIS int64; all realistic values are far below 2^63).
"""

from __future__ import annotations

import math

from blisjax.config.hardware import HardwareConfig
from blisjax.config.model import ModelConfig

GIB_BYTES = 1 << 30
#: Activation memory reserved per replica, GiB (llm-d capacity-planner constants BLIS uses).
ACTIVATION_GIB_DENSE = 5.5
ACTIVATION_GIB_MOE = 8.0
#: Non-PyTorch memory (CUDA context, NCCL buffers) per GPU, GiB.
NON_TORCH_GIB_PER_GPU_TP1 = 0.15
NON_TORCH_GIB_PER_GPU_TP_MULTI = 0.6
#: Activations BLIS's weight estimate supports (3-matrix gated MLP); "" = unspecified.
SUPPORTED_HIDDEN_ACTS = ("silu", "swiglu", "geglu", "situ", "")


class KVCapacityParamsError(ValueError):
    """BLIS could not extract capacity parameters (its CLI then keeps 1,000,000 blocks)."""


def _check_capacity_params(model: ModelConfig) -> None:
    # BLIS ExtractKVCapacityParams: MoE activation fields without an expert count.
    if not model.is_moe and (model.num_shared_experts > 0 or model.num_experts_per_tok > 0):
        raise KVCapacityParamsError(
            f"model {model.name!r} looks MoE (n_shared_experts={model.num_shared_experts}, "
            f"num_experts_per_tok={model.num_experts_per_tok}) but has no expert count"
        )


def _check_inputs(
    model: ModelConfig,
    hardware: HardwareConfig,
    dp: int,
    block_size_tokens: int,
    gpu_memory_utilization: float,
) -> None:
    util = gpu_memory_utilization
    if not (math.isfinite(util) and 0 < util <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens}")
    if dp < 1:
        raise ValueError(f"data parallelism (dp) must be >= 1, got {dp}")
    if model.intermediate_dim <= 0:
        raise ValueError(f"model intermediate_size must be > 0, got {model.intermediate_dim}")
    if model.vocab_size <= 0:
        raise ValueError(f"model vocab_size must be > 0, got {model.vocab_size}")
    mem = hardware.memory_gib
    if not (math.isfinite(mem) and mem > 0):
        raise ValueError(f"GPU memory_gib of {hardware.name!r} must be > 0, got {mem!r}")
    wbpp = model.weight_bytes_per_param
    if wbpp != 0 and not (math.isfinite(wbpp) and wbpp > 0):
        raise ValueError(f"model weight_bytes_per_param must be > 0 when set, got {wbpp!r}")
    if model.hidden_act not in SUPPORTED_HIDDEN_ACTS:
        raise ValueError(
            f"unsupported hidden_act {model.hidden_act!r}; KV capacity supports "
            f"{', '.join(repr(a) for a in SUPPORTED_HIDDEN_ACTS)}"
        )


def kv_bytes_per_token_per_gpu(model: ModelConfig, tp: int) -> float:
    """KV-cache bytes one token occupies on one GPU (BLIS ``KVBytesPerToken``), a float.

    MLA latents are replicated across TP ranks (not divided by TP); standard K/V heads are
    sharded (divided by TP). Raises ValueError for the cases BLIS rejects.
    """
    if tp <= 0:
        raise ValueError(f"tensor parallelism (tp) must be > 0, got {tp}")
    for name in ("num_layers", "num_heads", "hidden_dim"):
        if getattr(model, name) <= 0:
            raise ValueError(f"model {name} must be > 0, got {getattr(model, name)}")
    bpp = model.bytes_per_param
    if not (math.isfinite(bpp) and bpp > 0):
        raise ValueError(f"model bytes_per_param must be > 0 (known dtype), got {bpp!r}")
    if model.is_mla:
        per_token = (
            float(model.num_layers) * float(model.kv_lora_rank + model.qk_rope_head_dim) * bpp
        )
    else:
        per_token = _standard_kv_bytes(model, tp)
    if per_token <= 0:
        raise ValueError(f"per-token KV bytes must be > 0, got {per_token!r}")
    return per_token


def _standard_kv_bytes(model: ModelConfig, tp: int) -> float:
    if model.config_head_dim <= 0 and model.hidden_dim % model.num_heads != 0:
        raise ValueError(
            f"hidden_size {model.hidden_dim} must be divisible by num_attention_heads "
            f"{model.num_heads} when head_dim is not given"
        )
    kv_heads = model.num_kv_heads
    if kv_heads < 0:
        raise ValueError(f"model num_kv_heads must be >= 0, got {kv_heads}")
    kv_heads = kv_heads or model.num_heads
    # Fewer KV heads than TP ranks is accepted (vLLM replicates them; BLIS underestimates).
    if kv_heads >= tp and kv_heads % tp != 0:
        raise ValueError(f"num_kv_heads {kv_heads} must be divisible by tp {tp}")
    per_model = float(model.num_layers) * 2.0 * float(model.head_dim) * float(kv_heads)
    return per_model * model.bytes_per_param / float(tp)


def model_weight_bytes(model: ModelConfig) -> int:
    """Weight bytes BLIS reserves: trunc(total_parameters × effective weight bytes/param)."""
    return int(float(model.total_parameters) * model.effective_weight_bytes_per_param)


def _overhead_gib(weight_gib: float, is_moe: bool, tp: int) -> float:
    activation = ACTIVATION_GIB_MOE if is_moe else ACTIVATION_GIB_DENSE
    per_gpu = NON_TORCH_GIB_PER_GPU_TP1 if tp == 1 else NON_TORCH_GIB_PER_GPU_TP_MULTI
    # BLIS adds a LoRA-adapter term (0 without adapters); adding 0.0 changes nothing.
    return weight_gib + activation + per_gpu * float(tp)


def _minimum_tp(weight_gib: float, is_moe: bool, per_gpu_gib: float) -> int | None:
    for tp in range(1, 1025):
        if _overhead_gib(weight_gib, is_moe, tp) < per_gpu_gib * float(tp):
            return tp
    return None


def compute_total_kv_blocks(
    model: ModelConfig,
    hardware: HardwareConfig,
    tp: int,
    dp: int,
    block_size_tokens: int,
    gpu_memory_utilization: float = 0.9,
) -> int:
    """KV blocks of one instance (``tp`` GPUs per replica, ``dp`` replicas), as BLIS computes.

    Budget = memory_gib · util · tp, minus weights, activations (5.5 GiB dense / 8 GiB MoE) and
    non-torch memory (0.15 GiB at TP 1, else 0.6 GiB per GPU); divided into blocks of
    ``block_size_tokens`` tokens. MoE models with dp > 1 multiply the blocks by dp.

    Raises:
      KVCapacityParamsError: the config looks MoE but has no expert count.
      ValueError: any other check of docs/roofline.md §4.2–§4.5 fails (message says which).
    """
    _check_capacity_params(model)
    _check_inputs(model, hardware, dp, block_size_tokens, gpu_memory_utilization)
    per_token = kv_bytes_per_token_per_gpu(model, tp)
    per_block_bytes = int(per_token * float(block_size_tokens))
    if per_block_bytes <= 0:
        raise ValueError(f"per-block KV bytes must be > 0, got {per_block_bytes}")
    available_gib = hardware.memory_gib * gpu_memory_utilization * float(tp)
    weight_gib = float(model_weight_bytes(model)) / float(GIB_BYTES)
    overhead_gib = _overhead_gib(weight_gib, model.is_moe, tp)
    if overhead_gib >= available_gib:
        min_tp = _minimum_tp(weight_gib, model.is_moe, hardware.memory_gib * gpu_memory_utilization)
        hint = f"; needs tp >= {min_tp}" if min_tp is not None else ""
        raise ValueError(
            f"model {model.name!r} does not fit on {tp} x {hardware.name}: overhead "
            f"{overhead_gib:.3f} GiB (weights {weight_gib:.3f}) >= available "
            f"{available_gib:.3f} GiB{hint}"
        )
    allocatable_bytes = int((available_gib - overhead_gib) * float(GIB_BYTES))
    blocks = allocatable_bytes // per_block_bytes
    if blocks <= 0:
        raise ValueError(f"no KV blocks fit (allocatable {allocatable_bytes} bytes)")
    if model.is_moe and dp > 1:
        # Each DP rank of an MoE deployment is its own engine with a full KV budget.
        blocks *= dp
    return blocks
