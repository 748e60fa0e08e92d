"""Randomized parity (slow tier): random workloads and engine configurations, each evaluated as
a population of random policies in one compiled call; every lane must equal its own reference
run. 20 scenarios × 16 lanes = 320 cases (half of them with the narrow step program). Run with
``python -m pytest -m slow``."""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.config import resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.reference import simulate as reference
from tests.engine.test_parity import _random_policy_configs
from tests.reference.conftest import make_resolved, make_workload


def random_rows(rng, n):
    rows, t, prefix = [], 0, int(rng.integers(8, 40))
    for _ in range(n):
        t += int(rng.choice([0, 0, int(rng.integers(1, 4000))]))
        group = int(rng.choice([-1, 0]))
        extra = int(rng.integers(1, 150))
        rows.append(dict(
            arrival=t, input=extra + (prefix if group == 0 else 0),
            output=int(rng.integers(0, 40)), group=group, prefix=prefix if group == 0 else 0,
            tenant=str(rng.choice(["a", "b"])), slo=str(rng.choice(["", "critical", "batch"])),
            deadline=int(t + rng.integers(500, 60_000)) if rng.random() < 0.3 else 0))
    return rows


def random_engine(rng):
    bs = int(rng.choice([4, 16]))
    return dict(
        instances=int(rng.integers(1, 4)), block_size=bs, kv_blocks=int(rng.integers(30, 90)),
        max_running=int(rng.integers(1, 9)), max_tokens=int(rng.choice([24, 64, 512])),
        threshold=int(rng.choice([0, 0, 20])), refresh_us=int(rng.choice([0, 3000])),
        alpha=(float(rng.choice([0.0, 95.5])), float(rng.choice([0.0, 1.25])),
               float(rng.choice([0.0, 21.7]))),
        beta=(float(rng.choice([700.0, 5752.705191348184])), float(rng.choice([4.5, 17.25])),
              float(rng.choice([55.0, 5.999143920128404]))),
        horizon_us=int(rng.choice([300_000, 2**63 - 1])),
        admission_latency_us=int(rng.choice([0, 0, 250])),
        routing_latency_us=int(rng.choice([0, 0, 400])))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_random_population_parity(seed):
    rng = np.random.default_rng(1000 + seed)
    w = make_workload(random_rows(rng, int(rng.integers(5, 40))), ("a", "b"), ("g",))
    engine = random_engine(rng)
    base = make_resolved(**engine)
    configs = _random_policy_configs(base.config, w.tenant_names, 16, seed)
    if any(c.engine.preemption_policy == "priority" for c in configs):
        # priority preemption can thrash forever; the horizon is shared by all lanes
        configs = [c.__class__(**{**c.__dict__, "horizon_us": 2_000_000}) for c in configs]
    base = resolve_config(configs[0])
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    # odd seeds: the narrowest step program has width 2, so with max_running > 2 steps switch
    # between programs of width 2, 4, ... up to the batch slots (instance.step_widths)
    lanes = simulate_population(base, w, params, **({"running_width": 2} if seed % 2 else {}))
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, lanes[k]) is None, (seed, k, cfg.policy, cfg.engine)
