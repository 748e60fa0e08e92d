"""`--engine jax` and `blisjax parity` from the command line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from blisjax.cli import main
from blisjax.workload import write_trace
from tests.reference.conftest import make_workload

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


# ---- capacities -------------------------------------------------------------------------------

FLAGS = ("--queue-slots", "--pending-slots", "--deadline-window", "--max-blocks-per-request",
         "--offchain-generations", "--kv-hold-slots", "--pd-transfer-slots", "--pd-reserve-slots",
         "--max-events")


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5"])
def test_capacity_flags_refuse_values_below_one(flag, bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *SMALL, "--engine", "jax", flag, bad])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be an integer >= 1, got {bad!r}" in capsys.readouterr().err


@pytest.mark.parametrize("flag", FLAGS)
def test_capacity_flags_belong_to_the_jax_engine(flag, capsys):
    assert main(["run", *SMALL, flag, "4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{flag}: is a JAX engine capacity: only used with --engine jax" in err


@pytest.mark.parametrize(("capacity", "flag", "holds", "args", "size"), [
    ("queue", "--queue-slots", "wait-queue slots per instance", [], 30),  # default: N
    ("queue", "--queue-slots", "wait-queue slots per instance", ["--queue-slots", "5"], 5),
    ("pending", "--pending-slots", "requests between routing and enqueue",
     ["--pending-slots", "2"], 2),
    ("deadline", "--deadline-window", "requests sharing one deadline microsecond", [], 8),
    ("blocks", "--max-blocks-per-request", "KV blocks one request can hold",
     ["--max-blocks-per-request", "3"], 3),
    ("events", "--max-events", "events one simulation handles", ["--max-events", "50"], 50),
])
def test_an_overflowed_run_prints_no_numbers_and_names_the_flag(
        capacity, flag, holds, args, size, monkeypatch, tmp_path, capsys):
    # The engine's answer is replaced by one that reports the overflow (no compile here;
    # tests/engine/test_capacities.py drives the engine into each capacity).
    import blisjax.engine
    from blisjax.reference import simulate as reference

    seen = {}

    def overflowed(resolved, workload, phase=None, **capacities):  # phase: progress lines
        seen.update(capacities)
        return dataclasses.replace(reference(resolved, workload), overflow={capacity: 3})

    monkeypatch.setattr(blisjax.engine, "simulate", overflowed)
    metrics, results = tmp_path / "m.json", tmp_path / "r.json"
    assert main(["run", *SMALL, "--engine", "jax", *args, "--metrics-path", str(metrics),
                 "--results-path", str(results)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not metrics.exists() and not results.exists()
    assert "numbers are not valid" in err
    assert f"{holds}" in err and f"{size} exceeded 3 time(s); raise it with {flag} (> {size})" \
        in err
    assert seen == ({} if not args else {flag[2:].replace("-", "_"): int(args[1])})


def _shared_deadline_replay(tmp_path, count: int) -> list[str]:
    """`replay` of ``count`` requests 1 ms apart that share the deadline 3 s."""
    rows = [dict(arrival=1000 * k, input=32, output=4, deadline=3_000_000) for k in range(count)]
    header, data = tmp_path / "h.yaml", tmp_path / "d.csv"
    write_trace(make_workload(rows), header, data)
    return ["--trace-header", str(header), "--trace-data", str(data), "--model",
            "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1",
            "--total-kv-blocks", "64", "--max-num-running-reqs", "4"]


@pytest.mark.slow  # two compiles; the default tier checks the refusal without compiling
def test_deadline_window_overflow_is_refused_until_the_flag_raises_it(tmp_path, capsys):
    # Nine requests share one deadline microsecond; the default window orders eight.
    trace = _shared_deadline_replay(tmp_path, 9)
    assert main(["replay", *trace, "--engine", "jax"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "requests sharing one deadline microsecond: 8 exceeded" in err
    assert "raise it with --deadline-window (> 8)" in err
    assert main(["parity", *trace]) == 2  # parity refuses an overflowed JAX run the same way
    assert "raise it with --deadline-window (> 8)" in capsys.readouterr().err
    assert main(["replay", *trace]) == 0
    want = capsys.readouterr().out
    assert main(["replay", *trace, "--engine", "jax", "--deadline-window", "9"]) == 0
    assert capsys.readouterr().out == want
    assert main(["parity", *trace, "--deadline-window", "9"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == "identical"


def test_the_event_bound_reported_is_the_runs_own():
    # no --max-events: the bound is the workload's, 64 × (tokens + 8 × requests + 64) plus
    # the horizon in µs (here none): 64 × (2 × (10 + 3) + 16 + 64) = 6,784
    from blisjax.cli.simulate import _derived_capacity
    from blisjax.engine.static import build_static
    from tests.reference.conftest import make_resolved

    w = make_workload([dict(arrival=0, input=10, output=3), dict(arrival=5, input=10, output=3)])
    static = build_static(make_resolved(), w)
    none = 2**63 - 1
    assert static.shapes.max_events == 0 and _derived_capacity("events", static, w, none) \
        == 6_784
    assert _derived_capacity("events", static, w, 1_000) == 6_784 + 1_000
    assert _derived_capacity("queue", static, w, none) == 0
