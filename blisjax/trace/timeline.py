"""A decision trace as a Chrome/Perfetto timeline (trace-event JSON, "JSON object format").

``timeline_events(lines)`` turns the JSON objects of ``trace.jsonl`` (``Trace.lines()`` or
``read_jsonl``) into ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``;
``write_timeline`` writes it, compact and deterministic, for ui.perfetto.dev or
chrome://tracing. ``ts`` and ``dur`` of the format are microseconds, the records' unit, so
times are copied unchanged.

Tracks (a process per instance, plus one for the cluster; thread ids are unique over the whole
file because Perfetto keys threads by ``tid`` alone):

* ``instance_<k>`` (pid ``100 + k``): thread ``steps``, one complete slice (``X``) per ``batch``
  record, named by its work (``prefill+decode``, ``prefill``, ``decode``, ``empty step``); thread
  ``state``, a slice per lifecycle state (``loading``, ``active``, ``draining``) up to the next
  change; thread ``preemptions``, an instant per ``preemption`` record; counters ``queue
  depth``, ``batch size`` and ``kv utilization`` (``kv_used_blocks / kv_total_blocks``), sampled
  at every step start (the record's state after batch formation) and at the end of every step
  the instance then sits idle after, or that is its last: there the batch size drops by the
  step's completions, the queue depth holds and the KV utilization is 0 if the batch emptied
  (completions free their blocks; otherwise it holds, the record says nothing newer).
* ``cluster`` (pid 1): ``router`` lanes, a ``ROUTING_SLICE_US`` slice per ``routing`` /
  ``prefill_routing`` decision (decisions closer than that take the next lane, so slices never
  overlap); ``kv_transfer`` lanes (P/D), a slice per transfer; instants on ``rejections``
  (admission refusals, routing rejections), ``autoscaler`` (scale decisions and actuations),
  ``lifecycle`` (every ``instance_state``) and ``anomalies`` (with their description).
* Flows (``s`` … ``t`` … ``f``, ``cat`` and ``name`` ``request``, ``id`` the request id), one per
  request that was routed and completed: from its first routing slice to the step slice in which
  it completed, through (P/D) the prefill instance's step that finished its prefill and its KV
  transfer. Every flow event binds to the slice enclosing it (``"bp": "e"`` on ``t`` and ``f``;
  ``s`` always does): it sits 1 µs inside that slice (its first µs after the start for the routing
  slice, its last µs for a step), so neither a slice starting nor one ending at the same instant
  can capture it.

A step slice never overlaps the next step of its instance: a ``batch`` record whose
``time_us + duration_us`` passes the next step's start (records do this when the step's
completions empty the batch and a new request arrives before that end) is cut at that start,
and its args keep the record's ``duration_us``. Kinds drawn nowhere: ``admission`` that admitted (the routing slice
follows), ``disaggregation`` (its decode instance is in the routing slice's args), ``priority``
and ``event``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from blisjax.atomicio import write_text_atomic

__all__ = ["CLUSTER_PID", "CounterSample", "ROUTING_KINDS", "ROUTING_SLICE_US", "Step",
           "assign_lanes", "counter_samples", "instance_pid", "instance_steps",
           "timeline_events", "write_timeline"]

#: Process id of the cluster (router, autoscaler, anomalies). Not 0: Perfetto keeps pid 0 for
#: the idle process.
CLUSTER_PID = 1
#: Process id of instance ``k`` is ``INSTANCE_PID_BASE + k``.
INSTANCE_PID_BASE = 100
#: Thread ids are ``pid * TID_STRIDE + j`` (j = 1, 2, … per process), unique across processes.
TID_STRIDE = 100_000
#: Width (µs) of a routing decision's slice: a decision is instantaneous, the slice only gives
#: the flow start something to bind to and the viewer something to click.
ROUTING_SLICE_US = 100

#: ``cat`` and ``name`` of the request flows (Perfetto matches flow events on id, cat, name).
FLOW_CAT = "request"
#: Record kinds that are routing decisions.
ROUTING_KINDS = ("routing", "prefill_routing")


def instance_pid(instance: int) -> int:
    """Process id of instance ``instance``'s tracks."""
    return INSTANCE_PID_BASE + instance


# ---- steps and counters ----------------------------------------------------------------------


class Step(NamedTuple):
    """One ``batch`` record as a slice: ``start_us`` its ``time_us``; ``end_us`` its
    ``time_us + duration_us``, cut at the next step's start on the same instance (µs)."""

    instance: int
    start_us: int
    end_us: int
    record: dict[str, Any]


class CounterSample(NamedTuple):
    """An instance's counters at ``time_us``: wait-queue length and running requests (counts),
    KV blocks in use as a fraction of the instance's blocks (0…1)."""

    time_us: int
    queue_depth: int
    batch_size: int
    kv_utilization: float


def instance_steps(lines: Iterable[dict[str, Any]]) -> dict[int, list[Step]]:
    """The ``batch`` records per instance, by start time (ties keep record order), each cut so
    that it ends no later than the next one starts. Keys in instance order."""
    by_instance: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        if line["kind"] == "batch":
            by_instance[line["instance"]].append(line)
    out: dict[int, list[Step]] = {}
    for k in sorted(by_instance):
        records = sorted(by_instance[k], key=lambda r: r["time_us"])  # stable: ties in order
        steps = []
        for i, rec in enumerate(records):
            end = rec["time_us"] + rec["duration_us"]
            if i + 1 < len(records):
                end = min(end, records[i + 1]["time_us"])
            steps.append(Step(k, rec["time_us"], end, rec))
        out[k] = steps
    return out


def _kv_utilization(rec: dict[str, Any]) -> float:
    total = rec["kv_total_blocks"]
    return rec["kv_used_blocks"] / total if total > 0 else 0.0


def counter_samples(steps: Sequence[Step]) -> list[CounterSample]:
    """One instance's counter samples (time order): the record's state at every step start,
    and at the end of a step followed by idle time (or by nothing) the batch without the step's
    completions, the queue depth unchanged, and the KV utilization 0 if that batch is empty
    (unchanged otherwise)."""
    out = []
    for i, step in enumerate(steps):
        rec = step.record
        kv = _kv_utilization(rec)
        out.append(CounterSample(step.start_us, rec["queue_depth"], rec["batch_size"], kv))
        idle_after = i + 1 == len(steps) or steps[i + 1].start_us > step.end_us
        if idle_after:
            running = rec["batch_size"] - len(rec["completed"])
            # Requests hold KV blocks only while running (completion frees them), so a batch
            # that emptied holds none; otherwise the record says nothing newer.
            out.append(CounterSample(step.end_us, rec["queue_depth"], running,
                                     kv if running > 0 else 0.0))
    return out


def _step_name(rec: dict[str, Any]) -> str:
    prefill = bool(rec["admitted"] or rec["prefill_chunks"])
    decode = rec["decoding"] > 0
    if prefill and decode:
        return "prefill+decode"
    if prefill:
        return "prefill"
    return "decode" if decode else "empty step"


# ---- lanes and tracks ------------------------------------------------------------------------


def assign_lanes(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """Lane (0, 1, …) of each ``(start_us, end_us)`` interval, given in start order: the lowest
    lane whose last interval ended at or before this start, so a lane's intervals never
    overlap."""
    lane_end: list[int] = []
    out = []
    for start, end in intervals:
        lane = next((i for i, busy_until in enumerate(lane_end) if busy_until <= start),
                    len(lane_end))
        if lane == len(lane_end):
            lane_end.append(end)
        else:
            lane_end[lane] = end
        out.append(lane)
    return out


class _Tracks:
    """Processes and threads in creation order, with their ``M`` events."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, Any]] = []
        self._tids: dict[tuple[int, str], int] = {}
        self._count: dict[int, int] = defaultdict(int)

    def process(self, pid: int, name: str, sort_index: int) -> None:
        # tid = pid (the main thread) rather than 0: Perfetto keeps tid 0 for the idle thread.
        self.metadata.append(_meta("process_name", pid, pid, {"name": name}))
        self.metadata.append(_meta("process_sort_index", pid, pid, {"sort_index": sort_index}))

    def thread(self, pid: int, name: str) -> int:
        """The tid of ``name`` in ``pid``, created (named and sorted after the process's
        earlier threads) on first use."""
        key = (pid, name)
        if key not in self._tids:
            self._count[pid] += 1
            tid = pid * TID_STRIDE + self._count[pid]
            self._tids[key] = tid
            self.metadata.append(_meta("thread_name", pid, tid, {"name": name}))
            self.metadata.append(_meta("thread_sort_index", pid, tid,
                                       {"sort_index": self._count[pid]}))
        return self._tids[key]


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": args}


def _slice(pid: int, tid: int, ts: int, dur: int, name: str, cat: str,
           args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _instant(pid: int, tid: int, ts: int, name: str, cat: str,
             args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
            "args": args}


def _counter(pid: int, tid: int, ts: int, name: str, key: str,
             value: float) -> dict[str, Any]:
    # Perfetto names the track "<name> <key>": "queue depth", "batch size", "kv utilization".
    return {"ph": "C", "name": name, "pid": pid, "tid": tid, "ts": ts, "args": {key: value}}


def _flow(ph: str, pid: int, tid: int, ts: int, request_id: int) -> dict[str, Any]:
    event = {"ph": ph, "name": FLOW_CAT, "cat": FLOW_CAT, "id": request_id, "pid": pid,
             "tid": tid, "ts": ts}
    if ph != "s":
        event["bp"] = "e"
    return event


def _first_inside(start_us: int, end_us: int) -> int:
    """A time strictly inside ``[start_us, end_us]`` just after the start (the start itself
    for slices shorter than 2 µs)."""
    return start_us + 1 if end_us - start_us >= 2 else start_us


def _last_inside(start_us: int, end_us: int) -> int:
    """A time strictly inside ``[start_us, end_us]`` just before the end."""
    return end_us - 1 if end_us - start_us >= 2 else start_us


class _Anchor(NamedTuple):
    """Where a request's flow passes: a time inside a slice, and that slice's track."""

    time_us: int
    pid: int
    tid: int


# ---- the timeline ----------------------------------------------------------------------------


def _instances(lines: Sequence[dict[str, Any]]) -> list[int]:
    seen: set[int] = set()
    for line in lines:
        kind = line["kind"]
        if kind in ("batch", "instance_state", "preemption", "priority"):
            seen.add(line["instance"])
        elif kind in ROUTING_KINDS:
            seen.add(line["chosen_instance"])
        elif kind == "kv_transfer":
            seen.update((line["prefill_instance"], line["decode_instance"]))
    return sorted(seen)


def _end_us(lines: Sequence[dict[str, Any]], steps: dict[int, list[Step]]) -> int:
    ends = [line["time_us"] for line in lines]
    ends += [s[-1].end_us for s in steps.values() if s]
    ends += [line["transfer_start_us"] + line["transfer_duration_us"]
             for line in lines if line["kind"] == "kv_transfer"]
    ends += [line["time_us"] + ROUTING_SLICE_US for line in lines if line["kind"] in ROUTING_KINDS]
    return max(ends, default=0)


def _step_events(tracks: _Tracks, steps: dict[int, list[Step]],
                 completions: dict[int, list[_Anchor]]) -> list[dict[str, Any]]:
    """Step slices and counters of every instance; fills ``completions`` (request id → the
    anchors of the steps it completed in)."""
    events = []
    for k, instance_steps_ in steps.items():
        pid = instance_pid(k)
        tid = tracks.thread(pid, "steps")
        for step in instance_steps_:
            rec = step.record
            args: dict[str, Any] = {
                "batch_size": rec["batch_size"],
                "queue_depth": rec["queue_depth"],
                "admitted": [c["request_id"] for c in rec["admitted"]],
                "prefill_chunks": [c["request_id"] for c in rec["prefill_chunks"]],
                "prefill_tokens": sum(c["tokens"] for c in rec["admitted"])
                + sum(c["tokens"] for c in rec["prefill_chunks"]),
                "decoding": rec["decoding"],
                "preempted": list(rec["preempted"]),
                "completed": list(rec["completed"]),
                "token_budget_left": rec["token_budget_left"],
                "kv_used_blocks": rec["kv_used_blocks"],
                "kv_total_blocks": rec["kv_total_blocks"],
                "duration_us": rec["duration_us"],
            }
            events.append(_slice(pid, tid, step.start_us, step.end_us - step.start_us,
                                 _step_name(rec), "step", args))
            anchor = _Anchor(_last_inside(step.start_us, step.end_us), pid, tid)
            for request_id in rec["completed"]:
                completions[request_id].append(anchor)
        for sample in counter_samples(instance_steps_):
            events.append(_counter(pid, tid, sample.time_us, "queue", "depth",
                                   sample.queue_depth))
            events.append(_counter(pid, tid, sample.time_us, "batch", "size",
                                   sample.batch_size))
            events.append(_counter(pid, tid, sample.time_us, "kv", "utilization",
                                   sample.kv_utilization))
    return events


def _routing_events(tracks: _Tracks, lines: Sequence[dict[str, Any]],
                    arrivals: dict[int, _Anchor]) -> list[dict[str, Any]]:
    """Routing slices on the router lanes; fills ``arrivals`` (request id → its first routing
    decision's anchor)."""
    decisions = sorted((x for x in lines if x["kind"] in ROUTING_KINDS),
                       key=lambda x: x["time_us"])
    split = {x["request_id"]: x for x in lines if x["kind"] == "disaggregation"}
    lanes = assign_lanes([(x["time_us"], x["time_us"] + ROUTING_SLICE_US) for x in decisions])
    events = []
    for x, lane in zip(decisions, lanes, strict=True):
        tid = tracks.thread(CLUSTER_PID, "router" if lane == 0 else f"router {lane + 1}")
        args: dict[str, Any] = {
            "request_id": x["request_id"], "chosen_instance": x["chosen_instance"],
            "reason": x["reason"], "input_tokens": x["input_tokens"],
            "prefix_group": x["prefix_group"], "tenant": x["tenant"],
            "slo_class": x["slo_class"], "scores": x["scores"], "regret": x["regret"]}
        if x["request_id"] in split:
            args["disaggregate"] = split[x["request_id"]]["disaggregate"]
            args["decode_instance"] = split[x["request_id"]]["decode_instance"]
        name = "route" if x["kind"] == "routing" else "prefill route"
        ts = x["time_us"]
        events.append(_slice(CLUSTER_PID, tid, ts, ROUTING_SLICE_US, name, "routing", args))
        arrivals.setdefault(x["request_id"],
                            _Anchor(_first_inside(ts, ts + ROUTING_SLICE_US), CLUSTER_PID, tid))
    return events


def _transfer_events(tracks: _Tracks, lines: Sequence[dict[str, Any]],
                     hand_offs: dict[int, list[_Anchor]]) -> list[dict[str, Any]]:
    """P/D: KV transfer slices on the kv_transfer lanes; adds each to ``hand_offs``."""
    transfers = sorted((x for x in lines if x["kind"] == "kv_transfer"),
                       key=lambda x: x["transfer_start_us"])
    spans = [(x["transfer_start_us"], x["transfer_start_us"] + x["transfer_duration_us"])
             for x in transfers]
    events = []
    for x, (start, end), lane in zip(transfers, spans, assign_lanes(spans), strict=True):
        tid = tracks.thread(CLUSTER_PID, "kv_transfer" if lane == 0 else f"kv_transfer {lane + 1}")
        args = {k: x[k] for k in ("request_id", "kv_blocks", "prefill_instance",
                                  "decode_instance")}
        events.append(_slice(CLUSTER_PID, tid, start, end - start, "kv_transfer", "kv_transfer",
                             args))
        hand_offs[x["request_id"]].append(_Anchor(_last_inside(start, end), CLUSTER_PID, tid))
    return events


def _cluster_instants(tracks: _Tracks, lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rejections, autoscaler, lifecycle and anomaly instants on the cluster's threads."""
    events = []
    for x in lines:
        kind, ts = x["kind"], x["time_us"]
        if kind == "admission" and not x["admitted"]:
            tid = tracks.thread(CLUSTER_PID, "rejections")
            events.append(_instant(CLUSTER_PID, tid, ts, "admission rejected", "admission",
                                   {"request_id": x["request_id"], "reason": x["reason"]}))
        elif kind == "routing_rejection":
            tid = tracks.thread(CLUSTER_PID, "rejections")
            events.append(_instant(CLUSTER_PID, tid, ts, "routing rejected", "routing",
                                   {"request_id": x["request_id"], "reason": x["reason"]}))
        elif kind in ("scale_decision", "scale_actuation"):
            tid = tracks.thread(CLUSTER_PID, "autoscaler")
            args = {k: v for k, v in x.items() if k not in ("kind", "time_us")}
            name = "scale decision" if kind == "scale_decision" else f"scale {x['delta']:+d}"
            events.append(_instant(CLUSTER_PID, tid, ts, name, "autoscaler", args))
        elif kind == "instance_state":
            tid = tracks.thread(CLUSTER_PID, "lifecycle")
            events.append(_instant(CLUSTER_PID, tid, ts,
                                   f"instance_{x['instance']} {x['state']}", "lifecycle",
                                   {"instance": x["instance"], "state": x["state"]}))
        elif kind == "anomaly":
            tid = tracks.thread(CLUSTER_PID, "anomalies")
            args = {k: x[k] for k in ("description", "instances", "requests", "severity",
                                      "count")}
            events.append(_instant(CLUSTER_PID, tid, ts, x["type"], "anomaly", args))
    return events


def _instance_extras(tracks: _Tracks, lines: Sequence[dict[str, Any]],
                     end_us: int) -> list[dict[str, Any]]:
    """Per instance: lifecycle state slices (each state until the instance's next change, the
    last until ``end_us``; ``terminated`` ends the previous and draws none) and preemption
    instants."""
    events = []
    states: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        if x["kind"] == "instance_state":
            states[x["instance"]].append(x)
        elif x["kind"] == "preemption":
            pid = instance_pid(x["instance"])
            args = {k: x[k] for k in ("request_id", "for_request_id", "policy", "tokens_lost",
                                      "reason")}
            events.append(_instant(pid, tracks.thread(pid, "preemptions"), x["time_us"],
                                   "preemption", "preemption", args))
    for k in sorted(states):
        changes = sorted(states[k], key=lambda x: x["time_us"])
        pid = instance_pid(k)
        for i, x in enumerate(changes):
            start = x["time_us"]
            end = changes[i + 1]["time_us"] if i + 1 < len(changes) else end_us
            # Zero-length states (two changes at one time) would nest in the viewers.
            if x["state"] != "terminated" and end > start:
                events.append(_slice(pid, tracks.thread(pid, "state"), start, end - start,
                                     x["state"], "lifecycle", {"state": x["state"]}))
    return events


def _flow_events(arrivals: dict[int, _Anchor], completions: dict[int, list[_Anchor]],
                 hand_offs: dict[int, list[_Anchor]]) -> list[dict[str, Any]]:
    """One flow per request with a routing decision and a completion: ``s`` at the routing
    slice, ``t`` at each earlier completion (P/D prefill) and KV transfer, ``f`` at the last
    completion; hops out of time order are dropped so the flow only moves forward."""
    events = []
    for request_id in sorted(completions.keys() & arrivals.keys()):
        start = arrivals[request_id]
        done = sorted(completions[request_id])
        final = done[-1]
        hops = sorted(done[:-1] + hand_offs.get(request_id, []))
        events.append(_flow("s", start.pid, start.tid, start.time_us, request_id))
        for hop in hops:
            if start.time_us <= hop.time_us <= final.time_us:
                events.append(_flow("t", hop.pid, hop.tid, hop.time_us, request_id))
        events.append(_flow("f", final.pid, final.tid, final.time_us, request_id))
    return events


def timeline_events(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace-event JSON object of a decision trace's records (``trace.jsonl``'s objects, any
    level). Events: metadata first (process/thread names and sort order), then every other
    event by ``ts`` (ties in the order built, flow events last)."""
    lines = list(lines)
    tracks = _Tracks()
    tracks.process(CLUSTER_PID, "cluster", 0)
    for k in _instances(lines):
        tracks.process(instance_pid(k), f"instance_{k}", k + 1)
    steps = instance_steps(lines)
    end_us = _end_us(lines, steps)
    arrivals: dict[int, _Anchor] = {}
    completions: dict[int, list[_Anchor]] = defaultdict(list)
    hand_offs: dict[int, list[_Anchor]] = defaultdict(list)
    events = _routing_events(tracks, lines, arrivals)
    events += _transfer_events(tracks, lines, hand_offs)
    events += _cluster_instants(tracks, lines)
    events += _step_events(tracks, steps, completions)
    events += _instance_extras(tracks, lines, end_us)
    events += _flow_events(arrivals, completions, hand_offs)
    events.sort(key=lambda e: e["ts"])  # stable: ties keep the order built
    return {"traceEvents": tracks.metadata + events, "displayTimeUnit": "ms",
            "otherData": {"generator": "blisjax decision trace", "time_unit": "us",
                          "end_us": end_us}}


def write_timeline(path: str | Path, lines: list[dict[str, Any]]) -> None:
    """Write ``timeline_events(lines)`` to ``path`` atomically as compact JSON (same lines,
    same bytes)."""
    text = json.dumps(timeline_events(lines), separators=(",", ":"), allow_nan=False)
    write_text_atomic(path, text + "\n")
