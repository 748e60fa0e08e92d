"""State updates inside the engine's loops stay in place in the compiled program.

XLA updates a loop-carried array in place only when every read of its old value is an
ancestor of the update (``lockstep.after_reads``); otherwise it copies the whole array at
every iteration. For a release that copy was twice the [lanes, instances, batch slots]
block-count array per completion, ~4 % of scenario S's wall time. These tests compile a loop
of releases (as a step's completion loop runs them), a loop of allocations and a loop of
evictions (as phase 1 preempts), and look for whole-array copies of per-slot, per-block or
per-request arrays inside the loop bodies of the optimized program.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp

from blisjax.engine import batch, kvcache
from blisjax.engine.consts import build_consts
from blisjax.engine.initial import init_state
from blisjax.engine.lockstep import LANES, lane_while
from blisjax.engine.params import params_from_config
from blisjax.engine.static import build_static
from tests.reference.conftest import make_resolved, make_workload

LANES_N, SLOTS, BLOCKS = 3, 24, 40  # distinct sizes, so array shapes are easy to tell apart


def _setup():
    resolved = make_resolved(instances=2, block_size=4, kv_blocks=BLOCKS, max_running=SLOTS)
    rows = [dict(input=30, output=10, group=0, prefix=16), dict(input=22, output=6)]
    w = make_workload(rows, ("",), ("g",))
    st = build_static(resolved, w)
    consts = build_consts(resolved, w, st)
    s = jax.vmap(functools.partial(init_state, st), in_axes=(0, 0, 0, None))(
        jnp.zeros(LANES_N), jnp.zeros(LANES_N), jnp.zeros(LANES_N, jnp.int32), 3)
    return st, consts, s, (resolved, w)


def _loop_copies(compiled_text: str, dims: tuple[int, ...]) -> list[str]:
    """Copies of arrays shaped [LANES_N, *dims] made directly in a while loop's body."""
    shape = ",".join(str(d) for d in (LANES_N, *dims))
    bodies = set(re.findall(r"body=(%[\w.\-]+)", compiled_text))
    found, in_body = [], False
    for line in compiled_text.splitlines():
        if line and not line.startswith(" "):
            in_body = line.split(" ")[0] in bodies
        elif in_body and re.search(rf"= \w+\[{shape}\]\S* copy\(", line):
            found.append(line.strip()[:160])
    return found


def _compile(st, s, lane):
    batched = jax.vmap(lane, in_axes=(0, None), axis_name=LANES)
    return jax.jit(batched).lower(s, jnp.int32(0)).compile().as_text()


def test_release_in_a_loop_updates_block_counts_in_place():
    st, _, s, _ = _setup()

    def lane(s, sb):
        def body(carry, go):
            s, k = carry
            return kvcache.release(s, st, 0, (sb + k) % SLOTS, go), k + go.astype(k.dtype)

        return lane_while(lambda c: c[1] < 3, body, (s, jnp.int32(0)))[0]

    text = _compile(st, s, lane)
    assert " while(" in text
    copies = _loop_copies(text, (st.shapes.num_instances, SLOTS)) \
        + _loop_copies(text, (st.shapes.num_instances, st.shapes.kv_blocks))
    assert copies == [], "\n".join(copies)


def test_allocation_in_a_loop_updates_hash_slots_in_place():
    st, consts, s, _ = _setup()
    empty = jnp.zeros(1, jnp.int32)

    def lane(s, sb):
        def body(carry, go):
            s, k = carry
            s = kvcache.allocate(s, st, consts, 0, sb, 0, start=4 * k, end=4 * k + 4, cached=empty,
                                 n_cached=0, active=go)
            return s, k + go.astype(k.dtype)

        return lane_while(lambda c: c[1] < 3, body, (s, jnp.int32(0)))[0]

    text = _compile(st, s, lane)
    assert " while(" in text
    assert _loop_copies(text, (st.shapes.num_instances, st.shapes.kv_blocks)) == []


def test_eviction_in_a_loop_updates_order_slots_and_grants_in_place():
    st, consts, s, (resolved, w) = _setup()
    p = params_from_config(resolved.config, w.tenant_names)

    def lane(s, vpos):
        def body(carry, go):
            s, budget, k = carry
            s, budget, _ = batch.evict(s, st, consts, p, 0, vpos, budget, go)
            return s, budget, k + go.astype(k.dtype)

        init = (s, jnp.int32(0), jnp.int32(0))
        return lane_while(lambda c: c[2] < 3, body, init)[0]

    text = _compile(st, s, lane)
    assert " while(" in text
    copies = _loop_copies(text, (st.shapes.num_instances, SLOTS)) \
        + _loop_copies(text, (st.shapes.num_requests + 1,))
    assert copies == [], "\n".join(copies)
