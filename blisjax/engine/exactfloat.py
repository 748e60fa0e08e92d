"""IEEE float64 multiplication from integer operations, immune to FMA contraction.

XLA (CPU and GPU) may fuse ``a*b + c`` into one fused multiply-add, which rounds once instead of
twice and so can differ from Python in the last bit (docs/semantics.md, Bit parity between the
two engines). No compiler flag is a reliable defence. Where a sum of products decides an
outcome (weighted routing scores, fitness), the engine forms each product with
:func:`exact_mul`: it builds the correctly rounded IEEE product from the operands' bits with
64-bit integer arithmetic, so there is no float multiply for the compiler to fuse with the
following addition. No reference counterpart (Python multiplies without contraction).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_U = jnp.uint64
_SIGN = 0x8000000000000000
_FRAC = (1 << 52) - 1
_IMPLICIT = 1 << 52
_LOW32 = 0xFFFFFFFF


def _u(x: int):
    return jnp.asarray(x, dtype=_U)


def _mul_53x53(ma, mb):
    """Full 106-bit product of two < 2**53 integers as (hi, lo) uint64 words."""
    a_hi, a_lo = ma >> _u(32), ma & _u(_LOW32)
    b_hi, b_lo = mb >> _u(32), mb & _u(_LOW32)
    lo_lo, hi_lo, lo_hi, hi_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi, a_hi * b_hi
    mid = (lo_lo >> _u(32)) + (hi_lo & _u(_LOW32)) + (lo_hi & _u(_LOW32))
    lo = (lo_lo & _u(_LOW32)) | (mid << _u(32))
    hi = hi_hi + (hi_lo >> _u(32)) + (lo_hi >> _u(32)) + (mid >> _u(32))
    return hi, lo


def _shr128(hi, lo, s):
    """(hi:lo) >> s for 0 <= s <= 127, returned as the low 64 bits (the result fits)."""
    s = s.astype(_U)
    small = s < _u(64)
    s_small = jnp.where(small, s, _u(0))
    s_big = jnp.where(small, _u(0), s - _u(64))
    carry = jnp.where(s_small == _u(0), _u(0), hi << ((_u(64) - s_small) & _u(63)))
    return jnp.where(small, (lo >> s_small) | carry, hi >> s_big)


def _any_below(hi, lo, k):
    """True where any of the lowest k bits of (hi:lo) is set, 0 <= k <= 128."""
    k = k.astype(_U)
    lo_mask = jnp.where(k >= _u(64), ~_u(0), (_u(1) << jnp.minimum(k, _u(63))) - _u(1))
    lo_mask = jnp.where(k == _u(0), _u(0), lo_mask)
    hi_bits = jnp.where(k > _u(64), k - _u(64), _u(0))
    hi_mask = jnp.where(hi_bits >= _u(64), ~_u(0), (_u(1) << jnp.minimum(hi_bits, _u(63))) - _u(1))
    return ((lo & lo_mask) != _u(0)) | ((hi & hi_mask) != _u(0))


def _bit_length(x):
    """Number of significant bits of uint64 x (0 for 0)."""
    return _u(64) - lax.clz(x)


def exact_mul(a, b):
    """Correctly rounded (nearest-even) float64 product ``a*b`` for finite a, b.

    Handles signs, zeros, subnormal operands and results, and overflow to infinity. NaN/inf
    operands are not expected by the engine (all operands are finite by construction).
    """
    a = jnp.asarray(a, jnp.float64)
    b = jnp.asarray(b, jnp.float64)
    ua, ub = lax.bitcast_convert_type(a, _U), lax.bitcast_convert_type(b, _U)
    sign = (ua ^ ub) & _u(_SIGN)
    ea = ((ua >> _u(52)) & _u(0x7FF)).astype(jnp.int64)
    eb = ((ub >> _u(52)) & _u(0x7FF)).astype(jnp.int64)
    ma = jnp.where(ea > 0, (ua & _u(_FRAC)) | _u(_IMPLICIT), ua & _u(_FRAC))
    mb = jnp.where(eb > 0, (ub & _u(_FRAC)) | _u(_IMPLICIT), ub & _u(_FRAC))
    ea, eb = jnp.maximum(ea, 1), jnp.maximum(eb, 1)
    hi, lo = _mul_53x53(ma, mb)
    # value = (hi:lo) · 2^(ea + eb - 2150); msb = index of the leading 1 bit of the product.
    msb = jnp.where(hi != _u(0), _bit_length(hi).astype(jnp.int64) + 63,
                    _bit_length(lo).astype(jnp.int64) - 1)
    biased = msb + ea + eb - 1127  # biased exponent of the normalised result
    shift = msb - 52 + jnp.where(biased < 1, 1 - biased, 0)  # extra shift for subnormals
    biased = jnp.maximum(biased, 0)
    pos = shift > 0
    shift_c = jnp.clip(shift, 0, 127)
    sig = jnp.where(pos, _shr128(hi, lo, shift_c), lo << jnp.clip(-shift, 0, 63).astype(_U))
    round_bit = jnp.where(pos, _shr128(hi, lo, jnp.maximum(shift_c - 1, 0)) & _u(1), _u(0))
    sticky = jnp.where(pos, _any_below(hi, lo, jnp.maximum(shift_c - 1, 0)), False)
    round_up = (round_bit == _u(1)) & (sticky | ((sig & _u(1)) == _u(1)))
    sig = sig + round_up.astype(_U)
    # Encode: for normal results sig carries the implicit bit at 52, so adding (biased-1)<<52
    # yields the right exponent, and a rounding carry to 2**53 bumps the exponent by itself.
    exp_field = jnp.where(biased > 0, biased - 1, 0).astype(_U)
    bits = (exp_field << _u(52)) + sig
    too_big = bits >= _u(0x7FF0000000000000)
    bits = jnp.where(too_big, _u(0x7FF0000000000000), bits)
    zero = (ma == _u(0)) | (mb == _u(0)) | (shift > 127)
    bits = jnp.where(zero, _u(0), bits) | sign
    return lax.bitcast_convert_type(bits, jnp.float64)


def spread_divisor(value, like):
    """``value`` spread to the shape of ``like`` (an array batched like the numerator) behind
    an optimization barrier, to divide by. XLA rewrites ``x / d`` as ``x * (1/d)`` when ``d``
    is a broadcast scalar — a compile-time constant, and also a traced value shared by every
    lane — and the rounded reciprocal makes some quotients differ in the last bit (95 of
    1,024 KV utilisations ``used / blocks`` in a vmapped test). Behind the barrier the divisor
    is an ordinary array and the division an IEEE division. ``like`` must not be a
    compile-time constant: XLA folds the select of a constant mask into the broadcast it
    stands for, and the quotients round through the reciprocal again."""
    return lax.optimization_barrier(jnp.where(like, value, value))


def ieee_divide(x, d):
    """``x / d`` rounded once as IEEE division, also where ``d`` is a scalar shared by every
    lane (``spread_divisor``). No reference counterpart (Python divides)."""
    return x / spread_divisor(d, x == x)

