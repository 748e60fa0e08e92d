"""Latency models on the host: the reference's own formulas, through a host callback.

Blackbox, roofline and physics step times (and physics queueing delays) are computed inside the
compiled program (``instance.step_duration``, ``blisjax.engine.roofline``,
``blisjax.engine.physics``). This module is the fallback for a configuration the program
cannot evaluate exactly (a roofline model that ``roofline.fits_the_program`` rejects), and for
comparisons: any roofline or physics model set as ``EngineStatic.features.latency`` runs here
(``benchmarks/bench_latency_models.py --host-roofline --host-physics``). The kernel hands its
inputs to the *same Python code* the reference engine calls (``jax.pure_callback``), once per
step for all lanes of a device, and gets integer microseconds back. Results are exact by
construction; the price is a host round trip per step (docs/latency-models.md), amortized only
over lanes, and such programs are not kept by the program cache.

Counterpart: the latency-model calls of ``blisjax.reference.instance.Instance._step`` and
``_execute`` (``step_time``) and of ``Instance._model_queueing_delay_us`` (``queueing_delay``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.engine.physics import StepInputs
from blisjax.latency.base import StepBatch

_STEP_OUT = (jax.ShapeDtypeStruct((), jnp.int64), jax.ShapeDtypeStruct((), jnp.float64))


def _lanes(*arrays):
    """Host arrays with a leading lane axis (``vmap_method="broadcast_all"``)."""
    arrays = [np.asarray(a) for a in arrays]
    lead = max((a.shape[0] for a in arrays if a.ndim), default=1)
    return [np.broadcast_to(a, (lead,) + a.shape[1:]) if a.ndim else np.full(lead, a)
            for a in arrays]


def step_time(model, active, x: StepInputs):
    """(duration µs >= 1, updated preemption EMA) of one step of the lanes where ``active``
    (``x``: the step, ``physics.StepInputs``; its EMA is read by physics models only)."""
    stateful = hasattr(model, "step_inputs")

    def host(active, nn, pi, l_in, out, cached, ema, n_pre, depth):
        active, nn, pi, l_in, out, cached, ema, n_pre, depth = _lanes(
            active, nn, pi, l_in, out, cached, ema, n_pre, depth)
        lanes = active.shape[0]
        d = np.zeros(lanes, np.int64)
        new_ema = np.array(ema, np.float64)
        for k in range(lanes):
            if not active[k]:
                continue
            on = nn[k] > 0
            batch = StepBatch(new_tokens=[int(x) for x in nn[k][on]],
                              progress_index=[int(x) for x in pi[k][on]],
                              input_tokens=[int(x) for x in l_in[k][on]],
                              output_tokens=[int(x) for x in out[k][on]])
            if stateful:  # the EMA step comes first, as in the reference's _step
                new_ema[k] = model.update_preemption_ema(float(ema[k]), int(n_pre[k]),
                                                         int(depth[k]))
                inputs = model.step_inputs(batch, float(new_ema[k]),
                                           prefix_cached_tokens=[int(x) for x in cached[k][on]])
                d[k] = max(1, model.step_time_us(inputs))
            else:
                d[k] = max(1, model.step_time_us(batch))
        return d, new_ema

    return jax.pure_callback(host, _STEP_OUT, active, *x, vmap_method="broadcast_all")


def queueing_delay(model, active, running_depth, waiting_depth, kv_used_blocks, prompt_tokens,
                   prefix_cached_blocks, ema):
    """Physics α delay (µs >= 0) of a request an instance receives, per lane."""
    from blisjax.latency.physics import PhysicsQueueInputs

    def host(active, run, wait, used, prompt, cached, ema):
        active, run, wait, used, prompt, cached, ema = _lanes(
            active, run, wait, used, prompt, cached, ema)
        out = np.zeros(active.shape[0], np.int64)
        for k in np.nonzero(active)[0]:
            inputs = PhysicsQueueInputs.from_state(
                model.config, running_depth=int(run[k]), waiting_depth=int(wait[k]),
                kv_used_blocks=int(used[k]), prompt_tokens=int(prompt[k]),
                prefix_cached_blocks=int(cached[k]), preemption_ema=float(ema[k]))
            out[k] = model.queueing_delay_us(inputs)
        return out

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.int64), active, running_depth,
                             waiting_depth, kv_used_blocks, prompt_tokens, prefix_cached_blocks,
                             ema, vmap_method="broadcast_all")
