"""JAX engine vs reference engine with a CPU tier of the KV cache (docs/semantics.md §3.8):
lanes of one population with distinct tier sizes and transfer times — no tier, a tier that
thrashes, tiers that hold more and more of the prefixes — every request against an
independent reference run, and the tier's counters too.

The workload is BLIS's tiered-KV trace (8 prefix groups of 640 tokens) on an instance whose
GPU cache cannot hold every prefix, with a small token budget so prompts are prefilled in
chunks: reloads happen at admissions, next to preemptions and to readmissions whose blocks
hold outputs only (checked on the reference first, so the test cannot pass by not exercising
them). Reloads between the chunks of a running request are rare in such runs (a request
reloads its cached prefix when it is admitted); ``test_kv_differential.py`` drives them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import LatencyConfig, resolve_config
from blisjax.engine import params_from_config, stack_params
from blisjax.engine.consts import build_consts
from blisjax.engine.instance import FINISH_PER_OCTAVE, step_widths
from blisjax.engine.parity import first_divergence
from blisjax.engine.run import lane_result, run_lanes
from blisjax.engine.static import build_static
from blisjax.reference import simulate as reference
from blisjax.reference.kvcache import KVCache
from blisjax.workload.trace import read_trace
from tests.paths import GOLDEN_NEXT_DIR
from tests.reference.conftest import make_resolved

#: (CPU blocks, bandwidth tokens/µs, base latency µs) per lane; the first lane has no tier.
LANES = ((0, 100.0, 0), (24, 8.0, 25), (160, 0.5, 0), (1200, 100.0, 40))


def _workload():
    return read_trace(GOLDEN_NEXT_DIR / "kv_tiered_reload.yaml",
                      GOLDEN_NEXT_DIR / "kv_tiered_reload.csv")


def _config(base, cpu_blocks, bandwidth, base_us):
    engine = dataclasses.replace(base.config.engine, kv_cpu_blocks=cpu_blocks,
                                 kv_transfer_bandwidth=bandwidth,
                                 kv_transfer_base_latency_us=base_us)
    return dataclasses.replace(base.config, engine=engine)


@pytest.mark.parametrize(("stretches", "latency"), [
    (True, "blackbox"), pytest.param(False, "blackbox", marks=pytest.mark.slow),
    pytest.param(True, "roofline", marks=pytest.mark.slow)])
def test_lanes_with_distinct_tiers_match_the_reference(stretches, latency):
    """With decode stretches (the default-tier case) a stretch's mirror passes are one pass
    at its end, planned only while the tier evicts nothing: the lanes whose tier holds the
    batch stretch, the thrashing one mostly runs step by step, and all match (under the
    roofline model too, whose plain steps have times of their own), whichever width programs
    the steps take."""
    base = make_resolved(instances=1, kv_blocks=100, max_tokens=256, max_running=32,
                         preemption="fcfs",
                         cpu_blocks=max(c for c, _, _ in LANES))
    if latency == "roofline":
        base = resolve_config(dataclasses.replace(base.config,
                                                  latency=LatencyConfig(model="roofline")))
    workload = _workload()
    configs = [_config(base, *lane) for lane in LANES]
    readmitted = {"output only": 0}
    register = KVCache._register

    def counted(self, req, j, b):
        register(self, req, j, b)
        readmitted["output only"] += self.first_token[b] >= req.input_tokens and j == 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KVCache, "_register", counted)
        refs = [reference(resolve_config(cfg), workload) for cfg in configs]
    # a request readmitted with its whole prompt cached holds only output blocks
    assert readmitted["output only"] > 0
    assert refs[0].kv_tier is None
    tiers = [ref.kv_tier for ref in refs[1:]]
    assert all(int(t.reloads.sum()) > 0 for t in tiers[1:])
    assert int(tiers[0].cpu_evictions.sum()) > int(tiers[0].mirror_stores.sum()) // 2  # thrash
    assert all(int(np.sum(ref.preemption_count)) > 0 for ref in refs[:3])
    reloads = [int(t.reloads.sum()) for t in tiers]
    assert reloads == sorted(reloads), reloads  # a bigger tier holds more prefixes
    # each lane twice, the second time in reverse: blocks of ``TIERED_LANE_BLOCK`` lanes
    # ordered by tier size, each lane run in another block than its place in the population
    order = [*range(len(LANES)), *reversed(range(len(LANES)))]
    params = stack_params([params_from_config(configs[k], workload.tenant_names)
                           for k in order])
    # steps of width programs 8 .. 32 (the running batch's): phase 1's passes, the stretches'
    # steps, execution (then the tier's mirror pass once, `instance._execute_all`) and
    # completions each at the narrowest that holds the lanes' batches
    st = build_static(base, workload, decode_stretches=stretches, running_width=8)
    assert st.stretches == stretches
    assert step_widths(st, FINISH_PER_OCTAVE) == (8, 12, 16, 24, 32)
    consts = build_consts(base, workload, st)
    final = run_lanes(st, consts, params)
    if stretches:  # a 24-block tier never holds a batch's blocks: it never stretches
        stretched = np.asarray(final.run.stretched)
        assert np.all((stretched == 0) == (np.array(order) == 1)), stretched
    for j, k in enumerate(order):
        got, ref = lane_result(st, consts, final, j), refs[k]
        assert first_divergence(ref, got) is None, (k, first_divergence(ref, got))
        assert got.overflow == {}
        if ref.kv_tier is None:
            assert got.kv_tier is None
            continue
        for field in ref.kv_tier._fields:
            assert np.array_equal(getattr(ref.kv_tier, field),
                                  getattr(got.kv_tier, field)), (k, field)


#: BLIS's own tiered-KV configuration, lanes of other sizes and transfer times.
QUIRK_LANES = ((0, 100.0, 0), (300, 8.0, 25), (600, 0.5, 0), (1200, 100.0, 40))


@pytest.mark.slow
def test_lanes_with_distinct_tiers_match_the_reference_with_blis_quirks():
    """The same with ``--blis-quirks`` (reloads inside BLIS's tiered allocation, off-chain
    hashes after a reload replaced a claimed block), on the configuration of BLIS's replay,
    with decode stretches (planned while no request's blocks chain off the true chain)."""
    base = make_resolved(instances=1, kv_blocks=384, max_tokens=2048, max_running=256,
                         cpu_blocks=1200, quirks=True)
    workload = _workload()
    configs = [_config(base, *lane) for lane in QUIRK_LANES]
    refs = [reference(resolve_config(cfg), workload) for cfg in configs]
    assert all(int(ref.kv_tier.reloads.sum()) > 0 for ref in refs[2:])
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    st = build_static(base, workload, decode_stretches=True)
    assert st.stretches
    consts = build_consts(base, workload, st)
    final = run_lanes(st, consts, params)
    assert np.all(np.asarray(final.run.stretched) > 0), np.asarray(final.run.stretched)
    lanes = [lane_result(st, consts, final, k) for k in range(len(QUIRK_LANES))]
    for k, ref in enumerate(refs):
        assert first_divergence(ref, lanes[k]) is None, (k, first_divergence(ref, lanes[k]))
        assert lanes[k].overflow == {}
        if ref.kv_tier is not None:
            for field in ref.kv_tier._fields:
                assert np.array_equal(getattr(ref.kv_tier, field),
                                      getattr(lanes[k].kv_tier, field)), (k, field)
