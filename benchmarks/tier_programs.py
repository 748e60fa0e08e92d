"""The engine programs the test tier compiles: how many distinct ones, per test file, and which
``EngineStatic`` fields tell a file's programs apart.

Each distinct program costs the tier a trace, a lowering and an XLA compile (~30–70 s on two
cores), so the tier's time follows the count printed here. The input is a survey run of the
tier (tests/conftest.py: each program a test would compile is recorded, not compiled):

    BLISJAX_TEST_PROGRAM_SURVEY=/tmp/programs.jsonl python -m pytest -q -p no:cacheprovider
    python benchmarks/tier_programs.py /tmp/programs.jsonl
    python benchmarks/tier_programs.py /tmp/programs.jsonl --diff   # fields that differ

A test's programs after its first are not in the survey (the test stops at its first).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def programs_by_file(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{test file: {program key: {"static": fields, "tests": [test ids]}}} in survey order."""
    files: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for row in rows:
        entry = files[row["test"].split("::")[0]].setdefault(
            row["key"], {"static": row["static"], "lane_block": row["lane_block"],
                         "lanes": row["lanes"], "tests": []})
        if row["test"] not in entry["tests"]:
            entry["tests"].append(row["test"])
    return files


def differences(first: dict, other: dict) -> dict[str, tuple]:
    """Fields (and the lane block, lane count) where ``other`` differs from ``first``."""
    out = {k: (v, other["static"].get(k)) for k, v in first["static"].items()
           if other["static"].get(k) != v}
    for k in ("lane_block", "lanes"):
        if first[k] != other[k]:
            out[k] = (first[k], other[k])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("survey", type=Path, help="BLISJAX_TEST_PROGRAM_SURVEY's file")
    ap.add_argument("--diff", action="store_true",
                    help="for files of several programs, the fields differing from the first")
    args = ap.parse_args()
    files = programs_by_file(load(args.survey))
    keys = {k for programs in files.values() for k in programs}
    print(f"{len(keys)} distinct programs in {len(files)} test files")
    for name, programs in sorted(files.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"{len(programs):3d}  {name}")
        if not args.diff or len(programs) < 2:
            continue
        entries = list(programs.values())
        for other in entries[1:]:
            diff = ", ".join(f"{k} {a} → {b}" for k, (a, b) in differences(entries[0], other)
                             .items())
            test = other["tests"][0].split("::")[1]
            print(f"       {test}: {diff}")


if __name__ == "__main__":
    main()
