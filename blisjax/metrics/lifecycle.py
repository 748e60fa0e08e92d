"""A run's instances and their lifecycles in metrics (docs/autoscaling.md, Results): which
instance slots ever held an instance, each one's counters, the state changes with the replicas
held and routable after each, and the cost and scaling summary of a run with lifecycles."""

from __future__ import annotations

from typing import Any

import numpy as np

from blisjax.config.codes import HOLDING_STATES, ROUTABLE_STATES, InstanceState
from blisjax.metrics.records import RunResult

__all__ = ["existing_instances", "instance_summaries", "lifecycle_metrics", "replica_timeline",
           "timeline_csv"]


def existing_instances(result: RunResult) -> np.ndarray:
    """Bool [I]: the instance slots that ever held an instance (all, without lifecycles).
    BLIS's per-instance means run over the instances that existed."""
    if result.lifecycle is None:
        return np.ones(int(result.num_instances), dtype=bool)
    return np.asarray(result.lifecycle.placements) > 0


def instance_summaries(result: RunResult) -> dict[str, dict[str, Any]]:
    """Instance slot (as text) → its counters (BLIS's per-instance blocks' counts), and with
    lifecycles its placements, time held and final state; slots that never held an instance
    are left out."""
    lc = result.lifecycle
    out = {}
    for i in np.nonzero(existing_instances(result))[0].tolist():
        entry: dict[str, Any] = {
            "completed_requests": int(result.completed[i]),
            "preemption_count": int(result.preemption_count[i]),
            "dropped_unservable": int(result.dropped_unservable[i]),
            "timed_out_requests": int(result.timed_out[i]),
            "total_input_tokens": int(result.total_input_tokens[i]),
            "busy_time_s": float(result.busy_time_us[i]) / 1e6,
        }
        if lc is not None:
            entry.update(placements=int(lc.placements[i]),
                         replica_seconds=float(lc.replica_us[i]) / 1e6,
                         cost=float(lc.cost[i]),
                         final_state=InstanceState(int(lc.final_state[i])).label,
                         dropped_at_drain=int(lc.dropped_at_drain[i]))
        out[str(i)] = entry
    return out


def replica_timeline(result: RunResult) -> list[dict[str, Any]]:
    """Every lifecycle state change in order, with the replicas held and routable after it
    (without lifecycles: every instance Active at time 0)."""
    lc = result.lifecycle
    n = int(result.num_instances)
    if lc is None:
        changes = [(0, i, int(InstanceState.ACTIVE)) for i in range(n)]
    else:
        changes = zip(lc.timeline_us.tolist(), lc.timeline_slot.tolist(),
                      lc.timeline_state.tolist(), strict=True)
    state = np.zeros(n, dtype=np.int8)
    out = []
    for t, i, s in changes:
        state[i] = s
        out.append({"time_us": t, "instance": i, "state": InstanceState(s).label,
                    "replicas": int(np.isin(state, _HOLDING_CODES).sum()),
                    "routable": int(np.isin(state, _ROUTABLE_CODES).sum())})
    return out


def timeline_csv(result: RunResult) -> str:
    """``replica_timeline`` as CSV text with a header line."""
    lines = ["time_us,instance,state,replicas,routable"]
    lines += [f"{x['time_us']},{x['instance']},{x['state']},{x['replicas']},{x['routable']}"
              for x in replica_timeline(result)]
    return "\n".join(lines) + "\n"


_HOLDING_CODES = [int(x) for x in HOLDING_STATES]
_ROUTABLE_CODES = [int(x) for x in ROUTABLE_STATES]


def lifecycle_metrics(result: RunResult) -> dict[str, Any]:
    """Cost and scaling of a run with lifecycles (docs/autoscaling.md): replica-seconds
    (instances held, placement to termination or the run's end), cost (Σ held time × cost
    per hour), time-weighted mean and peak replicas, scale actions, oscillations, and
    requests rejected for want of a routable instance (the state changes themselves:
    ``replica_timeline``)."""
    lc = result.lifecycle
    replica_us = int(np.sum(lc.replica_us))
    cost = 0.0
    for c in np.asarray(lc.cost, dtype=np.float64).tolist():
        cost += c
    timeline = replica_timeline(result)
    return {
        "replica_seconds": float(replica_us) / 1e6,
        "cost": cost,
        "mean_replicas": float(replica_us) / float(lc.end_us) if lc.end_us > 0 else 0.0,
        "peak_replicas": max((x["replicas"] for x in timeline), default=0),
        "scale_ups": int(lc.scale_ups),
        "scale_downs": int(lc.scale_downs),
        "instances_added": int(lc.instances_added),
        "instances_drained": int(lc.instances_drained),
        "scale_oscillations": int(lc.oscillations),
        "rejected_routing": int(result.rejected_routing),
        "refused_no_room": int(lc.refused_no_room),
        "redirected_requests": int(lc.redirected),
        "dropped_at_drain": int(np.sum(lc.dropped_at_drain)),
        "end_s": float(lc.end_us) / 1e6,
    }
