"""A git revision's ``blisjax`` package, importable beside the working tree's (A/B benchmarks)."""

from __future__ import annotations

import importlib
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


def own_config(config, package: str, scratch: Path):
    """``config`` (a working-tree ``SimConfig``) as ``package``'s own records: written as YAML
    and read back by that package's loader (``blisjax`` returns it unchanged). Code that
    compares a record with a default (``lifecycle != LifecycleConfig()``) needs records of
    its own classes: another package's never compare equal."""
    if package == "blisjax":
        return config
    from blisjax.config import dump_config

    path = scratch / "config.yaml"
    path.write_text(dump_config(config))
    return importlib.import_module(f"{package}.config").load_config(path)


def own_resolved(resolved, package: str, scratch: Path):
    """``resolved`` (a working-tree resolved configuration) resolved again by ``package``."""
    if package == "blisjax":
        return resolved
    return importlib.import_module(f"{package}.config").resolve_config(
        own_config(resolved.config, package, scratch))
