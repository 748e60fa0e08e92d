"""prefix_sum and leading_count against NumPy's cumsum and cumprod (the independent oracle), at
both sides of the length where the helper switches from shifted adds to XLA's cumsum, and
under vmap, as the engine runs them; earlier_smaller against a direct count."""

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

from blisjax.engine.vec import earlier_smaller, leading_count, prefix_sum  # noqa: E402

LENGTHS = [1, 2, 3, 7, 16, 17, 31, 32, 33, 64, 85, 256]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_prefix_sum_equals_numpy_cumsum(n, dtype):
    rng = np.random.default_rng(n)
    x = rng.integers(-1_000, 100_000, size=(5, n)).astype(dtype)
    got = np.asarray(jax.jit(jax.vmap(prefix_sum))(x))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1))


@pytest.mark.parametrize("n", [1, 5, 16, 33, 128])
def test_prefix_sum_counts_bools_as_int32(n):
    x = np.random.default_rng(7).random((3, n)) < 0.4
    got = np.asarray(jax.vmap(prefix_sum)(x))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1))


@pytest.mark.parametrize("n", [1, 4, 16, 85])
def test_leading_count_equals_sum_of_cumprod(n):
    rng = np.random.default_rng(n)
    # mostly-True rows so long leading runs, all-True and all-False rows occur
    x = rng.random((64, n)) < 0.9
    x[0], x[1] = True, False
    want = np.sum(np.cumprod(x, axis=1), axis=1)
    np.testing.assert_array_equal(np.asarray(jax.vmap(leading_count)(x)), want)
    np.testing.assert_array_equal(np.asarray(leading_count(x, axis=1)), want)
    np.testing.assert_array_equal(np.asarray(leading_count(x.T, axis=0)), want)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13, 64, 100])
def test_earlier_smaller_counts_each_earlier_smaller_value(n):
    rng = np.random.default_rng(n)
    # distinct values spanning int64 (the engine packs a key and a position into one)
    rows = np.stack([rng.choice(1 << 50, size=n, replace=False) for _ in range(3)])
    rows[0] = np.arange(n)  # increasing: t earlier values below the t-th
    rows[1] = np.arange(n)[::-1]  # decreasing: none
    want = np.array([[sum(int(r[u] < r[t]) for u in range(t)) for t in range(n)]
                     for r in rows])
    np.testing.assert_array_equal(want[0], np.arange(n))
    got = np.asarray(jax.jit(jax.vmap(earlier_smaller))(rows.astype(np.int64)))
    np.testing.assert_array_equal(got, want)
