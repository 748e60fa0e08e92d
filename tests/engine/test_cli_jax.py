"""`--engine jax` and `blisjax parity` from the command line."""

from __future__ import annotations

import json

from blisjax.cli import main

SMALL = ["--workload", "distribution", "--rate", "20", "--num-requests", "30", "--num-instances",
         "2", "--total-kv-blocks", "400", "--max-num-running-reqs", "16", "--prompt-tokens", "96",
         "--output-tokens", "24", "--routing-policy", "weighted", "--prefix-tokens", "32"]


def test_engine_jax_prints_the_same_metrics(capsys, tmp_path):
    assert main(["run", *SMALL, "--results-path", str(tmp_path / "ref.json")]) == 0
    ref = capsys.readouterr().out
    assert main(["run", *SMALL, "--engine", "jax", "--results-path", str(tmp_path / "jax.json")]) == 0
    assert capsys.readouterr().out == ref
    assert (tmp_path / "ref.json").read_bytes() == (tmp_path / "jax.json").read_bytes()


def test_parity_command_reports_identical(capsys):
    assert main(["parity", *SMALL]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"requests": 30, "result": "identical", "first_divergence": None}
