"""The decision trace as a Chrome/Perfetto timeline (``blisjax.trace.timeline``).

Every timeline is checked against the trace-event format's rules (``check_trace_events``); the
hand-made traces against events worked out by hand, the real runs against their records.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

import pytest

from blisjax.trace.timeline import assign_lanes, timeline_events, write_timeline

REPO = Path(__file__).resolve().parents[2]
FLOW_PHASES = ("s", "t", "f")
METADATA_NAMES = ("process_name", "process_sort_index", "thread_name", "thread_sort_index")


# ---- records written by hand -----------------------------------------------------------------


def batch(time_us, instance, duration_us, *, admitted=(), chunks=(), decoding=0, preempted=(),
          completed=(), budget=2048, batch_size=1, queue_depth=0, kv_used=0, kv_total=100):
    """A ``batch`` line; ``admitted`` / ``chunks`` as (request_id, tokens)."""
    return {"kind": "batch", "time_us": time_us, "instance": instance,
            "duration_us": duration_us,
            "admitted": [{"request_id": r, "tokens": n, "cached_tokens": 0} for r, n in admitted],
            "prefill_chunks": [{"request_id": r, "tokens": n, "cached_tokens": 0}
                               for r, n in chunks],
            "decoding": decoding, "preempted": list(preempted), "completed": list(completed),
            "token_budget_left": budget, "batch_size": batch_size, "queue_depth": queue_depth,
            "kv_used_blocks": kv_used, "kv_total_blocks": kv_total}


def routing(time_us, request_id, chosen, kind="routing"):
    return {"kind": kind, "time_us": time_us, "request_id": request_id,
            "chosen_instance": chosen, "reason": "weighted", "input_tokens": 32,
            "prefix_group": -1, "tenant": 0, "slo_class": 1, "scores": [0.5, 0.25],
            "snapshots": [], "candidates": [], "regret": 0.0}


def state(time_us, instance, name):
    return {"kind": "instance_state", "time_us": time_us, "instance": instance, "state": name}


#: Two instances. Request 7 is routed at 1000 to instance 0, prefilled in [1500, 3500) and
#: completes in the decode step starting at 3500, whose record says 1000 µs but the next step
#: starts at 4200 (cut: 700 µs). Request 9 is routed at 1040 (within the first routing slice,
#: so on a second router lane) to instance 1 and completes in its only step [3000, 4000).
#: Request 8 is refused admission, 12 finds no instance, 11 is preempted at 4200 for 10
#: (never routed: no flow); instance 1 drains at 4400 and ends at 4600.
HAND = [
    state(0, 0, "active"),
    state(0, 1, "active"),
    {"kind": "admission", "time_us": 1000, "request_id": 7, "admitted": True,
     "reason": "always-admit: admitted"},
    routing(1000, 7, 0),
    routing(1040, 9, 1),
    batch(1500, 0, 2000, admitted=[(7, 32)], budget=2016, kv_used=2),
    {"kind": "admission", "time_us": 2000, "request_id": 8, "admitted": False,
     "reason": "token-bucket: rejected"},
    batch(3000, 1, 1000, admitted=[(9, 16)], completed=[9], budget=2032, kv_used=1),
    batch(3500, 0, 1000, decoding=1, completed=[7], budget=2047, queue_depth=2, kv_used=3),
    {"kind": "preemption", "time_us": 4200, "instance": 0, "request_id": 11,
     "for_request_id": 10, "policy": "fcfs", "tokens_lost": 5, "reason": "fcfs victim"},
    batch(4200, 0, 800, admitted=[(10, 8)], preempted=[11], budget=2040, queue_depth=1,
          kv_used=4),
    {"kind": "routing_rejection", "time_us": 4300, "request_id": 12,
     "reason": "no routable instance"},
    {"kind": "scale_actuation", "time_us": 4400, "delta": -1, "placed": [], "drained": [1],
     "refused": 0},
    state(4400, 1, "draining"),
    state(4600, 1, "terminated"),
    {"kind": "anomaly", "time_us": 5000, "type": "hol_blocking", "count": 1, "instances": [0],
     "requests": [10], "severity": 2.0, "description": "instance 0 kept 1.00 requests waiting"},
]

#: P/D: request 1 is prefilled on instance 0 (routed there at 100, "completed" there at the end
#: of [200, 1200)), its KV moves in [1200, 1500), it decodes on instance 1 and completes at the
#: end of [2000, 2500).
PD = [
    {"kind": "disaggregation", "time_us": 100, "request_id": 1, "disaggregate": True,
     "decode_instance": 1},
    routing(100, 1, 0, kind="prefill_routing"),
    batch(200, 0, 1000, admitted=[(1, 64)], completed=[1], kv_used=4),
    {"kind": "kv_transfer", "time_us": 1500, "request_id": 1, "transfer_start_us": 1200,
     "transfer_duration_us": 300, "kv_blocks": 4, "prefill_instance": 0, "decode_instance": 1},
    batch(1500, 1, 500, admitted=[(1, 1)], kv_used=5),
    batch(2000, 1, 500, decoding=1, completed=[1], kv_used=5),
]


# ---- the format's rules ----------------------------------------------------------------------


def _is_number(x):
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def enclosing(slices, event):
    """The X slices on ``event``'s track whose [ts, ts + dur] holds its ts."""
    return [x for x in slices[(event["pid"], event["tid"])]
            if x["ts"] <= event["ts"] <= x["ts"] + x["dur"]]


def check_trace_events(doc):
    """Assert the trace-event format's rules; returns the X slices per (pid, tid) and the flow
    events per id."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    names = {}
    slices = defaultdict(list)
    flows = defaultdict(list)
    pid_of_tid = {}
    for e in events:
        ph = e["ph"]
        assert ph in ("M", "X", "C", "i", *FLOW_PHASES), e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        # Perfetto keys threads by tid alone: one tid, one process.
        assert pid_of_tid.setdefault(e["tid"], e["pid"]) == e["pid"], e
        if ph == "M":
            assert e["name"] in METADATA_NAMES, e
            key = "name" if e["name"].endswith("_name") else "sort_index"
            names[(e["name"], e["pid"], e["tid"])] = e["args"][key]
        elif ph == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            assert isinstance(e["args"], dict), e
            slices[(e["pid"], e["tid"])].append(e)
        elif ph == "C":
            assert e["args"] and all(_is_number(v) for v in e["args"].values()), e
        elif ph == "i":
            assert e["s"] in ("t", "p", "g"), e
        else:
            assert isinstance(e["id"], int) and isinstance(e["cat"], str), e
            if ph != "s":
                assert e["bp"] == "e", e
            flows[(e["cat"], e["name"], e["id"])].append(e)
    for e in events:  # every track is named
        if e["ph"] != "M":
            assert ("process_name", e["pid"], e["pid"]) in names, e
            if e["ph"] != "C":
                assert ("thread_name", e["pid"], e["tid"]) in names, e
    for track, xs in slices.items():  # in order, never overlapping
        for a, b in zip(xs, xs[1:], strict=False):
            assert a["ts"] <= b["ts"], (track, a, b)
            assert a["ts"] + a["dur"] <= b["ts"], (track, a, b)
    for key, fs in flows.items():
        phases = [f["ph"] for f in fs]
        assert phases[0] == "s" and phases[-1] == "f", (key, phases)
        assert phases.count("s") == 1 and phases.count("f") == 1, (key, phases)
        assert [f["ts"] for f in fs] == sorted(f["ts"] for f in fs), key
        for f in fs:  # bound to the one slice enclosing it, strictly inside
            (x,) = enclosing(slices, f)
            assert x["ts"] < f["ts"] < x["ts"] + x["dur"], (key, f, x)
    return slices, flows


def tid_of(doc, pid, thread):
    (tid,) = [e["tid"] for e in doc["traceEvents"] if e["ph"] == "M"
              and e["name"] == "thread_name" and e["pid"] == pid and e["args"]["name"] == thread]
    return tid


def pid_of(doc, process):
    (pid,) = [e["pid"] for e in doc["traceEvents"] if e["ph"] == "M"
              and e["name"] == "process_name" and e["args"]["name"] == process]
    return pid


def of(doc, ph, pid=None, tid=None, name=None):
    return [e for e in doc["traceEvents"] if e["ph"] == ph
            and (pid is None or e["pid"] == pid) and (tid is None or e["tid"] == tid)
            and (name is None or e["name"] == name)]


def brief(events, *keys):
    return [tuple(e[k] for k in keys) for e in events]


# ---- hand-made traces ------------------------------------------------------------------------


def test_hand_trace_obeys_the_format():
    check_trace_events(timeline_events(HAND))
    check_trace_events(timeline_events(PD))


def test_processes_are_named_and_sorted_cluster_first():
    doc = timeline_events(HAND)
    sort = {e["pid"]: e["args"]["sort_index"] for e in of(doc, "M", name="process_sort_index")}
    pids = [pid_of(doc, p) for p in ("cluster", "instance_0", "instance_1")]
    assert [sort[p] for p in pids] == [0, 1, 2]
    assert len(set(pids)) == 3


def test_steps_are_slices_named_by_their_work_and_cut_at_the_next_step():
    doc = timeline_events(HAND)
    pid0, pid1 = pid_of(doc, "instance_0"), pid_of(doc, "instance_1")
    steps0 = of(doc, "X", pid0, tid_of(doc, pid0, "steps"))
    assert brief(steps0, "ts", "dur", "name") == [
        (1500, 2000, "prefill"), (3500, 700, "decode"), (4200, 800, "prefill")]
    assert brief(of(doc, "X", pid1, tid_of(doc, pid1, "steps")), "ts", "dur", "name") == [
        (3000, 1000, "prefill")]
    cut = steps0[1]["args"]
    assert cut["duration_us"] == 1000  # the record's, though the slice is 700
    assert (cut["batch_size"], cut["completed"], cut["admitted"], cut["decoding"]) == (
        1, [7], [], 1)
    last = steps0[2]["args"]
    assert (last["admitted"], last["preempted"], last["token_budget_left"],
            last["prefill_tokens"], last["queue_depth"]) == ([10], [11], 2040, 8, 1)


def test_counters_sample_every_step_and_the_idle_ends():
    doc = timeline_events(HAND)
    pid0, pid1 = pid_of(doc, "instance_0"), pid_of(doc, "instance_1")

    def series(pid, name, key):
        return [(e["ts"], e["args"][key]) for e in of(doc, "C", pid, name=name)]

    # Instance 0 steps back to back (the cut one too) and ends at 5000 with 10 still running.
    assert series(pid0, "queue", "depth") == [(1500, 0), (3500, 2), (4200, 1), (5000, 1)]
    assert series(pid0, "batch", "size") == [(1500, 1), (3500, 1), (4200, 1), (5000, 1)]
    assert series(pid0, "kv", "utilization") == [(1500, 0.02), (3500, 0.03), (4200, 0.04),
                                                 (5000, 0.04)]
    # Instance 1's only step completes its only request: empty batch, no KV after it.
    assert series(pid1, "batch", "size") == [(3000, 1), (4000, 0)]
    assert series(pid1, "kv", "utilization") == [(3000, 0.01), (4000, 0.0)]


def test_routing_slices_take_a_second_lane_when_decisions_are_close():
    doc = timeline_events(HAND)
    router, router2 = tid_of(doc, 1, "router"), tid_of(doc, 1, "router 2")
    (first,) = of(doc, "X", 1, router)
    (second,) = of(doc, "X", 1, router2)
    assert brief([first, second], "ts", "dur", "name") == [(1000, 100, "route"),
                                                          (1040, 100, "route")]
    assert (first["args"]["request_id"], first["args"]["chosen_instance"],
            first["args"]["scores"]) == (7, 0, [0.5, 0.25])
    assert second["args"]["request_id"] == 9


def test_flows_run_from_routing_slice_to_completing_step():
    doc = timeline_events(HAND)
    pid0, pid1 = pid_of(doc, "instance_0"), pid_of(doc, "instance_1")
    router, router2 = tid_of(doc, 1, "router"), tid_of(doc, 1, "router 2")
    steps0, steps1 = tid_of(doc, pid0, "steps"), tid_of(doc, pid1, "steps")
    flows = [e for e in doc["traceEvents"] if e["ph"] in FLOW_PHASES]
    # 1 µs inside the routing slice; 1 µs before the end of the (cut) completing step.
    assert sorted(brief(flows, "id", "ph", "pid", "tid", "ts")) == [
        (7, "f", pid0, steps0, 4199), (7, "s", 1, router, 1001),
        (9, "f", pid1, steps1, 3999), (9, "s", 1, router2, 1041)]
    assert {(e["cat"], e["name"]) for e in flows} == {("request", "request")}


def test_cluster_instants():
    doc = timeline_events(HAND)
    assert brief(of(doc, "i", 1, tid_of(doc, 1, "rejections")), "ts", "name") == [
        (2000, "admission rejected"), (4300, "routing rejected")]
    rejected = of(doc, "i", 1, name="routing rejected")[0]["args"]
    assert rejected == {"request_id": 12, "reason": "no routable instance"}
    (scale,) = of(doc, "i", 1, tid_of(doc, 1, "autoscaler"))
    assert (scale["ts"], scale["name"], scale["args"]["drained"]) == (4400, "scale -1", [1])
    assert brief(of(doc, "i", 1, tid_of(doc, 1, "lifecycle")), "ts", "name") == [
        (0, "instance_0 active"), (0, "instance_1 active"), (4400, "instance_1 draining"),
        (4600, "instance_1 terminated")]
    (anomaly,) = of(doc, "i", 1, tid_of(doc, 1, "anomalies"))
    assert (anomaly["ts"], anomaly["name"], anomaly["args"]["description"]) == (
        5000, "hol_blocking", "instance 0 kept 1.00 requests waiting")


def test_instance_state_slices_and_preemptions():
    doc = timeline_events(HAND)
    pid0, pid1 = pid_of(doc, "instance_0"), pid_of(doc, "instance_1")
    # The trace's last moment is 5000 (the last step's end, the anomaly).
    assert brief(of(doc, "X", pid0, tid_of(doc, pid0, "state")), "ts", "dur", "name") == [
        (0, 5000, "active")]
    assert brief(of(doc, "X", pid1, tid_of(doc, pid1, "state")), "ts", "dur", "name") == [
        (0, 4400, "active"), (4400, 200, "draining")]
    (pre,) = of(doc, "i", pid0, tid_of(doc, pid0, "preemptions"))
    assert (pre["ts"], pre["args"]["request_id"], pre["args"]["for_request_id"]) == (4200, 11,
                                                                                       10)


def test_pd_flow_passes_the_prefill_instance_and_the_kv_transfer():
    doc = timeline_events(PD)
    pid0, pid1 = pid_of(doc, "instance_0"), pid_of(doc, "instance_1")
    flows = [e for e in doc["traceEvents"] if e["ph"] in FLOW_PHASES]
    assert brief(flows, "ph", "pid", "tid", "ts") == [
        ("s", 1, tid_of(doc, 1, "router"), 101),
        ("t", pid0, tid_of(doc, pid0, "steps"), 1199),
        ("t", 1, tid_of(doc, 1, "kv_transfer"), 1499),
        ("f", pid1, tid_of(doc, pid1, "steps"), 2499)]
    (route,) = of(doc, "X", 1, name="prefill route")
    assert (route["args"]["disaggregate"], route["args"]["decode_instance"]) == (True, 1)
    (transfer,) = of(doc, "X", 1, name="kv_transfer")
    assert (transfer["ts"], transfer["dur"], transfer["args"]["kv_blocks"]) == (1200, 300, 4)


def test_assign_lanes():
    assert assign_lanes([]) == []
    # [0,10) lane 0; [5,15) lane 1; [10,20) reuses lane 0; [12,13) lane 2; [15,16) lane 1.
    assert assign_lanes([(0, 10), (5, 15), (10, 20), (12, 13), (15, 16)]) == [0, 1, 0, 2, 1]


def test_unknown_and_full_level_kinds_are_ignored():
    extra = [{"kind": "event", "time_us": 10, "event": "arrival", "instance": -1,
              "request_id": 7},
             {"kind": "priority", "time_us": 1500, "instance": 0, "policy": "constant",
              "scheduler": "fcfs", "considered": [], "passed_over": 0}]
    with_extra = timeline_events(HAND + extra)
    assert with_extra["traceEvents"] == timeline_events(HAND)["traceEvents"]


def test_write_timeline_is_compact_deterministic_and_atomic(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_timeline(a, HAND)
    write_timeline(b, list(HAND))
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    assert '": ' not in text and ', "' not in text  # no spaces after separators
    assert json.loads(text) == timeline_events(HAND)
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json"]  # no temporary file left


# ---- real runs -------------------------------------------------------------------------------


@cache
def traced_lines(config: str, n: int) -> tuple[dict, ...]:
    """The decision trace of ``config`` (repo-relative) on its workload's first ``n``
    requests."""
    from blisjax.config import load_config, resolve_config
    from blisjax.trace import simulate_traced
    from blisjax.workload import generate_workload, parse_workload_spec

    cfg = load_config(REPO / config)
    workload = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed).head(n)
    _, trace = simulate_traced(resolve_config(cfg), workload, "decisions", 2)
    return tuple(trace.lines())


REAL = [("configs/default.yaml", 200), ("configs/search/pd-split.yaml", 100)]


@pytest.mark.parametrize(("config", "n"), REAL)
def test_real_run_obeys_the_format_and_counts_match_the_records(config, n):
    lines = list(traced_lines(config, n))
    doc = timeline_events(lines)
    slices, flows = check_trace_events(doc)
    batches = [x for x in lines if x["kind"] == "batch"]
    routed = {x["request_id"] for x in lines if x["kind"] in ("routing", "prefill_routing")}
    completed = {r for x in batches for r in x["completed"]}
    assert completed and completed <= routed
    # One step slice per batch record, on its instance's track, in the same order.
    by_instance = Counter(x["instance"] for x in batches)
    for k, count in by_instance.items():
        pid = pid_of(doc, f"instance_{k}")
        steps = slices[(pid, tid_of(doc, pid, "steps"))]
        assert len(steps) == count
        mine = [x for x in batches if x["instance"] == k]
        assert [s["ts"] for s in steps] == [x["time_us"] for x in mine]
        assert [s["args"]["completed"] for s in steps] == [x["completed"] for x in mine]
    assert len(of(doc, "X", 1)) >= len([x for x in lines if x["kind"] in (
        "routing", "prefill_routing")])
    # One flow per completed request, from its routing slice to a step that completed it (the
    # last such step: P/D requests complete on their prefill instance first).
    assert {key[2] for key in flows} == completed
    last_done = {}
    for x in batches:
        for r in x["completed"]:
            last_done[r] = max(last_done.get(r, 0), x["time_us"])
    for (_, _, r), events in flows.items():
        (start,) = enclosing(slices, events[0])
        assert start["args"]["request_id"] == r
        (end,) = enclosing(slices, events[-1])
        assert r in end["args"]["completed"] and end["ts"] == last_done[r]
    # Counters: three per sample, a sample per step plus one per step followed by idle time.
    idle_ends = 0
    for k in by_instance:
        mine = [x for x in batches if x["instance"] == k]
        idle_ends += 1 + sum(1 for a, b in zip(mine, mine[1:], strict=False)
                             if b["time_us"] > a["time_us"] + a["duration_us"])
    assert len(of(doc, "C")) == 3 * (len(batches) + idle_ends)


def test_real_run_timeline_file_round_trips(tmp_path):
    lines = list(traced_lines(*REAL[0]))
    write_timeline(tmp_path / "timeline.json", lines)
    assert json.loads((tmp_path / "timeline.json").read_text()) == timeline_events(lines)


# ---- a real viewer ---------------------------------------------------------------------------


def _trace_processor(path):
    """Perfetto's trace processor on ``path``, or a skip: the ``perfetto`` package runs the
    ``trace_processor_shell`` binary named by ``BLISJAX_TRACE_PROCESSOR`` or downloads its
    pinned one, which needs the network."""
    tp_api = pytest.importorskip("perfetto.trace_processor")
    config = tp_api.TraceProcessorConfig(bin_path=os.environ.get("BLISJAX_TRACE_PROCESSOR"))
    try:
        return tp_api.TraceProcessor(trace=str(path), config=config)
    except Exception as exc:  # any start-up failure: no viewer here
        pytest.skip(f"Perfetto trace processor unavailable: {type(exc).__name__}: {exc}")


def test_perfetto_trace_processor_reads_the_timeline(tmp_path):
    lines = list(traced_lines(*REAL[0]))
    path = tmp_path / "timeline.json"
    write_timeline(path, lines)
    tp = _trace_processor(path)
    try:
        def count(sql):
            return int(next(iter(tp.query(sql))).n)

        batches = [x for x in lines if x["kind"] == "batch"]
        routings = [x for x in lines if x["kind"] in ("routing", "prefill_routing")]
        instants = sum(1 for x in lines if x["kind"] in (
            "instance_state", "anomaly", "scale_actuation", "scale_decision", "preemption",
            "routing_rejection") or (x["kind"] == "admission" and not x["admitted"]))
        doc = timeline_events(lines)
        state_slices = len(of(doc, "X")) - len(batches) - len(routings)
        assert count("select count(*) as n from slice where category = 'step'") == len(batches)
        assert count("select count(*) as n from slice where category = 'routing'") == len(
            routings)
        assert count("select count(*) as n from slice") == (
            len(batches) + len(routings) + state_slices + instants)
        completed = {r for x in batches for r in x["completed"]}
        assert count("select count(*) as n from flow") == len(completed)
        assert count("select count(*) as n from counter") == len(of(doc, "C"))
    finally:
        tp.close()
