"""JAX's persistent compile cache and the engine's program cache: where they live and turning
them on or off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from blisjax.cli.common import log_line

# Read by ``blisjax.engine.progcache`` (named here so the command need not import JAX to set it).
# ``blisjax.engine.progcache.ENV_DIRECTORY``, named again here: importing that module starts
# JAX, which must not happen before ``--cpu-devices`` is applied.
PROGRAM_CACHE_ENV = "BLISJAX_PROGRAM_CACHE_DIR"


def compile_cache_dir() -> Path:
    """Where compiled JAX programs are kept: ``$XDG_CACHE_HOME/blisjax/xla`` (default
    ``~/.cache/blisjax/xla``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "blisjax" / "xla"


def program_cache_dir() -> Path:
    """Where whole compiled engine programs are kept (``blisjax.engine.progcache``):
    ``programs`` next to ``compile_cache_dir()``."""
    return compile_cache_dir().parent / "programs"


class CompileCache(NamedTuple):
    """The compile-cache setting of this process."""

    path: Path | None  # None = off
    created: bool  # the directory was made by this process (its location is then logged)


def enable_compile_cache(disabled: bool) -> CompileCache:
    """Turn JAX's persistent compilation cache on (before JAX is imported) in
    ``compile_cache_dir()``, or in ``JAX_COMPILATION_CACHE_DIR`` when the user set it; off when
    ``disabled`` (``--no-compile-cache``) or ``BLISJAX_COMPILE_CACHE=0``, which win over that
    variable. The directory is private (mode 700): it holds executable code. The engine's
    program cache (``BLISJAX_PROGRAM_CACHE_DIR``, default ``program_cache_dir()``) follows the
    same switch."""
    if disabled or os.environ.get("BLISJAX_COMPILE_CACHE", "1").strip() in ("0", "", "off"):
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the opt-out wins
        os.environ.pop(PROGRAM_CACHE_ENV, None)
        return CompileCache(None, False)
    os.environ.setdefault(PROGRAM_CACHE_ENV, str(program_cache_dir()))
    chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if chosen:
        return CompileCache(Path(chosen), False)
    path = compile_cache_dir()
    created = not path.exists()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        os.environ.pop(PROGRAM_CACHE_ENV, None)
        return CompileCache(None, False)  # an unwritable home: run without the cache
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    return CompileCache(path, created)


#: This process's setting (``app.main`` sets it before running a command).
_compile_cache = CompileCache(None, False)


def announce_compile_cache(args: Any) -> None:
    """Print the compile cache's location the first time it is created."""
    if _compile_cache.created and not args.quiet:
        log_line(args, f"keeping compiled JAX programs in {_compile_cache.path} and "
                   f"{os.environ.get(PROGRAM_CACHE_ENV)} (turn off with --no-compile-cache or "
                   "BLISJAX_COMPILE_CACHE=0)")
