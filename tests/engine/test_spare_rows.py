"""Request rows as a capacity: a program built for N requests runs a workload of fewer, its
spare rows never arriving (``consts.WorkloadConsts.rows``), and gives the run of that
workload's own program request by request — the reference engine's. One compiled program
serves hand cases of different sizes and horizons (``build_static_shared``)."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.consts import build_consts
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.reference import simulate as reference
from tests.engine.conftest import edge_engine
from tests.engine.test_parity_sessions import random_session_workload
from tests.reference.conftest import make_resolved, make_workload

# three hand cases of one configuration: a burst on one instance's worth of KV, a lone long
# request, and a trickle whose last arrival is past a short horizon
CASES = (
    [dict(arrival=k * 10, input=40 + 8 * k, output=6 + k % 3) for k in range(9)],
    [dict(arrival=0, input=300, output=20)],
    [dict(arrival=k * 4_000, input=24, output=30, deadline=9_000 if k == 2 else 0)
     for k in range(5)],
)


def _resolved(horizon_us: int):
    return make_resolved(instances=2, block_size=8, kv_blocks=60, max_running=4,
                         max_tokens=128, horizon_us=horizon_us)


def test_hand_cases_of_other_sizes_and_horizons_share_one_program():
    workloads = [make_workload(rows) for rows in CASES]
    base = _resolved(2**63 - 1)
    static = build_static_shared(base, workloads)
    assert static.shapes.num_requests == 9 and static.shapes.batch_slots == 4
    cfg = base.config
    lanes = [cfg, dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, routing=dataclasses.replace(cfg.policy.routing, policy="least-loaded")))]
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    for horizon_us in (2**63 - 1, 10_000):
        for w in workloads:
            resolved = _resolved(horizon_us)
            got = simulate_population(resolved, w, params, static=static)
            for k, c in enumerate(lanes):
                want = reference(resolve_config(dataclasses.replace(c, horizon_us=horizon_us)),
                                 w)
                assert first_divergence(want, got[k]) is None, (horizon_us, w.num_requests, k)
                assert len(got[k].status) == w.num_requests
                assert got[k].horizon_us == horizon_us


def test_a_workload_of_more_requests_than_rows_is_refused():
    small = make_workload(CASES[1])
    static = build_static(_resolved(2**63 - 1), small)
    with pytest.raises(ValueError, match="1 request rows.*9 requests needs at most"):
        build_consts(_resolved(2**63 - 1), make_workload(CASES[0]), static)


def test_closed_loop_sessions_fill_their_rows_exactly():
    """Follow-up rows come after the initial ones (``Shapes.initial_requests``): a sessions
    workload never runs on spare rows, and workloads of other sizes do not share a program."""
    resolved, w = edge_engine(2), random_session_workload(0)
    static = build_static(resolved, w)
    with pytest.raises(ValueError, match="needs exactly that many"):
        build_consts(resolved, w, static.replace(num_requests=static.shapes.num_requests + 1))
