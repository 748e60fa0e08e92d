"""``benchmarks/gpu_check.py`` on a CPU: its smallest form runs, compares lanes of distinct
policies with independent reference runs, and reports what a device run must show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_small_check_compares_every_lane_with_the_reference(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--small",
                           "--stages", "roofline", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    by_stage = {r["stage"]: r for r in rows}
    assert by_stage["environment"]["backend"] == "cpu"
    line = by_stage["roofline"]
    assert (line["model"], line["lanes"], line["requests"], line["instances"]) == \
        ("roofline", 4, 40, 2)
    # each lane (a policy of its own) equals its own reference run
    assert line["parity_lanes"] == 4
    assert line["parity_identical"] == 4, line["parity_first_divergences"]
    assert line["compile_s"] > 0 and len(line["calls_s"]) == 2
    assert "end" in by_stage
    # the Markdown table closes the printed output
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| roofline | roofline | 40 | 4 |")
