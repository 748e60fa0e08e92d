"""The latency-model interface both engines use, and BLIS's float→tick conversion."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from blisjax.limits import INT64_MAX

INT64_MIN = -INT64_MAX - 1
_TWO_63 = 9.223372036854775807e18  # 2**63 as a float64


def float_to_ticks(x: float) -> int:
    """BLIS ``clampToInt64``: truncate toward zero; NaN or >= 2**63 gives INT64_MAX, <= -2**63
    gives INT64_MIN."""
    if math.isnan(x) or x >= _TWO_63:
        return INT64_MAX
    if x <= -_TWO_63:
        return INT64_MIN
    return int(x)


def float_to_ticks_array(x, xp=np):
    """``float_to_ticks`` elementwise on a float64 array of ``xp`` (NumPy, or ``jax.numpy``
    inside the JAX engine's programs): int64 array, the same values."""
    big = xp.isnan(x) | (x >= _TWO_63)
    small = x <= -_TWO_63
    inside = xp.where(big | small, 0.0, x)  # converting NaN or out-of-range values is undefined
    return xp.where(big, INT64_MAX, xp.where(small, INT64_MIN, inside.astype(xp.int64)))


@dataclass(frozen=True)
class StepBatch:
    """The scheduled requests of one step (those with ``new_tokens > 0``), in batch order.

    Every list has one entry per scheduled request. ``progress_index`` is the value at the
    *start* of the step (before the step's progress update), as BLIS classifies with it.
    """

    new_tokens: list[int]
    progress_index: list[int]
    input_tokens: list[int]
    output_tokens: list[int]


class LatencyModel(Protocol):
    """What an engine needs from a latency model (all results in integer µs)."""

    def queueing_delay_us(self, input_tokens: int) -> int:
        """Delay between routing and enqueue, applied once per request."""

    def step_time_us(self, batch: StepBatch) -> int:
        """Duration of one step for the scheduled batch, >= 1."""

    @property
    def output_token_processing_us(self) -> int:
        """Metric-only time added to TTFT and to each ITL entry (BLIS α2)."""

    @property
    def post_decode_overhead_us(self) -> int:
        """Metric-only time added to E2E of requests with output tokens."""
