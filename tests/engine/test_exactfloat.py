"""exact_mul must equal IEEE multiplication bit for bit (numpy is the independent oracle)."""

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

from blisjax.engine.exactfloat import exact_mul  # noqa: E402

_mul = jax.jit(exact_mul)


def _check(a, b):
    want = (a * b).view(np.uint64)
    got = np.asarray(_mul(a, b)).view(np.uint64)
    bad = np.nonzero(want != got)[0]
    assert bad.size == 0, [(a[i], b[i], a[i] * b[i], np.asarray(_mul(a, b))[i]) for i in bad[:5]]


def test_random_normals_and_unit_range():
    rng = np.random.default_rng(0)
    _check(rng.random(200_000), rng.random(200_000))
    _check(rng.standard_normal(200_000) * 1e3, rng.standard_normal(200_000) * 1e-3)
    bits = rng.integers(0, 2**63 - 2**52, size=200_000, dtype=np.uint64)  # any finite double
    signs = rng.integers(0, 2, size=200_000, dtype=np.uint64) << np.uint64(63)
    a = (bits | signs).view(np.float64)
    b = rng.integers(0, 2**63 - 2**52, size=200_000, dtype=np.uint64).view(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        _check(a, b)


def test_edge_cases():
    tiny = np.nextafter(0.0, 1.0)
    vals = np.array([0.0, -0.0, 1.0, 0.5, 3.0, 1 / 3, 2 / 7, 1e-300, 1e300, tiny, 2.2250738585072014e-308,
                     2.225073858507201e-308, 1.7976931348623157e308, 0.1, 0.2, 0.7])
    a, b = np.meshgrid(vals, vals)
    with np.errstate(over="ignore", under="ignore"):
        _check(a.ravel(), b.ravel())
    # ties to even at the rounding position
    x = np.array([1 + 2**-52, 1 + 3 * 2**-52, 1.5, 1 + 2**-26])
    _check(x, x[::-1])


def test_ieee_divide_by_a_scalar_shared_by_every_lane_matches_python():
    # A vmapped division by one traced scalar is what XLA turns into a multiplication by the
    # rounded reciprocal (jaxlib 0.10.2: 95 of these 1,024 KV utilisations); ieee_divide must
    # give Python's quotient for every value: KV utilisations and token-bucket refills.
    from blisjax.engine.exactfloat import ieee_divide

    rng = np.random.default_rng(7)
    used = rng.integers(0, 26_312, size=(256, 4)).astype(np.float64)
    refill = rng.integers(0, 10**7, size=(256, 4)) * rng.uniform(1.0, 5_000.0, size=(256, 4))
    for x, d in ((used, 26_312.0), (refill, 1e6), (used, 3.35e12)):
        want = x / d
        got = jax.jit(jax.vmap(lambda row, d: ieee_divide(row, d), in_axes=(0, None)))(x, d)
        assert np.array_equal(np.asarray(got).view(np.int64), want.view(np.int64))
