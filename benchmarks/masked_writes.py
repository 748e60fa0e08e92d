"""Cost of one masked write per lane under ``vmap``, in isolation: ``lockstep.upd`` against
the gather + select + scatter form, for one entry and for a whole row, and ``lockstep.add``
against a scatter-add to a dropped row.

Each lane of a ``vmap`` over ``--lanes`` lanes runs a ``fori_loop`` of ``--writes`` masked
writes (two of three active) into its own ``[4, 8192]`` int32 array; prints microseconds per
write (the loop's wall time / writes, best of ``--repeats`` calls after a warm-up) and checks
that both forms give the same array.

    python benchmarks/masked_writes.py
    python benchmarks/masked_writes.py --lanes 8 --writes 5000
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from blisjax.engine.lockstep import add, upd

ROWS, COLS = 4, 8192


def select_write(arr, idx, val, active):
    """The gather + select + scatter form of a masked write."""
    return arr.at[idx].set(jnp.where(active, val, arr[idx]))


def dropped_add(arr, idx, delta, active):
    """A masked scatter-add whose masked-off lanes add to a dropped row."""
    return arr.at[jnp.where(active, idx[0], arr.shape[0]), idx[1]].add(
        jnp.asarray(delta).astype(arr.dtype), mode="drop")


def _program(write, *, row: bool, writes: int):
    def lane(arr, seed):
        def body(t, a):
            i = (t * 7 + seed) % ROWS
            active = (t + seed) % 3 != 0
            if row:
                return write(a, i, jnp.full(COLS, t + seed, a.dtype), active)
            j = (t * 131 + seed * 17) % COLS
            return write(a, (i, j), (t + seed).astype(a.dtype), active)

        return lax.fori_loop(0, writes, body, arr)

    return jax.jit(jax.vmap(lane))


def _time(fn, args, repeats: int) -> tuple[float, np.ndarray]:
    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, np.asarray(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--writes", type=int, default=20000, help="writes per lane (rows: a tenth)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    arr = jnp.zeros((args.lanes, ROWS, COLS), jnp.int32)
    seeds = jnp.arange(args.lanes)
    cases = [("entry", False, select_write, upd), ("row", True, select_write, upd),
             ("add", False, add, dropped_add)]
    for name, row, base, new in cases:
        writes = args.writes // 10 if row else args.writes
        t_base, a = _time(_program(base, row=row, writes=writes), (arr, seeds), args.repeats)
        t_new, b = _time(_program(new, row=row, writes=writes), (arr, seeds), args.repeats)
        assert np.array_equal(a, b), name
        print(json.dumps({"case": name, "lanes": args.lanes, "writes": writes,
                          "base_us_per_write": round(t_base * 1e6 / writes, 3),
                          "new_us_per_write": round(t_new * 1e6 / writes, 3)}))


if __name__ == "__main__":
    main()
