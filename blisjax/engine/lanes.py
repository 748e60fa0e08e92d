"""Work done across the lanes of a lockstep block at once, on the stacked state (outside
``vmap``): every lane's queued releases (``kv.defer_release``) as one flat pass.

Counterpart: none of its own — the releases are ``KVCache.release`` calls that
``blisjax.reference.instance.Instance._finish`` makes one completion at a time, in this order.

Inside ``vmap`` a lane's releases run one per loop trip, as many trips as the busiest lane of
the block has completions, each as wide as the longest block table among the lanes; most of
that work is masked. Here the blocks to release, of all lanes, are laid end to end — lane by
lane, each lane's releases in queue order, each release's blocks last to first, exactly the
order in which the reference engine releases them — so the pass is as wide as the blocks
actually released (rounded up to one of a few widths).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from blisjax.engine import kvblocks
from blisjax.engine import kvcache as kv
from blisjax.engine.lockstep import LANES, run_if
from blisjax.engine.state import NIL, SimState
from blisjax.engine.vec import prefix_sum

_FLAT_WIDEST = 4096  # blocks per flat pass; a block of lanes releasing more takes the lane loop
# Blocks of fewer lanes release in place (``engine.run``): with few lanes there is little
# lockstep waste to save, and queueing costs a single lane time (docs/performance.md, What the
# engine does for speed).
FLAT_MIN_LANES = 8


def flat_widths(lanes: int, queue: int, max_blocks: int) -> tuple[int, ...]:
    """Widths of the flat release programs: 256, 384, 512, 768, … (two per doubling) up to
    what the lanes can release at most (``lanes × queue × max_blocks``) or ``_FLAT_WIDEST``,
    whichever is smaller. Masked positions cost nearly as much as live ones."""
    most = max(1, min(lanes * queue * max_blocks, _FLAT_WIDEST))
    widths, w = [], 256
    while w < most:
        widths += [x for x in (w, w * 3 // 2) if x < most]
        w *= 2
    return (*widths, most)


def release_queued(s: SimState, st) -> SimState:
    """Run every lane's queued releases and empty the queues (``s`` stacked over lanes).

    The flat pass is exact when no lane's free-list ring could need compaction on the way
    (``kvblocks.append_blocks``): bounded by the blocks each lane releases, not the ones it
    frees. Otherwise, or when the blocks exceed the widest program, the lanes run their own
    queues (``kv.flush_releases``)."""
    lanes, queue = s.kv.rel_slots.shape
    queued = jnp.arange(queue)[None, :] < s.kv.rel_count[:, None]  # [L, D]
    lane = jnp.arange(lanes)
    inst = s.kv.rel_inst
    slots = jnp.where(queued, s.kv.rel_slots, 0)
    held = jnp.where(queued, s.batch.blen[lane[:, None], inst[:, None], slots], 0)  # [L, D]
    per_lane = jnp.sum(held, axis=1)
    tail, head = s.kv.ftail[lane, inst], s.kv.fhead[lane, inst]
    ring_ok = jnp.all((tail - head + per_lane <= kvblocks.ring_size(st))
                      & (tail + per_lane <= kvblocks.KEY_LIMIT))
    total = jnp.sum(per_lane)
    widths = flat_widths(lanes, queue, st.shapes.max_blocks_per_request)
    flat = ring_ok & (total > 0) & (total <= widths[-1])  # nothing queued: no pass at all
    for k, w in enumerate(widths):
        fits = flat & (total > (widths[k - 1] if k else -1)) & (total <= w)
        s = run_if(fits, lambda s, w=w: _flat_release(s, st, slots, held, w), s)
    lane_loop = jax.vmap(lambda s: kv.flush_releases(s, st, jnp.asarray(True)),
                         axis_name=LANES)
    s = run_if(~flat & jnp.any(s.kv.rel_count > 0), lane_loop, s)
    return s.replace(kv=s.kv.replace(rel_count=jnp.zeros_like(s.kv.rel_count)))


def _flat(x, index, valid=None):
    """``x`` as one flat vector and ``index`` into it, out of bounds (dropped by scatters)
    where not ``valid``: one integer per position instead of a row of coordinates, so a
    gather or scatter over a stacked ``[L, I, K]`` array costs no index concatenation."""
    flat = x.reshape(-1)
    return flat, index if valid is None else jnp.where(valid, index, flat.shape[0])


def _flat_release(s: SimState, st, slots, held, width: int) -> SimState:
    """The queued releases of all lanes as one pass over ``width`` positions (>= the blocks
    held by the queued slots). Same result as running ``kv.release`` for each queued slot in
    queue order, lane by lane."""
    lanes, queue = slots.shape
    insts, b_slots = st.shapes.num_instances, st.slot_count
    k_blocks, mb = st.shapes.kv_blocks, st.shapes.max_blocks_per_request
    r_size = kvblocks.ring_size(st)
    n = held.reshape(-1)  # [L·D] blocks of each queued release, lane-major, queue order
    end = prefix_sum(n)
    start = end - n
    p = jnp.arange(width, dtype=jnp.int32)
    valid = p < end[-1]
    # release owning each position: the last one starting at or before it
    first = jnp.full(width, 0, jnp.int32).at[jnp.where(n > 0, start, width)].set(
        jnp.arange(n.shape[0], dtype=jnp.int32), mode="drop")
    owner = lax.cummax(first)
    lane = owner // queue
    # (lane, instance) as one row index; int64, as the flat arrays may pass 2^31 entries
    row = lane.astype(jnp.int64) * insts + s.kv.rel_inst[lane]
    sb = slots.reshape(-1)[owner]
    pos = n[owner] - 1 - (p - start[owner])  # last block first
    bt, at = _flat(s.batch.bt, (row * b_slots + sb) * mb + jnp.clip(pos, 0, mb - 1))
    b = jnp.where(valid, bt[at], 0)
    kv_ref, at = _flat(s.kv.kv_ref, row * k_blocks + b, valid)
    kv_ref = kv_ref.at[at].add(-1, mode="drop")
    # a block's entry goes to the tail at its last release (fkey is -1 while a block is in use)
    fkey = s.kv.fkey.reshape(-1).at[at].max(p, mode="drop")
    last = valid & (fkey[at] == p)
    freed = last & (kv_ref[at] == 0)
    count = jnp.zeros(lanes, jnp.int32).at[jnp.where(freed, lane, lanes)].add(1, mode="drop")
    before = jnp.cumsum(count) - count  # freed blocks of the lanes before
    rank = jnp.cumsum(freed.astype(jnp.int32)) - 1 - before[lane]
    tail, at_tail = _flat(s.kv.ftail, row)
    key = tail[at_tail] + rank
    fifo, at_fifo = _flat(s.kv.fifo, row * r_size + key % r_size, freed)
    lanes_all, inst = jnp.arange(lanes), s.kv.rel_inst
    queued = jnp.arange(queue)[None, :] < s.kv.rel_count[:, None]
    rows = lanes_all.astype(jnp.int64) * insts + inst
    blen, at_blen = _flat(s.batch.blen, rows[:, None] * b_slots + slots, queued)
    shape = s.kv.kv_ref.shape
    return s.replace(batch=s.batch.replace(
                         blen=blen.at[at_blen].set(0, mode="drop").reshape(s.batch.blen.shape)),
                     kv=s.kv.replace(
                         kv_ref=kv_ref.reshape(shape),
                         fifo=fifo.at[at_fifo].set(b, mode="drop").reshape(s.kv.fifo.shape),
                         fkey=fkey.at[jnp.where(last, at, fkey.shape[0])].set(
            jnp.where(freed, key, NIL), mode="drop").reshape(shape),
                         ftail=s.kv.ftail.at[lanes_all, inst].add(count),
                         kv_free=s.kv.kv_free.at[lanes_all, inst].add(count)))
