"""The engine's guard against the process's memory-mapping limit (compiled XLA programs)."""

from __future__ import annotations

import jax
import pytest

from blisjax.engine import run


@pytest.fixture
def proc(tmp_path, monkeypatch):
    """Fake /proc files: ``set(mappings, limit)`` writes them; returns the clear-cache calls."""
    maps, limit_file = tmp_path / "maps", tmp_path / "max_map_count"
    monkeypatch.setattr(run, "_MAPS", str(maps))
    monkeypatch.setattr(run, "_MAP_LIMIT", str(limit_file))
    calls = []
    monkeypatch.setattr(jax, "clear_caches", lambda: calls.append(1))

    def set_counts(mappings: int, limit: int | None) -> list:
        maps.write_text("m\n" * mappings)
        if limit is not None:
            limit_file.write_text(f"{limit}\n")
        return calls

    return set_counts


def test_guard_keeps_programs_below_half_the_limit(proc):
    calls = proc(500, 1_000)
    assert run.mapping_headroom_guard() is False
    assert calls == []


def test_guard_drops_programs_above_half_the_limit(proc):
    calls = proc(501, 1_000)
    assert run.mapping_headroom_guard() is True
    assert calls == [1]


def test_guard_uses_linux_default_limit_when_unreadable(proc):
    calls = proc(32_765, None)  # half of 65,530: still fine
    assert run.mapping_headroom_guard() is False
    calls = proc(32_766, None)
    assert run.mapping_headroom_guard() is True
    assert calls == [1]


def test_guard_is_a_no_op_without_proc(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "_MAPS", str(tmp_path / "absent"))
    called = []
    monkeypatch.setattr(jax, "clear_caches", lambda: called.append(1))
    assert run.mapping_headroom_guard() is False
    assert called == []
