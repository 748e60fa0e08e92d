"""Prefill/decode disaggregation in the reference engine: pools, deciders, KV transfers and the
parent request's metrics (docs/semantics.md §5.10, Decision 15; BLIS HEAD's P/D).

A disaggregated request (the *parent*) runs as two sub-requests with the parent's index: a
prefill sub-request on a prefill-pool instance (the prompt, no output tokens), then, after its
KV cache is transferred, a decode sub-request on the decode instance chosen when the parent was
routed (the output tokens). ``PDCluster`` holds a run's P/D state and handles its events for
``ClusterSimulator``. JAX counterpart: ``blisjax.engine.pd``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from blisjax.config.codes import PDRole
from blisjax.config.policy import RoutingConfig
from blisjax.metrics.records import (
    COMPLETED,
    DROPPED,
    NOT_RECORDED,
    OUTCOME_OF_STAGE,
    TIMED_OUT,
    UNFINISHED,
    PDCounters,
    Stage,
)
from blisjax.reference.events import EV_PREFILL_ROUTING, EV_TRANSFER_DONE, EV_TRANSFER_START
from blisjax.reference.policies import Router, Snapshot
from blisjax.reference.request import PD_DECODE, PD_PREFILL, SimRequest
from blisjax.rules import slot_roles

if TYPE_CHECKING:
    from blisjax.reference.cluster import ClusterSimulator
    from blisjax.reference.instance import Instance

Role = PDRole  # what an instance serves (a bit mask, as BLIS's roles)


def pool(roles: list[Role], wanted: Role) -> list[int]:
    """Instances whose role includes ``wanted``, in index order."""
    return [i for i, role in enumerate(roles) if role & wanted]


def disaggregates(decider: str, threshold_tokens: int, input_tokens: int,
                  cached_blocks_on_decode: int, block_size: int) -> bool:
    """The decider: ``never``, ``always``, or ``prefix-threshold`` — the prompt tokens not
    cached on the pre-selected decode instance (its consecutive cached prompt blocks) exceed
    the threshold (strictly); a request without prompt tokens is never disaggregated."""
    if decider == "never":
        return False
    if decider == "always":
        return True
    if input_tokens == 0:
        return False
    return input_tokens - cached_blocks_on_decode * block_size > threshold_tokens


def transfer_duration_us(input_tokens: int, block_size: int, kv_bytes_per_token: float,
                         bandwidth_gbps: float, base_latency_ms: float, active: int) -> int:
    """One KV transfer's duration, µs: ``ceil(base_ms·1000 + bytes / bw)``, at least 1, where
    bytes = ceil(L_in / bs) · (bs · KV bytes per token) and bw = GB/s · 1000 bytes per µs,
    divided by ``active`` (the transfers in flight, this one included) under contention
    (``active`` = 1 otherwise). Float64 in BLIS's order of operations."""
    blocks = -(-input_tokens // block_size)
    size = float(blocks) * (float(block_size) * kv_bytes_per_token)
    bandwidth = bandwidth_gbps * 1000.0
    if active > 1:
        bandwidth = bandwidth / float(active)
    return max(int(math.ceil(base_latency_ms * 1000.0 + size / bandwidth)), 1)


@dataclass
class Parent:
    """A disaggregated request's P/D state (times in µs; ``NOT_RECORDED`` until known)."""

    decode_instance: int
    prefill_instance: int = -1
    prefill_sub: object = None  # SimRequest
    decode_sub: object = None  # SimRequest, from the transfer's start
    transfer_start_us: int = NOT_RECORDED
    transfer_end_us: int = NOT_RECORDED
    dropped_at_decode_kv: bool = False  # the decode instance's KV reservation failed


class PDCluster:
    """A run's P/D pools (§5.10), owned by its ``ClusterSimulator`` (``sim.pd``, None without
    pools): routing into the pools, prefill sub-requests, KV transfers, and the parents' rows
    at the end. Reaches the cluster's instances, events and snapshots through ``sim``."""

    def __init__(self, sim: ClusterSimulator, resolved) -> None:
        cfg = sim.cfg
        pd = cfg.cluster.pd
        self.sim = sim
        self.config = pd
        self.blis_quirks = sim.blis_quirks
        self.block_size = sim.block_size
        n_inst = len(sim.instances)
        self.roles = slot_roles(cfg)  # autoscaled pools grow into slots of their role
        assert len(self.roles) == n_inst
        #: per instance: disaggregated parents bound for it whose decode sub-request has not
        #: joined it yet (a draining decode instance waits for them)
        self.headed = [0] * n_inst
        self.parents: dict[int, Parent] = {}
        self.prefill_completed = 0
        self.dropped_at_decode_kv = 0
        self.active_transfers = self.peak_transfers = 0
        self.transfer_depth_sum = self.transfer_starts = 0
        self.decode_pool = pool(self.roles, Role.DECODE)
        self.prefill_pool = pool(self.roles, Role.PREFILL)
        self.kv_bytes_per_token = resolved.pd_kv_bytes_per_token

        def pool_router(scorers, stream: str) -> Router:
            if not scorers:  # the pool routes with the cluster's policy (and its stream)
                return sim.router
            routing = RoutingConfig(policy="weighted", scorers=scorers,
                                    tie_break=cfg.policy.routing.tie_break)
            return Router(routing, n_inst, self.block_size,
                          cfg.cluster.prefix_index_capacity_blocks, cfg.seed, stream)

        self.decode_router = pool_router(pd.decode_scorers, "decode-router")
        self.prefill_router = pool_router(pd.prefill_scorers, "prefill-router")
        # round-robin counts per pool; BLIS's one shared counter is a quirk (Decision 12)
        self.counter_of = ({"decode": "", "prefill": ""} if self.blis_quirks
                           else {"decode": "decode", "prefill": "prefill"})

    def route(self, req: SimRequest, time_us: int, snap: Snapshot) -> None:
        """Routing with pools: the decode instance first, then the decider. A disaggregated
        request goes on to prefill routing at the same time; any other is served whole by
        the decode instance."""
        sim, pd = self.sim, self.config
        members = self._routable(self.decode_pool)
        if not members:
            sim._reject_routing(req, time_us)
            return
        routed = self.decode_router.decide(req, sim._prompt_hashes(req), snap,
                                           members, self.counter_of["decode"])
        decode = routed.target
        cached = 0
        if pd.decider == "prefix-threshold" and req.input_tokens > 0:
            cached = sim._cached_blocks(req)[decode]
        split = disaggregates(pd.decider, pd.prefix_threshold_tokens, req.input_tokens, cached,
                              self.block_size)
        if sim.trace is not None:  # BLIS: a routing record only for a request served whole
            sim.trace.disaggregation(req, time_us, split, decode)
            if not split:
                sim._trace_routing(req, time_us, routed, self.decode_router, members)
        if split:
            self.parents[req.index] = Parent(decode_instance=decode)
            self.headed[decode] += 1
            sim._push(time_us, EV_PREFILL_ROUTING, req)
            return
        sim.in_flight[decode] += 1
        sim.instances[decode].inject_arrival(req, time_us)

    def route_prefill(self, req: SimRequest, time_us: int) -> None:
        """The prefill pool's decision; the prefill sub-request arrives at its instance."""
        sim = self.sim
        members = self._routable(self.prefill_pool)
        if not members:  # no prefill instance is routable: the request is rejected
            sim._reject_routing(req, time_us)
            self._abandoned(self.parents.pop(req.index).decode_instance, time_us)
            return
        qd, bs, kv = sim._snapshots(time_us)
        snap = Snapshot(qd, bs, kv, sim.in_flight, lambda: sim._cached_blocks(req))
        routed = self.prefill_router.decide(req, sim._prompt_hashes(req), snap,
                                            members, self.counter_of["prefill"])
        target = routed.target
        if sim.trace is not None:
            sim._trace_routing(req, time_us, routed, self.prefill_router, members,
                               prefill=True)
        sim.in_flight[target] += 1
        parent = self.parents[req.index]
        parent.prefill_instance = target
        parent.prefill_sub = req.sub_request(PD_PREFILL)
        sim.instances[target].inject_arrival(parent.prefill_sub, time_us)

    def _routable(self, pool_members: list[int]) -> list[int]:
        """The pool's instances the router may pick (with instance lifecycles: the Active and
        WarmingUp ones)."""
        routable = self.sim.life.routable()
        if routable is None:
            return pool_members
        return [i for i in pool_members if i in routable]

    def prefills_completed(self, inst: Instance) -> None:
        """Prefill sub-requests that completed in the instance's last event start their KV
        transfers, in BLIS's order (by request id as text): at the end of their last step,
        or with ``--blis-quirks`` at its start (Decision 12)."""
        sim = self.sim
        done = [r for r in inst.finished if r.pd_part == PD_PREFILL and r.state == Stage.COMPLETED]
        for sub in sorted(done, key=lambda r: f"request_{sim.request_ids[r.index]}_prefill"):
            self.prefill_completed += 1
            start = inst.clock_us if self.blis_quirks else sub.left_us
            sim._push(start, EV_TRANSFER_START, sim.requests[sub.index])

    def prefill_failed(self, sub: SimRequest) -> None:
        """A prefill sub-request left its instance without completing (timed out or
        dropped): its parent no longer heads for its decode instance."""
        self._abandoned(self.parents[sub.index].decode_instance, self.sim.clock_us)

    def _abandoned(self, decode: int, now_us: int) -> None:
        """A parent bound for ``decode`` will not join it: a draining instance that now holds
        nothing terminates."""
        self.headed[decode] -= 1
        self.sim.life.released(decode, now_us)

    def start_transfer(self, req: SimRequest, time_us: int) -> None:
        """Reserve KV on the decode instance; the transfer then takes its time (dropped when
        the reservation fails)."""
        sim, pd = self.sim, self.config
        parent = self.parents[req.index]
        sub = req.sub_request(PD_DECODE)
        parent.transfer_start_us = time_us
        if not sim.instances[parent.decode_instance].reserve_transferred_kv(sub, time_us):
            parent.dropped_at_decode_kv = True
            self.dropped_at_decode_kv += 1
            self._abandoned(parent.decode_instance, time_us)
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
        sim._push(time_us + duration, EV_TRANSFER_DONE, req)

    def end_transfer(self, req: SimRequest, time_us: int) -> None:
        """The KV has arrived: the decode sub-request joins the decode instance's queue."""
        sim = self.sim
        if self.config.transfer_contention:
            self.active_transfers -= 1
        parent = self.parents[req.index]
        parent.transfer_end_us = time_us
        if sim.trace is not None:
            sim.trace.kv_transfer(req, time_us, parent.transfer_start_us,
                                  -(-req.input_tokens // self.block_size),
                                  parent.prefill_instance, parent.decode_instance)
        sim.in_flight[parent.decode_instance] += 1
        self.headed[parent.decode_instance] -= 1
        sim.tenant_in_flight[req.tenant] += 1  # BLIS starts the tenant's request again
        decode = sim.instances[parent.decode_instance]
        decode.enqueue_decode(parent.decode_sub, time_us)
        sim._settle_finished(decode)  # one whose deadline has passed leaves at once
        sim.life.released(parent.decode_instance, time_us)

    def project(self, rows: dict[str, np.ndarray]) -> PDCounters:
        """Each disaggregated request's row from its sub-requests (§5.10, BLIS's projection):
        the decode instance handles it; completed, its TTFT is the decode sub-request's
        scheduling delay plus its first inter-token gap, its E2E the decode sub-request's own
        (plus that delay when it never re-prefilled), its scheduling delay the prefill's;
        otherwise its TTFT is the prefill's, if any. A failed decode-side reservation drops
        it, a timed-out decode sub-request times it out (with ``--blis-quirks`` each is BLIS's
        completed-looking row outside ``completed_requests``: E2E = transfer start −
        arrival, resp. timeout − arrival). Fills ``rows`` in place."""
        requests = self.sim.requests
        n = len(requests)
        prefill_instance = np.full(n, -1, np.int32)
        start = np.full(n, NOT_RECORDED, np.int64)
        end = np.full(n, NOT_RECORDED, np.int64)
        in_transfer = 0
        for r, parent in self.parents.items():
            req = requests[r]
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
