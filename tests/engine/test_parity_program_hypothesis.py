"""Policy programs drawn by ``hypothesis`` on drawn workloads: every lane of a population of
routing, admission and priority programs equals its own reference run, request by request.

The workloads, engines and the one-program-per-test envelope are
``test_parity_hypothesis``'s; hypothesis draws each lane's three programs (trees over the
site's observables, parameters, edge constants and every operator), its tie-break, scheduler
and preemption order. The default tier runs a few examples; the slow tier (``-m slow``) runs
3 engines × 25 examples × 4 lanes.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blisjax.config import AdmissionConfig, PriorityConfig, RoutingConfig, resolve_config
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static, build_static_shared
from blisjax.program import MAX_PROGRAM_LENGTH, Node, to_text
from blisjax.program.bytecode import assemble
from blisjax.program.observables import SITES, visible_at
from blisjax.reference import simulate as reference
from tests.engine.test_parity_hypothesis import (
    _SETTINGS,
    ENGINES,
    HORIZON_US,
    LANES,
    TENANTS,
    _envelope,
    workloads,
)
from tests.program.random_programs import BINARY, CONSTANTS, UNARY
from tests.reference.conftest import make_resolved

PARAMS = {"w": 0.5, "k": 3.0}


def trees(site: str):
    """Expression trees of ``site``: observables, parameters and constants under every
    operator, ``if`` and ``clip``."""
    leaves = st.one_of(
        st.sampled_from(visible_at(site) + tuple(PARAMS)).map(lambda n: Node("name", name=n)),
        st.sampled_from(CONSTANTS).map(lambda v: Node("const", value=v)),
        st.floats(-1e3, 1e3).map(lambda v: Node("const", value=v)))

    def extend(sub):
        return st.one_of(
            st.tuples(st.sampled_from(BINARY), sub, sub).map(lambda t: Node(t[0], t[1:])),
            st.tuples(st.sampled_from(UNARY), sub).map(lambda t: Node(t[0], t[1:])),
            st.tuples(sub, sub, sub).map(lambda t: Node("if", t)),
            st.tuples(sub, sub, sub).map(lambda t: Node("clip", t)))

    return st.recursive(leaves, extend, max_leaves=12).filter(
        lambda n: len(assemble(n, PARAMS)) <= MAX_PROGRAM_LENGTH)


@st.composite
def program_policies(draw, base):
    """``base`` with drawn programs at every site (admission sometimes a template, so most
    lanes admit something) and a drawn tie-break, scheduler and preemption order."""
    text = {site: to_text(draw(trees(site), label=site)) for site in SITES}
    routing = RoutingConfig(policy="program", program=text["routing"], params=PARAMS,
                            tie_break=draw(st.sampled_from(["blis-random", "lowest-index"])))
    admission = AdmissionConfig(policy="program", program=text["admission"], params=PARAMS) \
        if draw(st.booleans()) else AdmissionConfig()
    priority = PriorityConfig(policy="program", program=text["priority"], params=PARAMS)
    scheduler = dataclasses.replace(base.policy.scheduler, policy=draw(
        st.sampled_from(["fcfs", "priority-fcfs"])))
    policy = dataclasses.replace(base.policy, routing=routing, admission=admission,
                                 priority=priority, scheduler=scheduler)
    engine = dataclasses.replace(base.engine, preemption_policy=draw(
        st.sampled_from(["fcfs", "priority"])))
    return dataclasses.replace(base, policy=policy, engine=engine)


def _check(engine: dict, data) -> None:
    base = make_resolved(horizon_us=HORIZON_US, **engine)
    static = build_static(base, _envelope(), decode_stretches=True).replace(cache_scorers=True,
                                                                            program_sites=SITES)
    w = data.draw(workloads(), label="workload")
    assert build_static_shared(base, [_envelope(), w],
                               decode_stretches=True).replace(cache_scorers=True,
                                                              program_sites=SITES) == static
    configs = [data.draw(program_policies(base.config), label=f"lane {k}")
               for k in range(LANES)]
    params = stack_params([params_from_config(c, TENANTS) for c in configs])
    lanes = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(configs):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, lanes[k]) is None, (k, cfg.policy, cfg.engine)


@settings(max_examples=4, **_SETTINGS)
@given(data=st.data())
def test_drawn_programs_on_drawn_workloads_match_reference(data):
    _check(ENGINES["small-blocks"], data)


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
@settings(max_examples=25, **_SETTINGS)
@given(data=st.data())
def test_drawn_programs_on_drawn_workloads_match_reference_slow(engine, data):
    _check(ENGINES[engine], data)
