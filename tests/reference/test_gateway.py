"""The gateway queue (BLIS's flow control, docs/semantics.md §5.12, Decision 21) on cases
computed by hand from BLIS's rules: one dispatch attempt at each admission and at each tick
(every ``dispatch_tick_interval_us`` from the first attempt while requests wait), held while
the detector's saturation is >= 1, a full queue rejects, fifo / band dispatch order."""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.config import GatewayConfig
from blisjax.metrics.records import COMPLETED, REJECTED, GatewayCounters
from tests.reference.conftest import run

# A: 100 prompt tokens, 3 output tokens. Steps (1000 + 10·prefill + 100·decode µs): its
# prefill at 0 (2000 µs), decodes at 2000 and 3100 (1100 µs each). Its completion is counted
# when its last step starts (docs/semantics.md §2.7): in flight from 0 until 3100.
A = dict(arrival=0, input=100, output=3)
ONE_AT_A_TIME = GatewayConfig(enabled=True, saturation_detector="concurrency",
                              max_concurrency=1)
PER_REQUEST = ("status", "ttft_us", "e2e_us", "scheduling_delay_us", "itl_sum_us",
               "instance")


def rows_of(result, i):
    return {f: int(np.asarray(getattr(result, f))[i]) for f in PER_REQUEST}


def test_held_until_the_first_tick_after_capacity_frees():
    """B arrives at 10 while A is in flight (1 of 1): held. Ticks at 1000, 2000, 3000 find A
    in flight; A leaves at 3100; the tick at 4000 dispatches B. B then behaves as a request
    arriving at 4000 without a gateway; its latencies count from its own arrival (10)."""
    b = dict(arrival=10, input=50, output=2)
    res, _ = run([A, b], gateway=ONE_AT_A_TIME)
    assert res.gateway == GatewayCounters(rejected=0, queue_depth=0, dispatched=2,
                                          wait_sum_us=0 + (4000 - 10))
    shifted, _ = run([A, dict(b, arrival=4000)])
    got, want = rows_of(res, 1), rows_of(shifted, 1)
    for f in ("ttft_us", "e2e_us", "scheduling_delay_us"):
        want[f] += 4000 - 10  # measured from the true arrival
    assert got == want
    assert rows_of(res, 0) == rows_of(shifted, 0)


def test_tick_interval_sets_the_dispatch_grid():
    """With 700 µs ticks the first tick after 3100 is at 3500 (0 + 5·700)."""
    gw = dataclasses.replace(ONE_AT_A_TIME, dispatch_tick_interval_us=700)
    res, _ = run([A, dict(arrival=10, input=50, output=2)], gateway=gw)
    assert res.gateway.wait_sum_us == 3500 - 10


def test_full_queue_rejects():
    """max_queue_depth 1: B waits, C (arriving while B waits) is rejected; BLIS's
    ``Gateway Queue Rejected``, not an admission rejection."""
    gw = dataclasses.replace(ONE_AT_A_TIME, max_queue_depth=1)
    res, _ = run([A, dict(arrival=10, input=50, output=2), dict(arrival=20, input=50,
                                                                   output=2)], gateway=gw)
    assert res.status.tolist() == [COMPLETED, COMPLETED, REJECTED]
    assert res.rejected_admission == 0
    assert res.gateway.rejected == 1 and res.gateway.dispatched == 2


def test_dispatch_order():
    """B (standard) waits from 10, C (critical) from 20. fifo dispatches B at the 4000 tick;
    priority dispatches C there (critical's priority 4 > standard's 3). The other is held
    until the request dispatched at 4000 leaves. BLIS's gated dispatch always goes by band
    (--blis-quirks): C first even under fifo."""
    b = dict(arrival=10, input=50, output=2, slo="standard")
    c = dict(arrival=20, input=50, output=2, slo="critical")

    def first_dispatched(order, quirks=False):
        gw = dataclasses.replace(ONE_AT_A_TIME, dispatch_order=order)
        res, _ = run([A, b, c], gateway=gw, quirks=quirks)
        ttft = res.ttft_us.tolist()
        return "B" if ttft[1] - 10 < ttft[2] - 20 else "C"

    assert first_dispatched("fifo") == "B"
    assert first_dispatched("priority") == "C"
    assert first_dispatched("fifo", quirks=True) == "C"


def test_utilization_detector():
    """Utilization: max(queue depth / 5, KV use / 0.8) per instance, averaged. With the KV
    threshold tiny, any block in use saturates: B (at 10) waits while A holds blocks; A's
    blocks are freed when it completes (its last step starts at 3100), so B goes at 4000 —
    the same as the concurrency case above."""
    gw = GatewayConfig(enabled=True, saturation_detector="utilization",
                       kv_cache_util_threshold=1e-9)
    res, _ = run([A, dict(arrival=10, input=50, output=2)], gateway=gw)
    assert res.gateway.wait_sum_us == 4000 - 10


def test_never_saturated_is_a_pass_through():
    """BLIS: the ``never`` detector makes the gateway queue a zero-latency pass-through."""
    rows = [dict(arrival=37 * k, input=40 + k, output=3 + k % 4) for k in range(12)]
    on, _ = run(rows, instances=2, gateway=GatewayConfig(enabled=True))
    off, _ = run(rows, instances=2)
    for i in range(len(rows)):
        assert rows_of(on, i) == rows_of(off, i)
    assert on.gateway == GatewayCounters(0, 0, len(rows), 0)
    assert off.gateway is None
