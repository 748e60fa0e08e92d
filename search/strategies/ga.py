"""A simple real-coded genetic algorithm with (mu + lambda) survival; NSGA-II for several
objectives.

Each generation makes P children from the P parents: binary tournament-style selection of two
parents (the better of ``tournament`` random parents, each), uniform crossover with probability
``crossover_rate``, then Gaussian mutation of each gene with probability ``mutation_rate`` and
scale ``sigma``. Survival keeps the best P of parents + children (elitism for free, no
re-evaluation): by fitness for one objective, by NSGA-II (non-dominated rank, then crowding
distance) for a fitness matrix ``(P, M)``. The first generation is uniform in
``[init_low, init_high]`` on every coordinate.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from search.pareto import nsga2_order
from search.strategies.base import PyTreeCodec, key_words, rng_for, sanitize_fitness

__all__ = ["GAState", "GeneticAlgorithm"]


class GAState(NamedTuple):
    """parents: float64[P, d] best-first; parent_fitness: float64[P, M]; has_parents: bool[];
    generation: int64[]; key: uint32[k]."""

    parents: np.ndarray
    parent_fitness: np.ndarray
    has_parents: np.ndarray
    generation: np.ndarray
    key: np.ndarray


class GeneticAlgorithm:
    """Genetic algorithm over a solution pytree (see the module docstring).

    Args:
      template: solution pytree (fixes the structure; values unused).
      population_size: P >= 2.
      num_objectives: M; ``tell`` then takes fitness (P,) for M = 1 or (P, M).
      sigma: mutation scale; crossover_rate, mutation_rate: probabilities in [0, 1];
      tournament: candidates per selection (>= 1); init_low/init_high: first-generation box.
    """

    def __init__(self, template: Any, population_size: int, num_objectives: int = 1,
                 sigma: float = 0.1, crossover_rate: float = 0.9, mutation_rate: float = 1.0,
                 tournament: int = 2, init_low: float = 0.0, init_high: float = 1.0) -> None:
        if population_size < 2:
            raise ValueError(f"GA needs population_size >= 2, got {population_size}")
        if num_objectives < 1:
            raise ValueError(f"num_objectives must be >= 1, got {num_objectives}")
        self.codec = PyTreeCodec(template)
        self.population_size = int(population_size)
        self.num_objectives = int(num_objectives)
        self.multi_objective = self.num_objectives > 1
        self.sigma = float(sigma)
        self.crossover_rate = float(crossover_rate)
        self.mutation_rate = float(mutation_rate)
        self.tournament = int(tournament)
        self.init_low, self.init_high = float(init_low), float(init_high)

    def init(self, key: Any) -> GAState:
        p, d, m = self.population_size, self.codec.dim, self.num_objectives
        return GAState(parents=np.zeros((p, d)), parent_fitness=np.full((p, m), -np.inf),
                       has_parents=np.asarray(False), generation=np.asarray(0, np.int64),
                       key=key_words(key))

    def ask(self, state: GAState) -> tuple[Any, GAState]:
        """Uniform random first generation; afterwards selection, crossover and mutation."""
        rng = rng_for(state.key, int(state.generation), 0)
        p, d = self.population_size, self.codec.dim
        if not bool(state.has_parents):
            return self.codec.unravel(rng.uniform(self.init_low, self.init_high, (p, d))), state
        # parents are stored best-first, so the better of k picks is the smallest index
        picks = rng.integers(0, p, size=(2, p, self.tournament)).min(axis=2)
        a, b = state.parents[picks[0]], state.parents[picks[1]]
        cross = rng.random(p) < self.crossover_rate
        mask = (rng.random((p, d)) < 0.5) & cross[:, None]
        children = np.where(mask, b, a)
        mutate = rng.random((p, d)) < self.mutation_rate
        children = children + mutate * rng.standard_normal((p, d)) * self.sigma
        return self.codec.unravel(children), state

    def tell(self, state: GAState, population: Any, fitness: Any) -> GAState:
        """(mu + lambda) survival of the best P of parents and children."""
        f = sanitize_fitness(fitness, self.population_size, allow_matrix=True)
        f = f.reshape(self.population_size, -1)
        if f.shape[1] != self.num_objectives:
            raise ValueError(f"fitness has {f.shape[1]} objectives, the GA was built for "
                             f"{self.num_objectives}")
        x = self.codec.ravel(population)
        if bool(state.has_parents):
            x = np.concatenate([state.parents, x])
            f = np.concatenate([state.parent_fitness, f])
        if self.num_objectives == 1:
            order = np.argsort(-f[:, 0], kind="stable")
        else:
            order = nsga2_order(f)
        keep = order[: self.population_size]
        return GAState(parents=x[keep], parent_fitness=f[keep], has_parents=np.asarray(True),
                       generation=np.asarray(int(state.generation) + 1, np.int64),
                       key=state.key)

    def best(self, state: GAState) -> Any:
        """The best parent (first objective / first of the NSGA-II order) as a pytree."""
        return self.codec.unravel(state.parents[:1])
