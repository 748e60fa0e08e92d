"""The CPU tier's LRU in the program (``engine.kvtier``) against the reference's ``CpuTier``:
mirror passes (with repeated keys, tiers that fill and thrash) and touches, key by key."""

from __future__ import annotations

from itertools import islice

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine import kvtier
from blisjax.engine.lockstep import LANES
from blisjax.reference.kvcache import CpuTier
from tests.engine.static_like import static_like

KEYS, WIDTH, RING = 40, 24, 64


def _tier(capacity: int):
    st = static_like(tiered=True, num_instances=2, cpu_keys=KEYS, cpu_ring=RING,
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


def _chained_pass(rng, width: int) -> list[int]:
    """A batch's mirror pass as the engine lists it: requests in order, each a prefix of one
    of a few shared chains and then keys of its own (distinct across the pass)."""
    chains = [list(range(c * 8, c * 8 + 8)) for c in range(3)]  # keys 0..23
    own = iter(range(24, KEYS))
    keys: list[int] = []
    while len(keys) < width:
        chain = chains[int(rng.integers(0, 3))]
        keys += chain[:int(rng.integers(1, 9))]
        keys += list(islice(own, int(rng.integers(0, 3))))
    return keys[:width]


@pytest.mark.parametrize("capacity", [1, 3, 8, 14, 30])
def test_mirror_passes_resolved_by_runs_match_the_reference_lru(capacity, monkeypatch):
    """Every exact pass resolved from its runs (``kvtier._stores_by_runs``): the per-access
    path is replaced by a wrong count, and ``RUN_WIDTH`` is one less than the pass width, so
    that every pass fits (at most as many runs as accesses) and takes the run path."""
    monkeypatch.setattr(kvtier, "RUN_WIDTH", WIDTH - 1)
    monkeypatch.setattr(kvtier, "_pass_stores", lambda *args: jnp.int32(-1000))
    mirror = _one_lane(lambda t, keys, valid: kvtier.mirror(t, 1, keys, valid,
                                                            jnp.asarray(True)))
    rng = np.random.default_rng(100 + capacity)
    cpu, t, stores = CpuTier(capacity), _tier(capacity), 0
    for step in range(80):
        n = int(rng.integers(0, WIDTH))  # at most WIDTH - 1 valid accesses
        if step % 2:
            keys = np.asarray(_chained_pass(rng, WIDTH))
        else:
            keys = rng.integers(0, int(rng.integers(2, KEYS)), WIDTH)
        holes = rng.random(WIDTH) < 0.15  # blocks not full or without a hash
        valid = np.zeros(WIDTH, bool)
        valid[np.flatnonzero(~holes)[:n]] = True
        stores += _reference_pass(cpu, keys[valid].tolist())
        t = mirror(t, jnp.asarray(keys, jnp.int32), jnp.asarray(valid))
        assert _order(t) == list(cpu.lru), step
        assert int(t.mirror_stores[1]) == stores, step
    assert int(t.evictions[1]) == cpu.evictions


@pytest.mark.parametrize("run_width", [2, 5])
def test_passes_with_more_runs_than_run_width_take_the_per_access_path(run_width,
                                                                        monkeypatch):
    """With a small ``RUN_WIDTH`` most exact passes have more runs and fall back to
    ``_pass_stores``; the tier still follows the reference's LRU key by key."""
    monkeypatch.setattr(kvtier, "RUN_WIDTH", run_width)
    mirror = _one_lane(lambda t, keys, valid: kvtier.mirror(t, 1, keys, valid,
                                                            jnp.asarray(True)))
    rng = np.random.default_rng(run_width)
    cpu, t, stores = CpuTier(6), _tier(6), 0
    for step in range(60):
        keys = np.asarray(_chained_pass(rng, WIDTH)) if step % 2 else rng.integers(0, 20, WIDTH)
        n = int(rng.integers(0, WIDTH + 1))
        stores += _reference_pass(cpu, keys[:n].tolist())
        t = mirror(t, jnp.asarray(keys, jnp.int32), jnp.arange(WIDTH) < n)
        assert _order(t) == list(cpu.lru), step
        assert int(t.mirror_stores[1]) == stores, step
