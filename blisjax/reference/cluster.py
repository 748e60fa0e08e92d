"""Shared-clock cluster loop: arrival → admission → routing → instances.

Implements docs/semantics.md §1.5 and §5; section numbers in comments refer to it. The P/D
pools (``reference.pd.PDCluster``, ``sim.pd``) and the instance lifecycles and autoscaler
(``reference.lifecycle.Lifecycle``, ``sim.life``) are components the simulator owns.

Cluster events are ordered by (time, priority, sequence; priorities in ``reference.events``)
with a counter starting at 0; at equal times cluster events run before instance events, and
among instances the lowest index first. Events past the horizon are never executed.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq

import numpy as np

from blisjax.blockhash import CHAIN_SEED, block_code, chain, content_code
from blisjax.config import ConfigError, resolve_config
from blisjax.config.autoscale import max_replicas
from blisjax.config.codes import SchedulerPolicy
from blisjax.latency import make_latency_model
from blisjax.metrics.records import (
    COMPLETED,
    NOT_RECORDED,
    OUTCOME_OF_STAGE,
    GatewayCounters,
    KVTierCounters,
    RunResult,
    SessionRecords,
    Stage,
)
from blisjax.reference.code_policy import RequestInfo, request_info
from blisjax.reference.events import (
    EV_ADMISSION,
    EV_CLUSTER_ARRIVAL,
    EV_GATEWAY_TICK,
    EV_LOADED,
    EV_PREFILL_ROUTING,
    EV_PROVISIONED,
    EV_ROUTING,
    EV_SCALE_ACTUATION,
    EV_SCALING_TICK,
    EV_TRANSFER_DONE,
    EV_TRANSFER_START,
)
from blisjax.reference.gateway import SATURATED, GatewayQueue, saturation
from blisjax.reference.instance import EV_ARRIVAL, EV_QUEUED, EV_STEP, EV_TIMEOUT, Instance
from blisjax.reference.lifecycle import Lifecycle
from blisjax.reference.pd import PDCluster
from blisjax.reference.policies import Admission, Priority, Router, Snapshot, leading_present
from blisjax.reference.program import cluster_observables, recent_arrivals
from blisjax.reference.request import PD_DECODE, PD_PREFILL, SimRequest
from blisjax.rules import KV_UTIL_BUCKETS
from blisjax.trace.records import InstanceView
from blisjax.workload import sessions

#: Event names in ``full`` traces.
CLUSTER_EVENT_NAMES = {
    EV_PROVISIONED: "node_ready", EV_LOADED: "instance_loaded", EV_CLUSTER_ARRIVAL: "arrival",
    EV_ADMISSION: "admission", EV_ROUTING: "routing", EV_PREFILL_ROUTING: "prefill_routing",
    EV_TRANSFER_START: "kv_transfer_start", EV_TRANSFER_DONE: "kv_transfer_done",
    EV_SCALING_TICK: "scaling_tick", EV_SCALE_ACTUATION: "scale_actuation",
    EV_GATEWAY_TICK: "gateway_tick"}
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
        priority = Priority(cfg.policy.priority, workload.tenant_names)
        n_inst = max_replicas(cfg.policy.autoscaler, cfg.cluster.num_instances,
                              cfg.cluster.node_pools, cfg.engine.tensor_parallel_size,
                              cfg.cluster.pd)
        # each instance runs its P/D pool's configuration (``ResolvedConfig.for_instance``)
        own = [resolved.for_instance(i) for i in range(n_inst)]
        latency = {id(x): make_latency_model(x) for x in own}
        self.resolved = resolved
        self._latency_by_gpu = {cfg.hardware: latency[id(resolved)]} if id(resolved) in latency \
            else {}
        self.instances = [
            Instance(i, engine=cfg.engine, total_kv_blocks=own[i].total_kv_blocks,
                     max_model_len=own[i].max_model_len, latency=latency[id(own[i])],
                     priority=priority,
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
        # sorted (arrival_rate); follow-ups join at their arrival when created (_follow_up)
        self._arrival_us = [int(x) for x in workload.arrival_us]
        priority.tenant_in_flight = self.tenant_in_flight  # a priority program reads it
        self.rejected_admission = 0
        #: the gateway queue (BLIS's flow control; None when off)
        gw = cfg.cluster.gateway
        self.gateway = GatewayQueue(gw, cfg.policy.priority.slo_class_score_table(),
                                    cfg.compat.blis_quirks) if gw.enabled else None
        self.rejected_routing = 0
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
        #: closed-loop sessions: each request's next round (-1: none); prompts as assembled
        self.next_round = sessions.next_round(workload)
        self.follow_ups_created = 0  # against the workload's follow-up budget
        self.rounds_overflow = 0  # follow-ups a session out of rows would have sent
        self._unbounded = tuple(workload.session_unbounded)
        self.prompts = sessions.prompt_tokens(workload, resolved.conversation_max_model_len,
                                              disaggregated=cfg.cluster.pd.enabled)
        self.requests = self._make_requests(workload, self.prompts)
        self.request_ids = [int(x) for x in np.asarray(workload.request_id).tolist()]
        #: the P/D pools (None without them)
        self.pd = PDCluster(self, resolved) if cfg.cluster.pd.enabled else None
        if code_policy is not None:  # functions instead of templates (code_policy.py)
            def describe(req: SimRequest) -> RequestInfo:
                return request_info(req, self.request_ids[req.index], workload.tenant_names)

            self.router.code, self.router.describe = code_policy.route_scores, describe
            priority.code, priority.describe = code_policy.priority, describe
        self.events: list = []
        self.seq = -1
        self.clock_us = 0
        # requests not routed yet (tick stop rule); a follow-up counts once it is created
        self.awaiting_routing = int(np.count_nonzero(~workload.follow_up))
        self.route_count = 0  # routings so far (the order a redirect drain routes again in)
        #: the instance slots, their lifecycles and the autoscaler
        self.life = Lifecycle(self)
        self._handlers = {EV_ADMISSION: self._admit, EV_ROUTING: self._route,
                          EV_PROVISIONED: self.life.start_loading, EV_LOADED: self.life.ready,
                          EV_SCALE_ACTUATION: self.life.actuate}
        if self.pd is not None:
            self._handlers.update({EV_PREFILL_ROUTING: self.pd.route_prefill,
                                   EV_TRANSFER_START: self.pd.start_transfer,
                                   EV_TRANSFER_DONE: self.pd.end_transfer})

    # ---- requests and their block hashes ----------------------------------------------------
    @staticmethod
    def _make_requests(w, prompts) -> list[SimRequest]:
        cols = (w.arrival_us, prompts, w.output_tokens, w.prefix_group, w.prefix_length,
                w.tenant, w.slo_class, w.deadline_us)
        rows = zip(*(c.tolist() for c in cols), strict=True)
        reqs = [SimRequest(i, *row) for i, row in enumerate(rows)]
        shared = sessions.content_tokens(w, prompts)
        for i in np.flatnonzero(w.session >= 0).tolist():
            reqs[i].session, reqs[i].session_tokens = int(w.session[i]), int(shared[i])
        return reqs

    def latency_on(self, gpu: str):
        """The latency model of this configuration on GPU ``gpu`` (an instance placed on a node
        pool of that GPU): the configuration resolved again with ``hardware: gpu``.

        Raises:
          ConfigError: naming ``cluster.node_pools`` where that configuration does not resolve
            (e.g. no shipped blackbox coefficients for the GPU)."""
        if gpu not in self._latency_by_gpu:
            cfg = self.resolved.config
            try:
                other = resolve_config(dataclasses.replace(cfg, hardware=gpu))
            except ConfigError as err:
                raise ConfigError("cluster.node_pools", f"an instance on a {gpu!r} node runs "
                                  f"at that GPU's speed: {err}") from None
            self._latency_by_gpu[gpu] = make_latency_model(other)
        return self._latency_by_gpu[gpu]

    def _hash_of(self, req: SimRequest, j: int) -> int:
        """Chained hash of block j of ``req`` (prompt and output blocks), computed lazily."""
        hashes = req.block_hashes
        if hashes is None:
            hashes = req.block_hashes = []
        while len(hashes) <= j:
            prev = hashes[-1] if hashes else CHAIN_SEED
            code = block_code(req.index, req.prefix_group, req.prefix_length, len(hashes),
                              self.block_size, req.session, req.session_tokens)
            hashes.append(chain(prev, code))
        return hashes[j]

    def _hash_at(self, prev: int | None, req: SimRequest, start_token: int) -> int:
        """The hash of a full block holding ``req``'s tokens from ``start_token`` on, chained
        from ``prev`` (the hash of the block the request holds before it; None: no hash): the
        hash of a block off the true chain (``KVCache._register``, the reload scan)."""
        code = content_code(req.index, req.prefix_group, req.prefix_length, start_token,
                            self.block_size, req.session, req.session_tokens)
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
            self.life.tick(time_us)
        elif prio == EV_GATEWAY_TICK:
            self._gateway_tick(time_us)
        else:
            self._handlers[prio](payload, time_us)

    def _admit(self, req: SimRequest, time_us: int) -> None:
        qd, _, kv = self._snapshots(time_us)  # building router state refreshes stale snapshots
        cluster = None
        if self.admission.reads_cluster:
            members = self.life.routable()
            members = list(range(len(self.instances))) if members is None else members
            cluster = cluster_observables(qd, self.in_flight, kv, members,
                                          recent_arrivals(self._arrival_us, time_us))
        admitted = self.admission.admit(req, time_us, self.tenant_in_flight, cluster)
        if self.trace is not None:
            self.trace.admission(req, time_us, admitted, self.cfg.policy.admission.policy)
        if admitted and self.gateway is not None and not self.gateway.enqueue(req, time_us):
            req.state = Stage.REJECTED  # the gateway queue is full (§5.12)
            self.awaiting_routing -= 1
        elif admitted:
            self.tenant_in_flight[req.tenant] += 1
            if self.gateway is not None:
                self._try_dispatch(time_us)
            else:
                self._push(time_us + self.routing_latency_us, EV_ROUTING, req)
        else:
            req.state = Stage.REJECTED
            self.rejected_admission += 1
            self.awaiting_routing -= 1

    def _try_dispatch(self, time_us: int) -> None:
        """One dispatch attempt of the gateway queue (§5.12; BLIS
        ``tryDispatchFromGatewayQueue``): with requests waiting, start the dispatch ticks if
        none is pending; on snapshots refreshed as a routing decision's, dispatch the next
        request to routing unless the cluster is saturated."""
        gw = self.gateway
        if not gw.entries:
            return
        if not gw.tick_pending:
            gw.tick_pending = True
            self._push(time_us + gw.cfg.dispatch_tick_interval_us, EV_GATEWAY_TICK, None)
        qd, _, kv = self._snapshots(time_us)
        members = self.life.routable()
        members = list(range(len(self.instances))) if members is None else members
        if saturation(gw.cfg, members, qd, kv, self.in_flight) >= SATURATED:
            return
        self._push(time_us + self.routing_latency_us, EV_ROUTING, gw.pop(time_us))

    def _gateway_tick(self, time_us: int) -> None:
        """A dispatch tick (BLIS ``GatewayDispatchTickEvent``): one dispatch attempt; the next
        tick follows while requests wait."""
        gw = self.gateway
        if gw.entries:
            self._try_dispatch(time_us)
        if gw.entries:
            self._push(time_us + gw.cfg.dispatch_tick_interval_us, EV_GATEWAY_TICK, None)
        else:
            gw.tick_pending = False

    def _route(self, req: SimRequest, time_us: int) -> None:
        """The routing decision among the routable instances; none routable rejects the
        request (BLIS's routing rejections)."""
        self.awaiting_routing -= 1
        qd, bs, kv = self._snapshots(time_us)
        snap = Snapshot(qd, bs, kv, self.in_flight, lambda: self._cached_blocks(req),
                        self.tenant_in_flight, time_us,
                        lambda: [x.recent.values(time_us) for x in self.instances],
                        recent_arrivals(self._arrival_us, time_us)
                        if self.router.program is not None else 0)
        if self.pd is not None:
            self.pd.route(req, time_us, snap)
            return
        routable = self.life.routable()
        if routable == []:
            self._reject_routing(req, time_us)
            return
        routed = self.router.decide(req, self._prompt_hashes(req), snap, routable)
        target = routed.target
        if self.trace is not None:
            self._trace_routing(req, time_us, routed, self.router, routable)
        req.route_order = self.route_count
        self.route_count += 1
        self.in_flight[target] += 1
        self.life.routed(req, target)
        self.instances[target].inject_arrival(req, time_us)

    def _reject_routing(self, req: SimRequest, time_us: int) -> None:
        """No instance the request may go to is routable: it is rejected (BLIS's routing
        rejections)."""
        req.state = Stage.REJECTED
        self.rejected_routing += 1
        self.tenant_in_flight[req.tenant] = max(0, self.tenant_in_flight[req.tenant] - 1)
        if self.trace is not None:
            self.trace.routing_rejection(req, time_us)

    # ---- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        if self.life.autoscaler is not None:  # BLIS pushes the first tick before the arrivals
            self._push(0, EV_SCALING_TICK, None)
        follow_up = self.workload.follow_up
        for req in self.requests:
            if not follow_up[req.index]:  # a follow-up arrives once its predecessor completes
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
                    self.pd.prefills_completed(inst)
                if self.life.enabled:
                    self.life.after_instance_event(inst)
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
        parents = self.pd.parents.values() if self.pd is not None else ()
        subs = [sub for p in parents for sub in (p.prefill_sub, p.decode_sub) if sub is not None]
        for x in self.instances:
            x.kv.check_conservation()
            assert len(x.running) <= x.max_running, "BC-12: batch exceeds max running requests"
            assert not x.wait_queue or x.step_pending or x.stalled, \
                "INV-8: queued work without a pending step"
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
        """In-flight accounting: requests that completed, dropped or timed out leave (§5.8);
        a completed round of a session creates its next round (a disaggregated round when its
        decode sub-request completes: at the end of that step, or with ``--blis-quirks`` at
        its start plus the post-decode overhead, as BLIS's ``detectDecodeCompletions``)."""
        if not inst.finished:
            return
        for r in inst.finished:
            self.in_flight[inst.index] = max(0, self.in_flight[inst.index] - 1)
            self.tenant_in_flight[r.tenant] = max(0, self.tenant_in_flight[r.tenant] - 1)
            if r.state == Stage.COMPLETED and r.pd_part != PD_PREFILL and (
                    self.next_round[r.index] >= 0 or self._out_of_rows(r)):
                at_start = self.blis_quirks and r.pd_part == PD_DECODE
                self._follow_up(r, inst.clock_us + inst.post_decode_us if at_start
                                else r.left_us)
            elif self.pd is not None and r.pd_part == PD_PREFILL \
                    and r.state != Stage.COMPLETED:
                self.pd.prefill_failed(r)
        inst.finished.clear()

    def _out_of_rows(self, done: SimRequest) -> bool:
        """``done`` is the last row of a session whose rows are a capacity (a concurrency
        user's, ``Workload.session_unbounded``)."""
        return done.session >= 0 and bool(self._unbounded) and self._unbounded[done.session]

    def _follow_up(self, done: SimRequest, done_us: int) -> None:
        """Create the session's next round when ``done`` (its predecessor) completed at
        ``done_us`` (``blisjax.workload.sessions``; BLIS ``SessionManager.OnComplete``): it
        arrives a think time after that, unless the follow-up budget
        is spent (``Workload.follow_up_budget``) or that is past the horizon. A round that
        timed out, was dropped or was rejected ends its session: it never gets here. A
        concurrency user out of rows that would send one more is counted in
        ``rounds_overflow`` (the run's ``overflow["session_rounds"]``)."""
        w = self.workload
        budget = w.follow_up_budget
        if 0 <= budget <= self.follow_ups_created:  # the budget is spent: the session ends
            return
        nxt = int(self.next_round[done.index])
        if nxt < 0:  # a concurrency user out of rows: it would send one more (flagged)
            if done_us + int(w.think_time_us[done.index]) <= self.horizon_us:
                self.rounds_overflow += 1
            return
        req = self.requests[nxt]
        if w.session_accumulate:  # the conversation so far, then the round's message
            progress = done.progress_index
            if done.pd_part == PD_DECODE:  # a one-token round's decode sub-request runs one
                # step past its prompt: the conversation holds what co-located serving made
                progress = min(progress, done.input_tokens + max(done.output_tokens, 1) - 1)
            expected = progress + int(w.input_tokens[req.index])
            if req.input_tokens != expected:
                raise RuntimeError(f"session round {req.index}: assembled prompt "
                                   f"{req.input_tokens} != {expected} tokens")
        arrival = done_us + int(w.think_time_us[req.index])
        if arrival > self.horizon_us:
            return
        req.arrival_us = arrival
        self.follow_ups_created += 1
        bisect.insort(self._arrival_us, arrival)  # an arrival of the programs' arrival_rate
        timeout = int(w.deadline_us[req.index])  # a follow-up's is relative to its arrival
        req.deadline_us = arrival + timeout if timeout > 0 else 0
        self.awaiting_routing += 1
        self._push(arrival, EV_CLUSTER_ARRIVAL, req)

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
        pd = self.pd.project(rows) if self.pd is not None else None
        insts = self.instances

        def per_inst(attr):
            return np.array([getattr(x, attr) for x in insts], dtype=np.int64)

        itl_entries = [e for x in insts for e in x.itl_entries]
        return RunResult(
            **rows,
            itl_entries_us=np.array(itl_entries, dtype=np.int64),
            itl_entry_request=np.array([k for x in insts for k in x.itl_entry_rows],
                                       dtype=np.int64),
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
            kv_block_time_us=per_inst("kv_block_time_us"),
            kv_util_time_us=per_inst("kv_util_time_us").reshape(len(insts),
                                                                KV_UTIL_BUCKETS + 1),
            kv_total_blocks=np.array([x.kv.total_blocks for x in insts], dtype=np.int64),
            kv_tier=self._tier_counters(),
            pd=pd,
            rejected_routing=self.rejected_routing,
            # with --blis-quirks a scale-up past the instance slots (BLIS has no such limit)
            overflow={name: count for name, count in (
                ("instance_slots", self.life.refused_no_slot),
                ("session_rounds", self.rounds_overflow)) if count},
            lifecycle=self.life.counters(rows) if self.life.enabled else None,
            gateway=(GatewayCounters(self.gateway.rejected, len(self.gateway),
                                     self.gateway.dispatched, self.gateway.wait_sum_us)
                     if self.gateway is not None else None),
            sessions=(SessionRecords(col("arrival_us"), np.asarray(self.prompts, np.int64))
                      if self.workload.has_sessions else None),
        )

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
