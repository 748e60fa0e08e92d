"""Anomaly records computed after a run: priority inversions and HOL blocking.

They follow the metrics exactly (docs/semantics.md Decision 18): the counts of a trace's
``priority_inversion`` records sum to the metrics' ``priority_inversions``, and its
``hol_blocking`` records are the instances counted by ``hol_blocking_instances``. Scale
oscillations and KV thrashing are recorded when they happen (``TraceCollector``).
"""

from __future__ import annotations

import numpy as np

from blisjax.metrics.aggregate import INVERSION_SCHEDULERS, inversion_inputs
from blisjax.metrics.formulas import (
    hol_blocking_flags,
    hol_blocking_means,
    priority_inversions_per_request,
)
from blisjax.metrics.lifecycle import existing_instances
from blisjax.metrics.records import RunResult
from blisjax.trace.records import AnomalyRecord
from blisjax.workload import Workload

#: Requests named as examples in one anomaly record.
EXAMPLES = 5


def priority_inversion_records(result: RunResult, workload: Workload,
                               scheduler: str) -> list[AnomalyRecord]:
    """One record per request that later arrivals of its instance and SLO class overtook
    (finished in under half its E2E), at its completion; ``requests`` = that request, then
    up to ``EXAMPLES`` of the later ones. Only for the schedulers the metric counts."""
    if scheduler not in INVERSION_SCHEDULERS:
        return []
    rows, arrival, e2e, group = inversion_inputs(result, workload)
    counts = priority_inversions_per_request(arrival, e2e, group)
    ids = workload.request_id
    out = []
    for k in np.nonzero(counts)[0].tolist():
        later = np.nonzero((group == group[k]) & ((arrival > arrival[k])
                                                  | ((arrival == arrival[k]) & (rows > rows[k])))
                           & (2 * e2e < e2e[k]))[0]
        later = later[np.lexsort((rows[later], arrival[later]))][:EXAMPLES]
        fastest = int(e2e[later].min())
        r = int(rows[k])
        inst = int(result.instance[r])
        out.append(AnomalyRecord(
            int(arrival[k] + e2e[k]), "priority_inversion", int(counts[k]), (inst,),
            (int(ids[r]), *(int(ids[rows[j]]) for j in later)),
            float(e2e[k]) / float(max(1, 2 * fastest)),
            f"request {int(ids[r])} (E2E {e2e[k] / 1e3:.1f} ms) was overtaken on instance "
            f"{inst} by {int(counts[k])} later arrival(s) of its SLO class that finished in under "
            f"half its E2E"))
    out.sort(key=lambda a: (a.time_us, a.requests[0]))
    return out


def hol_blocking_records(result: RunResult, workload: Workload,
                         end_us: int) -> list[AnomalyRecord]:
    """One record per HOL-blocking instance, at the run's end (the metric is a whole-run
    mean); ``requests``: the ``EXAMPLES`` it kept waiting longest."""
    existed = np.nonzero(existing_instances(result))[0]
    depth = np.asarray(result.queue_depth_time_us)[existed]
    busy = np.asarray(result.busy_time_us)[existed]
    avgs, mean_avg = hol_blocking_means(depth, busy)
    delay = np.asarray(result.scheduling_delay_us, dtype=np.int64)
    out = []
    for k, flagged in enumerate(hol_blocking_flags(depth, busy)):
        if not flagged:
            continue
        inst = int(existed[k])
        mine = np.nonzero((np.asarray(result.instance) == inst) & (delay >= 0))[0]
        worst = mine[np.lexsort((mine, -delay[mine]))][:EXAMPLES]
        out.append(AnomalyRecord(
            end_us, "hol_blocking", 1, (inst,), tuple(int(workload.request_id[r]) for r in worst),
            avgs[k] / mean_avg,
            f"instance {inst} kept {avgs[k]:.2f} requests waiting on average, over twice the "
            f"cluster mean {mean_avg:.2f}"))
    return out
