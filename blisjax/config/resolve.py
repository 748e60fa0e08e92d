"""Turn a :class:`SimConfig` into everything an engine needs (model, hardware, KV, coefficients)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

from blisjax.config._checks import ConfigError
from blisjax.config.coefficients import select_blackbox_coefficients
from blisjax.config.hardware import HardwareConfig, load_hardware
from blisjax.config.kv_capacity import (
    KVCapacityParamsError,
    compute_total_kv_blocks,
    kv_bytes_per_token_per_gpu,
)
from blisjax.config.model import ModelConfig, UnknownModelError, load_model_config
from blisjax.config.policy import PolicyConfig
from blisjax.config.sim import (
    ClusterConfig,
    EngineConfig,
    LatencyConfig,
    MetricsConfig,
    SimConfig,
    check_model_len_fits,
)

#: KV blocks BLIS keeps when it cannot size the cache (unknown GPU memory, odd MoE config).
BLIS_FALLBACK_TOTAL_KV_BLOCKS = 1_000_000
#: Roofline α when none is given: every overhead is 0 (docs/roofline.md §1.6).
ROOFLINE_DEFAULT_ALPHA = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated SimConfig with every derived quantity filled in.

    Attributes:
      config: the SimConfig as given.
      model_config: the parsed model; None only for an unshipped model whose KV blocks and
        blackbox coefficients are both explicit (the engines then need nothing from it).
      hardware_config: the GPU.
      total_kv_blocks: KV blocks per instance (explicit, or computed as BLIS does).
      max_model_len: max input + output tokens per request, 0 = unlimited.
      alpha: α coefficients (µs) for the latency model.
      beta: β coefficients (µs); () for roofline, and for physics when not given (the physics
        model then uses its own defaults).
      pd_kv_bytes_per_token: with P/D pools, the KV bytes of one token a transfer moves (BLIS
        ``KVBytesPerToken`` at the global TP, a float); 0.0 without pools.
    """

    config: SimConfig
    model_config: ModelConfig | None
    hardware_config: HardwareConfig
    total_kv_blocks: int
    max_model_len: int
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    pd_kv_bytes_per_token: float = 0.0

    @property
    def engine(self) -> EngineConfig:
        return self.config.engine

    @property
    def latency(self) -> LatencyConfig:
        return self.config.latency

    @property
    def cluster(self) -> ClusterConfig:
        return self.config.cluster

    @property
    def policy(self) -> PolicyConfig:
        return self.config.policy

    @property
    def metrics(self) -> MetricsConfig:
        return self.config.metrics


def _needs_model(cfg: SimConfig) -> bool:
    latency = cfg.latency
    explicit_coeffs = latency.alpha_coeffs is not None and latency.beta_coeffs is not None
    explicit = cfg.engine.total_kv_blocks is not None and explicit_coeffs
    return latency.model != "blackbox" or not explicit


def _load_model(cfg: SimConfig) -> ModelConfig | None:
    try:
        model = load_model_config(cfg.model)
    except UnknownModelError as err:
        if not _needs_model(cfg):
            return None
        raise ConfigError(
            "model",
            f"{err}. An unshipped model runs only with latency.model 'blackbox' and explicit "
            "engine.total_kv_blocks, latency.alpha_coeffs and latency.beta_coeffs",
        ) from err
    model.validate()
    return model


def _total_kv_blocks(cfg: SimConfig, model: ModelConfig | None, hardware: HardwareConfig) -> int:
    engine = cfg.engine
    if engine.total_kv_blocks is not None:
        return engine.total_kv_blocks
    if model is None:  # unreachable: _load_model insists on a model when blocks are implicit
        raise ConfigError("engine.total_kv_blocks", "must be given when the model is unknown")
    pools = cfg.cluster.node_pools
    if pools:  # instances are sized by their pool's GPU memory (BLIS applyPerInstanceKVCapacity)
        memories = {p.gpu_memory_gib for p in pools}
        if len(memories) > 1:
            raise ConfigError("engine.total_kv_blocks", "must be given when node pools differ in "
                              f"gpu_memory_gib ({', '.join(f'{m:g}' for m in sorted(memories))})")
        hardware = dataclasses.replace(hardware, memory_gib=pools[0].gpu_memory_gib)
    if hardware.memory_gib <= 0:
        warnings.warn(
            f"GPU {hardware.name!r} has no memory_gib; using {BLIS_FALLBACK_TOTAL_KV_BLOCKS} KV "
            "blocks as BLIS does (set engine.total_kv_blocks)",
            stacklevel=3,
        )
        return BLIS_FALLBACK_TOTAL_KV_BLOCKS
    try:
        return compute_total_kv_blocks(
            model,
            hardware,
            engine.tensor_parallel_size,
            engine.data_parallel_size,
            engine.block_size_tokens,
            engine.gpu_memory_utilization,
        )
    except KVCapacityParamsError as err:
        warnings.warn(
            f"{err}; using {BLIS_FALLBACK_TOTAL_KV_BLOCKS} KV blocks as BLIS does", stacklevel=3
        )
        return BLIS_FALLBACK_TOTAL_KV_BLOCKS
    except ValueError as err:
        raise ConfigError("engine.total_kv_blocks", f"cannot compute KV capacity: {err}") from err


def _coefficients(cfg: SimConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    latency = cfg.latency
    alpha, beta = latency.alpha_coeffs, latency.beta_coeffs
    if latency.model == "roofline":
        return alpha or ROOFLINE_DEFAULT_ALPHA, ()
    if latency.model == "physics":
        return alpha or (), beta or ()
    if (alpha is None) != (beta is None):
        missing = "latency.alpha_coeffs" if alpha is None else "latency.beta_coeffs"
        raise ConfigError(missing, "give both alpha_coeffs and beta_coeffs, or neither (shipped)")
    if alpha is not None and beta is not None:
        return alpha, beta
    # BLIS's choice from its own table (blisjax.config.coefficients): lowercased model id, the
    # model's default vLLM version unless one is given, first exact match.
    try:
        shipped = select_blackbox_coefficients(
            cfg.model, cfg.hardware, cfg.engine.tensor_parallel_size, latency.vllm_version
        )
    except LookupError as err:
        raise ConfigError(
            "latency.alpha_coeffs",
            f"{err.args[0]}; pick one with latency.vllm_version (--vllm-version), or pass "
            "latency.alpha_coeffs and latency.beta_coeffs (--alpha-coeffs/--beta-coeffs)",
        ) from None
    return shipped.alpha, shipped.beta


def resolve_config(cfg: SimConfig, hardware_path: str | Path | None = None) -> ResolvedConfig:
    """Load the model and hardware, size the KV cache, pick coefficients, check what needs them.

    ``hardware_path``: a user hardware JSON (BLIS format) instead of the shipped table.

    Raises:
      ConfigError: naming the field at fault (unknown model/GPU, the model check of contract
        BC-1 in docs/semantics.md §11, KV capacity failure, missing coefficients, max_model_len
        larger than the KV cache).
    """
    if not isinstance(cfg, SimConfig):
        raise ConfigError("config", f"must be a SimConfig, got {type(cfg).__name__}")
    hardware = load_hardware(cfg.hardware, hardware_path)
    model = _load_model(cfg)
    total_kv_blocks = _total_kv_blocks(cfg, model, hardware)
    alpha, beta = _coefficients(cfg)
    max_model_len = cfg.engine.max_model_len
    check_model_len_fits(max_model_len, cfg.engine.block_size_tokens, total_kv_blocks)
    pd_bytes = _pd_kv_bytes_per_token(cfg, model) if cfg.cluster.pd.enabled else 0.0
    return ResolvedConfig(
        config=cfg,
        model_config=model,
        hardware_config=hardware,
        total_kv_blocks=total_kv_blocks,
        max_model_len=max_model_len,
        alpha=alpha,
        beta=beta,
        pd_kv_bytes_per_token=pd_bytes,
    )


def _pd_kv_bytes_per_token(cfg: SimConfig, model: ModelConfig | None) -> float:
    """KV bytes per token of a P/D transfer: the model's at the (global) TP, as BLIS."""
    if model is None:
        raise ConfigError("cluster.pd", "P/D pools need the model's KV size per token for the "
                          f"transfer time; {cfg.model!r} is not a shipped model")
    try:
        return kv_bytes_per_token_per_gpu(model, cfg.engine.tensor_parallel_size)
    except ValueError as err:
        raise ConfigError("cluster.pd", f"cannot size a KV transfer: {err}") from err
