"""Field validators shared by every config dataclass.

Each validator takes the dotted field path (``engine.max_num_running_reqs``) and the value, and
returns the value normalized (numpy ints → ``int``, ints → ``float`` for float fields, sequences →
tuples) or raises :class:`ConfigError` whose message names the path and the allowed range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from typing import Any, TypeVar

T = TypeVar("T")

#: Largest value of a Go ``int64`` (BLIS stores ticks and seeds as int64).
INT64_MIN = -(2**63)


class ConfigError(ValueError):
    """An invalid configuration value.

    ``ConfigError(path, problem)`` reads ``"<path>: <problem>"``; ``ConfigError(message)`` (one
    argument) is accepted for messages that already name what is wrong.

    Attributes:
      path: dotted field path (``engine.block_size_tokens``) or flag (``--tp``) at fault; "" when
        built from a single message.
      problem: what is wrong, including the allowed range and the value received.
    """

    def __init__(self, path: str, problem: str | None = None) -> None:
        if problem is None:
            path, problem = "", path
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


def set_field(obj: object, name: str, value: Any) -> None:
    """Store a normalized value on a frozen dataclass (only from ``__post_init__``)."""
    object.__setattr__(obj, name, value)


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def _in_range(x: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (x < lo or (lo_open and x == lo)):
        return False
    return hi is None or not (x > hi or (hi_open and x == hi))


def check_int(
    path: str, value: Any, *, min_value: int | None = None, max_value: int | None = None
) -> int:
    """An integer (bool excluded) within [min_value, max_value]."""
    rng = _range_text(min_value, max_value, False, False)
    wanted = f"must be an integer {rng}".rstrip()
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(path, f"{wanted}, got {value!r}")
    value = int(value)
    if not _in_range(value, min_value, max_value, False, False):
        raise ConfigError(path, f"{wanted}, got {value}")
    return value


def check_float(
    path: str,
    value: Any,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
) -> float:
    """A finite real number (bool excluded) within the given bounds; returned as ``float``."""
    rng = _range_text(min_value, max_value, min_open, max_open)
    wanted = f"must be a finite number {rng}".rstrip()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(path, f"{wanted}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not _in_range(value, min_value, max_value, min_open, max_open):
        raise ConfigError(path, f"{wanted}, got {value!r}")
    return value


def check_choice(path: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of names."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigError(path, f"must be one of {allowed}, got {value!r}")
    return value


def check_bool(path: str, value: Any) -> bool:
    """A bool (no truthy coercion: ``"no"`` or ``0`` are errors)."""
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be true or false, got {value!r}")
    return value


def check_str(path: str, value: Any, *, nonempty: bool = True) -> str:
    """A string, non-empty unless told otherwise."""
    if not isinstance(value, str) or (nonempty and not value):
        raise ConfigError(path, f"must be a non-empty string, got {value!r}")
    return value


def check_float_tuple(path: str, value: Any) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers, returned as a tuple of floats."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(path, f"must be a list of finite numbers, got {value!r}")
    items = tuple(value)
    if not items:
        raise ConfigError(path, "must be a non-empty list of finite numbers, got []")
    return tuple(check_float(f"{path}[{i}]", x) for i, x in enumerate(items))


def check_pairs(
    path: str,
    value: Any,
    check_key: Callable[[str, Any], str],
    check_value: Callable[[str, Any], T],
) -> tuple[tuple[str, T], ...]:
    """A name → value table given as a mapping or a sequence of pairs; keys must be unique.

    Returned as a tuple of ``(key, value)`` pairs in the given order (hashable, unlike a dict).
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(path, f"must be a mapping of name to value, got {value!r}")
    else:
        items = list(value)
    out: list[tuple[str, T]] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ConfigError(path, f"entries must be (name, value) pairs, got {item!r}")
        key = check_key(path, item[0])
        if key in seen:
            raise ConfigError(path, f"duplicate name {key!r}")
        seen.add(key)
        out.append((key, check_value(f"{path}[{key!r}]", item[1])))
    return tuple(out)
