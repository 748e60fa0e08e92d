"""Partitioned random streams: one independent numpy ``Generator`` per named subsystem.

BLIS gives every subsystem its own Go ``math/rand`` source seeded with ``seed XOR FNV-1a-64(name)``
so that drawing in one subsystem never shifts another (docs/semantics.md §8.6, §11 BC-10).
blisjax keeps the idea but not Go's generator (docs/semantics.md Decision 10: statistical parity only).

Derivation of the stream for a name path ``(n_1, ..., n_k)`` under master seed ``s``::

    key_i   = FNV-1a-64(UTF-8 bytes of str(n_i))          # one 64-bit word per path component
    seq     = numpy.random.SeedSequence(entropy=s mod 2**64, spawn_key=(key_1, ..., key_k))
    stream  = numpy.random.Generator(numpy.random.PCG64(seq))

``SeedSequence`` hashes the entropy and the spawn key together into the PCG64 state, so the stream
depends only on ``(s, names)``: never on which other streams exist or the order they were created
or drawn from. Components are hashed one by one, so ``("a", "b")`` and ``("a/b",)`` differ; an
integer component is hashed through ``str``, so ``0`` and ``"0"`` name the same stream.
"""

from __future__ import annotations

import numpy as np

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1

#: Seed used when neither the caller nor the workload spec gives one (BLIS CLI ``--seed`` default).
DEFAULT_SEED = 42


def fnv1a_64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data`` as an unsigned int in [0, 2**64)."""
    h = _FNV64_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV64_PRIME) & _MASK64
    return h


def _component_key(name: str | int) -> int:
    # bool is an int subclass; "True" as a stream name is almost surely a bug.
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        raise TypeError(f"stream name components must be str or int, got {name!r}")
    return fnv1a_64(str(name).encode("utf-8"))


class PartitionedRNG:
    """Named, mutually independent random streams derived from one master seed.

    ``stream(*names)`` returns the same ``Generator`` object on every call with the same names
    (like BLIS ``ForSubsystem``), so consecutive calls continue one sequence. Use
    ``seed_sequence(*names)`` to build a fresh, independent copy of a stream.
    """

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.seed = int(seed)
        self._streams: dict[tuple[str, ...], np.random.Generator] = {}

    def seed_sequence(self, *names: str | int) -> np.random.SeedSequence:
        """The ``SeedSequence`` of a name path (see the module docstring for the derivation)."""
        if not names:
            raise ValueError("a stream needs at least one name")
        key = tuple(_component_key(n) for n in names)
        return np.random.SeedSequence(entropy=self.seed & _MASK64, spawn_key=key)

    def stream(self, *names: str | int) -> np.random.Generator:
        """The (cached) generator of a name path, e.g. ``stream("workload", 3, "arrival")``."""
        seq = self.seed_sequence(*names)  # validates the names
        key = tuple(str(n) for n in names)
        gen = self._streams.get(key)
        if gen is None:
            gen = np.random.Generator(np.random.PCG64(seq))
            self._streams[key] = gen
        return gen
