"""Go's ``math/rand`` (v1) source inside the program: the lane's copy of BLIS's "router" stream.

Counterpart: ``blisjax.gorand.GoRand`` (``uint64``, ``int31`` and ``intn`` for bounds below
2**31, the only draws routing makes). The 607 state words are seeded on the host
(``blisjax.gorand``) and carried per lane in ``SimState``; a draw moves ``tap`` and ``feed`` one
word down (cyclically) and stores ``words[feed] += words[tap]`` (mod 2**64, which int64 addition
gives in XLA). A lane's stream advances only where its draw is ``active``, so each lane sees the
same draws as an independent reference run.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from blisjax.engine.lockstep import lane_while, upd
from blisjax.gorand import STATE_WORDS

_MASK63 = (1 << 63) - 1
_INT31_SPAN = 1 << 31


class GoSource(NamedTuple):
    """A Go ``rngSource``: ``words`` int64 [607], ``tap`` and ``feed`` int32 indices."""

    words: jax.Array
    tap: jax.Array
    feed: jax.Array


def _int31(src: GoSource, active) -> tuple[GoSource, jax.Array]:
    """Go ``Int31`` (the top 31 bits of ``Int63``) as int64, and the source after it; the
    source is unchanged where not ``active``."""
    tap = jnp.where(src.tap == 0, STATE_WORDS - 1, src.tap - 1)
    feed = jnp.where(src.feed == 0, STATE_WORDS - 1, src.feed - 1)
    value = src.words[feed] + src.words[tap]  # wraps modulo 2**64, as Go's uint64 sum
    words = upd(src.words, feed, value, active)
    out = GoSource(words, jnp.where(active, tap, src.tap), jnp.where(active, feed, src.feed))
    return out, (value & _MASK63) >> 32


def intn(src: GoSource, n, active) -> tuple[GoSource, jax.Array]:
    """Go ``Intn(n)`` for 1 <= n < 2**31 (through ``Int31n``): a power of two masks one
    ``Int31``; any other bound redraws while the value exceeds ``2**31 − 1 − (2**31 mod n)``
    and takes the remainder. Returns (source, int32 draw); nothing is drawn where not
    ``active`` (the draw is then 0)."""
    n = jnp.maximum(n.astype(jnp.int64), 1)
    power_of_two = (n & (n - 1)) == 0
    accept_max = (_INT31_SPAN - 1) - _INT31_SPAN % n
    src, value = _int31(src, active)

    def rejected(carry):
        return active & ~power_of_two & (carry[1] > accept_max)

    def redraw(carry, go):
        again, v = _int31(carry[0], go)
        return again, jnp.where(go, v, carry[1])

    src, value = lane_while(rejected, redraw, (src, value))
    draw = jnp.where(power_of_two, value & (n - 1), value % n)
    return src, jnp.where(active, draw, 0).astype(jnp.int32)
