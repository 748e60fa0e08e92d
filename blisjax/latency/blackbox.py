"""BLIS's blackbox latency model (docs/semantics.md B.1).

queueing delay = trunc(α0 + α1·L_in); step time = max(1, trunc(β0 + β1·prefill_tokens +
β2·decode_tokens)); α2 is a per-token output-processing time added only to metrics.
Every formula is IEEE double, left to right, one rounding per operation (no FMA).
"""

from __future__ import annotations

from dataclasses import dataclass

from blisjax.latency.base import StepBatch, float_to_ticks


def blackbox_queueing_delay_us(alpha: tuple[float, ...], input_tokens: int) -> int:
    """trunc((0.0 + α0) + α1·L_in), ``input_tokens`` including any shared prefix."""
    return float_to_ticks((0.0 + alpha[0]) + alpha[1] * float(input_tokens))


def blackbox_step_time_us(beta: tuple[float, ...], prefill_tokens: int, decode_tokens: int) -> int:
    """max(1, trunc(((0.0 + β0) + β1·prefill) + β2·decode)).

    ``prefill_tokens`` are the new tokens of scheduled requests still in prefill (cache misses),
    ``decode_tokens`` the number of scheduled decode requests. An empty batch gives max(1, β0).
    """
    x = ((0.0 + beta[0]) + beta[1] * float(prefill_tokens)) + beta[2] * float(decode_tokens)
    return max(1, float_to_ticks(x))


def split_prefill_decode(batch: StepBatch) -> tuple[int, int]:
    """(Σ new tokens of prefill requests, Σ new tokens of decode requests) by start-of-step PI."""
    prefill = 0
    decode = 0
    for new, pi, l_in, n_out in zip(
        batch.new_tokens, batch.progress_index, batch.input_tokens, batch.output_tokens,
        strict=True,
    ):
        if pi < l_in:
            prefill += new
        elif n_out > 0:
            decode += new
    return prefill, decode


@dataclass(frozen=True)
class BlackboxLatency:
    """α = (α0, α1, α2) in µs, µs/token, µs; β = (β0, β1, β2) in µs, µs/token, µs/token."""

    alpha: tuple[float, float, float]
    beta: tuple[float, float, float]

    def queueing_delay_us(self, input_tokens: int) -> int:
        return blackbox_queueing_delay_us(self.alpha, input_tokens)

    def step_time_us(self, batch: StepBatch) -> int:
        prefill, decode = split_prefill_decode(batch)
        return blackbox_step_time_us(self.beta, prefill, decode)

    @property
    def output_token_processing_us(self) -> int:
        return float_to_ticks(self.alpha[2])

    @property
    def post_decode_overhead_us(self) -> int:
        return 0
