"""JAX engine vs reference engine under KV pressure: steps that preempt in phase 1 and then go
on serving the requests after the one that needed room.

The JAX engine serves phase 1 in vectorized passes and takes a sequential, preempting step only
at each request whose blocks do not fit, then resumes the vectorized pass after it. These
workloads make that happen dozens of times (checked on the reference engine first, so the
test cannot pass by not exercising it), under both preemption policies, and every request's
timestamps must match the reference's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.reference import instance as ref_instance
from blisjax.reference import simulate as reference
from blisjax.workload import distribution_spec, generate_workload
from tests.reference.conftest import make_resolved


def _count_resumed(resolved, workload) -> int:
    """Phase-1 allocations that came after an eviction in the same step (reference engine)."""
    counts = {"resumed": 0}
    evicted_in_step = set()
    form_batch, preempt_for = (ref_instance.Instance._form_batch,
                               ref_instance.Instance._preempt_for_tokens)

    def form(self, now_us):
        evicted_in_step.discard(id(self))
        return form_batch(self, now_us)

    def preempt(self, req, n, cursor):
        if id(self) in evicted_in_step:
            counts["resumed"] += 1
        before = self.preemption_count
        out = preempt_for(self, req, n, cursor)
        if self.preemption_count > before:
            evicted_in_step.add(id(self))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_instance.Instance, "_form_batch", form)
        mp.setattr(ref_instance.Instance, "_preempt_for_tokens", preempt)
        reference(resolved, workload)
    return counts["resumed"]


@pytest.mark.parametrize("preemption", ["fcfs", "priority"])
def test_lanes_match_reference_when_steps_preempt_and_go_on(preemption):
    base = make_resolved(instances=2, block_size=16, kv_blocks=80, max_running=64,
                         max_tokens=512, preemption=preemption)
    spec = distribution_spec(150.0, 300, prompt_mean=256, prompt_std=128, output_mean=48,
                             output_std=16, prefix_tokens=64)
    workload = generate_workload(spec, seed=3)
    rng = np.random.default_rng(7)
    configs = []
    for _ in range(4):
        scorers = tuple(dataclasses.replace(sw, weight=float(rng.uniform(0.1, 3.0)))
                        for sw in base.config.policy.routing.scorers)
        routing = dataclasses.replace(base.config.policy.routing, policy="weighted",
                                      scorers=scorers)
        policy = dataclasses.replace(base.config.policy, routing=routing)
        configs.append(dataclasses.replace(base.config, policy=policy))
    assert _count_resumed(resolve_config(configs[0]), workload) >= 30
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    lanes = simulate_population(base, workload, params)
    for k, cfg in enumerate(configs):
        ref = reference(resolve_config(cfg), workload)
        assert int(np.sum(ref.preemption_count)) > 0
        assert first_divergence(ref, lanes[k]) is None, (k, first_divergence(ref, lanes[k]))
