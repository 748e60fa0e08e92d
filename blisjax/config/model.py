"""Model architecture parsed from a Hugging Face ``config.json`` exactly as BLIS does.

Parsing follows ``docs/roofline.md`` §1.1–§1.3 (BLIS ``ParseHFConfig`` / ``GetModelConfigFromHF``
at f90a1e3a, plus the CLI's model-name quantization fallback); validation follows contract BC-1
(docs/semantics.md §11) and the model checks of docs/roofline.md §1.4. Parsing never rejects a
config except for the four fields BLIS rejects when negative; call :meth:`ModelConfig.validate`
before simulating.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from blisjax.config._checks import ConfigError
from blisjax.config._data import model_configs_root

#: dtype string → bytes per parameter (exact, case-sensitive; anything else gives 0).
DTYPE_BYTES: Mapping[str, float] = MappingProxyType(
    {
        "float32": 4.0,
        "float16": 2.0,
        "bfloat16": 2.0,
        "int8": 1.0,
        "uint8": 1.0,
        "fp8": 1.0,
        "int4": 1.0,
        "nf4": 1.0,
    }
)

#: Keys giving the routed-expert count, in BLIS's resolution order (first value >= 2 wins).
EXPERT_COUNT_KEYS = (
    "num_experts",
    "moe_num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_routed_experts",
)
#: Keys giving the KV-head count, first non-zero wins; 0 means MHA (= num_attention_heads).
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
#: A model is MoE iff it has at least this many routed experts (1 expert = dense).
MOE_MIN_EXPERTS = 2

# Model-name quantization hints (applied by the BLIS CLI when config.json has none).
_WEIGHT_ACT_BITS_RE = re.compile(r"(?:^|[.\-_/])w(\d+)a\d+(?:\Z|[.\-_])", re.IGNORECASE)
_FP8_NAME_RE = re.compile(r"(?:^|[.\-_/])fp8(?:\Z|[.\-_])", re.IGNORECASE)
_GO_ATOI_RE = re.compile(r"[+-]?[0-9]+")


class UnknownModelError(ValueError):
    """The model is neither a config.json path nor a shipped model."""


# --------------------------------------------------------------------------- HF getters


def _is_number(value: Any) -> bool:
    # JSON true/false decode to Python bool, an int subclass; BLIS treats them as non-numbers.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def hf_int(hf: Mapping[str, Any], key: str) -> int:
    """BLIS ``getInt``: a JSON number truncated toward zero, anything else (or absent) 0."""
    value = hf.get(key)
    if not _is_number(value):
        return 0
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    return int(value)


def hf_first_nonzero(hf: Mapping[str, Any], *keys: str) -> int:
    """The first ``hf_int(key)`` that is non-zero, else 0."""
    for key in keys:
        value = hf_int(hf, key)
        if value != 0:
            return value
    return 0


def hf_num_experts(hf: Mapping[str, Any]) -> int:
    """BLIS ``ResolveNumExperts``: first expert-count key whose value is >= 2, else 0."""
    for key in EXPERT_COUNT_KEYS:
        value = hf_int(hf, key)
        if value >= MOE_MIN_EXPERTS:
            return value
    return 0


def pivot_text_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Copy the keys of a ``text_config`` object over the top level (multimodal configs)."""
    out = dict(hf)
    text = hf.get("text_config")
    if isinstance(text, dict):
        out.update(text)
    return out


def _dtype_of(hf: Mapping[str, Any]) -> str:
    # torch_dtype wins when it is a string, even an unknown one (no fall back to `dtype`).
    for key in ("torch_dtype", "dtype"):
        if isinstance(hf.get(key), str):
            return hf[key]
    return ""


def _go_atoi(text: str) -> int:
    return int(text) if _GO_ATOI_RE.fullmatch(text) else 0


def weight_bytes_from_quantization(quant: Any) -> float:
    """Bytes per weight from a ``quantization_config`` object (docs/roofline.md §1.3); 0 = unknown."""
    if not isinstance(quant, dict):
        return 0.0
    bits_value = quant.get("bits")
    bits = 0
    if _is_number(bits_value):
        bits = int(bits_value) if math.isfinite(bits_value) else 0
    elif isinstance(bits_value, str):
        bits = _go_atoi(bits_value)
    if bits > 0:
        return bits / 8
    method = quant.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if method == "fp8":
        return 1.0
    groups = quant.get("config_groups")
    if method == "compressed-tensors" and isinstance(groups, dict):
        # Python's str order is code-point order, which equals Go's byte-wise UTF-8 order.
        for key in sorted(groups):
            weights = groups[key].get("weights") if isinstance(groups[key], dict) else None
            num_bits = weights.get("num_bits") if isinstance(weights, dict) else None
            if _is_number(num_bits) and num_bits > 0:
                return float(num_bits) / 8
    return 0.0


def weight_bytes_from_model_name(model_name: str) -> float:
    """Bytes per weight hinted by a model name (``…-w4a16``, ``…-fp8``); 0 = no hint."""
    name = model_name.lower()
    match = _WEIGHT_ACT_BITS_RE.search(name)
    if match and int(match.group(1)) > 0:
        return int(match.group(1)) / 8
    return 1.0 if _FP8_NAME_RE.search(name) else 0.0


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts view of a :class:`ModelConfig`.

    Attributes:
      num_local_experts: routed experts per MoE layer (>= 2).
      num_experts_per_tok: routed experts active per token.
      expert_intermediate_size: FFN width of one routed expert (``moe_intermediate_size``, or the
        dense ``intermediate_size`` when absent — the Mixtral convention).
      num_shared_experts: always-active shared experts (DeepSeek style), 0 if none.
      shared_expert_intermediate_size: total FFN width of the shared experts, 0 if none.
      interleave_moe_layer_step: Llama-4 style interleave step (0 = every layer is MoE).
      first_k_dense_replace: leading dense layers (DeepSeek style).
    """

    num_local_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    interleave_moe_layer_step: int = 0
    first_k_dense_replace: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """Transformer architecture, with BLIS's field semantics (docs/roofline.md §1.1).

    Dimensions are counts (layers, heads) or widths in elements; byte widths are bytes per
    parameter. Zero means "absent from config.json" unless stated otherwise.

    Attributes:
      name: model id as given (``meta-llama/llama-3.1-8b-instruct``) or the config path.
      model_type: HF ``model_type``.
      num_layers: ``num_hidden_layers``.
      hidden_dim: ``hidden_size``.
      num_heads: ``num_attention_heads``.
      num_kv_heads: first non-zero of ``num_key_value_heads``/``num_kv_heads``/
        ``multi_query_group_num``; 0 is replaced by ``num_heads`` (MHA).
      vocab_size: ``vocab_size``.
      intermediate_dim: ``intermediate_size``, else ``ffn_hidden_size``.
      max_position_embeddings: ``max_position_embeddings``.
      dtype: the dtype string used (``torch_dtype``, else ``dtype``), "" if none.
      bytes_per_param: bytes of activations / KV cache elements (from ``dtype``; 0 if unknown).
      weight_bytes_per_param: bytes per weight from quantization (0 = same as bytes_per_param).
      hidden_act: ``hidden_act`` if a string, else "".
      tie_word_embeddings: ``tie_word_embeddings`` if a JSON bool, else False.
      config_head_dim: explicit ``head_dim`` (0 = derive hidden_dim // num_heads).
      kv_lora_rank, qk_rope_head_dim: MLA latent widths (0 = not MLA).
      num_local_experts: routed experts (first expert-count key >= 2, else 0 = dense).
      num_experts_per_tok: ``num_experts_per_tok``.
      moe_expert_ffn_dim: ``moe_intermediate_size`` (0 = use intermediate_dim).
      num_shared_experts: ``n_shared_experts``.
      shared_expert_ffn_dim: total shared-expert FFN width (docs/roofline.md §1.1 rule).
      capacity_shared_expert_ffn_dim: the shared width BLIS's KV-capacity estimate uses (it reads
        only ``intermediate_size``, never ``ffn_hidden_size``); None = shared_expert_ffn_dim.
      interleave_moe_layer_step: ``interleave_moe_layer_step``.
      dense_intermediate_dim: ``intermediate_size_mlp`` (FFN width of dense layers).
      first_k_dense_replace: ``first_k_dense_replace``.
      architectures: HF ``architectures``.
      raw: the (text_config-pivoted) config.json mapping; not compared or hashed.
    """

    name: str = ""
    model_type: str = ""
    num_layers: int = 0
    hidden_dim: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    vocab_size: int = 0
    intermediate_dim: int = 0
    max_position_embeddings: int = 0
    dtype: str = ""
    bytes_per_param: float = 0.0
    weight_bytes_per_param: float = 0.0
    hidden_act: str = ""
    tie_word_embeddings: bool = False
    config_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_expert_ffn_dim: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_dim: int = 0
    capacity_shared_expert_ffn_dim: int | None = None
    interleave_moe_layer_step: int = 0
    dense_intermediate_dim: int = 0
    first_k_dense_replace: int = 0
    architectures: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, hash=False, repr=False
    )

    def __getstate__(self) -> dict:
        # a read-only mapping does not pickle (configs sent to other processes are pickled)
        return {**self.__dict__, "raw": dict(self.raw)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({**state, "raw": MappingProxyType(state["raw"])})

    def __post_init__(self) -> None:
        if self.num_kv_heads == 0:
            # BLIS: no KV-head key means multi-head attention.
            object.__setattr__(self, "num_kv_heads", self.num_heads)

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], name: str = "") -> ModelConfig:
        """Parse a decoded config.json (docs/roofline.md §1.1–§1.3).

        ``name`` is the ``--model`` string; when config.json gives no weight quantization, the
        name's ``w<bits>a<bits>`` / ``fp8`` hint is used, as the BLIS CLI does.

        Raises:
          ValueError: ``head_dim``, ``kv_lora_rank``, ``qk_rope_head_dim`` or
            ``first_k_dense_replace`` is negative (BLIS rejects these at parse time).
        """
        hf = pivot_text_config(hf)
        for key in ("head_dim", "kv_lora_rank", "qk_rope_head_dim", "first_k_dense_replace"):
            if hf_int(hf, key) < 0:
                raise ConfigError(f"model.{key}", f"must be >= 0, got {hf_int(hf, key)}")
        intermediate = hf_first_nonzero(hf, "intermediate_size", "ffn_hidden_size")
        moe_ff = hf_int(hf, "moe_intermediate_size")
        dtype = _dtype_of(hf)
        weight_bpp = weight_bytes_from_quantization(hf.get("quantization_config"))
        if weight_bpp == 0 and name:
            weight_bpp = weight_bytes_from_model_name(name)
        archs = hf.get("architectures")
        return cls(
            name=name,
            model_type=hf["model_type"] if isinstance(hf.get("model_type"), str) else "",
            num_layers=hf_int(hf, "num_hidden_layers"),
            hidden_dim=hf_int(hf, "hidden_size"),
            num_heads=hf_int(hf, "num_attention_heads"),
            num_kv_heads=hf_first_nonzero(hf, *KV_HEAD_KEYS),
            vocab_size=hf_int(hf, "vocab_size"),
            intermediate_dim=intermediate,
            max_position_embeddings=hf_int(hf, "max_position_embeddings"),
            dtype=dtype,
            bytes_per_param=DTYPE_BYTES.get(dtype, 0.0),
            weight_bytes_per_param=weight_bpp,
            hidden_act=hf["hidden_act"] if isinstance(hf.get("hidden_act"), str) else "",
            tie_word_embeddings=hf.get("tie_word_embeddings") is True,
            config_head_dim=hf_int(hf, "head_dim"),
            kv_lora_rank=hf_int(hf, "kv_lora_rank"),
            qk_rope_head_dim=hf_int(hf, "qk_rope_head_dim"),
            num_local_experts=hf_num_experts(hf),
            num_experts_per_tok=hf_int(hf, "num_experts_per_tok"),
            moe_expert_ffn_dim=moe_ff,
            num_shared_experts=hf_int(hf, "n_shared_experts"),
            shared_expert_ffn_dim=_shared_ffn_dim(hf, moe_ff, intermediate),
            capacity_shared_expert_ffn_dim=_shared_ffn_dim(
                hf, moe_ff, hf_int(hf, "intermediate_size")
            ),
            interleave_moe_layer_step=hf_int(hf, "interleave_moe_layer_step"),
            dense_intermediate_dim=hf_int(hf, "intermediate_size_mlp"),
            first_k_dense_replace=hf_int(hf, "first_k_dense_replace"),
            architectures=tuple(a for a in archs if isinstance(a, str))
            if isinstance(archs, list)
            else (),
            raw=MappingProxyType(hf),
        )

    # ----------------------------------------------------------------- derived values

    @property
    def is_moe(self) -> bool:
        """True iff the model has >= 2 routed experts."""
        return self.num_local_experts >= MOE_MIN_EXPERTS

    @property
    def is_mla(self) -> bool:
        """True iff the KV cache is an MLA latent (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> MoEConfig | None:
        """The MoE view, or None for a dense model."""
        if not self.is_moe:
            return None
        return MoEConfig(
            num_local_experts=self.num_local_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            expert_intermediate_size=self.moe_expert_ffn_dim or self.intermediate_dim,
            num_shared_experts=self.num_shared_experts,
            shared_expert_intermediate_size=self.shared_expert_ffn_dim,
            interleave_moe_layer_step=self.interleave_moe_layer_step,
            first_k_dense_replace=self.first_k_dense_replace,
        )

    @property
    def head_dim(self) -> int:
        """Width of one attention head: explicit ``head_dim``, else hidden_dim // num_heads.

        This is the KV-cache head width (docs/roofline.md §4.3). The roofline *step time* instead uses
        the float ``hidden_dim / num_heads`` regardless of ``head_dim`` (docs/roofline.md §1.7).
        """
        if self.config_head_dim > 0:
            return self.config_head_dim
        return self.hidden_dim // self.num_heads if self.num_heads > 0 else 0

    @property
    def effective_weight_bytes_per_param(self) -> float:
        """Bytes per weight: the quantized width if known, else bytes_per_param."""
        return (
            self.weight_bytes_per_param if self.weight_bytes_per_param > 0 else self.bytes_per_param
        )

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across the whole model (all GPUs).

        Standard attention: 2 (K and V) · layers · kv_heads · head_dim · bytes_per_param.
        MLA: layers · (kv_lora_rank + qk_rope_head_dim) · bytes_per_param (one shared latent).
        """
        if self.is_mla:
            width = self.kv_lora_rank + self.qk_rope_head_dim
            return int(self.num_layers * width * self.bytes_per_param)
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param)

    @property
    def total_parameters(self) -> int:
        """Parameter count as BLIS estimates it for weight memory (docs/roofline.md §4.4).

        Embeddings + per layer (attention, 3-matrix SwiGLU MLP or all routed experts + shared
        experts + router, 2 norms) + lm_head (unless tied) + final norm.
        """
        return self._parameter_count(self.num_local_experts)

    @property
    def active_parameters_per_token(self) -> int:
        """Parameters one token touches: like total_parameters, but each MoE layer counts only
        ``num_experts_per_tok`` routed experts (router and shared experts are always active)."""
        if not self.is_moe:
            return self.total_parameters
        return self._parameter_count(self.num_experts_per_tok)

    def _parameter_count(self, routed_experts: int) -> int:
        d, vocab, layers = self.hidden_dim, self.vocab_size, self.num_layers
        kv_dim = self.num_kv_heads * self.head_dim
        attention_per_layer = d * (d + 2 * kv_dim) + d * d
        dense_mlp_per_layer = 3 * d * self.intermediate_dim
        if self.is_moe:
            mlp_all_layers = self._moe_mlp_params(routed_experts, dense_mlp_per_layer)
        else:
            mlp_all_layers = layers * dense_mlp_per_layer
        attention_and_norms = layers * (attention_per_layer + 2 * d)
        lm_head = 0 if self.tie_word_embeddings else vocab * d
        return vocab * d + attention_and_norms + mlp_all_layers + lm_head + d

    def _moe_mlp_params(self, routed_experts: int, dense_mlp_per_layer: int) -> int:
        d = self.hidden_dim
        expert_ffn = (
            self.moe_expert_ffn_dim if self.moe_expert_ffn_dim > 0 else self.intermediate_dim
        )
        shared = self.capacity_shared_expert_ffn_dim
        shared = self.shared_expert_ffn_dim if shared is None else shared
        moe_layer = 3 * d * expert_ffn * routed_experts + self.num_local_experts * d  # + router
        if shared > 0:
            moe_layer += 3 * d * shared
        if self.dense_intermediate_dim > 0:
            dense_layer = 3 * d * self.dense_intermediate_dim
        else:
            dense_layer = dense_mlp_per_layer
        # BLIS ignores interleave_moe_layer_step here: every non-leading layer counts as MoE.
        n_dense = min(max(self.first_k_dense_replace, 0), self.num_layers)
        return n_dense * dense_layer + (self.num_layers - n_dense) * moe_layer

    # ----------------------------------------------------------------- validation

    def validate(self) -> None:
        """Check contract BC-1 (docs/semantics.md §11) and BLIS's model checks (docs/roofline.md
        §1.4).

        Raises:
          ConfigError: naming the first invalid field (``model.<field>``) and its allowed range.
        """
        for name in ("num_layers", "hidden_dim", "num_heads"):
            _require(name, getattr(self, name) > 0, "must be > 0", getattr(self, name))
        _require(
            "num_kv_heads",
            1 <= self.num_kv_heads <= self.num_heads,
            f"must be in [1, num_heads={self.num_heads}]",
            self.num_kv_heads,
        )
        if self.config_head_dim <= 0:
            _require(
                "hidden_dim",
                self.hidden_dim % self.num_heads == 0,
                f"must be divisible by num_heads={self.num_heads} (integer head_dim)",
                self.hidden_dim,
            )
        for name in (
            "config_head_dim",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "first_k_dense_replace",
        ):
            _require(name, getattr(self, name) >= 0, "must be >= 0", getattr(self, name))
        _require(
            "bytes_per_param",
            self.bytes_per_param in (1.0, 2.0, 4.0),
            "must be 1, 2 or 4 (known torch_dtype/dtype)",
            self.bytes_per_param,
        )
        wbpp = self.weight_bytes_per_param
        _require(
            "weight_bytes_per_param",
            wbpp == 0 or (math.isfinite(wbpp) and wbpp > 0),
            "must be 0 (unset) or a finite number > 0",
            wbpp,
        )
        self._validate_moe()

    def _validate_moe(self) -> None:
        n, k = self.num_local_experts, self.num_experts_per_tok
        _require("num_local_experts", n >= 0, "must be >= 0", n)
        if self.is_moe:
            _require(
                "num_experts_per_tok", 1 <= k <= n, f"must be in [1, num_local_experts={n}]", k
            )
        else:
            _require("num_experts_per_tok", k == 0, "must be 0 for a dense model (< 2 experts)", k)
        for name in ("moe_expert_ffn_dim", "shared_expert_ffn_dim"):
            _require(name, getattr(self, name) >= 0, "must be >= 0", getattr(self, name))


def _require(field_name: str, ok: bool, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"model.{field_name}", f"{rule}, got {value!r}")


def _shared_ffn_dim(hf: Mapping[str, Any], moe_ff: int, fallback_ffn: int) -> int:
    """Total shared-expert FFN width: explicit size, else n_shared × per-expert width."""
    explicit = hf_int(hf, "shared_expert_intermediate_size")
    if explicit > 0:
        return explicit
    n_shared = hf_int(hf, "n_shared_experts")
    if n_shared > 0:
        return n_shared * (moe_ff if moe_ff != 0 else fallback_ffn)
    return 0


# --------------------------------------------------------------------------- loading


def shipped_models() -> tuple[str, ...]:
    """Names of the model configs shipped in ``blisjax/data/model_configs`` (sorted)."""
    root = model_configs_root()
    return tuple(
        sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())
    )


def _reject_json_constant(token: str) -> Any:
    # Go's encoding/json rejects NaN/Infinity; so do we.
    raise ValueError(f"invalid JSON number {token!r}")


def _parse_json(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text, parse_constant=_reject_json_constant)
    except ValueError as err:
        raise ValueError(f"{origin}: invalid config.json: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: config.json must hold a JSON object")
    return data


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """Load a model config by model id, shipped name, config.json path or directory.

    Resolution: an existing file is read as config.json; an existing directory must contain
    ``config.json``; otherwise ``org/Name`` (or ``Name``) resolves, as in BLIS, to the shipped
    ``model_configs/<name lowercased>/config.json``.

    Raises:
      UnknownModelError: nothing matches (the message lists the shipped models).
      ValueError: the file is not a JSON object, or BLIS rejects a negative field.
    """
    path = Path(name_or_path)
    if path.is_file():
        return ModelConfig.from_hf(_parse_json(path.read_text(), str(path)), name=path.parent.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnknownModelError(f"model directory {str(path)!r} has no config.json")
        hf = _parse_json((path / "config.json").read_text(), str(path))
        return ModelConfig.from_hf(hf, name=path.name)
    model_id = str(name_or_path)
    shipped = model_configs_root() / model_id.rsplit("/", 1)[-1].lower() / "config.json"
    if model_id and shipped.is_file():
        return ModelConfig.from_hf(_parse_json(shipped.read_text(), model_id), name=model_id)
    raise UnknownModelError(
        f"unknown model {model_id!r}: not a config.json path and not shipped; "
        f"shipped models: {', '.join(shipped_models())}"
    )
