"""The operation counts of ``benchmarks/program_size.py``: each lowered operation is attributed
to every blisjax function on its source stack, once per time that function was traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.engine import vec
from tests.paths import benchmark_script


def _tool():
    return benchmark_script("program_size")


def _counts(fn):
    text = jax.jit(fn).lower(jnp.arange(16, dtype=jnp.int32)).as_text(debug_info=True)
    return _tool().count_by_function(text)


def test_a_function_traced_twice_counts_twice_and_other_code_not_at_all():
    total_once, once = _counts(lambda x: vec.prefix_sum(x))
    total_twice, twice = _counts(lambda x: vec.prefix_sum(x) + vec.prefix_sum(x * 3))
    key = "engine/vec.py:prefix_sum"
    assert once[key] > 0
    assert twice[key] == 2 * once[key]
    assert set(twice) == {key}  # the test's own multiply and add belong to no blisjax function
    assert total_twice >= 2 * once[key] + 2  # ... but are counted in the total
    assert total_once >= once[key]
