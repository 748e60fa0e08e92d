"""Atomic file output: a file is either its old contents or the complete new ones, never half.

The data goes to a temporary file beside the target (same filesystem), is flushed and fsynced,
gets ordinary permissions (``mkstemp`` creates 0600), then ``os.replace``s the target; on any
error the temporary file is removed and the target is untouched.
"""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically (newlines written as given)."""
    write_bytes_atomic(path, text.encode("utf-8"))
