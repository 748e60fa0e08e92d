"""The 11 alpha and 16 beta features of the physics-normalized model (docs/latency-models.md
§P.5–§P.7).

Rules every function here follows, so the JAX engine can reproduce it bit for bit:

* float64 only; each formula is evaluated exactly as parenthesised in its docstring (left to
  right otherwise), one IEEE rounding per operation, no fused multiply-add;
* counts enter as ``float(int)`` (exact below 2**53);
* guarded denominators are ``max(EPSILON, x)`` with ``EPSILON = 1e-6``;
* indicators are exact 0.0/1.0 factors, so "indicator × x" equals "x if condition else 0.0";
* the only transcendental functions, ``ln(1 + waiting_depth)`` and ``(1 − k/E)**B``, are
  computed by :func:`log1p_int` and :func:`pow_int`, fixed sequences of +, −, ×, ÷ and
  ``frexp`` (no libm call whose last bit could differ between Python and XLA);
* every feature is finally clamped to ``[0, 100]`` (§P.7): ``min(100, max(0, x))``.

Units: "s" features are times in seconds (work / hardware ceiling), the others are
dimensionless ratios or indicators. Coefficients are therefore µs per feature unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from blisjax.latency.base import float_to_ticks
from blisjax.latency.physics.config import PhysicsConfig
from blisjax.latency.physics.inputs import EPSILON, PhysicsQueueInputs, PhysicsStepInputs

NUM_ALPHA_FEATURES = 11
NUM_BETA_FEATURES = 16
#: Upper clamp of every feature (docs/latency-models.md §P.7).
FEATURE_MAX = 100.0

ALPHA_FEATURE_NAMES = (
    "batch_saturation",
    "kv_memory_pressure",
    "admission_compute_cost",
    "base_bias",
    "queue_drain_estimate",
    "queue_memory_interaction",
    "prefix_cache_benefit",
    "memory_admission_gap",
    "preemption_disruption",
    "cpu_offload_memory_expansion",
    "queued_regime_bias",
)
BETA_FEATURE_NAMES = (
    "prefill_linear_compute",
    "prefill_quadratic_attention",
    "decode_weight_loading",
    "decode_attention_compute",
    "kv_cache_read_cost",
    "batch_utilization",
    "prefill_decode_mix",
    "moe_batch_activation",
    "tp_communication",
    "gqa_efficiency",
    "fixed_step_overhead",
    "preemption_overhead",
    "cpu_offload_transfer",
    "cpu_offload_kv_read",
    "chunked_prefill_indicator",
    "bias",
)

# ln 2 and sqrt(1/2), correctly rounded to binary64.
_LN2 = 0.6931471805599453
_SQRT_HALF = 0.7071067811865476
# 1/(2k+1) for k = 11 .. 1, correctly rounded; Horner order of the atanh series.
_ATANH_SERIES = tuple(1.0 / float(2 * k + 1) for k in range(11, 0, -1))


# --------------------------------------------------------------------------- primitives


def clamp_feature(x: float) -> float:
    """``min(100.0, max(0.0, x))``."""
    return min(FEATURE_MAX, max(0.0, x))


def log1p_int(w: int) -> float:
    """``ln(1 + w)`` for an integer ``w >= 0``, to about 1 ulp, by a fixed operation sequence.

    ``x = float(1 + w)``; ``(m, e) = frexp(x)`` (exact, m in [0.5, 1)); if ``m < sqrt(1/2)``
    then ``m = m*2.0, e = e − 1``; ``f = m − 1.0``; ``s = f/(2.0 + f)``; ``z = s*s``;
    ``p = 1/23``, then for c in 1/21, 1/19, …, 1/3, 1.0: ``p = p*z + c``;
    result = ``float(e)*LN2 + (2.0*s)*p``. ``log1p_int(0)`` is exactly 0.0 and
    ``log1p_int(1)`` exactly LN2 = 0.6931471805599453.
    """
    m, e = math.frexp(float(1 + w))
    if m < _SQRT_HALF:
        m = m * 2.0
        e = e - 1
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = _ATANH_SERIES[0]
    for c in _ATANH_SERIES[1:]:
        p = p * z + c
    p = p * z + 1.0
    return float(e) * _LN2 + (2.0 * s) * p


def pow_int(base: float, n: int) -> float:
    """``base**n`` for an integer ``n >= 0`` by binary exponentiation.

    ``r = 1.0``; for each bit of n from the least significant: if the bit is set,
    ``r = r*base``; then ``base = base*base``. (Squarings after the top bit are unused, so a
    fixed 63-iteration loop gives the same result.)
    """
    result = 1.0
    while n > 0:
        if n & 1:
            result = result * base
        base = base * base
        n >>= 1
    return result


def congestion_gate(cfg: PhysicsConfig, running_depth: int, kv_usage_ratio: float) -> float:
    """Probabilistic-OR gate ``g = (s + m) − (s·m)`` in [0, 1] (docs/latency-models.md §P.5).

    ``s = min(1.0, float(running_depth)/max(ε, float(max_num_seqs)))``,
    ``m = min(1.0, max(0.0, kv_usage_ratio))``.
    """
    s = min(1.0, float(running_depth) / max(EPSILON, float(cfg.max_num_seqs)))
    m = min(1.0, max(0.0, kv_usage_ratio))
    return (s + m) - (s * m)


def moe_activation(cfg: PhysicsConfig, scheduled_tokens: int) -> float:
    """``1.0 − pow_int(1.0 − k/E, max(1, B))`` with B = scheduled tokens; 0.0 for dense
    models and for an empty step (§P.6)."""
    if not cfg.is_moe or scheduled_tokens <= 0:
        return 0.0
    return 1.0 - pow_int(1.0 - cfg.moe_top_k_fraction, max(1, scheduled_tokens))


def effective_weight_bytes(cfg: PhysicsConfig, scheduled_tokens: int) -> float:
    """Weight bytes streamed in a step, bytes (docs/latency-models.md §P.6).

    Dense: ``weight_bytes_total``. MoE: ``L·(weight_bytes_attn + ((mlp_weight_elems_per_expert
    ·unique)·dtype_bytes))`` with ``unique = float(E)·(1.0 − pow_int(1.0 − k/E, max(1, B)))``.
    """
    if not cfg.is_moe:
        return cfg.weight_bytes_total
    activation = 1.0 - pow_int(1.0 - cfg.moe_top_k_fraction, max(1, scheduled_tokens))
    unique = float(cfg.num_experts) * activation
    mlp = (cfg.mlp_weight_elems_per_expert * unique) * cfg.dtype_bytes
    return float(cfg.num_layers) * (cfg.weight_bytes_attn + mlp)


def _indicator(flag: bool) -> float:
    return 1.0 if flag else 0.0


# --------------------------------------------------------------------------- alpha (raw)
# g = congestion_gate(cfg, q.running_depth, q.kv_usage_ratio) for features 5-11.


def alpha_batch_saturation(cfg: PhysicsConfig, q: PhysicsQueueInputs) -> float:
    """a1 = float(running_depth)/max(ε, float(max_num_seqs)); ratio (not capped at 1)."""
    return float(q.running_depth) / max(EPSILON, float(cfg.max_num_seqs))


def alpha_kv_memory_pressure(cfg: PhysicsConfig, q: PhysicsQueueInputs) -> float:
    """a2 = kv_usage_ratio; ratio."""
    return q.kv_usage_ratio


def alpha_admission_compute_cost(cfg: PhysicsConfig, q: PhysicsQueueInputs) -> float:
    """a3 = (float(prompt_tokens)·flops_linear_per_token)/hw_peak_flops; s."""
    return (float(q.prompt_tokens) * cfg.flops_linear_per_token) / cfg.hw_peak_flops


def alpha_queue_drain_estimate(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a5 = (g·log1p_int(waiting_depth))·roofline_step_time; s."""
    return (g * log1p_int(q.waiting_depth)) * cfg.roofline_step_time


def alpha_queue_memory_interaction(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a6 = ((g·kv_usage_ratio)·float(waiting_depth))/max(ε, float(max_num_seqs)); ratio."""
    return ((g * q.kv_usage_ratio) * float(q.waiting_depth)) / max(EPSILON, float(cfg.max_num_seqs))


def alpha_prefix_cache_benefit(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a7 = ((g·prefix_hit_ratio)·float(prompt_tokens))/max(ε, float(max_num_batched_tokens))."""
    return ((g * q.prefix_hit_ratio) * float(q.prompt_tokens)) / max(
        EPSILON, float(cfg.max_num_batched_tokens)
    )


def alpha_memory_admission_gap(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a8 = ((g·float(prompt_tokens))·kv_bytes_per_token)/max(ε, kv_free_bytes); ratio."""
    return ((g * float(q.prompt_tokens)) * cfg.kv_bytes_per_token) / max(EPSILON, q.kv_free_bytes)


def alpha_preemption_disruption(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a9 = g·preemption_ema; ratio."""
    return g * q.preemption_ema


def alpha_cpu_offload_expansion(cfg: PhysicsConfig, q: PhysicsQueueInputs, g: float) -> float:
    """a10 = ((g·cpu_offload_active)·cpu_kv_capacity_bytes)/max(ε, gpu_kv_capacity_bytes)."""
    return ((g * _indicator(cfg.cpu_offload_active)) * cfg.cpu_kv_capacity_bytes) / max(
        EPSILON, cfg.gpu_kv_capacity_bytes
    )


def alpha_features(cfg: PhysicsConfig, q: PhysicsQueueInputs) -> tuple[float, ...]:
    """The 11 clamped alpha features in §P.5 order (a1 … a11; a4 = 1.0, a11 = g·1.0)."""
    g = congestion_gate(cfg, q.running_depth, q.kv_usage_ratio)
    c = clamp_feature
    return (
        c(alpha_batch_saturation(cfg, q)),
        c(alpha_kv_memory_pressure(cfg, q)),
        c(alpha_admission_compute_cost(cfg, q)),
        1.0,
        c(alpha_queue_drain_estimate(cfg, q, g)),
        c(alpha_queue_memory_interaction(cfg, q, g)),
        c(alpha_prefix_cache_benefit(cfg, q, g)),
        c(alpha_memory_admission_gap(cfg, q, g)),
        c(alpha_preemption_disruption(cfg, q, g)),
        c(alpha_cpu_offload_expansion(cfg, q, g)),
        c(g * 1.0),
    )


# --------------------------------------------------------------------------- beta (raw)


def beta_prefill_linear_compute(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b1 = (float(prefill_tokens)·flops_linear_per_token)/hw_peak_flops; s."""
    return (float(s.prefill_tokens) * cfg.flops_linear_per_token) / cfg.hw_peak_flops


def beta_prefill_quadratic_attention(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b2 = (float(sum_prefill_attn_work)·attn_flops_per_work_unit)/hw_peak_flops; s."""
    return (float(s.sum_prefill_attn_work) * cfg.attn_flops_per_work_unit) / cfg.hw_peak_flops


def beta_decode_weight_loading(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b3 = effective_weight_bytes(scheduled_tokens)/hw_peak_bandwidth if decode_tokens > 0
    else 0.0; s."""
    if s.decode_tokens <= 0:
        return 0.0
    return effective_weight_bytes(cfg, s.scheduled_tokens) / cfg.hw_peak_bandwidth


def beta_decode_attention_compute(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b4 = (float(decode_context_tokens)·attn_flops_per_work_unit)/hw_peak_flops; s."""
    return (float(s.decode_context_tokens) * cfg.attn_flops_per_work_unit) / cfg.hw_peak_flops


def beta_kv_cache_read_cost(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b5 = (float(sum_decode_kv_blocks)·block_size_bytes)/hw_peak_bandwidth; s."""
    return (float(s.sum_decode_kv_blocks) * cfg.block_size_bytes) / cfg.hw_peak_bandwidth


def beta_batch_utilization(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b6 = float(scheduled_tokens)/max(ε, float(max_num_batched_tokens)); ratio."""
    return float(s.scheduled_tokens) / max(EPSILON, float(cfg.max_num_batched_tokens))


def beta_prefill_decode_mix(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b7 = float(prefill_tokens)/max(ε, float(prefill_tokens + decode_tokens)); ratio."""
    return float(s.prefill_tokens) / max(EPSILON, float(s.prefill_tokens + s.decode_tokens))


def beta_tp_communication(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b9 = (comm_bytes_per_token·float(scheduled_tokens))/hw_interconnect_bw if tp > 1
    else 0.0; s."""
    if cfg.tp <= 1:
        return 0.0
    return (cfg.comm_bytes_per_token * float(s.scheduled_tokens)) / cfg.hw_interconnect_bw


def beta_fixed_step_overhead(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b11 = 1.0/float(max(1, scheduled_tokens)); 1/token."""
    return 1.0 / float(max(1, s.scheduled_tokens))


def beta_cpu_offload_transfer(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b13 = (float(transfer_blocks)·block_size_bytes)/hw_pcie_bandwidth_eff if CPU offloading
    else 0.0; s."""
    if not cfg.cpu_offload_active:
        return 0.0
    return (float(s.transfer_blocks) * cfg.block_size_bytes) / cfg.hw_pcie_bandwidth_eff


def beta_cpu_offload_kv_read(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b14 = (float(cpu_resident_read_blocks)·block_size_bytes)/hw_pcie_bandwidth_eff if CPU
    offloading else 0.0; s."""
    if not cfg.cpu_offload_active:
        return 0.0
    return (float(s.cpu_resident_read_blocks) * cfg.block_size_bytes) / cfg.hw_pcie_bandwidth_eff


def beta_chunked_prefill_indicator(cfg: PhysicsConfig, s: PhysicsStepInputs) -> float:
    """b15 = 1.0 if chunked prefill is enabled and the step has both prefill and decode
    requests, else 0.0."""
    both = s.num_prefill_reqs > 0 and s.num_decode_reqs > 0
    return _indicator(cfg.chunked_prefill_enabled and both)


def beta_features(cfg: PhysicsConfig, s: PhysicsStepInputs) -> tuple[float, ...]:
    """The 16 clamped beta features in §P.6 order (b8 = :func:`moe_activation`,
    b10 = gqa_ratio, b12 = preemption_ema, b16 = 1.0)."""
    c = clamp_feature
    return (
        c(beta_prefill_linear_compute(cfg, s)),
        c(beta_prefill_quadratic_attention(cfg, s)),
        c(beta_decode_weight_loading(cfg, s)),
        c(beta_decode_attention_compute(cfg, s)),
        c(beta_kv_cache_read_cost(cfg, s)),
        c(beta_batch_utilization(cfg, s)),
        c(beta_prefill_decode_mix(cfg, s)),
        c(moe_activation(cfg, s.scheduled_tokens)),
        c(beta_tp_communication(cfg, s)),
        c(cfg.gqa_ratio),
        c(beta_fixed_step_overhead(cfg, s)),
        c(s.preemption_ema),
        c(beta_cpu_offload_transfer(cfg, s)),
        c(beta_cpu_offload_kv_read(cfg, s)),
        c(beta_chunked_prefill_indicator(cfg, s)),
        1.0,
    )


# --------------------------------------------------------------------------- dot products


def dot_left_to_right(coeffs: Sequence[float], features: Sequence[float]) -> float:
    """``acc = 0.0``; for i = 0, 1, …: ``acc = acc + coeffs[i]*features[i]``."""
    acc = 0.0
    for c, f in zip(coeffs, features, strict=True):
        acc = acc + c * f
    return acc


def queueing_delay_from_features(alpha: Sequence[float], features: Sequence[float]) -> int:
    """``max(0, trunc(α·F_queue))`` µs (a delay is never negative)."""
    return max(0, float_to_ticks(dot_left_to_right(alpha, features)))


def step_time_from_features(beta: Sequence[float], features: Sequence[float]) -> int:
    """``max(1, trunc(β·F_step))`` µs (BLIS: a step lasts at least one tick)."""
    return max(1, float_to_ticks(dot_left_to_right(beta, features)))
