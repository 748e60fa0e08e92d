"""Turn a :class:`SimConfig` into everything an engine needs (model, hardware, KV, coefficients)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

from blisjax.config._checks import ConfigError
from blisjax.config.codes import PDRole
from blisjax.config.coefficients import select_blackbox_coefficients
from blisjax.config.hardware import HardwareConfig, load_hardware
from blisjax.config.kv_capacity import (
    KVCapacityParamsError,
    compute_total_kv_blocks,
    kv_bytes_per_token_per_gpu,
)
from blisjax.config.model import ModelConfig, UnknownModelError, load_model_config
from blisjax.config.pd import POOL_ROLES, slot_roles
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
        ``KVBytesPerToken`` at the prefill pool's TP, a float); 0.0 without pools.
      pools: with per-pool settings (``cluster.pd.prefill`` / ``decode``), the prefill and the
        decode pool's own resolved configuration (``pool_resolved``; None for a pool without
        settings of its own); None without per-pool settings.
        ``for_instance`` picks an instance's.
    """

    config: SimConfig
    model_config: ModelConfig | None
    hardware_config: HardwareConfig
    total_kv_blocks: int
    max_model_len: int
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    pd_kv_bytes_per_token: float = 0.0
    pools: tuple[ResolvedConfig | None, ResolvedConfig | None] | None = None

    def for_instance(self, instance: int) -> ResolvedConfig:
        """The resolved configuration instance ``instance`` runs: its pool's with per-pool
        settings (prefill instances the prefill pool's, decode and shared ones the decode
        pool's), this one otherwise."""
        if self.pools is None:
            return self
        roles = slot_roles(self.config)
        role = roles[instance] if instance < len(roles) else PDRole.NONE
        pool = (self.pools[0] if role == PDRole.PREFILL
                else self.pools[1] if role != PDRole.NONE else None)
        return self if pool is None else pool

    @property
    def conversation_max_model_len(self) -> int:
        """The length cap under which accumulating conversations are assembled
        (``workload.sessions.prompt_tokens``): that of the instances where requests complete.
        With P/D pools of their own settings the decode pool's (decode and shared instances run
        it, and requests not disaggregated go to the decode pool), else ``max_model_len``."""
        if self.pools is None or self.pools[1] is None:
            return self.max_model_len
        return self.pools[1].max_model_len

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
    resolved = ResolvedConfig(
        config=cfg,
        model_config=model,
        hardware_config=hardware,
        total_kv_blocks=total_kv_blocks,
        max_model_len=max_model_len,
        alpha=alpha,
        beta=beta,
        pd_kv_bytes_per_token=pd_bytes,
    )
    if not cfg.cluster.pd.has_overrides:
        return resolved
    pools = tuple(None if getattr(cfg.cluster.pd, role).empty
                  else pool_resolved(resolved, role, hardware_path) for role in POOL_ROLES)
    return dataclasses.replace(resolved, pools=pools)


def pool_resolved(resolved: ResolvedConfig, role: str,
                  hardware_path: str | Path | None = None) -> ResolvedConfig:
    """The configuration a P/D pool's instances run (``role``: prefill or decode), from its
    settings ``cluster.pd.<role>`` (docs/semantics.md §5.10, "Per-pool settings"):

    * TP, GPU, latency model and max-model-len are the pool's where it sets them.
    * KV blocks: a pool whose TP or GPU differs from the global ones gets its KV cache sized
      for them (the global DP, block size and memory utilization; an explicit
      ``engine.total_kv_blocks`` does not stop this, as in BLIS), and its max-model-len capped
      to that cache when it sets none and the global one is larger. With ``--blis-quirks``
      only roofline and physics configurations are resized (BLIS sizes no blackbox pool).
    * Speed: the pool's GPU rates and shipped coefficients for its GPU and TP. With
      ``--blis-quirks`` the pool keeps the global GPU's rates and coefficients (BLIS copies
      them; only TP and the latency model change a pool's speed there).
    * A GPU without memory data or a model without KV parameters keeps the global KV blocks
      (with a warning), as BLIS does.
    """
    cfg = resolved.config
    own = getattr(cfg.cluster.pd, role)
    if own.empty:
        return resolved
    path = f"cluster.pd.{role}"
    engine = cfg.engine
    quirks = cfg.compat.blis_quirks
    tp = own.tensor_parallel_size or engine.tensor_parallel_size
    gpu = own.hardware or cfg.hardware
    model_name = own.latency_model or cfg.latency.model
    try:
        gpu_config = load_hardware(gpu, hardware_path)
    except ConfigError as err:
        raise ConfigError(f"{path}.hardware", err.problem) from None
    resize = (tp, gpu) != (engine.tensor_parallel_size, cfg.hardware) and (
        not quirks or cfg.latency.model in ("roofline", "physics"))
    blocks = _pool_kv_blocks(cfg, resolved, gpu_config, tp, path) if resize \
        else resolved.total_kv_blocks
    max_model_len = resolved.max_model_len
    if own.max_model_len is not None:
        max_model_len = own.max_model_len
    elif resize and 0 < blocks * engine.block_size_tokens < max_model_len:
        max_model_len = blocks * engine.block_size_tokens
    try:
        check_model_len_fits(max_model_len, engine.block_size_tokens, blocks)
    except ConfigError as err:
        raise ConfigError(f"{path}.max_model_len", err.problem) from None
    pool_cfg = dataclasses.replace(
        cfg, hardware=gpu,
        engine=dataclasses.replace(engine, tensor_parallel_size=tp, total_kv_blocks=blocks,
                                   max_model_len=max_model_len),
        latency=dataclasses.replace(cfg.latency, model=model_name))
    speed = resolved.hardware_config if quirks else gpu_config
    if quirks and model_name == cfg.latency.model:
        alpha, beta = resolved.alpha, resolved.beta
    else:
        basis = pool_cfg if not quirks else dataclasses.replace(pool_cfg, hardware=cfg.hardware)
        try:
            alpha, beta = _coefficients(basis)
        except ConfigError as err:
            field = ("hardware" if own.hardware else "tensor_parallel_size"
                     if own.tensor_parallel_size else "latency_model")
            raise ConfigError(f"{path}.{field}", f"the pool's latency: {err.problem}; or give "
                              f"the pool a latency model with no coefficients to look up "
                              f"({path}.latency_model roofline)") from None
    if model_name != "blackbox" and resolved.model_config is None:
        raise ConfigError(f"{path}.latency_model", f"{model_name!r} needs a shipped model")
    return ResolvedConfig(config=pool_cfg, model_config=resolved.model_config,
                          hardware_config=speed, total_kv_blocks=blocks,
                          max_model_len=max_model_len, alpha=alpha, beta=beta,
                          pd_kv_bytes_per_token=resolved.pd_kv_bytes_per_token)


def _pool_kv_blocks(cfg: SimConfig, resolved: ResolvedConfig, gpu: HardwareConfig, tp: int,
                    path: str) -> int:
    """KV blocks per instance of a pool on GPU ``gpu`` at TP ``tp``; the global count, with a
    warning, where BLIS keeps it (no memory data, no KV parameters)."""
    engine = cfg.engine
    model = resolved.model_config
    if model is None or gpu.memory_gib <= 0:
        warnings.warn(f"{path}: cannot size the pool's KV cache (GPU {gpu.name!r} memory or "
                      f"the model unknown); it keeps {resolved.total_kv_blocks} KV blocks",
                      stacklevel=4)
        return resolved.total_kv_blocks
    try:
        return compute_total_kv_blocks(model, gpu, tp, engine.data_parallel_size,
                                       engine.block_size_tokens, engine.gpu_memory_utilization)
    except KVCapacityParamsError as err:
        warnings.warn(f"{path}: {err}; the pool keeps {resolved.total_kv_blocks} KV blocks",
                      stacklevel=4)
        return resolved.total_kv_blocks
    except ValueError as err:
        raise ConfigError(f"{path}.tensor_parallel_size",
                          f"cannot size the pool's KV cache: {err}") from err


def _pd_kv_bytes_per_token(cfg: SimConfig, model: ModelConfig | None) -> float:
    """KV bytes per token of a P/D transfer: the model's at the prefill pool's TP (the global
    one unless ``cluster.pd.prefill`` sets its own), as BLIS (``EffectivePrefillTP``)."""
    if model is None:
        raise ConfigError("cluster.pd", "P/D pools need the model's KV size per token for the "
                          f"transfer time; {cfg.model!r} is not a shipped model")
    try:
        tp = cfg.cluster.pd.prefill.tensor_parallel_size or cfg.engine.tensor_parallel_size
        return kv_bytes_per_token_per_gpu(model, tp)
    except ValueError as err:
        raise ConfigError("cluster.pd", f"cannot size a KV transfer: {err}") from err
