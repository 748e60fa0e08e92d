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
from functools import cache

import numpy as np
import pytest

from blisjax.config import ConfigError, PDConfig, RoutingConfig, ScorerWeight, resolve_config
from blisjax.config.pd import PoolOverrides
from blisjax.config.sim import EngineConfig, LatencyConfig
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.parity import first_divergence
from blisjax.engine.population import apply_knobs
from blisjax.engine.static import build_static
from blisjax.engine.static_lanes import for_lanes
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from tests.engine.conftest import PHYSICS
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


@cache
def _population(quirks: bool):
    """The pools' lanes — the base split; a prefix-threshold decider with transfer contention,
    decode scorers of their own and least-loaded routing; the base split on the A100-SXM —
    run in one program (with per-lane GPU types), and each lane's reference run."""
    base = resolve_config(_config(quirks))
    w = _workload()
    lanes = [_config(quirks),
             _config(quirks, decider="prefix-threshold", prefix_threshold_tokens=120,
                     transfer_contention=True,
                     decode_scorers=(ScorerWeight("kv-utilization", 1.0),
                                     ScorerWeight("queue-depth", 1.0))),
             apply_knobs(_config(quirks), {"hardware": "A100-SXM"})]
    lanes[1] = dataclasses.replace(lanes[1], policy=dataclasses.replace(
        lanes[1].policy, routing=RoutingConfig(policy="least-loaded")))
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    static = build_static(base, w, gpus=("H100", "A100-SXM"))
    assert static.settings.instance_rows == (1, 2, 2, 2)
    results = simulate_population(base, w, params, static=static)
    return lanes, results, [reference(resolve_config(c), w) for c in lanes]


def _check(quirks: bool) -> None:
    lanes, results, wants = _population(quirks)
    for k, want in enumerate(wants[:2]):
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


def _lengths_config(quirks: bool, **pd):
    """Blackbox, 4 instances of 200 blocks of 16 tokens, no max-model-len of its own; the
    prefill pool's is 300 tokens, the decode pool's (and the shared instance's) 150."""
    cfg = make_resolved(instances=4, quirks=quirks, block_size=16, kv_blocks=200,
                        max_running=4, max_tokens=128, threshold=64,
                        horizon_us=HORIZON_US).config
    pools = PDConfig(prefill_instances=1, decode_instances=2, shared_instances=1,
                     decider="always", transfer_bandwidth_gbps=5.0,
                     prefill=PoolOverrides(max_model_len=300),
                     decode=PoolOverrides(max_model_len=150))
    return dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, pd=dataclasses.replace(pools, **pd)))


def _lengths_workload():
    """Prompts of 40–290 tokens and outputs of 0–90: some pass the prefill pool's cap (dropped
    there), some the decode pool's once decoding (length-capped there), some neither."""
    rows = [dict(arrival=400 * k, input=40 + (53 * k) % 251, output=(37 * k) % 91,
                 group=0 if k % 4 == 0 else -1, prefix=32 if k % 4 == 0 else 0)
            for k in range(18)]
    for r in rows:
        r["input"] = max(r["input"], r["prefix"] + 1)
    return make_workload(rows, groups=("g0",))


@pytest.mark.parametrize("quirks", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_pools_of_their_own_max_model_len_match_reference(quirks):
    """Each instance caps lengths with its pool's max-model-len: a prefill sub-request is
    dropped at its prefill instance when its prompt and output budget pass that instance's
    cap, a decode sub-request completes length-capped at 150 on its decode instance; requests
    served whole (prefix-threshold) take the decode instance's cap."""
    base = resolve_config(_lengths_config(quirks))
    w = _lengths_workload()
    lanes = [_lengths_config(quirks),
             _lengths_config(quirks, decider="prefix-threshold", prefix_threshold_tokens=100,
                             transfer_contention=True)]
    lanes[1] = dataclasses.replace(lanes[1], policy=dataclasses.replace(
        lanes[1].policy, routing=RoutingConfig(policy="least-loaded")))
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    static = build_static(base, w)
    assert static.settings.instance_max_model_len == (300, 150, 150, 150)
    results = simulate_population(base, w, params, static=static)
    outcomes = []
    for k, cfg in enumerate(lanes):
        want = reference(resolve_config(cfg), w)
        assert first_divergence(want, results[k]) is None, k
        outcomes.append(want)
    # the caps act, by hand: a request prefilled on instance 0 (the prefill pool's cap, 300)
    # or 3 (shared: the decode pool's, 150) is dropped iff L_in + N_out passes that cap
    # (N_out = 0 asks up to it), and completes capped iff it was not and
    # L_in + N_out - 1 > 150 - 1 (its decode instance's cap)
    want = outcomes[0]
    l_in, out = np.asarray(w.input_tokens), np.asarray(w.output_tokens)
    assert set(want.pd.prefill_instance.tolist()) == {0, 3}
    cap = np.where(want.pd.prefill_instance == 0, 300, 150)
    dropped = l_in + np.where(out == 0, cap - l_in, out) > cap
    assert np.array_equal(np.asarray(want.status) == records.DROPPED, dropped)
    capped = ~dropped & (l_in + np.maximum(out, 1) - 1 > 149)
    assert np.array_equal(np.asarray(want.length_capped), capped)
    assert dropped.any() and capped.any() and (~dropped & ~capped).any()


@pytest.mark.parametrize("quirks", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_pools_of_their_own_latency_model_match_reference(quirks):
    """A roofline cluster whose decode pool (and shared instance) runs the blackbox model
    (llama-3.1-8b's H100 coefficients), and a blackbox cluster whose prefill pool runs the
    roofline: each instance steps with its pool's model, bit for bit with the reference."""
    w = _workload()
    roofline_base = _config(quirks, decode=PoolOverrides(latency_model="blackbox"))
    blackbox_base = dataclasses.replace(
        _config(quirks, prefill=PoolOverrides(latency_model="roofline"),
                decode=PoolOverrides()),
        latency=LatencyConfig(model="blackbox"))
    for cfg, rows in ((roofline_base, (True, True, False)),
                      (blackbox_base, (False, True, False))):
        base = resolve_config(cfg)
        static = build_static(base, w)
        assert static.settings.row_roofline == rows and not static.stretches
        _both_routings_match_reference(cfg, static, w)


def _both_routings_match_reference(cfg, static, w):
    """``cfg`` and its least-loaded twin as one population on ``static``: each lane equals its
    reference run, every request disaggregated; returns the population's results."""
    lanes = [cfg, dataclasses.replace(cfg, policy=dataclasses.replace(
        cfg.policy, routing=RoutingConfig(policy="least-loaded")))]
    params = stack_params([params_from_config(c, ("",)) for c in lanes])
    results = simulate_population(resolve_config(cfg), w, params, static=static)
    for k, lane in enumerate(lanes):
        want = reference(resolve_config(lane), w)
        assert first_divergence(want, results[k]) is None, k
        assert int(np.sum(want.pd.prefill_instance >= 0)) == 14
    return results


def test_physics_pools_of_their_own_match_reference():
    """Physics in every pool: the prefill pool at TP 2 on the H100, the decode pool (and the
    shared instance) on the A100-80. Each instance steps, and delays its arrivals, with its
    pool's physics constants, bit for bit with the reference; the pools' settings change the
    run (the same cluster without them diverges)."""
    cfg = dataclasses.replace(_config(), latency=PHYSICS)
    base = resolve_config(cfg)
    w = _workload()
    static = build_static(base, w)
    assert static.settings.instance_rows == (1, 2, 2,
                                             2) and static.settings.latency_model == "physics"
    results = _both_routings_match_reference(cfg, static, w)
    plain = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, pd=dataclasses.replace(
        cfg.cluster.pd, prefill=PoolOverrides(), decode=PoolOverrides())))
    assert first_divergence(reference(resolve_config(plain), w), results[0]) is not None


@pytest.mark.parametrize("pd, field", [
    (dict(decode=PoolOverrides(latency_model="physics")), "cluster.pd.decode.latency_model"),
])
def test_what_the_jax_engine_refuses_is_named(pd, field):
    """Physics in one pool and another model elsewhere (a physics base cannot give a pool
    another model: the base's coefficients are physics's)."""
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


def test_per_lane_gpu_types_with_pools_of_their_own_match_reference():
    """Lanes on the H100 and on the A100-SXM (80 GiB each, so every pool keeps its KV size):
    the prefill pool (TP 2, no GPU of its own) runs at the lane's GPU's rates, the decode pool
    and the shared instance at the A100-80's whatever the lane's. Each lane equals its
    reference run, and the two GPUs give other runs."""
    _, results, wants = _population(False)
    for k in (0, 2):
        assert first_divergence(wants[k], results[k]) is None, k
        assert list(results[k].kv_total_blocks) == [22059, 508, 508, 508]
    assert first_divergence(wants[0], wants[2]) is not None
    base, w = resolve_config(_config()), _workload()
    # a GPU of other memory gives the pools other KV sizes: refused, naming the knob
    with pytest.raises(ConfigError, match="^hardware: GPU 'L40S'"):
        build_static(base, w, gpus=("L40S",))


def test_kv_blocks_of_a_lanes_own_are_refused_beside_pools_of_their_own_kv_sizes():
    """The program holds each instance's KV blocks where the pools' caches differ; a lane's
    KV size cannot replace them."""
    base = resolve_config(_config())
    w = _workload()
    static = build_static(base, w)
    assert len(set(static.settings.instance_kv_blocks)) > 1
    smaller = apply_knobs(base.config, {"engine.total_kv_blocks": 100})
    params = stack_params([params_from_config(c, w.tenant_names) for c in (base.config, smaller)])
    with pytest.raises(ConfigError, match=r"engine\.total_kv_blocks: is not a per-lane knob "
                                          r"with P/D pools of their own KV sizes"):
        for_lanes(static, params)
