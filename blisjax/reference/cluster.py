"""Shared-clock cluster loop: arrival → admission → routing → instances.

Implements docs/semantics.md §1.5 and §5; section numbers in comments refer to it.

Cluster events are ordered by (time, priority, sequence) with a counter starting at 0; at equal
times cluster events run before instance events, and among instances the lowest index first.
Events past the horizon are never executed.
"""

from __future__ import annotations

import heapq

import numpy as np

from blisjax.blockhash import CHAIN_SEED, block_code, chain, content_code
from blisjax.config.autoscale import lifecycle_configured, max_replicas
from blisjax.config.codes import DrainPolicy, InstanceState, SchedulerPolicy
from blisjax.config.sim import INT64_MAX, RoutingConfig
from blisjax.latency import make_latency_model
from blisjax.metrics.records import (
    COMPLETED,
    DROPPED,
    NOT_RECORDED,
    OUTCOME_OF_STAGE,
    TIMED_OUT,
    UNFINISHED,
    KVTierCounters,
    LifecycleCounters,
    PDCounters,
    RunResult,
    Stage,
)
from blisjax.reference.autoscaler import Autoscaler, Decision, Reading
from blisjax.reference.code_policy import RequestInfo, request_info
from blisjax.reference.instance import EV_ARRIVAL, EV_QUEUED, EV_STEP, EV_TIMEOUT, Instance
from blisjax.reference.lifecycle import (
    COMING_UP,
    HOLDING,
    LIVE,
    ROUTABLE,
    Placement,
    Slot,
    Streams,
)
from blisjax.reference.pd import Parent, Role, disaggregates, pool, transfer_duration_us
from blisjax.reference.policies import Admission, Priority, Router, Snapshot, leading_present
from blisjax.reference.request import PD_DECODE, PD_PREFILL, SimRequest
from blisjax.rules import instance_roles, instance_variants, variant_of
from blisjax.trace.records import InstanceView

# Cluster event priorities (§5.2; P/D §5.10; lifecycle and autoscaler semantics-next.md §3).
EV_PROVISIONED, EV_LOADED = -2, -1
EV_CLUSTER_ARRIVAL, EV_ADMISSION, EV_ROUTING = 0, 1, 2
EV_PREFILL_ROUTING, EV_TRANSFER_START, EV_TRANSFER_DONE = 4, 5, 6
EV_SCALING_TICK, EV_SCALE_ACTUATION = 8, 9
#: Event names in ``full`` traces.
CLUSTER_EVENT_NAMES = {
    EV_PROVISIONED: "node_ready", EV_LOADED: "instance_loaded", EV_CLUSTER_ARRIVAL: "arrival",
    EV_ADMISSION: "admission", EV_ROUTING: "routing", EV_PREFILL_ROUTING: "prefill_routing",
    EV_TRANSFER_START: "kv_transfer_start", EV_TRANSFER_DONE: "kv_transfer_done",
    EV_SCALING_TICK: "scaling_tick", EV_SCALE_ACTUATION: "scale_actuation"}
INSTANCE_EVENT_NAMES = {EV_ARRIVAL: "instance_arrival", EV_QUEUED: "enqueue", EV_STEP: "step",
                        EV_TIMEOUT: "timeout"}

class ClusterSimulator:
    """Reference simulation of one configuration on one workload.

    ``resolved`` is a ``blisjax.config.ResolvedConfig``; ``workload`` a ``blisjax.workload.Workload``.
    Set ``check_invariants=True`` to assert KV conservation and clock monotonicity after every
    event (slow; used by tests).
    """

    def __init__(self, resolved, workload, check_invariants: bool = False,
                 observer=None, trace=None, code_policy=None) -> None:
        cfg = resolved.config
        self.cfg = cfg
        self.workload = workload
        self.horizon_us = int(cfg.horizon_us)
        self.block_size = cfg.engine.block_size_tokens
        self.check_invariants = check_invariants
        # compat.blis_quirks (docs/semantics.md Decision 12): read by the features whose BLIS
        # behaviour it switches (P/D, tiered KV, autoscaling)
        self.blis_quirks = cfg.compat.blis_quirks
        latency = make_latency_model(resolved)
        priority = Priority(cfg.policy.priority, workload.tenant_names)
        n_inst = max_replicas(cfg.policy.autoscaler, cfg.cluster.num_instances,
                              cfg.cluster.node_pools, cfg.engine.tensor_parallel_size)
        self.instances = [
            Instance(i, engine=cfg.engine, total_kv_blocks=resolved.total_kv_blocks,
                     max_model_len=resolved.max_model_len, latency=latency, priority=priority,
                     scheduler=SchedulerPolicy.of(cfg.policy.scheduler.policy), horizon_us=self.horizon_us,
                     hash_of=self._hash_of, blis_quirks=cfg.compat.blis_quirks,
                     hash_at=self._hash_at,
                     thrash_window_us=cfg.metrics.kv_thrash_window_us)
            for i in range(n_inst)
        ]
        #: the decision-trace collector (``blisjax.trace.TraceCollector``) or None
        self.trace = trace
        for x in self.instances:
            x.observer = observer
            x.trace = trace
        self.admission = Admission(cfg.policy.admission, workload.tenant_names)
        self.router = Router(cfg.policy.routing, n_inst, self.block_size,
                             cfg.cluster.prefix_index_capacity_blocks, cfg.seed)
        self.admission_latency_us = cfg.cluster.admission_latency_us
        self.routing_latency_us = cfg.cluster.routing_latency_us
        self.refresh_interval_us = cfg.cluster.snapshot_refresh_interval_us
        self.in_flight = [0] * n_inst
        self.tenant_in_flight = [0] * len(workload.tenant_names)
        self.rejected_admission = 0
        # Periodic snapshot cache: all zeros until the first refresh (§5.4).
        self._snap_last_refresh_us = 0
        self._snap_qd = [0] * n_inst
        self._snap_bs = [0] * n_inst
        self._snap_kv = [0.0] * n_inst
        self._snap_used = [0] * n_inst
        # Periodic copy of each instance's cached-block hashes (§5.4): empty until the first
        # refresh at a decision >= cache_signal_delay_us; unused when the delay is 0 (live).
        self.cache_delay_us = cfg.cluster.cache_signal_delay_us
        self._cache_last_refresh_us = 0
        self._cache_copy: list[frozenset[int]] = [frozenset() for _ in range(n_inst)]
        self.requests = self._make_requests(workload)
        self.request_ids = [int(x) for x in np.asarray(workload.request_id).tolist()]
        self._init_pd(resolved)
        if code_policy is not None:  # functions instead of templates (code_policy.py)
            def describe(req: SimRequest) -> RequestInfo:
                return request_info(req, self.request_ids[req.index], workload.tenant_names)

            self.router.code, self.router.describe = code_policy.route_scores, describe
            priority.code, priority.describe = code_policy.priority, describe
        self.events: list = []
        self.seq = -1
        self.clock_us = 0
        self._init_lifecycle()
        self._handlers = {EV_ADMISSION: self._admit, EV_ROUTING: self._route,
                          EV_PREFILL_ROUTING: self._route_prefill,
                          EV_TRANSFER_START: self._start_transfer,
                          EV_TRANSFER_DONE: self._end_transfer,
                          EV_PROVISIONED: self._start_loading, EV_LOADED: self._ready,
                          EV_SCALE_ACTUATION: self._actuate}

    # ---- P/D disaggregation (§5.10) ------------------------------------------------------------
    def _init_pd(self, resolved) -> None:
        cfg = self.cfg
        pd = cfg.cluster.pd
        self.pd = pd if pd.enabled else None
        n_inst = len(self.instances)
        self.roles = instance_roles(pd, n_inst)
        self.parents: dict[int, Parent] = {}
        self.prefill_completed = 0
        self.dropped_at_decode_kv = 0
        self.active_transfers = self.peak_transfers = 0
        self.transfer_depth_sum = self.transfer_starts = 0
        if self.pd is None:
            return
        self.decode_pool = pool(self.roles, Role.DECODE)
        self.prefill_pool = pool(self.roles, Role.PREFILL)
        self.kv_bytes_per_token = resolved.pd_kv_bytes_per_token

        def pool_router(scorers, stream: str) -> Router:
            if not scorers:  # the pool routes with the cluster's policy (and its stream)
                return self.router
            routing = RoutingConfig(policy="weighted", scorers=scorers,
                                    tie_break=cfg.policy.routing.tie_break)
            return Router(routing, n_inst, self.block_size,
                          cfg.cluster.prefix_index_capacity_blocks, cfg.seed, stream)

        self.decode_router = pool_router(pd.decode_scorers, "decode-router")
        self.prefill_router = pool_router(pd.prefill_scorers, "prefill-router")
        # round-robin counts per pool; BLIS's one shared counter is a quirk (Decision 12)
        self.counter_of = ({"decode": "", "prefill": ""} if self.blis_quirks
                           else {"decode": "decode", "prefill": "prefill"})

    def _route_pd(self, req: SimRequest, time_us: int, snap: Snapshot) -> None:
        """Routing with pools: the decode instance first, then the decider. A disaggregated
        request goes on to prefill routing at the same time; any other is served whole by
        the decode instance."""
        pd = self.pd
        routed = self.decode_router.decide(req, self._prompt_hashes(req), snap,
                                           self.decode_pool, self.counter_of["decode"])
        decode = routed.target
        cached = 0
        if pd.decider == "prefix-threshold" and req.input_tokens > 0:
            cached = self._cached_blocks(req)[decode]
        split = disaggregates(pd.decider, pd.prefix_threshold_tokens, req.input_tokens, cached,
                              self.block_size)
        if self.trace is not None:  # BLIS: a routing record only for a request served whole
            self.trace.disaggregation(req, time_us, split, decode)
            if not split:
                self._trace_routing(req, time_us, routed, self.decode_router, self.decode_pool)
        if split:
            self.parents[req.index] = Parent(decode_instance=decode)
            self._push(time_us, EV_PREFILL_ROUTING, req)
            return
        self.in_flight[decode] += 1
        self.instances[decode].inject_arrival(req, time_us)

    def _route_prefill(self, req: SimRequest, time_us: int) -> None:
        """The prefill pool's decision; the prefill sub-request arrives at its instance."""
        qd, bs, kv = self._snapshots(time_us)
        snap = Snapshot(qd, bs, kv, self.in_flight, lambda: self._cached_blocks(req))
        routed = self.prefill_router.decide(req, self._prompt_hashes(req), snap,
                                            self.prefill_pool, self.counter_of["prefill"])
        target = routed.target
        if self.trace is not None:
            self._trace_routing(req, time_us, routed, self.prefill_router, self.prefill_pool,
                                prefill=True)
        self.in_flight[target] += 1
        parent = self.parents[req.index]
        parent.prefill_instance = target
        parent.prefill_sub = req.sub_request(PD_PREFILL)
        self.instances[target].inject_arrival(parent.prefill_sub, time_us)

    def _prefills_completed(self, inst: Instance) -> None:
        """Prefill sub-requests that completed in the instance's last event start their KV
        transfers, in BLIS's order (by request id as text): at the end of their last step,
        or with ``--blis-quirks`` at its start (Decision 12)."""
        done = [r for r in inst.finished if r.pd_part == PD_PREFILL and r.state == Stage.COMPLETED]
        for sub in sorted(done, key=lambda r: f"request_{self.request_ids[r.index]}_prefill"):
            self.prefill_completed += 1
            start = inst.clock_us if self.blis_quirks else sub.left_us
            self._push(start, EV_TRANSFER_START, self.requests[sub.index])

    def _start_transfer(self, req: SimRequest, time_us: int) -> None:
        """Reserve KV on the decode instance; the transfer then takes its time (dropped when
        the reservation fails)."""
        pd = self.pd
        parent = self.parents[req.index]
        sub = req.sub_request(PD_DECODE)
        parent.transfer_start_us = time_us
        if not self.instances[parent.decode_instance].reserve_transferred_kv(sub, time_us):
            parent.dropped_at_decode_kv = True
            self.dropped_at_decode_kv += 1
            return
        parent.decode_sub = sub
        active = 1
        if pd.transfer_contention:
            self.active_transfers += 1
            active = self.active_transfers
            self.peak_transfers = max(self.peak_transfers, active)
            self.transfer_depth_sum += active
            self.transfer_starts += 1
        duration = transfer_duration_us(req.input_tokens, self.block_size,
                                        self.kv_bytes_per_token, pd.transfer_bandwidth_gbps,
                                        pd.transfer_base_latency_ms, active)
        self._push(time_us + duration, EV_TRANSFER_DONE, req)

    def _end_transfer(self, req: SimRequest, time_us: int) -> None:
        """The KV has arrived: the decode sub-request joins the decode instance's queue."""
        if self.pd.transfer_contention:
            self.active_transfers -= 1
        parent = self.parents[req.index]
        parent.transfer_end_us = time_us
        if self.trace is not None:
            self.trace.kv_transfer(req, time_us, parent.transfer_start_us,
                                   -(-req.input_tokens // self.block_size),
                                   parent.prefill_instance, parent.decode_instance)
        self.in_flight[parent.decode_instance] += 1
        self.tenant_in_flight[req.tenant] += 1  # BLIS starts the tenant's request again
        decode = self.instances[parent.decode_instance]
        decode.enqueue_decode(parent.decode_sub, time_us)
        self._settle_finished(decode)  # one whose deadline has passed leaves at once

    # ---- instance lifecycle and autoscaling (Decision 16; semantics-next.md §3) ----------------
    def _init_lifecycle(self) -> None:
        cfg = self.cfg
        self.life = cfg.cluster.lifecycle
        self.autoscale_cfg = cfg.policy.autoscaler
        self.pools = cfg.cluster.node_pools
        self.tp = cfg.engine.tensor_parallel_size
        self.initial_instances = cfg.cluster.num_instances
        #: the run models lifecycles at all (otherwise every instance is Active throughout)
        self.lifecycle_on = lifecycle_configured(self.autoscale_cfg, self.pools, self.life)
        self.slots = [Slot() for _ in self.instances]
        self.streams = Streams(cfg.seed)
        self.placement = Placement(self.pools, self.tp, not self.blis_quirks, self.streams)
        self.variants = instance_variants(self.pools, cfg.hardware, self.life.cost_per_hour,
                                          self.tp)
        self.timeline: list[tuple[int, int, int]] = []
        self.rejected_routing = 0
        self.awaiting_routing = len(self.requests)  # requests not routed yet (tick stop rule)
        self.route_count = 0  # routings so far (the order a redirect drain routes again in)
        self.scale_ups = self.scale_downs = self.instances_added = self.instances_drained = 0
        self.oscillations = self.refused_no_slot = self.refused_no_room = self.redirected = 0
        self._last_direction, self._last_actuation_us = 0, 0
        # --blis-quirks warm-up: the first requests routed to each instance (TTFT × factor)
        self.warm_up_routed: list[list[int]] = [[] for _ in self.instances]
        self.autoscaler = (Autoscaler(self.autoscale_cfg, self.variants, self.block_size)
                           if self.autoscale_cfg.enabled else None)
        for i in range(self.initial_instances):
            placed = self._place(i, None, 0, initial=True)
            assert placed, "the initial nodes hold the initial instances (config check)"

    def _set_state(self, slot: int, state: InstanceState, now_us: int) -> None:
        self.slots[slot].state = state
        self.timeline.append((now_us, slot, int(state)))
        if self.trace is not None:
            self.trace.instance_state(now_us, slot, state)

    def _place(self, slot: int, gpu_type: str | None, now_us: int, initial: bool) -> bool:
        """Place an instance in ``slot`` (False: no room on the node pools). It starts ready
        (a warm-started initial instance), waits for its node, or starts loading."""
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
        s.cost_per_hour = pool.cost_per_hour if pool else self.life.cost_per_hour
        s.variant = variant_of(self.variants, pool.gpu_type if pool else self.cfg.hardware)
        if s.placements > 1:  # a reused slot: a new instance with cold caches
            self.instances[slot].restart()
            self.router.forget_instance(slot)
        # BLIS starts initial instances ready without node pools, whatever its lifecycle says
        warm = self.life.warm_start_initial_instances or (self.blis_quirks and not self.pools)
        if initial and warm:
            self._ready(slot, now_us)
            return True
        ready_us = self.placement.nodes[node].ready_us if node is not None else now_us
        if ready_us > now_us:
            self._set_state(slot, InstanceState.SCHEDULING, now_us)
            self._push(ready_us, EV_PROVISIONED, slot)
        else:
            self._start_loading(slot, now_us)
        return True

    def _start_loading(self, slot: int, now_us: int) -> None:
        self._set_state(slot, InstanceState.LOADING, now_us)
        delay = self.streams.delay_us(self.life.loading_delay, "instance-loading")
        if delay == 0:
            self._ready(slot, now_us)
        else:
            self._push(now_us + delay, EV_LOADED, slot)

    def _ready(self, slot: int, now_us: int) -> None:
        """Loaded: routable, warming up first when the lifecycle has a warm-up."""
        warm_up = self.life.warm_up_requests
        if warm_up == 0:
            self._set_state(slot, InstanceState.ACTIVE, now_us)
            return
        self.slots[slot].warm_up_left = warm_up
        if not self.blis_quirks:  # BLIS multiplies TTFTs after the run instead
            self.instances[slot].step_factor = self.life.warm_up_factor
        self._set_state(slot, InstanceState.WARMING_UP, now_us)

    def _routable(self) -> list[int] | None:
        """Slots the router may pick, in slot order (None: every instance, no lifecycle)."""
        if not self.lifecycle_on:
            return None
        return [i for i, s in enumerate(self.slots) if s.state in ROUTABLE]

    def _counts(self) -> tuple[int, int]:
        """(live, holding): instances counted by a scale-down's minimum / by the maximum."""
        live = sum(1 for s in self.slots if s.state in LIVE)
        return live, sum(1 for s in self.slots if s.state in HOLDING)

    def _bounded(self, delta: int) -> int:
        """A decision within the replica bounds and step limits (by default at most
        ``max_replicas`` instances held; with --blis-quirks no maximum, as BLIS)."""
        cfg = self.autoscale_cfg
        live, holding = self._counts()
        if delta > 0:
            if not self.blis_quirks:
                delta = min(delta, len(self.slots) - holding)
            if cfg.max_scale_up_step:
                delta = min(delta, cfg.max_scale_up_step)
            return max(delta, 0)
        if delta < 0:
            delta = max(delta, cfg.min_replicas - live)
            if cfg.max_scale_down_step:
                delta = max(delta, -cfg.max_scale_down_step)
            return min(delta, 0)
        return 0

    def _tick(self, now_us: int) -> None:
        """The autoscaler's periodic tick (§3.4): read, decide, schedule the actuation, and
        the next tick unless an unbounded run has nothing left to do."""
        qd, bs, _ = self._snapshots(now_us)
        routable = self._routable()
        coming_up = [i for i, s in enumerate(self.slots) if s.state in COMING_UP]
        reading = Reading(
            kv_used_blocks=[self._snap_used[i] for i in routable],
            kv_total_blocks=[self.instances[i].kv.total_blocks for i in routable],
            queue_depth=[qd[i] for i in routable], batch_size=[bs[i] for i in routable],
            variant=[self.slots[i].variant for i in routable],
            pending_kv_tokens=sum(self.instances[i].kv.total_blocks * self.block_size
                                  for i in coming_up),
            live=self._counts()[0])
        decision = self.autoscaler.decide(reading, now_us)
        delta = self._bounded(decision.delta)
        actuate = bool(delta) and self.autoscaler.cooled_down(delta, now_us)
        if self.trace is not None:
            self.trace.scale_decision(now_us, self.autoscale_cfg.policy, reading.live,
                                      len(routable), sum(reading.queue_depth),
                                      sum(reading.batch_size), decision.delta, delta, actuate)
        if actuate:
            self.autoscaler.passed(delta, now_us)
            delay = self.streams.delay_us(self.autoscale_cfg.actuation_delay, "autoscaler")
            self._push(now_us + delay, EV_SCALE_ACTUATION, Decision(delta, decision.variant))
        idle = self.awaiting_routing <= 0 and sum(self.in_flight) == 0
        if not (self.horizon_us == INT64_MAX and idle):
            self._push(now_us + self.autoscale_cfg.interval_us, EV_SCALING_TICK, None)

    def _actuate(self, decision: Decision, now_us: int) -> None:
        """Carry out a decision, within the bounds as they stand now: place new instances
        (free slot, node room) or drain the oldest Active ones (of the decision's variant)."""
        delta = self._bounded(decision.delta)
        placed, drained = [], []
        refused = 0
        if delta > 0:
            gpu_type = self.variants[decision.variant].gpu_type if decision.variant >= 0 else None
            for _ in range(delta):
                slot = self._free_slot()
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
            active = [i for i, s in enumerate(self.slots) if s.state == InstanceState.ACTIVE
                      and (decision.variant < 0 or s.variant == decision.variant)]
            for slot in sorted(active, key=self._drain_order)[:-delta]:
                self._drain(slot, now_us)
                drained.append(slot)
            self.instances_drained += len(drained)
            self.scale_downs += bool(drained)
        if self.trace is not None:
            self.trace.scale_actuation(now_us, delta, placed, drained, refused)
        if placed or drained:  # a scale against the previous one within the cooldown
            direction = 1 if delta > 0 else -1
            if (self._last_direction == -direction
                    and now_us - self._last_actuation_us < self.autoscale_cfg.cooldown_us):
                self.oscillations += 1
                if self.trace is not None:
                    self.trace.oscillation(now_us, direction, self._last_actuation_us,
                                           placed or drained)
            self._last_direction, self._last_actuation_us = direction, now_us

    def _free_slot(self) -> int | None:
        """The slot a new instance takes: the lowest not holding one (with --blis-quirks the
        lowest never used, as BLIS appends)."""
        free = ((InstanceState.UNUSED,) if self.blis_quirks
                else (InstanceState.UNUSED, InstanceState.TERMINATED))
        return next((i for i, s in enumerate(self.slots) if s.state in free), None)

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
        self._set_state(slot, InstanceState.DRAINING, now_us)
        inst = self.instances[slot]
        policy = DrainPolicy.of(self.autoscale_cfg.drain_policy)
        if policy == DrainPolicy.IMMEDIATE:
            inst.drop_everything(now_us)
            self._settle_finished(inst)
            self._terminate(slot, now_us)
            return
        if policy == DrainPolicy.REDIRECT:
            for req in inst.take_not_running():
                self.in_flight[slot] -= 1
                req.state, req.instance = Stage.PENDING, -1
                self.awaiting_routing += 1
                self.redirected += 1
                self._push(now_us, EV_ROUTING, req)
        if not self.blis_quirks and self._holds_nothing(slot):
            self._terminate(slot, now_us)

    def _holds_nothing(self, slot: int) -> bool:
        """A draining instance may terminate: it holds no request (with --blis-quirks: its
        wait queue and batch are empty, checked after its events only)."""
        if self.blis_quirks:
            inst = self.instances[slot]
            return not inst.wait_queue and not inst.running
        return self.in_flight[slot] == 0

    def _terminate(self, slot: int, now_us: int) -> None:
        s = self.slots[slot]
        self._set_state(slot, InstanceState.TERMINATED, now_us)
        s.settle(now_us)
        if s.node >= 0:
            self.placement.release(s.node)

    def _after_instance_event(self, inst: Instance) -> None:
        """Lifecycle consequences of an instance's event: completions end a warm-up; a
        draining instance that holds nothing terminates."""
        slot, now_us = self.slots[inst.index], self.clock_us
        if slot.state == InstanceState.WARMING_UP:
            done = sum(1 for r in inst.finished if r.state == Stage.COMPLETED)
            slot.warm_up_left -= min(done, slot.warm_up_left)
            if slot.warm_up_left == 0:
                inst.step_factor = 1.0
                self._set_state(inst.index, InstanceState.ACTIVE, now_us)
        self._settle_finished(inst)
        if slot.state == InstanceState.DRAINING and self._holds_nothing(inst.index):
            self._terminate(inst.index, now_us)

    # ---- requests and their block hashes ----------------------------------------------------
    @staticmethod
    def _make_requests(w) -> list[SimRequest]:
        cols = (w.arrival_us, w.input_tokens, w.output_tokens, w.prefix_group, w.prefix_length,
                w.tenant, w.slo_class, w.deadline_us)
        rows = zip(*(c.tolist() for c in cols), strict=True)
        return [SimRequest(i, *row) for i, row in enumerate(rows)]

    def _hash_of(self, req: SimRequest, j: int) -> int:
        """Chained hash of block j of ``req`` (prompt and output blocks), computed lazily."""
        hashes = req.block_hashes
        if hashes is None:
            hashes = req.block_hashes = []
        while len(hashes) <= j:
            prev = hashes[-1] if hashes else CHAIN_SEED
            code = block_code(req.index, req.prefix_group, req.prefix_length, len(hashes),
                              self.block_size)
            hashes.append(chain(prev, code))
        return hashes[j]

    def _hash_at(self, prev: int | None, req: SimRequest, start_token: int) -> int:
        """The hash of a full block holding ``req``'s tokens from ``start_token`` on, chained
        from ``prev`` (the hash of the block the request holds before it; None: no hash): the
        hash of a block off the true chain (``KVCache._register``, the reload scan)."""
        code = content_code(req.index, req.prefix_group, req.prefix_length, start_token,
                            self.block_size)
        return chain(CHAIN_SEED if prev is None else prev, code)

    def _prompt_hashes(self, req: SimRequest) -> list[int]:
        full = req.input_tokens // self.block_size
        if full == 0:
            return []
        self._hash_of(req, full - 1)
        return req.block_hashes[:full]

    # ---- cluster events ---------------------------------------------------------------------
    def _push(self, time_us: int, prio: int, req: SimRequest) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time_us, prio, self.seq, req))

    def _snapshots(self, now_us: int) -> tuple[list[int], list[int], list[float]]:
        """Queue depth, batch size and KV utilisation per instance, live or periodic."""
        interval = self.refresh_interval_us
        if interval == 0 or now_us - self._snap_last_refresh_us >= interval:
            self._snap_qd = [len(x.wait_queue) for x in self.instances]
            self._snap_bs = [len(x.running) for x in self.instances]
            self._snap_kv = [x.kv.used_blocks / x.kv.total_blocks for x in self.instances]
            self._snap_used = [x.kv.used_blocks for x in self.instances]
            self._snap_last_refresh_us = now_us
        delay = self.cache_delay_us
        if delay > 0 and now_us - self._cache_last_refresh_us >= delay:
            self._cache_copy = [frozenset(x.kv.hash_to_block) for x in self.instances]
            self._cache_last_refresh_us = now_us
        return self._snap_qd, self._snap_bs, self._snap_kv

    def _cached_blocks(self, req: SimRequest) -> list[int]:
        """The router's cache query: leading full prompt blocks of ``req`` cached on each
        instance, live or from the periodic copy (§5.4)."""
        if self.cache_delay_us == 0:
            return [len(x.kv.cached_blocks(req)) for x in self.instances]
        if not self.cfg.engine.enable_prefix_caching:
            return [0] * len(self.instances)
        hashes = self._prompt_hashes(req)
        return [leading_present(hashes, copy) for copy in self._cache_copy]

    def _trace_routing(self, req: SimRequest, time_us: int, routed, router: Router,
                       candidates: list[int] | None, prefill: bool = False) -> None:
        """The routing record: every candidate as the router saw it (the snapshots read by
        this decision; in-flight counts before its own increment)."""
        idx = range(len(self.instances)) if candidates is None else candidates
        cached = self._cached_blocks(req)
        views = [InstanceView(i, self._snap_qd[i], self._snap_bs[i], self.in_flight[i],
                              self._snap_kv[i],
                              self.instances[i].kv.total_blocks - self._snap_used[i], cached[i])
                 for i in idx]
        policy = "code:route_scores" if router.code is not None else router.policy.label
        self.trace.routing(req, time_us, routed.target, policy, routed.scores, views, prefill)

    def _trace_event(self, time_us: int, name: str, instance: int, payload) -> None:
        """``full`` level: an executed event (a lifecycle event's payload is its slot)."""
        if isinstance(payload, int):
            instance, payload = payload, None
        elif not isinstance(payload, SimRequest):
            payload = None  # an actuation's decision
        self.trace.event(time_us, name, instance, payload)

    def _execute_cluster_event(self, time_us: int, prio: int, payload) -> None:
        """Run the cluster event of priority ``prio`` (its kind) for ``payload`` (a request,
        a slot or a decision)."""
        if prio == EV_CLUSTER_ARRIVAL:
            self._push(time_us + self.admission_latency_us, EV_ADMISSION, payload)
        elif prio == EV_SCALING_TICK:
            self._tick(time_us)
        else:
            self._handlers[prio](payload, time_us)

    def _admit(self, req: SimRequest, time_us: int) -> None:
        self._snapshots(time_us)  # building router state refreshes stale snapshots
        admitted = self.admission.admit(req, time_us, self.tenant_in_flight)
        if self.trace is not None:
            self.trace.admission(req, time_us, admitted, self.cfg.policy.admission.policy)
        if admitted:
            self.tenant_in_flight[req.tenant] += 1
            self._push(time_us + self.routing_latency_us, EV_ROUTING, req)
        else:
            req.state = Stage.REJECTED
            self.rejected_admission += 1
            self.awaiting_routing -= 1

    def _route(self, req: SimRequest, time_us: int) -> None:
        """The routing decision among the routable instances; none routable rejects the
        request (BLIS's routing rejections)."""
        self.awaiting_routing -= 1
        qd, bs, kv = self._snapshots(time_us)
        snap = Snapshot(qd, bs, kv, self.in_flight, lambda: self._cached_blocks(req))
        if self.pd is not None:
            self._route_pd(req, time_us, snap)
            return
        routable = self._routable()
        if routable == []:
            req.state = Stage.REJECTED
            self.rejected_routing += 1
            self.tenant_in_flight[req.tenant] = max(0, self.tenant_in_flight[req.tenant] - 1)
            if self.trace is not None:
                self.trace.routing_rejection(req, time_us)
            return
        routed = self.router.decide(req, self._prompt_hashes(req), snap, routable)
        target = routed.target
        if self.trace is not None:
            self._trace_routing(req, time_us, routed, self.router, routable)
        req.route_order = self.route_count
        self.route_count += 1
        self.in_flight[target] += 1
        warm_up = self.warm_up_routed[target]
        if self.blis_quirks and len(warm_up) < self.life.warm_up_requests:
            warm_up.append(req.index)
        self.instances[target].inject_arrival(req, time_us)

    # ---- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        if self.autoscaler is not None:  # BLIS pushes the first tick before the arrivals
            self._push(0, EV_SCALING_TICK, None)
        for req in self.requests:
            self._push(req.arrival_us, EV_CLUSTER_ARRIVAL, req)
        instances = self.instances
        last_time = -1
        while True:
            c_time = self.events[0][0] if self.events else None
            inst, i_time = None, None
            for x in instances:  # strict <: the lowest index wins ties
                t = x.next_event_time()
                if t is not None and (i_time is None or t < i_time):
                    inst, i_time = x, t
            if c_time is None and inst is None:
                break
            if c_time is not None and (i_time is None or c_time <= i_time):
                if c_time > self.horizon_us:
                    break
                time_us, prio, _, req = heapq.heappop(self.events)
                self.clock_us = time_us
                if self.trace is not None and self.trace.full:
                    self._trace_event(time_us, CLUSTER_EVENT_NAMES[prio], -1, req)
                self._execute_cluster_event(time_us, prio, req)
            else:
                if i_time > self.horizon_us:
                    break
                self.clock_us = i_time
                if self.trace is not None and self.trace.full:
                    _, prio, _, req = inst.events[0]
                    if not inst.cancelled(prio, req):
                        self._trace_event(i_time, INSTANCE_EVENT_NAMES[prio], inst.index, req)
                inst.process_next_event()
                if self.pd is not None and inst.finished:
                    self._prefills_completed(inst)
                if self.lifecycle_on:
                    self._after_instance_event(inst)
                else:
                    self._settle_finished(inst)
            if self.check_invariants:
                assert self.clock_us >= last_time, "INV-3: clock moved backwards"
                last_time = self.clock_us
                self._check_invariants()
        return self._result()

    def _check_invariants(self) -> None:
        """Per-event invariants (tests only): KV conservation, batch limit, work conservation,
        bounded event queues (§11 BC-12, BC-13, BC-14; BC-14: per live request on an instance at
        most one pending arrival/enqueue and one timeout, plus one step)."""
        subs = [sub for p in self.parents.values() for sub in (p.prefill_sub, p.decode_sub)
                if sub is not None]
        for x in self.instances:
            x.kv.check_conservation()
            assert len(x.running) <= x.max_running, "BC-12: batch exceeds max running requests"
            assert not x.wait_queue or x.step_pending, "INV-8: queued work without a pending step"
            mine = [r for r in [*self.requests, *subs] if r.instance == x.index]
            live = sum(1 for r in mine if r.state in (Stage.PENDING, Stage.QUEUED, Stage.RUNNING))
            # completed requests may leave one lazily cancelled timeout behind
            stale = sum(1 for r in mine if r.state == Stage.COMPLETED
                        and x.clock_us <= r.deadline_us <= self.horizon_us)
            assert len(x.events) <= 2 * live + stale + 1, "BC-14: instance event queue unbounded"
            for r in x.running:
                assert r.state == Stage.RUNNING and r.progress_index <= r.input_tokens + r.output_tokens
        assert len(self.events) <= 3 * len(self.requests), "BC-14: cluster event queue unbounded"

    def _settle_finished(self, inst: Instance) -> None:
        """In-flight accounting: requests that completed, dropped or timed out leave (§5.8)."""
        if not inst.finished:
            return
        for r in inst.finished:
            self.in_flight[inst.index] = max(0, self.in_flight[inst.index] - 1)
            self.tenant_in_flight[r.tenant] = max(0, self.tenant_in_flight[r.tenant] - 1)
        inst.finished.clear()

    # ---- results ----------------------------------------------------------------------------
    def _result(self) -> RunResult:
        reqs = self.requests
        n = len(reqs)
        stage = np.zeros(n, dtype=np.int8)
        for r in reqs:
            stage[r.index] = r.state
        status = OUTCOME_OF_STAGE[stage]
        done = status == COMPLETED

        def col(attr, dtype=np.int64):
            return np.fromiter((getattr(r, attr) for r in reqs), dtype=dtype, count=n)

        e2e = np.where(done, col("e2e_us"), NOT_RECORDED)
        itl_sum = np.fromiter((sum(r.itl_us) if r.state == Stage.COMPLETED else 0 for r in reqs),
                              dtype=np.int64, count=n)
        itl_count = np.fromiter((len(r.itl_us) if r.state == Stage.COMPLETED else 0 for r in reqs),
                                dtype=np.int64, count=n)
        rows = dict(status=status, instance=col("instance", np.int32), ttft_us=col("ttft_us"),
                    e2e_us=e2e, scheduling_delay_us=col("scheduling_delay_us"),
                    itl_sum_us=itl_sum, itl_count=itl_count,
                    output_tokens_done=np.where(done, col("output_tokens_done"), 0),
                    preemptions=col("preemptions", np.int32),
                    length_capped=col("length_capped", bool))
        pd = self._project_pd(rows) if self.pd is not None else None
        insts = self.instances

        def per_inst(attr):
            return np.array([getattr(x, attr) for x in insts], dtype=np.int64)

        itl_entries = [e for x in insts for e in x.itl_entries]
        return RunResult(
            **rows,
            itl_entries_us=np.array(itl_entries, dtype=np.int64),
            sim_ended_us=max((x.sim_ended_us() for x in insts), default=0),
            horizon_us=self.horizon_us,
            num_instances=len(insts),
            cache_hits=np.array([x.kv.hits for x in insts], dtype=np.int64),
            cache_misses=np.array([x.kv.misses for x in insts], dtype=np.int64),
            preemption_count=per_inst("preemption_count"),
            still_queued=np.array([len(x.wait_queue) for x in insts], dtype=np.int64),
            still_running=np.array([len(x.running) for x in insts], dtype=np.int64),
            dropped_unservable=per_inst("dropped_unservable"),
            timed_out=per_inst("timed_out"),
            length_capped_count=per_inst("length_capped"),
            completed=per_inst("completed"),
            total_input_tokens=per_inst("total_input_tokens"),
            kv_allocation_failures=per_inst("kv_allocation_failures"),
            rejected_admission=self.rejected_admission,
            queue_depth_time_us=per_inst("queue_depth_time_us"),
            busy_time_us=per_inst("busy_time_us"),
            step_count=per_inst("step_count"),
            peak_kv_blocks_used=per_inst("peak_kv_blocks_used"),
            kv_tier=self._tier_counters(),
            pd=pd,
            rejected_routing=self.rejected_routing,
            # with --blis-quirks a scale-up past the instance slots (BLIS has no such limit)
            overflow={"instance_slots": self.refused_no_slot} if self.refused_no_slot else {},
            lifecycle=self._lifecycle_counters(rows) if self.lifecycle_on else None,
        )

    def _lifecycle_counters(self, rows: dict[str, np.ndarray]) -> LifecycleCounters:
        """Settle the instances still held at the end; with --blis-quirks apply BLIS's
        after-the-run warm-up TTFT factor (§3.3) to ``rows``."""
        end_us = min(self.clock_us, self.horizon_us)
        for s in self.slots:
            if s.state in HOLDING:
                s.settle(end_us)
        factor = self.life.warm_up_factor
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
            dropped_at_drain=np.array([x.dropped_at_drain for x in self.instances],
                                      dtype=np.int64),
            end_us=end_us, scale_ups=self.scale_ups, scale_downs=self.scale_downs,
            instances_added=self.instances_added, instances_drained=self.instances_drained,
            oscillations=self.oscillations, refused_no_room=self.refused_no_room,
            redirected=self.redirected,
            timeline_us=np.array([x[0] for x in t], dtype=np.int64),
            timeline_slot=np.array([x[1] for x in t], dtype=np.int32),
            timeline_state=np.array([x[2] for x in t], dtype=np.int8))

    def _project_pd(self, rows: dict[str, np.ndarray]) -> PDCounters:
        """Each disaggregated request's row from its sub-requests (§5.10, BLIS's projection):
        the decode instance handles it; completed, its TTFT is the decode sub-request's
        scheduling delay plus its first inter-token gap, its E2E the decode sub-request's own
        (plus that delay when it never re-prefilled), its scheduling delay the prefill's;
        otherwise its TTFT is the prefill's, if any. A failed decode-side reservation drops
        it, a timed-out decode sub-request times it out (with ``--blis-quirks`` each is BLIS's
        completed-looking row outside ``completed_requests``: E2E = transfer start −
        arrival, resp. timeout − arrival). Fills ``rows`` in place."""
        n = len(self.requests)
        prefill_instance = np.full(n, -1, np.int32)
        start = np.full(n, NOT_RECORDED, np.int64)
        end = np.full(n, NOT_RECORDED, np.int64)
        in_transfer = 0
        for r, parent in self.parents.items():
            req = self.requests[r]
            rows["instance"][r] = parent.decode_instance
            prefill_instance[r] = parent.prefill_instance
            start[r], end[r] = parent.transfer_start_us, parent.transfer_end_us
            pre, dec = parent.prefill_sub, parent.decode_sub
            status, ttft, e2e, sched = UNFINISHED, NOT_RECORDED, NOT_RECORDED, NOT_RECORDED
            itl_sum = itl_count = tokens = preemptions = 0
            capped = False
            if pre is not None:
                preemptions = pre.preemptions
                if pre.state in (Stage.TIMED_OUT, Stage.DROPPED):
                    status = OUTCOME_OF_STAGE[pre.state]
                elif pre.state == Stage.COMPLETED:
                    ttft = pre.ttft_us
                    if parent.dropped_at_decode_kv:
                        status = COMPLETED if self.blis_quirks else DROPPED
                        if self.blis_quirks:
                            e2e, sched = parent.transfer_start_us - req.arrival_us, \
                                pre.scheduling_delay_us
                        else:
                            ttft = NOT_RECORDED
                    elif dec is None or parent.transfer_end_us == NOT_RECORDED:
                        in_transfer += 1
                    else:
                        preemptions += dec.preemptions
                        status = OUTCOME_OF_STAGE[dec.state]
                        timed_out = status == TIMED_OUT
                        if status == COMPLETED or (timed_out and self.blis_quirks):
                            # a timed-out decode sub-request ends its request too in BLIS:
                            # a completed-looking row (E2E = timeout − arrival)
                            status, sched = COMPLETED, pre.scheduling_delay_us
                            if dec.itl_us and dec.scheduling_delay_us >= 0:
                                ttft = dec.scheduling_delay_us + dec.itl_us[0]
                        if timed_out and self.blis_quirks:
                            e2e = dec.left_us - req.arrival_us
                        elif status == COMPLETED:
                            e2e = dec.e2e_us + (0 if dec.ttft_set else dec.scheduling_delay_us)
                            itl_sum, itl_count = sum(dec.itl_us), len(dec.itl_us)
                            tokens, capped = dec.output_tokens_done, dec.length_capped
            rows["status"][r] = status
            rows["ttft_us"][r], rows["e2e_us"][r] = ttft, e2e
            rows["scheduling_delay_us"][r] = sched
            rows["itl_sum_us"][r], rows["itl_count"][r] = itl_sum, itl_count
            rows["output_tokens_done"][r] = tokens
            rows["preemptions"][r] = preemptions
            rows["length_capped"][r] = capped
        return PDCounters(
            prefill_instance=prefill_instance, transfer_start_us=start, transfer_end_us=end,
            role=np.array(self.roles, dtype=np.int8), prefill_completed=self.prefill_completed,
            in_transfer=in_transfer, dropped_at_decode_kv=self.dropped_at_decode_kv,
            peak_transfers=self.peak_transfers, transfer_depth_sum=self.transfer_depth_sum,
            transfer_starts=self.transfer_starts, blis_quirks=self.blis_quirks)

    def _tier_counters(self) -> KVTierCounters | None:
        """The CPU tier's counters (None without one)."""
        if not self.cfg.engine.kv_cpu_blocks:
            return None
        kvs = [x.kv for x in self.instances]
        reloads = np.zeros(len(self.requests), dtype=np.int64)
        for kv in kvs:
            for r, count in kv.request_reloads.items():
                reloads[r] += count

        def per_inst(get):
            return np.array([get(kv) for kv in kvs], dtype=np.int64)

        return KVTierCounters(
            reloads=per_inst(lambda kv: kv.reloads), cpu_misses=per_inst(lambda kv: kv.cpu_misses),
            mirror_stores=per_inst(lambda kv: kv.mirror_stores),
            cpu_evictions=per_inst(lambda kv: kv.cpu.evictions), request_reloads=reloads,
            thrash_reloads=per_inst(lambda kv: kv.thrash_reloads))


def simulate(resolved, workload, check_invariants: bool = False) -> RunResult:
    """Run the reference engine once: ``ResolvedConfig`` × ``Workload`` → ``RunResult``."""
    return ClusterSimulator(resolved, workload, check_invariants=check_invariants).run()
