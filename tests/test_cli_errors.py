"""The command line's promises to a new user (reference engine only, so every test is cheap).

Flags with no effect in the given combination are errors saying what makes them count; one
base-configuration rule for every command (trace → replay reproduces run); output paths are
checked before simulating; help describes every argument; errors name the flag and the file;
degenerate runs warn; Ctrl-C exits 130 with one line; the progress line shows on a terminal only.
Expected messages and statuses come from issue 31's requirements and docs/configuration.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blisjax.cli import DISTRIBUTION_FLAGS, build_parser, main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SMALL = ["--workload", "distribution", "--rate", "5", "--num-requests", "20"]


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_refused(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, err
    assert out == ""
    first = err.strip().splitlines()[-1]
    assert first.startswith("blisjax: error: "), err
    for needle in needles:
        assert needle in first, (needle, err)


# ---- item 2: flags without effect ---------------------------------------------------------------


@pytest.mark.parametrize("flag", [f for f in DISTRIBUTION_FLAGS], ids=lambda f: f.flag)
@pytest.mark.parametrize("command", ["run", "trace", "parity"])
def test_distribution_flags_need_workload_distribution(capsys, tmp_path, command, flag):
    extra = ["--out-header", tmp_path / "h.yaml", "--out-data", tmp_path / "d.csv"] \
        if command == "trace" else []
    code, out, err = _main(capsys, command, flag.flag, "5", *extra)
    _assert_refused(code, out, err, f"{flag.flag}: only used with --workload distribution")
    assert not list(tmp_path.iterdir())


def test_issue_examples_of_ignored_flags_are_refused(capsys):
    _assert_refused(*_main(capsys, "run", "--num-requests", "10"), "--num-requests")
    _assert_refused(*_main(capsys, "run", "--rate", "5", "--num-requests", "50",
                           "--prompt-tokens", "100"), "--rate: only used with --workload")


@pytest.mark.parametrize("argv, needle", [
    (["run", "--workload-spec", EXAMPLES / "workload.yaml", *SMALL],
     "--workload: cannot be combined with --workload-spec"),
    (["parity", "--trace-header", EXAMPLES / "trace-header.yaml", "--trace-data",
      EXAMPLES / "trace.csv", "--workload-spec", EXAMPLES / "workload.yaml"],
     "--workload-spec: cannot be combined with --trace-header/--trace-data"),
    (["parity", "--trace-header", EXAMPLES / "trace-header.yaml"],
     "--trace-data: is required with --trace-header"),
    (["run", "--token-bucket-capacity", "5"],
     "--token-bucket-capacity: only used with --admission-policy token-bucket"),
    (["run", "--routing-policy", "least-loaded", "--routing-scorers", "queue-depth:1"],
     "--routing-scorers: only used with --routing-policy weighted"),
    (["run", "--routing-program=-in_flight"],
     "--routing-program: only used with --routing-policy program"),
    (["run", "--priority-policy", "slo-based", "--priority-program", "age_ms"],
     "--priority-program: only used with --priority-policy program"),
    (["run", "--routing-policy", "program"],
     "--routing-program: policy.routing.program: policy 'program' needs a program"),
    (["run", "--admission-policy", "program", "--admission-program", "queue_depth < 3"],
     "--admission-program: policy.admission.program: 'queue_depth' cannot be read by the "
     "admission program"),
    (["run", "--queue-slots", "8"], "--queue-slots: is a JAX engine capacity"),
    (["run", "--allow-placeholder-coefficients"],
     "--allow-placeholder-coefficients: only used with --latency-model physics"),
    (["fit-latency", "--export-from-config", REPO / "configs/latency/sample-config.yaml",
      "--out-steps", "s.csv", "--out-journeys", "j.csv", "--folds", "3"],
     "--folds: cannot be combined with --export-from-config"),
    (["fit-latency", "--steps", REPO / "configs/latency/sample-steps.csv", "--journeys",
      REPO / "configs/latency/sample-journeys.csv", "--out-steps", "s.csv"],
     "--out-steps: is only used with --export-from-config"),
])
def test_combinations_without_effect_are_refused(capsys, argv, needle):
    _assert_refused(*_main(capsys, *argv), needle)


# ---- item 3: one base configuration --------------------------------------------------------------


def test_trace_then_replay_reproduces_run_of_the_default_experiment(capsys, tmp_path):
    # The same configuration and the same requests give the same simulation (docs/semantics.md
    # INV-6), so the metrics must be equal to the last digit.
    header, data = tmp_path / "h.yaml", tmp_path / "d.csv"
    code, _, err = _main(capsys, "trace", "--out-header", header, "--out-data", data)
    assert code == 0, err
    assert "base configuration: the shipped default experiment" in err
    code, run_out, _ = _main(capsys, "run")
    assert code == 0
    code, replay_out, err = _main(capsys, "replay", "--trace-header", header, "--trace-data", data)
    assert code == 0, err
    assert replay_out == run_out
    assert "base configuration: the shipped default experiment" in err
    assert json.loads(run_out)["completed_requests"] == 1000  # the default experiment's workload


def test_workload_flags_keep_the_default_experiments_cluster(capsys, tmp_path):
    results = tmp_path / "r.json"
    code, _, err = _main(capsys, "run", *SMALL, "--results-path", results)
    assert code == 0, err
    assert "workload: --workload distribution" in err
    instances = {row["instance"] for row in json.loads(results.read_text())}
    assert len(instances) > 1  # configs/default.yaml has 4 instances; bare defaults have 1


def test_every_simulating_command_states_the_base_rule_in_help():
    parser = build_parser()
    for name in ("run", "replay", "parity", "trace"):
        text = " ".join(_subparsers(parser)[name].format_help().split())
        assert "Base configuration:" in text and "shipped default experiment" in text, name


def test_quiet_silences_the_logs_but_not_warnings(capsys):
    code, _, err = _main(capsys, "run", "--quiet", *SMALL, "--total-kv-blocks", "2")
    assert code == 0
    assert "base configuration" not in err and "s wall" not in err
    assert "warning:" in err


# ---- item 4: output paths -------------------------------------------------------------------------


def _output_cases(tmp_path: Path) -> list[tuple[list, str]]:
    blocked = tmp_path / "a-file"  # a directory cannot be created where a file is
    blocked.write_text("x")
    missing = blocked / "dir" / "r.json"
    folder = tmp_path / "folder"
    folder.mkdir()
    steps = REPO / "configs/latency/sample-steps.csv"
    journeys = REPO / "configs/latency/sample-journeys.csv"
    return [
        (["run", "--results-path", missing], "--results-path"),
        (["run", "--metrics-path", folder], "--metrics-path"),
        (["replay", "--trace-header", EXAMPLES / "trace-header.yaml", "--trace-data",
          EXAMPLES / "trace.csv", "--results-path", missing], "--results-path"),
        (["trace", "--out-header", missing, "--out-data", tmp_path / "d.csv"], "--out-header"),
        (["trace", "--out-header", tmp_path / "h.yaml", "--out-data", folder], "--out-data"),
        (["fit-latency", "--steps", steps, "--journeys", journeys, "--out", missing], "--out"),
        (["fit-latency", "--steps", steps, "--journeys", journeys, "--report", folder],
         "--report"),
        (["fit-latency", "--export-from-config", REPO / "configs/latency/sample-config.yaml",
          "--out-steps", missing, "--out-journeys", tmp_path / "j.csv"], "--out-steps"),
    ]


def test_output_paths_are_checked_before_simulating(capsys, tmp_path):
    for argv, flag in _output_cases(tmp_path):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        code, out, err = _main(capsys, *argv)
        path = str(argv[argv.index(flag) + 1])
        _assert_refused(code, out, err, f"{flag}: ", path)
        assert "base configuration" not in err  # refused before any work
        assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_results_directory_that_is_a_file_is_refused(capsys, tmp_path, command):
    target = tmp_path / "taken"
    target.write_text("x")
    argv = [command, REPO / "configs/search/prefix-affinity.yaml", "--out", target]
    argv += (["--grid", "routing.scorers.load-balance=1,2"] if command == "sweep" else
             ["--space", REPO / "configs/search/prefix-affinity-space.yaml", "--strategy",
              "random", "--population", "4", "--generations", "1"])
    _assert_refused(*_main(capsys, *argv), "--out: ", str(target), "not a directory")


# ---- item 8: help and error messages --------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_argument_of_every_command_has_help():
    parser = build_parser()
    for name, sub in {"blisjax": parser, **_subparsers(parser)}.items():
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help.strip(), (name, action.option_strings or
                                                         action.dest)


def test_parity_offers_only_flags_it_uses():
    options = {o for a in _subparsers(build_parser())["parity"]._actions for o in a.option_strings}
    assert not {"--engine", "--results-path", "--metrics-path"} & options
    assert {"--trace-header", "--workload-spec", "--config", "--queue-slots"} <= options


def test_policy_flags_list_their_choices():
    helps = {o: a.help for a in _subparsers(build_parser())["run"]._actions
             for o in a.option_strings}
    assert "round-robin | least-loaded | always-busiest | weighted" in helps["--routing-policy"]
    assert "fcfs | priority-fcfs | sjf" in helps["--scheduler"]
    assert "blackbox | roofline | physics" in helps["--latency-model"]
    assert "inverted-slo" in helps["--priority-policy"]


@pytest.mark.parametrize("argv", [
    ["--cpu-devices", "2", "--quiet", "run"],
    ["run", "--cpu-devices", "2", "--quiet"],
    ["--cpu-devices", "2", "run", "--quiet"],
])
def test_global_options_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert args.cpu_devices == 2 and args.quiet is True


def test_global_options_default_when_absent():
    args = build_parser().parse_args(["run"])
    assert args.cpu_devices is None and args.quiet is False and args.no_compile_cache is False


def test_unknown_keys_have_one_format_and_workload_errors_their_prefix(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("bogus: 1\n")
    spec = tmp_path / "w.yaml"
    spec.write_text('version: "2"\naggregate_rate: 5\nnum_requests: 3\nbogus: 1\nclients: []\n')
    in_config = tmp_path / "cw.yaml"
    in_config.write_text('workload:\n  version: "2"\n  bogus: 1\n')
    _assert_refused(*_main(capsys, "run", "--config", config),
                    f"--config: {config}: bogus: unknown key; allowed keys: ")
    _assert_refused(*_main(capsys, "run", "--workload-spec", spec),
                    f"--workload-spec: {spec}: workload.bogus: unknown key; allowed keys: ")
    _assert_refused(*_main(capsys, "run", "--config", in_config),
                    f"--config: {in_config}: workload.bogus: unknown key; allowed keys: ")


@pytest.mark.parametrize("argv, needle", [
    (["--rate", "-5"], "--rate: must be > 0"),
    (["--num-requests", "0"], "--num-requests: "),
    (["--prompt-tokens-min", "-3"], "--prompt-tokens-min: must be >= 0"),
])
def test_distribution_values_are_reported_against_their_flag(capsys, argv, needle):
    base = ["run", "--workload", "distribution", "--rate", "5", "--num-requests", "10"]
    _assert_refused(*_main(capsys, *base, *argv), needle)


@pytest.mark.parametrize("flag", ["--config", "--workload-spec", "--policy-config",
                                  "--trace-header"])
def test_missing_and_undecodable_files_name_the_flag_and_the_file(capsys, tmp_path, flag):
    trace = ["--trace-data", EXAMPLES / "trace.csv"] if flag == "--trace-header" else []
    command = "replay" if flag == "--trace-header" else "run"
    missing = tmp_path / "missing.yaml"
    _assert_refused(*_main(capsys, command, flag, missing, *trace), f"{flag}: ", str(missing))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    _assert_refused(*_main(capsys, command, flag, binary, *trace), f"{flag}: ", str(binary))


def test_header_only_trace_warns(capsys, tmp_path):
    data = tmp_path / "empty.csv"
    data.write_text((EXAMPLES / "trace.csv").read_text().splitlines()[0] + "\n")
    code, out, err = _main(capsys, "replay", "--trace-header", EXAMPLES / "trace-header.yaml",
                           "--trace-data", data)
    assert code == 0
    assert f"warning: --trace-data {data}: the trace has no requests" in err
    assert json.loads(out)["completed_requests"] == 0


def test_coefficients_file_flag_sets_the_physics_coefficients(capsys):
    coefficients = REPO / "configs/latency/sample-true-coefficients.yaml"
    argv = ["run", "--latency-model", "physics", *SMALL]
    code, with_file, err = _main(capsys, *argv, "--coefficients-file", coefficients)
    assert code == 0, err
    assert "placeholder" not in err
    code, placeholder, err = _main(capsys, *argv, "--allow-placeholder-coefficients")
    assert code == 0 and "warning: physics latency with the shipped all-zero placeholder" in err
    # the placeholder's zero coefficients give other latencies than the sample's
    assert json.loads(with_file)["ttft_mean_ms"] != json.loads(placeholder)["ttft_mean_ms"]


# ---- item 5: degenerate runs ----------------------------------------------------------------------


def test_physics_without_fitted_coefficients_is_refused(capsys, tmp_path):
    results = tmp_path / "r.json"
    _assert_refused(*_main(capsys, "run", "--latency-model", "physics", *SMALL,
                           "--results-path", results),
                    "--latency-model: physics needs fitted coefficients",
                    "--allow-placeholder-coefficients")
    assert not results.exists()


def test_a_kv_cache_too_small_for_every_request_warns(capsys):
    # 2 blocks x 16 tokens = 32 tokens < the shortest request (prompt >= 2 + output >= 2 of
    # means 512 ± 256 clamped at 2: not every one, so look at the completed count instead).
    code, out, err = _main(capsys, "run", *SMALL, "--total-kv-blocks", "1")
    assert code == 0
    metrics = json.loads(out)
    assert metrics["completed_requests"] == 0
    assert "warning: 20 of 20 requests can never be served" in err
    assert "warning: no request completed" in err and "dropped as unservable" in err


def test_every_request_rejected_warns(capsys):
    code, out, err = _main(capsys, "run", *SMALL, "--admission-policy", "reject-all")
    assert code == 0 and json.loads(out)["rejected_requests"] == 20
    assert "warning: no request completed: of 20 requests, 20 rejected" in err


# ---- item 6: interrupts ---------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "BLISJAX_COMPILE_CACHE": "0"}


def _ctrl_c_as_a_terminal_sends_it() -> None:
    """In the child before exec: SIGINT at its default disposition, as a shell starts a
    command. An ignored signal is inherited across exec, and a library run earlier in this
    test process may have left SIGINT ignored here; the CLI's Ctrl-C handling is under test,
    not that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    argv = [sys.executable, "-m", "blisjax.cli", "run", "--workload", "distribution", "--rate",
            "50", "--num-requests", "200000", "--results-path", str(tmp_path / "r.json")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_env(), preexec_fn=_ctrl_c_as_a_terminal_sends_it)
    first = proc.stderr.readline()  # logged once the inputs are checked, before simulating
    assert "base configuration" in first, first
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest
    assert rest.strip().splitlines() == ["blisjax: interrupted"]
    assert out == "" and not (tmp_path / "r.json").exists()


# ---- item 1: the progress line --------------------------------------------------------------------


def _stderr_on_a_terminal(argv: list[str]) -> str:
    """Run the CLI with stderr on a pseudo-terminal; its stderr text."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "blisjax.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=slave, env=_env(), cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_progress_line_on_a_terminal_plain_lines_elsewhere():
    argv = ["run", "--workload", "distribution", "--rate", "20", "--num-requests", "400"]
    shown = _stderr_on_a_terminal(argv)
    assert "\rblisjax: simulating 400 requests (reference engine) … " in shown
    assert "simulating" not in _stderr_on_a_terminal(["--quiet", *argv])
    piped = subprocess.run([sys.executable, "-m", "blisjax.cli", *argv], capture_output=True,
                           text=True, env=_env(), cwd=REPO, check=True)
    assert "blisjax: simulating 400 requests (reference engine)\n" in piped.stderr
    assert "\r" not in piped.stderr
    quiet = subprocess.run([sys.executable, "-m", "blisjax.cli", "--quiet", *argv],
                           capture_output=True, text=True, env=_env(), cwd=REPO, check=True)
    assert "simulating" not in quiet.stderr


def test_progress_ticks_while_a_phase_lasts():
    from io import StringIO

    from blisjax.progress import TICK_S, Progress

    class Terminal(StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    with Progress(stream=stream) as progress:
        progress.phase("compiling")
        time.sleep(3 * TICK_S)
    drawn = stream.getvalue().count("\rblisjax: compiling … ")
    assert drawn >= 2  # the first draw, then at least one tick
    off = Terminal()
    with Progress(enabled=False, stream=off) as progress:
        progress.phase("compiling")
    assert off.getvalue() == ""
    log = StringIO()  # not a terminal: one plain line per phase
    with Progress(stream=log) as progress:
        progress.phase("compiling")
        progress.phase("running")
    lines = log.getvalue().splitlines()
    assert lines[0] == "blisjax: compiling" and "\r" not in log.getvalue()
    assert lines[1].startswith("blisjax: running (after ") and lines[1].endswith(
        " s of compiling)")


@pytest.mark.slow
def test_ctrl_c_in_search_advises_resume_only_with_a_checkpoint(tmp_path):
    from tests.search.conftest import TINY_CONFIG, TINY_SPACE

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "blisjax.cli", "search", str(TINY_CONFIG), "--space",
            str(TINY_SPACE), "--strategy", "random", "--population", "4", "--generations", "50",
            "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_env(), preexec_fn=_ctrl_c_as_a_terminal_sends_it)
    time.sleep(5)  # inside the search: validating, compiling or evaluating generation 1
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("blisjax: interrupted") and "Traceback" not in err
    assert ("--resume" in last) == (out / "checkpoint.npz").is_file()
    assert stdout == ""


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_search_inputs_name_their_argument(capsys, tmp_path, command):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    config = REPO / "configs/search/prefix-affinity.yaml"
    rest = (["--grid", "routing.scorers.load-balance=1,2"] if command == "sweep" else
            ["--space", binary, "--strategy", "random", "--population", "4",
             "--generations", "1"])
    if command == "sweep":
        _assert_refused(*_main(capsys, command, binary, *rest, "--out", tmp_path / "o"),
                        "CONFIG: ", str(binary), "not UTF-8")
    else:
        _assert_refused(*_main(capsys, command, config, *rest, "--out", tmp_path / "o"),
                        "--space: ", str(binary), "not UTF-8")
    assert not (tmp_path / "o").exists()


# ---- item 1: the compile cache --------------------------------------------------------------------


def test_compile_cache_defaults_to_a_private_user_directory(monkeypatch, tmp_path):
    from blisjax.cli import enable_compile_cache

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("BLISJAX_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = enable_compile_cache(disabled=False)
    assert cache.path == tmp_path / "blisjax" / "xla" and cache.created
    assert (cache.path.stat().st_mode & 0o777) == 0o700  # it holds executable code
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(cache.path)
    assert not enable_compile_cache(disabled=False).created  # announced once, when created


@pytest.mark.parametrize("disabled, env", [(True, None), (False, "0")])
def test_compile_cache_opt_out(monkeypatch, tmp_path, disabled, env):
    from blisjax.cli import enable_compile_cache

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))  # the opt-out wins
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if env is None:
        monkeypatch.delenv("BLISJAX_COMPILE_CACHE", raising=False)
    else:
        monkeypatch.setenv("BLISJAX_COMPILE_CACHE", env)
    assert enable_compile_cache(disabled=disabled).path is None
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ and not list(tmp_path.iterdir())


def test_an_explicit_jax_cache_directory_wins(monkeypatch, tmp_path):
    from blisjax.cli import enable_compile_cache

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.delenv("BLISJAX_COMPILE_CACHE", raising=False)
    cache = enable_compile_cache(disabled=False)
    assert cache.path == tmp_path / "mine" and not cache.created


def test_output_paths_are_tried_before_simulating(tmp_path, capsys):
    """A path whose directory lets nothing be created (/proc) is refused before the run, naming
    the flag and the path; a missing directory is created, as a results directory is."""
    from blisjax.cli import main

    assert main(["run", "--metrics-path", "/proc/blisjax-m.json"]) == 2
    err = capsys.readouterr().err
    assert "--metrics-path: '/proc/blisjax-m.json' cannot be written" in err
    assert "Preemption Rate" not in err  # nothing was simulated
    out = tmp_path / "new" / "dir" / "rows.json"
    assert main(["run", "--quiet", "--results-path", str(out)]) == 0
    assert out.is_file()
