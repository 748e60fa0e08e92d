"""A run's trace records indexed once into the typed view every other module reads.

Sources: routing snapshots and counterfactual candidates give the ``Decision`` s, batch and
preemption records each request's ``Fate`` and each instance's ``QueueStats``; the other records
are kept by kind. Per-request TTFT and E2E are not in the trace, so they come from optional
``per_request_rows`` (``requests``). Without them a request's outcome is what the batch records
show, routing → first batch and routing → end of its last step, which bound TTFT and E2E from
below (the latency model's per-request overheads come on top).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple


class View(NamedTuple):
    """One candidate instance as the router saw it (a routing record's snapshot); ``score``
    is the policy's own (weighted routing), else None."""

    instance: int
    queue_depth: int
    batch_size: int
    in_flight: int
    kv_utilization: float
    cached_blocks: int
    score: float | None

    @property
    def load(self) -> int:
        """Effective load, requests: queued + running + in flight (the counterfactual's)."""
        return self.queue_depth + self.batch_size + self.in_flight


class Decision(NamedTuple):
    """A routing decision (``routing`` or P/D ``prefill_routing`` record); ``best`` is the top
    counterfactual candidate (-1 when the trace kept none: k = 0)."""

    index: int
    time_us: int
    request_id: int
    chosen: int
    policy: str
    prefill: bool
    input_tokens: int
    prefix_group: int
    slo_class: int
    views: tuple[View, ...]
    regret: float
    best: int

    def view(self, instance: int) -> View | None:
        """The snapshot of ``instance``, if it was a candidate."""
        return next((v for v in self.views if v.instance == instance), None)


class Fate(NamedTuple):
    """What became of a request, from the batch and preemption records: its first batch (µs,
    instance) and the end of its last step (µs; -1 = never), its preemptions; and from
    per-request rows when given, its TTFT and E2E (µs) and status (-1 / "" = unknown)."""

    first_batch_us: int
    first_instance: int
    done_us: int
    preemptions: int
    ttft_us: int
    e2e_us: int
    status: str


class QueueStats(NamedTuple):
    """An instance's steps (batch records): its wait queue's peak depth (requests) and when
    (µs), mean depth per step, and its running batch's mean and peak size (requests)."""

    instance: int
    steps: int
    peak_depth: int
    peak_us: int
    mean_depth: float
    mean_batch: float
    peak_batch: int


class RunView(NamedTuple):
    """Everything the sections read, indexed once."""

    config: Any
    metrics: dict
    decisions: tuple[Decision, ...]
    first_decision: dict[int, Decision]
    fates: dict[int, Fate]
    by_kind: dict[str, list[dict]]
    queues: dict[int, QueueStats]
    has_counterfactual: bool
    rows: dict[int, dict]


def _decision(index: int, rec: dict) -> Decision:
    scores = rec.get("scores")
    views = tuple(View(int(s["instance"]), int(s["queue_depth"]), int(s["batch_size"]),
                       int(s["in_flight"]), float(s["kv_utilization"]),
                       int(s.get("cached_blocks", 0)),
                       None if scores is None else float(scores[j]))
                  for j, s in enumerate(rec["snapshots"]))
    candidates = rec.get("candidates") or ()
    return Decision(index, int(rec["time_us"]), int(rec["request_id"]),
                    int(rec["chosen_instance"]), str(rec["reason"]),
                    rec["kind"] == "prefill_routing", int(rec["input_tokens"]),
                    int(rec["prefix_group"]), int(rec["slo_class"]), views,
                    float(rec["regret"]), int(candidates[0]["instance"]) if candidates else -1)


def _fates(batches: Iterable[dict], preemptions: Iterable[dict],
           rows: dict[int, dict]) -> dict[int, Fate]:
    first: dict[int, tuple[int, int]] = {}
    done: dict[int, int] = {}
    for b in batches:
        for c in b["admitted"]:
            first.setdefault(int(c["request_id"]), (int(b["time_us"]), int(b["instance"])))
        for rid in b["completed"]:  # a step's completions finish at its end
            done[int(rid)] = int(b["time_us"]) + int(b["duration_us"])
    evicted = Counter(int(p["request_id"]) for p in preemptions)
    out = {}
    for rid in sorted(set(first) | set(done) | set(rows)):
        row = rows.get(rid, {})
        fb, fi = first.get(rid, (-1, -1))
        ttft, e2e = row.get("ttft_us"), row.get("e2e_us")
        out[rid] = Fate(fb, fi, done.get(rid, -1), evicted.get(rid, 0),
                        -1 if ttft is None else int(ttft), -1 if e2e is None else int(e2e),
                        str(row.get("status", "")))
    return out


def _queues(batches: Iterable[dict]) -> dict[int, QueueStats]:
    # instance -> [steps, queue sum, queue peak, its time, batch sum, batch peak]
    acc: dict[int, list[int]] = {}
    for b in batches:
        a = acc.setdefault(int(b["instance"]), [0, 0, -1, 0, 0, 0])
        q, n = int(b["queue_depth"]), int(b["batch_size"])
        a[0] += 1
        a[1] += q
        if q > a[2]:
            a[2], a[3] = q, int(b["time_us"])
        a[4] += n
        a[5] = max(a[5], n)
    return {i: QueueStats(i, a[0], a[2], a[3], a[1] / a[0], a[4] / a[0], a[5])
            for i, a in sorted(acc.items())}


def index_run(lines: Sequence[dict], metrics: dict, config: Any,
              requests: Sequence[dict] | None = None) -> RunView:
    """Index a run's records (and optional ``per_request_rows``) for the sections."""
    by_kind: dict[str, list[dict]] = {}
    for rec in lines:
        by_kind.setdefault(rec["kind"], []).append(rec)
    routing = sorted(by_kind.get("routing", []) + by_kind.get("prefill_routing", []),
                     key=lambda r: (r["time_us"], r["request_id"], r["kind"] != "prefill_routing"))
    decisions = tuple(_decision(i, r) for i, r in enumerate(routing))
    first: dict[int, Decision] = {}
    for d in decisions:
        first.setdefault(d.request_id, d)
    rows = {int(r["request_id"]): dict(r) for r in requests or ()}
    batches = by_kind.get("batch", [])
    return RunView(config, metrics, decisions, first,
                   _fates(batches, by_kind.get("preemption", []), rows), by_kind,
                   _queues(batches), any(d.best >= 0 for d in decisions), rows)
