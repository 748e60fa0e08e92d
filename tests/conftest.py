"""Guard for JAX's compiled programs across a test run.

Engine runs already guard themselves (``blisjax.engine.run.mapping_headroom_guard``: each
program XLA:CPU compiles keeps ~2,000–3,000 memory mappings, and past ``vm.max_map_count``
XLA aborts the process). Tests also compile programs outside engine runs (metrics, search
helpers), so the same guard runs after every test; tests of a module often share programs,
and the caches are dropped only when the mappings pile up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

#: SIGINT's handler when the tests start: a test (or a library it runs, e.g. Ray or OpenEvolve)
#: that changes it is undone after the test, so later tests' subprocesses do not inherit an
#: ignored Ctrl-C.
_SIGINT_AT_START = signal.getsignal(signal.SIGINT)

# Tests call the `blisjax` command in-process and in subprocesses; keep them from writing
# compiled programs into the user's cache directory (the command's default).
os.environ.setdefault("BLISJAX_COMPILE_CACHE", "0")


@pytest.fixture(autouse=True)
def _drop_compiled_programs_when_mappings_pile_up():
    yield
    if "blisjax.engine.run" in sys.modules:
        sys.modules["blisjax.engine.run"].mapping_headroom_guard()


@pytest.fixture(autouse=True)
def _restore_sigint():
    yield
    if signal.getsignal(signal.SIGINT) is not _SIGINT_AT_START:
        signal.signal(signal.SIGINT, _SIGINT_AT_START)


#: ``BLISJAX_TEST_PROGRAM_LOG=path``: each engine program a test compiles is appended to
#: ``path`` as one JSON line (test id, the program's key as the program cache computes it,
#: seconds of the call that compiled it, the lane count), to find the programs tests could
#: share (docs/performance.md, Test tiers).
_PROGRAM_LOG = os.environ.get("BLISJAX_TEST_PROGRAM_LOG", "").strip()


class _WrappedProgram:
    """``run._run_sharded`` with its calls and lowerings passed through ``wrap(jitted,
    method, args)``; its other attributes are the program's."""

    def __init__(self, jitted, wrap):
        self._jitted, self._wrap = jitted, wrap

    def __call__(self, *args):
        return self._wrap(self._jitted, self._jitted, args)

    def lower(self, *args):
        return self._wrap(self._jitted, self._jitted.lower, args)

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def _wrapping_the_program(wrap):
    """Install ``_WrappedProgram(run._run_sharded, wrap)`` for one test (a generator for a
    fixture's body)."""
    from blisjax.engine import run

    jitted = run._run_sharded
    run._run_sharded = _WrappedProgram(jitted, wrap)
    try:
        yield
    finally:
        run._run_sharded = jitted


@pytest.fixture(autouse=True)
def _log_compiled_programs(request):
    if not _PROGRAM_LOG:
        yield
        return
    from blisjax.engine import progcache

    def logged(jitted, method, args):
        if method is not jitted:  # a lowering compiles nothing by itself
            return method(*args)
        st, consts, params, devices, lane_block = args
        before = jitted._cache_size()
        start = time.perf_counter()
        out = method(*args)
        if jitted._cache_size() > before:
            key = progcache.program_key(st, (consts, params), tuple(devices), lane_block)
            lanes = int(jax_leaves(params)[0].shape[0]) if jax_leaves(params) else 0
            with open(_PROGRAM_LOG, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, "key": key[:16],
                                    "seconds": round(time.perf_counter() - start, 2),
                                    "lanes": lanes}) + "\n")
        return out

    yield from _wrapping_the_program(logged)


#: ``BLISJAX_TEST_PROGRAM_SURVEY=path``: each engine program a test would compile is appended to
#: ``path`` as one JSON line (test id, the program's key, the ``EngineStatic``'s fields, lanes
#: and lane block) and the test stops there with ``ProgramSurveyed`` instead of compiling it:
#: the tier then runs in a fraction of its time, its engine tests failing, and
#: ``benchmarks/tier_programs.py path`` lists the distinct programs per test file and what
#: tells them apart (docs/performance.md, Test tiers). A test's programs after its first are
#: not reached.
_PROGRAM_SURVEY = os.environ.get("BLISJAX_TEST_PROGRAM_SURVEY", "").strip()


class ProgramSurveyed(Exception):
    """Raised instead of compiling an engine program in a survey run."""


@pytest.fixture(autouse=True)
def _survey_programs(request):
    if not _PROGRAM_SURVEY:
        yield
        return

    from blisjax.engine import progcache

    def surveyed(jitted, method, args):
        st, consts, params, devices, lane_block = args
        key = progcache.program_key(st, (consts, params), tuple(devices), lane_block)
        with open(_PROGRAM_SURVEY, "a") as f:
            f.write(json.dumps({
                "test": request.node.nodeid, "key": key[:16],
                "static": {name: repr(value) for name, value in st.fields().items()},
                "lanes": int(jax_leaves(params)[0].shape[0]), "lane_block": lane_block}) + "\n")
        raise ProgramSurveyed(request.node.nodeid)

    yield from _wrapping_the_program(surveyed)


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)
