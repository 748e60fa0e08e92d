"""A git revision's ``blisjax`` package, importable beside the working tree's (A/B benchmarks)."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_NAME = "blisjax_base"


def export_base(rev: str, into: Path) -> None:
    """Write revision ``rev``'s ``blisjax`` package to ``into/blisjax_base`` with every
    self-import renamed, so both versions can be imported side by side."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "blisjax"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    (into / "blisjax").rename(into / BASE_NAME)
    own = re.compile(r"\bblisjax(?=[. ]|$)", re.MULTILINE)
    for path in (into / BASE_NAME).rglob("*.py"):
        path.write_text(own.sub(BASE_NAME, path.read_text()))
