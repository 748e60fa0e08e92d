"""Code policies: routing scores and queue priorities written as Python functions.

The design's "Type 2" policies (evolved code, e.g. by OpenEvolve): instead of a template with
knobs, a function decides. The reference engine runs them (the JAX engine compiles templates
only):

* ``route_scores(request: RequestInfo, instances: list[InstanceInfo]) -> list[float]``: one
  score per candidate instance, higher is better; the request goes to the highest score, ties
  to the first candidate (lowest index). It replaces the configured routing template.
* ``priority(request: RequestInfo, now_us: int) -> float``: higher is more urgent; it replaces
  the priority template and is recomputed for every waiting request at every step, as the
  templates are (it orders the queue under ``priority-fcfs`` and picks preemption victims under
  the ``priority`` preemption policy).

The functions see what a real router or scheduler could: not a request's output length, nor the
future. What they return is checked (finite numbers, one per instance); anything else stops the
run with ``CodePolicyError``. The engine does not sandbox them — ``search.adapters.sandbox``
runs untrusted code in a subprocess with a time limit and an import allowlist.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from blisjax.workload.types import SLO_CLASSES


class CodePolicyError(RuntimeError):
    """A code policy raised or returned something that is not a valid decision."""


class RequestInfo(NamedTuple):
    """A request as a code policy sees it (names, not codes; no output length)."""

    request_id: int
    arrival_us: int
    input_tokens: int
    prefix_group: int
    prefix_length: int
    tenant: str
    slo_class: str
    deadline_us: int


class InstanceInfo(NamedTuple):
    """A candidate instance as the router sees it: the (live or periodic) snapshot signals, the
    live in-flight count (routed there, not finished) and the request's leading prompt blocks
    cached there."""

    index: int
    queue_depth: int
    batch_size: int
    in_flight: int
    kv_utilization: float
    cached_blocks: int


RouteScores = Callable[[RequestInfo, list[InstanceInfo]], Sequence[float]]
PriorityFn = Callable[[RequestInfo, int], float]


class CodePolicy(NamedTuple):
    """The functions of a code policy (either may be None: the configured template decides)."""

    route_scores: RouteScores | None = None
    priority: PriorityFn | None = None


def request_info(req, request_id: int, tenant_names: Sequence[str]) -> RequestInfo:
    """``RequestInfo`` of a reference-engine request."""
    return RequestInfo(request_id, req.arrival_us, req.input_tokens, req.prefix_group,
                       req.prefix_length, tenant_names[req.tenant], SLO_CLASSES[req.slo_class],
                       req.deadline_us)


def checked_scores(scores, n: int) -> list[float]:
    """The route scores as floats, or ``CodePolicyError`` saying what is wrong with them."""
    try:
        values = [float(x) for x in scores]
    except (TypeError, ValueError) as e:
        raise CodePolicyError(f"route_scores must return a list of numbers: {e}") from None
    if len(values) != n:
        raise CodePolicyError(f"route_scores returned {len(values)} scores for {n} instances")
    if not all(math.isfinite(v) for v in values):
        raise CodePolicyError(f"route_scores returned a non-finite score: {values}")
    return values


def checked_priority(value) -> float:
    """The priority as a float, or ``CodePolicyError``."""
    try:
        out = float(value)
    except (TypeError, ValueError) as e:
        raise CodePolicyError(f"priority must return a number: {e}") from None
    if not math.isfinite(out):
        raise CodePolicyError(f"priority returned {out}")
    return out
