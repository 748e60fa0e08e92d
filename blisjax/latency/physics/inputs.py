"""Simulator-state inputs of the physics features (docs/latency-models.md §P.4).

The engine fills these from its state; every field says what it is and when it is measured.
Counts are Python ints (int64 in the JAX engine): the per-request aggregation below is integer
arithmetic, hence exact and independent of summation order. Only the EMA and ratios are floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from blisjax.config._checks import ConfigError, set_field
from blisjax.latency.base import StepBatch
from blisjax.latency.physics.config import PhysicsConfig

#: ε of every guarded denominator (docs/latency-models.md §P.7).
EPSILON = 1e-6
#: Default preemption-EMA decay γ (docs/latency-models.md §P.4).
DEFAULT_PREEMPTION_EMA_GAMMA = 0.3


def _count(path: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(path, f"must be an integer >= 0, got {value!r}")


def _ratio(path: str, value: object, hi: float | None = None) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value >= 0
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        rng = f"in [0, {hi}]" if hi is not None else ">= 0"
        raise ConfigError(path, f"must be a finite number {rng}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PhysicsQueueInputs:
    """Instance state when a request arrives (alpha features; docs/latency-models.md §P.4).

    Measured once per request, at the moment the instance receives it (before the α delay and
    before the request joins the wait queue), as BLIS evaluates ``QueueingTime(req)``.

    Attributes:
      running_depth: requests in the running batch (``len(RunningBatch)``).
      waiting_depth: requests in the wait queue, this request excluded.
      kv_usage_ratio: used GPU KV blocks / total blocks (cached-but-free blocks count as free).
        Gate input; values above 1 are clamped inside the gate (§P.5).
      prompt_tokens: the request's input tokens (shared prefix included).
      prefix_hit_ratio: fraction of the prompt served from the prefix cache, in [0, 1]:
        ``(cached_blocks·block_size)/max(1, prompt_tokens)`` (§P.4); 0 without
        prefix caching.
      kv_free_bytes: free GPU KV bytes (§P.4:
        ``total_blocks·block_size_bytes·max(ε, 1 − kv_usage_ratio)``).
      preemption_ema: the preemption EMA after the latest step (:func:`update_preemption_ema`).
    """

    running_depth: int
    waiting_depth: int
    kv_usage_ratio: float
    prompt_tokens: int
    prefix_hit_ratio: float
    kv_free_bytes: float
    preemption_ema: float

    def __post_init__(self) -> None:
        p = "queue_inputs"
        for name in ("running_depth", "waiting_depth", "prompt_tokens"):
            _count(f"{p}.{name}", getattr(self, name))
        set_field(self, "kv_usage_ratio", _ratio(f"{p}.kv_usage_ratio", self.kv_usage_ratio))
        hit = _ratio(f"{p}.prefix_hit_ratio", self.prefix_hit_ratio, 1.0)
        set_field(self, "prefix_hit_ratio", hit)
        set_field(self, "kv_free_bytes", _ratio(f"{p}.kv_free_bytes", self.kv_free_bytes))
        set_field(self, "preemption_ema", _ratio(f"{p}.preemption_ema", self.preemption_ema))

    @classmethod
    def from_state(
        cls,
        cfg: PhysicsConfig,
        *,
        running_depth: int,
        waiting_depth: int,
        kv_used_blocks: int,
        prompt_tokens: int,
        prefix_cached_blocks: int,
        preemption_ema: float,
    ) -> PhysicsQueueInputs:
        """Derive the ratios from block counts as docs/latency-models.md §P.4 defines them.

        ``kv_used_blocks`` = total − free GPU blocks; ``prefix_cached_blocks`` = length of the
        cached prefix chain of the request's prompt (``GetCachedBlocks``), ignored when prefix
        caching is off.
        """
        _count("queue_inputs.kv_used_blocks", kv_used_blocks)
        _count("queue_inputs.prefix_cached_blocks", prefix_cached_blocks)
        _count("queue_inputs.prompt_tokens", prompt_tokens)
        usage = float(kv_used_blocks) / float(cfg.total_kv_blocks_gpu)
        free_bytes = (float(cfg.total_kv_blocks_gpu) * cfg.block_size_bytes) * max(
            EPSILON, 1.0 - usage
        )
        if cfg.prefix_caching_enabled:
            hit = float(prefix_cached_blocks * cfg.block_size_tokens) / float(max(1, prompt_tokens))
        else:
            hit = 0.0
        return cls(
            running_depth=running_depth,
            waiting_depth=waiting_depth,
            kv_usage_ratio=usage,
            prompt_tokens=prompt_tokens,
            prefix_hit_ratio=hit,
            kv_free_bytes=free_bytes,
            preemption_ema=float(preemption_ema),
        )


@dataclass(frozen=True)
class PhysicsStepInputs:
    """Aggregates of one step's scheduled batch (beta features; docs/latency-models.md §P.4).

    Measured after the step's batch formation (scheduled requests = those with new tokens > 0),
    before its progress update. A request is *prefill* if its progress index at the start of the
    step is below its input length, otherwise *decode* (if it has output tokens).

    Attributes:
      prefill_tokens: Σ new tokens of prefill requests (cache misses scheduled this step).
      decode_tokens: Σ new tokens of decode requests (1 each).
      num_prefill_reqs, num_decode_reqs: request counts of each kind.
      sum_prefill_attn_work: Σ over prefill requests of ``context_len × chunk_len`` with
        ``chunk_len`` = new tokens and ``context_len`` = tokens already computed + chunk_len
        (§P.4).
      decode_context_tokens: Σ over decode requests of their context length (tokens already in
        KV + the new token).
      sum_decode_kv_blocks: Σ of KV blocks held by decode requests this step.
      preemption_ema: the EMA including this step's preemptions.
      transfer_blocks: GPU↔CPU KV blocks transferred this step (0 until offloading exists).
      cpu_resident_read_blocks: KV blocks read from CPU this step (0 until offloading exists).
    """

    prefill_tokens: int
    decode_tokens: int
    num_prefill_reqs: int
    num_decode_reqs: int
    sum_prefill_attn_work: int
    decode_context_tokens: int
    sum_decode_kv_blocks: int
    preemption_ema: float
    transfer_blocks: int = 0
    cpu_resident_read_blocks: int = 0

    _COUNTS = (
        "prefill_tokens",
        "decode_tokens",
        "num_prefill_reqs",
        "num_decode_reqs",
        "sum_prefill_attn_work",
        "decode_context_tokens",
        "sum_decode_kv_blocks",
        "transfer_blocks",
        "cpu_resident_read_blocks",
    )

    def __post_init__(self) -> None:
        for name in self._COUNTS:
            _count(f"step_inputs.{name}", getattr(self, name))
        ema = _ratio("step_inputs.preemption_ema", self.preemption_ema)
        set_field(self, "preemption_ema", ema)

    @property
    def scheduled_tokens(self) -> int:
        """Total tokens of the step: prefill_tokens + decode_tokens."""
        return self.prefill_tokens + self.decode_tokens

    @classmethod
    def from_batch(
        cls,
        batch: StepBatch,
        *,
        block_size_tokens: int,
        preemption_ema: float,
        prefix_cached_tokens: Sequence[int] | None = None,
        kv_blocks: Sequence[int] | None = None,
        transfer_blocks: int = 0,
        cpu_resident_read_blocks: int = 0,
    ) -> PhysicsStepInputs:
        """Aggregate a scheduled batch (integer arithmetic; order-independent).

        For request i with new tokens ``t``, start-of-step progress index ``pi`` and
        ``c = prefix_cached_tokens[i]`` (prefix-cache tokens credited when the request was
        admitted in this very step, else 0): computed-before = ``pi + c``;
        prefill work += ``(pi + c + t)·t``; decode context += ``pi + c + t``; decode KV blocks
        += ``kv_blocks[i]``, or ``ceil((pi + c + t)/block_size_tokens)`` when not given (the
        blocks BLIS's KV cache holds for the request once this step's token is allocated).
        Requests with ``t == 0`` are ignored.
        """
        n = len(batch.new_tokens)
        cached = [0] * n if prefix_cached_tokens is None else prefix_cached_tokens
        if len(cached) != n or (kv_blocks is not None and len(kv_blocks) != n):
            raise ConfigError(
                "step_inputs", "prefix_cached_tokens/kv_blocks must have one entry per request"
            )
        prefill = decode = n_prefill = n_decode = work = context = blocks = 0
        bs = block_size_tokens
        held = kv_blocks if kv_blocks is not None else cached  # placeholder when derived
        for t, pi, l_in, n_out, c, kv in zip(
            batch.new_tokens,
            batch.progress_index,
            batch.input_tokens,
            batch.output_tokens,
            cached,
            held,
            strict=True,
        ):
            if t <= 0:
                continue
            ctx = pi + c + t
            if pi < l_in:
                prefill += t
                n_prefill += 1
                work += ctx * t
            elif n_out > 0:
                decode += t
                n_decode += 1
                context += ctx
                blocks += kv if kv_blocks is not None else -(-ctx // bs)
        return cls(
            prefill_tokens=prefill,
            decode_tokens=decode,
            num_prefill_reqs=n_prefill,
            num_decode_reqs=n_decode,
            sum_prefill_attn_work=work,
            decode_context_tokens=context,
            sum_decode_kv_blocks=blocks,
            preemption_ema=float(preemption_ema),
            transfer_blocks=transfer_blocks,
            cpu_resident_read_blocks=cpu_resident_read_blocks,
        )


def update_preemption_ema(
    previous: float, num_preempted: int, running_depth: int, gamma: float
) -> float:
    """One EMA step (docs/latency-models.md §P.4): ``(γ·rate) + ((1 − γ)·previous)``.

    ``rate = float(num_preempted)/float(max(1, running_depth))`` where ``num_preempted`` is the
    number of requests the step's batch formation preempted and ``running_depth`` the running
    batch size after it. Start from 0.0; call once per step, before that step's beta features.
    """
    rate = float(num_preempted) / float(max(1, running_depth))
    return (gamma * rate) + ((1.0 - gamma) * previous)
