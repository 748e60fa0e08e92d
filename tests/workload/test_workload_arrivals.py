"""Arrival processes against closed-form expectations; tolerances are derived from N."""

import math

import numpy as np
import pytest

from blisjax.workload import ArrivalSpec
from blisjax.workload.generate import (
    client_arrivals,
    sample_iats,
    weibull_cv,
    weibull_shape_from_cv,
)

N = 200_000
RATE_PER_US = 1e-4  # 100 req/s: mean IAT 10,000 µs


def rng(seed=0):
    return np.random.default_rng(seed)


def cv_tolerance(cv, kurtosis, n):
    """5 standard errors of the sample CV (delta method) plus the bisection tolerance."""
    rel_se = math.sqrt((kurtosis - 1) / (4 * n) + cv**2 / n)
    return 5 * rel_se * cv + 1e-3


def sample_cv(x):
    return x.std() / x.mean()


def test_poisson_mean_iat_closed_form():
    iats = sample_iats(ArrivalSpec("poisson"), RATE_PER_US, rng(), N)
    m = 1 / RATE_PER_US
    # E[max(1, floor(X))], X ~ Exp(mean m): sum_k P(X >= k) + P(X < 1)
    expected = 1 / math.expm1(1 / m) + (1 - math.exp(-1 / m))
    assert abs(iats.mean() - expected) < 5 * m / math.sqrt(N)
    assert iats.min() >= 1 and iats.dtype == np.int64


def test_constant_iat_is_truncated_reciprocal():
    # 10 req/s = 1e-5 req/µs; 1/1e-5 evaluates to 99999.99999999999 in float64 -> 99999
    iats = sample_iats(ArrivalSpec("constant"), 10 * 1.0 / 1e6, rng(), 4)
    np.testing.assert_array_equal(iats, [99999] * 4)
    np.testing.assert_array_equal(sample_iats(ArrivalSpec("constant"), 5.0, rng(), 2), [1, 1])


def test_first_arrival_is_first_iat_and_horizon_stops_at_t_ge_horizon():
    a = ArrivalSpec("constant")
    np.testing.assert_array_equal(client_arrivals(a, 1 / 3, rng(), 10, None), [3, 6, 9])
    np.testing.assert_array_equal(client_arrivals(a, 1 / 3, rng(), 9, None), [3, 6])
    np.testing.assert_array_equal(client_arrivals(a, 1 / 3, rng(), None, 4), [3, 6, 9, 12])


@pytest.mark.parametrize("process", ["poisson", "gamma", "weibull", "bursty", "periodic"])
def test_horizon_cut_is_a_prefix_of_a_longer_run(process):
    arrival = ArrivalSpec(process, cv=2.0 if process != "weibull" else 0.7, jitter_us=500)
    short = client_arrivals(arrival, RATE_PER_US, rng(3), 50_000_000, None)
    long = client_arrivals(arrival, RATE_PER_US, rng(3), 200_000_000, None)
    assert short.size > 1000 and short.max() < 50_000_000
    np.testing.assert_array_equal(short, long[long < 50_000_000])
    assert np.all(np.diff(short) >= 1)


@pytest.mark.parametrize("cv", [0.5, 2.0, 3.0])
def test_gamma_cv_and_mean(cv):
    iats = sample_iats(ArrivalSpec("gamma", cv=cv), RATE_PER_US, rng(), N).astype(float)
    shape = 1 / cv**2
    assert abs(sample_cv(iats) - cv) < cv_tolerance(cv, 3 + 6 / shape, N)
    m = 1 / RATE_PER_US
    assert abs(iats.mean() - m) < 5 * cv * m / math.sqrt(N) + 1


def test_gamma_explicit_shape_and_scale_override_cv():
    iats = sample_iats(ArrivalSpec("gamma", cv=5.0, shape=4.0, scale=500.0), RATE_PER_US, rng(), N)
    # Gamma(4, 500): mean 2000, sd 1000, CV 0.5 (truncation subtracts ~0.5)
    assert abs(iats.mean() - 1999.5) < 5 * 1000 / math.sqrt(N)
    assert abs(sample_cv(iats.astype(float)) - 0.5) < cv_tolerance(0.5, 3 + 6 / 4, N)


def test_gamma_tiny_shape_falls_back_to_poisson():
    # cv = 20 gives shape 0.0025 < 0.01: BLIS uses Poisson (CV 1) instead
    iats = sample_iats(ArrivalSpec("gamma", cv=20.0), RATE_PER_US, rng(), N).astype(float)
    assert abs(sample_cv(iats) - 1.0) < cv_tolerance(1.0, 9.0, N)


@pytest.mark.parametrize("target", [0.3, 1.0, 2.5])
def test_weibull_shape_solves_the_cv_equation(target):
    k = weibull_shape_from_cv(target)
    g1, g2 = math.gamma(1 + 1 / k), math.gamma(1 + 2 / k)
    assert abs(math.sqrt(g2 / g1**2 - 1) - target) < 1e-3
    assert 0.1 <= k <= 100


def test_weibull_cv_one_is_exponential():
    assert abs(weibull_shape_from_cv(1.0) - 1.0) < 2e-3
    assert weibull_cv(1.0) == pytest.approx(1.0)


def weibull_kurtosis(k):
    m = [math.gamma(1 + r / k) for r in range(5)]
    var = m[2] - m[1] ** 2
    mu4 = m[4] - 4 * m[3] * m[1] + 6 * m[2] * m[1] ** 2 - 3 * m[1] ** 4
    return mu4 / var**2


@pytest.mark.parametrize("cv", [0.5, 1.5])
def test_weibull_cv_and_mean(cv):
    iats = sample_iats(ArrivalSpec("weibull", cv=cv), RATE_PER_US, rng(), N).astype(float)
    k = weibull_shape_from_cv(cv)
    assert abs(sample_cv(iats) - cv) < cv_tolerance(cv, weibull_kurtosis(k), N)
    m = 1 / RATE_PER_US
    assert abs(iats.mean() - m) < 5 * cv * m / math.sqrt(N) + 1


def test_bursty_pareto_median_and_minimum():
    alpha = 1.5
    iats = sample_iats(ArrivalSpec("bursty", pareto_alpha=alpha), RATE_PER_US, rng(), N)
    x_m = (1 / RATE_PER_US) * (alpha - 1) / alpha  # mean alpha*x_m/(alpha-1) = 1/rate
    assert iats.min() >= math.floor(x_m)
    median = x_m * 2 ** (1 / alpha)
    assert abs(np.mean(iats <= median) - 0.5) < 5 * 0.5 / math.sqrt(N) + 1e-3


def test_bursty_mean_with_finite_variance():
    alpha = 4.0  # variance finite: sd = mean / sqrt(alpha (alpha - 2))
    iats = sample_iats(ArrivalSpec("bursty", pareto_alpha=alpha), RATE_PER_US, rng(), N)
    m = 1 / RATE_PER_US
    assert abs(iats.mean() - m) < 5 * (m / math.sqrt(alpha * (alpha - 2))) / math.sqrt(N) + 1


def test_periodic_with_and_without_jitter():
    plain = sample_iats(ArrivalSpec("periodic", period_us=2500), RATE_PER_US, rng(), 10)
    np.testing.assert_array_equal(plain, [2500] * 10)
    default_period = sample_iats(ArrivalSpec("periodic"), RATE_PER_US, rng(), 3)
    np.testing.assert_array_equal(default_period, [10_000] * 3)
    jit = sample_iats(ArrivalSpec("periodic", period_us=2500, jitter_us=400), 1.0, rng(), N)
    assert jit.min() >= 2100 and jit.max() <= 2900
    # trunc(2500 + U(-400, 400)): mean 2499.5, sd 400/sqrt(3)
    assert abs(jit.mean() - 2499.5) < 5 * (400 / math.sqrt(3)) / math.sqrt(N)


def test_pathological_iats_do_not_overflow():
    # A rate at BLIS's floor gives IATs of ~1e15 µs; cumulative sums must stay exact.
    iat = int(1 / 1e-15)
    out = client_arrivals(ArrivalSpec("constant"), 1e-18, rng(), None, 5000)
    np.testing.assert_array_equal(out, iat * np.arange(1, 5001, dtype=np.int64))
    # past int64 the run ends (no horizon means the int64 limit), instead of wrapping around
    out = client_arrivals(ArrivalSpec("constant"), 1e-18, rng(), None, 20_000)
    assert out.size == (2**63 - 1) // iat and np.all(np.diff(out) == iat)
