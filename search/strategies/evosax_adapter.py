"""Run an evosax (0.3.x) algorithm unchanged behind this package's ask/tell interface.

evosax 0.3 algorithms are built as ``Algo(population_size, solution)`` and used as
``state = algo.init(key, mean, params)`` (distribution-based) or
``algo.init(key, population, fitness, params)`` (population-based),
``population, state = algo.ask(key, state, params)`` and
``state, metrics = algo.tell(key, population, fitness, state, params)``; they *minimise*.

:class:`EvosaxStrategy` keeps the evosax state plus a PRNG key in its own state, splits the key
for every call, and negates fitness (this package maximises). Population-based algorithms need
an evaluated initial population: the adapter's first ``ask`` proposes a uniform sample in
``[init_low, init_high]`` and its first ``tell`` calls ``algo.init`` with it. Install with
``pip install blisjax[evosax]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from search.strategies.base import key_words, sanitize_fitness

__all__ = ["EvosaxState", "EvosaxStrategy"]


class EvosaxState(NamedTuple):
    """algo_state: the evosax state pytree; key: uint32[2] raw PRNG key; started: bool[]
    (population-based algorithms: initialised from an evaluated population)."""

    algo_state: Any
    key: Any
    started: Any


def _is_distribution_based(algo: Any) -> bool:
    from evosax.algorithms.distribution_based.base import DistributionBasedAlgorithm

    return isinstance(algo, DistributionBasedAlgorithm)


class EvosaxStrategy:
    """Adapter from an evosax algorithm to ``init/ask/tell`` with maximised fitness.

    Args:
      algorithm: an evosax algorithm instance, e.g. ``evosax.algorithms.CMA_ES(8, template)``.
      params: its params (default ``algorithm.default_params``).
      mean: initial mean pytree of distribution-based algorithms (default: the algorithm's
        ``solution`` template).
      init_low, init_high: box of the first population of population-based algorithms.
    """

    multi_objective = False

    def __init__(self, algorithm: Any, params: Any = None, mean: Any = None,
                 init_low: float = 0.0, init_high: float = 1.0) -> None:
        self.algorithm = algorithm
        self.params = algorithm.default_params if params is None else params
        self.population_size = int(algorithm.population_size)
        self.distribution_based = _is_distribution_based(algorithm)
        self.mean0 = algorithm.solution if mean is None else mean
        self.init_low, self.init_high = float(init_low), float(init_high)
        flat, self._unravel = ravel_pytree(algorithm.solution)
        self._dim, self._dtype = int(flat.size), flat.dtype

    def _initial_population(self, key: Any) -> Any:
        flat = jax.random.uniform(key, (self.population_size, self._dim), minval=self.init_low,
                                  maxval=self.init_high, dtype=self._dtype)
        return jax.vmap(self._unravel)(flat)

    def init(self, key: Any) -> EvosaxState:
        words = key_words(key)
        seed = int(words[0]) | (int(words[1]) << 32 if words.size > 1 else 0)
        raw = jax.random.PRNGKey(seed)
        raw, sub = jax.random.split(raw)
        if self.distribution_based:
            algo_state = self.algorithm.init(sub, self.mean0, self.params)
        else:  # structure only; replaced by the first tell
            pop = self._initial_population(sub)
            algo_state = self.algorithm.init(sub, pop, jnp.zeros(self.population_size),
                                             self.params)
        return EvosaxState(algo_state, raw, np.asarray(self.distribution_based))

    def ask(self, state: EvosaxState) -> tuple[Any, EvosaxState]:
        key, sub = jax.random.split(jnp.asarray(state.key))
        if not bool(state.started):
            population = self._initial_population(sub)
            return population, EvosaxState(state.algo_state, key, state.started)
        population, algo_state = self.algorithm.ask(sub, state.algo_state, self.params)
        return population, EvosaxState(algo_state, key, state.started)

    def tell(self, state: EvosaxState, population: Any, fitness: Any) -> EvosaxState:
        f = jnp.asarray(-sanitize_fitness(fitness, self.population_size))
        key, sub = jax.random.split(jnp.asarray(state.key))
        population = jax.tree_util.tree_map(jnp.asarray, population)
        if not bool(state.started):
            algo_state = self.algorithm.init(sub, population, f, self.params)
            return EvosaxState(algo_state, key, np.asarray(True))
        algo_state, _ = self.algorithm.tell(sub, population, f, state.algo_state, self.params)
        return EvosaxState(algo_state, key, state.started)
