"""BLIS golden cases: `blisjax replay` with BLIS's exact flags reproduces BLIS.

Every completed request's ttft_us / e2e_us / input and output tokens must be identical to BLIS's
per-request output, and the aggregate metrics equal up to float round-off. Inputs and expected
values come from ``tests/data/blis-golden`` (BLIS commit 4e179804), not from this code.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from blisjax.cli import main
from tests.paths import GOLDEN_CASES, GOLDEN_DIR, golden_case

GOLDEN = GOLDEN_DIR
CASES = [golden_case(n) for n in GOLDEN_CASES]


def _replay(case: dict, tmp_path: Path, capsys) -> tuple[dict, list[dict]]:
    argv = shlex.split(case["command"])[1:]  # drop the program name "blis"
    i = argv.index("--results-path")
    argv[i + 1] = str(tmp_path / "results.json")
    argv = [str(GOLDEN / a) if a.endswith((".yaml", ".csv")) else a for a in argv]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    rows = json.loads((tmp_path / "results.json").read_text())
    return metrics, rows


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden_case_reproduces_blis(path, tmp_path, capsys):
    case = json.loads(path.read_text())
    metrics, rows = _replay(case, tmp_path, capsys)
    by_id = {r["request_id"]: r for r in rows}
    assert len(by_id) == len(case["results"])
    for want in case["results"]:
        got = by_id[want["request_id"]]
        assert got["status"] == "completed"
        for key in ("ttft_us", "e2e_us", "input_tokens", "output_tokens"):
            assert got[key] == want[key], (want["request_id"], key)
    for key, want in case["metrics"].items():
        got = metrics[key]
        if isinstance(want, str):
            assert got == want
        else:
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (key, got, want)
    # BLIS's KV-cache summary line (printed when any rate is non-zero).
    for line in case["kv_cache_stdout"].splitlines():
        if line.startswith("Cache Hit Rate"):
            assert f"{metrics['cache_hit_rate']:.4f}" == line.split(": ")[1]
