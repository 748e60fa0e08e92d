"""A traced reference run, and the trace it gives: records, BLIS's summary, JSON Lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from blisjax.atomicio import write_text_atomic
from blisjax.config.codes import TraceLevel
from blisjax.metrics.records import RunResult
from blisjax.trace.anomalies import hol_blocking_records, priority_inversion_records
from blisjax.trace.collector import TraceCollector
from blisjax.trace.records import Record
from blisjax.trace.summary import TraceSummary, summarize


class Trace(NamedTuple):
    """A run's decision trace: ``records`` in emission order, then the anomalies computed
    after the run (priority inversions, HOL blocking)."""

    level: TraceLevel
    counterfactual_k: int
    records: list[Record]

    def summary(self) -> TraceSummary:
        """BLIS's trace summary (the metrics JSON's ``trace_summary``)."""
        return summarize(self.records)

    def lines(self) -> Iterator[dict[str, Any]]:
        """Every record as its JSON object."""
        return (r.as_json() for r in self.records)

    def write_jsonl(self, path: str | Path) -> None:
        """Write ``trace.jsonl`` (one record per line) atomically."""
        write_text_atomic(path, "".join(
            json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n"
            for line in self.lines()))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``trace.jsonl`` file, as JSON objects."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def of_kind(lines: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of one kind."""
    return [x for x in lines if x["kind"] == kind]


def simulate_traced(resolved, workload, level: str | TraceLevel = TraceLevel.DECISIONS,
                    counterfactual_k: int = 0, code_policy=None) -> tuple[RunResult, Trace]:
    """Run the reference engine with a trace: ``ResolvedConfig`` × ``Workload`` →
    (``RunResult``, ``Trace``). The result is the untraced run's, bit for bit.
    ``code_policy``: a ``blisjax.reference.CodePolicy`` in place of templates."""
    from blisjax.reference.cluster import ClusterSimulator  # the engine imports the records

    level = TraceLevel.of(level) if isinstance(level, str) else TraceLevel(level)
    if counterfactual_k < 0:
        raise ValueError(f"counterfactual_k must be >= 0, got {counterfactual_k}")
    collector = TraceCollector(level, counterfactual_k, workload.request_id.tolist())
    result = ClusterSimulator(resolved, workload, trace=collector,
                              code_policy=code_policy).run()
    scheduler = resolved.config.policy.scheduler.policy
    records = [*collector.records,
               *priority_inversion_records(result, workload, scheduler),
               *hol_blocking_records(result, workload, int(result.sim_ended_us))]
    return result, Trace(level, counterfactual_k, records)
