"""Frozen dataclasses that are JAX pytrees: the engine's state, constants and policy knobs.

Every field is a leaf (an array); the leaves flatten in field-name order. ``replace`` returns
a copy with some fields changed. (A local decorator rather than a library's: importing one
costs a new process time; docs/performance.md, Seconds to first result.)
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

T = TypeVar("T")


def _replace(self: T, **changes: Any) -> T:
    """A copy with ``changes`` applied (field name → new value)."""
    return dataclasses.replace(self, **changes)


def pytree_dataclass(cls: type[T]) -> type[T]:
    """``cls`` as a frozen dataclass registered as a pytree whose leaves are its
    fields in name order, with a ``replace(**changes)`` method."""
    cls = dataclasses.dataclass(frozen=True, eq=False)(cls)
    names = sorted(f.name for f in dataclasses.fields(cls))
    jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])
    cls.replace = _replace
    return cls
