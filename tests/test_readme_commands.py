"""Every `blisjax` command in README.md's ```bash blocks runs as written from the repository root.

Which lines count as commands (the rule README.md's examples follow):

* a command is a line of a ```bash block that starts with ``blisjax``, joined with its ``\\``
  continuation lines; ``#`` comments are dropped. Other lines (``pip install``, ``python -m
  pytest``) set up or test the project and are not run here;
* a command containing ``...`` is a placeholder for arguments described elsewhere and is skipped.

Commands run in README order in one scratch directory that holds links to the repository's
``examples/`` and ``configs/`` (so a command's outputs never land in the repository), each with
exit status 0. The default tier runs the reference-engine commands; commands that compile JAX
programs (``--engine jax``, ``parity``) and every command of a block holding ``sweep`` or
``search`` (minutes each, and later commands read their outputs) run in the slow tier.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SLOW_SUBCOMMANDS = ("parity", "sweep", "search")
#: Commands that print a Markdown summary instead of a JSON document.
TEXT_SUBCOMMANDS = ("explain",)


def readme_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block (continuations joined, comments dropped)."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        commands: list[str] = []
        pending = ""
        for line in body.splitlines():
            line = pending + line
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1] + " "
                continue
            pending = ""
            words = shlex.split(line, comments=True)
            if words and words[0] == "blisjax" and "..." not in words:
                commands.append(shlex.join(words))
        blocks.append(commands)
    return blocks


def _is_slow(command: str, block: list[str]) -> bool:
    block_is_search = any(shlex.split(c)[1] in ("sweep", "search") for c in block)
    words = shlex.split(command)
    return block_is_search or words[1] in SLOW_SUBCOMMANDS or "--engine jax" in command


def _commands(slow: bool) -> list[str]:
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    return [c for block in blocks for c in block if slow or not _is_slow(c, block)]


def _run_all(commands: list[str], workdir: Path) -> None:
    for name in ("examples", "configs"):
        (workdir / name).symlink_to(REPO / name)
    env = {**os.environ, "PYTHONPATH": str(REPO), "BLISJAX_COMPILE_CACHE": "0"}
    for command in commands:
        argv = [sys.executable, "-m", "blisjax.cli", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        if shlex.split(command)[1] in TEXT_SUBCOMMANDS:
            assert done.stdout.startswith("# "), f"{command}\n{done.stdout[:200]}"
        elif done.stdout.strip():
            json.loads(done.stdout)  # every other command prints one JSON document


def test_readme_lists_commands_for_every_command_name():
    # The parser of this test finds the commands: a README rewrite that hid them (another fence
    # language, a prompt prefix) would otherwise leave nothing to run.
    names = {shlex.split(c)[1] for c in _commands(slow=True)}
    assert {"run", "replay", "trace", "parity", "fit-latency", "sweep", "search"} <= names


def test_trace_is_written_before_the_replay_that_reads_it():
    commands = _commands(slow=False)
    written = next(i for i, c in enumerate(commands) if c.startswith("blisjax trace"))
    reads = [i for i, c in enumerate(commands) if "--trace-data results/trace.csv" in c]
    assert reads and all(i > written for i in reads)


def test_fast_readme_commands_run_as_written(tmp_path):
    _run_all(_commands(slow=False), tmp_path)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path):
    _run_all(_commands(slow=True), tmp_path)
