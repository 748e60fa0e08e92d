"""BLIS's roofline step time inside the compiled program, bit-identical to the reference.

Counterpart: ``blisjax.latency.roofline`` (``split_roofline_requests``,
``roofline_step_seconds``, ``roofline_step_time_us``; docs/roofline.md §2–§3). The same float64
operations run in the same order, with three precautions that make XLA round every one of them
as Python does (docs/roofline.md, "Numerical rules"; docs/jax-engine.md, Exactness):

* **Host tables for what depends on the new tokens t alone.** The reference's own functions
  (``token_flop_terms``, ``weight_bytes`` with MoE's expected distinct experts and Go's
  ``math.Pow``, ``kv_bytes``, ``activation_bytes``) fill a table indexed by t = 0 .. the most
  tokens a step can hold (``RooflineConsts.by_tokens``). The step's weights, read once at the
  step's total token count, come from the same table.
* **No multiply that XLA could fuse into the following add.** A product whose result is added
  (attention and vector FLOPs times the layer count, the KV read of the context) is formed by
  ``exactfloat.exact_mul``, which leaves no float multiply to contract into a fused
  multiply-add. Products that only feed further products or divisions cannot be contracted.
* **Divisors XLA cannot see as constants.** XLA rewrites ``x / c`` as ``x * (1/c)`` when c is
  a compile-time constant, and also when c is a *broadcast scalar*, even a traced one (the
  model's TP, FLOP rates and bandwidth are scalars shared by every lane and position). So the
  constants are arguments, never literals, and each divisor is first spread to the
  numerator's shape behind ``lax.optimization_barrier`` (:func:`_divisor`): the division then
  has an ordinary array operand and stays a division. XLA also rewrites ``(a / b) / c`` as
  ``a / (b·c)``; a barrier between the two divisions keeps them apart.

The float sums of the reference run over the prefill requests in batch order, then over the
decode requests in batch order. Here each sum is one chain of additions over the batch
positions, twice: the first pass adds each prefill request's term and 0.0 elsewhere, the second
each decode request's term and 0.0 elsewhere. Every term is >= +0.0 and adding +0.0 to a value
>= +0.0 returns it bit for bit, so the chain rounds exactly as the reference's loop does.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from blisjax.engine.exactfloat import exact_mul
from blisjax.latency.base import float_to_ticks_array
from blisjax.latency.roofline import (
    RooflineLatency,
    activation_bytes,
    kv_bytes,
    token_flop_terms,
    weight_bytes,
)

F64 = jnp.float64

# Columns of RooflineConsts.by_tokens: the t-only terms of one request's FLOPs and bytes.
GEMM, CTX_OFFSET, FOUR_HEADS_T, FIVE_HEADS_T, TWO_T_D, MOE, DENSE, WEIGHTS, KV_WRITE, ACT = \
    range(10)
TOKEN_COLUMNS = 10


class RooflineConsts(NamedTuple):
    """Roofline constants of one model on one GPU at one TP, as traced float64 arrays.

    Attributes:
      by_tokens: [T + 1, 10] float64, row t = the t-only terms for t new tokens, columns
        ``GEMM`` .. ``ACT`` (``blisjax.latency.roofline.token_flop_terms`` fields in FLOPs,
        then weight bytes W(t), KV bytes written for t tokens, activation bytes of t tokens).
        T = token budget + batch slots bounds a step's total tokens (prefill chunks fit the
        budget; each decode counts 1).
      head_dim: dh = d/H.  layers: L as a float.
      kv_bytes_per_token: KV bytes of one token over all layers (bytes).
      tp: float(TP).
      prefill_flops, decode_flops: FLOP/s of prefill and decode requests (peak·MFU).
      bandwidth: HBM bytes/s.
      us_per_s: 1e6.
    """

    by_tokens: jax.Array
    head_dim: jax.Array
    layers: jax.Array
    kv_bytes_per_token: jax.Array
    tp: jax.Array
    prefill_flops: jax.Array
    decode_flops: jax.Array
    bandwidth: jax.Array
    us_per_s: jax.Array


def token_table(model: RooflineLatency, max_tokens: int) -> np.ndarray:
    """[max_tokens + 1, 10] float64 host table of the t-only terms, from the reference's own
    functions (row t for t new tokens; row 0 is never read for a request, only as the weights
    of an empty step, which the kernel replaces by 1 µs)."""
    a = model.arch
    rows = []
    for t in range(max_tokens + 1):
        f = token_flop_terms(a, t)
        rows.append((f.gemm, f.ctx_offset, f.four_heads_t, f.five_heads_t, f.two_t_d, f.moe,
                     f.dense, weight_bytes(a, t), kv_bytes(a, t), activation_bytes(a, t)))
    return np.array(rows, dtype=np.float64).reshape(max_tokens + 1, TOKEN_COLUMNS)


def roofline_consts(model: RooflineLatency | None, max_tokens: int) -> RooflineConsts:
    """Traced constants for ``model`` with a table up to ``max_tokens`` tokens per step;
    ``None`` (another latency model) gives a one-row placeholder of the same structure."""
    if model is None:
        zero = jnp.asarray(0.0, F64)
        return RooflineConsts(jnp.zeros((1, TOKEN_COLUMNS), F64), *([zero] * 8))
    a, r = model.arch, model.rates

    def f64(x: float):
        return jnp.asarray(x, F64)

    return RooflineConsts(
        by_tokens=jnp.asarray(token_table(model, max_tokens)),
        head_dim=f64(a.head_dim), layers=f64(a.layers),
        kv_bytes_per_token=f64(a.kv_bytes_per_token), tp=f64(r.tp),
        prefill_flops=f64(r.prefill_flops), decode_flops=f64(r.decode_flops),
        bandwidth=f64(r.bandwidth), us_per_s=f64(1e6))


class RooflineSeconds(NamedTuple):
    """(compute s, memory s) of one step and whether it has any roofline request."""

    compute: jax.Array  # float64 s
    memory: jax.Array  # float64 s
    any_request: jax.Array  # bool


def _divisor(value, like):
    """``value`` (a scalar shared by every lane) spread to the shape of the bool array
    ``like`` (batched over lanes), behind an optimization barrier: dividing by it is an IEEE
    division, where dividing by the broadcast scalar would become a multiplication by its
    rounded reciprocal."""
    return lax.optimization_barrier(jnp.where(like, value, value))


def _ordered_sum(terms, prefill, decode):
    """0.0 + prefill terms in position order, then + decode terms in position order, one
    addition per position and pass (absent positions add +0.0: no change to a value >= 0)."""
    total = jnp.zeros(terms.shape[:-1], F64)
    zero = jnp.zeros_like(total)
    for mask in (prefill, decode):
        for k in range(terms.shape[-1]):
            total = total + jnp.where(mask[..., k], terms[..., k], zero)
    return total


def step_seconds(rc: RooflineConsts, nn, pi, l_in, out) -> RooflineSeconds:
    """Compute and memory seconds of one step (``roofline_step_seconds`` after
    ``split_roofline_requests``).

    Args (each [W], the running batch in running order): ``nn`` new tokens this step (> 0 =
    scheduled), ``pi`` progress at the step's start, ``l_in`` input tokens, ``out`` output
    tokens. Prefill: scheduled and pi < l_in (s = pi, t = nn); decode: scheduled, pi >= l_in and
    out > 0 (s = pi, t = 1); other positions contribute nothing. ``nn`` must be at most the
    table's last row.
    """
    sched = nn > 0
    prefill = sched & (pi < l_in)
    decode = sched & (pi >= l_in) & (out > 0)
    t = jnp.where(prefill, nn, 1)
    row = rc.by_tokens[t]  # [W, 10]
    sf = pi.astype(F64)
    ctx = sf + row[..., CTX_OFFSET]  # s + (t − 1)/2 for t > 1, s + 0.0 = s otherwise
    attn = (row[..., FOUR_HEADS_T] * ctx) * rc.head_dim
    vec = exact_mul(row[..., FIVE_HEADS_T], ctx) + row[..., TWO_T_D]
    gemm = row[..., GEMM] + exact_mul(attn, rc.layers)
    sram = exact_mul(vec, rc.layers)
    gemm = gemm + row[..., MOE]  # + 0.0 without MoE layers
    gemm = gemm + row[..., DENSE]  # + 0.0 without dense layers
    flops = gemm + sram
    tp = _divisor(rc.tp, prefill)
    rate = _divisor(jnp.where(prefill, rc.prefill_flops, rc.decode_flops), prefill)
    # The barrier keeps XLA from rewriting (a / b) / c as a / (b·c).
    compute_terms = lax.optimization_barrier(flops / tp) / rate
    w = row[..., WEIGHTS]
    total = ((w + row[..., KV_WRITE]) + exact_mul(rc.kv_bytes_per_token, sf)) + row[..., ACT]
    dynamic_terms = (total - w) / tp
    compute = _ordered_sum(compute_terms, prefill, decode)
    dynamic = _ordered_sum(dynamic_terms, prefill, decode)
    n_tok = jnp.sum(jnp.where(prefill, nn, 0)) + jnp.sum(decode)
    any_request = jnp.any(prefill | decode)
    memory = ((rc.by_tokens[n_tok, WEIGHTS] / _divisor(rc.tp, any_request)) + dynamic) \
        / _divisor(rc.bandwidth, any_request)
    return RooflineSeconds(compute, memory, any_request)


def step_time_us(rc: RooflineConsts, nn, pi, l_in, out):
    """int64 µs of one step: max(1, trunc(max(compute, memory)·1e6)), 1 for a step without
    roofline requests (``roofline_step_time_us``). Arguments as :func:`step_seconds`."""
    sec = step_seconds(rc, nn, pi, l_in, out)
    ticks = float_to_ticks_array(jnp.maximum(sec.compute, sec.memory) * rc.us_per_s, jnp)
    return jnp.where(sec.any_request, jnp.maximum(1, ticks), 1)
