"""Checks of input files and output paths, done before anything is simulated or written."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blisjax.cli.common import flag_name
from blisjax.config import ConfigError


def check_input_file(flag: str, path: str) -> None:
    """``path`` (given with ``flag``) is a readable regular file, else ``ConfigError``."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(flag, f"no such file: {path!r}")
    if p.is_dir():
        raise ConfigError(flag, f"{path!r} is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(flag, f"cannot read {path!r}: permission denied")


def check_text_file(flag: str, path: str) -> None:
    """``check_input_file``, and the file is UTF-8 text."""
    check_input_file(flag, path)
    try:
        Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path!r} is not UTF-8 text") from None


@contextlib.contextmanager
def reading(flag: str, path: str, prefix: str = "") -> Iterator[None]:
    """Report any failure to read or parse ``path`` as a ``ConfigError`` naming ``flag`` and
    ``path``; messages about the file's content get ``prefix`` (e.g. ``workload.``)."""
    check_input_file(flag, path)
    try:
        yield
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path!r} is not UTF-8 text") from None
    except OSError as err:
        raise ConfigError(flag, f"cannot read {path!r}: {err.strerror or err}") from None
    except ValueError as err:  # ConfigError is a ValueError; YAML errors are wrapped as one
        text = " ".join(str(err).split())
        if prefix and not text.startswith(prefix):
            text = prefix + text
        raise ConfigError(flag, f"{path}: {text}") from None


def check_output_path(flag: str, path: str) -> None:
    """``path`` (a file to write, given with ``flag``) can be written: it is not a directory,
    its directory exists (missing directories are created, as for a results directory) and a
    file can be created there (tried: permissions alone do not tell, e.g. in /proc). Checked
    before any simulation."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, f"{path!r} is a directory; give a file path")
    parent = p.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(flag, f"{path!r}: {str(existing)!r} is not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(flag, f"{path!r} cannot be written: "
                          f"{(err.strerror or str(err)).lower()}") from None


def check_output_dir(flag: str, path: str) -> None:
    """``path`` (a results directory, created with its parents if missing) can be written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(flag, f"{path!r} exists and is not a directory")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(flag, f"{path!r}: {str(existing)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{path!r}: permission denied")


def check_outputs(args: Any, flags: tuple[str, ...]) -> None:
    for dest in flags:
        value = getattr(args, dest, None)
        if value:
            check_output_path(flag_name(dest), value)
