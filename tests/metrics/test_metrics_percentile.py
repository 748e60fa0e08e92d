"""Percentile / mean formulas: hand values, numpy agreement, and BLIS's exact float expression."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blisjax.metrics.percentile import mean, percentile_linear, sort_values


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1, 2, 3, 4], 0, 1.0),
        ([1, 2, 3, 4], 100, 4.0),
        ([1, 2, 3, 4], 50, 2.5),  # rank 1.5
        ([4, 1, 3, 2], 50, 2.5),  # order of the input does not matter
        ([10, 20, 30, 40, 50], 25, 20.0),  # rank exactly 1
        ([10, 20], 90, 19.0),  # rank 0.9
        ([7], 99, 7.0),
        ([], 99, 0.0),
    ],
)
def test_percentile_hand_values(values, p, expected):
    assert percentile_linear(values, p) == pytest.approx(expected, rel=1e-15)


def test_percentile_divisor_converts_units():
    assert percentile_linear([1000, 2000], 50, 1000.0) == 1.5
    assert percentile_linear([1500], 99, 1000.0) == 1.5


def test_percentile_rejects_out_of_range_p():
    with pytest.raises(ValueError):
        percentile_linear([1, 2], 101)
    with pytest.raises(ValueError):
        percentile_linear([1, 2], -1)


def test_percentile_ms_uses_blis_grouping_bit_exactly():
    # golden_case3's e2e_p90: sorted[269] = 931453 µs, sorted[270] = 933066 µs, n = 300.
    # BLIS prints 931.6143; converting to ms before interpolating gives 931.6143000000001.
    values = list(range(269)) + [931453, 933066] + [10**7] * 29
    assert len(values) == 300
    got = percentile_linear(values, 90, 1000.0)
    assert got == 931.6143
    rank = 0.9 * 299
    frac = rank - math.floor(rank)
    ms_first = 931.453 + (933.066 - 931.453) * frac
    assert ms_first != got  # the test distinguishes the two expressions


@given(
    st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=200),
    st.floats(min_value=0, max_value=100),
)
@settings(max_examples=200, deadline=None)
def test_percentile_matches_numpy_linear(values, p):
    ours = percentile_linear(values, p)
    ref = float(np.percentile(np.asarray(values, dtype=np.float64), p, method="linear"))
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-6)


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50))
@settings(max_examples=100, deadline=None)
def test_percentile_float_values_match_numpy(values):
    for p in (0, 50, 90, 99, 100):
        ref = float(np.percentile(np.asarray(values), p))
        assert percentile_linear(values, p) == pytest.approx(ref, rel=1e-9, abs=1e-6)


def test_mean_hand_values():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([1000, 2000, 4000], 1000.0) == pytest.approx(7.0 / 3.0, rel=1e-15)
    assert mean([]) == 0.0
    assert mean([0.5, 0.25]) == 0.375


def test_mean_is_sum_over_n_then_divisor():
    values = [14329, 17208, 16976]
    assert mean(values, 1000.0) == (sum(values) / 3) / 1000


def test_float_mean_sums_in_ascending_order():
    # 1e16 + 1 + 1 in float64: left to right the ones are lost (1e16 + 1 == 1e16), smallest
    # first they are not; BLIS sums the sorted values
    values = [1e16, 1.0, 1.0]
    assert mean(values) == (1.0 + 1.0 + 1e16) / 3
    assert mean(values) != (1e16 + 1.0 + 1.0) / 3


@given(st.one_of(st.lists(st.integers(min_value=-10**12, max_value=10**12), max_size=60),
                 st.lists(st.floats(min_value=-1e9, max_value=1e9), max_size=60)))
@settings(max_examples=150, deadline=None)
def test_a_population_sorted_once_gives_the_same_statistics(values):
    """``sort_values`` once, then several statistics: the same floats, bit for bit, as each
    statistic of the raw values (whose own sort they would each repeat)."""
    once = sort_values(values)
    assert list(once.values) == sorted(once.values.tolist())
    assert sort_values(once) is once
    for p in (0, 1, 50, 90, 95, 99, 99.9, 100):
        assert percentile_linear(once, p, 1000.0) == percentile_linear(values, p, 1000.0)
    assert mean(once, 1000.0) == mean(values, 1000.0)
    if values and all(isinstance(v, int) for v in values):
        assert once.values.dtype == np.int64
        assert mean(once) == float(sum(values)) / len(values)
