"""Decision-trace records: one frozen dataclass per line kind of ``trace.jsonl``.

Every record has a ``kind`` (the JSON line's ``"kind"``) and a simulated time ``time_us``;
requests are named by their workload ``request_id`` (as in ``--results-path``), instances by
their index (BLIS's ``instance_<k>``). ``as_json()`` gives the line's object; the JSON schema
of every kind is ``blisjax/data/schema/trace.schema.json`` and docs/tracing.md explains them.

Kinds, by trace level (docs/semantics.md Decision 17):

* ``decisions``: ``admission``, ``routing``, ``routing_rejection``, ``disaggregation``,
  ``prefill_routing``, ``kv_transfer`` (BLIS's records, docs/tracing.md, ``trace.jsonl``), ``priority``,
  ``batch``, ``preemption``, ``scale_decision``, ``scale_actuation``, ``instance_state`` and
  ``anomaly``;
* ``full``: the above plus one ``event`` per executed simulation event.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every record: its simulated time (µs)."""

    kind: ClassVar[str] = ""
    time_us: int

    def as_json(self) -> dict[str, Any]:
        """The JSON object of this record's line: ``kind`` first, then the fields in order."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


# ---- what the router saw --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One candidate instance as the router saw it at a decision: the (live or periodic)
    snapshot signals, the live in-flight count before this request's own increment, the
    request's leading prompt blocks cached there (the router's cache signal, live or
    delayed), and — in ``candidates`` — its counterfactual score."""

    instance: int
    queue_depth: int
    batch_size: int
    in_flight: int
    kv_utilization: float
    free_kv_blocks: int
    cached_blocks: int
    score: float | None = None


@dataclass(frozen=True, slots=True)
class RoutingRecord(Record):
    """A routing decision (BLIS's ``RoutingRecord``). ``scores``: the policy's score per
    candidate (weighted routing; ``None`` for round-robin, least-loaded, always-busiest);
    ``snapshots``: every candidate as seen; ``candidates``: the counterfactual top-k
    (``--counterfactual-k``; empty when k = 0) and ``regret`` = best score − chosen score
    (0 when k = 0, as BLIS)."""

    kind: ClassVar[str] = "routing"
    request_id: int
    chosen_instance: int
    reason: str
    input_tokens: int
    prefix_group: int
    tenant: int
    slo_class: int
    scores: tuple[float, ...] | None
    snapshots: tuple[InstanceView, ...]
    candidates: tuple[InstanceView, ...]
    regret: float


@dataclass(frozen=True, slots=True)
class PrefillRoutingRecord(RoutingRecord):
    """P/D: the prefill pool's decision for a disaggregated request (BLIS's
    ``PrefillRoutingRecord``), over the prefill pool's instances."""

    kind: ClassVar[str] = "prefill_routing"


@dataclass(frozen=True, slots=True)
class AdmissionRecord(Record):
    """An admission decision, admitted or not (BLIS's ``AdmissionRecord``)."""

    kind: ClassVar[str] = "admission"
    request_id: int
    admitted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class RoutingRejectionRecord(Record):
    """A request no instance could take (no routable instance: BLIS's routing rejection)."""

    kind: ClassVar[str] = "routing_rejection"
    request_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class DisaggregationRecord(Record):
    """P/D: the decider's answer for a request, after the decode instance was picked."""

    kind: ClassVar[str] = "disaggregation"
    request_id: int
    disaggregate: bool
    decode_instance: int


@dataclass(frozen=True, slots=True)
class KVTransferRecord(Record):
    """P/D: a completed KV transfer (BLIS's ``KVTransferRecord``), written at its end."""

    kind: ClassVar[str] = "kv_transfer"
    request_id: int
    transfer_start_us: int
    transfer_duration_us: int
    kv_blocks: int
    prefill_instance: int
    decode_instance: int


# ---- what an instance decided ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A waiting request as a step's batch formation considered it."""

    request_id: int
    arrival_us: int
    priority: float


@dataclass(frozen=True, slots=True)
class PriorityRecord(Record):
    """The scheduling order a step's batch formation used, when a priority policy or a
    non-FCFS scheduler ordered the wait queue: the requests it considered, in that order
    (those admitted, then the first left waiting), and ``passed_over``: requests still waiting
    that arrived before the latest-arriving admitted one."""

    kind: ClassVar[str] = "priority"
    instance: int
    policy: str
    scheduler: str
    considered: tuple[QueuedRequest, ...]
    passed_over: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens a request was given in a step (``cached_tokens``: prompt tokens found in the
    prefix cache when it was admitted)."""

    request_id: int
    tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BatchRecord(Record):
    """One step of an instance: who ran and how, at the step's start ``time_us``.

    ``admitted``: requests that joined the batch (their prefill chunks); ``prefill_chunks``:
    running requests given a further prefill chunk; ``decoding``: running requests that
    decoded one token; ``preempted``: requests evicted in this step; ``completed``: requests
    that finished at its end (``time_us + duration_us``). ``token_budget_left``: the token
    budget not used; the state after batch formation: ``batch_size``, ``queue_depth``,
    ``kv_used_blocks`` of ``kv_total_blocks``."""

    kind: ClassVar[str] = "batch"
    instance: int
    duration_us: int
    admitted: tuple[Chunk, ...]
    prefill_chunks: tuple[Chunk, ...]
    decoding: int
    preempted: tuple[int, ...]
    completed: tuple[int, ...]
    token_budget_left: int
    batch_size: int
    queue_depth: int
    kv_used_blocks: int
    kv_total_blocks: int


@dataclass(frozen=True, slots=True)
class PreemptionRecord(Record):
    """A running request evicted so that another could get KV blocks."""

    kind: ClassVar[str] = "preemption"
    instance: int
    request_id: int
    for_request_id: int
    policy: str
    tokens_lost: int
    reason: str


# ---- autoscaler and lifecycle ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleDecisionRecord(Record):
    """An autoscaler tick: what the policy wanted (``desired``), what the bounds and step
    limits allowed (``bounded``), and whether an actuation was scheduled (cooldown)."""

    kind: ClassVar[str] = "scale_decision"
    policy: str
    live: int
    routable: int
    queue_depth: int
    batch_size: int
    desired: int
    bounded: int
    actuate: bool


@dataclass(frozen=True, slots=True)
class ScaleActuationRecord(Record):
    """An actuation: instances placed and drained, placements refused."""

    kind: ClassVar[str] = "scale_actuation"
    delta: int
    placed: tuple[int, ...]
    drained: tuple[int, ...]
    refused: int


@dataclass(frozen=True, slots=True)
class InstanceStateRecord(Record):
    """An instance slot entering a lifecycle state (docs/autoscaling.md)."""

    kind: ClassVar[str] = "instance_state"
    instance: int
    state: str


# ---- anomalies and events --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnomalyRecord(Record):
    """An anomaly (docs/semantics.md Decision 18): ``type`` is ``priority_inversion``,
    ``hol_blocking``, ``scale_oscillation`` or ``kv_thrashing``; ``count``: how many of the
    metric's occurrences it stands for; ``requests`` and ``instances`` the ones involved."""

    kind: ClassVar[str] = "anomaly"
    type: str
    count: int
    instances: tuple[int, ...]
    requests: tuple[int, ...]
    severity: float
    description: str


@dataclass(frozen=True, slots=True)
class EventRecord(Record):
    """``full`` level: one executed simulation event (``instance`` −1 for cluster events,
    ``request_id`` −1 for events without a request)."""

    kind: ClassVar[str] = "event"
    event: str
    instance: int
    request_id: int


#: Every record type, by kind.
RECORD_TYPES: dict[str, type[Record]] = {
    t.kind: t for t in (AdmissionRecord, RoutingRecord, RoutingRejectionRecord,
                        DisaggregationRecord, PrefillRoutingRecord, KVTransferRecord,
                        PriorityRecord, BatchRecord, PreemptionRecord, ScaleDecisionRecord,
                        ScaleActuationRecord, InstanceStateRecord, AnomalyRecord, EventRecord)
}
