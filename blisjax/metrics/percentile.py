"""Percentiles and means with BLIS's exact float expressions.

BLIS reports every latency statistic through two tiny formulas; reproducing its JSON to the last
bit needs the same operations in the same order, so both are written out explicitly here (numpy's
``percentile`` uses a different lerp and is only equal up to round-off).

Percentile (linear interpolation between order statistics, numpy's "linear" definition)::

    s = sorted(values);  rank = (p / 100.0) * float(n - 1)
    lo = floor(rank);    hi = ceil(rank)
    lo == hi:  s[lo] / divisor
    otherwise: s[lo] / divisor + (float(s[hi] - s[lo]) * (rank - lo)) / divisor

With ``divisor = 1000`` this is BLIS's JSON percentile (µs in, ms out); it reproduces all 30
TTFT/E2E percentiles of the five golden cases bit for bit, whereas interpolating after converting
to ms, or computing ``(lo + (hi - lo)·frac) / 1000``, is off by one ulp on some of them. With
``divisor = 1`` it is BLIS's raw-unit ``Distribution`` percentile (``lo + frac·(hi − lo)``, the
same value since IEEE multiplication commutes and ``x / 1 == x``), used by the fitness function.
The golden ``itl_p99_ms = 31.458400000000395`` shows the rounding error of ``rank − lo`` for a
large ``n`` being multiplied by the gap ``hi − lo``: the formula is applied as is, not rounded.

Mean::

    (Σ values) / n / divisor

BLIS sums in float64 over the sorted values; for integer values (all our times) every partial sum
is an exact integer below 2**53, so the exact integer sum converted once is the same number.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["SortedValues", "mean", "percentile_linear", "sort_values"]


class SortedValues(NamedTuple):
    """A population sorted once (``sort_values``), for several statistics of it: each
    ``percentile_linear`` of raw values sorts them again."""

    values: np.ndarray  # 1-D, ascending; int64 for integer input, else float64


def sort_values(values: np.ndarray | list | tuple | SortedValues) -> SortedValues:
    """``values`` sorted ascending, integers kept as int64 and anything else as float64."""
    if isinstance(values, SortedValues):
        return values
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D array of values, got shape {arr.shape}")
    if arr.dtype.kind in "iub":  # equal integers are indistinguishable: any sort will do
        return SortedValues(np.sort(arr.astype(np.int64, copy=False)))
    # a stable sort keeps equal floats (0.0 and -0.0) in their order, for mean's sum
    return SortedValues(np.sort(arr.astype(np.float64), kind="stable"))


def percentile_linear(values: np.ndarray | list | tuple | SortedValues, p: float,
                      divisor: float = 1.0) -> float:
    """BLIS's linear-interpolation percentile of ``values``, divided by ``divisor``.

    Args:
      values: 1-D numbers in any order (any unit, e.g. µs), or ``sort_values`` of them;
        integer arrays keep exact integer differences, as BLIS's ``int64`` ITL list does.
      p: percentile in [0, 100].
      divisor: unit conversion applied the way BLIS applies it (1000 turns µs into ms).

    Returns:
      The percentile in ``unit / divisor`` (e.g. ms for µs input and ``divisor=1000``);
      0.0 for an empty input (BLIS's value for an empty list).
    """
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile p must be in [0, 100], got {p}")
    s = sort_values(values).values
    n = int(s.shape[0])
    if n == 0:
        return 0.0
    rank = p / 100.0 * float(n - 1)
    lo = math.floor(rank)
    hi = math.ceil(rank)
    lo_val = s[lo].item()
    if lo == hi:
        return float(lo_val) / divisor
    # Why this grouping: BLIS scales the lower value and the interpolated gap separately; the
    # gap is formed in the values' own type (exact for integers) before the float multiply.
    gap = float(s[hi].item() - lo_val)
    return float(lo_val) / divisor + gap * (rank - float(lo)) / divisor


def mean(values: np.ndarray | list | tuple | SortedValues, divisor: float = 1.0) -> float:
    """Arithmetic mean of ``values`` divided by ``divisor`` (0.0 for an empty input).

    Integer inputs are summed exactly (equal to BLIS's float64 running sum whenever partial sums
    stay below 2**53, i.e. always for µs latencies); float inputs are summed sequentially in
    sorted order, as BLIS does. ``values`` may be ``sort_values`` of them.
    """
    arr = values.values if isinstance(values, SortedValues) else np.asarray(values)
    if arr.ndim == 1 and arr.dtype.kind in "iub":  # an exact sum: the order does not matter
        n = int(arr.shape[0])
        return float(int(np.sum(arr, dtype=np.int64))) / float(n) / divisor if n else 0.0
    s = sort_values(values).values  # already sorted if ``values`` is ``SortedValues``
    n = int(s.shape[0])
    if n == 0:
        return 0.0
    # cumsum is a strictly sequential left-to-right sum (np.sum would sum pairwise).
    total = float(np.cumsum(s)[-1])
    return total / float(n) / divisor
