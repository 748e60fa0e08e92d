"""The constants of the programs' arithmetic, shared by both engines' evaluators
(``blisjax.reference.program`` and ``blisjax.engine.program``; docs/policy-programs.md,
Arithmetic)."""

from __future__ import annotations

import sys

#: The largest finite float64: results beyond it are clamped to it (or its negative).
MAX_FLOAT = sys.float_info.max
#: The smallest normal float64: smaller magnitudes are 0.0.
MIN_NORMAL = sys.float_info.min
#: log1p's reduction: u = m·2^e with m in [SQRT_HALF, 2·SQRT_HALF).
SQRT_HALF = 0.7071067811865476
LN2 = 0.6931471805599453
#: 1/(2k+1), k = 0 .. 11: the series of atanh, log(m) = 2·atanh((m-1)/(m+1)).
LOG_SERIES = tuple(1.0 / float(2 * k + 1) for k in range(12))
