"""Which runs are compiled as short runs (``run.short_run``, docs/jax-engine.md): every device a
CPU and lanes × requests at most ``run.SHORT_RUN_REQUEST_LANES``."""

from __future__ import annotations

from types import SimpleNamespace

from blisjax.engine import run
from tests.engine.static_like import static_like

CPU, GPU = SimpleNamespace(platform="cpu"), SimpleNamespace(platform="gpu")


def test_lanes_times_requests_up_to_the_bound_is_a_short_run():
    bound = run.SHORT_RUN_REQUEST_LANES
    assert bound == 20_000
    st = static_like(num_requests=1_000)
    assert run.short_run(st, 20, (CPU,))
    assert not run.short_run(st, 21, (CPU,))
    assert run.short_run(static_like(num_requests=bound), 1, (CPU, CPU))
    assert not run.short_run(static_like(num_requests=bound + 1), 1, (CPU,))


def test_a_run_on_an_accelerator_is_never_a_short_run():
    st = static_like(num_requests=1)
    assert not run.short_run(st, 1, (GPU,))
    assert not run.short_run(st, 1, (CPU, GPU))

