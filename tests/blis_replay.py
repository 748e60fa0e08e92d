"""Replaying a BLIS run with BLIS's own command line, and comparing with what BLIS wrote."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from blisjax.cli import main

#: Per-request fields BLIS's results file shares with blisjax's, compared exactly.
REQUEST_FIELDS = ("ttft_us", "e2e_us", "input_tokens", "output_tokens")


def replay(command: str, data_dir: Path, tmp_path: Path, capsys,
           extra: tuple[str, ...] = ()) -> tuple[dict, dict[int, dict]]:
    """Run ``command`` (a ``blis replay …`` line whose trace files are in ``data_dir``) through
    ``blisjax``; returns the printed metrics and the per-request rows by request id."""
    argv = shlex.split(command)[1:]  # drop the program name "blis"
    i = argv.index("--results-path")
    argv[i + 1] = str(tmp_path / "results.json")
    argv = [str(data_dir / a) if a.endswith((".yaml", ".csv")) else a for a in argv]
    assert main([*argv, *extra]) == 0
    metrics = json.loads(capsys.readouterr().out)
    rows = json.loads((tmp_path / "results.json").read_text())
    by_id = {r["request_id"]: r for r in rows}
    assert len(by_id) == len(rows)
    return metrics, by_id


def assert_matches_blis(case: dict, metrics: dict, rows: dict[int, dict]) -> None:
    """Every request BLIS completed completed here with BLIS's values, and BLIS's numeric
    aggregate metrics agree up to float round-off (string ones exactly)."""
    assert len(rows) == len(case["results"])
    for want in case["results"]:
        got = rows[want["request_id"]]
        assert got["status"] == "completed"
        for key in REQUEST_FIELDS:
            assert got[key] == want[key], (want["request_id"], key)
    for key, want in case["metrics"].items():
        got = metrics[key]
        if isinstance(want, str):
            assert got == want, key
        else:
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (key, got, want)
