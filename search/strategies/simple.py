"""Random search and grid sweep: strategies that ignore fitness when proposing candidates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from search.strategies.base import PyTreeCodec, key_words, rng_for, sanitize_fitness

__all__ = ["GridState", "GridSweep", "RandomSearch", "RandomState"]


class RandomState(NamedTuple):
    """generation: int64[]; key: uint32[k]."""

    generation: np.ndarray
    key: np.ndarray


class RandomSearch:
    """Independent uniform samples in ``[low, high]`` on every coordinate (default the unit
    cube). Accepts fitness (P,) or (P, M); it never uses it."""

    multi_objective = True

    def __init__(self, template: Any, population_size: int, low: float = 0.0,
                 high: float = 1.0) -> None:
        if population_size < 1:
            raise ValueError(f"population_size must be >= 1, got {population_size}")
        self.codec = PyTreeCodec(template)
        self.population_size = int(population_size)
        self.low, self.high = float(low), float(high)

    def init(self, key: Any) -> RandomState:
        return RandomState(np.asarray(0, np.int64), key_words(key))

    def ask(self, state: RandomState) -> tuple[Any, RandomState]:
        rng = rng_for(state.key, int(state.generation), 0)
        x = rng.uniform(self.low, self.high, (self.population_size, self.codec.dim))
        return self.codec.unravel(x), state

    def tell(self, state: RandomState, population: Any, fitness: Any) -> RandomState:
        sanitize_fitness(fitness, self.population_size, allow_matrix=True)
        return RandomState(np.asarray(int(state.generation) + 1, np.int64), state.key)


class GridState(NamedTuple):
    """generation: int64[] = number of chunks already told."""

    generation: np.ndarray


class GridSweep:
    """Every point of a fixed list, ``population_size`` at a time (the last chunk may be
    shorter). ``num_generations`` chunks cover the grid; asking past the end raises.

    Args:
      template: solution pytree.
      points: the grid as a population pytree (leading axis N) or a sequence of solutions.
      population_size: chunk size (lanes per evaluation).
    """

    multi_objective = True

    def __init__(self, template: Any, points: Any, population_size: int) -> None:
        self.codec = PyTreeCodec(template)
        if isinstance(points, Sequence) and not isinstance(points, np.ndarray):
            matrix = np.stack([self.codec.ravel_one(p) for p in points]) if points else \
                np.zeros((0, self.codec.dim))
        else:
            matrix = self.codec.ravel(points)
        if matrix.shape[0] == 0:
            raise ValueError("grid sweep needs at least one point")
        if population_size < 1:
            raise ValueError(f"population_size must be >= 1, got {population_size}")
        self.points = matrix
        self.population_size = int(population_size)
        self.num_generations = math.ceil(matrix.shape[0] / self.population_size)

    def init(self, key: Any = 0) -> GridState:
        """The key is ignored (a sweep has no randomness)."""
        return GridState(np.asarray(0, np.int64))

    def chunk(self, generation: int) -> np.ndarray:
        """Rows of ``points`` proposed at ``generation``."""
        start = generation * self.population_size
        if start >= self.points.shape[0]:
            raise IndexError(f"grid exhausted after {self.num_generations} generations")
        return self.points[start:start + self.population_size]

    def ask(self, state: GridState) -> tuple[Any, GridState]:
        return self.codec.unravel(self.chunk(int(state.generation))), state

    def tell(self, state: GridState, population: Any, fitness: Any) -> GridState:
        n = self.chunk(int(state.generation)).shape[0]
        sanitize_fitness(fitness, n, allow_matrix=True)
        return GridState(np.asarray(int(state.generation) + 1, np.int64))
