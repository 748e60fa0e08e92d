"""A decode instance that can admit nothing with nothing running (docs/semantics.md Decision
17), on timelines computed by hand.

The blackbox model of ``conftest``: a step takes 1000 + 10·prefill tokens + 100·decode tokens
µs, α = 0; 16-token blocks, two KV blocks per instance. Two 16-token prompts arrive at 0 and
prefill together on the prefill instance (1000 + 10·32 = 1320 µs); each transfer moves one
block (16 × 131,072 bytes at 20 GB/s + 0.1 ms: ceil(204.86) = 205 µs) and reserves one of the
decode instance's two blocks, so both decode sub-requests queue there at 1525 holding the whole
cache. The head's first decode token needs a second block (17 tokens): FCFS admission waits,
nothing runs, and nothing else will free a block.
"""

from __future__ import annotations

import dataclasses

from blisjax.config import resolve_config
from blisjax.config.pd import PDConfig
from blisjax.metrics.records import COMPLETED, TIMED_OUT, UNFINISHED
from blisjax.reference import ClusterSimulator
from tests.reference.conftest import make_resolved, make_workload

PD = PDConfig(prefill_instances=1, decode_instances=1, decider="always",
              transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)
HORIZON_US = 20_000


def _run(rows, *, quirks=False, horizon_us=2**63 - 1):
    base = make_resolved(instances=2, kv_blocks=2, quirks=quirks, horizon_us=horizon_us)
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(base.config.cluster,
                                                                       pd=PD))
    return ClusterSimulator(resolve_config(cfg), make_workload(rows),
                            check_invariants=True).run()


def _rows(deadline_b=0):
    return [dict(arrival=0, input=16, output=5), dict(arrival=0, input=16, output=5,
                                                      deadline=deadline_b)]


def test_a_stalled_decode_instance_steps_once_and_the_run_ends():
    res = _run(_rows())  # no horizon: BLIS's empty steps would never end
    assert res.status.tolist() == [UNFINISHED, UNFINISHED]
    assert res.still_queued.tolist() == [0, 2]
    assert res.step_count.tolist() == [1, 1]  # the prefill step; one empty step at 1525


def test_with_blis_quirks_a_stalled_instance_steps_empty_until_the_horizon():
    res = _run(_rows(), quirks=True, horizon_us=HORIZON_US)
    assert res.still_queued.tolist() == [0, 2]
    # empty steps of 1000 µs from the subs' arrival until the horizon cuts the next
    first = int(res.pd.transfer_end_us.max())
    assert res.step_count.tolist() == [1, 1 + (HORIZON_US - first) // 1000]


def test_a_timeout_that_frees_a_block_wakes_the_stalled_instance_at_once():
    # B's deadline at 5000 µs releases its reservation and A's next token fits: the stalled
    # instance steps at 5000 (BLIS's empty steps at 1525 + k·1000 would admit A at 5525).
    # A's decode steps of 1100 µs run at 5000, 6100, 7200 and 8300: its first token at the
    # end of the first (TTFT 6100), its end at 9400.
    res = _run(_rows(deadline_b=5000))
    assert res.status.tolist() == [COMPLETED, TIMED_OUT]
    assert res.ttft_us[0] == 6100 and res.e2e_us[0] == 9400
    assert res.step_count.tolist() == [1, 1 + 4]
