"""What a policy program can read: the observables, their units and where each is defined.

Both engines compute every observable the same way (docs/policy-programs.md, Observables);
this table is their shared naming: a program's ``obs`` instructions carry an observable's
index in ``OBSERVABLES``. Three kinds:

* ``instance``: one value per candidate instance of a routing decision (routing only);
* ``request``: the request being decided on (every site);
* ``cluster``: the cluster at the decision, over the instances a router could pick (routing
  and admission; a priority is computed inside an instance's step, where the router's
  snapshots are not refreshed, so it sees the request only).
"""

from __future__ import annotations

from typing import NamedTuple

from blisjax.config.codes import Scorer

__all__ = ["OBSERVABLES", "RECENT_SIGNALS", "RECENT_WINDOW_US", "SITES", "SLO_CLASS_RANK",
           "Observable", "index_of", "scorer_name", "visible_at"]

#: Where a program plugs in: ``policy.<site>``.
SITES = ("routing", "admission", "priority")


class Observable(NamedTuple):
    """One name a program may read."""

    name: str
    kind: str  # "instance", "request" or "cluster"
    unit: str
    meaning: str


def scorer_name(scorer: Scorer) -> str:
    """The observable holding a weighted-routing scorer's value: ``score_<label>``."""
    return "score_" + scorer.label.replace("-", "_")


_INSTANCE = (
    Observable("queue_depth", "instance", "requests",
               "waiting requests (the router's snapshot)"),
    Observable("batch_size", "instance", "requests",
               "running requests (the router's snapshot)"),
    Observable("in_flight", "instance", "requests",
               "requests routed there and not finished (live)"),
    Observable("kv_utilization", "instance", "fraction 0-1",
               "KV blocks in use over KV blocks (the router's snapshot)"),
    Observable("cached_blocks", "instance", "blocks",
               "leading full prompt blocks of this request cached there (live cache query)"),
    Observable("recent_ttft_ms", "instance", "ms",
               "mean TTFT of the first tokens it produced recently"),
    Observable("recent_itl_ms", "instance", "ms",
               "mean inter-token latency of the requests it completed recently"),
    Observable("estimated_wait_ms", "instance", "ms",
               "mean time from arrival to admission into its batch, of its recent admissions"),
    Observable("recent_hit_rate", "instance", "fraction 0-1",
               "prompt tokens found in its prefix cache over prompt tokens, of its recent "
               "admissions"),
) + tuple(
    Observable(scorer_name(s), "instance", "0-1",
               f"the weighted router's {s.label} scorer, clamped to [0, 1]")
    for s in Scorer)

_REQUEST = (
    Observable("input_tokens", "request", "tokens", "prompt length"),
    Observable("prefix_tokens", "request", "tokens",
               "shared-prefix length (0 without a prefix group)"),
    Observable("slo_class_rank", "request", "0-4",
               "0 critical, 1 standard or none, 2 batch, 3 sheddable, 4 background"),
    Observable("tenant_in_flight", "request", "requests",
               "admitted, unfinished requests of the request's tenant"),
    Observable("age_ms", "request", "ms", "time since the request arrived"),
)

_CLUSTER = (
    Observable("cluster_queue_depth", "cluster", "requests",
               "sum of queue_depth over the instances"),
    Observable("cluster_in_flight", "cluster", "requests",
               "sum of in_flight over the instances"),
    Observable("cluster_kv_utilization", "cluster", "fraction 0-1",
               "mean of kv_utilization over the instances (0 when there are none)"),
    Observable("instances", "cluster", "instances",
               "instances the router could pick (routing: the candidates)"),
    Observable("arrival_rate", "cluster", "requests/s",
               "requests that arrived at the cluster in the last RECENT_WINDOW_US"),
)

#: Every observable, in index order.
OBSERVABLES: tuple[Observable, ...] = _INSTANCE + _REQUEST + _CLUSTER

_INDEX = {o.name: k for k, o in enumerate(OBSERVABLES)}

#: ``slo_class_rank`` of each SLO class code (``blisjax.workload.types.SLO_CLASSES``: "",
#: critical, standard, sheddable, batch, background): BLIS's default slo-class order, most
#: urgent first.
SLO_CLASS_RANK = (1, 0, 1, 3, 2, 4)

#: "Recently": the current and the previous whole window of this many µs (windows aligned at
#: multiples of it), for the recent_* and estimated_wait_ms observables; arrival_rate counts
#: the arrivals of the last this many µs.
RECENT_WINDOW_US = 1_000_000
#: The recent signals an instance keeps, in order: each a (sum, count) pair per window —
#: TTFT µs and first tokens; ITL µs and ITL entries of completed requests; arrival-to-
#: admission µs and admissions; cached prompt tokens and prompt tokens of admissions.
RECENT_SIGNALS = ("recent_ttft_ms", "recent_itl_ms", "estimated_wait_ms", "recent_hit_rate")

_KINDS_AT = {"routing": ("instance", "request", "cluster"),
             "admission": ("request", "cluster"), "priority": ("request",)}


def index_of(name: str) -> int:
    """Index of observable ``name`` in ``OBSERVABLES`` (KeyError if none)."""
    return _INDEX[name]


def visible_at(site: str) -> tuple[str, ...]:
    """Names of the observables a program at ``site`` may read, in index order."""
    kinds = _KINDS_AT[site]
    return tuple(o.name for o in OBSERVABLES if o.kind in kinds)
