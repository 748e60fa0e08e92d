"""The program cache (``blisjax.engine.progcache``): a run whose compiled program is loaded from
disk skips tracing and gives the same result as the reference engine and as a run without the
cache; a defective entry is reported and rebuilt; the key changes with everything that fixes
the program; the ``blisjax`` command turns the cache on and off with the XLA cache."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from blisjax import cli
from blisjax.engine import (
    params_from_config,
    progcache,
    run,
    simulate_population,
    stack_params,
)
from blisjax.engine.parity import first_divergence
from blisjax.metrics.records import RunResult
from blisjax.reference import simulate as reference
from tests.engine.conftest import room_for_a_program
from tests.engine.test_parity import EDGE_ROWS
from tests.engine.test_stretches import stretch_scenario
from tests.paths import REPO
from tests.reference.conftest import make_resolved, make_workload

# The shape of test_parity's two-instance population tests (two tenants, one prefix group).
BASE = dict(instances=2, block_size=4, kv_blocks=40, max_running=4, max_tokens=64)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The program cache on in a fresh directory for one test, off again afterwards."""
    monkeypatch.setattr(progcache, "_chosen", None)
    monkeypatch.setattr(progcache, "_chosen_set", False)
    monkeypatch.setattr(progcache, "_loaded", {})
    progcache.use_program_cache(tmp_path / "programs")
    return tmp_path / "programs"


def _same_result(a: RunResult, b: RunResult) -> bool:
    for field in dataclasses.fields(RunResult):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


class _NoTracing:
    """Stands in for the jitted program: tracing or running it fails the test."""

    def lower(self, *args, **kwargs):
        raise AssertionError("traced a program the cache holds")

    __call__ = lower


def _refuse_tracing(monkeypatch):
    monkeypatch.setattr(run, "_run_sharded", _NoTracing())


def test_cache_is_off_unless_chosen(monkeypatch):
    monkeypatch.setattr(progcache, "_chosen_set", False)
    monkeypatch.delenv(progcache.ENV_DIRECTORY, raising=False)
    assert progcache.program_cache_dir() is None
    monkeypatch.setenv(progcache.ENV_DIRECTORY, "/some/dir")
    assert str(progcache.program_cache_dir()) == "/some/dir"


def test_loaded_program_gives_the_uncached_and_reference_result(cache_dir, monkeypatch, capsys):
    # The 8 lanes of test_stretches.py's scenario: its program, compiled here, is the one that
    # test finds in memory.
    resolved, w, configs = stretch_scenario()
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])

    def lanes():
        return simulate_population(resolved, w, params, decode_stretches=True)

    def same(a: list[RunResult], b: list[RunResult]) -> bool:
        return all(_same_result(x, y) for x, y in zip(a, b, strict=True))

    progcache.use_program_cache(None)
    room_for_a_program()
    uncached = lanes()
    progcache.use_program_cache(cache_dir)
    stored = lanes()  # compiled, then kept
    entries = list(cache_dir.glob("*.program"))
    assert len(entries) == 1
    progcache.forget_loaded()
    with monkeypatch.context() as m:
        _refuse_tracing(m)
        loaded = lanes()
    for k, cfg in enumerate(configs):
        want = reference(dataclasses.replace(resolved, config=cfg), w)
        assert first_divergence(want, uncached[k]) is None, k
    assert same(uncached, stored) and same(uncached, loaded)

    # A defective entry: one notice naming it, the same result, and a sound entry again.
    entries[0].write_bytes(b"blisjax-program\nnot a program")
    progcache.forget_loaded()
    capsys.readouterr()
    rebuilt = lanes()
    err = capsys.readouterr().err
    assert "ignoring unreadable compiled program" in err and entries[0].name in err
    assert err.count("\n") == 1
    assert same(uncached, rebuilt)
    progcache.forget_loaded()
    with monkeypatch.context() as m:
        _refuse_tracing(m)
        assert same(uncached, lanes())


def test_latency_models_with_host_callbacks_are_not_cached(cache_dir):
    class Lowered:
        def compile(self):
            return "compiled"

    class Static:  # a model evaluated on the host (EngineStatic.features.latency)
        features = SimpleNamespace(latency="a model")

    got = progcache.compiled_program(Static(), Lowered, (np.zeros(3),), (), 64)
    assert got == progcache.Program("compiled", None, False)
    assert not cache_dir.exists()


def test_key_follows_everything_that_fixes_the_program(monkeypatch):
    import jax

    static = run.build_static(make_resolved(**BASE), make_workload(EDGE_ROWS, ("a", "b"),
                                                                   ("g",)))
    args = (np.zeros(3, np.int64), {"x": np.zeros((2, 4), np.int32)})
    devices = tuple(jax.local_devices()[:1])
    key = progcache.program_key(static, args, devices, 64)
    assert key == progcache.program_key(static, args, devices, 64)
    others = [
        progcache.program_key(static.replace(queue_slots=static.shapes.queue_slots + 1),
                              args, devices, 64),
        progcache.program_key(static, (np.zeros(4, np.int64), args[1]), devices, 64),
        progcache.program_key(static, (np.zeros(3, np.int32), args[1]), devices, 64),
        progcache.program_key(static, (args[0], {"y": args[1]["x"]}), devices, 64),
        progcache.program_key(static, args, devices, 32),
    ]
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=/x")
    others.append(progcache.program_key(static, args, devices, 64))
    monkeypatch.undo()
    monkeypatch.setattr(progcache, "source_hash", lambda: "an edited engine")
    others.append(progcache.program_key(static, args, devices, 64))
    assert len({key, *others}) == len(others) + 1


def test_source_hash_changes_with_any_python_file(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "instance.py").write_text("STEP = 1\n")
    (tmp_path / "cli.py").write_text("")
    first = progcache.tree_hash(tmp_path)
    (tmp_path / "notes.txt").write_text("not source")
    assert progcache.tree_hash(tmp_path) == first
    (tmp_path / "engine" / "instance.py").write_text("STEP = 2\n")
    edited = progcache.tree_hash(tmp_path)
    (tmp_path / "engine" / "lanes.py").write_text("")
    added = progcache.tree_hash(tmp_path)
    (tmp_path / "engine" / "lanes.py").rename(tmp_path / "engine" / "lanes2.py")
    renamed = progcache.tree_hash(tmp_path)
    assert len({first, edited, added, renamed}) == 4
    package = Path(progcache.__file__).resolve().parents[1]
    assert progcache.source_hash() == progcache.tree_hash(package)


def test_command_turns_the_program_cache_on_and_off_with_the_xla_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("BLISJAX_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR", cli.PROGRAM_CACHE_ENV):
        monkeypatch.delenv(name, raising=False)
    assert cli.PROGRAM_CACHE_ENV == progcache.ENV_DIRECTORY  # the variable the engine reads
    cli.enable_compile_cache(False)
    assert os.environ[cli.PROGRAM_CACHE_ENV] == str(tmp_path / "blisjax" / "programs")
    cli.enable_compile_cache(True)  # --no-compile-cache
    assert cli.PROGRAM_CACHE_ENV not in os.environ
    cli.enable_compile_cache(False)
    monkeypatch.setenv("BLISJAX_COMPILE_CACHE", "0")
    cli.enable_compile_cache(False)
    assert cli.PROGRAM_CACHE_ENV not in os.environ


SHARDED = textwrap.dedent("""
    import sys
    import jax
    from blisjax.engine import params_from_config, progcache, run, simulate_population
    from blisjax.engine import stack_params
    from blisjax.engine.parity import first_divergence
    from blisjax.reference import simulate as reference
    from blisjax.config import resolve_config
    from tests.engine.test_parity import EDGE_ROWS, _random_policy_configs
    from tests.reference.conftest import make_resolved, make_workload

    assert jax.local_device_count() == 2, jax.local_devices()
    progcache.use_program_cache(sys.argv[1])
    base = make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=4, max_tokens=64)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    configs = _random_policy_configs(base.config, w.tenant_names, 3, seed=11)
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    for attempt in ("compiled", "loaded"):
        progcache.forget_loaded()
        if attempt == "loaded":  # from disk: tracing the program again would fail
            run._run_sharded = None
        lanes = simulate_population(base, w, params)
        for k, cfg in enumerate(configs):
            d = first_divergence(reference(resolve_config(cfg), w), lanes[k])
            assert d is None, (attempt, k, d)
    print("OK", len(list(progcache.program_cache_dir().glob("*.program"))))
""")


@pytest.mark.slow  # a second compile; the default tier stores and loads a one-device program
def test_program_sharded_over_two_devices_is_stored_and_loaded(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", SHARDED, str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 1" in out.stdout


def test_only_the_most_recently_used_entries_are_kept(tmp_path):
    for k in range(5):
        entry = tmp_path / f"{k}.program"
        entry.write_bytes(b"x")
        os.utime(entry, (1000 + k, 1000 + k))
    os.utime(tmp_path / "0.program", (2000, 2000))  # used last
    (tmp_path / "notes.txt").write_text("not an entry")
    progcache._prune(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["0.program", "3.program", "4.program", "notes.txt"]
