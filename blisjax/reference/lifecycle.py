"""Instance slots, their lifecycle and the node pools they are placed on (Decision 16).

A run has a fixed number of instance slots (``config.autoscale.max_replicas``). The
``cluster.num_instances`` initial instances take the first slots; each scale-up takes a free
slot: by default the lowest one not holding an instance (a terminated instance's slot is
reused, its caches cold), with ``--blis-quirks`` the lowest never used, since BLIS appends every
new instance to its list (a scale-up finding none is refused and flagged, the run's
``instance_slots`` overflow). Instance order, for event ties and routing, is slot order.

States: UNUSED → SCHEDULING (waiting for a node) → LOADING → WARMING_UP → ACTIVE → DRAINING →
TERMINATED (``config.codes.InstanceState``). A slot holds an instance, paying for it, from its
placement to its termination.

``Lifecycle`` holds a run's slots and autoscaler and handles their events for
``ClusterSimulator``. JAX counterpart: ``blisjax.engine.lifecycle``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from blisjax.config.autoscale import lifecycle_configured
from blisjax.config.codes import (
    HOLDING_STATES,
    ROUTABLE_STATES,
    DrainPolicy,
    InstanceState,
    PDRole,
)
from blisjax.gorand import blis_subsystem_rand
from blisjax.limits import INT64_MAX
from blisjax.metrics.records import LifecycleCounters, Stage
from blisjax.reference.autoscaler import Autoscaler, Reading
from blisjax.reference.events import (
    EV_LOADED,
    EV_PROVISIONED,
    EV_ROUTING,
    EV_SCALE_ACTUATION,
    EV_SCALING_TICK,
)
from blisjax.rules import delay_us, held_cost, instance_variants, speed_gpu, variant_of

if TYPE_CHECKING:
    from blisjax.reference.cluster import ClusterSimulator
    from blisjax.reference.instance import Instance
    from blisjax.reference.request import SimRequest

HOLDING, ROUTABLE = HOLDING_STATES, ROUTABLE_STATES
#: States in which an instance counts toward the replicas a scale-down leaves.
LIVE = HOLDING - {InstanceState.DRAINING}
#: States of an instance still coming up (BLIS's pending replicas).
COMING_UP = frozenset({InstanceState.SCHEDULING, InstanceState.LOADING})

class Actuation(NamedTuple):
    """A decision on its way to actuation: replicas to add (> 0) or remove (< 0), the variant
    (-1: any) and the scaling group (``Lifecycle.groups``) it is for."""

    delta: int
    variant: int
    group: int


def scaling_groups(roles, slots: int, autoscaled: bool) -> list[list[int]]:
    """The slots of each group the autoscaler scales on its own: with P/D pools (``roles``,
    each slot's ``PDRole``) and an autoscaler the prefill pool's and the decode pool's
    (shared instances and those of no pool are never added or drained); otherwise one
    group of every slot."""
    if roles is None or not autoscaled:
        return [list(range(slots))]
    return [[i for i, r in enumerate(roles) if r == role]
            for role in (PDRole.PREFILL, PDRole.DECODE)]


class Streams:
    """BLIS's lifecycle random streams, created when first drawn from (§3.5)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rngs: dict[str, object] = {}

    def delay_us(self, spec, stream: str) -> int:
        if spec.stddev_s <= 0:
            return delay_us(spec, None)
        if stream not in self._rngs:
            self._rngs[stream] = blis_subsystem_rand(self.seed, stream)
        return delay_us(spec, self._rngs[stream])


class Node(NamedTuple):
    """A node of a pool: where it sits and when it is ready (µs)."""

    pool: int
    ready_us: int


class Placement:
    """GPUs of the node pools (docs/autoscaling.md, Instances, slots and their lifecycle): first fit over the pools in
    order and their nodes in index order, ``tp`` GPUs of one node per instance. By default a
    placement that finds no room provisions a node of the first pool with room to grow (of
    the wanted GPU type), ready after its provisioning delay; with ``--blis-quirks`` none is
    ever provisioned. Without pools every placement succeeds."""

    def __init__(self, pools, tp: int, provision: bool, streams: Streams) -> None:
        self.pools = pools
        self.tp = tp
        self.provision = provision
        self.streams = streams
        self.nodes: list[Node] = []
        self.free_gpus: list[int] = []
        self.count = [0] * len(pools)
        for p, pool in enumerate(pools):
            for _ in range(pool.initial_nodes):
                self._add_node(p, 0)

    def _add_node(self, pool: int, ready_us: int) -> int:
        self.nodes.append(Node(pool, ready_us))
        self.free_gpus.append(self.pools[pool].gpus_per_node)
        self.count[pool] += 1
        return len(self.nodes) - 1

    def place(self, gpu_type: str | None, now_us: int) -> int | None:
        """A node for one instance (its GPUs taken), or None; ``gpu_type`` None = any. Nodes
        are tried in pool order, then index order within a pool."""
        wanted = [p for p, pool in enumerate(self.pools)
                  if gpu_type is None or pool.gpu_type == gpu_type]
        for p in wanted:
            for n, node in enumerate(self.nodes):
                if node.pool == p and self.free_gpus[n] >= self.tp:
                    self.free_gpus[n] -= self.tp
                    return n
        if not self.provision:
            return None
        for p in wanted:
            pool = self.pools[p]
            if self.count[p] < pool.max_nodes and pool.slots_per_node(self.tp) > 0:
                delay = self.streams.delay_us(pool.provisioning_delay, "node-provisioning")
                n = self._add_node(p, now_us + delay)
                self.free_gpus[n] -= self.tp
                return n
        return None

    def release(self, node: int) -> None:
        self.free_gpus[node] += self.tp


class Slot:
    """One instance slot's lifecycle facts."""

    __slots__ = ("state", "placed_us", "node", "cost_per_hour", "variant", "warm_up_left",
                 "replica_us", "cost", "placements")

    def __init__(self) -> None:
        self.state = InstanceState.UNUSED
        self.placed_us = -1
        self.node = -1
        self.cost_per_hour = 0.0
        self.variant = 0
        self.warm_up_left = 0
        self.replica_us = 0  # time held, summed over the instances the slot has held
        self.cost = 0.0
        self.placements = 0

    def settle(self, now_us: int) -> None:
        """Account the time held since placement (at termination, or the run's end)."""
        held = now_us - self.placed_us
        self.replica_us += held
        self.cost += held_cost(held, self.cost_per_hour)


class Lifecycle:
    """A run's instance slots and autoscaler (Decision 16), owned by its ``ClusterSimulator``
    (``sim.life``): placement, loading and warm-up, the autoscaler's ticks and actuations,
    drains and terminations, and the counters at the end. Reaches the cluster's instances,
    events and snapshots through ``sim``. The initial instances are placed on construction."""

    def __init__(self, sim: ClusterSimulator) -> None:
        cfg = sim.cfg
        self.sim = sim
        self.blis_quirks = sim.blis_quirks
        self.config = cfg.cluster.lifecycle
        self.autoscale_cfg = cfg.policy.autoscaler
        self.pools = cfg.cluster.node_pools
        self.tp = cfg.engine.tensor_parallel_size
        self.initial_instances = cfg.cluster.num_instances
        #: the run models lifecycles at all (otherwise every instance is Active throughout)
        self.enabled = lifecycle_configured(self.autoscale_cfg, self.pools, self.config)
        self.slots = [Slot() for _ in sim.instances]
        self.streams = Streams(cfg.seed)
        self.placement = Placement(self.pools, self.tp, not self.blis_quirks, self.streams)
        self.variants = instance_variants(self.pools, cfg.hardware, self.config.cost_per_hour,
                                          self.tp)
        self.timeline: list[tuple[int, int, int]] = []
        self.scale_ups = self.scale_downs = self.instances_added = self.instances_drained = 0
        self.oscillations = self.refused_no_slot = self.refused_no_room = self.redirected = 0
        #: the slots each scaling group holds: with P/D pools the prefill and the decode pool
        #: (docs/autoscaling.md, "P/D pools"), else one group of every slot
        self.groups = scaling_groups(sim.pd.roles if sim.pd is not None else None,
                                     len(self.slots), self.autoscale_cfg.enabled)
        # per group: the last actuation's direction and time (the oscillation count)
        self._last_direction = [0] * len(self.groups)
        self._last_actuation_us = [0] * len(self.groups)
        # --blis-quirks warm-up: the first requests routed to each instance (TTFT × factor)
        self.warm_up_routed: list[list[int]] = [[] for _ in sim.instances]
        #: one autoscaler (cooldown clocks, stabilization timers) per scaling group
        self.autoscalers = ([Autoscaler(self.autoscale_cfg, self.variants, sim.block_size)
                             for _ in self.groups] if self.autoscale_cfg.enabled else [])
        self.autoscaler = self.autoscalers[0] if self.autoscalers else None
        # each variant's speed: its GPU's where the hardware table knows it (``speed_gpu``);
        # None: the configuration's GPU, the instance's own latency model
        speeds = [speed_gpu(v.gpu_type, cfg.hardware, self.blis_quirks) for v in self.variants]
        self.variant_latency = [None if gpu == cfg.hardware else sim.latency_on(gpu)
                                for gpu in speeds]
        for i in range(self.initial_instances):
            placed = self._place(i, None, 0, initial=True)
            assert placed, "the initial nodes hold the initial instances (config check)"

    def _set_state(self, slot: int, state: InstanceState, now_us: int) -> None:
        self.slots[slot].state = state
        self.timeline.append((now_us, slot, int(state)))
        if self.sim.trace is not None:
            self.sim.trace.instance_state(now_us, slot, state)

    def _place(self, slot: int, gpu_type: str | None, now_us: int, initial: bool) -> bool:
        """Place an instance in ``slot`` (False: no room on the node pools). It starts ready
        (a warm-started initial instance), waits for its node, or starts loading."""
        sim = self.sim
        node = None
        if self.pools:
            node = self.placement.place(gpu_type, now_us)
            if node is None:
                return False
        elif self.blis_quirks and not initial:
            return False  # BLIS: "PlacementManager not available"
        s = self.slots[slot]
        s.placed_us, s.node = now_us, -1 if node is None else node
        s.placements += 1
        pool = self.pools[self.placement.nodes[node].pool] if node is not None else None
        s.cost_per_hour = pool.cost_per_hour if pool else self.config.cost_per_hour
        s.variant = variant_of(self.variants, pool.gpu_type if pool else sim.cfg.hardware)
        if s.placements > 1:  # a reused slot: a new instance with cold caches
            sim.instances[slot].restart()
            sim.router.forget_instance(slot)
        sim.instances[slot].set_latency(self.variant_latency[s.variant])
        # BLIS starts initial instances ready without node pools, whatever its lifecycle says
        warm = self.config.warm_start_initial_instances or (self.blis_quirks and not self.pools)
        if initial and warm:
            self.ready(slot, now_us)
            return True
        ready_us = self.placement.nodes[node].ready_us if node is not None else now_us
        if ready_us > now_us:
            self._set_state(slot, InstanceState.SCHEDULING, now_us)
            sim._push(ready_us, EV_PROVISIONED, slot)
        else:
            self.start_loading(slot, now_us)
        return True

    def start_loading(self, slot: int, now_us: int) -> None:
        """The slot's node is ready: its instance loads the model."""
        self._set_state(slot, InstanceState.LOADING, now_us)
        delay = self.streams.delay_us(self.config.loading_delay, "instance-loading")
        if delay == 0:
            self.ready(slot, now_us)
        else:
            self.sim._push(now_us + delay, EV_LOADED, slot)

    def ready(self, slot: int, now_us: int) -> None:
        """Loaded: routable, warming up first when the lifecycle has a warm-up."""
        warm_up = self.config.warm_up_requests
        if warm_up == 0:
            self._set_state(slot, InstanceState.ACTIVE, now_us)
            return
        self.slots[slot].warm_up_left = warm_up
        if not self.blis_quirks:  # BLIS multiplies TTFTs after the run instead
            self.sim.instances[slot].step_factor = self.config.warm_up_factor
        self._set_state(slot, InstanceState.WARMING_UP, now_us)

    def routable(self) -> list[int] | None:
        """Slots the router may pick, in slot order (None: every instance, no lifecycle)."""
        if not self.enabled:
            return None
        return [i for i, s in enumerate(self.slots) if s.state in ROUTABLE]

    def routed(self, req: SimRequest, target: int) -> None:
        """A request routed to ``target``: with --blis-quirks the first ``warm_up_requests``
        routed to each instance are recorded (BLIS multiplies their TTFT after the run)."""
        warm_up = self.warm_up_routed[target]
        if self.blis_quirks and len(warm_up) < self.config.warm_up_requests:
            warm_up.append(req.index)

    def _counts(self, group: int = 0) -> tuple[int, int]:
        """(live, holding): the group's instances counted by a scale-down's minimum / by the
        maximum."""
        slots = [self.slots[i] for i in self.groups[group]]
        live = sum(1 for s in slots if s.state in LIVE)
        return live, sum(1 for s in slots if s.state in HOLDING)

    def _bounded(self, delta: int, group: int = 0) -> int:
        """A decision within the group's replica bounds and the step limits (by default at
        most its slots' instances held — ``max_replicas``, or a P/D pool's maximum; with
        --blis-quirks no maximum, as BLIS)."""
        cfg = self.autoscale_cfg
        live, holding = self._counts(group)
        if delta > 0:
            if not self.blis_quirks:
                delta = min(delta, len(self.groups[group]) - holding)
            if cfg.max_scale_up_step:
                delta = min(delta, cfg.max_scale_up_step)
            return max(delta, 0)
        if delta < 0:
            delta = max(delta, cfg.min_replicas - live)
            if cfg.max_scale_down_step:
                delta = max(delta, -cfg.max_scale_down_step)
            return min(delta, 0)
        return 0

    def tick(self, now_us: int) -> None:
        """The autoscaler's periodic tick (§3.4): for each scaling group in order, read,
        decide and schedule the actuation; then the next tick unless an unbounded run has
        nothing left to do."""
        sim = self.sim
        qd, bs, _ = sim._snapshots(now_us)
        routable = self.routable()
        for group, (members, autoscaler) in enumerate(zip(self.groups, self.autoscalers,
                                                          strict=True)):
            mine = set(members)
            seen = [i for i in routable if i in mine]
            coming_up = [i for i in members if self.slots[i].state in COMING_UP]
            reading = Reading(
                kv_used_blocks=[sim._snap_used[i] for i in seen],
                kv_total_blocks=[sim.instances[i].kv.total_blocks for i in seen],
                queue_depth=[qd[i] for i in seen], batch_size=[bs[i] for i in seen],
                variant=[self.slots[i].variant for i in seen],
                pending_kv_tokens=sum(sim.instances[i].kv.total_blocks * sim.block_size
                                      for i in coming_up),
                live=self._counts(group)[0])
            decision = autoscaler.decide(reading, now_us)
            delta = self._bounded(decision.delta, group)
            actuate = bool(delta) and autoscaler.cooled_down(delta, now_us)
            if sim.trace is not None:
                sim.trace.scale_decision(now_us, self.autoscale_cfg.policy, reading.live,
                                         len(seen), sum(reading.queue_depth),
                                         sum(reading.batch_size), decision.delta, delta,
                                         actuate)
            if actuate:
                autoscaler.passed(delta, now_us)
                delay = self.streams.delay_us(self.autoscale_cfg.actuation_delay, "autoscaler")
                sim._push(now_us + delay, EV_SCALE_ACTUATION,
                          Actuation(delta, decision.variant, group))
        idle = sim.awaiting_routing <= 0 and sum(sim.in_flight) == 0 \
            and (sim.pd is None or sum(sim.pd.headed) == 0)
        if not (sim.horizon_us == INT64_MAX and idle):
            sim._push(now_us + self.autoscale_cfg.interval_us, EV_SCALING_TICK, None)

    def actuate(self, decision: Actuation, now_us: int) -> None:
        """Carry out a decision, within its group's bounds as they stand now: place new
        instances (free slot of the group, node room) or drain the group's oldest Active
        ones (of the decision's variant)."""
        trace = self.sim.trace
        group = decision.group
        delta = self._bounded(decision.delta, group)
        placed, drained = [], []
        refused = 0
        if delta > 0:
            gpu_type = self.variants[decision.variant].gpu_type if decision.variant >= 0 else None
            for _ in range(delta):
                slot = self._free_slot(group)
                if slot is None:
                    self.refused_no_slot += 1
                elif not self._place(slot, gpu_type, now_us, initial=False):
                    self.refused_no_room += 1
                else:
                    placed.append(slot)
            refused = delta - len(placed)
            self.instances_added += len(placed)
            self.scale_ups += bool(placed)
        elif delta < 0:
            active = [i for i in self.groups[group]
                      if self.slots[i].state == InstanceState.ACTIVE
                      and (decision.variant < 0 or self.slots[i].variant == decision.variant)]
            for slot in sorted(active, key=self._drain_order)[:-delta]:
                self._drain(slot, now_us)
                drained.append(slot)
            self.instances_drained += len(drained)
            self.scale_downs += bool(drained)
        if trace is not None:
            trace.scale_actuation(now_us, delta, placed, drained, refused)
        if placed or drained:  # a scale against the group's previous one within the cooldown
            direction = 1 if delta > 0 else -1
            if (self._last_direction[group] == -direction
                    and now_us - self._last_actuation_us[group] < self.autoscale_cfg.cooldown_us):
                self.oscillations += 1
                if trace is not None:
                    trace.oscillation(now_us, direction, self._last_actuation_us[group],
                                      placed or drained)
            self._last_direction[group], self._last_actuation_us[group] = direction, now_us

    def _free_slot(self, group: int = 0) -> int | None:
        """The slot of the group a new instance takes: the lowest not holding one (with
        --blis-quirks the lowest never used, as BLIS appends)."""
        free = ((InstanceState.UNUSED,) if self.blis_quirks
                else (InstanceState.UNUSED, InstanceState.TERMINATED))
        return next((i for i in self.groups[group] if self.slots[i].state in free), None)

    def _drain_order(self, slot: int) -> tuple:
        """Which Active instance drains first: the earliest placed (then the lowest slot);
        with --blis-quirks BLIS's smallest ID string ("autoscale-<model>-<seq>" before
        "instance_<i>", compared as text)."""
        if not self.blis_quirks:
            return (self.slots[slot].placed_us, slot)
        if slot >= self.initial_instances:
            return (0, "", slot)
        return (1, f"instance_{slot}", slot)

    def _drain(self, slot: int, now_us: int) -> None:
        """Stop routing to the instance; its drain policy decides what happens to the requests
        it holds. It terminates once it holds none (by default at once when idle)."""
        sim = self.sim
        self._set_state(slot, InstanceState.DRAINING, now_us)
        inst = sim.instances[slot]
        policy = DrainPolicy.of(self.autoscale_cfg.drain_policy)
        if policy == DrainPolicy.IMMEDIATE:
            inst.drop_everything(now_us)
            sim._settle_finished(inst)
            self._terminate(slot, now_us)
            return
        if policy == DrainPolicy.REDIRECT:
            for req in inst.take_not_running():
                sim.in_flight[slot] -= 1
                req.state, req.instance = Stage.PENDING, -1
                sim.awaiting_routing += 1
                self.redirected += 1
                sim._push(now_us, EV_ROUTING, req)
        if not self.blis_quirks and self._holds_nothing(slot):
            self._terminate(slot, now_us)

    def _holds_nothing(self, slot: int) -> bool:
        """A draining instance may terminate: it holds no request and no disaggregated request
        is bound for it (with --blis-quirks: its wait queue and batch are empty, checked after
        its events only)."""
        if self.blis_quirks:
            inst = self.sim.instances[slot]
            return not inst.wait_queue and not inst.running
        pd = self.sim.pd
        return self.sim.in_flight[slot] == 0 and (pd is None or pd.headed[slot] == 0)

    def released(self, slot: int, now_us: int) -> None:
        """Something bound for the slot's instance went elsewhere: a draining instance that
        now holds nothing terminates."""
        if self.enabled and self.slots[slot].state == InstanceState.DRAINING \
                and self._holds_nothing(slot):
            self._terminate(slot, now_us)

    def _terminate(self, slot: int, now_us: int) -> None:
        s = self.slots[slot]
        self._set_state(slot, InstanceState.TERMINATED, now_us)
        s.settle(now_us)
        if s.node >= 0:
            self.placement.release(s.node)

    def after_instance_event(self, inst: Instance) -> None:
        """Lifecycle consequences of an instance's event: completions end a warm-up; a
        draining instance that holds nothing terminates."""
        slot, now_us = self.slots[inst.index], self.sim.clock_us
        if slot.state == InstanceState.WARMING_UP:
            done = sum(1 for r in inst.finished if r.state == Stage.COMPLETED)
            slot.warm_up_left -= min(done, slot.warm_up_left)
            if slot.warm_up_left == 0:
                inst.step_factor = 1.0
                self._set_state(inst.index, InstanceState.ACTIVE, now_us)
        self.sim._settle_finished(inst)
        if slot.state == InstanceState.DRAINING and self._holds_nothing(inst.index):
            self._terminate(inst.index, now_us)

    def counters(self, rows: dict[str, np.ndarray]) -> LifecycleCounters:
        """Settle the instances still held at the end; with --blis-quirks apply BLIS's
        after-the-run warm-up TTFT factor (§3.3) to ``rows``."""
        sim = self.sim
        end_us = min(sim.clock_us, sim.horizon_us)
        for s in self.slots:
            if s.state in HOLDING:
                s.settle(end_us)
        factor = self.config.warm_up_factor
        if self.blis_quirks and factor > 1:
            ttft = rows["ttft_us"]
            for routed in self.warm_up_routed:
                for r in routed:
                    if ttft[r] >= 0:
                        ttft[r] = int(float(ttft[r]) * factor)
        slots = self.slots
        t = self.timeline
        return LifecycleCounters(
            final_state=np.array([s.state for s in slots], dtype=np.int8),
            placements=np.array([s.placements for s in slots], dtype=np.int32),
            replica_us=np.array([s.replica_us for s in slots], dtype=np.int64),
            cost=np.array([s.cost for s in slots], dtype=np.float64),
            dropped_at_drain=np.array([x.dropped_at_drain for x in sim.instances],
                                      dtype=np.int64),
            end_us=end_us, scale_ups=self.scale_ups, scale_downs=self.scale_downs,
            instances_added=self.instances_added, instances_drained=self.instances_drained,
            oscillations=self.oscillations, refused_no_room=self.refused_no_room,
            redirected=self.redirected,
            timeline_us=np.array([x[0] for x in t], dtype=np.int64),
            timeline_slot=np.array([x[1] for x in t], dtype=np.int32),
            timeline_state=np.array([x[2] for x in t], dtype=np.int8))
