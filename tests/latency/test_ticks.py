"""BLIS's float→tick conversion (``clampToInt64``): the scalar form both engines' host code uses
and the array form inside the JAX engine's programs give the same ticks."""

import math

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from blisjax.latency.base import INT64_MAX, INT64_MIN, float_to_ticks, float_to_ticks_array  # noqa: E402

# (float, ticks) by Go's rules: truncate toward zero; NaN and >= 2**63 saturate high,
# <= -2**63 saturates low.
CASES = [
    (0.0, 0), (0.9999999999999999, 0), (1.5, 1), (-1.5, -1), (5752.705191348184, 5752),
    (2.0**53 + 2.0, 2**53 + 2), (9.223372036854774784e18, 9223372036854774784),
    (9.223372036854775807e18, INT64_MAX), (math.inf, INT64_MAX), (math.nan, INT64_MAX),
    (-9.223372036854775808e18, INT64_MIN), (-math.inf, INT64_MIN),
]


@pytest.mark.parametrize(("x", "ticks"), CASES)
def test_scalar_conversion(x, ticks):
    assert float_to_ticks(x) == ticks


def test_array_conversion_matches_the_scalar_one_in_numpy_and_jax():
    xs = np.array([x for x, _ in CASES], dtype=np.float64)
    expected = [t for _, t in CASES]
    assert float_to_ticks_array(xs).tolist() == expected
    in_graph = jax.jit(lambda x: float_to_ticks_array(x, jnp))(jnp.asarray(xs))
    assert np.asarray(in_graph).tolist() == expected
