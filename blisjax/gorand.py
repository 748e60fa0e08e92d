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

BLIS's named streams: ``ForSubsystem(name)`` seeds the stream ``"workload"`` with the master seed
itself and every other name (``"router"``, ``"prefill-router"``, ``"decode-router"``,
``"autoscaler"``, ``"instance-loading"``, ...) with ``master XOR FNV-1a-64(name)``, the 64-bit hash
read as a two's-complement int64 (``blis_subsystem_seed``).

Units: draws are plain integers (or floats in [0, 1) for ``float64``); seeds are int64 values.
Go's int64/uint64 arithmetic is reproduced with Python integers masked to 64 bits. Expected
sequences for the tests come from a real Go toolchain (tests/data/gorand/).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple

from blisjax.workload.rng import fnv1a_64

__all__ = [
    "BLIS_WORKLOAD_STREAM",
    "GoRand",
    "GoSourceState",
    "blis_subsystem_rand",
    "blis_subsystem_seed",
    "go_rng_cooked",
]

STATE_WORDS = 607  # words of state of the lagged-Fibonacci source (Go's rngLen)
TAP_LAG = 273  # lag between the two words added at each step (Go's rngTap)
LEHMER_MODULUS = (1 << 31) - 1  # the prime 2**31 - 1; also Go's int32max
LEHMER_MULTIPLIER = 48271
ZERO_SEED_REPLACEMENT = 89482311  # seed used when seed mod (2**31 - 1) is 0
LEHMER_WARMUP_STEPS = 20  # Lehmer steps discarded before the first state word

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_TWO_POW_63 = float(1 << 63)

#: The one BLIS subsystem whose stream is seeded with the master seed unchanged.
BLIS_WORKLOAD_STREAM = "workload"

_COOKED_PATH = Path(__file__).with_name("data") / "go_rng_cooked.json"


@cache
def go_rng_cooked() -> tuple[int, ...]:
    """Go's ``rngCooked`` table: 607 int64 words (signed), in order.

    The file is data taken from Go's source tree (its ``provenance`` field says which release).
    """
    values = json.loads(_COOKED_PATH.read_text())["values"]
    if len(values) != STATE_WORDS:
        raise ValueError(f"{_COOKED_PATH}: expected {STATE_WORDS} values, found {len(values)}")
    return tuple(int(v) for v in values)


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
        self._feed = STATE_WORDS - TAP_LAG

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
