"""The gateway queue: BLIS HEAD's flow control (docs/semantics.md §5.12, Decision 21).

Admitted requests wait here and are dispatched to routing one at a time while the cluster is
not saturated. ``ClusterSimulator`` calls ``enqueue`` at an admission, ``try_dispatch`` right
after it and at every dispatch tick; BLIS: ``sim/cluster/gateway_queue.go``,
``flow_control_admission.go``, ``cluster.go`` ``tryDispatchFromGatewayQueue``,
``cluster_event.go`` ``GatewayDispatchTickEvent``, ``sim/saturation.go``.
"""

from __future__ import annotations

from blisjax.config.sim import GatewayConfig

#: BLIS: a detector holds dispatch while the saturation is at least this.
SATURATED = 1.0


def saturation(cfg: GatewayConfig, members: list[int], queue_depth: list[int],
               kv_util: list[float], in_flight: list[int]) -> float:
    """The detector's saturation over the routable instances ``members`` (BLIS
    ``SaturationDetector.Saturation``; no instance: 1, saturated)."""
    if cfg.saturation_detector == "never":
        return 0.0
    if not members:
        return 1.0
    if cfg.saturation_detector == "utilization":
        total = 0.0
        for i in members:  # in instance order, as BLIS sums its snapshots
            q = float(queue_depth[i]) / cfg.queue_depth_threshold
            k = kv_util[i] / cfg.kv_cache_util_threshold
            total += max(q, k)
        return total / float(len(members))
    busy = sum(in_flight[i] for i in members)  # concurrency
    return float(busy) / float(len(members) * cfg.max_concurrency)


class GatewayQueue:
    """The queue's entries ``(enqueue sequence, band, enqueue time, request)`` and its
    counters. ``band`` is the request's SLO-class priority (higher first under ``priority``
    dispatch; BLIS's bands)."""

    def __init__(self, cfg: GatewayConfig, class_score, blis_quirks: bool) -> None:
        self.cfg = cfg
        self.class_score = class_score
        # BLIS's gated dispatch takes the highest band first whatever --dispatch-order says
        # (``DequeueGated``); --blis-quirks reproduces it (Decision 21)
        self.by_band = cfg.dispatch_order == "priority" or blis_quirks
        self.entries: list[tuple[int, float, int, object]] = []
        self.seq = 0
        self.tick_pending = False
        self.rejected = 0
        self.dispatched = 0
        self.wait_sum_us = 0

    def __len__(self) -> int:
        return len(self.entries)

    def enqueue(self, req, now_us: int) -> bool:
        """Hold ``req``; False (rejected) when the queue is at its ``max_queue_depth``."""
        limit = self.cfg.max_queue_depth
        if limit > 0 and len(self.entries) >= limit:
            self.rejected += 1
            return False
        self.seq += 1
        self.entries.append((self.seq, self.class_score[req.slo_class], now_us, req))
        return True

    def pop(self, now_us: int):
        """Remove and return the next request to dispatch: the earliest enqueued, or under
        band order the earliest of the highest band."""
        if self.by_band:
            k = min(range(len(self.entries)),
                    key=lambda j: (-self.entries[j][1], self.entries[j][0]))
        else:
            k = 0  # entries stay in enqueue order
        _, _, enqueued_us, req = self.entries.pop(k)
        self.dispatched += 1
        self.wait_sum_us += now_us - enqueued_us
        return req
