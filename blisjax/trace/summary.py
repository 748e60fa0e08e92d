"""BLIS's trace summary (docs/tracing.md): the numbers of its "Trace Summary" block.

Computed from the records exactly as BLIS computes them: the admission records give the
decision counts, the routing records (in P/D mode only the requests served without
disaggregation: prefill routing records are not counted) the targets and the regret.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from blisjax.trace.records import AdmissionRecord, Record, RoutingRecord


class TraceSummary(NamedTuple):
    """The metrics JSON's ``trace_summary`` block; ``target_distribution`` is keyed
    ``instance_<k>`` in BLIS's (text) order."""

    total_decisions: int
    admitted: int
    rejected: int
    unique_targets: int
    target_distribution: dict[str, int]
    mean_regret: float
    max_regret: float

    def as_json(self) -> dict[str, Any]:
        return self._asdict()

    def blis_text(self) -> str:
        """The block as BLIS prints it (``--summarize-trace``)."""
        lines = ["=== Trace Summary ===",
                 f"Total Decisions: {self.total_decisions}",
                 f"  Admitted: {self.admitted}",
                 f"  Rejected: {self.rejected}",
                 f"Unique Targets: {self.unique_targets}"]
        if self.target_distribution:
            lines.append("Target Distribution:")
            lines += [f"  {k}: {v}" for k, v in self.target_distribution.items()]
        lines += [f"Mean Regret: {self.mean_regret:.6f}", f"Max Regret: {self.max_regret:.6f}"]
        return "\n".join(lines) + "\n"


def summarize(records: Iterable[Record]) -> TraceSummary:
    """BLIS's summary of a trace's records."""
    admitted = rejected = 0
    counts: dict[str, int] = {}
    regret_sum = regret_max = 0.0
    routings = 0
    for rec in records:
        if type(rec) is AdmissionRecord:
            admitted += rec.admitted
            rejected += not rec.admitted
        elif type(rec) is RoutingRecord:  # not its prefill-routing subclass
            key = f"instance_{rec.chosen_instance}"
            counts[key] = counts.get(key, 0) + 1
            regret_sum += rec.regret
            regret_max = max(regret_max, rec.regret)
            routings += 1
    return TraceSummary(
        total_decisions=admitted + rejected, admitted=admitted, rejected=rejected,
        unique_targets=len(counts), target_distribution=dict(sorted(counts.items())),
        mean_regret=regret_sum / routings if routings else 0.0, max_regret=regret_max)
