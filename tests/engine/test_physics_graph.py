"""The physics latency model inside the compiled program (``blisjax.engine.physics``) against
the reference formulas (``blisjax.latency.physics``, the oracle; docs/latency-models.md §P).

Thousands of random steps (prefill only, decode only, mixed, prefix-cached admissions,
unscheduled positions, empty batches, contexts of up to 10^8 tokens, preemptions moving the EMA)
and random arrivals (idle and saturated instances, full KV caches whose memory feature clamps at
100, long wait queues, cached prefixes) are evaluated by one jitted program each, vmapped as the
engine's lanes, and by the reference; every feature's float64 bits, the EMA's bits, the step
times and the queueing delays must agree. A stretch's plan (16 decode steps and the EMA after
each) is checked against the reference step by step.

Coefficients and the EMA decay are random floats with full significands and the ``odd`` model
(d = 4099, 31 heads, 7 KV heads, 37 layers) at TP = 3 makes the model's constants inexact, so
every product and division rounds: a product contracted into an addition, or a division
rewritten as a multiplication, changes results here.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np
import pytest

from blisjax.config import load_hardware, load_model_config
from blisjax.engine import physics
from blisjax.latency.base import StepBatch
from blisjax.latency.physics import (
    PhysicsCoefficients,
    PhysicsLatency,
    PhysicsQueueInputs,
    VLLMKnobs,
)
from blisjax.latency.physics.features import dot_left_to_right

WIDTH = 64  # running positions of every test step (one compiled shape)
BUDGET = 2048  # token budget; the token tables end at BUDGET + WIDTH
QUEUE = 500  # wait-queue capacity: the ln(1 + depth) table ends here
STEPS = 1200
ARRIVALS = 3000


def _odd_model():
    base = load_model_config("meta-llama/llama-3.1-8b-instruct")
    return dataclasses.replace(base, hidden_dim=4099, num_heads=31, num_kv_heads=7,
                               num_layers=37, intermediate_dim=11001)


# (model, GPU, TP, prefix caching, KV blocks)
CASES = {
    "llama-3.1-8b-h100": (lambda: load_model_config("meta-llama/llama-3.1-8b-instruct"),
                          "H100", 1, True, 7_463),
    "qwen3-30b-a3b-moe-a100-tp2": (lambda: load_model_config("qwen/qwen3-30b-a3b"),
                                   "A100-SXM", 2, False, 30_001),
    "odd-h100-tp3": (_odd_model, "H100", 3, True, 12_347),
}


def _model(case: str, seed: int) -> PhysicsLatency:
    load, gpu, tp, prefix, blocks = CASES[case]
    rng = np.random.default_rng(seed)
    knobs = VLLMKnobs(max_num_seqs=WIDTH, max_num_batched_tokens=BUDGET,
                      total_kv_blocks_gpu=blocks, block_size_tokens=16,
                      prefix_caching_enabled=prefix)
    # full-significand coefficients of both signs, large enough that every feature counts
    coef = PhysicsCoefficients(alpha=tuple(rng.uniform(-3000.0, 3000.0, 11)),
                               beta=tuple(rng.uniform(-300.0, 3000.0, 16)),
                               model="m", hardware=gpu, tp=tp, gamma=float(rng.uniform(0.05, 1)))
    return PhysicsLatency.build(load(), load_hardware(gpu), tp, knobs, coef)


class Steps(NamedTuple):
    """[STEPS, WIDTH] int32 running batches, then [STEPS] per-step values."""

    nn: np.ndarray  # new tokens (> 0: scheduled)
    pi: np.ndarray  # progress at the step's start
    l_in: np.ndarray
    out: np.ndarray
    cached: np.ndarray  # prefix tokens credited at admission in this step
    ema: np.ndarray  # float64: the EMA before the step
    preempted: np.ndarray
    depth: np.ndarray  # running depth after batch formation


def _steps(seed: int) -> Steps:
    rng = np.random.default_rng(seed)
    shape = (STEPS, WIDTH)
    l_in = rng.integers(1, 30_000, shape)
    out = rng.integers(0, 4_000, shape)
    nn, pi, cached = (np.zeros(shape, np.int64) for _ in range(3))
    for b in range(STEPS):
        kind = b % 6
        decode_share = {0: 0.0, 1: 1.0}.get(kind, rng.random())
        is_decode = rng.random(WIDTH) < decode_share
        pi[b] = np.where(is_decode, l_in[b] + rng.integers(0, 4_000, WIDTH),
                         rng.integers(0, l_in[b]) * (rng.random(WIDTH) < 0.5))
        if kind == 4:  # contexts of up to 10^8 tokens
            pi[b] += rng.integers(0, 10**8, WIDTH) * (rng.random(WIDTH) < 0.5)
            l_in[b] = np.where(is_decode, np.minimum(l_in[b], pi[b]), l_in[b] + pi[b])
        admitted = (~is_decode) & (pi[b] == 0) & (rng.random(WIDTH) < 0.5)
        cached[b] = np.where(admitted, 16 * rng.integers(0, l_in[b] // 16 + 1), 0)
        chunk = rng.integers(1, 600, WIDTH)
        new = np.where(is_decode, 1, np.maximum(1, np.minimum(chunk, l_in[b] - pi[b] - cached[b])))
        scheduled = np.arange(WIDTH) < rng.integers(0, WIDTH + 1)
        scheduled &= rng.random(WIDTH) < (0.6 if kind == 3 else 1.0)
        nn[b] = np.where(scheduled, new, 0)
        while nn[b][~is_decode].sum() > BUDGET:  # prefill chunks fit the token budget
            j = int(np.argmax(np.where(is_decode, 0, nn[b])))
            nn[b, j] = max(1, nn[b, j] // 2)
        if kind == 5 and b % 12 == 5:
            nn[b] = 0  # an empty step
    ema = np.where(rng.random(STEPS) < 0.3, 0.0, rng.random(STEPS))
    depth = rng.integers(0, WIDTH + 1, STEPS)
    preempted = np.where(rng.random(STEPS) < 0.3, rng.integers(0, 9, STEPS), 0)
    ints = (x.astype(np.int32) for x in (nn, pi, l_in, out, cached))
    return Steps(*ints, ema, preempted.astype(np.int32), depth.astype(np.int32))


class Arrivals(NamedTuple):
    """[ARRIVALS] per-arrival values (the α inputs)."""

    running: np.ndarray
    waiting: np.ndarray
    used_blocks: np.ndarray
    prompt: np.ndarray
    cached_blocks: np.ndarray
    ema: np.ndarray


def _arrivals(seed: int, blocks: int) -> Arrivals:
    rng = np.random.default_rng(seed)
    n = ARRIVALS
    prompt = rng.integers(1, 40_000, n)
    used = np.where(rng.random(n) < 0.2, blocks, rng.integers(0, blocks + 1, n))
    return Arrivals(running=rng.integers(0, 2 * WIDTH, n).astype(np.int32),
                    waiting=np.where(rng.random(n) < 0.1, QUEUE,
                                     rng.integers(0, QUEUE + 1, n)).astype(np.int32),
                    used_blocks=used.astype(np.int32), prompt=prompt.astype(np.int32),
                    cached_blocks=(rng.integers(0, prompt // 16 + 1)).astype(np.int32),
                    ema=np.where(rng.random(n) < 0.3, 0.0, rng.random(n)))


def _step_all(pc, nn, pi, l_in, out, cached, ema, preempted, depth):
    """The engine's step time and updated EMA, and the features and dot product (whose float
    bits the truncation to µs would mostly hide) they come from."""
    us, after = physics.step_time(pc, physics.StepInputs(nn, pi, l_in, out, cached, ema,
                                                         preempted, depth))
    features = physics.step_features(pc, nn, pi, l_in, out, cached, after)
    return features, after, physics.dot_left_to_right(pc.beta, features), us


def _arrival_all(pc, *arrival):
    """The engine's queueing delay, and the features and dot product it comes from."""
    features = physics.queue_features(pc, *arrival)
    return (features, physics.dot_left_to_right(pc.alpha, features),
            physics.queueing_delay(pc, *arrival))


# One program each, the model's coefficients and tables being its arguments (as in the engine).
_step = jax.jit(jax.vmap(_step_all, in_axes=(None, *[0] * 8)))
_arrival = jax.jit(jax.vmap(_arrival_all, in_axes=(None, *[0] * 6)))


def _bits(values) -> list[int]:
    return [int(x) for x in np.asarray(values, np.float64).view(np.int64)]


@pytest.mark.parametrize("case", CASES)
def test_step_features_and_times_match_the_reference_bit_for_bit(case):
    model = _model(case, seed=len(case))
    steps = _steps(seed=3 * len(case))
    pc = physics.physics_consts(model, BUDGET + WIDTH, QUEUE)
    got_features, got_ema, got_dot, got_us = jax.device_get(_step(pc, *steps))
    features = np.stack(got_features, axis=-1)
    mismatches, mixed, moe = [], 0, 0
    for b in range(STEPS):
        on = steps.nn[b] > 0
        batch = StepBatch(*([int(x) for x in a[b][on]] for a in steps[:4]))
        ema = model.update_preemption_ema(float(steps.ema[b]), int(steps.preempted[b]),
                                          int(steps.depth[b]))
        inputs = model.step_inputs(batch, ema,
                                   prefix_cached_tokens=[int(x) for x in steps.cached[b][on]])
        want = model.beta_features(inputs)
        mixed += want[14] == 1.0
        moe += 0.0 < want[7] < 1.0
        if (_bits(want) != _bits(features[b]) or _bits([ema]) != _bits([got_ema[b]])
                or _bits([dot_left_to_right(model.coefficients.beta, want)]) != _bits(
                    [got_dot[b]])
                or model.step_time_us(inputs) != int(got_us[b])):
            mismatches.append((b, want, features[b].tolist(), model.step_time_us(inputs),
                               int(got_us[b])))
    assert not mismatches, mismatches[:3]
    assert mixed > 0  # steps with prefill and decode requests
    assert (moe > 0) == model.config.is_moe


@pytest.mark.parametrize("case", CASES)
def test_queue_features_and_delays_match_the_reference_bit_for_bit(case):
    model = _model(case, seed=len(case))
    arrivals = _arrivals(seed=5 * len(case), blocks=model.config.total_kv_blocks_gpu)
    pc = physics.physics_consts(model, BUDGET + WIDTH, QUEUE)
    got_features, dots, delays = jax.device_get(_arrival(pc, *arrivals))
    features = np.stack(got_features, axis=-1)
    mismatches, positive, clamped = [], 0, 0
    for k in range(ARRIVALS):
        inputs = PhysicsQueueInputs.from_state(
            model.config, running_depth=int(arrivals.running[k]),
            waiting_depth=int(arrivals.waiting[k]), kv_used_blocks=int(arrivals.used_blocks[k]),
            prompt_tokens=int(arrivals.prompt[k]), prefix_cached_blocks=int(
                arrivals.cached_blocks[k]), preemption_ema=float(arrivals.ema[k]))
        want, want_us = model.alpha_features(inputs), model.queueing_delay_us(inputs)
        positive += want_us > 0
        clamped += want[7] == 100.0  # a full KV cache: memory admission gap clamped
        dot = dot_left_to_right(model.coefficients.alpha, want)
        if (_bits(want) != _bits(features[k]) or want_us != int(delays[k])
                or _bits([dot]) != _bits([dots[k]])):
            mismatches.append((k, want, features[k].tolist(), want_us, int(delays[k])))
    assert not mismatches, mismatches[:3]
    assert 0 < positive < ARRIVALS  # delays of both signs before the floor at 0
    assert clamped > 0


@pytest.mark.parametrize("case", CASES)
def test_a_stretch_plan_times_each_step_as_the_reference_would(case):
    """``plain_step_times``: 16 decode steps of a fixed batch at progress pi + k, each with
    the EMA the reference's update gives after the steps before (no preemption)."""
    model = _model(case, seed=len(case))
    pc = physics.physics_consts(model, BUDGET + WIDTH, QUEUE)
    rng = np.random.default_rng(7 * len(case))
    plan = jax.jit(jax.vmap(physics.plain_step_times, in_axes=(None, 0, 0, 0, 0, 0, None)),
                   static_argnums=6)
    lanes = 40
    keep = rng.random((lanes, WIDTH)) < 0.7
    l_in = rng.integers(1, 30_000, (lanes, WIDTH))
    pi = l_in + rng.integers(0, 4_000, (lanes, WIDTH))
    out = rng.integers(1, 4_000, (lanes, WIDTH))
    ema = np.where(np.arange(lanes) % 4 == 0, 0.0, rng.random(lanes))
    got_us, got_ema = (np.asarray(x) for x in plan(
        pc, keep, *(x.astype(np.int32) for x in (pi, l_in, out)), ema, 16))
    for b in range(lanes):
        on = keep[b]
        e, want_us, want_ema = float(ema[b]), [], [float(ema[b])]
        for k in range(16):
            e = model.update_preemption_ema(e, 0, int(on.sum()))
            batch = StepBatch([1] * int(on.sum()), [int(x) + k for x in pi[b][on]],
                              [int(x) for x in l_in[b][on]], [int(x) for x in out[b][on]])
            want_us.append(model.step_time_us(model.step_inputs(batch, e)))
            want_ema.append(e)
        assert got_us[b].tolist() == want_us, b
        assert _bits(got_ema[b]) == _bits(want_ema), b
    assert len({tuple(x) for x in got_us.tolist()}) > 1 and np.any(got_us[:, 0] != got_us[:, -1])
