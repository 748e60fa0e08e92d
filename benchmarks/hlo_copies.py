"""Whole-array copies inside the compiled event loop, with the engine lines that cause them.

XLA updates an array in place (a scatter into the loop's carried state) only when nothing else
still reads the old contents; otherwise copy insertion copies the whole array first. Inside the
event loop such a copy costs O(array size) on every pass, which profiles show only as time
spread over "copy" kernels, and which grows with the request count when the array is per
request. This script compiles a case (the options of ``profile_engine.py``) and lists every
``copy`` instruction in a loop body, or in a fusion called there, whose result has at least
``--min-elements`` elements (default: lanes × requests), with the engine source lines of the
instructions that use the copy. A read of the old array next to an in-place update is the
usual cause; reading the value back from the updated array removes it (``stretch._apply``).

    python benchmarks/hlo_copies.py --anchor --requests 2000 --lanes 4
    python benchmarks/hlo_copies.py --pd --requests 300 --lanes 4
"""

from __future__ import annotations

import argparse
import collections
import re

import profile_engine  # splits the CPU for --cpu-devices before JAX starts

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([a-z][\w\-]*)\((.*)")
_FRAME = re.compile(r"stack_frame_id=(\d+)")


def _elements(shape: str) -> int:
    """Elements of an array shape such as ``s32[4,2001]{1,0}`` (0 for tuples)."""
    m = re.match(r"[a-z]+\d*\[([0-9,]*)\]", shape)
    if m is None:
        return 0
    count = 1
    for d in filter(None, m.group(1).split(",")):
        count *= int(d)
    return count


def loop_copies(text: str, min_elements: int) -> list[tuple[str, str, str]]:
    """(computation, copy name, shape) of the large copies outside the entry computation."""
    found, computation = [], ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith("{"):
            computation = line.split(" ")[0].lstrip("%")
            continue
        m = _INSTRUCTION.match(line)
        if m and m.group(3) == "copy" and not computation.startswith("ENTRY") \
                and _elements(m.group(2)) >= min_elements:
            found.append((computation, m.group(1), m.group(2)))
    return found


def engine_lines(text: str, names: set[str], stack) -> collections.Counter:
    """Engine source stacks (innermost 3 engine frames) of the instructions that read any of
    ``names`` or call any computation in ``names``."""
    out: collections.Counter = collections.Counter()
    refs = re.compile(r"%(" + "|".join(map(re.escape, names)) + r")\b")
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m or m.group(1) in names or not refs.search(m.group(4)):
            continue
        frame = _FRAME.search(line)
        if frame:
            frames = [f for f in stack(int(frame.group(1)))
                      if f[0] in profile_engine.ENGINE_FILES]
            out[" < ".join(f"{f[0]}:{f[1]}:{f[2]}" for f in frames[:3])] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    profile_engine.add_case_arguments(ap)
    ap.add_argument("--min-elements", type=int, default=None,
                    help="smallest copy listed (default: lanes x requests)")
    args = ap.parse_args()
    case = profile_engine.compile_case(args)
    module = case.compiled.runtime_executable().hlo_modules()[0]
    text = module.to_string()
    stack = profile_engine.stack_resolver(module.as_serialized_hlo_module_proto())
    smallest = args.min_elements or args.lanes * args.requests
    copies = loop_copies(text, smallest)
    print(f"{len(copies)} copies of >= {smallest} elements inside loops")
    for computation, name, shape in copies:
        print(f"  {name} {shape} in {computation}")
    if copies:
        users = engine_lines(text, {n for _, n, _ in copies} | {c for c, _, _ in copies}, stack)
        print("used or called by:")
        for where, count in users.most_common():
            print(f"  {count:4d}  {where}")


if __name__ == "__main__":
    main()
