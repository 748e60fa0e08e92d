"""The command line as a user meets it: defaults, determinism, errors, atomic outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from blisjax.cli import main

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blisjax.cli", *args], capture_output=True,
                          text=True, cwd=REPO, check=False)


def test_default_run_and_byte_identical_repeat(tmp_path):
    # docs/semantics.md INV-6 / BC-9: same config and seed → byte-identical stdout and results file.
    a = _cli("run", "--results-path", str(tmp_path / "a.json"))
    b = _cli("run", "--results-path", str(tmp_path / "b.json"))
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    metrics = json.loads(a.stdout)
    assert metrics["completed_requests"] > 0 and metrics["instance_id"] == "cluster"
    rows = json.loads((tmp_path / "a.json").read_text())
    assert [r["request_id"] for r in rows] == sorted(r["request_id"] for r in rows)
    assert {"request_id", "status", "instance", "input_tokens", "output_tokens",
            "scheduling_delay_us", "preemptions"} <= set(rows[0])


def test_seed_changes_generated_workload():
    a = json.loads(_cli("run", "--seed", "1").stdout)
    b = json.loads(_cli("run", "--seed", "2").stdout)
    assert a["total_input_tokens"] != b["total_input_tokens"]


def test_distribution_workload_and_flags(capsys):
    assert main(["run", "--workload", "distribution", "--rate", "5", "--num-requests", "40",
                 "--num-instances", "2", "--routing-policy", "least-loaded",
                 "--max-num-seqs", "8", "--seed", "7"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed_requests"] == 40


def test_bad_flag_value_names_the_field_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "results.json"
    code = main(["run", "--max-num-running-reqs", "0", "--results-path", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "max_num_running_reqs" in err and ">= 1" in err
    assert not out.exists()


def test_bad_scorer_spec_is_rejected(capsys):
    code = main(["run", "--routing-policy", "weighted", "--routing-scorers", "queue-depth:x"])
    assert code == 2 and "--routing-scorers" in capsys.readouterr().err


def test_trace_round_trip_through_cli(tmp_path, capsys):
    header, data = tmp_path / "h.yaml", tmp_path / "d.csv"
    assert main(["trace", "--workload", "distribution", "--rate", "4", "--num-requests", "30",
                 "--out-header", str(header), "--out-data", str(data)]) == 0
    assert main(["run", "--workload", "distribution", "--rate", "4", "--num-requests", "30"]) == 0
    generated = json.loads(capsys.readouterr().out)
    assert main(["replay", "--trace-header", str(header), "--trace-data", str(data)]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed == generated


def test_blis_quirks_switch_reaches_both_engines(tmp_path):
    """``--blis-quirks`` sets ``compat.blis_quirks``; the reference simulator and the JAX
    engine's static configuration carry it (the features it switches read it there)."""
    import argparse

    from blisjax.config import SimConfig, resolve_config
    from blisjax.config.flags import add_blis_flags, apply_blis_flags
    from blisjax.engine.static import build_static
    from blisjax.reference import ClusterSimulator
    from tests.reference.conftest import make_workload

    parser = argparse.ArgumentParser()
    add_blis_flags(parser)
    cfg = apply_blis_flags(SimConfig(), parser.parse_args(["--blis-quirks"]))
    assert cfg.compat.blis_quirks
    assert not apply_blis_flags(SimConfig(), parser.parse_args([])).compat.blis_quirks
    resolved = resolve_config(cfg)
    w = make_workload([dict(arrival=0, input=40, output=4)])
    assert ClusterSimulator(resolved, w).blis_quirks
    assert build_static(resolved, w).settings.blis_quirks
