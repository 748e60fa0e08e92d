"""Request rows as a capacity and programs shared by runs: what ``build_static_shared`` and
``static_lanes.for_runs`` build, and what they refuse (nothing is compiled here). The runs on
spare rows: tests/engine/test_parity.py's hand cases (of several sizes and horizons on one
program) and tests/engine/test_parity_sessions.py's population (conversations of two sizes)."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import resolve_config
from blisjax.engine.consts import build_consts
from blisjax.engine.static import EngineStatic, build_static, build_static_shared
from blisjax.engine.static_lanes import for_runs
from tests.engine.conftest import edge_engine
from tests.engine.test_parity import SPARE_ROW_CASES
from tests.engine.test_parity_sessions import random_session_workload
from tests.reference.conftest import make_resolved, make_workload

# three hand cases: a burst, a lone long request, a trickle (test_parity.py runs them)
CASES = SPARE_ROW_CASES


def _resolved(horizon_us: int):
    return make_resolved(block_size=4, kv_blocks=60, max_running=4, max_tokens=128,
                         horizon_us=horizon_us)


def test_a_workload_of_more_requests_than_rows_is_refused():
    small = make_workload(CASES[1])
    static = build_static(_resolved(2**63 - 1), small)
    with pytest.raises(ValueError, match="1 request rows.*9 requests needs at most"):
        build_consts(_resolved(2**63 - 1), make_workload(CASES[0]), static)


def test_workloads_of_other_sizes_share_one_static():
    """``build_static_shared``: the most request rows and sessions; conversations on spare
    rows run in tests/engine/test_parity_sessions.py's population."""
    resolved = edge_engine(2)
    workloads = [random_session_workload(1, sessions=6, loose=3), random_session_workload(2)]
    static = build_static_shared(resolved, workloads)
    assert static.shapes.num_sessions == 10
    assert static.shapes.num_requests == max(w.num_requests for w in workloads) \
        > min(w.num_requests for w in workloads)


def test_a_workload_of_more_sessions_than_the_program_is_refused():
    resolved = edge_engine(2)
    static = build_static(resolved, random_session_workload(1, sessions=6, loose=3))
    with pytest.raises(ValueError, match="6 sessions.*of 10 needs at most"):
        build_consts(resolved, random_session_workload(2, sessions=10, loose=0),
                     static.replace(num_requests=200))


def test_runs_of_several_configurations_read_their_settings_per_lane():
    """``for_runs``: the largest KV cache, running cap and instance count; each run's own read
    per lane (its parity: tests/engine/test_parity.py's hand cases)."""
    small = make_resolved(instances=1, block_size=8, kv_blocks=30, max_running=2)
    st = for_runs([(make_resolved(instances=2, block_size=8, kv_blocks=60, max_running=4),
                    make_workload(CASES[0])), (small, make_workload(CASES[2]))])
    assert (st.shapes.kv_blocks, st.shapes.batch_slots, st.shapes.num_instances) == (60, 4, 2)
    assert st.features.lane_settings and st.features.sized_lanes
    assert st.shapes.num_requests == 9


@pytest.mark.parametrize("other", [dict(block_size=16), dict(max_model_len=400)])
def test_runs_that_differ_in_a_setting_of_the_program_cannot_share_it(other):
    w = make_workload(CASES[1])
    with pytest.raises(ValueError, match=f"runs differ in {next(iter(other))}"):
        for_runs([(make_resolved(instances=2, block_size=8, kv_blocks=60, max_running=4), w),
                  (make_resolved(instances=2, kv_blocks=60, max_running=4,
                                 **{"block_size": 8, **other}), w)])


def test_runs_of_other_prefix_index_capacities_cannot_share_a_program():
    """The router's prefix index evicts at its capacity: a setting, not a capacity to raise."""
    base = _resolved(2**63 - 1)
    small = resolve_config(dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, prefix_index_capacity_blocks=6)))
    w = make_workload(CASES[0])
    with pytest.raises(ValueError, match="runs differ in prefix_index_capacity"):
        for_runs([(base, w), (small, w)])


def test_a_search_shares_one_program_between_seeds_of_other_sizes():
    """``blisjax search``'s seeds (or recorded traces) of different request counts share one
    program; seeds of other tenants cannot, and get one each."""
    from search.evaluate import _shared_static

    resolved = _resolved(2**63 - 1)
    seeds = {0: make_workload(CASES[0]), 1: make_workload(CASES[1])}
    shared = _shared_static(resolved, seeds, (), {})
    assert isinstance(shared, EngineStatic) and shared.shapes.num_requests == 9
    seeds[2] = make_workload(CASES[2], tenants=("a", "b"))
    assert set(_shared_static(resolved, seeds, (), {})) == {0, 1, 2}
