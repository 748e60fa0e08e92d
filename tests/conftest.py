"""Test-session guard for JAX's compiled programs.

Each JAX engine program XLA:CPU compiles adds ~2,000–3,000 memory mappings to the process
(measured: 445 → 2,281 → 5,319 after two edge-case programs, 534 after ``jax.clear_caches()``).
Linux refuses new mappings past ``vm.max_map_count`` (65,530 by default), and XLA then aborts
the whole process inside compilation — which the slow tier hit at its ~25th program. Tests in a
module often share programs, so the caches are dropped only when the mappings pile up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_MAPS = Path("/proc/self/maps")
_MAX_MAPPINGS = 30_000  # about half of Linux's default limit


def _mappings() -> int:
    with _MAPS.open() as f:
        return sum(1 for _ in f)


@pytest.fixture(autouse=True)
def _drop_compiled_programs_when_mappings_pile_up():
    yield
    if "jax" in sys.modules and _MAPS.exists() and _mappings() > _MAX_MAPPINGS:
        sys.modules["jax"].clear_caches()
