"""The roofline step time inside the compiled program (``blisjax.engine.roofline``) against the
reference formulas (``blisjax.latency.roofline``, the oracle; docs/roofline.md §2–§3).

Thousands of random running batches (prefill only, decode only, mixed, one-token prefill
chunks, unscheduled positions, decodes without output, empty batches, contexts up to 10^8
tokens, a step at the table's last row) are evaluated by one jitted program per test and by the
reference; the integer µs and the float64 bits of compute and memory seconds must agree.

Real models have power-of-two widths, so most of their products are exact and a fused
multiply-add would round like the separate operations. The ``odd`` model (d = 4099, 31 heads,
7 KV heads, 37 layers: d/H and every product built on it are inexact) and TP = 3 (division by
TP inexact) make every multiply, addition and division round, so a contracted or rewritten
operation in the program changes results here.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.config import load_hardware, load_model_config
from blisjax.engine import roofline as rl
from blisjax.engine.static import build_static
from blisjax.latency.base import StepBatch
from blisjax.latency.roofline import (
    RooflineLatency,
    roofline_step_seconds,
    split_roofline_requests,
)

WIDTH = 64  # running positions of every test batch (one compiled shape)
BUDGET = 2048  # token budget: a step's prefill tokens; the table ends at BUDGET + WIDTH
BATCHES = 1500  # per model and GPU


def _odd_model():
    base = load_model_config("meta-llama/llama-3.1-8b-instruct")
    return dataclasses.replace(base, hidden_dim=4099, num_heads=31, num_kv_heads=7,
                               num_layers=37, intermediate_dim=11001)


MODELS = {
    "llama-3.1-8b": lambda: load_model_config("meta-llama/llama-3.1-8b-instruct"),
    "qwen3-30b-a3b-moe": lambda: load_model_config("qwen/qwen3-30b-a3b"),
    "scout-interleaved-moe-fp8": lambda: load_model_config(
        "meta-llama/llama-4-scout-17b-16e-instruct-fp8-dynamic"),
    "odd": _odd_model,
}
GPUS = [("H100", 1), ("L40S", 3), ("A100-SXM", 8)]


class Batches(NamedTuple):
    """[BATCHES, WIDTH] int32 running batches: new tokens, progress at the step's start, input
    tokens, output tokens."""

    nn: np.ndarray
    pi: np.ndarray
    l_in: np.ndarray
    out: np.ndarray


def _batches(seed: int, huge_context: int) -> Batches:
    rng = np.random.default_rng(seed)
    shape = (BATCHES, WIDTH)
    nn, pi = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    l_in = rng.integers(1, 30_000, shape)
    out = rng.integers(0, 4_000, shape)
    for b in range(BATCHES):
        kind = b % 8
        n = int(rng.integers(0, WIDTH + 1))
        decode_share = {0: 0.0, 1: 1.0}.get(kind, rng.random())
        is_decode = rng.random(WIDTH) < decode_share
        pi[b] = np.where(is_decode, l_in[b] + rng.integers(0, 4_000, WIDTH),
                         rng.integers(0, l_in[b]))
        chunk = np.ones(WIDTH, np.int64) if kind == 2 else rng.integers(1, 600, WIDTH)
        new = np.where(is_decode, 1, np.minimum(chunk, l_in[b] - pi[b]))
        scheduled = np.arange(WIDTH) < n
        if kind == 3:  # unscheduled positions inside the batch
            scheduled &= rng.random(WIDTH) < 0.6
        nn[b] = np.where(scheduled, new, 0)
        while nn[b][~is_decode].sum() > BUDGET:  # prefill chunks fit the token budget
            j = int(np.argmax(np.where(is_decode, 0, nn[b])))
            nn[b, j] = max(1, nn[b, j] // 2)
        if kind == 4:  # huge contexts
            pi[b] += rng.integers(0, huge_context, WIDTH) * (rng.random(WIDTH) < 0.5)
            l_in[b] = np.where(is_decode, np.minimum(l_in[b], pi[b]), l_in[b] + pi[b])
        if kind == 5 and b % 16 == 5:
            nn[b] = 0  # empty batch
    # The table's last row: a full-budget prefill chunk and WIDTH - 1 decodes.
    nn[0], pi[0], l_in[0], out[0] = 1, 5_000, 100, 7
    nn[0, 0], pi[0, 0], l_in[0, 0] = BUDGET, 0, 3 * BUDGET
    return Batches(*(x.astype(np.int32) for x in (nn, pi, l_in, out)))


# The engine compiles step_time_us alone; its seconds are checked through step_seconds.
_seconds = jax.jit(jax.vmap(rl.step_seconds, in_axes=(None, 0, 0, 0, 0)))
_step_us = jax.jit(jax.vmap(rl.step_time_us, in_axes=(None, 0, 0, 0, 0)))


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


@pytest.mark.parametrize("model_name", MODELS)
def test_matches_the_reference_bit_for_bit(model_name):
    # The odd model's KV bytes per token have 53 significant bits: its products with the
    # context are exact in the program for contexts below 2^26 (fits_the_program).
    batches = _batches(seed=len(model_name), huge_context=2**25 if model_name == "odd" else 10**8)
    scheduled = batches.nn > 0
    assert {"prefill", "decode"} <= {
        "prefill" if p < i else "decode"
        for p, i in zip(batches.pi[scheduled], batches.l_in[scheduled], strict=True)}
    for gpu, tp in GPUS:
        model = RooflineLatency(MODELS[model_name](), load_hardware(gpu), tp)
        assert rl.fits_the_program(model, BUDGET + WIDTH, int(batches.pi.max()))
        rc = rl.roofline_consts(model, BUDGET + WIDTH)
        got = jax.device_get(_seconds(rc, *batches))
        got_us = np.asarray(_step_us(rc, *batches))
        mismatches, empty = _mismatches(model, batches, got, got_us)
        assert not mismatches, (gpu, tp, mismatches[:5])
        assert empty > 0 and got_us.min() >= 1


def _mismatches(model, batches: Batches, got: rl.RooflineSeconds, got_us: np.ndarray
                ) -> tuple[list, int]:
    """(batches whose program seconds or µs differ from the reference's, as (batch, want µs,
    got µs); batches without a roofline request)."""
    mismatches, empty = [], 0
    for b in range(BATCHES):
        on = batches.nn[b] > 0
        batch = StepBatch(*([int(x) for x in a[b][on]] for a in batches))
        prefill, decode = split_roofline_requests(batch)
        want_us = model.step_time_us(batch)
        if prefill or decode:
            compute, memory = roofline_step_seconds(model.arch, model.rates, prefill, decode)
            same = (got.any_request[b] and _bits(compute) == _bits(got.compute[b])
                    and _bits(memory) == _bits(got.memory[b]))
        else:
            empty += 1
            same = not got.any_request[b]
        if not same or want_us != int(got_us[b]):
            mismatches.append((b, want_us, int(got_us[b])))
    return mismatches, empty


_decode_seconds = jax.jit(jax.vmap(rl.decode_seconds, in_axes=(None, 0, 0)))


def _decode_batches(seed: int) -> Batches:
    """Decode-only batches as a stretch plan evaluates them: every scheduled position decodes
    one token with output left (contexts up to 10^6), unscheduled positions anywhere, and
    some batches empty."""
    rng = np.random.default_rng(seed)
    shape = (BATCHES, WIDTH)
    l_in = rng.integers(1, 30_000, shape)
    pi = l_in + rng.integers(0, 4_000, shape) * (1 + 250 * (rng.random(shape) < 0.1))
    out = rng.integers(1, 4_000, shape)
    n = rng.integers(0, WIDTH + 1, (BATCHES, 1))
    scheduled = (np.arange(WIDTH)[None, :] < n) & (rng.random(shape) < 0.9)
    scheduled[::97] = False
    return Batches(*(x.astype(np.int32) for x in (scheduled.astype(np.int64), pi, l_in, out)))


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "qwen3-30b-a3b-moe", "odd"])
def test_decode_only_steps_match_the_reference_bit_for_bit(model_name):
    """``decode_seconds`` (a stretch plan's steps) against the reference on decode-only
    batches: a dense model, an MoE one and the odd one (every product rounds), each on every
    GPU and TP of ``GPUS`` (TP 3 makes the divisions round)."""
    batches = _decode_batches(seed=7 + len(model_name))
    on = batches.nn > 0
    assert np.all(batches.pi[on] >= batches.l_in[on]) and np.all(batches.out[on] > 0)
    for gpu, tp in GPUS:
        model = RooflineLatency(MODELS[model_name](), load_hardware(gpu), tp)
        assert rl.fits_the_program(model, BUDGET + WIDTH, int(batches.pi.max()))
        rc = rl.roofline_consts(model, BUDGET + WIDTH)
        sec = _decode_seconds(rc, batches.nn > 0, batches.pi)
        got = jax.device_get(sec)
        got_us = np.asarray(jax.jit(rl.seconds_to_us)(rc, sec))
        mismatches, empty = _mismatches(model, batches, got, got_us)
        assert not mismatches, (gpu, tp, mismatches[:5])
        assert empty > 0


def test_moe_weights_follow_the_token_count():
    """Row t holds W(t): MoE weights grow with t (more distinct experts hit), dense weights
    do not depend on t."""
    model = RooflineLatency(load_model_config("qwen/qwen3-30b-a3b"), load_hardware("H100"), 1)
    table = rl.token_table(model, 10)
    assert table.shape == (11, rl.TOKEN_COLUMNS)
    assert np.all(np.diff(table[1:, rl.WEIGHTS]) >= 0) and table[10, rl.WEIGHTS] > table[1,
                                                                                        rl.WEIGHTS]
    dense = RooflineLatency(load_model_config("meta-llama/llama-3.1-8b-instruct"),
                            load_hardware("H100"), 1)
    assert np.unique(rl.token_table(dense, 10)[:, rl.WEIGHTS]).size == 1


def test_roofline_and_physics_statics_run_in_the_program(tmp_path, monkeypatch):
    """Roofline and physics configurations compile without host callbacks: no latency object
    in the static, so the program cache keeps them; decode stretches are compiled in, with
    step times of their own (they grow with the contexts), and physics plans carry the
    preemption EMA; a model set on the host by hand has neither."""
    from blisjax.config import LatencyConfig, load_config, resolve_config
    from blisjax.engine import progcache
    from blisjax.latency.factory import make_latency_model
    from blisjax.workload import generate_workload, parse_workload_spec
    from tests.paths import REPO

    cfg = load_config(REPO / "configs" / "latency" / "sample-config.yaml")
    spec = parse_workload_spec({**cfg.workload, "num_requests": 5})
    workload = generate_workload(spec, seed=cfg.seed)
    monkeypatch.setattr(progcache, "_chosen", None)
    monkeypatch.setattr(progcache, "_chosen_set", False)
    progcache.use_program_cache(tmp_path)
    roof = build_static(resolve_config(dataclasses.replace(
        cfg, latency=LatencyConfig(model="roofline"))), workload, decode_stretches=True)
    assert roof.settings.latency_model == "roofline" and roof.features.latency is None
    assert progcache.cacheable(roof) and roof.stretches and roof.stretch_times_vary
    physics = build_static(resolve_config(cfg), workload, decode_stretches=True)
    assert physics.settings.latency_model == "physics" and physics.features.latency is None
    assert progcache.cacheable(physics) and physics.stretches and physics.stretch_ema_slots
    on_host = physics.replace(latency=make_latency_model(resolve_config(cfg)))
    assert not progcache.cacheable(on_host) and not on_host.stretches


def test_placeholder_has_the_same_structure():
    """Other latency models carry a one-row placeholder: the consts pytree has one shape."""
    model = RooflineLatency(load_model_config("meta-llama/llama-3.1-8b-instruct"),
                            load_hardware("H100"), 1)
    real = rl.roofline_consts(model, 8)
    placeholder = rl.roofline_consts(None, 8)
    assert jax.tree_util.tree_structure(real) == jax.tree_util.tree_structure(placeholder)
    assert placeholder.by_tokens.shape == (1, rl.TOKEN_COLUMNS)
    assert real.by_tokens.dtype == jnp.float64


def test_products_round_once_where_a_multiply_add_would_not():
    """mul_by_short(x, c) + z equals Python's fl(fl(x·c) + z) for 53-bit x and c of up to 26
    significant bits, in a program where XLA fuses the plain x*c + z into an FMA."""
    rng = np.random.default_rng(5)
    x = rng.random(20_000) * 2.0 ** rng.integers(0, 40, 20_000)
    c = np.ldexp(rng.integers(1, 2**26, 20_000).astype(np.float64), rng.integers(-30, 10, 20_000))
    z = rng.random(20_000) * 2.0 ** rng.integers(0, 60, 20_000)
    want = np.array([(float(a) * float(b)) + float(d) for a, b, d in zip(x, c, z, strict=True)])
    got = np.asarray(jax.jit(lambda x, c, z: rl.mul_by_short(x, c) + z)(x, c, z))
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    fused = np.asarray(jax.jit(lambda x, c, z: x * c + z)(x, c, z))
    assert not np.array_equal(fused.view(np.int64), want.view(np.int64))  # the hazard is real


def test_configurations_outside_the_program_go_to_the_host(monkeypatch):
    """``fits_the_program``: a model whose KV bytes per token and whose contexts both need
    more than 26 significant bits is evaluated on the host (``EngineStatic.features.latency``
    set)."""
    from blisjax.config import LatencyConfig, load_config, resolve_config
    from blisjax.engine import static
    from blisjax.workload import generate_workload, parse_workload_spec
    from tests.paths import REPO

    odd = RooflineLatency(_odd_model(), load_hardware("H100"), 1)
    assert rl.fits_the_program(odd, BUDGET, 2**24)
    assert not rl.fits_the_program(odd, BUDGET, 2**26)
    llama = RooflineLatency(load_model_config("meta-llama/llama-3.1-8b-instruct"),
                            load_hardware("H100"), 1)
    assert rl.fits_the_program(llama, BUDGET, 2**31 - 1)
    cfg = load_config(REPO / "configs" / "latency" / "sample-config.yaml")
    workload = generate_workload(parse_workload_spec({**cfg.workload, "num_requests": 5}),
                                 seed=cfg.seed)
    resolved = resolve_config(dataclasses.replace(cfg, latency=LatencyConfig(model="roofline")))
    monkeypatch.setattr(static, "roofline_fits_the_program", lambda *args: False)
    st = build_static(resolved, workload)
    assert isinstance(st.features.latency, RooflineLatency) and not st.stretches
