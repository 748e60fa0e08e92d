"""Initial program for OpenEvolve: a code policy for configs/search/prefix-affinity.yaml.

``route_scores`` scores each candidate instance for a request (higher is better; ties go to the
first candidate). It starts as least-load routing — the scenario's losing baseline, blind to
which instance holds the request's prefix in its KV cache. The evaluator
(search/adapters/openevolve_evaluator.py) runs it in a sandbox: only math, statistics, itertools,
functools, collections, heapq, bisect, dataclasses, typing, numbers and operator may be
imported, and ``RequestInfo`` / ``InstanceInfo`` (blisjax.reference.code_policy) are given.
Fields: request.input_tokens, .prefix_group, .prefix_length, .tenant, .slo_class,
.arrival_us, .deadline_us; instance.index, .queue_depth, .batch_size, .in_flight,
.kv_utilization (0-1), .cached_blocks (the request's leading prompt blocks cached there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers only: the sandbox provides these names
    from blisjax.reference.code_policy import InstanceInfo, RequestInfo


# EVOLVE-BLOCK-START
def route_scores(request: RequestInfo, instances: list[InstanceInfo]) -> list[float]:
    """One score per candidate instance: the fewer requests waiting, running or in flight
    there, the higher."""
    return [-float(i.queue_depth + i.batch_size + i.in_flight) for i in instances]
# EVOLVE-BLOCK-END
