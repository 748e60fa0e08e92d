"""`blisjax run|replay --trace-level …`, `blisjax plot`: outputs and input checks."""

from __future__ import annotations

import json

import pytest

from blisjax.cli import main
from blisjax.trace import of_kind, read_jsonl
from tests.search.conftest import TINY_CONFIG

RUN = ["run", "--config", str(TINY_CONFIG), "--quiet"]


def _cli(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_trace_out_writes_every_file(tmp_path, capsys):
    out = tmp_path / "trace"
    code, stdout, err = _cli([*RUN, "--trace-level", "decisions", "--counterfactual-k", "2",
                              "--summarize-trace", "--trace-out", out], capsys)
    assert code == 0, err
    metrics = json.loads(stdout)
    assert sorted(p.name for p in out.iterdir()) == ["summary.txt", "timeline.json",
                                                      "trace.jsonl"]
    lines = read_jsonl(out / "trace.jsonl")
    routing = of_kind(lines, "routing")
    assert metrics["trace_summary"]["total_decisions"] == len(of_kind(lines, "admission")) == 30
    assert sum(metrics["trace_summary"]["target_distribution"].values()) == len(routing)
    assert all(len(r["candidates"]) == 2 for r in routing)  # two instances, k = 2
    assert "=== Trace Summary ===\nTotal Decisions: 30\n" in err
    assert json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert (out / "summary.txt").read_text().startswith("# ")
    # `blisjax plot` on the directory: the per-instance plot beside the trace, and a timeline
    code, _, err = _cli(["plot", out, "--timeline-png", tmp_path / "tl.png", "--quiet"], capsys)
    assert code == 0, err
    for png in (out / "instances.png", tmp_path / "tl.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_untraced_run_has_no_trace_summary(capsys):
    code, stdout, _ = _cli(RUN, capsys)
    assert code == 0 and "trace_summary" not in json.loads(stdout)


@pytest.mark.parametrize("extra, message", [
    (["--trace-out", "{tmp}/t"], "--trace-out: needs --trace-level decisions or full"),
    (["--summary-strategy", "counterfactual"], "--summary-strategy: needs --trace-level"),
    (["--trace-level", "decisions", "--counterfactual-k", "-1"],
     "--counterfactual-k: must be >= 0, got -1"),
    (["--trace-level", "decisions", "--engine", "jax"],
     "--trace-level: traces are recorded by the reference engine"),
])
def test_trace_flag_errors(tmp_path, capsys, extra, message):
    argv = [*RUN, *(a.format(tmp=tmp_path) for a in extra)]
    code, stdout, err = _cli(argv, capsys)
    assert code == 2 and stdout == ""
    assert message in err, err
    assert not (tmp_path / "t").exists()


def test_blis_trace_flags_without_a_level_only_warn(capsys):
    code, stdout, err = _cli([*RUN, "--summarize-trace", "--counterfactual-k", "2"], capsys)
    assert code == 0 and "trace_summary" not in json.loads(stdout)
    assert "--summarize-trace without --trace-level" in err
    assert "--counterfactual-k without --trace-level" in err


def test_plot_errors(tmp_path, capsys):
    code, _, err = _cli(["plot", tmp_path], capsys)
    assert code == 2 and "TRACE: " in err
    (tmp_path / "trace.jsonl").write_text("")
    code, _, err = _cli(["plot", tmp_path, "--start-s", "1"], capsys)
    assert code == 2 and "--start-s: only used with --timeline-png" in err
    code, _, err = _cli(["plot", tmp_path, "--timeline-png", tmp_path / "t.png",
                         "--start-s", "2", "--end-s", "1"], capsys)
    assert code == 2 and "--end-s: must be after --start-s" in err
