"""The reference engine's trace collector: the engine calls it at each decision.

A run without a trace has no collector (``None``): every hook in the engine is behind an
``is not None`` test, so untraced runs pay one attribute test per decision and nothing else.
The collector only reads the simulation's state; it never changes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from blisjax.config.codes import InstanceState, SchedulerPolicy, TraceLevel
from blisjax.trace.counterfactual import counterfactual
from blisjax.trace.records import (
    AdmissionRecord,
    AnomalyRecord,
    BatchRecord,
    Chunk,
    DisaggregationRecord,
    EventRecord,
    InstanceStateRecord,
    InstanceView,
    KVTransferRecord,
    PreemptionRecord,
    PrefillRoutingRecord,
    PriorityRecord,
    QueuedRequest,
    Record,
    RoutingRecord,
    RoutingRejectionRecord,
    ScaleActuationRecord,
    ScaleDecisionRecord,
)


@dataclass
class StepMark:
    """What a step looked like before its batch formation (collector-private)."""

    running: set[int]  # id() of the requests running before formation
    order: list  # the wait queue in scheduling order (only when a policy ordered it)
    finished: int  # length of the instance's finished list
    thrash_reloads: int
    preempted: list[int] = field(default_factory=list)
    admitted: tuple[Chunk, ...] = ()
    prefill_chunks: tuple[Chunk, ...] = ()
    decoding: int = 0
    budget_left: int = 0
    batch_size: int = 0
    queue_depth: int = 0
    kv_used_blocks: int = 0


class TraceCollector:
    """Collects the records of one reference run, in emission order.

    Args:
      level: ``TraceLevel.DECISIONS`` or ``FULL``.
      counterfactual_k: candidates kept per routing decision (0: no top-k and no regret,
        as BLIS).
      request_ids: the workload's request id of each request index.
    """

    def __init__(self, level: TraceLevel, counterfactual_k: int,
                 request_ids: Sequence[int]) -> None:
        if level == TraceLevel.NONE:
            raise ValueError("a collector records at level decisions or full")
        self.full = level == TraceLevel.FULL
        self.k = counterfactual_k
        self.ids = list(request_ids)
        self.records: list[Record] = []
        self._mark: StepMark | None = None  # the step being formed

    def request_id(self, req) -> int:
        """The workload request id of a reference-engine request (-1 for none)."""
        return -1 if req is None else self.ids[req.index]

    # ---- cluster decisions ---------------------------------------------------------------------
    def admission(self, req, time_us: int, admitted: bool, policy: str) -> None:
        reason = f"{policy}: {'admitted' if admitted else 'rejected'}"
        self.records.append(AdmissionRecord(time_us, self.request_id(req), admitted, reason))

    def routing(self, req, time_us: int, chosen: int, policy: str,
                scores: dict[int, float] | None, views: list[InstanceView],
                prefill: bool = False) -> None:
        """A routing decision among ``views`` (the candidates, in instance order)."""
        top, regret = counterfactual(views, scores, chosen, self.k)
        kind = PrefillRoutingRecord if prefill else RoutingRecord
        self.records.append(kind(
            time_us, self.request_id(req), chosen, policy, req.input_tokens, req.prefix_group,
            req.tenant, req.slo_class,
            None if scores is None else tuple(scores.get(v.instance, 0.0) for v in views),
            tuple(views), top, regret))

    def routing_rejection(self, req, time_us: int) -> None:
        self.records.append(RoutingRejectionRecord(time_us, self.request_id(req),
                                                   "no routable instance"))

    def disaggregation(self, req, time_us: int, disaggregate: bool, decode: int) -> None:
        self.records.append(DisaggregationRecord(time_us, self.request_id(req), disaggregate,
                                                 decode))

    def kv_transfer(self, req, time_us: int, start_us: int, kv_blocks: int, prefill: int,
                    decode: int) -> None:
        self.records.append(KVTransferRecord(time_us, self.request_id(req), start_us,
                                             max(0, time_us - start_us), kv_blocks, prefill,
                                             decode))

    # ---- instance steps --------------------------------------------------------------------------
    def before_batch(self, inst) -> None:
        """Called after the wait queue was ordered, before batch formation (a step runs
        within one event, so one step is open at a time)."""
        ordered = (inst.scheduler != SchedulerPolicy.FCFS or not inst.priority.is_constant)
        self._mark = StepMark(running={id(r) for r in inst.running},
                        order=list(inst.wait_queue) if ordered and len(inst.wait_queue) > 1
                        else [],
                        finished=len(inst.finished),
                        thrash_reloads=inst.kv.thrash_reloads if inst.tiered else 0)

    def preemption(self, inst, victim, for_req) -> None:
        """``victim`` is about to be evicted so that ``for_req`` gets KV blocks."""
        policy = inst.preemption_policy.label
        why = ("it needed KV blocks itself" if victim is for_req
               else f"request {self.request_id(for_req)} needed KV blocks")
        self.records.append(PreemptionRecord(
            inst.clock_us, inst.index, self.request_id(victim), self.request_id(for_req), policy,
            victim.progress_index, f"{policy} victim: {why}"))
        if self._mark is not None:
            self._mark.preempted.append(self.request_id(victim))

    def formed(self, inst) -> None:
        """Called after batch formation: who got which tokens."""
        mark = self._mark
        admitted, chunks, decoding = [], [], 0
        cached = inst._admitted_cached_tokens
        for r in inst.running:
            if id(r) not in mark.running:  # (a fully cached prompt is admitted with 0 tokens)
                admitted.append(Chunk(self.request_id(r), r.num_new_tokens, cached.get(r.index, 0)))
            elif r.num_new_tokens <= 0:
                continue
            elif r.progress_index < r.input_tokens:
                chunks.append(Chunk(self.request_id(r), r.num_new_tokens))
            else:
                decoding += 1
        mark.admitted, mark.prefill_chunks, mark.decoding = tuple(admitted), tuple(chunks), \
            decoding
        mark.budget_left = inst._budget
        mark.batch_size, mark.queue_depth = len(inst.running), len(inst.wait_queue)
        mark.kv_used_blocks = inst.kv.used_blocks
        if mark.order:
            self._priority(inst, mark)

    def _priority(self, inst, mark: StepMark) -> None:
        n = len(mark.admitted)
        considered = mark.order[:n + 1]
        latest = max((r.arrival_us for r in mark.order[:n]), default=None)
        passed = 0 if latest is None else sum(1 for r in mark.order[n:]
                                              if r.arrival_us < latest)
        self.records.append(PriorityRecord(
            inst.clock_us, inst.index, inst.priority.policy.label, inst.scheduler.label,
            tuple(QueuedRequest(self.request_id(r), r.arrival_us, r.priority) for r in considered),
            passed))

    def stepped(self, inst, now_us: int, duration_us: int) -> None:
        """Called at the end of a step: the batch record (and a thrashing anomaly)."""
        mark = self._mark
        completed = tuple(self.request_id(r) for r in inst.finished[mark.finished:])
        self.records.append(BatchRecord(
            now_us, inst.index, duration_us, mark.admitted, mark.prefill_chunks, mark.decoding,
            tuple(mark.preempted), completed, mark.budget_left, mark.batch_size,
            mark.queue_depth, mark.kv_used_blocks, inst.kv.total_blocks))
        if inst.tiered and inst.kv.thrash_reloads > mark.thrash_reloads:
            self.thrashing(inst, now_us, inst.kv.thrash_reloads - mark.thrash_reloads,
                           [c.request_id for c in mark.admitted])
        self._mark = None

    def thrashing(self, inst, time_us: int, count: int, requests: list[int]) -> None:
        window = inst.thrash_window_us
        self.records.append(AnomalyRecord(
            time_us, "kv_thrashing", count, (inst.index,), tuple(requests), float(count),
            f"instance {inst.index} reloaded {count} block(s) from the CPU tier less than "
            f"{window} us after their GPU copies were evicted"))

    # ---- autoscaler and lifecycle ------------------------------------------------------------------
    def scale_decision(self, time_us: int, policy: str, live: int, routable: int,
                       queue_depth: int, batch_size: int, desired: int, bounded: int,
                       actuate: bool) -> None:
        self.records.append(ScaleDecisionRecord(time_us, policy, live, routable, queue_depth,
                                                batch_size, desired, bounded, actuate))

    def scale_actuation(self, time_us: int, delta: int, placed: list[int], drained: list[int],
                        refused: int) -> None:
        self.records.append(ScaleActuationRecord(time_us, delta, tuple(placed), tuple(drained),
                                                 refused))

    def instance_state(self, time_us: int, slot: int, state: InstanceState) -> None:
        self.records.append(InstanceStateRecord(time_us, slot, state.label))

    def oscillation(self, time_us: int, direction: int, previous_us: int,
                    slots: list[int]) -> None:
        turn = "down after an up" if direction < 0 else "up after a down"
        self.records.append(AnomalyRecord(
            time_us, "scale_oscillation", 1, tuple(slots), (), 1.0,
            f"scaled {turn} at {previous_us / 1e6:.3f} s, within the cooldown"))

    # ---- full level ------------------------------------------------------------------------------
    def event(self, time_us: int, name: str, instance: int, req) -> None:
        self.records.append(EventRecord(time_us, name, instance, self.request_id(req)))
