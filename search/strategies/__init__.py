"""Strategies with an evosax-like ask/tell interface on pytrees (maximising fitness).

``state = strategy.init(seed_or_key)``; ``population, state = strategy.ask(state)``;
``state = strategy.tell(state, population, fitness)``. See :mod:`search.strategies.base`.
"""

from __future__ import annotations

from typing import Any

from search.strategies.base import (
    PyTreeCodec,
    Strategy,
    restore_state,
    state_leaves,
)
from search.strategies.cma import CMAES, CMAState
from search.strategies.evosax_adapter import EvosaxStrategy
from search.strategies.ga import GAState, GeneticAlgorithm
from search.strategies.gp import GeneticProgramming, GPState
from search.strategies.openes import OpenES, OpenESState, centered_ranks
from search.strategies.simple import GridSweep, RandomSearch

__all__ = ["CMAES", "CUBE_STRATEGIES", "STRATEGIES", "CMAState", "EvosaxStrategy", "GAState", "GPState",
           "GeneticAlgorithm", "GeneticProgramming", "GridSweep", "OpenES", "OpenESState", "PyTreeCodec", "RandomSearch", "Strategy",
           "centered_ranks", "make_strategy", "restore_state", "state_leaves"]

#: Names accepted by :func:`make_strategy` (and ``blisjax search --strategy``).
STRATEGIES = ("cma", "openes", "ga", "gp", "random")
#: The strategies over the unit cube alone: all but ``gp``, which also needs a program section.
CUBE_STRATEGIES = ("cma", "openes", "ga", "random")


def make_strategy(name: str, template: Any, population_size: int, *, num_objectives: int = 1,
                  sigma: float | None = None, learning_rate: float | None = None,
                  program: Any = None) -> Any:
    """A strategy over the unit cube around ``template`` with this package's defaults.

    ``sigma`` (default: cma 0.3, openes 0.1, ga 0.1, gp 0.1) is in unit-cube coordinates;
    ``learning_rate`` (openes, Adam) defaults to 0.05. ``num_objectives`` > 1 makes the GA
    an NSGA-II (the GP ranks by NSGA-II's order too); the other strategies get a scalarised
    fitness from the runner. ``gp`` needs ``program``, the space's program section
    (``search.space.ProgramSpec``: site, observables, operators, constants, max_nodes, seeds);
    ``template`` then holds the numeric knobs only.
    """
    if name == "cma":
        return CMAES(template, population_size, sigma=0.3 if sigma is None else sigma)
    if name == "openes":
        return OpenES(template, population_size, sigma=0.1 if sigma is None else sigma,
                      learning_rate=0.05 if learning_rate is None else learning_rate)
    if name == "ga":
        return GeneticAlgorithm(template, population_size, num_objectives=num_objectives,
                                sigma=0.1 if sigma is None else sigma)
    if name == "gp":
        if program is None:
            raise ValueError("strategy gp needs a program section (search.space.ProgramSpec)")
        return GeneticProgramming(program.site, population_size, template,
                                  observables=program.observables, operators=program.operators,
                                  constants=program.constants, max_nodes=program.max_nodes,
                                  seeds=program.seeds, num_objectives=num_objectives,
                                  sigma=0.1 if sigma is None else sigma)
    if name == "random":
        return RandomSearch(template, population_size)
    raise ValueError(f"strategy: must be one of {', '.join(STRATEGIES)}, got {name!r}")
