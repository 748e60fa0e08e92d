"""Go's ``math/rand`` (v1) random stream, reproduced draw for draw, and BLIS's named streams.

BLIS draws its random numbers from Go ``rand.New(rand.NewSource(seed))`` generators, one per
subsystem (docs/semantics.md §8.6); reproducing a BLIS run exactly, for instance the random
routing tie-breaks of Decision 13, needs those very streams. This module is a pure-Python port of
the algorithms (not of Go's source text):

* **Source.** An additive lagged-Fibonacci generator over 607 words of 64 bits with lag 273:
  each step moves two indices, ``feed`` and ``tap``, one word down (cyclically) and stores
  ``vec[feed] += vec[tap]`` (mod 2**64), which is the step's output. ``feed`` starts 334 (= 607 −
  273) words ahead of ``tap``.
* **Seeding** (``NewSource(seed)``). ``seed mod (2**31 − 1)`` (a remainder 0 becomes 89482311)
  starts a Lehmer generator ``x ← 48271·x mod (2**31 − 1)``; after 20 discarded steps, word i of
  the state is three consecutive Lehmer values packed as ``x1<<40 ^ x2<<20 ^ x3`` (mod 2**64),
  XOR-ed with word i of Go's fixed ``rngCooked`` table (blisjax/data/go_rng_cooked.json).
* **Derived draws**, as Go's ``*rand.Rand`` computes them: ``Int63`` (the output with its top bit
  cleared), ``Uint64``, ``Int31``/``Uint32`` (high bits of ``Int63``), ``Int31n``/``Int63n``
  (masking for powers of two, otherwise rejection of the top partial block of values, then the
  remainder), ``Intn`` (``Int31n`` for bounds below 2**31, else ``Int63n``) and ``Float64``
  (``Int63 / 2**63``, redrawn when it rounds to 1.0).
* **Normal draws** (``NormFloat64``): Marsaglia & Tsang's ziggurat over 128 layers with Go's fixed
  tables ``kn`` (uint32), ``wn`` and ``fn`` (float32; blisjax/data/go_rng_normal.json). A
  ``Uint32`` read as a signed int32 ``j`` picks layer ``i = j & 127`` and the candidate
  ``x = j·wn[i]``, returned at once when ``|j| < kn[i]`` (about 97% of attempts). Otherwise layer 0
  samples the tail beyond r = 3.442619855899 by Marsaglia's exponential rejection (pairs of
  ``Float64`` draws u1, u2: ``x = −ln(u1)/r``, ``y = −ln(u2)`` until ``2y ≥ x²``) and returns
  ``±(r + x)`` with the sign of j; any other layer keeps x when a point drawn uniformly up the
  wedge, ``fn[i] + u·(fn[i−1] − fn[i])`` with u a ``Float64`` draw, lies under ``exp(−x²/2)``,
  all rounded and compared in float32, and else starts over with a new ``Uint32``.
* **Logarithm** (``go_log``). Go's ``math.Log`` is not correctly rounded, and tail draws return
  its value, so it is reproduced: ``x = 2**k·(1 + f)`` with ``1 + f`` in [√2/2, √2), then
  ``ln x = k·ln2 + 2s + s·R(s²)`` with ``s = f/(2 + f)`` and R a degree-7 minimax polynomial, ln2
  split into a high part (exact times any k) and a low part. The evaluation order is Go's (amd64
  runs the same operations in assembly), which C's ``log`` does not share: the two disagree in
  the last bit on about 7% of inputs. Go's ``math.Exp`` on amd64, a range-reduced Taylor series
  (with fused multiply-adds when the CPU has them, so even its last bit depends on the CPU),
  differs from C's ``exp`` too, but the wedge test only uses its value rounded to float32 and
  compared with a float32: C's ``exp`` gives the same decision unless the two straddle the
  midpoint between two float32 values, which none of a million arguments tried did.

BLIS's named streams: ``ForSubsystem(name)`` seeds the stream ``"workload"`` with the master seed
itself and every other name (``"router"``, ``"prefill-router"``, ``"decode-router"``,
``"autoscaler"``, ``"instance-loading"``, ...) with ``master XOR FNV-1a-64(name)``, the 64-bit hash
read as a two's-complement int64 (``blis_subsystem_seed``).

Units: draws are plain integers (or floats in [0, 1) for ``float64``, standard normal for
``norm_float64``); seeds are int64 values. Go's int64/uint64 arithmetic is reproduced with Python
integers masked to 64 bits; Go's float32 arithmetic by rounding each float64 result to float32,
which for one +, − or × of float32 operands gives the correctly rounded float32 result. Expected
sequences for the tests come from a real Go toolchain on amd64 (tests/data/gorand/); Go's
compiler fuses multiply-adds on arm64 and some other architectures (and on amd64 with
GOAMD64=v3), and there a tail or wedge draw of ``NormFloat64`` can come out differently.
"""

from __future__ import annotations

import json
import math
import struct
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import NamedTuple

from blisjax.limits import INT64_MAX
from blisjax.workload.rng import fnv1a_64

__all__ = [
    "BLIS_WORKLOAD_STREAM",
    "GoNormalTables",
    "GoRand",
    "GoSourceState",
    "blis_subsystem_rand",
    "blis_subsystem_seed",
    "go_log",
    "go_normal_tables",
    "go_rng_cooked",
]

STATE_WORDS = 607  # words of state of the lagged-Fibonacci source (Go's rngLen)
TAP_LAG = 273  # lag between the two words added at each step (Go's rngTap)
FEED_START = STATE_WORDS - TAP_LAG  # a seeded source's feed index (Go's rngFeed)
LEHMER_MODULUS = (1 << 31) - 1  # the prime 2**31 - 1; also Go's int32max
LEHMER_MULTIPLIER = 48271
ZERO_SEED_REPLACEMENT = 89482311  # seed used when seed mod (2**31 - 1) is 0
LEHMER_WARMUP_STEPS = 20  # Lehmer steps discarded before the first state word

INT64_MIN = -(1 << 63)
INT32_MAX = (1 << 31) - 1
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_TWO_POW_63 = float(1 << 63)
_TWO_POW_31 = 1 << 31
_TWO_POW_32 = 1 << 32

NORMAL_LAYERS = 128  # layers of the ziggurat; a draw's low 7 bits pick one
_LAYER_MASK = NORMAL_LAYERS - 1
# Go's rn, where the tail starts. Go folds 1/rn at compile time from the exact decimal, and only
# then rounds to float64; Fraction does the same.
NORMAL_TAIL_START = 3.442619855899
_INV_NORMAL_TAIL_START = float(1 / Fraction("3.442619855899"))

# Go's math.Log: ln 2 split so that k·_LN2_HI is exact for any float64 exponent k, the minimax
# coefficients of R(z) = _LOG_C1·z + _LOG_C2·z² + ... + _LOG_C7·z⁷ (exact binary values), and
# the reduction bound √2/2.
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_LOG_C1 = float.fromhex("0x1.5555555555593p-1")
_LOG_C2 = float.fromhex("0x1.999999997fa04p-2")
_LOG_C3 = float.fromhex("0x1.2492494229359p-2")
_LOG_C4 = float.fromhex("0x1.c71c51d8e78afp-3")
_LOG_C5 = float.fromhex("0x1.7466496cb03dep-3")
_LOG_C6 = float.fromhex("0x1.39a09d078c69fp-3")
_LOG_C7 = float.fromhex("0x1.2f112df3e5244p-3")
_HALF_SQRT2 = float.fromhex("0x1.6a09e667f3bcdp-1")

_FLOAT32 = struct.Struct("<f")
_UINT32 = struct.Struct("<I")
_FLOAT64 = struct.Struct("<d")
_FLOAT64_BITS = struct.Struct("<Q")
_FRACTION_FIELD = (1 << 52) - 1  # the 52 stored fraction bits of a float64
_HALF_BITS = _FLOAT64_BITS.unpack(_FLOAT64.pack(0.5))[0]  # sign 0, exponent of [0.5, 1)

#: The one BLIS subsystem whose stream is seeded with the master seed unchanged.
BLIS_WORKLOAD_STREAM = "workload"

_COOKED_PATH = Path(__file__).with_name("data") / "go_rng_cooked.json"
_NORMAL_PATH = Path(__file__).with_name("data") / "go_rng_normal.json"


@cache
def go_rng_cooked() -> tuple[int, ...]:
    """Go's ``rngCooked`` table: 607 int64 words (signed), in order.

    The file is data taken from Go's source tree (its ``provenance`` field says which release).
    """
    values = json.loads(_COOKED_PATH.read_text())["values"]
    if len(values) != STATE_WORDS:
        raise ValueError(f"{_COOKED_PATH}: expected {STATE_WORDS} values, found {len(values)}")
    return tuple(int(v) for v in values)


class GoNormalTables(NamedTuple):
    """Go's ziggurat tables for ``NormFloat64``, 128 entries each.

    ``kn``: uint32 thresholds (a draw ``j`` in layer i is accepted at once when ``|j| < kn[i]``);
    ``wn``: the float32 values that scale ``j`` to x (layer i's right edge over 2**31; for layer 0
    the base strip's area over the density at r, over 2**31); ``fn``: the float32 values of
    ``exp(−x²/2)`` at each layer's edge. Float32 values are held as the float64s equal to them.
    """

    kn: tuple[int, ...]
    wn: tuple[float, ...]
    fn: tuple[float, ...]


def _float32_from_bits(bits: int) -> float:
    """The float32 with IEEE-754 binary32 pattern ``bits``, as the (exactly equal) float64."""
    return _FLOAT32.unpack(_UINT32.pack(bits))[0]


@cache
def go_normal_tables() -> GoNormalTables:
    """Go's ``kn``, ``wn`` and ``fn`` tables (``NormFloat64``), from go_rng_normal.json.

    The file is data taken from Go's source tree (its ``provenance`` field says which release);
    it stores the float32 tables as bit patterns so no decimal rounding stands in between.
    """
    data = json.loads(_NORMAL_PATH.read_text())
    tables = GoNormalTables(
        kn=tuple(int(v) for v in data["kn"]),
        wn=tuple(_float32_from_bits(int(v)) for v in data["wn_float32_bits"]),
        fn=tuple(_float32_from_bits(int(v)) for v in data["fn_float32_bits"]),
    )
    for name, table in zip(GoNormalTables._fields, tables, strict=True):
        if len(table) != NORMAL_LAYERS:
            raise ValueError(
                f"{_NORMAL_PATH}: {name} must hold {NORMAL_LAYERS} values, found {len(table)}"
            )
    return tables


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even), as Go's ``float32(value)``."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


def go_log(x: float) -> float:
    """Go's ``math.Log(x)``, bit for bit as Go computes it on amd64.

    Special cases as Go: +Inf and NaN return x, a negative x NaN, ±0 −Inf; a subnormal x gets
    amd64 Go's value, not the logarithm (see below).
    """
    if math.isnan(x) or x == math.inf:
        return x
    if x < 0.0:
        return math.nan
    if x == 0.0:
        return -math.inf
    # Reduce to x = 2**k · f1 with f1 in [√2/2, √2), so that f = f1 − 1 is small. Go's amd64 code
    # takes f1 in [0.5, 1) and k straight from the bit fields: the same as frexp for normal x, but
    # a subnormal x (never a Float64 draw) is read as if it had exponent −1022, and Go returns
    # that value (about −709) there; so does this port.
    bits = _FLOAT64_BITS.unpack(_FLOAT64.pack(x))[0]
    f1 = _FLOAT64.unpack(_FLOAT64_BITS.pack(bits & _FRACTION_FIELD | _HALF_BITS))[0]
    k_int = (bits >> 52) - 1022  # exponent field less the bias of [0.5, 1); x > 0: no sign bit
    if f1 < _HALF_SQRT2:
        f1 *= 2.0
        k_int -= 1
    f = f1 - 1.0
    k = float(k_int)
    # ln(1 + f) = 2s + s·R(s²) with s = f / (2 + f). R's odd and even powers of s² are summed
    # as two chains in s⁴, in Go's order, because the rounding of each step decides the last bit.
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_LOG_C1 + s4 * (_LOG_C3 + s4 * (_LOG_C5 + s4 * _LOG_C7)))
    t2 = s4 * (_LOG_C2 + s4 * (_LOG_C4 + s4 * _LOG_C6))
    r = t1 + t2
    # As 2s = f − s·f, ln(1 + f) = f − (hfsq − s·(hfsq + R)) with hfsq = f²/2, so the largest
    # term, f, enters last and the small ones are rounded before they meet it.
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def _to_int64(value: int) -> int:
    """Two's-complement reading of the low 64 bits of ``value`` (Go's ``int64(uint64)``)."""
    value &= _MASK64
    return value - (1 << 64) if value > INT64_MAX else value


def _check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int when it is one in [low, high]; a ValueError naming ``name`` otherwise."""
    if type(value) is int and low <= value <= high:  # the common case, checked cheaply
        return value
    if isinstance(value, bool):  # an int subclass, but True as a seed or bound is a bug
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, int):
        # numpy integers are not int subclasses; they convert through __index__.
        try:
            value = value.__index__()  # type: ignore[union-attr]
        except AttributeError:
            raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _seeded_words(seed: int) -> list[int]:
    """The 607 state words (unsigned, < 2**64) that ``NewSource(seed)`` produces."""
    # Go reduces with a truncating remainder, then lifts a negative one into [0, 2**31 - 1).
    x = abs(seed) % LEHMER_MODULUS
    if seed < 0 and x != 0:
        x = LEHMER_MODULUS - x
    if x == 0:
        x = ZERO_SEED_REPLACEMENT
    # Go evaluates x·48271 mod (2**31 − 1) by Schrage's decomposition to stay inside int32; the
    # value is the same as the plain product's remainder, which Python computes exactly.
    for _ in range(LEHMER_WARMUP_STEPS):
        x = (x * LEHMER_MULTIPLIER) % LEHMER_MODULUS
    words = []
    for cooked in go_rng_cooked():
        x = (x * LEHMER_MULTIPLIER) % LEHMER_MODULUS
        word = x << 40
        x = (x * LEHMER_MULTIPLIER) % LEHMER_MODULUS
        word ^= x << 20
        x = (x * LEHMER_MULTIPLIER) % LEHMER_MODULUS
        word ^= x
        # x << 40 overflows int64 in Go; the mask keeps exactly the bits Go keeps.
        words.append((word ^ cooked) & _MASK64)
    return words


class GoSourceState(NamedTuple):
    """The complete state of a Go ``rngSource``.

    ``words``: 607 int64 values (signed, as Go stores them); ``tap`` and ``feed``: indices in
    [0, 607), each moved one down (cyclically) before a step uses them. A freshly seeded source
    has ``tap = 0`` and ``feed = 334``.
    """

    words: tuple[int, ...]
    tap: int
    feed: int


class GoRand:
    """A Go ``rand.New(rand.NewSource(seed))`` generator: same draws, in the same order.

    ``seed`` is an int64 in [-2**63, 2**63 - 1]. Methods are named after Go's in lower case
    (``Int63`` → ``int63``); bounded draws raise ValueError where Go would panic.
    """

    __slots__ = ("_words", "_tap", "_feed")

    def __init__(self, seed: int) -> None:
        seed = _check_int("seed", seed, INT64_MIN, INT64_MAX)
        self._words = _seeded_words(seed)
        self._tap = 0
        self._feed = FEED_START

    # -- state ------------------------------------------------------------------------------

    def state(self) -> GoSourceState:
        """A snapshot of the source state (for copying it into another engine)."""
        return GoSourceState(tuple(_to_int64(w) for w in self._words), self._tap, self._feed)

    @classmethod
    def from_state(cls, state: GoSourceState) -> GoRand:
        """A generator continuing from ``state`` (as returned by ``state()``)."""
        if len(state.words) != STATE_WORDS:
            raise ValueError(f"state.words must hold {STATE_WORDS} words, got {len(state.words)}")
        rand = cls.__new__(cls)
        rand._words = [
            _check_int("state.words[i]", w, INT64_MIN, INT64_MAX) & _MASK64 for w in state.words
        ]
        rand._tap = _check_int("state.tap", state.tap, 0, STATE_WORDS - 1)
        rand._feed = _check_int("state.feed", state.feed, 0, STATE_WORDS - 1)
        return rand

    def copy(self) -> GoRand:
        """An independent generator in the same state."""
        rand = GoRand.__new__(GoRand)
        rand._words = list(self._words)
        rand._tap = self._tap
        rand._feed = self._feed
        return rand

    # -- raw source -------------------------------------------------------------------------

    def uint64(self) -> int:
        """Go ``Uint64``: one step of the source, an integer in [0, 2**64)."""
        tap = self._tap - 1
        if tap < 0:
            tap += STATE_WORDS
        feed = self._feed - 1
        if feed < 0:
            feed += STATE_WORDS
        self._tap = tap
        self._feed = feed
        words = self._words
        value = (words[feed] + words[tap]) & _MASK64
        words[feed] = value
        return value

    def int63(self) -> int:
        """Go ``Int63``: one step of the source with the top bit cleared, in [0, 2**63)."""
        return self.uint64() & _MASK63

    # -- derived draws ----------------------------------------------------------------------

    def int31(self) -> int:
        """Go ``Int31``: the top 31 bits of ``int63()``, in [0, 2**31)."""
        return self.int63() >> 32

    def uint32(self) -> int:
        """Go ``Uint32``: the top 32 bits of ``int63()``, in [0, 2**32)."""
        return self.int63() >> 31

    def int63n(self, n: int) -> int:
        """Go ``Int63n``: an integer in [0, n) for n in [1, 2**63 - 1].

        Powers of two mask ``int63()``; other bounds reject draws above the largest multiple of
        n (minus one) that fits under 2**63, then take the remainder.
        """
        return self._int63n(_check_int("n", n, 1, INT64_MAX))

    def _int63n(self, n: int) -> int:
        """``int63n`` for an ``n`` already known to be in range."""
        if n & (n - 1) == 0:
            return self.int63() & (n - 1)
        accept_max = _MASK63 - (1 << 63) % n
        value = self.int63()
        while value > accept_max:
            value = self.int63()
        return value % n

    def int31n(self, n: int) -> int:
        """Go ``Int31n``: an integer in [0, n) for n in [1, 2**31 - 1].

        Go's v1 rule, built on ``int31()``: masking for powers of two, otherwise rejection of
        draws above ``2**31 - 1 - (2**31 mod n)``, then the remainder.
        """
        return self._int31n(_check_int("n", n, 1, INT32_MAX))

    def _int31n(self, n: int) -> int:
        """``int31n`` for an ``n`` already known to be in range."""
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        accept_max = INT32_MAX - (1 << 31) % n
        value = self.int31()
        while value > accept_max:
            value = self.int31()
        return value % n

    def intn(self, n: int) -> int:
        """Go ``Intn`` (64-bit ``int``): an integer in [0, n) for n in [1, 2**63 - 1].

        Bounds up to 2**31 - 1 go through ``int31n`` (one source step per accepted draw), larger
        ones through ``int63n``.
        """
        n = _check_int("n", n, 1, INT64_MAX)
        if n <= INT32_MAX:
            return self._int31n(n)
        return self._int63n(n)

    def float64(self) -> float:
        """Go ``Float64``: ``int63() / 2**63`` in [0, 1), redrawn when it rounds up to 1.0.

        ``float(int)`` rounds to nearest-even as Go's int64 → float64 conversion does; dividing
        by a power of two is exact.
        """
        while True:
            value = self.int63() / _TWO_POW_63
            if value != 1.0:
                return value

    def norm_float64(self) -> float:
        """Go ``NormFloat64``: a standard normal draw (the ziggurat, see the module docstring).

        Consumes one ``uint32()`` per attempt, plus one ``float64()`` for a wedge test or two per
        round of the tail's rejection loop, exactly as Go does, so later draws stay in step.
        """
        kn, wn, fn = go_normal_tables()
        while True:
            j = self.uint32()
            if j >= _TWO_POW_31:  # Go reads the 32 bits as a signed int32
                j -= _TWO_POW_32
            i = j & _LAYER_MASK  # two's-complement low bits, as Go's int32 & 0x7F
            # j (|j| <= 2**31) converts to float64 exactly; the product rounds once, as in Go.
            x = float(j) * wn[i]
            if abs(j) < kn[i]:
                return x
            if i == 0:
                # j == 0 was accepted above (kn[0] > 0), so j's sign is that of the tail.
                while True:
                    x = -go_log(self.float64()) * _INV_NORMAL_TAIL_START
                    y = -go_log(self.float64())
                    if y + y >= x * x:
                        break
                return NORMAL_TAIL_START + x if j > 0 else -NORMAL_TAIL_START - x
            # Go evaluates the wedge test in float32: every operation rounds to float32. C's exp
            # stands in for Go's, whose value only matters rounded to float32 (module docstring).
            u = _to_float32(self.float64())
            height = _to_float32(fn[i] + _to_float32(u * _to_float32(fn[i - 1] - fn[i])))
            if height < _to_float32(math.exp(-0.5 * x * x)):
                return x


def blis_subsystem_seed(master_seed: int, name: str) -> int:
    """The int64 seed of BLIS's stream ``name`` (``PartitionedRNG.ForSubsystem``).

    ``"workload"`` keeps ``master_seed``; any other name gets ``master_seed XOR
    int64(FNV-1a-64(UTF-8 bytes of name))``.
    """
    master_seed = _check_int("master_seed", master_seed, INT64_MIN, INT64_MAX)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {name!r}")
    if name == BLIS_WORKLOAD_STREAM:
        return master_seed
    return master_seed ^ _to_int64(fnv1a_64(name.encode("utf-8")))


def blis_subsystem_rand(master_seed: int, name: str) -> GoRand:
    """A fresh generator for BLIS's stream ``name`` under ``master_seed`` (see
    ``blis_subsystem_seed``). BLIS caches one per name, so its draws continue across calls; the
    caller keeps the returned object to do the same."""
    return GoRand(blis_subsystem_seed(master_seed, name))
