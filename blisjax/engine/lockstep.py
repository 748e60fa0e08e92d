"""Lockstep helpers: loops and masked updates for code that ``vmap`` runs over the lanes of a
population.

Every lane of a lockstep block runs the same program; a handler that only some lanes need is
run for all of them with an ``active`` mask and must leave the state unchanged where the mask
is False. The helpers here keep that cheap: loops whose trip count is the busiest lane's
(``lane_while``), one-shot handlers skipped when no lane needs them (``lane_once``,
``run_if``), programs of a few fixed vector widths of which only one runs (``by_width``),
masked single-element writes (``upd``, ``add``) and the data dependence XLA needs to update a
loop-carried array in place (``after_reads``). Nothing here is specific to the simulation; the
reference engine has no counterpart (it runs one configuration at a time).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

LANES = "lanes"  # the vmap axis name of a population


def lane_while(cond_fn, body_fn, init):
    """``while_loop`` for code vmapped over ``LANES``: runs while *any* lane's ``cond_fn`` holds
    and calls ``body_fn(carry, go)`` with this lane's ``go``; the body must leave the carry
    unchanged where ``go`` is False.

    A plain ``while_loop`` with a per-lane predicate under ``vmap`` selects between old and new
    values of its whole carry at every iteration — O(state size) per inner iteration. Reducing
    the predicate over the lane axis keeps each iteration O(what it touches). The lane's
    ``go`` and the reduced flag are carried, computed once per iteration at the end of the
    body: the loop's own condition then only reads a scalar (no kernel of its own), and
    ``cond_fn`` runs once per iteration, not once in the condition and again in the body.
    """
    def step(carry):
        inner, go, _ = carry
        inner = body_fn(inner, go)
        go = cond_fn(inner)
        return inner, go, _any_lane(go)

    go = cond_fn(init)
    return lax.while_loop(lambda carry: carry[2], step, (init, go, _any_lane(go)))[0]


def _any_lane(flag):
    """Whether ``flag`` holds in any lane (unbatched)."""
    return lax.pmax(flag.astype(jnp.int32), LANES) > 0


def lane_max(x):
    """Maximum of ``x`` over all lanes (unbatched)."""
    return lax.pmax(x, LANES)


def lane_once(active, handler, s):
    """``handler(s, active)`` run once if any lane is ``active``, skipped otherwise. A one-shot
    loop rather than a ``cond``: XLA updates a loop's carry in place, a ``cond`` may copy it
    (a ``lax.switch`` in place of ``by_width``'s loops copied the whole state at every call:
    docs/performance.md, Ideas tried and not kept)."""
    return run_if(_any_lane(active), lambda s: handler(s, active), s)


def run_if(flag, fn, s):
    """``fn(s)`` if the unbatched ``flag`` holds, else ``s`` (a one-shot loop, see
    ``lane_once``)."""
    def step(carry):
        return fn(carry[0]), jnp.asarray(False)

    return lax.while_loop(lambda carry: carry[1], step, (s, flag))[0]


def by_width(widths, need, active, program, carry):
    """``program(carry, go, w)`` at the narrowest width ``w`` of ``widths`` that is >= ``need``,
    a lockstep maximum (unbatched: ``lane_max``), so every lane takes the same program and
    only one runs. The program must leave the carry unchanged where ``go`` is False."""
    if len(widths) == 1:
        return program(carry, active, widths[0])
    anyone = _any_lane(active)  # one reduction for all widths
    for k, w in enumerate(widths):
        fits = need > (widths[k - 1] if k else -1)
        if k < len(widths) - 1:
            fits = fits & (need <= w)
        carry = run_if(anyone & fits, lambda cr, w=w: program(cr, active, w), carry)
    return carry


def upd(arr, idx, val, active):
    """``arr[idx] = val`` where ``active``; otherwise unchanged.

    With a scalar ``active`` an inactive write goes to an out-of-bounds row and is dropped: one
    scatter, no read of ``arr`` (a gather of the old value and a select cost XLA:CPU several
    times more under ``vmap``; docs/performance.md). A mask of another shape selects between
    the new and the old values element by element."""
    if jnp.ndim(active) == 0:
        head, rest = (idx[0], idx[1:]) if isinstance(idx, tuple) else (idx, ())
        return arr.at[(jnp.where(active, head, arr.shape[0]),) + rest].set(
            jnp.asarray(val).astype(arr.dtype), mode="drop")
    return arr.at[idx].set(jnp.where(active, val, arr[idx]))


def add(arr, idx, delta, active):
    """``arr[idx] += delta`` where ``active``; otherwise unchanged (``delta`` cast to
    ``arr``'s dtype)."""
    return arr.at[idx].add(jnp.where(active, delta, 0).astype(arr.dtype))


def after_reads(values, old):
    """``values``, made data-dependent on ``old`` (the same shape, or a scalar) without
    changing them (nor an array's dtype).

    XLA updates an array in place inside a loop only when every read of its old value is an
    ancestor of the update; a read that feeds only *other* arrays (here: a block's old hash
    slot, read to clear ``slot_block``) is unordered with the write, and XLA then copies the
    whole array at every iteration. ``old`` holds values >= -1, so the test never fires, but
    XLA cannot know that. (An optimization barrier does not order them; measured.)
    """
    out = jnp.where(old < -1, old, values)
    return out.astype(values.dtype) if hasattr(values, "dtype") else out
