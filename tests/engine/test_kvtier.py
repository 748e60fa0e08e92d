"""The CPU tier's LRU in the program (``engine.kvtier``) against the reference's ``CpuTier``:
mirror passes (with repeated keys, tiers that fill and thrash) and touches, key by key."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine import kvtier
from blisjax.engine.lockstep import LANES
from blisjax.reference.kvcache import CpuTier

KEYS, WIDTH, RING = 40, 24, 64


def _tier(capacity: int):
    st = SimpleNamespace(tiered=True, num_instances=2, cpu_keys=KEYS, cpu_ring=RING,
                         kv_blocks=4, num_requests=1, request_rows=2, blis_quirks=False,
                         cpu_off_slots=1)
    return kvtier.init_tier(st, capacity)


def _one_lane(fn):
    """``fn`` run as a population of one lane (the lockstep helpers reduce over lanes)."""
    lanes = jax.vmap(fn, axis_name=LANES)
    add_axis = lambda x: jnp.expand_dims(x, 0)  # noqa: E731
    return jax.jit(lambda *args: jax.tree.map(lambda x: x[0],
                                              lanes(*jax.tree.map(add_axis, args))))


_mirror = _one_lane(lambda t, keys, valid: kvtier.mirror(t, 1, keys, valid, jnp.asarray(True)))
_touch = _one_lane(lambda t, key: kvtier.append(t, 1, jnp.reshape(key, (1,)),
                                                jnp.ones(1, bool)))


def _order(t) -> list[int]:
    """Instance 1's keys, oldest first."""
    where, ring = np.asarray(t.where), np.asarray(t.ring[1])
    out = []
    for pos in range(int(t.head[1]), int(t.tail[1])):
        k = int(ring[pos % RING])
        if k >= 0 and where[k] == pos:
            out.append(k)
    return out


def _reference_pass(cpu: CpuTier, keys) -> int:
    stores = 0
    for h in keys:
        if h in cpu:
            cpu.touch(h)
        elif cpu.store(h):
            stores += 1
    return stores


@pytest.mark.parametrize("capacity", [1, 3, 8, 30])
def test_mirror_passes_and_touches_match_the_reference_lru(capacity):
    rng = np.random.default_rng(capacity)
    cpu, t, stores = CpuTier(capacity), _tier(capacity), 0
    for _ in range(60):
        if rng.random() < 0.2 and cpu.lru:  # a reload's touch of a held key
            h = int(rng.choice(list(cpu.lru)))
            cpu.touch(h)
            t = _touch(t, jnp.int32(h))
        else:
            n = int(rng.integers(0, WIDTH + 1))
            pool = int(rng.integers(2, KEYS))
            keys = rng.integers(0, pool, WIDTH)
            stores += _reference_pass(cpu, keys[:n].tolist())
            t = _mirror(t, jnp.asarray(keys, jnp.int32), jnp.arange(WIDTH) < n)
        assert _order(t) == list(cpu.lru)
        assert int(t.size[1]) == len(cpu.lru)
    assert int(t.mirror_stores[1]) == stores
    assert int(t.evictions[1]) == cpu.evictions
    assert int(t.mirror_stores[0]) == 0 and _order_of(t, 0) == []


def _order_of(t, i):
    return [k for k in np.asarray(t.ring[i]).tolist() if k >= 0]
