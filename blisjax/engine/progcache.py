"""Compiled engine programs kept on disk, so a new process skips tracing, lowering and compiling.

Tracing and lowering the engine's event loop take ~9–10 s on every new process even when XLA's
own persistent cache holds the compiled code (its key is a hash of the lowered program, so the
program must be lowered to look it up). Here a compiled program is stored whole (XLA's
serialized executable) under a key computed from what fixes the program *before* tracing: the
``EngineStatic``, the argument shapes and dtypes, the devices, the lane block, the jax/jaxlib
versions, the XLA flags and a hash of blisjax's own source files (an edited engine never loads a
stale program).

Off unless a directory is chosen: ``use_program_cache(path)``, or the environment variable
``BLISJAX_PROGRAM_CACHE_DIR`` (the ``blisjax`` command sets it to
``$XDG_CACHE_HOME/blisjax/programs`` unless ``--no-compile-cache`` / ``BLISJAX_COMPILE_CACHE=0``).
Entries are safe to delete; an unreadable entry is reported in one line and rebuilt.

Not cached: programs with host callbacks (a roofline configuration
``engine.roofline.fits_the_program`` rejects, or a model put on the host by hand through
``EngineStatic.features.latency``: a callback is a pointer into this process), which compile the
usual way.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
import zlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jaxlib
import numpy as np

ENV_DIRECTORY = "BLISJAX_PROGRAM_CACHE_DIR"
# Bumped when the entry layout changes.
ENTRY_FORMAT = 1
_MAGIC = b"blisjax-program\n"
# Entries kept per directory, most recently used first (an entry of the default experiment is
# ~7 MB; every shape, engine edit or jax upgrade makes a new one).
MAX_ENTRIES = 32

_chosen: Path | None = None
_chosen_set = False
# Programs loaded or compiled by this process, by key (loading one costs seconds).
_loaded: dict[str, Any] = {}


def use_program_cache(path: str | os.PathLike | None) -> None:
    """Keep compiled engine programs in ``path`` (created private, mode 700); ``None`` turns
    the cache off. Overrides ``BLISJAX_PROGRAM_CACHE_DIR`` for this process."""
    global _chosen, _chosen_set
    _chosen, _chosen_set = (None if path is None else Path(path)), True


def program_cache_dir() -> Path | None:
    """The directory in use, or ``None`` when the program cache is off."""
    if _chosen_set:
        return _chosen
    env = os.environ.get(ENV_DIRECTORY, "").strip()
    return Path(env) if env else None


def tree_hash(root: Path) -> str:
    """SHA-256 over the Python files under ``root`` (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def source_hash() -> str:
    """``tree_hash`` of the blisjax package: any edit to it gives new keys."""
    return tree_hash(Path(__file__).resolve().parents[1])


def program_key(static: Any, args: tuple, devices: tuple, lane_block: int) -> str:
    """Hex key of the program for ``static`` (its repr names every field), the shapes and
    dtypes of ``args``, ``devices`` and ``lane_block``, under this jax/jaxlib and XLA flags."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    parts = (
        ENTRY_FORMAT, jax.__version__, jaxlib.__version__, source_hash(),
        os.environ.get("XLA_FLAGS", ""), bool(jax.config.jax_enable_x64),
        repr(static), str(treedef),
        tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__)))
              for x in leaves),
        tuple((d.platform, d.device_kind, d.id) for d in devices), lane_block,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _notice(message: str) -> None:
    print(f"blisjax: {message}", file=sys.stderr)


def _load(path: Path, key: str, devices: tuple):
    """The compiled program stored at ``path``; raises on any defect."""
    from jax.experimental import serialize_executable

    blob = path.read_bytes()
    if not blob.startswith(_MAGIC):
        raise ValueError("not a blisjax program entry")
    stored_key, serialized, in_tree, out_tree = pickle.loads(zlib.decompress(blob[len(_MAGIC):]))
    if stored_key != key:
        raise ValueError("entry key does not match its file name")
    return serialize_executable.deserialize_and_load(serialized, in_tree, out_tree,
                                                     execution_devices=list(devices))


def _store(directory: Path, path: Path, key: str, compiled) -> None:
    """Write ``compiled`` atomically (a reader sees the old entry, none, or the new one)."""
    from jax.experimental import serialize_executable

    serialized, in_tree, out_tree = serialize_executable.serialize(compiled)
    blob = _MAGIC + zlib.compress(pickle.dumps((key, serialized, in_tree, out_tree)), 1)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".program")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _prune(directory)


def _prune(directory: Path, keep: int = MAX_ENTRIES) -> None:
    """Delete all but the ``keep`` most recently used entries (loading one touches it)."""
    def used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # deleted meanwhile by another process
            return 0.0

    for old in sorted(directory.glob("*.program"), key=used, reverse=True)[keep:]:
        old.unlink(missing_ok=True)


def _compile_fresh(lower: Callable[[], Any]):
    """Compile without XLA's persistent cache: an executable XLA loaded from its cache
    serializes without its kernels (jaxlib 0.10.2: the reloaded program fails with "Function
    … not found"), so only freshly compiled code is stored here. JAX decides once per process
    whether its cache is in use; ``reset_cache`` makes it decide again."""
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_enable_compilation_cache
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        return lower().compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


class Program(NamedTuple):
    """A compiled program and where it came from."""

    compiled: Any  # jax.stages.Compiled: call with the non-static arguments
    path: Path | None  # its entry on disk (None: cache off or not cacheable)
    from_disk: bool  # loaded from ``path`` rather than compiled by this process


def cacheable(static: Any) -> bool:
    """Whether programs for ``static`` go through the program cache: it is on, and the
    program has no host callbacks."""
    return program_cache_dir() is not None and static.features.latency is None


def compiled_program(static: Any, lower: Callable[[], Any], args: tuple, devices: tuple,
                     lane_block: int) -> Program:
    """The compiled program for these arguments: from this process's memory, from the
    program cache, or ``lower().compile()`` (then stored). ``lower`` returns the program's
    ``jax.stages.Lowered``; ``args`` are its non-static arguments (only their shapes count)."""
    if not cacheable(static):
        return Program(lower().compile(), None, False)
    directory = program_cache_dir()
    key = program_key(static, args, devices, lane_block)
    path = directory / f"{key}.program"
    if key in _loaded:
        return Program(_loaded[key], path, False)
    if path.exists():
        try:
            compiled = _load(path, key, devices)
            os.utime(path)  # most recently used: kept longest by ``_prune``
            _loaded[key] = compiled
            return Program(compiled, path, True)
        except Exception as exc:  # noqa: BLE001 -- any defect: rebuild the entry
            _notice(f"ignoring unreadable compiled program {path} ({type(exc).__name__}: "
                    f"{exc}); compiling it again")
    compiled = _compile_fresh(lower)
    try:
        _store(directory, path, key, compiled)
    except Exception as exc:  # noqa: BLE001 -- a full disk or a read-only cache: run anyway
        _notice(f"could not keep the compiled program in {directory} ({exc})")
    _loaded[key] = compiled
    return Program(compiled, path, False)


def run_program(static: Any, lower: Callable[[], Any], args: tuple, devices: tuple,
                lane_block: int, loaded: Callable[[Any], None] | None = None):
    """Run the program for ``args`` (``compiled_program``) and wait for its outputs.
    ``loaded``, if given, is called with the compiled program between obtaining it and
    running it. A program
    loaded from disk that fails to run is dropped from the cache, reported, and rebuilt."""
    program = compiled_program(static, lower, args, devices, lane_block)
    if loaded is not None:
        loaded(program.compiled)
    try:
        return jax.block_until_ready(program.compiled(*args))
    except Exception as exc:  # noqa: BLE001
        if not program.from_disk:
            raise
        _notice(f"compiled program {program.path} failed to run ({type(exc).__name__}); "
                "compiling it again")
        _loaded.pop(program.path.stem, None)
        program.path.unlink(missing_ok=True)
        return jax.block_until_ready(
            compiled_program(static, lower, args, devices, lane_block).compiled(*args))


def forget_loaded() -> None:
    """Drop the programs this process holds (the next use loads them from disk again)."""
    _loaded.clear()
