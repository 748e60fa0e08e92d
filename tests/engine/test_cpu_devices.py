"""``blisjax.devices``: one XLA CPU device per usable core, requested before JAX starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from blisjax.cli import build_parser
from blisjax.devices import DEVICE_COUNT_FLAG, usable_cores, use_cpu_cores, with_device_count
from tests.paths import REPO


def test_flag_is_appended_to_other_flags():
    assert with_device_count("", 4) == f"{DEVICE_COUNT_FLAG}=4"
    assert with_device_count("--xla_cpu_enable_fast_math=false", 2) \
        == f"--xla_cpu_enable_fast_math=false {DEVICE_COUNT_FLAG}=2"


def test_an_explicit_device_count_or_one_device_changes_nothing():
    assert with_device_count(f"{DEVICE_COUNT_FLAG}=3", 2) is None
    assert with_device_count("", 1) is None


def test_bad_count_is_refused_by_name():
    with pytest.raises(ValueError, match="cpu devices: must be >= 1, got 0"):
        with_device_count("", 0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--cpu-devices", "0", "run"])


def test_too_late_once_jax_is_imported(monkeypatch):
    import jax  # noqa: F401  (the test process has it loaded anyway)

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert use_cpu_cores(2) is None
    assert "XLA_FLAGS" not in os.environ


def _devices_in_fresh_interpreter(call: str, xla_flags: str | None) -> str:
    script = textwrap.dedent(f"""
        from blisjax.devices import use_cpu_cores
        print({call})
        import jax
        print(jax.local_device_count())
    """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_request_reaches_jax_and_an_explicit_flag_wins():
    assert _devices_in_fresh_interpreter("use_cpu_cores(3)", None) == ["3", "3"]
    assert _devices_in_fresh_interpreter("use_cpu_cores(3)", f"{DEVICE_COUNT_FLAG}=2") \
        == ["None", "2"]
    cores = usable_cores()
    expected = ["None", "1"] if cores == 1 else [str(cores), str(cores)]
    assert _devices_in_fresh_interpreter("use_cpu_cores()", None) == expected
