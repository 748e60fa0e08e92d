"""The ask/tell interface shared by every strategy, and its pytree plumbing.

Conventions (all strategies, including wrapped evosax ones):

* **Maximisation**: ``tell`` takes fitness where *higher is better*; NaN counts as −inf.
  Strategies that minimise internally (CMA-ES, evosax) negate it.
* **Functional state**: ``state = strategy.init(seed_or_key)``;
  ``population, state = strategy.ask(state)``; ``state = strategy.tell(state, population,
  fitness)``. States are pytrees (NamedTuples of numpy arrays, or evosax's dataclasses) and are
  never mutated, so a state can be checkpointed and restored with :func:`state_leaves` /
  :func:`restore_state` and the run continues bit for bit. A leaf may be a numpy text array
  (the programs of ``search.strategies.gp``): its width is free, its shape fixed.
* **Pytrees**: a strategy is built from a *solution template* pytree (e.g. the search space's
  ``{knob: float}``); ``ask`` returns a population with the same structure and a leading axis
  of size ``population_size`` on every leaf; ``tell`` takes that population back unchanged.
* **Randomness**: ``init`` takes an int seed or a JAX PRNG key; our strategies draw generation
  ``g``'s numbers from ``numpy.random.default_rng([key words…, g, stream])``, so the state only
  needs the key words and the generation counter.
* **Fitness shape**: ``(P,)``; strategies with ``multi_objective = True`` also accept
  ``(P, M)`` (objectives, all maximised).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

# Strategy states are float64 (as the engine's): optax states must not depend on import order.
jax.config.update("jax_enable_x64", True)

__all__ = ["PyTreeCodec", "Strategy", "key_words", "restore_state", "rng_for", "sanitize_fitness",
           "state_leaves"]


@runtime_checkable
class Strategy(Protocol):
    """What the runner needs from a strategy (see the module docstring)."""

    population_size: int

    def init(self, key: Any) -> Any: ...

    def ask(self, state: Any) -> tuple[Any, Any]: ...

    def tell(self, state: Any, population: Any, fitness: Any) -> Any: ...


class PyTreeCodec:
    """Maps a population pytree (leading axis P) to a float64 matrix (P, d) and back.

    Leaves are flattened in ``jax.tree_util`` order (dict keys sorted), each leaf's trailing
    shape raveled in C order.
    """

    def __init__(self, template: Any) -> None:
        leaves, self.treedef = jax.tree_util.tree_flatten(template)
        self.shapes = [np.shape(leaf) for leaf in leaves]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = int(sum(self.sizes))
        self.center = self.ravel_one(template)

    def ravel_one(self, solution: Any) -> np.ndarray:
        """One solution → float64[d]."""
        leaves = jax.tree_util.tree_leaves(solution)
        return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in leaves]) \
            if leaves else np.zeros(0)

    def ravel(self, population: Any) -> np.ndarray:
        """Population pytree (leading axis P) → float64[P, d]."""
        leaves = jax.tree_util.tree_leaves(population)
        p = np.shape(leaves[0])[0]
        return np.concatenate([np.asarray(x, np.float64).reshape(p, -1) for x in leaves], axis=1)

    def unravel(self, matrix: np.ndarray) -> Any:
        """float64[P, d] → population pytree (leading axis P)."""
        matrix = np.asarray(matrix, np.float64)
        p = matrix.shape[0]
        out, start = [], 0
        for shape, size in zip(self.shapes, self.sizes, strict=True):
            out.append(matrix[:, start:start + size].reshape((p, *shape)).copy())
            start += size
        return jax.tree_util.tree_unflatten(self.treedef, out)


def key_words(key: Any) -> np.ndarray:
    """An int seed or a JAX PRNG key as a uint32 vector (the entropy of :func:`rng_for`)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise ValueError(f"seed must be >= 0, got {key}")
        value = int(key)
        words = []
        while True:
            words.append(value & 0xFFFFFFFF)
            value >>= 32
            if not value:
                break
        return np.array(words, dtype=np.uint32)
    arr = key
    if jax.dtypes.issubdtype(getattr(key, "dtype", np.float64), jax.dtypes.prng_key):
        arr = jax.random.key_data(key)
    arr = np.asarray(arr)
    if arr.dtype.kind not in "ui":
        raise ValueError(f"init takes an int seed or a JAX PRNG key, got {key!r}")
    return arr.astype(np.uint32).reshape(-1)


def rng_for(words: np.ndarray, generation: int, stream: int) -> np.random.Generator:
    """The generator of one (key, generation, stream): independent of every other triple."""
    entropy = [int(w) for w in np.asarray(words).reshape(-1)] + [int(generation), int(stream)]
    return np.random.default_rng(entropy)


def sanitize_fitness(fitness: Any, population_size: int | None = None,
                     allow_matrix: bool = False) -> np.ndarray:
    """float64 fitness with NaN → −inf; checks the shape ``(P,)`` (or ``(P, M)``)."""
    f = np.asarray(fitness, dtype=np.float64)
    ok = f.ndim == 1 or (allow_matrix and f.ndim == 2)
    if not ok or (population_size is not None and f.shape[0] != population_size):
        want = "(P,) or (P, M)" if allow_matrix else "(P,)"
        raise ValueError(f"fitness must have shape {want} with P = {population_size}, "
                         f"got {f.shape}")
    return np.where(np.isnan(f), -np.inf, f)


def state_leaves(state: Any) -> list[np.ndarray]:
    """The state's leaves as numpy arrays (what a checkpoint stores)."""
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]


def restore_state(template_state: Any, leaves: Sequence[np.ndarray]) -> Any:
    """A state with ``template_state``'s structure and the given leaves.

    ``template_state`` is any state of the same strategy (e.g. ``strategy.init(seed)``); each
    leaf must match its counterpart's shape and dtype, except that a text leaf (numpy dtype
    kind ``U``) may have any width.
    """
    tmpl, treedef = jax.tree_util.tree_flatten(template_state)
    if len(tmpl) != len(leaves):
        raise ValueError(f"checkpoint has {len(leaves)} state arrays, the strategy needs "
                         f"{len(tmpl)}")
    out = []
    for i, (t, leaf) in enumerate(zip(tmpl, leaves, strict=True)):
        leaf = np.asarray(leaf)
        if np.shape(t) == leaf.shape and np.asarray(t).dtype.kind == leaf.dtype.kind == "U":
            out.append(leaf.copy())
            continue
        if np.shape(t) != leaf.shape or np.asarray(t).dtype != leaf.dtype:
            raise ValueError(f"checkpoint state array {i}: shape/dtype {leaf.shape}/{leaf.dtype}"
                             f" != {np.shape(t)}/{np.asarray(t).dtype}")
        out.append(leaf.copy() if isinstance(t, np.ndarray) else _like(t, leaf))
    return jax.tree_util.tree_unflatten(treedef, out)


def _like(template_leaf: Any, leaf: np.ndarray) -> Any:
    """Restore a leaf with the template leaf's kind (numpy array or jax array)."""
    if isinstance(template_leaf, jax.Array):
        return jax.numpy.asarray(leaf, dtype=template_leaf.dtype)
    if isinstance(template_leaf, (float, int, bool, np.generic)):
        return leaf[()] if leaf.shape == () else leaf
    return leaf
