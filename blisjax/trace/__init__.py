"""Decision traces of the reference engine (docs/tracing.md; docs/semantics.md Decision 17).

``simulate_traced`` runs the reference engine with a collector and returns the run's result with
its ``Trace``: the records (``records``), BLIS's summary (``TraceSummary``), and JSON Lines.
"""

from blisjax.trace.records import RECORD_TYPES, Record
from blisjax.trace.run import Trace, of_kind, read_jsonl, simulate_traced
from blisjax.trace.summary import TraceSummary, summarize

__all__ = ["RECORD_TYPES", "Record", "Trace", "TraceSummary", "of_kind", "read_jsonl",
           "simulate_traced", "summarize"]
