"""Token-length samplers against closed-form expectations and hand-computed cases.

Statistical tolerances are 5 standard errors computed from the sample size N.
"""

import math
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blisjax.workload import DistSpec
from blisjax.workload.lengths import round_half_away, sample_lengths

N = 200_000


def rng(seed=0):
    return np.random.default_rng(seed)


class FixedUniforms:
    """Stand-in generator whose ``random`` returns preset values (exact inverse-CDF checks)."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float64)

    def random(self, n):
        assert n == self.values.size
        return self.values


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0.5, 1.0), (1.5, 2.0), (2.5, 3.0), (4.5, 5.0), (-0.5, -1.0), (-2.5, -3.0),
        (2.4999, 2.0), (-2.4999, -2.0), (0.49999999999999994, 0.0), (7.0, 7.0), (0.0, 0.0),
    ],
)  # fmt: skip
def test_round_half_away_hand_cases(x, expected):
    assert round_half_away(np.array([x]))[0] == expected


@given(st.floats(min_value=-1e15, max_value=1e15, allow_nan=False))
def test_round_half_away_matches_exact_decimal_rounding(x):
    # Decimal(x) is the exact binary value; ROUND_HALF_UP rounds ties away from zero.
    exact = float(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert round_half_away(np.array([x]))[0] == exact


def gaussian(mean, std, lo, hi):
    return DistSpec("gaussian", {"mean": mean, "std_dev": std, "min": lo, "max": hi})


@pytest.mark.parametrize(
    ("mean", "expected"),
    [(2.5, 3), (4.5, 5), (3.4, 3), (0.4, 1), (-7.0, 1), (9.5, 9)],
)
def test_gaussian_zero_std_rounds_half_away_then_clamps(mean, expected):
    # std 0 makes the sample exactly the mean: 2.5 -> 3 and 4.5 -> 5 (Python's round gives 2, 4);
    # 0.4 rounds to 0 and is floored to 1; -7 is clamped to min 0 then floored to 1;
    # 9.5 is clamped to max 9 first.
    out = sample_lengths(gaussian(mean, 0.0, 0, 9), rng(), 5)
    np.testing.assert_array_equal(out, np.full(5, expected))


def test_gaussian_min_equal_max_returns_min_without_drawing():
    g = rng(1)
    state = g.bit_generator.state
    np.testing.assert_array_equal(sample_lengths(gaussian(500, 100, 64, 64), g, 4), [64] * 4)
    assert g.bit_generator.state == state


def test_gaussian_clamps_to_bounds():
    out = sample_lengths(gaussian(15, 1000, 10, 20), rng(), N)
    assert out.min() == 10 and out.max() == 20
    # Rounds to 10 iff X < 10.5: P = Phi(-4.5/1000) ~ 0.498; both ends hold ~half the mass.
    p_low = 0.5 * math.erfc(4.5 / 1000 / math.sqrt(2))
    assert abs(np.mean(out == 10) - p_low) < 5 * math.sqrt(p_low * (1 - p_low) / N)


def test_gaussian_mean_and_std_unclamped():
    out = sample_lengths(gaussian(1000, 50, 0, 10_000), rng(), N)
    assert abs(out.mean() - 1000) < 5 * 50 / math.sqrt(N)
    # rounding adds Uniform(-0.5, 0.5) noise: variance 50² + 1/12
    assert abs(out.std() - math.sqrt(2500 + 1 / 12)) < 5 * 50 / math.sqrt(2 * N)


def test_exponential_mean_and_clamps():
    mean = 300.0
    out = sample_lengths(DistSpec("exponential", {"mean": mean}), rng(), N)
    assert abs(out.mean() - mean) < 5 * mean / math.sqrt(N) + 0.01
    clamped = sample_lengths(
        DistSpec("exponential", {"mean": mean, "min": 50, "max": 400}), rng(), N
    )
    assert clamped.min() == 50 and clamped.max() == 400
    p_max = math.exp(-400 / mean)  # P(X >= 400)
    assert abs(np.mean(clamped == 400) - p_max) < 5 * math.sqrt(p_max * (1 - p_max) / N) + 1e-3


def test_uniform_is_inclusive_and_flat():
    out = sample_lengths(DistSpec("uniform", {"min": 3, "max": 7}), rng(), N)
    values, counts = np.unique(out, return_counts=True)
    np.testing.assert_array_equal(values, [3, 4, 5, 6, 7])
    p = 1 / 5
    assert np.all(np.abs(counts / N - p) < 5 * math.sqrt(p * (1 - p) / N))


def test_lognormal_median_and_log_mean():
    mu, sigma = 6.0, 0.5
    out = sample_lengths(DistSpec("lognormal", {"mu": mu, "sigma": sigma}), rng(), N)
    # median exp(mu) ~ 403 tokens; rounding moves log-values by < 0.5/100
    assert abs(np.log(out).mean() - mu) < 5 * sigma / math.sqrt(N) + 0.005
    assert abs(np.mean(out <= math.exp(mu)) - 0.5) < 5 * 0.5 / math.sqrt(N) + 0.002


def test_constant_and_floor_at_one():
    np.testing.assert_array_equal(
        sample_lengths(DistSpec("constant", {"value": 9}), rng(), 3), [9] * 3
    )
    np.testing.assert_array_equal(
        sample_lengths(DistSpec("constant", {"value": 0}), rng(), 2), [1, 1]
    )


def test_empirical_inverse_cdf_boundaries():
    # Unsorted, unnormalised bins. CDF: 10 -> 0.2, 20 -> 0.5, 30 -> 1.0; a draw maps to the
    # first bin with CDF >= u.
    dist = DistSpec("empirical", bins=(30, 10, 20), probabilities=(5.0, 2.0, 3.0))
    u = [0.0, 0.1, 0.2, 0.2000001, 0.5, 0.5000001, 0.999999]
    out = sample_lengths(dist, FixedUniforms(u), len(u))
    np.testing.assert_array_equal(out, [10, 10, 10, 20, 20, 30, 30])


def test_empirical_frequencies_and_zero_probability_bins():
    dist = DistSpec("empirical", bins=(64, 128, 256, 512), probabilities=(0.1, 0.0, 0.6, 0.3))
    out = sample_lengths(dist, rng(), N)
    assert not np.any(out == 128)
    for value, p in ((64, 0.1), (256, 0.6), (512, 0.3)):
        assert abs(np.mean(out == value) - p) < 5 * math.sqrt(p * (1 - p) / N)


def test_pareto_lognormal_mixture_weight():
    params = {"alpha": 2.0, "xm": 5000.0, "mu": 3.0, "sigma": 0.1, "mix_weight": 0.3}
    out = sample_lengths(DistSpec("pareto_lognormal", params), rng(), N)
    # Pareto part is >= 5000; the lognormal part is ~exp(3) = 20 and never near 5000.
    p = 0.3
    assert abs(np.mean(out >= 5000) - p) < 5 * math.sqrt(p * (1 - p) / N)
