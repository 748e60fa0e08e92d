"""A population over pinned worker processes: same lanes, same results as one process."""

from __future__ import annotations

import pickle

import pytest

from blisjax.config import resolve_config
from blisjax.engine import evaluate_population, params_from_config, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.workers import WorkerPool, single_device_flags, split_lanes, usable_cores
from blisjax.reference import simulate as reference
from tests.engine.test_parity import EDGE_ROWS, _random_policy_configs
from tests.reference.conftest import make_resolved, make_workload


def test_split_lanes_covers_every_lane_in_order_with_even_shares():
    assert split_lanes(5, 2) == [(0, 3), (3, 5)]
    assert split_lanes(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_lanes(2, 8) == [(0, 1), (1, 2)]  # no empty share
    for lanes in range(1, 40):
        for parts in range(1, 9):
            shares = split_lanes(lanes, parts)
            assert shares[0][0] == 0 and shares[-1][1] == lanes
            assert all(a[1] == b[0] for a, b in zip(shares, shares[1:], strict=False))
            sizes = [b - a for a, b in shares]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="lanes"):
        split_lanes(0, 2)


def test_pool_size_is_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        WorkerPool(0)
    assert usable_cores()  # at least the core this test runs on


def test_workers_drop_only_the_forced_device_count_from_xla_flags():
    forced = "--xla_force_host_platform_device_count=2"
    assert single_device_flags(forced) == ""  # then unset: XLA aborts on a blank value
    assert single_device_flags(f" {forced} ") == ""
    assert single_device_flags(f"--xla_cpu_max_isa=AVX {forced} --xla_dump_to=/tmp/x") == \
        "--xla_cpu_max_isa=AVX --xla_dump_to=/tmp/x"
    assert single_device_flags("") == ""


def test_resolved_configs_travel_to_workers_by_pickle():
    resolved = make_resolved(instances=2)
    copy = pickle.loads(pickle.dumps(resolved))
    assert copy == resolved
    assert dict(copy.model_config.raw) == dict(resolved.model_config.raw)
    with pytest.raises(TypeError):  # still read-only after the trip
        copy.model_config.raw["x"] = 1


@pytest.mark.slow
def test_worker_pool_lanes_match_reference_runs_and_report_worker_errors():
    # 5 lanes over 2 pinned workers (shares of 3 and 2): every lane equals its own reference
    # run; a second call reuses the workers; a failure inside a worker is raised here.
    base = make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=4, max_tokens=64)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    configs = _random_policy_configs(base.config, w.tenant_names, 5, seed=11)
    params = stack_params([params_from_config(c, w.tenant_names) for c in configs])
    with WorkerPool(2) as pool:  # under the caller's forced device count, if any
        assert pool.size == 2
        lanes = pool.simulate_population(base, w, params)
        assert len(lanes) == 5 and len(pool.last_worker_s) == 2
        for k, cfg in enumerate(configs):
            assert first_divergence(reference(resolve_config(cfg), w), lanes[k]) is None, (k,)
        again = pool.simulate_population(base, w, params)
        assert all(first_divergence(a, b) is None for a, b in zip(lanes, again, strict=True))
        knob_sets = [{"routing.policy": "round-robin"}, {"routing.policy": "least-loaded"},
                     {"scheduler.policy": "sjf"}]
        pop = evaluate_population(base, w, knob_sets, pool=pool)
        for k, cfg in enumerate(pop.configs):
            assert first_divergence(reference(resolve_config(cfg), w), pop.results[k]) is None
        with pytest.raises(RuntimeError, match="queue_slots"):
            pool.simulate_population(base, w, params, queue_slots=-1)
    with pytest.raises(RuntimeError, match="closed"):
        pool.simulate_population(base, w, params)
