"""The JAX engine: fixed-shape cluster state, a jitted next-event kernel, vmapped populations.

Must reproduce the reference engine's per-request timestamps bit for bit (docs/semantics.md,
Bit parity between the two engines).

The modules, what each holds and its reference counterpart: docs/jax-engine.md, Layout (the
one table of them).

Glossary of the short names used throughout (arguments and locals):

* ``s``: the ``SimState`` of one lane (in ``lanes`` and ``run``: stacked over lanes).
* ``st``: the ``EngineStatic`` (shapes, capacities, fixed settings; hashable, compile-time).
* ``c``: the ``WorkloadConsts`` (per-request constants with a sink row at index N, float tables).
* ``p``: the lane's ``PolicyParams``.
* ``kv``: the ``kvcache`` module, imported under the name of the reference's ``Instance.kv``.
* ``i``: an instance index; ``i_star`` the instance of the next instance event.
* ``r``: a request index (row of the per-request arrays); ``reqs``: several. ``N``
  (``st.shapes.num_requests``) is the sink row masked writes go to; ``r_or_sink`` = r where the
  write applies, N elsewhere.
* ``sb``: a batch slot of an instance (``0 .. st.shapes.batch_slots - 1``); a slot holds one running
  request (``s.batch.slot_req``) and its block table (``s.batch.bt``, ``blen``). ``slots``:
  several.
* ``pos``: a running position, an index into ``s.batch.order[i, :n_run]`` (batch order);
  ``vpos`` the position of a preemption victim.
* ``k``: an offset from a wait queue's head, or a loop counter. ``e``: an entry of an
  instance's α-delay window (``s.window``). ``t``: a tenant. ``g``: a prefix group (in
  ``kvcache._grant_chunk``: a fresh block's index within the grant). ``j``: a block's index
  within a request's block table. ``b``: a KV block id of an instance. ``m``: a block count,
  or a block's index among one request's fresh blocks.
* ``pi``: a request's progress index (tokens processed; BLIS's ProgressIndex); ``l_in``,
  ``out``: its input and output token counts; ``nn``: tokens scheduled this step (``num_new``).
* ``now``, ``d``: the event's time and a step's duration (int64 µs); ``cm``, ``dc``: a step's
  prefill and decode token counts.
* ``active``, ``go``: per-lane masks — the handler's writes take effect only where they hold
  (``lockstep``); ``ok``: a pre-check or an allocation passed.
* ``w``, ``width``: a vector width of a fixed-width program (``lockstep.by_width``).
* ``ev``: the lane's ``cluster.NextEvent``; ``plan``: a step's one-pass completion plan
  (``completion.QueuedPlan``).
* Array dimensions in comments: N requests, I instances, T tenants, B batch slots,
  MB blocks per request, K KV blocks per instance, R = 2K free-list ring keys, Q wait-queue
  slots, E α-delay window entries, G prefix groups, Jg blocks per prefix group, S hash slots,
  D deferred releases, L lanes, W deadline window.
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
