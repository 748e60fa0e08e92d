"""P/D pools with their own TP and GPU (``cluster.pd.prefill`` / ``decode``; docs/semantics.md
§5.10, "Per-pool settings"): every lane of a JAX population equals its own reference run,
request by request, with the P/D counters and each instance's KV size.

Roofline latency for llama-3.1-8b at a GPU memory utilization of 0.27: the H100 and the
A100-80 (both 80 GiB) hold 508 blocks per instance at TP 1, a TP-2 prefill pool 22,059
(roofline.md §4.5); the prefill pool runs at H100 rates with TP 2, the decode and shared
instances at A100-80 rates, and the KV-utilization scorer reads each instance's own size. One compiled program for the default tier; the slow tier
adds ``--blis-quirks`` (the decode pool keeps the H100's rates).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import ConfigError, PDConfig, RoutingConfig, ScorerWeight, resolve_config
from blisjax.config.pd import PoolOverrides
from blisjax.config.sim import EngineConfig, LatencyConfig
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.static import build_static
from blisjax.reference import simulate as reference
from tests.reference.conftest import make_resolved, make_workload

HORIZON_US = 3_000_000  # decode instances full of reservations step empty: bound every run
POOLS = PDConfig(prefill_instances=1, decode_instances=2, shared_instances=1, decider="always",
                 transfer_bandwidth_gbps=5.0,
                 prefill=PoolOverrides(tensor_parallel_size=2),
                 decode=PoolOverrides(hardware="A100-80"))


def _config(quirks: bool = False, **pd):
    cfg = make_resolved(instances=4, quirks=quirks, max_running=4, max_tokens=256,
                        horizon_us=HORIZON_US).config
    return dataclasses.replace(
        cfg, latency=LatencyConfig(model="roofline"),
        engine=dataclasses.replace(cfg.engine, total_kv_blocks=None,
                                   gpu_memory_utilization=0.27),
        cluster=dataclasses.replace(cfg.cluster, pd=dataclasses.replace(POOLS, **pd)))


def _workload():
    rows = [dict(arrival=100 * k, input=1000 + 60 * k, output=200 + 7 * (k % 4),
                 group=k % 2 - 1 if k % 3 else -1, prefix=64 if k % 3 and k % 2 else 0)
            for k in range(14)]
    return make_workload(rows, groups=("g0",))


def _check(quirks: bool) -> None:
    base = resolve_config(_config(quirks))
    w = _workload()
    lanes = [_config(quirks),
             _config(quirks, decider="prefix-threshold", prefix_threshold_tokens=120,
                     transfer_contention=True,
                     decode_scorers=(ScorerWeight("kv-utilization", 1.0),
                                     ScorerWeight("queue-depth", 1.0)))]
    lanes[1] = dataclasses.replace(lanes[1], policy=dataclasses.replace(
        lanes[1].policy, routing=RoutingConfig(policy="least-loaded")))
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    static = build_static(base, w)
    assert static.instance_rows == (1, 2, 2, 2)
    results = simulate_population(base, w, params, static=static)
    for k, cfg in enumerate(lanes):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
        assert list(results[k].kv_total_blocks) == list(want.kv_total_blocks)
    blocks = list(results[0].kv_total_blocks)
    assert blocks == [22059, 508, 508, 508]
    assert int(np.sum(results[0].pd.prefill_instance >= 0)) == 14


def test_pools_of_their_own_match_reference():
    _check(False)


@pytest.mark.slow
def test_pools_of_their_own_match_reference_with_quirks():
    _check(True)


@pytest.mark.parametrize("pd, field", [
    (dict(decode=PoolOverrides(latency_model="blackbox")), "cluster.pd.decode.latency_model"),
    (dict(prefill=PoolOverrides(max_model_len=512)), "cluster.pd.prefill.max_model_len"),
])
def test_what_the_jax_engine_refuses_is_named(pd, field):
    r = resolve_config(dataclasses.replace(_config(), engine=EngineConfig(
        total_kv_blocks=500, gpu_memory_utilization=0.27), latency=LatencyConfig(
        model="roofline"), cluster=dataclasses.replace(_config().cluster, pd=dataclasses.replace(
            PDConfig(prefill_instances=1, decode_instances=3, decider="always"), **pd))))
    with pytest.raises(ConfigError, match=field + ": .*reference engine only"):
        build_static(r, _workload())


def test_lanes_keep_the_base_split():
    base = resolve_config(_config())
    other = _config(prefill_instances=2, decode_instances=1)
    params = stack_params([params_from_config(c, ("",)) for c in (_config(), other)])
    with pytest.raises(ConfigError, match="every lane keeps the base configuration's split"):
        simulate_population(base, _workload(), params)


def test_per_lane_gpu_types_with_pools_are_refused():
    with pytest.raises(ConfigError, match="hardware: per-lane GPU types with P/D pools"):
        build_static(resolve_config(_config()), _workload(), gpus=("A100-80",))
