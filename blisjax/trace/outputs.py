"""What ``--trace-out DIR`` writes: the records, the timeline and the text summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blisjax.atomicio import write_text_atomic
from blisjax.trace.reflect import reflection_text
from blisjax.trace.run import Trace
from blisjax.trace.timeline import write_timeline

#: File names inside a trace directory.
TRACE_FILE, TIMELINE_FILE, SUMMARY_FILE = "trace.jsonl", "timeline.json", "summary.txt"


def write_trace_outputs(out_dir: Path, trace: Trace, metrics: dict[str, Any], config,
                        strategy: str, requests: list[dict[str, Any]] | None = None
                        ) -> dict[str, Path]:
    """Write ``trace.jsonl``, ``timeline.json`` and ``summary.txt`` (``strategy``) into
    ``out_dir`` (created if missing), each atomically; returns their paths. ``requests``: the
    run's ``per_request_rows``, which give the summary each request's TTFT and E2E (the trace
    alone gives only step times)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = list(trace.lines())
    paths = {"trace": out_dir / TRACE_FILE, "timeline": out_dir / TIMELINE_FILE,
             "summary": out_dir / SUMMARY_FILE}
    trace.write_jsonl(paths["trace"])
    write_timeline(paths["timeline"], lines)
    write_text_atomic(paths["summary"], reflection_text(lines, metrics, config, strategy,
                                                        requests=requests))
    return paths
