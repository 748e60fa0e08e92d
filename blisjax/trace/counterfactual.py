"""Counterfactual top-k and regret of a routing decision (BLIS's; docs/tracing.md,
Counterfactual regret).

The candidates are the instances the policy saw, in instance order. A candidate's score is the
policy's own when it returned scores (weighted routing), otherwise minus its effective load
``-(queue_depth + batch_size + in_flight)``. Candidates are ranked by score, highest first, ties
by instance ID as BLIS compares them (the text ``instance_<k>``). The regret is the best score of
all candidates minus the chosen one's, at least 0: always 0 for weighted and least-loaded
routing, positive when round-robin or always-busiest pass a less loaded instance by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from blisjax.trace.records import InstanceView


def candidate_score(view: InstanceView, scores: dict[int, float] | None) -> float:
    """A candidate's counterfactual score: the policy's (0 for an instance it did not score),
    else minus the effective load."""
    if scores is not None:
        return scores.get(view.instance, 0.0)
    return 0.0 - float(view.queue_depth + view.batch_size + view.in_flight)  # no -0.0


def counterfactual(snapshots: Sequence[InstanceView], scores: dict[int, float] | None,
                   chosen: int, k: int) -> tuple[tuple[InstanceView, ...], float]:
    """The top ``k`` candidates (with their scores) and the decision's regret.

    BLIS computes neither when ``k`` is 0, nor when the chosen instance is not a candidate:
    both give ``((), 0.0)``.
    """
    if k <= 0 or all(v.instance != chosen for v in snapshots):
        return (), 0.0
    scored = [dataclasses.replace(v, score=candidate_score(v, scores)) for v in snapshots]
    ranked = sorted(scored, key=lambda v: (-v.score, f"instance_{v.instance}"))
    chosen_score = next(v.score for v in scored if v.instance == chosen)
    return tuple(ranked[:k]), max(0.0, ranked[0].score - chosen_score)
