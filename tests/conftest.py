"""Guard for JAX's compiled programs across a test run.

Engine runs already guard themselves (``blisjax.engine.run.mapping_headroom_guard``: each
program XLA:CPU compiles keeps ~2,000–3,000 memory mappings, and past ``vm.max_map_count``
XLA aborts the process). Tests also compile programs outside engine runs (metrics, search
helpers), so the same guard runs after every test; tests of a module often share programs,
and the caches are dropped only when the mappings pile up.
"""

from __future__ import annotations

import os
import signal
import sys

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
