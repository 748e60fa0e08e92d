"""The programs' arithmetic: the JAX engine's interpreter gives the reference evaluator's
values bit for bit, on random programs over values at the edges of float64, and ``log1p``
is accurate (docs/policy-programs.md, Arithmetic)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine import program as jax_program
from blisjax.engine.lockstep import LANES
from blisjax.program import OBSERVABLES, compile_program
from blisjax.reference import program as ref_program
from tests.program.random_programs import CONSTANTS, random_program

N = 5  # items a program is evaluated for at once (candidate instances)
EDGE_VALUES = CONSTANTS + (-1.0, -0.999999, -1.5, 1e-17, -1e-17, 7.0, 1e16, -3e305, 2.2e-308)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float64).view(np.int64)


@pytest.fixture(scope="module")
def interpreter():
    run = jax.vmap(jax_program.run, axis_name=LANES)
    return jax.jit(run)


def _values(rng, count):
    """``count`` × [K, N] observable values: half at the edges, half ordinary."""
    edge = rng.choice(np.asarray(EDGE_VALUES), size=(count, len(OBSERVABLES), N))
    plain = rng.normal(0.0, 10.0, size=(count, len(OBSERVABLES), N))
    return np.where(rng.random(size=edge.shape) < 0.5, edge, plain)


@pytest.mark.parametrize("site", ["routing", "admission", "priority"])
def test_random_programs_agree_bit_for_bit(interpreter, site):
    rng = np.random.default_rng({"routing": 1, "admission": 2, "priority": 3}[site])
    batch = 256
    programs = [compile_program(site, node=random_program(rng, site, depth=6))
                for _ in range(batch)]
    codes = [p.bytecode() for p in programs]
    code = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *codes)
    values = _values(rng, batch)
    got = np.asarray(interpreter(code, jnp.asarray(values)))
    for k, p in enumerate(programs):
        for j in range(N):
            seen = {o.name: float(values[k, i, j]) for i, o in enumerate(OBSERVABLES)}
            want = ref_program.run(p, seen)
            assert _bits(got[k, j]) == _bits(want), (p.text, j, got[k, j], want)
            assert math.isfinite(want)


def test_hand_computed_edges(interpreter):
    cases = {  # program: value (every observable is 2.0)
        "queue_depth / 0": 0.0,
        "1.7976931348623157e308 * queue_depth": 1.7976931348623157e308,
        "-1.7976931348623157e308 - 1.7976931348623157e308": -1.7976931348623157e308,
        "1e308 / 1e-10": 1.7976931348623157e308,
        "log1p(-1)": -1.7976931348623157e308,
        "log1p(-5)": -1.7976931348623157e308,
        "log1p(0)": 0.0,
        "log1p(1e-20)": 1e-20,
        "(queue_depth > 1) + (queue_depth >= 3) + (queue_depth != 2)": 1.0,
        "(0.5 and -3) + (0 or 0) + (not 0) + (not 7)": 2.0,
        "clip(queue_depth, 3, 1)": 1.0,  # lo > hi: hi
        "min(queue_depth, 1, 5)": 1.0,
        "3 if 0 else 4": 4.0,
        "abs(-queue_depth)": 2.0,
    }
    programs = [compile_program("routing", program=t) for t in cases]
    code = jax.tree_util.tree_map(lambda *xs: np.stack(xs),
                                  *[p.bytecode() for p in programs])
    values = np.full((len(programs), len(OBSERVABLES), N), 2.0)
    got = np.asarray(interpreter(code, jnp.asarray(values)))
    for k, (p, want) in enumerate(zip(programs, cases.values(), strict=True)):
        ref = ref_program.run(p, {o.name: 2.0 for o in OBSERVABLES})
        assert ref == want and got[k, 0] == want, (p.text, ref, got[k, 0])


def test_log1p_is_within_a_few_ulp_and_identical_in_both_engines():
    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.uniform(-1, 1, 3000), np.exp(rng.uniform(-700, 700, 3000)),
                         -np.exp(rng.uniform(-700, -1e-9, 2000)),
                         np.asarray([1e-300, 5e-324, -0.5, 1.0, 1e308, 2.0**-52, -1 + 2.0**-53])])
    got = np.asarray(jax.jit(jax_program.log1p)(jnp.asarray(xs)))
    for x, g in zip(xs.tolist(), got.tolist(), strict=True):
        want = ref_program.log1p(x)
        assert _bits(g) == _bits(want), x
        exact = math.log1p(x)
        assert abs(want - exact) <= 4 * math.ulp(exact) + 1e-300, (x, want, exact)
