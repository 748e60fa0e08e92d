"""A stand-in for ``EngineStatic`` in tests of helpers that read a few of its fields."""

from __future__ import annotations

from types import SimpleNamespace

from blisjax.engine.static_parts import FIELD_GROUP


def static_like(**fields) -> SimpleNamespace:
    """An object holding ``fields`` where ``EngineStatic`` does: its fields in their groups
    (``st.shapes.kv_blocks``), anything else (its derived properties, e.g. ``tiered``) on top."""
    groups: dict[str, dict] = {}
    top = {}
    for name, value in fields.items():
        if name in FIELD_GROUP:
            groups.setdefault(FIELD_GROUP[name], {})[name] = value
        else:
            top[name] = value
    return SimpleNamespace(**top, **{g: SimpleNamespace(**kw) for g, kw in groups.items()})
