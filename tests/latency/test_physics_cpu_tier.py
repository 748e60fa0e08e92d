"""The physics model with a CPU tier (docs/latency-models.md §P.2): the tier's size feeds α
feature 10, ``cpu_offload_memory_expansion``; β features 13 and 14 stay 0, since the tier
charges its reloads' transfer time to the step itself (docs/semantics.md §3.8)."""

from __future__ import annotations

import dataclasses

from blisjax.config import load_config, resolve_config
from blisjax.latency.factory import make_latency_model
from blisjax.latency.physics import PhysicsQueueInputs, PhysicsStepInputs
from tests.paths import REPO

SAMPLE = REPO / "configs" / "latency" / "sample-config.yaml"  # 200 GPU blocks per instance


def _model(cpu_blocks: int, alpha=None):
    cfg = load_config(SAMPLE)
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine,
                                                              kv_cpu_blocks=cpu_blocks))
    if alpha is not None:
        cfg = dataclasses.replace(cfg, latency=dataclasses.replace(cfg.latency,
                                                                   alpha_coeffs=alpha))
    return make_latency_model(resolve_config(cfg))


def test_the_tier_size_feeds_alpha_feature_10():
    """16 of 32 sequences running and half the KV blocks in use: the congestion gate is
    g = 0.5 + 0.5 − 0.5·0.5 = 0.75, so feature 10 = g · CPU bytes / GPU bytes =
    0.75 · 100 / 200 = 0.375 (block bytes a power of two: exact)."""
    q = PhysicsQueueInputs(running_depth=16, waiting_depth=0, kv_usage_ratio=0.5,
                           prompt_tokens=100, prefix_hit_ratio=0.0,
                           kv_free_bytes=100 * 4_194_304.0, preemption_ema=0.0)
    with_tier = _model(100)
    assert with_tier.config.cpu_offload_active
    assert with_tier.config.cpu_kv_capacity_bytes == 100 * 16 * 262_144
    assert with_tier.alpha_features(q)[9] == 0.375
    assert _model(0).alpha_features(q)[9] == 0.0
    # only α10's coefficient, 3000 µs per unit: a queueing delay of 3000 · 0.375 = 1125 µs
    alpha = (0.0,) * 9 + (3000.0, 0.0)
    assert _model(100, alpha).queueing_delay_us(q) == 1125
    assert _model(0, alpha).queueing_delay_us(q) == 0
    step = PhysicsStepInputs(prefill_tokens=64, decode_tokens=8, num_prefill_reqs=1,
                             num_decode_reqs=8, sum_prefill_attn_work=4096,
                             decode_context_tokens=2000, sum_decode_kv_blocks=130,
                             preemption_ema=0.0)
    assert with_tier.beta_features(step)[12:14] == (0.0, 0.0)
