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
* **No product that a fused multiply-add could round differently.** XLA:CPU contracts
  ``a*b + c`` into one FMA. The three products whose results are added (attention and vector
  FLOPs times the layer count L, 5H·t times the attention context, the KV bytes per token
  times the context s) are formed by :func:`mul_by_short`: one factor has at most 26
  significant bits, the other is split so that both partial products are exact, and their sum
  rounds once to the IEEE product whether or not the compiler fuses one of them into the
  addition. L always qualifies; of the other two pairs, one factor qualifies for every shipped
  model (5H·t and the KV bytes per token are small integers times a power of two) and for any
  workload whose contexts are below 2^25 tokens; :func:`fits_the_program` checks a
  configuration on the host, and the engine evaluates the others on the host through the
  callback (``blisjax.engine.hostlatency``). Products that only feed further products or
  divisions cannot be contracted.
* **Divisors XLA cannot see as constants.** XLA rewrites ``x / c`` as ``x * (1/c)`` when c is
  a compile-time constant, and also when c is a *broadcast scalar*, even a traced one (the
  model's TP, FLOP rates and bandwidth are scalars shared by every lane and position). So the
  constants are arguments, never literals, and each divisor is first spread to the
  numerator's shape behind ``lax.optimization_barrier`` (``exactfloat.spread_divisor``): the division then
  has an ordinary array operand and stays a division. XLA also rewrites ``(a / b) / c`` as
  ``a / (b·c)``; a barrier between the two divisions keeps them apart.

The float sums of the reference run over the prefill requests in batch order, then over the
decode requests in batch order. Here each sum is one chain of additions over the batch
positions, twice: the first pass adds each prefill request's term and 0.0 elsewhere, the second
each decode request's term and 0.0 elsewhere. Every term is >= +0.0 and adding +0.0 to a value
>= +0.0 returns it bit for bit, so the chain rounds exactly as the reference's loop does. A
step in which every request decodes (the steps a decode stretch plans, :func:`decode_seconds`)
has no prefill pass: it would add +0.0 throughout.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from blisjax.engine.exactfloat import spread_divisor
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
      five_heads_t_short: bool, every 5H·t of the table has at most ``SHORT_BITS``
        significant bits (else the attention context is the short factor).
      kv_bytes_short: bool, the KV bytes per token have at most ``SHORT_BITS`` significant bits
        (else the context s is the short factor).
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
    five_heads_t_short: jax.Array
    kv_bytes_short: jax.Array


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
    # Host values placed with device_put: jnp.asarray would compile a program per value.
    put = jax.device_put
    if model is None:
        zero, true = put(np.float64(0.0)), put(np.bool_(True))
        return RooflineConsts(put(np.zeros((1, TOKEN_COLUMNS), np.float64)), *([zero] * 8),
                              true, true)
    a, r = model.arch, model.rates
    table = token_table(model, max_tokens)

    def f64(x: float):
        return put(np.float64(x))

    return RooflineConsts(
        by_tokens=put(table),
        head_dim=f64(a.head_dim), layers=f64(a.layers),
        kv_bytes_per_token=f64(a.kv_bytes_per_token), tp=f64(r.tp),
        prefill_flops=f64(r.prefill_flops), decode_flops=f64(r.decode_flops),
        bandwidth=f64(r.bandwidth), us_per_s=f64(1e6),
        five_heads_t_short=put(np.bool_(_five_heads_t_short(table))),
        kv_bytes_short=put(np.bool_(significant_bits(a.kv_bytes_per_token) <= SHORT_BITS)))


def _five_heads_t_short(table: np.ndarray) -> bool:
    return max(significant_bits(x) for x in table[:, FIVE_HEADS_T]) <= SHORT_BITS


def fits_the_program(model: RooflineLatency, max_tokens: int, max_context: int) -> bool:
    """Whether :func:`step_seconds` is exact for ``model`` with steps of at most
    ``max_tokens`` tokens and contexts (progress at a step's start) of at most
    ``max_context`` tokens: each product it adds has a factor of at most ``SHORT_BITS``
    significant bits (:func:`mul_by_short`). True for every shipped model with contexts below
    2^25 tokens; otherwise the engine computes the roofline on the host."""
    a = model.arch
    # ctx = s + (t − 1)/2 is a multiple of 1/2: its bits are those of the integer 2·ctx.
    ctx_short = (2 * max_context + max_tokens).bit_length() <= SHORT_BITS
    five_short = _five_heads_t_short(token_table(model, max_tokens)) or ctx_short
    kv_short = (significant_bits(a.kv_bytes_per_token) <= SHORT_BITS
                or max_context.bit_length() <= SHORT_BITS)
    return significant_bits(a.layers) <= SHORT_BITS and five_short and kv_short


def significant_bits(x: float) -> int:
    """Bits from the leading to the last set bit of the significand of a finite float x
    (0 for 0.0): x = m·2^e with an odd integer m of this many bits."""
    if x == 0.0:
        return 0
    m = abs(float(x)).as_integer_ratio()[0]  # x = m / 2^k, or an integer with factors of 2
    while m % 2 == 0:
        m //= 2
    return m.bit_length()


# A product x·c is formed from two exact partial products when c has at most this many
# significant bits: x_hi keeps 53 − 26 = 27 bits, x_lo the other 26 (mul_by_short).
SHORT_BITS = 26
_HIGH_MASK = ~((1 << SHORT_BITS) - 1) & ((1 << 64) - 1)


def mul_by_short(x, c):
    """The IEEE product x·c (correctly rounded) for finite x and a c with at most
    ``SHORT_BITS`` significant bits, also where the compiler contracts multiplies into adds.

    x = x_hi + x_lo exactly, x_hi being x with its low 26 significand bits cleared (<= 27
    bits) and x_lo = x − x_hi (an exact subtraction, <= 26 bits). Both x_hi·c (<= 53 bits)
    and x_lo·c (<= 52 bits) are exact, so x_hi·c + x_lo·c is x·c rounded once; fusing either
    product into that addition rounds the same exact sum once. Shapes broadcast; float64.
    """
    bits = lax.bitcast_convert_type(x, jnp.uint64) & jnp.asarray(_HIGH_MASK, jnp.uint64)
    x_hi = lax.bitcast_convert_type(bits, F64)
    x_lo = x - x_hi
    return x_hi * c + x_lo * c


def _product(x, y, y_short):
    """x·y, correctly rounded (:func:`mul_by_short`), with y the short factor where
    ``y_short``, else x (a traced flag; :func:`fits_the_program` ensures one of them is)."""
    return mul_by_short(jnp.where(y_short, x, y), jnp.where(y_short, y, x))


class RooflineSeconds(NamedTuple):
    """(compute s, memory s) of one step and whether it has any roofline request."""

    compute: jax.Array  # float64 s
    memory: jax.Array  # float64 s
    any_request: jax.Array  # bool


def _ordered_sum(terms, prefill, decode):
    """0.0 + the prefill terms in position order, then + the decode terms in position order,
    one addition per position and pass (absent positions add +0.0: no change to a value
    >= 0). ``terms``, ``prefill``, ``decode``: [..., W]; returns [...]. ``prefill`` None: no
    position is a prefill (the first pass would add +0.0 throughout, and is left out).

    The masked terms are selected once, then added along one chain over static slices: two
    operations per position, so the program grows by little per position of the width.
    """
    zero = jnp.zeros((), terms.dtype)
    total = jnp.zeros((*terms.shape[:-1], 1), terms.dtype)
    for mask in (decode,) if prefill is None else (prefill, decode):
        part = jnp.where(mask, terms, zero)
        for k in range(part.shape[-1]):
            total = total + lax.slice_in_dim(part, k, k + 1, axis=-1)
    return total[..., 0]


def _request_terms(rc: RooflineConsts, row, sf, prefill):
    """(compute s, dynamic memory bytes / TP) of each request: ``row`` its t-only terms
    (``by_tokens[t]``, [..., W, 10], or one row [10] shared by every position), ``sf`` its
    progress s as float64 and ``prefill`` whether it prefills ([..., W])."""
    ctx = sf + row[..., CTX_OFFSET]  # s + (t − 1)/2 for t > 1, s + 0.0 = s otherwise
    attn = (row[..., FOUR_HEADS_T] * ctx) * rc.head_dim
    vec = _product(ctx, row[..., FIVE_HEADS_T], rc.five_heads_t_short) + row[..., TWO_T_D]
    gemm = row[..., GEMM] + mul_by_short(attn, rc.layers)
    sram = mul_by_short(vec, rc.layers)
    gemm = gemm + row[..., MOE]  # + 0.0 without MoE layers
    gemm = gemm + row[..., DENSE]  # + 0.0 without dense layers
    flops = gemm + sram
    tp = spread_divisor(rc.tp, prefill)
    rate = spread_divisor(jnp.where(prefill, rc.prefill_flops, rc.decode_flops), prefill)
    # The barrier keeps XLA from rewriting (a / b) / c as a / (b·c).
    compute_terms = lax.optimization_barrier(flops / tp) / rate
    w = row[..., WEIGHTS]
    total = ((w + row[..., KV_WRITE]) + _product(sf, rc.kv_bytes_per_token, rc.kv_bytes_short)) \
        + row[..., ACT]
    return compute_terms, (total - w) / tp


def _seconds(rc: RooflineConsts, compute, dynamic, n_tok, any_request) -> RooflineSeconds:
    """The step's seconds from its summed compute seconds and dynamic bytes / TP, its total
    tokens and whether it has any roofline request (the weights are read once)."""
    memory = ((rc.by_tokens[n_tok, WEIGHTS] / spread_divisor(rc.tp, any_request)) + dynamic) \
        / spread_divisor(rc.bandwidth, any_request)
    return RooflineSeconds(compute, memory, any_request)


def step_seconds(rc: RooflineConsts, nn, pi, l_in, out) -> RooflineSeconds:
    """Compute and memory seconds of one step (``roofline_step_seconds`` after
    ``split_roofline_requests``).

    Args (each [..., W], running batches in running order; the result has shape [...]):
    ``nn`` new tokens this step (> 0 = scheduled), ``pi`` progress at the step's start,
    ``l_in`` input tokens, ``out`` output tokens. Prefill: scheduled and pi < l_in (s = pi,
    t = nn); decode: scheduled, pi >= l_in and out > 0 (s = pi, t = 1); other positions
    contribute nothing. Exact when the configuration passes :func:`fits_the_program` for the
    table's last row and the largest ``pi``.
    """
    sched = nn > 0
    prefill = sched & (pi < l_in)
    decode = sched & (pi >= l_in) & (out > 0)
    t = jnp.where(prefill, nn, 1)
    compute_terms, dynamic_terms = _request_terms(rc, rc.by_tokens[t], pi.astype(F64), prefill)
    compute = _ordered_sum(compute_terms, prefill, decode)
    dynamic = _ordered_sum(dynamic_terms, prefill, decode)
    n_tok = jnp.sum(jnp.where(prefill, nn, 0), axis=-1) + jnp.sum(decode, axis=-1)
    return _seconds(rc, compute, dynamic, n_tok, jnp.any(prefill | decode, axis=-1))


def decode_seconds(rc: RooflineConsts, decode, pi) -> RooflineSeconds:
    """:func:`step_seconds` of a step in which every scheduled request decodes one token:
    ``decode`` [..., W] the scheduled positions, ``pi`` [..., W] their progress (each >= its
    input tokens, with output to produce). Every request reads the table's row t = 1, and the
    prefill pass of the sums, which would add +0.0 throughout, is left out: the same
    operations on the same values for every request, in the same order."""
    sf = pi.astype(F64)
    # no request prefills; the mask is computed from the data, since with a constant one XLA
    # folds spread_divisor's select and divides by a broadcast scalar (a reciprocal product)
    compute_terms, dynamic_terms = _request_terms(rc, rc.by_tokens[1], sf, pi < 0)
    compute = _ordered_sum(compute_terms, None, decode)
    dynamic = _ordered_sum(dynamic_terms, None, decode)
    return _seconds(rc, compute, dynamic, jnp.sum(decode, axis=-1), jnp.any(decode, axis=-1))


def seconds_to_us(rc: RooflineConsts, sec: RooflineSeconds):
    """int64 µs of a step's seconds: max(1, trunc(max(compute, memory)·1e6)), 1 for a step
    without roofline requests (``roofline_step_time_us``)."""
    ticks = float_to_ticks_array(jnp.maximum(sec.compute, sec.memory) * rc.us_per_s, jnp)
    return jnp.where(sec.any_request, jnp.maximum(1, ticks), 1)


def step_time_us(rc: RooflineConsts, nn, pi, l_in, out):
    """int64 µs of one step (``roofline_step_time_us``). Arguments as :func:`step_seconds`."""
    return seconds_to_us(rc, step_seconds(rc, nn, pi, l_in, out))
