"""A preemption-heavy tiered replay through the JAX engine finishes, and matches the reference.

The first 200 requests of BLIS's ``kv_tiered_preempt`` trace (1 instance, 448 GPU blocks, a
2,500-block CPU tier, 12 prefix groups of 1,024 tokens) under the blackbox model with
``--blis-quirks``: 86 preemptions and 8,089 reloaded blocks in the reference run, with requests
reloading over their own cached prefixes and waiting with blocks held. The JAX replay runs in
a subprocess with a time limit, so a replay that does not finish fails the suite instead of
stalling it (it compiles in about a minute on 2 cores and runs in seconds); its metrics and
per-request rows must be the reference engine's, byte for byte.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from blisjax.cli import main
from tests.paths import GOLDEN_NEXT_DIR, GOLDEN_NEXT_TIERED_PREEMPT

REQUESTS = 200
TIME_LIMIT_S = 900  # compile and run take ~1.5 min on 2 cores


def _replay_argv(tmp_path) -> list[str]:
    case = json.loads((GOLDEN_NEXT_DIR / f"{GOLDEN_NEXT_TIERED_PREEMPT}.json").read_text())
    lines = (GOLDEN_NEXT_DIR / f"{case['trace']}.csv").read_text().splitlines()
    data = tmp_path / "first.csv"
    data.write_text("\n".join(lines[:REQUESTS + 1]) + "\n")
    argv = shlex.split(case["command"])[1:]
    i = argv.index("--results-path")
    del argv[i:i + 2]
    argv = [str(data) if a.endswith(".csv") else
            str(GOLDEN_NEXT_DIR / a) if a.endswith(".yaml") else a for a in argv]
    return [("blackbox" if a == "roofline" else a) for a in argv] + ["--blis-quirks"]


def test_jax_replay_of_a_preempting_tiered_trace_finishes(tmp_path, capsys):
    argv = _replay_argv(tmp_path)
    assert main([*argv, "--results-path", str(tmp_path / "ref.json")]) == 0
    want = json.loads(capsys.readouterr().out)
    assert want["preemption_count"] > 50 and want["kv_reloads"] > 5000, want
    jax_argv = [*argv, "--engine", "jax", "--results-path", str(tmp_path / "jax.json")]
    done = subprocess.run([sys.executable, "-m", "blisjax.cli", *jax_argv],
                          capture_output=True, text=True, timeout=TIME_LIMIT_S, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == want
    assert (tmp_path / "jax.json").read_bytes() == (tmp_path / "ref.json").read_bytes()


@pytest.mark.slow
def test_too_few_holder_slots_are_refused_with_the_flag(tmp_path, capsys):
    """BLIS's whole replay has up to 3 requests at once waiting with blocks held: with 2 holder
    slots the JAX engine refuses to print numbers and names ``--kv-hold-slots``."""
    case = json.loads((GOLDEN_NEXT_DIR / f"{GOLDEN_NEXT_TIERED_PREEMPT}.json").read_text())
    argv = shlex.split(case["command"])[1:]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "r.json")
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a for a in argv]
    assert main([*argv, "--blis-quirks", "--engine", "jax", "--kv-hold-slots", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "r.json").exists()
    assert "raise it with --kv-hold-slots (> 2)" in err
