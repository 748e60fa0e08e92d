"""BLIS golden cases: `blisjax replay` with BLIS's exact flags reproduces BLIS.

Every completed request's ttft_us / e2e_us / input and output tokens must be identical to BLIS's
per-request output, and the aggregate metrics equal up to float round-off. Inputs and expected
values come from ``tests/data/blis-golden`` (BLIS commit 4e179804), not from this code.
"""

from __future__ import annotations

import json

import pytest

from tests.blis_replay import assert_matches_blis, replay
from tests.paths import GOLDEN_CASES, GOLDEN_DIR, golden_case

GOLDEN = GOLDEN_DIR
CASES = [golden_case(n) for n in GOLDEN_CASES]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden_case_reproduces_blis(path, tmp_path, capsys):
    case = json.loads(path.read_text())
    metrics, rows = replay(case["command"], GOLDEN, tmp_path, capsys)
    assert_matches_blis(case, metrics, rows)
    # BLIS's KV-cache summary line (printed when any rate is non-zero).
    for line in case["kv_cache_stdout"].splitlines():
        if line.startswith("Cache Hit Rate"):
            assert f"{metrics['cache_hit_rate']:.4f}" == line.split(": ")[1]
