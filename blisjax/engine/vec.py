"""Prefix sums and leading-run counts over short integer vectors, in the forms XLA:CPU runs
fastest inside the engine's programs.

``jnp.cumsum`` lowers to a two-level ``reduce-window``; over a short vector most of its cost
is fixed (64 lanes × 16 positions: 2.4 µs, against 0.9 µs for four shifted adds), and the
block pops that use one run thousands of times per simulation. Over longer vectors XLA's form
stays: a scan by blocks of 8 was faster in isolation but slower in the engine, as it fuses
worse with its neighbours (``benchmarks/ab_engine.py``, one device, 64 lanes of scenario S:
1.013 against the previous revision, where shifted adds up to 32 positions and ``jnp.cumsum``
beyond gave 0.951; docs/performance.md). Integer addition is associative, so every form gives
the same values. No reference counterpart (plain Python loops there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_SHORT = 32  # up to this length: log-step (Hillis–Steele) shifted adds; longer: jnp.cumsum


def prefix_sum(x):
    """Inclusive prefix sum of the 1-D integer or bool vector ``x`` (bool counts as int32),
    in ``x``'s integer dtype; the same values as ``jnp.cumsum``."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int32)
    if x.shape[0] > _SHORT:
        return jnp.cumsum(x).astype(x.dtype)
    d = 1
    while d < x.shape[0]:
        x = x + jnp.concatenate([jnp.zeros(d, x.dtype), x[:-d]])
        d *= 2
    return x


def leading_count(mask, axis: int = -1):
    """Number of leading True entries of ``mask`` along ``axis`` (``sum(cumprod(mask))``):
    the index of the first False, or the length if there is none. One reduction instead of a
    ``reduce-window`` scan and a sum."""
    first_false = jnp.argmin(mask, axis=axis).astype(jnp.int32)
    return jnp.where(jnp.all(mask, axis=axis), jnp.int32(mask.shape[axis]), first_false)


def earlier_smaller(a):
    """For each t, ``#{u < t : a[u] < a[t]}`` of the 1-D int64 vector ``a`` of *distinct*
    values (int32 counts), in O(n log² n) rather than the pairwise O(n²).

    A bottom-up merge sort: at the level of runs of length s, every element of a run's right
    sibling gains the number of the left run's values below it (its insertion point there),
    and the two runs merge by each element's insertion point in the other. The length is
    padded to a power of two with values above any real one (``benchmarks/RESULTS.md``: its
    speed against the pairwise count)."""
    n = a.shape[0]
    size = 1 << max(n - 1, 0).bit_length()
    top = jnp.iinfo(jnp.int64).max
    vals = jnp.concatenate([a.astype(jnp.int64),
                            top - jnp.arange(size - n, 0, -1, dtype=jnp.int64)])
    origin = jnp.arange(size, dtype=jnp.int32)
    count = jnp.zeros(size, jnp.int32)
    insertion = jax.vmap(lambda run, xs: jnp.searchsorted(
        run, xs, method="scan_unrolled").astype(jnp.int32))
    s = 1
    while s < size:
        v, o = vals.reshape(-1, 2, s), origin.reshape(-1, 2, s)
        left, right = v[:, 0], v[:, 1]
        right_in_left = insertion(left, right)  # left values below each right value
        left_in_right = insertion(right, left)
        count = count.at[o[:, 1]].add(right_in_left)
        k = jnp.arange(s, dtype=jnp.int32)[None, :]
        base = (2 * s * jnp.arange(v.shape[0], dtype=jnp.int32))[:, None]
        dest = jnp.concatenate([base + k + left_in_right, base + k + right_in_left]).ravel()
        src = jnp.concatenate([left, right]).ravel()
        vals = jnp.zeros(size, jnp.int64).at[dest].set(src)
        origin = jnp.zeros(size, jnp.int32).at[dest].set(jnp.concatenate([o[:, 0], o[:, 1]])
                                                        .ravel())
        s *= 2
    return count[:n]
