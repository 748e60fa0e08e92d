"""The JAX engine: fixed-shape cluster state, a jitted next-event kernel, vmapped populations.

Must reproduce the reference engine's per-request timestamps bit for bit.
"""

from blisjax.engine.params import PolicyParams, params_from_config, stack_params
from blisjax.engine.population import (
    PopulationResult,
    evaluate_population,
    grid,
    random_knobs,
    set_knob,
)
from blisjax.engine.run import run_lanes, simulate, simulate_population

__all__ = ["PolicyParams", "PopulationResult", "evaluate_population", "grid",
           "params_from_config", "random_knobs", "run_lanes", "set_knob", "simulate",
           "simulate_population", "stack_params"]
