"""A CPU tier with P/D pools (docs/semantics.md §3.8, §5.10): every lane of a JAX population
equals its own reference run, request by request, with the tier's counters.

The workload is the first 200 requests of BLIS's tiered-KV trace (8 prefix groups of 640
tokens) on three instances whose GPU caches cannot hold every prefix. Lanes differ in their
tier (none, a thrashing one, larger ones) and their pools: one prefill and two decode
instances disaggregating everything or by prefix threshold, two prefill instances and a decode
instance routed by prefix affinity, and no pools. A decode instance's reservation is the
tiered allocation, so it reloads prompt blocks its tier holds and, refused after a reload, the
dropped sub-request keeps what it claimed (as in BLIS). The reference run is checked first for
those reservation reloads and refusals, so the test cannot pass by not exercising them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import PDConfig, ScorerWeight, resolve_config
from blisjax.engine import params_from_config, stack_params
from blisjax.engine.consts import build_consts
from blisjax.engine.parity import first_divergence
from blisjax.engine.run import lane_result, run_lanes
from blisjax.engine.static import build_static
from blisjax.reference import simulate as reference
from blisjax.reference.instance import Instance
from blisjax.workload.trace import read_trace
from tests.paths import GOLDEN_NEXT_DIR
from tests.reference.conftest import make_resolved

REQUESTS = 200
SPLIT = PDConfig(prefill_instances=1, decode_instances=2, decider="always",
                 transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)
#: (CPU blocks, pools) per lane
LANES = (
    (0, SPLIT),
    (24, SPLIT),
    (160, dataclasses.replace(SPLIT, decider="prefix-threshold", prefix_threshold_tokens=64)),
    (1200, dataclasses.replace(SPLIT, prefill_instances=2, decode_instances=1,
                               decode_scorers=(ScorerWeight("prefix-affinity", 2.0),))),
    (1200, PDConfig()),
)


def _configs(quirks: bool):
    base = make_resolved(instances=3, kv_blocks=160, max_tokens=256, max_running=32,
                         preemption="fcfs", cpu_blocks=max(c for c, _ in LANES), quirks=quirks,
                         horizon_us=60_000_000)
    base = resolve_config(dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=SPLIT)))

    def lane(cpu_blocks, pools):
        engine = dataclasses.replace(base.config.engine, kv_cpu_blocks=cpu_blocks)
        return dataclasses.replace(base.config, engine=engine, cluster=dataclasses.replace(
            base.config.cluster, pd=pools))

    return base, [lane(*x) for x in LANES]


def _reference_runs(configs, workload):
    """Each lane's reference run, counting the decode-side reservations that reloaded blocks
    and those refused while holding reloaded blocks."""
    seen = {"reloaded": 0, "refused holding": 0}
    reserve = Instance.reserve_transferred_kv

    def counted(self, sub, now_us):
        before = self.kv.reloads if self.tiered else 0
        ok = reserve(self, sub, now_us)
        if self.tiered:
            seen["reloaded"] += self.kv.reloads > before
            seen["refused holding"] += not ok and bool(self.kv.request_blocks.get(sub.index))
        return ok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Instance, "reserve_transferred_kv", counted)
        refs = [reference(resolve_config(cfg), workload) for cfg in configs]
    return refs, seen


@pytest.mark.parametrize("quirks", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tiers_with_pools_match_the_reference(quirks):
    workload = read_trace(GOLDEN_NEXT_DIR / "kv_tiered_reload.yaml",
                          GOLDEN_NEXT_DIR / "kv_tiered_reload.csv").head(REQUESTS)
    base, configs = _configs(quirks)
    refs, seen = _reference_runs(configs, workload)
    assert seen["reloaded"] > 0 and seen["refused holding"] > 0, seen
    assert refs[4].pd is None and refs[0].kv_tier is None
    assert all(int(ref.kv_tier.reloads.sum()) > 0 for ref in refs[2:])
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    st = build_static(base, workload, decode_stretches=True)
    assert st.tiered and st.features.pd
    consts = build_consts(base, workload, st)
    final = run_lanes(st, consts, params)
    for k, ref in enumerate(refs):
        lane = lane_result(st, consts, final, k)
        assert first_divergence(ref, lane) is None, (k, first_divergence(ref, lane))
        assert lane.overflow == {}
        if ref.kv_tier is None:
            assert lane.kv_tier is None
            continue
        for field in ref.kv_tier._fields:
            assert np.array_equal(getattr(ref.kv_tier, field),
                                  getattr(lane.kv_tier, field)), (k, field)
