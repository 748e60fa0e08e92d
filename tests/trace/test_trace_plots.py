"""Pictures of a decision trace (``blisjax.trace.plots``): the data they draw, worked out by
hand, and the PNGs they write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from blisjax.trace.plots import (
    RequestFlow,
    StepSlice,
    busiest_window,
    instance_series,
    plot_instances,
    plot_timeline,
    request_flows,
    routing_ticks,
    window_slices,
)

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def batch(time_us, instance, duration_us, *, admitted=(), decoding=0, completed=(),
          batch_size=1, queue_depth=0, kv_used=0, kv_total=200):
    return {"kind": "batch", "time_us": time_us, "instance": instance,
            "duration_us": duration_us,
            "admitted": [{"request_id": r, "tokens": 16, "cached_tokens": 0} for r in admitted],
            "prefill_chunks": [], "decoding": decoding, "preempted": [],
            "completed": list(completed), "token_budget_left": 0, "batch_size": batch_size,
            "queue_depth": queue_depth, "kv_used_blocks": kv_used, "kv_total_blocks": kv_total}


def routing(time_us, request_id, chosen, kind="routing"):
    return {"kind": kind, "time_us": time_us, "request_id": request_id,
            "chosen_instance": chosen}


#: Instance 0 steps in [100, 150), [150, 200), idles, then [400, 500); instance 2 (no
#: instance 1) steps once in [120, 150) on a KV pool of 0 blocks. Request 8 completes twice
#: (as a P/D request does: prefill on instance 2, decode on instance 0); 9 never completes.
LINES = [
    routing(50, 9, 2),
    routing(60, 8, 2, kind="prefill_routing"),
    routing(90, 5, 0),
    batch(100, 0, 50, admitted=[5], batch_size=2, queue_depth=3, kv_used=10),
    batch(120, 2, 30, admitted=[8], completed=[8], kv_total=0),
    batch(150, 0, 50, decoding=2, completed=[5], batch_size=2, queue_depth=1, kv_used=20),
    routing(300, 6, 0),
    batch(400, 0, 100, admitted=[6], decoding=1, completed=[6, 8], batch_size=2, kv_used=5),
]


def test_instance_series_by_hand():
    series = instance_series(LINES)
    assert list(series) == [0, 2]
    s0 = series[0]
    # Samples at each step start; at 200 (idle follows) the batch less request 5, KV held
    # since one request still runs; at 500 (last step) the batch emptied: no KV.
    np.testing.assert_array_equal(s0.time_us, [100, 150, 200, 400, 500])
    np.testing.assert_array_equal(s0.queue_depth, [3, 1, 1, 0, 0])
    np.testing.assert_array_equal(s0.batch_size, [2, 2, 1, 2, 0])
    np.testing.assert_allclose(s0.kv_utilization, [0.05, 0.1, 0.1, 0.025, 0.0])
    assert s0.time_us.dtype == np.int64 and s0.batch_size.dtype == np.int64
    assert s0.kv_utilization.dtype == np.float64
    s2 = series[2]
    np.testing.assert_array_equal(s2.time_us, [120, 150])
    np.testing.assert_array_equal(s2.batch_size, [1, 0])
    np.testing.assert_array_equal(s2.kv_utilization, [0.0, 0.0])  # no KV pool: 0, not NaN


def test_window_slices_and_routing_ticks_by_hand():
    assert window_slices(LINES, 160, 400) == [StepSlice(0, 150, 200, False)]
    assert window_slices(LINES, 140, 420) == [
        StepSlice(0, 100, 150, True), StepSlice(0, 150, 200, False),
        StepSlice(0, 400, 500, True), StepSlice(2, 120, 150, True)]
    assert routing_ticks(LINES, 60, 300) == [(60, 2), (90, 0)]


def test_request_flows_end_at_the_last_completion():
    assert request_flows(LINES) == [RequestFlow(5, 90, 0, 200), RequestFlow(6, 300, 0, 500),
                                    RequestFlow(8, 60, 0, 500)]


def test_busiest_window():
    lines = [batch(0, 0, 100), batch(1000, 0, 100, batch_size=5, queue_depth=1),
             batch(2000, 0, 100), batch(3000, 1, 100, batch_size=7)]
    # Busiest: instance 1 at 3000 (7), centred, then pulled back inside the span [0, 3100).
    assert busiest_window(lines, 400) == (2700, 3100)
    # A tie (6 at 1000 and at 3000): the earlier, centred.
    tie = [*lines[:3], batch(3000, 1, 100, batch_size=6)]
    assert busiest_window(tie, 400) == (800, 1200)
    assert busiest_window(lines[:3], 4000) == (0, 4000)  # wider than the span: from its start
    assert busiest_window([], 400) == (0, 400)


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_plots_write_pngs(tmp_path):
    out = plot_instances(LINES, tmp_path / "instances.png", title="hand")
    assert out == tmp_path / "instances.png" and _is_png(out)
    assert _is_png(plot_timeline(LINES, tmp_path / "timeline.png"))
    assert _is_png(plot_timeline(LINES, tmp_path / "window.png", start_us=100, end_us=600))
    assert _is_png(plot_timeline(LINES, tmp_path / "from.png", start_us=100))
    with pytest.raises(ValueError, match="empty window"):
        plot_timeline(LINES, tmp_path / "bad.png", start_us=500, end_us=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "from.png", "instances.png", "timeline.png", "window.png"]  # none of bad.png


def test_plots_of_an_empty_trace(tmp_path):
    assert _is_png(plot_instances([], tmp_path / "i.png"))
    assert _is_png(plot_timeline([], tmp_path / "t.png"))


def test_plots_of_a_real_run(tmp_path):
    from blisjax.config import load_config, resolve_config
    from blisjax.trace import simulate_traced
    from blisjax.workload import generate_workload, parse_workload_spec

    cfg = load_config(REPO / "configs" / "default.yaml")
    workload = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    workload = dataclasses.replace(workload, **{
        f.name: getattr(workload, f.name)[:150] for f in dataclasses.fields(workload)
        if isinstance(getattr(workload, f.name), np.ndarray)})
    _, trace = simulate_traced(resolve_config(cfg), workload, "decisions", 0)
    lines = list(trace.lines())
    batches = [x for x in lines if x["kind"] == "batch"]
    series = instance_series(lines)
    assert sorted(series) == sorted({x["instance"] for x in batches})
    for k, s in series.items():
        mine = [x for x in batches if x["instance"] == k]
        # Every step start is a sample, with the record's values.
        starts = np.isin(s.time_us, [x["time_us"] for x in mine])
        np.testing.assert_array_equal(s.batch_size[starts], [x["batch_size"] for x in mine])
        np.testing.assert_array_equal(s.queue_depth[starts], [x["queue_depth"] for x in mine])
        assert np.all(np.diff(s.time_us) > 0)
        assert np.all((s.kv_utilization >= 0) & (s.kv_utilization <= 1))
    assert _is_png(plot_instances(lines, tmp_path / "instances.png"))
    assert _is_png(plot_timeline(lines, tmp_path / "timeline.png"))
