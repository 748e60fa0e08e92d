"""How the reflection text shows numbers, durations, times and lists, and what it costs in tokens.

Units: trace times are µs; the text gives points in time in s since the run's start, durations in
ms (or s from 10 s up), KV use in %, sizes in tokens or KV blocks. Every number has a fixed
format, so the text is a function of its inputs only.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from blisjax.workload.types import SLO_CLASSES

_TOKEN_RE = re.compile(r"[A-Za-z]+|[0-9]+|\S")


def approx_tokens(text: str) -> int:
    """A deterministic estimate of the tokens an LLM tokenizer makes of ``text``.

    Rule: every maximal run of ASCII letters costs ceil(length / 8) tokens (an English word of
    up to eight letters is usually one BPE token), every maximal run of digits ceil(length / 3)
    (common BPE vocabularies group digits by three), every other non-whitespace character
    (punctuation, ``_``, symbols, non-ASCII letters such as µ) one; whitespace costs nothing.
    So ``"regret 6.25 ms"`` costs 1 + 1 + 1 + 1 + 1 = 5. No match spans a line break, so the
    estimate of lines joined by ``\\n`` is the sum of theirs.
    """
    total = 0
    for m in _TOKEN_RE.findall(text):
        c = m[0]
        if c.isascii() and c.isalpha():
            total += -(-len(m) // 8)
        elif c.isascii() and c.isdigit():
            total += -(-len(m) // 3)
        else:
            total += 1
    return total


def _num(x: float) -> str:
    """A number with about three significant digits, in fixed notation when it is large."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    a = abs(x)
    if x == int(x) and a < 1e6:  # whole numbers (scores, weights, targets) without ".0"
        return str(int(x))
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _ms(value_ms: float) -> str:
    """A duration given in ms: ms below 10 s, s from there."""
    return f"{value_ms / 1e3:.2f} s" if value_ms >= 10_000 else f"{_num(value_ms)} ms"


def _dur(us: int) -> str:
    """A duration given in µs."""
    return _ms(us / 1e3)


def _at(us: int) -> str:
    """A point in simulated time (µs) in s."""
    return f"{us / 1e6:.3f} s"


def _pct(fraction: float) -> str:
    return f"{100.0 * fraction:.1f}%"


def _class_name(code: int) -> str:
    return "default" if code == 0 or not 0 <= code < len(SLO_CLASSES) else SLO_CLASSES[code]


def _quantile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank quantile of an ascending sequence (0 when empty)."""
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _ids(values: Iterable[int], limit: int = 4) -> str:
    vals = list(values)
    more = f", … ({len(vals)} in all)" if len(vals) > limit else ""
    return ", ".join(str(v) for v in vals[:limit]) + more


def _per_instance(counts: Counter, limit: int = 6) -> str:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"inst {i} {n}" for i, n in ranked[:limit])
    return text + (f", … ({len(ranked)} instances)" if len(ranked) > limit else "")


def _spread(items: Sequence, n: int) -> list:
    """``n`` items spread evenly over ``items`` (first and last included), in order."""
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[0]]
    return [items[(len(items) - 1) * j // (n - 1)] for j in range(n)]
