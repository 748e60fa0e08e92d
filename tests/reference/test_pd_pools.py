"""P/D pools with their own TP, GPU, latency model and max-model-len (BLIS's ``--prefill-tp``,
``--decode-hardware``, ...; docs/semantics.md §5.10, "Per-pool settings"), in the reference
engine, against hand computation and BLIS's worked values (shared notes: roofline.md §4–§6).

llama-3.1-8b-instruct on an H100 (80 GiB, utilization 0.9, 16-token blocks): 14.957527160644531
GiB of weights and 131,072 KV bytes per token at TP 1 (65,536 at TP 2, the KV heads split).
"""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import ConfigError, resolve_config
from blisjax.config.codes import PDRole
from blisjax.config.flags import apply_blis_flag_values
from blisjax.config.pd import PDConfig, PoolOverrides
from blisjax.config.sim import ClusterConfig, LatencyConfig, SimConfig
from blisjax.metrics import aggregate_metrics
from blisjax.metrics.cost import CostBasis, cost_basis, cost_metrics
from blisjax.reference import ClusterSimulator
from tests.reference.conftest import make_resolved, make_workload

WEIGHT_GIB = 14.957527160644531


def _blocks(tp: int, memory_gib: float = 80.0) -> int:
    """BLIS's KV blocks for llama-3.1-8b (roofline.md §4.5): per-GPU KV of one block, the
    memory left after weights, activations (5.5 GiB) and non-torch memory (0.15 GiB at TP 1,
    0.6 GiB per GPU otherwise)."""
    per_block = (131072 // tp) * 16
    over = (WEIGHT_GIB + 5.5) + (0.15 if tp == 1 else 0.6) * float(tp)
    return int((memory_gib * 0.9 * float(tp) - over) * 2**30) // per_block


def _pools(cfg: SimConfig, **pd) -> SimConfig:
    base = dict(prefill_instances=1, decode_instances=1, decider="always")
    return dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, num_instances=2, pd=PDConfig(**{**base, **pd})))


def _quirks(cfg: SimConfig) -> SimConfig:
    return dataclasses.replace(cfg, compat=dataclasses.replace(cfg.compat, blis_quirks=True))


ROOFLINE = SimConfig(latency=LatencyConfig(model="roofline"))


def test_flags_set_the_pools_settings():
    cfg = SimConfig(cluster=ClusterConfig(num_instances=4))
    pd = apply_blis_flag_values(cfg, {
        "prefill-instances": "2", "decode-instances": "2", "prefill-tp": "2",
        "prefill-hardware": "A100-80", "decode-latency-model": "roofline",
        "decode-max-model-len": "8192"}).cluster.pd
    assert (pd.prefill.tensor_parallel_size, pd.prefill.hardware) == (2, "A100-80")
    assert (pd.decode.latency_model, pd.decode.max_model_len) == ("roofline", 8192)
    assert pd.prefill.latency_model is None and pd.decode.tensor_parallel_size is None
    # shared instances take the decode pool's settings ("decode wins"), the rest none
    pd = dataclasses.replace(pd, shared_instances=0)
    assert [pd.overrides_for(role) for role in pd.roles(4)] == [pd.prefill] * 2 + [pd.decode] * 2
    assert pd.overrides_for(PDRole.NONE) == PoolOverrides()


@pytest.mark.parametrize("values, message", [
    ({"prefill-instances": 1, "decode-instances": 1, "decode-tp": "0"},
     "--decode-tp: cluster.pd.decode.tensor_parallel_size: must be an integer >= 1"),
    ({"prefill-instances": 1, "decode-instances": 1, "prefill-max-model-len": "0"},
     "--prefill-max-model-len: cluster.pd.prefill.max_model_len: must be an integer >= 1"),
    ({"prefill-instances": 1, "decode-instances": 1, "prefill-latency-model": "fast"},
     "--prefill-latency-model: cluster.pd.prefill.latency_model: must be one of"),
    ({"decode-tp": "2"}, "--decode-tp: cluster.pd.decode.tensor_parallel_size: per-pool "
                         "settings need a prefill pool"),
])
def test_bad_pool_settings_are_refused(values, message):
    with pytest.raises(ConfigError) as err:
        apply_blis_flag_values(SimConfig(cluster=ClusterConfig(num_instances=2)), values)
    assert str(err.value).startswith(message)


def test_pool_settings_round_trip_through_yaml():
    import yaml

    from blisjax.config.yaml_io import config_from_dict, dump_config

    cfg = _pools(ROOFLINE, prefill={"tensor_parallel_size": 2},
                 decode={"hardware": "A100-80", "max_model_len": 4096})
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg
    with pytest.raises(ConfigError, match="cluster.pd.prefill.tp: unknown key"):
        _pools(ROOFLINE, prefill={"tp": 2})


def test_a_pool_of_another_tp_gets_its_own_kv_cache():
    """TP 2 doubles the memory and halves the KV of a token per GPU: 125,278 blocks against
    26,312 (BLIS's value at TP 1), whatever ``total_kv_blocks`` says, as in BLIS; the
    transfer moves the prefill pool's 65,536 bytes per token."""
    assert (_blocks(1), _blocks(2)) == (26312, 125278)
    for cfg in (ROOFLINE, dataclasses.replace(ROOFLINE, engine=dataclasses.replace(
            ROOFLINE.engine, total_kv_blocks=5000))):
        r = resolve_config(_pools(cfg, prefill={"tensor_parallel_size": 2}))
        prefill, decode = r.for_instance(0), r.for_instance(1)
        assert prefill.total_kv_blocks == _blocks(2)
        assert prefill.config.engine.tensor_parallel_size == 2
        assert decode is r and decode.total_kv_blocks == (cfg.engine.total_kv_blocks or 26312)
        assert r.pd_kv_bytes_per_token == 65536.0


def test_max_model_len_is_capped_to_a_smaller_pool_cache():
    """A decode pool on an L40S (48 GiB) at TP 1 holds fewer tokens than a global
    max-model-len of 400,000: it is capped to its blocks × 16 unless the pool sets its own,
    which must fit its cache."""
    cfg = dataclasses.replace(ROOFLINE, engine=dataclasses.replace(
        ROOFLINE.engine, max_model_len=400_000))
    r = resolve_config(_pools(cfg, decode={"hardware": "L40S"}))
    blocks = _blocks(1, memory_gib=48.0)
    assert r.for_instance(1).total_kv_blocks == blocks
    assert r.for_instance(1).max_model_len == blocks * 16 < 400_000
    assert r.for_instance(0).max_model_len == 400_000
    own = resolve_config(_pools(cfg, decode={"hardware": "L40S", "max_model_len": 2048}))
    assert own.for_instance(1).max_model_len == 2048
    with pytest.raises(ConfigError, match="cluster.pd.decode.max_model_len: must fit in the KV"):
        resolve_config(_pools(cfg, decode={"hardware": "L40S", "max_model_len": 400_000}))


def test_blis_quirks_size_no_blackbox_pool():
    """BLIS sizes pools only for analytical latency models; a blackbox pool keeps the
    global cache (and, with the quirks, the global coefficients)."""
    cfg = _pools(make_resolved(instances=2).config, prefill={"tensor_parallel_size": 2})
    r = resolve_config(cfg)
    assert r.for_instance(0).total_kv_blocks == _blocks(2)
    quirky = resolve_config(_quirks(cfg))
    assert quirky.for_instance(0).total_kv_blocks == 10_000
    assert quirky.for_instance(0).beta == quirky.beta


@pytest.mark.parametrize("quirks, prefill_step_us", [(False, 44636), (True, 11884)])
def test_a_prefill_pool_on_another_gpu_runs_at_its_speed(quirks, prefill_step_us):
    """One 512-token prompt prefilled in one roofline step on the prefill pool: 44,636 µs on
    an A100-80 (BLIS's value for this model, roofline.md §6), 11,884 µs on the H100 (§5,
    Example 1). BLIS keeps the global GPU's rates for a pool of another GPU (--blis-quirks)."""
    cfg = _pools(ROOFLINE, prefill={"hardware": "A100-80"})
    cfg = _quirks(cfg) if quirks else cfg
    w = make_workload([dict(arrival=0, input=512, output=4)])
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    m = aggregate_metrics(result, w)
    assert m["completed_requests"] == 1
    assert result.busy_time_us[0] == prefill_step_us
    # the A100-80 has the H100's memory: both pools hold 26,312 blocks
    assert list(result.kv_total_blocks) == [26312, 26312]


def test_the_transfer_moves_the_prefill_pools_kv():
    """conftest's blackbox model: prefill [0, 2600); a 160-token prompt (10 blocks) at TP 2 is
    10 · 16 · 65,536 bytes: ceil(100 + 10,485,760 / 20,000) = 625 µs at 20 GB/s and 0.1 ms;
    then a decode step of 1100 µs."""
    cfg = _pools(make_resolved(instances=2).config, prefill={"tensor_parallel_size": 2},
                 transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)
    w = make_workload([dict(arrival=0, input=160, output=3)])
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    assert (result.pd.transfer_start_us[0], result.pd.transfer_end_us[0]) == (2600, 2600 + 625)
    assert result.ttft_us[0] == 2600 + 625 + 1100


def test_each_instance_is_priced_by_its_pool():
    """Prefill instance: 2 H100s at 3.0 per GPU-hour; decode: 1 A100-80 at its default price;
    each held for the whole run."""
    from blisjax.config.hardware import gpu_price_per_hour

    cfg = _pools(ROOFLINE, prefill={"tensor_parallel_size": 2}, decode={"hardware": "A100-80"})
    basis = cost_basis(cfg)
    h100, a100 = gpu_price_per_hour("H100"), gpu_price_per_hour("A100-80")
    assert basis.per_instance == ((2, h100), (1, a100))
    two_hours = dataclasses.make_dataclass("R", ["sim_ended_us", "lifecycle",
                                                 "num_instances"])(7_200_000_000, None, 2)
    assert cost_metrics(two_hours, CostBasis(1, 1.0, ((2, 3.0), (1, 2.0)))) == {
        "gpu_hours": 6.0, "cost": 2 * 2 * 3.0 + 2 * 2.0}

