"""Autoscaling decisions at each tick (docs/semantics.md Decision 16; docs/autoscaling.md).

A tick reads the routable instances (``Reading``) and decides a change in replicas: the seed
templates ``threshold``, ``target-utilization`` and ``queue-depth`` with their cooldown, or
BLIS HEAD's ``blis-saturation`` pipeline (saturation analyzer → unlimited engine →
stabilization windows, docs/autoscaling.md, The tick), exactly. Clamping to the replica bounds
and actuation are the cluster's (``reference.cluster``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from blisjax.config.codes import AutoscalerPolicy
from blisjax.rules import NEVER_US, Variant, cost_order


#: "never scaled": the cooldowns are measured from here.
class Reading(NamedTuple):
    """What a tick reads. Per routable instance, in instance order ([R] lists): KV blocks
    used and in total, queue depth and batch size (the router's snapshots), and its variant
    (an index into the run's variants). ``pending_kv_tokens``: KV capacity, tokens, of the
    instances still coming up; ``live``: instances placed and not draining."""

    kv_used_blocks: list[int]
    kv_total_blocks: list[int]
    queue_depth: list[int]
    batch_size: list[int]
    variant: list[int]
    pending_kv_tokens: int
    live: int


class Decision(NamedTuple):
    """A tick's outcome: replicas to add (> 0) or remove (< 0), and for blis-saturation the
    variant to add or remove (-1: any)."""

    delta: int
    variant: int = -1


def mean_kv_utilization(r: Reading) -> float:
    """Mean over the routable instances of used / total KV blocks, summed in instance
    order; 0 without routable instances."""
    if not r.kv_used_blocks:
        return 0.0
    total = 0.0
    for used, blocks in zip(r.kv_used_blocks, r.kv_total_blocks, strict=True):
        total += float(used) / float(blocks)
    return total / float(len(r.kv_used_blocks))


def threshold_delta(r: Reading, up: float, down: float) -> int:
    """``threshold``: one replica more when the mean KV utilization exceeds ``up``, one less
    when it is below ``down``."""
    u = mean_kv_utilization(r)
    return 1 if u > up else (-1 if u < down else 0)


def target_utilization_delta(r: Reading, target: float, tolerance: float) -> int:
    """``target-utilization`` (Kubernetes HPA): desired = ceil(live · mean / target), no change
    while |mean / target − 1| <= tolerance or without routable instances."""
    if not r.kv_used_blocks:
        return 0
    u = mean_kv_utilization(r)
    if abs(u / target - 1.0) <= tolerance:
        return 0
    return math.ceil(float(r.live) * u / target) - r.live


def queue_depth_delta(r: Reading, target: float) -> int:
    """``queue-depth``: desired = ceil(requests queued or running on the routable instances /
    target per replica); no change without routable instances."""
    if not r.kv_used_blocks:
        return 0
    load = 0
    for q, b in zip(r.queue_depth, r.batch_size, strict=True):
        load += q + b
    return math.ceil(float(load) / target) - r.live


def saturation_decision(r: Reading, variants: list[Variant], block_size: int, threshold: float,
                        up: float, boundary: float, avg_input_tokens: float) -> Decision:
    """``blis-saturation``: BLIS HEAD's V2 saturation analyzer and unlimited engine
    (docs/autoscaling.md, The tick), float operations in BLIS's order."""
    count = [0] * len(variants)
    supply = [0.0] * len(variants)
    demand = [0.0] * len(variants)
    with_capacity = 0
    for used, blocks, q, v in zip(r.kv_used_blocks, r.kv_total_blocks, r.queue_depth,
                                  r.variant, strict=True):
        capacity = blocks * block_size
        if capacity <= 0:
            continue
        with_capacity += 1
        count[v] += 1
        supply[v] += float(capacity) * threshold
        demand[v] += float(used * block_size) + float(q) * avg_input_tokens
    if with_capacity == 0:
        return Decision(0)
    order = [v for v in cost_order(variants) if count[v] > 0]
    total_supply = total_demand = 0.0
    for v in order:
        total_supply += supply[v]
        total_demand += demand[v]
    pending_supply = float(r.pending_kv_tokens) * threshold
    required = total_demand / up - (total_supply + pending_supply)
    if required > 0:
        cheapest = order[0]
        per_replica = supply[cheapest] / float(count[cheapest])
        if per_replica <= 0:
            return Decision(1, cheapest)
        return Decision(max(1, math.ceil(required / per_replica)), cheapest)
    if with_capacity < 2:
        return Decision(0)
    spare = total_supply - total_demand / boundary
    if not spare > 0:
        return Decision(0)
    max_per = max(supply[v] / float(count[v]) for v in order)
    if not total_supply - max_per > total_demand / boundary:
        return Decision(0)
    dearest = max(order, key=lambda v: variants[v].cost_per_hour)  # first of equal cost
    per_replica = supply[dearest] / float(count[dearest])
    return Decision(-min(max(math.floor(spare / per_replica), 1), count[dearest]), dearest)


class Autoscaler:
    """A policy's per-run state: its cooldown clocks, or blis-saturation's stabilization
    timers. ``decide`` is called once per tick."""

    def __init__(self, cfg, variants: list[Variant], block_size: int) -> None:
        self.cfg = cfg
        self.policy = cfg.code
        self.variants = variants
        self.block_size = block_size
        self.last_up_us = NEVER_US  # the last tick whose scale-up passed
        self.last_scale_us = NEVER_US  # the last tick whose scale (either way) passed
        self.window_start_us: dict[int, int | None] = {1: None, -1: None}

    def decide(self, r: Reading, now_us: int) -> Decision:
        """The tick's decision before the replica bounds: 0 when nothing passes."""
        cfg = self.cfg
        if self.policy == AutoscalerPolicy.BLIS_SATURATION:
            d = saturation_decision(r, self.variants, self.block_size, cfg.kv_cache_threshold,
                                    cfg.saturation_up_threshold, cfg.saturation_down_boundary,
                                    cfg.avg_input_tokens)
            return d if self._stabilized(d.delta, now_us) else Decision(0)
        if self.policy == AutoscalerPolicy.THRESHOLD:
            delta = threshold_delta(r, cfg.scale_up_utilization, cfg.scale_down_utilization)
        elif self.policy == AutoscalerPolicy.TARGET_UTILIZATION:
            delta = target_utilization_delta(r, cfg.target_utilization,
                                             cfg.utilization_tolerance)
        else:
            delta = queue_depth_delta(r, cfg.target_queue_depth)
        return Decision(delta)

    def cooled_down(self, delta: int, now_us: int) -> bool:
        """The seed templates' cooldown: no scale-up within ``cooldown_us`` of the last
        scale-up, no scale-down within it of the last scale either way (blis-saturation has
        its windows instead)."""
        if self.policy == AutoscalerPolicy.BLIS_SATURATION or delta == 0:
            return True
        last = self.last_up_us if delta > 0 else self.last_scale_us
        return now_us - last >= self.cfg.cooldown_us

    def passed(self, delta: int, now_us: int) -> None:
        """Record a decision that goes to actuation."""
        self.last_scale_us = now_us
        if delta > 0:
            self.last_up_us = now_us

    def _stabilized(self, delta: int, now_us: int) -> bool:
        """BLIS's stabilization (§3.4 step 4): a direction absent this tick has its timer
        reset; a signal first seen starts it (passing at once with a 0 window); a signal
        with a timer passes once its window has elapsed, which resets the timer."""
        sign = (delta > 0) - (delta < 0)
        for direction in (1, -1):
            if direction != sign:
                self.window_start_us[direction] = None
        if sign == 0:
            return False
        window = (self.cfg.scale_up_window_us if sign > 0 else self.cfg.scale_down_window_us)
        start = self.window_start_us[sign]
        if start is None:
            if window > 0:
                self.window_start_us[sign] = now_us
                return False
            return True
        if now_us - start >= window:
            self.window_start_us[sign] = None
            return True
        return False
