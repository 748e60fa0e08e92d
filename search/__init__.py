"""Policy search on top of the blisjax JAX engine: search spaces over policy knobs, ask/tell
strategies (OpenAI-ES, CMA-ES, GA/NSGA-II, genetic programming over policy programs, random,
grid, any evosax 0.3 algorithm), objective
and constraint expressions over the metrics, robust multi-seed scoring, Pareto fronts,
checkpointed reproducible runs, policy export and plots.

Conventions: fitness is **maximised** everywhere; strategies work in the unit cube (one
coordinate per knob, see :mod:`search.space`); state is functional
(``state = s.init(seed)``, ``x, state = s.ask(state)``, ``state = s.tell(state, x, fitness)``).

Names are imported lazily (building the CLI parser must not import JAX).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SearchSpace": "search.space", "load_space": "search.space",
    "space_from_mapping": "search.space", "get_knob": "search.space",
    "compile_expression": "search.expr", "compile_constraint": "search.expr",
    "flatten_metrics": "search.expr",
    "Scoring": "search.objectives", "Robust": "search.objectives",
    "CandidateEval": "search.objectives", "score_candidate": "search.objectives",
    "non_dominated_sort": "search.pareto", "crowding_distance": "search.pareto",
    "pareto_front": "search.pareto",
    "CMAES": "search.strategies", "OpenES": "search.strategies",
    "GeneticAlgorithm": "search.strategies", "GeneticProgramming": "search.strategies",
    "RandomSearch": "search.strategies",
    "GridSweep": "search.strategies", "EvosaxStrategy": "search.strategies",
    "make_strategy": "search.strategies",
    "SimulationProblem": "search.evaluate",
    "LocalBackend": "search.backends", "RayBackend": "search.backends",
    "run_search": "search.runner",
    "prepare": "search.api", "execute": "search.api", "explain": "search.trace_candidate",
    "endpoint_picker_config": "search.llmd",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'search' has no attribute {name!r}")
