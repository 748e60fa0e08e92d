"""A configuration's ``workload:`` section as a ``Workload``: generated from a workload spec,
or read from recorded traces.

A section is either a BLIS workload-spec v2 mapping (generated with a seed) or a list of
TraceV2 traces::

    workload:
      traces:
        - {header: traces/monday-header.yaml, data: traces/monday.csv}
        - {header: traces/tuesday-header.yaml, data: traces/tuesday.csv}

With traces the workload *seed* selects a trace by its index in the list (0, 1, …), so a
search's training seeds and held-out seeds (``--seeds 0 --holdout-seeds 1``) are recorded
days instead of generated draws. Relative paths are read from the working directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blisjax.workload.generate import generate_workload
from blisjax.workload.spec import parse_workload_spec
from blisjax.workload.trace import read_trace
from blisjax.workload.types import Workload

__all__ = ["section_traces", "workload_from_section"]


def section_traces(section: Mapping[str, Any] | None) -> list[tuple[str, str]] | None:
    """The (header, data) paths of a section that lists traces; None for a workload spec.

    Raises ValueError naming ``workload.traces`` when the list is malformed."""
    if section is None or "traces" not in section:
        return None
    if set(section) != {"traces"}:
        extra = sorted(set(section) - {"traces"})
        raise ValueError(f"workload.{extra[0]}: a section with traces holds nothing else")
    traces = section["traces"]
    if not isinstance(traces, list) or not traces:
        raise ValueError("workload.traces: must be a non-empty list of {header, data} paths")
    out = []
    for k, entry in enumerate(traces):
        if not isinstance(entry, Mapping) or set(entry) != {"header", "data"} \
                or not all(isinstance(entry[key], str) and entry[key]
                           for key in ("header", "data")):
            raise ValueError(f"workload.traces[{k}]: must be {{header: PATH, data: PATH}}, "
                             f"got {entry!r}")
        out.append((entry["header"], entry["data"]))
    return out


def workload_from_section(section: Mapping[str, Any], seed: int) -> Workload:
    """The workload of a ``workload:`` section: the spec generated with ``seed``, or the trace
    at index ``seed`` of a section that lists traces.

    Raises ValueError naming the field (a seed outside the list names ``workload.traces``)."""
    traces = section_traces(section)
    if traces is None:
        return generate_workload(parse_workload_spec(section), seed=seed)
    if not 0 <= seed < len(traces):
        raise ValueError(f"workload.traces: seed {seed} selects the trace at that index; the "
                         f"section lists {len(traces)} (seeds 0 .. {len(traces) - 1})")
    header, data = traces[seed]
    try:
        return read_trace(header, data)
    except OSError as err:
        raise ValueError(f"workload.traces[{seed}]: cannot read "
                         f"{err.filename or data!r}: {err.strerror or err}") from None
