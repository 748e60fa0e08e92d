"""The CPU tier of the KV cache (docs/semantics.md §3.8): hand-computed timelines.

Blackbox step time 1000 + 10·prefill + 100·decode µs (tests/reference/conftest.py), blocks of
4 tokens, a GPU of 4 blocks and a CPU tier of 16; a reload costs 10 + ceil(4 / 2) = 12 µs.

r0 (prefix group g: blocks G0, G1, then its own block) runs at t = 0 and leaves its three full
prompt blocks in the CPU tier (mirrored after its step). r1 (no group) at 5 ms needs every GPU
block, evicting G0 and G1 from the GPU. r2 (group g) at 10 ms finds nothing cached on the GPU;
its allocation reloads G0 and G1 from the CPU tier (24 µs charged to its step) and claims them.
BLIS (``--blis-quirks``) still prefills all 12 prompt tokens in that step; by default the
reloaded blocks count as cached, so it prefills 4.
"""

from __future__ import annotations

import pytest

from blisjax.config import ConfigError, MetricsConfig
from tests.reference.conftest import run

ROWS = [dict(arrival=0, input=12, output=1, group=0, prefix=8),
        dict(arrival=5000, input=12, output=1),
        dict(arrival=10_000, input=12, output=1, group=0, prefix=8)]
TIER = dict(block_size=4, kv_blocks=4, cpu_blocks=16, transfer_bandwidth=2.0,
            transfer_base_us=10, groups=("g",))


@pytest.mark.parametrize(("quirks", "r2_ttft_us"), [
    (True, 1000 + 10 * 12 + 2 * 12),  # reload time added, no prefill saved
    (False, 1000 + 10 * 4 + 2 * 12),  # reload time added, reloaded tokens not prefilled
])
def test_reload_is_charged_to_the_step_that_reloads(quirks, r2_ttft_us):
    res, sim = run(ROWS, quirks=quirks, **TIER)
    assert list(res.ttft_us) == [1000 + 10 * 12, 1000 + 10 * 12, r2_ttft_us]
    tier = res.kv_tier
    assert list(tier.request_reloads) == [0, 0, 2]
    assert int(tier.reloads[0]) == 2 and int(tier.cpu_misses[0]) == 0
    # stores: r0's 3 prompt blocks, r1's 3, r2's own block (G0, G1 were already there)
    assert int(tier.mirror_stores[0]) == 7 and int(tier.cpu_evictions[0]) == 0
    # 2 hits (G0, G1 claimed by r2); misses: 3 + 3 + 1 fresh prompt blocks, 3 final tokens
    assert (int(res.cache_hits[0]), int(res.cache_misses[0])) == (2, 10)


def test_without_a_cpu_tier_r2_recomputes_its_prefix():
    res, _ = run(ROWS, **{**TIER, "cpu_blocks": 0})
    assert list(res.ttft_us) == [1120, 1120, 1120]
    assert res.kv_tier is None


def test_a_full_tier_evicts_its_least_recent_block():
    """A tier of 3 blocks: r1's three prompt blocks push out r0's, so r2 reloads nothing, and
    r2's three blocks push out r1's."""
    res, _ = run(ROWS, **{**TIER, "cpu_blocks": 3})
    assert list(res.ttft_us) == [1120, 1120, 1120]
    assert int(res.kv_tier.cpu_evictions[0]) == 3 + 3
    assert int(res.kv_tier.reloads[0]) == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(kv_cpu_blocks=-1), r"^engine\.kv_cpu_blocks: must be an integer >= 0"),
    (dict(kv_transfer_bandwidth=0.0), r"^engine\.kv_transfer_bandwidth: must be a finite number > 0"),
    (dict(kv_transfer_bandwidth=float("inf")), r"^engine\.kv_transfer_bandwidth: "),
    (dict(kv_transfer_base_latency_us=-5), r"^engine\.kv_transfer_base_latency_us: "),
    (dict(kv_cpu_blocks=8, enable_prefix_caching=False), r"^engine\.kv_cpu_blocks: .*prefix"),
])
def test_cpu_tier_settings_are_checked(kwargs, message):
    from blisjax.config import ConfigError, EngineConfig

    with pytest.raises(ConfigError, match=message):
        EngineConfig(**kwargs)


def test_blis_tier_flags_set_the_engine_and_the_offload_threshold_is_only_checked():
    import argparse

    from blisjax.config import ConfigError, SimConfig
    from blisjax.config.flags import add_blis_flags, apply_blis_flags

    parser = argparse.ArgumentParser()
    add_blis_flags(parser)
    args = ["--kv-cpu-blocks", "1200", "--kv-transfer-bandwidth", "8",
            "--kv-transfer-base-latency", "25", "--kv-offload-threshold", "0.9"]
    eng = apply_blis_flags(SimConfig(), parser.parse_args(args)).engine
    assert (eng.kv_cpu_blocks, eng.kv_transfer_bandwidth, eng.kv_transfer_base_latency_us) == \
        (1200, 8.0, 25)
    with pytest.raises(ConfigError, match=r"^--kv-offload-threshold: must be in \[0, 1\]"):
        apply_blis_flags(SimConfig(), parser.parse_args(["--kv-offload-threshold", "1.5"]))


# Prefix of 3 blocks (G0, G1, G2), prompts of 14 tokens. r0 leaves G0..G2 in the CPU tier and
# frees its blocks (last to first: free list P, G2, G1, G0); r1 takes P and G2's block, so the
# GPU keeps G0 and G1 with G1 at the free list's head. r2 finds G0, G1 cached and reloads G2:
# * BLIS (quirk): the reload takes the head — G1's own block — so r2 keeps only G0 cached in
#   name, claims the overwritten block anyway, prefills 14 − 8 = 6 tokens; 1000 + 60 + 12 µs.
# * default: r2 keeps its cached blocks, the reload takes the next free block, and with G2
#   counted as cached r2 prefills 2 tokens; 1000 + 20 + 12 µs.
OWN_PREFIX_ROWS = [dict(arrival=0, input=14, output=1, group=0, prefix=12),
                   dict(arrival=5000, input=4, output=1),
                   dict(arrival=10_000, input=14, output=1, group=0, prefix=12)]


@pytest.mark.parametrize(("quirks", "r2_ttft_us", "hits"), [
    (True, 1000 + 10 * 6 + 12, 2),
    (False, 1000 + 10 * 2 + 12, 3),
])
def test_a_reload_keeps_the_requests_own_cached_blocks_unless_quirks(quirks, r2_ttft_us, hits):
    res, _ = run(OWN_PREFIX_ROWS, quirks=quirks, **TIER)
    assert list(res.ttft_us) == [1000 + 10 * 14, 1000 + 10 * 4, r2_ttft_us]
    assert list(res.kv_tier.request_reloads) == [0, 0, 1]
    assert int(res.cache_hits[0]) == hits


@pytest.mark.parametrize(("window_us", "thrash"), [(1_000_000, 2), (5001, 2), (5000, 0), (0, 0)])
def test_reloads_soon_after_the_gpu_eviction_are_thrashing(window_us, thrash):
    """The thrashing anomaly (Decision 14): r1's step takes G0's and G1's GPU blocks 5,000 µs
    before r2's step reloads them (both steps start one α delay after their arrival, the same
    delay for the same prompt length), so they count iff the window is longer than that."""
    res, _ = run(ROWS, thrash_window_us=window_us, **TIER)
    assert int(res.kv_tier.reloads[0]) == 2
    assert int(res.kv_tier.thrash_reloads[0]) == thrash


def test_thrash_window_is_checked():
    with pytest.raises(ConfigError, match="metrics.kv_thrash_window_us"):
        MetricsConfig(kv_thrash_window_us=-1)


def test_a_new_instance_in_the_slot_keeps_the_slots_tier_counters():
    """Instance lifecycles reuse a slot for a new instance with cold caches (Decision 16): its
    caches start empty, its counters carry on — the CPU tier's as the GPU's (this timeline:
    two reloads, both thrashing, one for request 2)."""
    _, sim = run(ROWS, thrash_window_us=1_000_000, **TIER)
    inst = sim.instances[0]
    before = (inst.kv.hits, inst.kv.misses, inst.kv.reloads, inst.kv.cpu_misses,
              inst.kv.mirror_stores, inst.kv.thrash_reloads, inst.kv.cpu.evictions)
    assert (inst.kv.reloads, inst.kv.thrash_reloads) == (2, 2)
    inst.restart()
    assert (inst.kv.hits, inst.kv.misses, inst.kv.reloads, inst.kv.cpu_misses,
            inst.kv.mirror_stores, inst.kv.thrash_reloads, inst.kv.cpu.evictions) == before
    assert inst.kv.request_reloads == {2: 2}
    assert not inst.kv.hash_to_block and not inst.kv.cpu.lru  # a cold instance
