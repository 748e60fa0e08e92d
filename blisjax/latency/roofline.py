"""BLIS's roofline latency model, bit-exact (docs/roofline.md §2–§3, docs/semantics.md §4.3).

A step takes ``max(compute seconds, memory seconds)``: compute is the batch's FLOPs over the
GPU's peak rate scaled by an MFU, memory is the bytes moved (weights once per step, plus each
request's KV reads/writes and activations) over the HBM bandwidth. The result is truncated to
integer µs and floored at 1.

Exactness rules (docs/roofline.md §7), followed everywhere below:

* every quantity is an IEEE binary64 Python float; every operation is evaluated left to right
  exactly as docs/roofline.md writes it, one rounding per operation, never fused or reassociated;
* integers (layer split, token totals) stay integers until docs/roofline.md converts them;
* sub-expressions that do not depend on the batch (``d·d + 2d·dKV``, ``4·H``, …) are evaluated
  once in :func:`roofline_arch`, with the same operations in the same order, so using them is
  bit-identical to recomputing them per request.

The formulas are small pure functions of scalars (:func:`transformer_flops`,
:func:`memory_access_bytes`, :func:`weight_bytes`, :func:`expected_distinct_experts`,
:func:`go_pow`, :func:`roofline_step_seconds`, :func:`roofline_step_time_us`) so a vectorised
engine can reproduce them operation for operation. Their only data-dependent branches are
``t > 1`` (attention context) and, in :func:`go_pow`, the bits of the exponent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from blisjax.config import ConfigError, HardwareConfig, ModelConfig
from blisjax.latency.base import StepBatch, float_to_ticks
from blisjax.latency.blackbox import blackbox_queueing_delay_us

#: Tera (FLOP/s and B/s scale of the hardware table).
TERA = 1e12
#: Seconds → microseconds.
US_PER_S = 1e6
#: Matrices counted per MLP by the roofline (always 2, whatever ``hidden_act`` is).
ROOFLINE_MLP_MATRICES = 2.0


# --------------------------------------------------------------------------- constants


@dataclass(frozen=True, slots=True)
class RooflineArch:
    """Model constants of the roofline from a :class:`ModelConfig` (docs/roofline.md §2.1–§2.2).

    Floats are binary64; widths are in elements, byte widths in bytes per element.

    Attributes:
      layers: L as a float.
      d: hidden width d.
      heads: H, attention heads.
      kv_heads: KVH, KV heads (H when the config gives none).
      head_dim: dh = d / H (true division; ``head_dim`` from config.json is ignored).
      kv_dim: dKV = KVH·dh.
      n_moe, n_dense: integer numbers of MoE and dense layers (nMoE + nDense = L).
      num_experts: N as a float (unused unless nMoE > 0).
      top_k: k as a float.
      bytes_per_param: bpp, bytes per KV/activation element.
      weight_bytes_per_param: EffWBpp, bytes per weight (quantized width, else bpp).
      qkv_width: (d·d) + ((2·d)·dKV), elements per token of the QKV projection / 2.
      four_heads: 4·H.  five_heads: 5·H.
      moe_mlp_width: (2.0·d)·fMoE, weights of one expert's MLP (elements).
      dense_mlp_width: (2.0·d)·fDense, weights of one dense layer's MLP (elements).
      attn_weights_all_layers: ((d·(d + 2·dKV)) + d·d)·L, attention weights of all layers.
      dense_weights_all_layers: dense_mlp_width·nDense (0.0 when nDense = 0).
      kv_bytes_per_token: (((2·L)·KVH)·dh)·bpp, KV bytes of one token over all layers.
      act_bytes_per_token: (L·d)·bpp, activation bytes of one token over all layers.
    """

    layers: float
    d: float
    heads: float
    kv_heads: float
    head_dim: float
    kv_dim: float
    n_moe: int
    n_dense: int
    num_experts: float
    top_k: float
    bytes_per_param: float
    weight_bytes_per_param: float
    qkv_width: float
    four_heads: float
    five_heads: float
    moe_mlp_width: float
    dense_mlp_width: float
    attn_weights_all_layers: float
    dense_weights_all_layers: float
    kv_bytes_per_token: float
    act_bytes_per_token: float


def moe_layer_split(num_layers: int, num_experts: int, interleave_step: int) -> tuple[int, int]:
    """(nMoE, nDense) integer layer counts (docs/roofline.md §2.2).

    Interleaved MoE (``interleave_moe_layer_step`` > 0): nMoE = L div (step + 1). Otherwise every
    layer of an MoE model (N >= 2) is MoE and every layer of a dense model is dense.
    ``first_k_dense_replace`` is deliberately ignored, as in BLIS.
    """
    is_moe = num_experts >= 2
    if interleave_step > 0 and is_moe:
        n_moe = num_layers // (interleave_step + 1)
        return n_moe, num_layers - n_moe
    if is_moe:
        return num_layers, 0
    return 0, num_layers


def roofline_arch(model: ModelConfig) -> RooflineArch:
    """The roofline constants of ``model`` (docs/roofline.md §2.1, §2.2, §2.5 batch-free parts)."""
    layers = float(model.num_layers)
    d = float(model.hidden_dim)
    heads = float(model.num_heads)
    kv_heads = float(model.num_kv_heads if model.num_kv_heads != 0 else model.num_heads)
    head_dim = d / heads
    kv_dim = kv_heads * head_dim
    d_ff = float(model.intermediate_dim) if model.intermediate_dim > 0 else 4.0 * d
    n_moe, n_dense = moe_layer_split(
        model.num_layers, model.num_local_experts, model.interleave_moe_layer_step
    )
    f_moe = float(model.moe_expert_ffn_dim) if model.moe_expert_ffn_dim > 0 else d_ff
    f_dense = float(model.dense_intermediate_dim) if model.dense_intermediate_dim > 0 else d_ff
    bpp = float(model.bytes_per_param)
    wbpp = float(model.weight_bytes_per_param)
    eff_wbpp = wbpp if wbpp > 0 else bpp
    dense_mlp_width = (ROOFLINE_MLP_MATRICES * d) * f_dense
    return RooflineArch(
        layers=layers,
        d=d,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_dim=kv_dim,
        n_moe=n_moe,
        n_dense=n_dense,
        num_experts=float(model.num_local_experts),
        top_k=float(model.num_experts_per_tok),
        bytes_per_param=bpp,
        weight_bytes_per_param=eff_wbpp,
        qkv_width=(d * d) + ((2.0 * d) * kv_dim),
        four_heads=4.0 * heads,
        five_heads=5.0 * heads,
        moe_mlp_width=(ROOFLINE_MLP_MATRICES * d) * f_moe,
        dense_mlp_width=dense_mlp_width,
        attn_weights_all_layers=((d * (d + (2.0 * kv_dim))) + (d * d)) * layers,
        dense_weights_all_layers=dense_mlp_width * float(n_dense) if n_dense > 0 else 0.0,
        kv_bytes_per_token=(((2.0 * layers) * kv_heads) * head_dim) * bpp,
        act_bytes_per_token=(layers * d) * bpp,
    )


@dataclass(frozen=True, slots=True)
class RooflineRates:
    """Per-GPU rates of the roofline (docs/roofline.md §3.2).

    Attributes:
      tp: float(TP); FLOPs and per-request bytes are divided by it.
      peak_flops: FLOP/s, TFlopsPeak·1e12, or TFlopsFP8·1e12 when EffWBpp == 1.0 exactly and the
        GPU has an FP8 rate.
      prefill_flops: peak_flops·mfuPrefill, FLOP/s reached by prefill requests.
      decode_flops: peak_flops·mfuDecode, FLOP/s reached by decode requests.
      bandwidth: BwPeakTBs·1e12, bytes/s.
    """

    tp: float
    peak_flops: float
    prefill_flops: float
    decode_flops: float
    bandwidth: float


def roofline_rates(
    hardware: HardwareConfig, tp: int, weight_bytes_per_param: float
) -> RooflineRates:
    """Rates of ``hardware`` at tensor parallelism ``tp``; ``weight_bytes_per_param`` is EffWBpp."""
    peak = hardware.tflops_peak * TERA
    if weight_bytes_per_param == 1.0 and hardware.tflops_fp8 > 0:
        peak = hardware.tflops_fp8 * TERA
    return RooflineRates(
        tp=float(tp),
        peak_flops=peak,
        prefill_flops=peak * hardware.mfu_prefill,
        decode_flops=peak * hardware.mfu_decode,
        bandwidth=hardware.bw_peak_tbs * TERA,
    )


# --------------------------------------------------------------------------- formulas


def go_pow(x: float, n: int) -> float:
    """``x**n`` for a float ``x`` >= 0 and an integer ``n`` >= 0, bit-identical to Go ``math.Pow``.

    Go does not call libm: for an integer exponent it multiplies frexp mantissas by repeated
    squaring, renormalising after every square, and applies the binary exponent at the end
    (docs/roofline.md §2.4). The result can differ from ``x ** n`` in the last ulps.
    """
    if n == 0 or x == 1.0:
        return 1.0
    if n == 1:
        return x
    if x == 0.0:
        return 0.0
    a1 = 1.0
    ae = 0
    x1, xe = math.frexp(x)
    i = n
    while i != 0:
        if xe < -4096 or xe > 4096:
            ae += xe  # catastrophic under/overflow: leave it to ldexp
            break
        if i & 1:
            a1 = a1 * x1
            ae += xe
        x1 = x1 * x1
        xe = 2 * xe
        if x1 < 0.5:
            x1 = x1 + x1
            xe -= 1
        i >>= 1
    # Both Go's Ldexp and Python's round a subnormal result to nearest-even and flush below it;
    # overflow is impossible (0 < x < 1 whenever the loop runs for the roofline).
    return math.ldexp(a1, ae)


def expected_distinct_experts(num_experts: float, top_k: float, tokens: int) -> float:
    """Expected number of distinct experts hit by ``tokens`` tokens routed top-k of N.

    nEff = N·(1 − ((N − k)/N)^B) with B = ``tokens`` (an integer; the power is Go's
    :func:`go_pow`). ``num_experts`` and ``top_k`` are floats; the result is in experts.
    """
    p = (num_experts - top_k) / num_experts
    return num_experts * (1.0 - go_pow(p, tokens))


class TokenFlopTerms(NamedTuple):
    """The parts of :func:`transformer_flops` that depend on the new tokens t alone (FLOPs, or
    FLOPs per context token for the ``*_heads_t`` factors), each with the reference's
    operations in its order (docs/roofline.md §2.3). An engine may tabulate them by t.

    Attributes:
      gemm: ((2T·qkv_width) + ((2T·d)·d))·L, the QKV and output projections of all layers.
      ctx_offset: (T − 1)/2 when t > 1, else 0.0 (the attention context is s + ctx_offset; adding
        0.0 to s >= 0 leaves it unchanged).
      four_heads_t: 4H·T.  five_heads_t: 5H·T.
      two_t_d: 2T·d.
      moe: ((2T·moe_mlp_width)·k)·nMoE, or 0.0 without MoE layers.
      dense: (2T·dense_mlp_width)·nDense, or 0.0 without dense layers.
    """

    gemm: float
    ctx_offset: float
    four_heads_t: float
    five_heads_t: float
    two_t_d: float
    moe: float
    dense: float


def token_flop_terms(a: RooflineArch, t: int) -> TokenFlopTerms:
    """The t-only terms of :func:`transformer_flops` for ``t`` new tokens."""
    tf = float(t)
    two_t = 2.0 * tf
    qkv = two_t * a.qkv_width
    proj = (two_t * a.d) * a.d
    return TokenFlopTerms(
        gemm=(qkv + proj) * a.layers,
        ctx_offset=(tf - 1.0) / 2.0 if t > 1 else 0.0,
        four_heads_t=a.four_heads * tf,
        five_heads_t=a.five_heads * tf,
        two_t_d=two_t * a.d,
        moe=((two_t * a.moe_mlp_width) * a.top_k) * float(a.n_moe) if a.n_moe > 0 else 0.0,
        dense=(two_t * a.dense_mlp_width) * float(a.n_dense) if a.n_dense > 0 else 0.0,
    )


def transformer_flops(a: RooflineArch, s: int, t: int) -> float:
    """FLOPs to process ``t`` new tokens after ``s`` tokens of context (docs/roofline.md §2.3).

    Attention (QKV + output projections, score/value GEMMs, vector work) over all layers plus the
    2-matrix MLP of every dense layer and the top-k experts of every MoE layer. The attention
    context is c = s + (t − 1)/2 for t > 1, else s. Result in FLOPs (one model replica, no TP).
    The t-only terms come from :func:`token_flop_terms`.
    """
    terms = token_flop_terms(a, t)
    sf = float(s)
    ctx = sf + terms.ctx_offset if t > 1 else sf
    attn = (terms.four_heads_t * ctx) * a.head_dim
    vec = (terms.five_heads_t * ctx) + terms.two_t_d
    gemm = terms.gemm + (attn * a.layers)
    sram = vec * a.layers
    if a.n_moe > 0:
        gemm = gemm + terms.moe
    if a.n_dense > 0:
        gemm = gemm + terms.dense
    return gemm + sram


def weight_bytes(a: RooflineArch, t: int) -> float:
    """Weight bytes read to process ``t`` tokens (docs/roofline.md §2.5 "ModelWeights").

    Attention of all layers, plus dense MLPs, plus for MoE layers the expected number of distinct
    experts hit by ``t`` tokens; times EffWBpp. Excludes embeddings, lm_head, norms, routers and
    shared experts.
    """
    moe_w = 0.0
    if a.n_moe > 0:
        n_eff = expected_distinct_experts(a.num_experts, a.top_k, t)
        moe_w = (a.moe_mlp_width * n_eff) * float(a.n_moe)
    return (a.attn_weights_all_layers + (moe_w + a.dense_weights_all_layers)) * (
        a.weight_bytes_per_param
    )


def memory_access_bytes(a: RooflineArch, s: int, t: int, with_kv: bool) -> tuple[float, float]:
    """(weights W, total bytes) moved to process ``t`` new tokens after ``s`` of context.

    Total = ((W + KV write of t tokens) + KV read of s tokens) + activations of t tokens, in bytes
    (docs/roofline.md §2.5); the KV terms are 0.0 when ``with_kv`` is false.
    """
    w = weight_bytes(a, t)
    if with_kv:
        kv_write = kv_bytes(a, t)
        kv_read = kv_bytes(a, s)
    else:
        kv_write = 0.0
        kv_read = 0.0
    return w, ((w + kv_write) + kv_read) + activation_bytes(a, t)


def kv_bytes(a: RooflineArch, tokens: int) -> float:
    """KV-cache bytes of ``tokens`` tokens over all layers (written or read)."""
    return a.kv_bytes_per_token * float(tokens)


def activation_bytes(a: RooflineArch, tokens: int) -> float:
    """Activation bytes of ``tokens`` new tokens over all layers."""
    return a.act_bytes_per_token * float(tokens)


def split_roofline_requests(batch: StepBatch) -> tuple[list[tuple[int, int]], list[int]]:
    """(prefill (s, t) pairs, decode contexts s), each in batch order (docs/roofline.md §3.1).

    Prefill: start-of-step PI < L_in, s = PI, t = new tokens (cache hits of a newly admitted
    request are not context: its PI is still 0). Decode: PI >= L_in with output tokens, s = PI,
    t = 1. Anything else contributes nothing.
    """
    prefill: list[tuple[int, int]] = []
    decode: list[int] = []
    for new, pi, l_in, n_out in zip(
        batch.new_tokens, batch.progress_index, batch.input_tokens, batch.output_tokens,
        strict=True,
    ):
        if pi < l_in:
            prefill.append((pi, new))
        elif n_out > 0:
            decode.append(pi)
    return prefill, decode


def roofline_step_seconds(
    a: RooflineArch, r: RooflineRates, prefill: list[tuple[int, int]], decode: list[int]
) -> tuple[float, float]:
    """(compute seconds, memory seconds) of one step (docs/roofline.md §3.3–§3.4).

    compute = Σ_prefill (FLOPs(s,t)/TP)/(peak·mfuPrefill) + Σ_decode (FLOPs(s,1)/TP)/
    (peak·mfuDecode), accumulated left to right over the prefill requests then the decode
    requests. memory = ((W(Ntok)/TP) + Σ (Total − W)/TP)/bw, with the per-request (Total − W)
    from :func:`memory_access_bytes` at that request's (s, t) and the weights read once per step
    at Ntok = Σ prefill t + number of decodes (an integer). An empty batch gives (0.0, 0.0).
    """
    if not prefill and not decode:
        return 0.0, 0.0
    comp = 0.0
    dyn = 0.0
    n_tok = 0
    for s, t in prefill:
        comp = comp + ((transformer_flops(a, s, t) / r.tp) / r.prefill_flops)
        w, total = memory_access_bytes(a, s, t, True)
        dyn = dyn + ((total - w) / r.tp)
        n_tok += t
    for s in decode:
        comp = comp + ((transformer_flops(a, s, 1) / r.tp) / r.decode_flops)
        w, total = memory_access_bytes(a, s, 1, True)
        dyn = dyn + ((total - w) / r.tp)
    n_tok += len(decode)
    mem = ((weight_bytes(a, n_tok) / r.tp) + dyn) / r.bandwidth
    return comp, mem


def roofline_step_time_us(
    a: RooflineArch, r: RooflineRates, prefill: list[tuple[int, int]], decode: list[int]
) -> int:
    """Step time in integer µs (docs/roofline.md §3.5): max(1, trunc(max(compute, memory)·1e6)).

    Truncation, not rounding; an empty batch gives 1. See :func:`roofline_step_seconds`.
    """
    comp, mem = roofline_step_seconds(a, r, prefill, decode)
    return max(1, float_to_ticks(max(comp, mem) * US_PER_S))


# --------------------------------------------------------------------------- validation


def check_roofline_inputs(model: ModelConfig, hardware: HardwareConfig, tp: int) -> None:
    """BLIS ``ValidateRooflineConfig`` plus TP > 0 (docs/roofline.md §1.4).

    Raises:
      ConfigError: naming the first field BLIS would reject.
    """

    def finite_pos(x: float) -> bool:
        return math.isfinite(x) and x > 0

    def zero_or_finite_pos(x: float) -> bool:
        return x == 0 or finite_pos(x)

    n, k = model.num_local_experts, model.num_experts_per_tok
    checks = [
        ("engine.tensor_parallel_size", tp > 0, "must be > 0", tp),
        ("model.num_heads", model.num_heads > 0, "must be > 0", model.num_heads),
        ("model.num_layers", model.num_layers > 0, "must be > 0", model.num_layers),
        ("model.hidden_dim", model.hidden_dim > 0, "must be > 0", model.hidden_dim),
        ("model.bytes_per_param", finite_pos(model.bytes_per_param),
         "must be finite and > 0 (known torch_dtype/dtype)", model.bytes_per_param),
        ("hardware.tflops_peak", finite_pos(hardware.tflops_peak), "must be finite and > 0",
         hardware.tflops_peak),
        ("hardware.bw_peak_tbs", finite_pos(hardware.bw_peak_tbs), "must be finite and > 0",
         hardware.bw_peak_tbs),
        ("hardware.mfu_prefill", finite_pos(hardware.mfu_prefill), "must be finite and > 0",
         hardware.mfu_prefill),
        ("hardware.mfu_decode", finite_pos(hardware.mfu_decode), "must be finite and > 0",
         hardware.mfu_decode),
        ("model.num_local_experts", n >= 0, "must be >= 0", n),
        ("model.num_experts_per_tok", not (n > 1 and k <= 0), "must be > 0 for an MoE model", k),
        ("model.num_experts_per_tok", not (n > 1 and k > n),
         f"must be <= num_local_experts={n}", k),
        ("model.num_experts_per_tok", not (n == 0 and k > 0),
         "must be 0 for a model without experts", k),
        ("model.moe_expert_ffn_dim", model.moe_expert_ffn_dim >= 0, "must be >= 0",
         model.moe_expert_ffn_dim),
        ("model.shared_expert_ffn_dim", model.shared_expert_ffn_dim >= 0, "must be >= 0",
         model.shared_expert_ffn_dim),
        ("hardware.memory_gib", zero_or_finite_pos(hardware.memory_gib),
         "must be 0 or finite and > 0", hardware.memory_gib),
        ("hardware.tflops_fp8", zero_or_finite_pos(hardware.tflops_fp8),
         "must be 0 or finite and > 0", hardware.tflops_fp8),
        ("model.weight_bytes_per_param", zero_or_finite_pos(model.weight_bytes_per_param),
         "must be 0 (unset) or finite and > 0", model.weight_bytes_per_param),
    ]
    for path, ok, rule, value in checks:
        if not ok:
            raise ConfigError(path, f"{rule}, got {value!r} (roofline latency model)")


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class RooflineLatency:
    """BLIS's roofline latency model for one model on one GPU type at tensor parallelism ``tp``.

    ``alpha`` = (α0 µs, α1 µs per input token, α2 µs per output token); BLIS passes zeros.
    Queueing delay = trunc(α0 + α1·L_in), output-token processing = trunc(α2), post-decode
    overhead 0; step time from :func:`roofline_step_time_us`.

    Raises:
      ConfigError: the model/hardware/TP fail BLIS's roofline validation, or α is not 3 values.
    """

    model: ModelConfig
    hardware: HardwareConfig
    tp: int = 1
    alpha: tuple[float, float, float] = (0.0, 0.0, 0.0)
    arch: RooflineArch = field(init=False, repr=False)
    rates: RooflineRates = field(init=False, repr=False)

    def __post_init__(self) -> None:
        alpha = tuple(float(x) for x in self.alpha)
        if len(alpha) != 3:
            raise ConfigError("latency.alpha_coeffs", f"roofline needs 3 values, got {len(alpha)}")
        object.__setattr__(self, "alpha", alpha)
        check_roofline_inputs(self.model, self.hardware, self.tp)
        arch = roofline_arch(self.model)
        object.__setattr__(self, "arch", arch)
        object.__setattr__(
            self, "rates", roofline_rates(self.hardware, self.tp, arch.weight_bytes_per_param)
        )

    def queueing_delay_us(self, input_tokens: int) -> int:
        """trunc(α0 + α1·L_in) µs, ``input_tokens`` including any shared prefix (the same
        formula as blackbox, docs/semantics.md §4.3)."""
        return blackbox_queueing_delay_us(self.alpha, input_tokens)

    def step_time_us(self, batch: StepBatch) -> int:
        prefill, decode = split_roofline_requests(batch)
        return roofline_step_time_us(self.arch, self.rates, prefill, decode)

    @property
    def output_token_processing_us(self) -> int:
        return float_to_ticks(self.alpha[2])

    @property
    def post_decode_overhead_us(self) -> int:
        return 0
