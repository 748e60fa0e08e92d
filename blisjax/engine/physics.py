"""The physics latency model inside the compiled program, bit-identical to the reference.

Counterpart: ``blisjax.latency.physics`` (``PhysicsStepInputs.from_batch``,
``PhysicsQueueInputs.from_state``, ``update_preemption_ema``, ``alpha_features``,
``beta_features`` and the two dot products; docs/latency-models.md §P.4–§P.7). The model was
specified for this: float64 formulas with one rounding per operation in a fixed order, no
library transcendental. Three precautions make XLA round each operation as Python does
(docs/jax-engine.md, Exactness):

* **Host tables for what depends on one small integer.** The β features that depend only on
  the step's token count B (weight loading with MoE's expected distinct experts, batch
  utilization, MoE activation, TP communication, fixed overhead) or on its prefill tokens
  (prefill compute) are rows of ``PhysicsConsts.by_tokens``, and ``ln(1 + waiting depth)``
  (``log1p_int``) a row of ``PhysicsConsts.log1p_depth``, each filled by the reference's own
  functions and clamped there.
* **No product next to an addition.** XLA:CPU contracts ``a*b + c`` into one fused
  multiply-add. Every product that is added or subtracted (the congestion gate's s·m, the
  EMA's two terms, each coefficient times its feature) is formed by
  ``exactfloat.exact_mul``, which leaves no float multiply to fuse. Products that only feed
  further products, divisions or clamps cannot be contracted.
* **Divisors XLA cannot see as constants.** Every division goes through
  ``exactfloat.ieee_divide``: XLA rewrites a division by a scalar shared by the lanes as a
  multiplication by its reciprocal. The model's constants are arguments of the program, never
  literals.

``tests/engine/test_physics_graph.py`` compares every feature's bits, the step times, the EMA
and the queueing delays with the reference on thousands of random inputs, with coefficients
whose products are all inexact (where a contracted or rewritten operation shows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.engine.exactfloat import exact_mul, ieee_divide
from blisjax.latency.base import float_to_ticks_array
from blisjax.latency.physics import PhysicsLatency, PhysicsStepInputs
from blisjax.latency.physics.features import (
    FEATURE_MAX,
    NUM_ALPHA_FEATURES,
    NUM_BETA_FEATURES,
    beta_batch_utilization,
    beta_decode_weight_loading,
    beta_fixed_step_overhead,
    beta_prefill_linear_compute,
    beta_tp_communication,
    clamp_feature,
    log1p_int,
    moe_activation,
)
from blisjax.latency.physics.inputs import EPSILON

F64 = jnp.float64

# Columns of PhysicsConsts.by_tokens: clamped β features that depend on one token count.
PREFILL_LINEAR, WEIGHT_LOADING, UTILIZATION, MOE_ACTIVATION, TP_COMMUNICATION, FIXED_OVERHEAD = \
    range(6)
TOKEN_COLUMNS = 6


class PhysicsConsts(NamedTuple):
    """One physics model's coefficients, tables and constants, as traced arrays.

    Attributes:
      alpha: [11] float64 α coefficients (µs per feature unit).
      beta: [16] float64 β coefficients.
      by_tokens: [T + 1, 6] float64: row t holds the clamped β features 1 (t prefill tokens),
        3 (B = t, a step with decode requests), 6, 8, 9 and 11 (B = t), columns
        ``PREFILL_LINEAR`` .. ``FIXED_OVERHEAD``; T = the most tokens a step holds.
      log1p_depth: [Q + 1] float64: ``log1p_int(w)`` for a waiting depth w = 0 .. Q (the
        wait-queue capacity).
      gamma, one_minus_gamma: the preemption EMA's γ and 1 − γ.
      seqs_den: max(ε, max_num_seqs).  batched_den: max(ε, max_num_batched_tokens).
      total_blocks: the GPU KV blocks as a float.  capacity_bytes: blocks · block bytes.
      block_tokens: KV block size in tokens (int64).  block_bytes: block bytes (float64).
      flops_per_token, attn_flops_per_unit, peak_flops, peak_bandwidth: §P.3's constants.
      kv_bytes_per_token, roofline_step_time: §P.3's constants.
      cpu_indicator, cpu_capacity_bytes, gpu_capacity_den: α feature 10's factors
        (1.0 or 0.0 for CPU offloading; max(ε, GPU KV bytes)).
      gqa: β feature 10, clamped.  epsilon: ε (1e-6).
      prefix_caching, chunked_prefill: bool.
    """

    alpha: jax.Array
    beta: jax.Array
    by_tokens: jax.Array
    log1p_depth: jax.Array
    gamma: jax.Array
    one_minus_gamma: jax.Array
    seqs_den: jax.Array
    batched_den: jax.Array
    total_blocks: jax.Array
    capacity_bytes: jax.Array
    block_tokens: jax.Array
    block_bytes: jax.Array
    flops_per_token: jax.Array
    attn_flops_per_unit: jax.Array
    peak_flops: jax.Array
    peak_bandwidth: jax.Array
    kv_bytes_per_token: jax.Array
    roofline_step_time: jax.Array
    cpu_indicator: jax.Array
    cpu_capacity_bytes: jax.Array
    gpu_capacity_den: jax.Array
    gqa: jax.Array
    epsilon: jax.Array
    prefix_caching: jax.Array
    chunked_prefill: jax.Array


def _tokens_row(cfg, t: int) -> tuple[float, ...]:
    """Row t of ``by_tokens`` from the reference's feature functions."""
    as_prefill = PhysicsStepInputs(prefill_tokens=t, decode_tokens=0, num_prefill_reqs=0,
                                   num_decode_reqs=0, sum_prefill_attn_work=0,
                                   decode_context_tokens=0, sum_decode_kv_blocks=0,
                                   preemption_ema=0.0)
    # B = t with at least one decode token (feature 3 is 0.0 without one, chosen in the kernel)
    step = PhysicsStepInputs(prefill_tokens=max(t - 1, 0), decode_tokens=min(t, 1),
                             num_prefill_reqs=0, num_decode_reqs=0, sum_prefill_attn_work=0,
                             decode_context_tokens=0, sum_decode_kv_blocks=0,
                             preemption_ema=0.0)
    c = clamp_feature
    return (c(beta_prefill_linear_compute(cfg, as_prefill)),
            c(beta_decode_weight_loading(cfg, step)), c(beta_batch_utilization(cfg, step)),
            c(moe_activation(cfg, t)), c(beta_tp_communication(cfg, step)),
            c(beta_fixed_step_overhead(cfg, step)))


def physics_consts(model: PhysicsLatency | None, max_tokens: int,
                   max_waiting: int) -> PhysicsConsts:
    """Traced constants of ``model`` with token tables up to ``max_tokens`` tokens per step and
    waiting depths up to ``max_waiting``; ``None`` (another latency model) gives one-row
    placeholders of the same structure."""
    put = jax.device_put  # host values placed as they are: jnp.asarray compiles per value

    def f64(x):
        return put(np.asarray(x, np.float64))

    if model is None:
        fields = dict.fromkeys(PhysicsConsts._fields, f64(0.0))
        fields.update(alpha=f64(np.zeros(NUM_ALPHA_FEATURES)),
                      beta=f64(np.zeros(NUM_BETA_FEATURES)),
                      by_tokens=f64(np.zeros((1, TOKEN_COLUMNS))), log1p_depth=f64(np.zeros(1)),
                      block_tokens=put(np.int64(1)), prefix_caching=put(np.bool_(False)),
                      chunked_prefill=put(np.bool_(False)))
        return PhysicsConsts(**fields)
    cfg, coef = model.config, model.coefficients
    by_tokens = np.array([_tokens_row(cfg, t) for t in range(max_tokens + 1)], np.float64)
    return PhysicsConsts(
        alpha=f64(coef.alpha), beta=f64(coef.beta),
        by_tokens=put(by_tokens.reshape(max_tokens + 1, TOKEN_COLUMNS)),
        log1p_depth=f64([log1p_int(w) for w in range(max_waiting + 1)]),
        gamma=f64(coef.gamma), one_minus_gamma=f64(1.0 - coef.gamma),
        seqs_den=f64(max(EPSILON, float(cfg.max_num_seqs))),
        batched_den=f64(max(EPSILON, float(cfg.max_num_batched_tokens))),
        total_blocks=f64(float(cfg.total_kv_blocks_gpu)),
        capacity_bytes=f64(float(cfg.total_kv_blocks_gpu) * cfg.block_size_bytes),
        block_tokens=put(np.int64(cfg.block_size_tokens)), block_bytes=f64(cfg.block_size_bytes),
        flops_per_token=f64(cfg.flops_linear_per_token),
        attn_flops_per_unit=f64(cfg.attn_flops_per_work_unit),
        peak_flops=f64(cfg.hw_peak_flops), peak_bandwidth=f64(cfg.hw_peak_bandwidth),
        kv_bytes_per_token=f64(cfg.kv_bytes_per_token),
        roofline_step_time=f64(cfg.roofline_step_time),
        cpu_indicator=f64(1.0 if cfg.cpu_offload_active else 0.0),
        cpu_capacity_bytes=f64(cfg.cpu_kv_capacity_bytes),
        gpu_capacity_den=f64(max(EPSILON, cfg.gpu_kv_capacity_bytes)),
        gqa=f64(clamp_feature(cfg.gqa_ratio)), epsilon=f64(EPSILON),
        prefix_caching=put(np.bool_(cfg.prefix_caching_enabled)),
        chunked_prefill=put(np.bool_(cfg.chunked_prefill_enabled)))


def _clamp(x):
    """``clamp_feature``: min(100, max(0, x))."""
    return jnp.minimum(FEATURE_MAX, jnp.maximum(0.0, x))


def dot_left_to_right(coeffs, features):
    """``dot_left_to_right``: 0.0 + c0·f0 + c1·f1 + ..., each product rounded on its own."""
    acc = jnp.zeros(jnp.shape(features[0]), F64)
    for k, f in enumerate(features):
        acc = acc + exact_mul(coeffs[k], f)
    return acc


def _as_f64(x):
    return jnp.asarray(x).astype(F64)


def update_ema(pc: PhysicsConsts, ema, num_preempted, running_depth):
    """``update_preemption_ema``: (γ·rate) + ((1 − γ)·ema), rate = preempted / max(1,
    running). float64 per lane."""
    rate = ieee_divide(_as_f64(num_preempted), _as_f64(jnp.maximum(1, running_depth)))
    return exact_mul(pc.gamma, rate) + exact_mul(pc.one_minus_gamma, ema)


def step_features(pc: PhysicsConsts, nn, pi, l_in, out, cached, ema) -> tuple:
    """The 16 β features (§P.6 order) of one step (``step_inputs``, then ``beta_features``).

    Args: batch arrays [..., W] in running order: ``nn`` new tokens (> 0 = scheduled), ``pi``
    progress at the step's start, ``l_in`` input and ``out`` output tokens, ``cached`` prefix
    tokens credited to a request admitted in this step (else 0); ``ema`` [...]: the EMA after
    this step's update (:func:`update_ema`).
    """
    sched = nn > 0
    prefill = sched & (pi < l_in)
    decode = sched & (pi >= l_in) & (out > 0)
    t = nn.astype(jnp.int64)
    ctx = pi.astype(jnp.int64) + cached.astype(jnp.int64) + t

    def total(x, where):
        return jnp.sum(jnp.where(where, x, 0), axis=-1)

    prefill_tokens, decode_tokens = total(t, prefill), total(t, decode)
    work, context = total(ctx * t, prefill), total(ctx, decode)
    blocks = total((ctx + pc.block_tokens - 1) // pc.block_tokens, decode)
    scheduled = prefill_tokens + decode_tokens
    row = pc.by_tokens[scheduled]
    attn, peak = pc.attn_flops_per_unit, pc.peak_flops
    return (
        pc.by_tokens[prefill_tokens, PREFILL_LINEAR],
        _clamp(ieee_divide(_as_f64(work) * attn, peak)),
        jnp.where(decode_tokens > 0, row[..., WEIGHT_LOADING], 0.0),
        _clamp(ieee_divide(_as_f64(context) * attn, peak)),
        _clamp(ieee_divide(_as_f64(blocks) * pc.block_bytes, pc.peak_bandwidth)),
        row[..., UTILIZATION],
        _clamp(ieee_divide(_as_f64(prefill_tokens),
                           jnp.maximum(pc.epsilon, _as_f64(scheduled)))),
        row[..., MOE_ACTIVATION],
        row[..., TP_COMMUNICATION],
        jnp.broadcast_to(pc.gqa, ema.shape),
        row[..., FIXED_OVERHEAD],
        _clamp(ema),
        # features 13 and 14 (GPU↔CPU block traffic) are 0: no engine moves blocks this way
        jnp.zeros_like(ema), jnp.zeros_like(ema),
        jnp.where(pc.chunked_prefill & jnp.any(prefill, axis=-1) & jnp.any(decode, axis=-1),
                  1.0, 0.0),
        jnp.ones_like(ema),
    )


def _step_us(pc: PhysicsConsts, features):
    """``step_time_us``: max(1, trunc(β·F)) µs."""
    return jnp.maximum(1, float_to_ticks_array(dot_left_to_right(pc.beta, features), jnp))


class StepInputs(NamedTuple):
    """What a stateful or host-evaluated step time reads of one step, per lane: batch arrays
    [B] in running order, where ``new_tokens`` > 0 marks the scheduled requests
    (``progress`` at the step start, ``cached_tokens`` the prefix tokens of requests admitted
    this step); the preemption EMA before the step; the step's preemption count and running
    depth after batch formation."""

    new_tokens: jax.Array
    progress: jax.Array
    input_tokens: jax.Array
    output_tokens: jax.Array
    cached_tokens: jax.Array
    ema: jax.Array
    num_preempted: jax.Array
    running_depth: jax.Array


def step_time(pc: PhysicsConsts, x: StepInputs):
    """(duration µs >= 1, updated EMA) of one step: the reference ``_step``'s EMA update from
    ``x.ema`` (before the step) with the step's preemption count and running depth after
    batch formation, then its features (:func:`step_features`) and time."""
    ema = update_ema(pc, x.ema, x.num_preempted, x.running_depth)
    features = step_features(pc, x.new_tokens, x.progress, x.input_tokens, x.output_tokens,
                             x.cached_tokens, ema)
    return _step_us(pc, features), ema


def plain_step_times(pc: PhysicsConsts, keep, pi, l_in, out, ema, steps: int):
    """(int64 µs [steps], float64 EMA [steps + 1]) of the plain steps k = 0 .. steps − 1 of a
    decode stretch (``blisjax.engine.stretch``): the requests ``keep`` ([W], progress ``pi``
    after the step just run) each decode one token at progress pi + k, nothing is admitted or
    preempted, and the running depth is theirs. EMA entry 0 is ``ema`` (after the step just
    run), entry k + 1 the EMA after plain step k: the reference's update with no preemption,
    one step after the other."""
    depth = jnp.sum(keep, dtype=jnp.int32)
    zero = jnp.zeros((), jnp.int32)

    def one_step(ema, _):
        after = update_ema(pc, ema, zero, depth)
        return after, after

    _, later = jax.lax.scan(one_step, ema, None, length=steps)
    k = jnp.arange(steps, dtype=pi.dtype)[:, None]
    nn = jnp.broadcast_to(keep.astype(jnp.int32), (steps, keep.shape[0]))
    features = step_features(pc, nn, pi[None, :] + k, l_in[None, :], out[None, :],
                             jnp.zeros_like(nn), later)
    return _step_us(pc, features), jnp.concatenate([ema[None], later])


def queue_features(pc: PhysicsConsts, running_depth, waiting_depth, kv_used_blocks,
                   prompt_tokens, prefix_cached_blocks, ema, cpu_blocks=None) -> tuple:
    """The 11 α features (§P.5 order) of a request an instance receives
    (``PhysicsQueueInputs.from_state``, then ``alpha_features``). Arrays of one shape: the
    running and waiting depths, used KV blocks, the prompt's tokens and cached prefix blocks,
    the instance's EMA; ``cpu_blocks``: the lane's CPU tier size (feature 10; None: the
    configuration's, ``PhysicsConsts.cpu_capacity_bytes``)."""
    if cpu_blocks is None:
        cpu_on, cpu_bytes = pc.cpu_indicator, pc.cpu_capacity_bytes
    else:  # exact: integer-valued products far below 2^53
        cpu_on = jnp.where(cpu_blocks > 0, 1.0, 0.0)
        cpu_bytes = jnp.where(cpu_blocks > 0, _as_f64(cpu_blocks) * pc.block_bytes, 0.0)
    usage = ieee_divide(_as_f64(kv_used_blocks), pc.total_blocks)
    free_bytes = pc.capacity_bytes * jnp.maximum(pc.epsilon, 1.0 - usage)
    prompt = _as_f64(prompt_tokens)
    hit = jnp.where(pc.prefix_caching,
                    ieee_divide(_as_f64(prefix_cached_blocks * pc.block_tokens),
                                _as_f64(jnp.maximum(1, prompt_tokens))), 0.0)
    saturation = ieee_divide(_as_f64(running_depth), pc.seqs_den)
    s, m = jnp.minimum(1.0, saturation), jnp.minimum(1.0, jnp.maximum(0.0, usage))
    g = (s + m) - exact_mul(s, m)
    waiting = _as_f64(waiting_depth)
    return (
        _clamp(saturation),
        _clamp(usage),
        _clamp(ieee_divide(prompt * pc.flops_per_token, pc.peak_flops)),
        jnp.ones_like(g),
        _clamp((g * pc.log1p_depth[waiting_depth]) * pc.roofline_step_time),
        _clamp(ieee_divide((g * usage) * waiting, pc.seqs_den)),
        _clamp(ieee_divide((g * hit) * prompt, pc.batched_den)),
        _clamp(ieee_divide((g * prompt) * pc.kv_bytes_per_token,
                           jnp.maximum(pc.epsilon, free_bytes))),
        _clamp(g * ema),
        _clamp(ieee_divide((g * cpu_on) * cpu_bytes, pc.gpu_capacity_den)),
        _clamp(g),
    )


def queueing_delay(pc: PhysicsConsts, *inputs, cpu_blocks=None):
    """α delay in µs, >= 0 (``queueing_delay_us``: max(0, trunc(α·F))). Arguments as
    :func:`queue_features`."""
    features = queue_features(pc, *inputs, cpu_blocks=cpu_blocks)
    return jnp.maximum(0, float_to_ticks_array(dot_left_to_right(pc.alpha, features), jnp))
