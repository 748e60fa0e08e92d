"""Ordered hash-slot writes (``kvblocks.apply_slot_ops``) against writing them one by one.

An allocation may write one hash slot several times (clear a reused block's old slot, then
register a fresh block, perhaps under the same slot), and the reference applies them in order.
``apply_slot_ops`` resolves a call's writes by their sequence numbers: pairwise for a call of
at most ``PAIRWISE_SLOT_OPS`` writes, by persistent stamps above that. Calls of both kinds run
one after another on one table here, with few slots so that writes collide, and each must leave
the table a plain loop in ``seq`` order leaves (the independent oracle)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

from blisjax.engine.kvblocks import PAIRWISE_SLOT_OPS, apply_slot_ops  # noqa: E402

SLOTS = 6  # hash slots (plus the sink)


class _KV(NamedTuple):
    slot_block: jax.Array
    slot_seq: jax.Array
    slot_clock: jax.Array

    def replace(self, **changes):
        return self._replace(**changes)


class _State(NamedTuple):
    kv: _KV

    def replace(self, **changes):
        return self._replace(**changes)


def _in_order(table, slots, values, seq, mask):
    out = table.copy()
    for k in np.argsort(seq, kind="stable"):
        if mask[k]:
            out[slots[k]] = values[k]
    return out


@pytest.mark.parametrize("sizes", [(8, 40, 64, 65), (65, 100, 8), (64, 65, 33, 2)])
def test_writes_land_as_if_applied_in_sequence_order(sizes):
    assert min(sizes) <= PAIRWISE_SLOT_OPS < max(sizes)  # both ways of resolving run
    rng = np.random.default_rng(sum(sizes))
    st = SimpleNamespace(hash_slots=SLOTS)
    s = _State(_KV(jnp.full(SLOTS + 1, -1, jnp.int32), jnp.full(SLOTS + 1, -1, jnp.int64),
                   jnp.int64(0)))
    expected = np.full(SLOTS, -1, np.int32)
    for n in sizes:
        slots = rng.integers(0, SLOTS, n).astype(np.int32)
        values = rng.integers(-1, 50, n).astype(np.int32)
        seq = rng.permutation(3 * n)[:n].astype(np.int32)  # distinct, not contiguous
        mask = rng.random(n) < 0.7
        s = apply_slot_ops(s, st, jnp.asarray(slots), jnp.asarray(values),
                           jnp.asarray(seq), jnp.asarray(mask))
        expected = _in_order(expected, slots, values, seq, mask)
        np.testing.assert_array_equal(np.asarray(s.kv.slot_block)[:SLOTS], expected)
