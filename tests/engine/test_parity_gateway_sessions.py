"""The gateway queue with closed-loop sessions (docs/semantics.md §5.12, §8.5): follow-ups are
admitted and held at the gateway like any request and routed in dispatch order; a follow-up
turned away ends its session. Random policies and random gateways over two
session workloads (accumulating and not), each lane of one JAX program equal to its own
reference run."""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.config import resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static_shared
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from tests.engine.conftest import edge_engine, room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.engine.test_parity_gateway import random_gateways
from tests.engine.test_parity_sessions import random_session_workload


def test_gateway_with_sessions_matches_reference():
    room_for_a_program()
    edge = edge_engine(instances=3).config
    edge = dataclasses.replace(edge, engine=dataclasses.replace(edge.engine, max_model_len=80))
    workloads = (random_session_workload(1), random_session_workload(2, accumulate=False))
    policies = _random_policy_configs(edge, workloads[0].tenant_names, 8,
                                      seed=7)
    configs = [dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, gateway=gw)) for cfg, (gw, _) in zip(policies, random_gateways(8, seed=5),
                                                           strict=True)]
    base = resolve_config(configs[0])
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, list(workloads)).replace(cache_scorers=True)
    assert static.features.gateway and static.features.sessions
    follow_ups_rejected = 0
    for w in workloads:
        lanes = simulate_population(base, w, params, static=static)
        for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
            want = reference(dataclasses.replace(base, config=cfg), w)
            assert first_divergence(want, got, w.request_id) is None, (k, w.session_accumulate)
            assert got.gateway == want.gateway, k
            follow_ups_rejected += int(np.sum(np.asarray(want.status)[w.follow_up]
                                              == records.REJECTED))
    assert follow_ups_rejected > 0  # follow-ups turned away (admission or a full queue)
