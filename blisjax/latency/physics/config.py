"""Configuration of the physics-normalized latency model (docs/latency-models.md §P.2–§P.3).

* :class:`VLLMKnobs` — the vLLM settings the features depend on (§P.2).
* :class:`PhysicsHardwareExtras` — the hardware figures the shipped GPU table lacks (PCIe and
  interconnect bandwidth, PCIe efficiency; §P.2).
* :class:`PhysicsConfig` — every derived constant, computed once per simulation.

Every constant is a float64 computed by the exact sequence of operations written in its comment
(left to right, one rounding per operation). Integer-valued constants of real models are exact
(all intermediate integers stay far below 2**53), so only the hardware ceilings, ``tp`` divisions
and the roofline time carry rounding. Units are given per field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from blisjax.config._checks import (
    ConfigError,
    check_bool,
    check_float,
    check_int,
    set_field,
)
from blisjax.config.hardware import HardwareConfig
from blisjax.config.model import ModelConfig

#: Activations whose MLP has three projections (gate, up, down); "" counts as SwiGLU, as in the
#: KV-capacity estimate. Any other activation gives the 2-projection MLP (up, down).
GATED_HIDDEN_ACTS = ("silu", "swiglu", "geglu", "situ", "")


@dataclass(frozen=True)
class VLLMKnobs:
    """vLLM configuration the physics features read (docs/latency-models.md §P.2).

    Attributes:
      max_num_seqs: max running requests (vLLM ``--max-num-seqs``, blisjax
        ``engine.max_num_running_reqs``), >= 1.
      max_num_batched_tokens: token budget per step (``--max-num-batched-tokens``, blisjax
        ``engine.max_num_scheduled_tokens``), > 0: several features divide by it (§P.2).
      chunked_prefill_enabled: ``--enable-chunked-prefill``; blisjax always schedules vLLM-v1
        style chunked prefill, hence the default True.
      cpu_offloading: ``--cpu-offloading``; gates alpha feature 10 and beta features 13-14.
      gpu_memory_utilization: ``--gpu-memory-utilization``, in (0, 1] (recorded; it only
        matters through ``total_kv_blocks_gpu``).
      prefix_caching_enabled: ``--enable-prefix-caching``; when False the prefix hit ratio is 0.
      block_size_tokens: tokens per KV block, >= 1.
      total_kv_blocks_gpu: KV blocks of the instance, >= 1.
      total_kv_blocks_cpu: CPU-side KV blocks, >= 0 (used only when ``cpu_offloading``).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    total_kv_blocks_gpu: int
    block_size_tokens: int = 16
    chunked_prefill_enabled: bool = True
    cpu_offloading: bool = False
    gpu_memory_utilization: float = 0.9
    prefix_caching_enabled: bool = True
    total_kv_blocks_cpu: int = 0

    def __post_init__(self) -> None:
        p = "vllm_knobs"
        set_field(
            self, "max_num_seqs", check_int(f"{p}.max_num_seqs", self.max_num_seqs, min_value=1)
        )
        set_field(
            self,
            "max_num_batched_tokens",
            check_int(f"{p}.max_num_batched_tokens", self.max_num_batched_tokens, min_value=1),
        )
        for name in ("total_kv_blocks_gpu", "block_size_tokens"):
            set_field(self, name, check_int(f"{p}.{name}", getattr(self, name), min_value=1))
        set_field(
            self,
            "total_kv_blocks_cpu",
            check_int(f"{p}.total_kv_blocks_cpu", self.total_kv_blocks_cpu, min_value=0),
        )
        for name in ("chunked_prefill_enabled", "cpu_offloading", "prefix_caching_enabled"):
            check_bool(f"{p}.{name}", getattr(self, name))
        util = check_float(
            f"{p}.gpu_memory_utilization",
            self.gpu_memory_utilization,
            min_value=0,
            min_open=True,
            max_value=1,
        )
        set_field(self, "gpu_memory_utilization", util)

    @classmethod
    def from_engine(
        cls,
        engine,
        total_kv_blocks_gpu: int,
        *,
        cpu_offloading: bool = False,
        total_kv_blocks_cpu: int = 0,
        chunked_prefill_enabled: bool = True,
    ) -> VLLMKnobs:
        """Map a ``blisjax.config.EngineConfig`` (field mapping of docs/latency-models.md §P.2).

        ``total_kv_blocks_gpu`` is the resolved block count (``engine.total_kv_blocks`` may be
        None until the capacity formula has run).
        """
        return cls(
            max_num_seqs=engine.max_num_running_reqs,
            max_num_batched_tokens=engine.max_num_scheduled_tokens,
            total_kv_blocks_gpu=total_kv_blocks_gpu,
            block_size_tokens=engine.block_size_tokens,
            chunked_prefill_enabled=chunked_prefill_enabled,
            cpu_offloading=cpu_offloading,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            prefix_caching_enabled=engine.enable_prefix_caching,
            total_kv_blocks_cpu=total_kv_blocks_cpu,
        )


@dataclass(frozen=True)
class PhysicsHardwareExtras:
    """Hardware figures the physics model needs beyond ``HardwareConfig``.

    Attributes:
      pcie_bandwidth_gb_s: host-device PCIe bandwidth, GB/s (1e9 bytes/s), > 0.
      interconnect_bandwidth_gb_s: GPU-GPU link bandwidth used by TP all-reduce, GB/s, > 0.
      pcie_efficiency: achieved fraction of PCIe bandwidth, in (0, 1] (default 0.75).
    """

    pcie_bandwidth_gb_s: float
    interconnect_bandwidth_gb_s: float
    pcie_efficiency: float = 0.75

    def __post_init__(self) -> None:
        p = "hardware_extras"
        for name in ("pcie_bandwidth_gb_s", "interconnect_bandwidth_gb_s"):
            value = check_float(f"{p}.{name}", getattr(self, name), min_value=0, min_open=True)
            set_field(self, name, value)
        eff = check_float(
            f"{p}.pcie_efficiency", self.pcie_efficiency, min_value=0, min_open=True, max_value=1
        )
        set_field(self, "pcie_efficiency", eff)


#: Defaults per GPU name (docs/latency-models.md §P.2). H100: PCIe 64 GB/s, efficiency 0.75,
#: NVLink 900 GB/s, the figures of the model's worked example (§P.11). A100: NVIDIA A100 SXM
#: datasheet in the same convention (PCIe Gen4 x16 32 GB/s per direction, NVLink 600 GB/s).
#: Other GPUs need explicit values.
DEFAULT_HARDWARE_EXTRAS: Mapping[str, PhysicsHardwareExtras] = MappingProxyType(
    {
        "H100": PhysicsHardwareExtras(64.0, 900.0, 0.75),
        "A100-SXM": PhysicsHardwareExtras(32.0, 600.0, 0.75),
        "A100-80": PhysicsHardwareExtras(32.0, 600.0, 0.75),
    }
)


def default_hardware_extras(gpu: str) -> PhysicsHardwareExtras:
    """The shipped extras for a GPU name; ConfigError naming ``hardware_extras`` otherwise."""
    try:
        return DEFAULT_HARDWARE_EXTRAS[gpu]
    except KeyError:
        known = ", ".join(DEFAULT_HARDWARE_EXTRAS)
        raise ConfigError(
            "hardware_extras",
            f"no default PCIe/interconnect bandwidth for GPU {gpu!r} (known: {known}); "
            "pass PhysicsHardwareExtras explicitly",
        ) from None


def mlp_projection_count(model: ModelConfig) -> int:
    """``n_mlp_proj``: 3 for gated MLPs (SwiGLU/GeGLU: gate, up, down), else 2 (§P.2)."""
    return 3 if model.hidden_act in GATED_HIDDEN_ACTS else 2


def _check_model(model: ModelConfig) -> None:
    for name in (
        "num_layers",
        "hidden_dim",
        "num_heads",
        "num_kv_heads",
        "vocab_size",
        "intermediate_dim",
    ):
        if getattr(model, name) <= 0:
            raise ConfigError(f"model.{name}", f"must be > 0, got {getattr(model, name)}")
    if model.bytes_per_param <= 0:
        raise ConfigError(
            "model.bytes_per_param", f"must be > 0 (known dtype), got {model.bytes_per_param!r}"
        )
    if model.is_moe and not 1 <= model.num_experts_per_tok <= model.num_local_experts:
        raise ConfigError(
            "model.num_experts_per_tok",
            f"must be in [1, num_local_experts={model.num_local_experts}], "
            f"got {model.num_experts_per_tok}",
        )


@dataclass(frozen=True)
class PhysicsConfig:
    """Derived constants of one (model, hardware, TP, vLLM knobs) deployment (§P.3).

    Build with :meth:`build`. Model quantities (docs/latency-models.md §P.3), with ``h`` = hidden
    size, ``L`` = layers, ``I`` = FFN width (per expert for MoE), ``V`` = vocabulary, ``b`` =
    ``dtype_bytes``, ``n`` = ``n_mlp_proj``, ``k``/``E`` = experts per token / experts:

    Attributes:
      kv_dim: ``(h·num_kv_heads) / num_heads`` (elements).
      flops_attn_linear: ``(4·h)·(h + kv_dim)`` FLOPs per token per layer (Q, K, V, O).
      flops_mlp: ``(((n·2)·h)·I)·moe_factor`` FLOPs per token per layer; ``moe_factor`` = k/E
        for MoE, 1 for dense (as defined, §P.3).
      flops_lm_head: ``(2·h)·V`` FLOPs per token.
      flops_linear_per_token: ``(L·(flops_attn_linear + flops_mlp)) + flops_lm_head`` FLOPs.
      weight_bytes_attn: ``(((2·h)·h) + ((2·h)·kv_dim))·b`` bytes per layer.
      weight_bytes_mlp: ``(((n·h)·I)·moe_weight_factor)·b`` bytes per layer; factor k for MoE.
      weight_bytes_total: ``L·(weight_bytes_attn + weight_bytes_mlp)`` bytes.
      mlp_weight_elems_per_expert: ``(n·h)·I`` parameters of one expert's MLP per layer (used by
        the batch-aware MoE weight bytes of beta feature 3).
      kv_bytes_per_token: ``(((2·L)·kv_dim)·2)·b`` bytes, as defined in §P.3 (a second factor 2
        beyond K and V: 262,144 for Llama-3.1-8B in bf16).
      attn_flops_per_work_unit: ``(L·2)·h`` FLOPs per (query token × key token); beta features
        2 and 4 (``num_layers × 2h``).
      hw_peak_flops: ``(TFlopsPeak·1e12)/tp`` FLOP/s (per-device ceiling after the TP split).
      hw_peak_bandwidth: ``(BwPeakTBs·1e12)/tp`` bytes/s.
      hw_pcie_bandwidth_eff: ``(pcie_gb_s·1e9)·pcie_efficiency`` bytes/s (not split by TP).
      hw_interconnect_bw: ``interconnect_gb_s·1e9`` bytes/s.
      comm_bytes_per_token: ``(((((L·2)·h)·b)·2)·(tp−1))/tp`` bytes for tp > 1, else 0.0.
      roofline_step_time: ``max((max_num_batched_tokens·flops_linear_per_token)/hw_peak_flops,
        weight_bytes_total/hw_peak_bandwidth)`` seconds.
      block_size_bytes: ``block_size_tokens·kv_bytes_per_token`` bytes per KV block.
      gpu_kv_capacity_bytes: ``total_kv_blocks_gpu·block_size_bytes`` bytes.
      cpu_kv_capacity_bytes: ``total_kv_blocks_cpu·block_size_bytes`` bytes when CPU offloading
        is on, else 0.0.
      gqa_ratio: ``num_kv_heads/num_heads`` (beta feature 10).
      moe_top_k_fraction: ``k/E`` for MoE, 0.0 for dense.
      The remaining fields copy the inputs they come from.
    """

    # model
    num_layers: int
    hidden_size: int
    num_attn_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: float
    n_mlp_proj: int
    is_moe: bool
    num_experts: int
    top_k: int
    tp: int
    # derived model constants
    kv_dim: float
    flops_attn_linear: float
    flops_mlp: float
    flops_lm_head: float
    flops_linear_per_token: float
    weight_bytes_attn: float
    weight_bytes_mlp: float
    weight_bytes_total: float
    mlp_weight_elems_per_expert: float
    kv_bytes_per_token: float
    attn_flops_per_work_unit: float
    gqa_ratio: float
    moe_top_k_fraction: float
    # hardware
    hw_peak_flops: float
    hw_peak_bandwidth: float
    hw_pcie_bandwidth_eff: float
    hw_interconnect_bw: float
    comm_bytes_per_token: float
    roofline_step_time: float
    # vLLM knobs
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size_tokens: int
    total_kv_blocks_gpu: int
    chunked_prefill_enabled: bool
    cpu_offload_active: bool
    prefix_caching_enabled: bool
    block_size_bytes: float
    gpu_kv_capacity_bytes: float
    cpu_kv_capacity_bytes: float

    @classmethod
    def build(
        cls,
        model: ModelConfig,
        hardware: HardwareConfig,
        tp: int,
        knobs: VLLMKnobs,
        extras: PhysicsHardwareExtras | None = None,
        *,
        n_mlp_proj: int | None = None,
    ) -> PhysicsConfig:
        """Compute every constant of docs/latency-models.md §P.3.

        Args:
          model: architecture; MoE models use the per-expert FFN width for ``I``.
          hardware: GPU; its ``tflops_peak`` (dense BF16/FP16) and ``bw_peak_tbs`` are used.
          tp: tensor parallelism, >= 1.
          knobs: vLLM settings (``max_num_batched_tokens > 0`` is checked there).
          extras: PCIe/interconnect figures; None = :func:`default_hardware_extras`.
          n_mlp_proj: override of the MLP projection count (default from ``hidden_act``).

        Raises:
          ConfigError: naming the offending field.
        """
        tp = check_int("tp", tp, min_value=1)
        if not isinstance(knobs, VLLMKnobs):
            raise ConfigError("vllm_knobs", f"must be a VLLMKnobs, got {type(knobs).__name__}")
        _check_model(model)
        if extras is None:
            extras = default_hardware_extras(hardware.name)
        n = (
            mlp_projection_count(model)
            if n_mlp_proj is None
            else check_int("n_mlp_proj", n_mlp_proj, min_value=1)
        )
        h = float(model.hidden_dim)
        layers = float(model.num_layers)
        b = float(model.bytes_per_param)
        is_moe = model.is_moe
        ffn = model.moe.expert_intermediate_size if is_moe else model.intermediate_dim
        ffn_f = float(ffn)
        experts = model.num_local_experts if is_moe else 0
        top_k = model.num_experts_per_tok if is_moe else 0

        kv_dim = float(model.hidden_dim * model.num_kv_heads) / float(model.num_heads)
        top_k_fraction = float(top_k) / float(experts) if is_moe else 0.0
        moe_factor = top_k_fraction if is_moe else 1.0
        moe_weight_factor = float(top_k) if is_moe else 1.0

        flops_attn_linear = (4.0 * h) * (h + kv_dim)
        flops_mlp = (((float(n) * 2.0) * h) * ffn_f) * moe_factor
        flops_lm_head = (2.0 * h) * float(model.vocab_size)
        flops_linear = (layers * (flops_attn_linear + flops_mlp)) + flops_lm_head

        weight_bytes_attn = (((2.0 * h) * h) + ((2.0 * h) * kv_dim)) * b
        mlp_elems = (float(n) * h) * ffn_f
        weight_bytes_mlp = (mlp_elems * moe_weight_factor) * b
        weight_bytes_total = layers * (weight_bytes_attn + weight_bytes_mlp)
        kv_bytes = (((2.0 * layers) * kv_dim) * 2.0) * b

        tp_f = float(tp)
        peak_flops = (hardware.tflops_peak * 1e12) / tp_f
        peak_bw = (hardware.bw_peak_tbs * 1e12) / tp_f
        pcie_eff = (extras.pcie_bandwidth_gb_s * 1e9) * extras.pcie_efficiency
        interconnect = extras.interconnect_bandwidth_gb_s * 1e9
        if tp > 1:
            comm = (((((layers * 2.0) * h) * b) * 2.0) * (tp_f - 1.0)) / tp_f
        else:
            comm = 0.0
        roofline = max(
            (float(knobs.max_num_batched_tokens) * flops_linear) / peak_flops,
            weight_bytes_total / peak_bw,
        )
        block_bytes = float(knobs.block_size_tokens) * kv_bytes
        gpu_capacity = float(knobs.total_kv_blocks_gpu) * block_bytes
        cpu_capacity = (
            float(knobs.total_kv_blocks_cpu) * block_bytes if knobs.cpu_offloading else 0.0
        )

        return cls(
            num_layers=model.num_layers,
            hidden_size=model.hidden_dim,
            num_attn_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            intermediate_size=ffn,
            vocab_size=model.vocab_size,
            dtype_bytes=b,
            n_mlp_proj=n,
            is_moe=is_moe,
            num_experts=experts,
            top_k=top_k,
            tp=tp,
            kv_dim=kv_dim,
            flops_attn_linear=flops_attn_linear,
            flops_mlp=flops_mlp,
            flops_lm_head=flops_lm_head,
            flops_linear_per_token=flops_linear,
            weight_bytes_attn=weight_bytes_attn,
            weight_bytes_mlp=weight_bytes_mlp,
            weight_bytes_total=weight_bytes_total,
            mlp_weight_elems_per_expert=mlp_elems,
            kv_bytes_per_token=kv_bytes,
            attn_flops_per_work_unit=(layers * 2.0) * h,
            gqa_ratio=float(model.num_kv_heads) / float(model.num_heads),
            moe_top_k_fraction=top_k_fraction,
            hw_peak_flops=peak_flops,
            hw_peak_bandwidth=peak_bw,
            hw_pcie_bandwidth_eff=pcie_eff,
            hw_interconnect_bw=interconnect,
            comm_bytes_per_token=comm,
            roofline_step_time=roofline,
            max_num_seqs=knobs.max_num_seqs,
            max_num_batched_tokens=knobs.max_num_batched_tokens,
            block_size_tokens=knobs.block_size_tokens,
            total_kv_blocks_gpu=knobs.total_kv_blocks_gpu,
            chunked_prefill_enabled=knobs.chunked_prefill_enabled,
            cpu_offload_active=knobs.cpu_offloading,
            prefix_caching_enabled=knobs.prefix_caching_enabled,
            block_size_bytes=block_bytes,
            gpu_kv_capacity_bytes=gpu_capacity,
            cpu_kv_capacity_bytes=cpu_capacity,
        )
