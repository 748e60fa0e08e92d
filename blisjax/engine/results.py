"""Results of the JAX engine's final states: each lane's ``RunResult``, read on the host.

Counterpart: ``blisjax.reference.cluster.ClusterSimulator._result`` (the same ``RunResult``
fields, per request, per instance and per feature: P/D parents projected from their
sub-requests, the CPU tier's counters, instance lifecycles). The program that produces the
states is ``run.py``'s.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from blisjax.config.codes import HOLDING_STATES
from blisjax.engine.state import (
    DECODE,
    DROPPED_AT_DECODE,
    PREFILL,
    TRANSFER,
    WHOLE,
)
from blisjax.engine.static import EngineStatic
from blisjax.metrics import records
from blisjax.rules import held_cost


def _status_codes(status: np.ndarray) -> np.ndarray:
    """``RunResult.status`` (``Outcome``) of each request's final ``Stage``."""
    return records.OUTCOME_OF_STAGE[status]


class HostLanes:
    """Lanes of final states read as NumPy views of each device's own buffer.

    Indexing device arrays lane by lane dispatches one slice per field and lane; converting a
    sharded array whole would first gather every device's share into one host copy (figures:
    docs/performance.md, What the engine does for speed).
    """

    def __init__(self, final) -> None:
        leaves, self._treedef = jax.tree_util.tree_flatten(final)
        self._parts = [self._shards(x) for x in leaves]

    @staticmethod
    def _shards(x) -> list[tuple[int, int, np.ndarray]]:
        """(first lane, end lane, host view) per device share of one field."""
        if not isinstance(x, jax.Array):
            x = np.asarray(x)
            return [(0, x.shape[0], x)]
        out = {}
        for shard in x.addressable_shards:
            lanes = shard.index[0] if shard.index else slice(None)
            start = lanes.start or 0
            if start not in out:  # replicated shares hold the same lanes
                data = np.asarray(shard.data)
                out[start] = (start, start + data.shape[0], data)
        return sorted(out.values(), key=lambda part: part[0])

    def __call__(self, k: int):
        """Lane k's final state (NumPy arrays)."""
        fields = []
        for parts in self._parts:
            start, _, data = next(p for p in parts if p[0] <= k < p[1])
            fields.append(data[k - start])
        return jax.tree_util.tree_unflatten(self._treedef, fields)


class CompletionFields(NamedTuple):
    """Per-request results derived from a lane's final state (``_completion_fields``); [N]."""

    e2e_us: np.ndarray  # int64: end-to-end latency (NOT_RECORDED unless completed)
    output_tokens_done: np.ndarray  # int64 (0 unless completed)
    length_capped: np.ndarray  # bool: completed at the max-model-len cap
    itl_count: np.ndarray  # int64: ITL entries (0 unless completed)


def _completion_fields(st: EngineStatic, consts, g, done) -> CompletionFields:
    """E2E, output tokens done, length-capped flag and ITL count per request, from one lane's
    final state: for a completed request they are functions of its progress, TTFT and ITL sum,
    which stop changing when it completes (``completion.complete``). ITL entries are decode
    steps, one per token past the prompt (``instance.execute``)."""
    n = int(consts.rows)
    pi = g.pi[:n].astype(np.int64)
    l_in = np.asarray(consts.input_tokens)[:n].astype(np.int64)
    out = np.asarray(consts.output_tokens)[:n].astype(np.int64)
    e2e = records.e2e_us(g.ttft[:n].astype(np.int64), g.itl_sum[:n].astype(np.int64), out,
                         st.settings.post_decode_us)
    out_done = records.output_tokens_done(pi, l_in, out)
    # the cap of the instance it completed on (P/D pools of their own max-model-len)
    mml = (np.asarray(st.settings.instance_max_model_len, np.int64)[np.maximum(g.instance[:n], 0)]
           if st.settings.instance_max_model_len else st.settings.max_model_len)
    capped = done & ~records.output_finished(pi, l_in, out) & records.at_length_cap(pi, mml)
    return CompletionFields(np.where(done, e2e, records.NOT_RECORDED).astype(np.int64),
                            np.where(done, out_done, 0).astype(np.int64), capped,
                            np.where(done, np.maximum(pi - l_in, 0), 0).astype(np.int64))


# ``RunResult``'s per-instance counters and the ``InstanceStats`` fields they come from
_STATS_FIELDS = (
    ("cache_hits", "hits"), ("cache_misses", "misses"), ("preemption_count", "preempt_count"),
    ("dropped_unservable", "dropped"), ("timed_out", "timed_out"),
    ("length_capped_count", "capped_count"), ("completed", "completed"),
    ("total_input_tokens", "input_tokens"), ("kv_allocation_failures", "alloc_failures"),
    ("queue_depth_time_us", "qdepth_time"), ("busy_time_us", "busy"), ("step_count", "steps"),
    ("peak_kv_blocks_used", "peak_used"), ("kv_block_time_us", "kv_time"),
    ("kv_util_time_us", "kv_util"))


def _kv_total_blocks(st: EngineStatic, g) -> np.ndarray:
    """int64 [I]: each instance's GPU KV blocks in the lane ``g``: the lane's own where lanes
    have their own settings (``KVState.capacity`` then holds them), P/D pools' where theirs
    differ, the program's otherwise."""
    if g.kv.capacity is not None:
        return np.asarray(g.kv.capacity, np.int64)
    return np.array(st.settings.instance_kv_blocks or [st.shapes.kv_blocks]
                    * st.shapes.num_instances, np.int64)


def lane_result(st: EngineStatic, consts, final, k: int) -> records.RunResult:
    """The k-th lane of a final state (or of its ``HostLanes``) as a ``RunResult`` (same
    fields as the reference): the workload's rows, not the program's spare ones."""
    n = int(consts.rows)
    g = (final if isinstance(final, HostLanes) else HostLanes(final))(k)
    status = _status_codes(g.status[:n])
    done = status == records.COMPLETED
    derived = _completion_fields(st, consts, g, done)
    e2e, out_done, capped = derived.e2e_us, derived.output_tokens_done, derived.length_capped
    itl_count = derived.itl_count
    if st.shapes.itl_capacity > 0:
        off = np.asarray(consts.itl_offset)[:n]
        entries = [g.itl_buf[o:o + c] for o, c in zip(off[done], itl_count[done], strict=True)]
        itl_entries = np.concatenate(entries).astype(np.int64) if entries else np.zeros(0, np.int64)
        itl_rows = np.repeat(np.flatnonzero(done), itl_count[done]).astype(np.int64)
    else:
        itl_entries = itl_rows = np.zeros(0, np.int64)
    clock = np.maximum(g.batch.clock, g.batch.last_left)
    overflow = {name: int(getattr(g.run, f"ovf_{name}")) for name in
                ("queue", "pending", "blocks", "deadline", "events")
                if int(getattr(g.run, f"ovf_{name}"))}
    if st.tiered and int(g.tier.offchain_overflow):
        overflow["offchain"] = int(g.tier.offchain_overflow)
    if st.tiered and int(g.tier.hold_overflow):
        overflow["kv_hold"] = int(g.tier.hold_overflow)
    if st.features.pd:
        for name, count in (("pd_transfers", g.pd.ovf_transfers),
                            ("pd_reserve", g.pd.ovf_reserve)):
            if int(count):
                overflow[name] = int(count)
    if st.features.lifecycle:
        for name, count in (("actuations", g.life.ovf_actuations),
                            ("instance_slots", g.life.ovf_slots),
                            ("lifecycle_draws", g.life.ovf_draws)):
            if int(count):
                overflow[name] = int(count)
        if int(g.life.tl_count) > st.shapes.timeline_slots:
            overflow["timeline"] = int(g.life.tl_count) - st.shapes.timeline_slots
    if st.features.gateway and int(g.gw.overflow):
        overflow["gateway"] = int(g.gw.overflow)
    if st.features.sessions and int(g.sess.rounds_overflow):
        overflow["session_rounds"] = int(g.sess.rounds_overflow)
    horizon = int(consts.horizon_us)
    ended = int(np.max(np.minimum(clock, horizon))) if st.shapes.num_instances else 0
    rows = dict(
        status=status, instance=g.instance[:n].astype(np.int32),
        ttft_us=g.ttft[:n].astype(np.int64), e2e_us=e2e,
        scheduling_delay_us=g.sched[:n].astype(np.int64),
        itl_sum_us=np.where(done, g.itl_sum[:n], 0).astype(np.int64), itl_count=itl_count,
        output_tokens_done=out_done, preemptions=g.preempt[:n].astype(np.int32),
        length_capped=capped)
    # a lane without pools in a program with them: no P/D counters, as the reference
    pd_counters = _project_pd(st, consts, g, rows) if st.features.pd and bool(g.pd.pools) else None
    life = _lifecycle_counters(st, g, rows, horizon) if st.features.lifecycle else None
    sess = records.SessionRecords(
        np.where(np.asarray(consts.follow_up)[:n], g.sess.arrival_us[:n],
                 np.asarray(consts.arrival_us)[:n]).astype(np.int64),
        np.asarray(consts.input_tokens)[:n].astype(np.int64)) if st.features.sessions else None
    result = records.RunResult(
        **rows,
        itl_entries_us=itl_entries, itl_entry_request=itl_rows, sim_ended_us=ended,
        horizon_us=horizon,
        num_instances=st.shapes.num_instances,
        **{name: getattr(g.stats, field).astype(np.int64) for name, field in _STATS_FIELDS},
        still_queued=g.queue.length.astype(np.int64), still_running=g.batch.n_run.astype(np.int64),
        rejected_admission=int(g.admission.rejected),
        kv_total_blocks=_kv_total_blocks(st, g),
        overflow=overflow,
        kv_tier=_tier_counters(st, g, n),
        pd=pd_counters,
        rejected_routing=int(g.life.rejected_routing) if st.features.lifecycle else 0,
        lifecycle=life,
        sessions=sess,
        # a lane without flow control in a program with it: no gateway counters
        gateway=records.GatewayCounters(int(g.gw.rejected), int(g.gw.count),
                                        int(g.gw.dispatched), int(g.gw.wait_sum))
        if st.features.gateway and bool(g.gw.on) else None,
    )
    return _lane_slots(result, int(g.life.lane_slots), bool(g.life.lane_on)) \
        if st.features.lifecycle else result


#: ``RunResult`` fields with one entry per instance.
_PER_INSTANCE = ("cache_hits", "cache_misses", "preemption_count", "still_queued",
                 "still_running", "dropped_unservable", "timed_out", "length_capped_count",
                 "completed", "total_input_tokens", "queue_depth_time_us", "busy_time_us",
                 "step_count", "peak_kv_blocks_used", "kv_allocation_failures",
                 "kv_block_time_us", "kv_total_blocks", "kv_util_time_us")


def _lane_slots(result: records.RunResult, slots: int, lane_on: bool) -> records.RunResult:
    """A lane's result with its own instance slots only (the program has the largest lane's),
    and without lifecycle counters when the lane itself has none (as the reference's)."""
    life = result.lifecycle
    if life is not None and lane_on:
        life = life._replace(**{f: getattr(life, f)[:slots] for f in (
            "final_state", "placements", "replica_us", "cost", "dropped_at_drain")})
    return _own_instances(dataclasses.replace(result, lifecycle=life if lane_on else None),
                          slots)


def _lifecycle_counters(st: EngineStatic, g, rows: dict,
                        horizon_us: int) -> records.LifecycleCounters:
    """The lane's lifecycle counters, the instances still held settled at the run's end, as
    the reference's ``reference.lifecycle.Lifecycle.counters`` (read it for the rules); with
    --blis-quirks BLIS's after-the-run warm-up TTFT factor applied to ``rows``."""
    q = g.life
    end = min(int(q.last_event_us), horizon_us)
    state = q.state.astype(np.int8)
    replica_us = q.replica_us.astype(np.int64).copy()
    cost = q.cost.astype(np.float64).copy()
    for k in np.nonzero(np.isin(state, [int(x) for x in HOLDING_STATES]))[0].tolist():
        held = end - int(q.placed_us[k])
        replica_us[k] += held
        cost[k] += held_cost(held, float(q.cost_per_hour[k]))
    factor = float(q.warm_factor)
    if st.settings.blis_quirks and factor > 1:
        ttft = rows["ttft_us"]
        marked = q.warm_routed[:len(ttft)] & (ttft >= 0)
        ttft[marked] = (ttft[marked].astype(np.float64) * factor).astype(np.int64)
    count = min(int(q.tl_count), st.shapes.timeline_slots)
    return records.LifecycleCounters(
        final_state=state, placements=q.placements.astype(np.int32), replica_us=replica_us,
        cost=cost, dropped_at_drain=q.dropped_at_drain.astype(np.int64), end_us=end,
        scale_ups=int(q.scale_ups), scale_downs=int(q.scale_downs),
        instances_added=int(q.added), instances_drained=int(q.drained),
        oscillations=int(q.oscillations), refused_no_room=int(q.refused_no_room),
        redirected=int(q.redirected), timeline_us=q.tl_us[:count].astype(np.int64),
        timeline_slot=q.tl_slot[:count].astype(np.int32),
        timeline_state=q.tl_state[:count].astype(np.int8))


def _project_pd(st: EngineStatic, consts, g, rows: dict) -> records.PDCounters:
    """Each disaggregated request's row from its sub-requests' rows, as the reference's
    ``reference.pd.PDCluster.project`` (read it for the rules); fills ``rows`` in place. Row r
    is the decode sub-request, row N + 1 + r the prefill sub-request."""
    n, q, quirks = int(consts.rows), g.pd, st.settings.blis_quirks
    c = lambda x: np.asarray(x)[:n].astype(np.int64)  # noqa: E731
    l_in, out, arrival, deadline = (c(consts.input_tokens), c(consts.output_tokens),
                                    c(consts.arrival_us), c(consts.deadline_us))
    # a follow-up's arrival is its creation's; its timeout counts from there
    if st.features.sessions:
        follow = np.asarray(consts.follow_up)[:n]
        arrival = np.where(follow, g.sess.arrival_us[:n].astype(np.int64), arrival)
        deadline = np.where(follow & (deadline > 0), arrival + deadline,
                            np.where(follow, 0, deadline))
    phase = q.phase[:n]
    pre = np.arange(n) + st.shapes.num_requests + 1
    pre_stage = g.status[pre]
    pre_status = records.OUTCOME_OF_STAGE[pre_stage]
    routed = phase >= PREFILL  # it has a prefill sub-request
    pre_done = routed & (pre_stage == records.Stage.COMPLETED)
    dropped = pre_done & (phase == DROPPED_AT_DECODE)
    arrived = pre_done & (phase == DECODE)
    dec_status = records.OUTCOME_OF_STAGE[g.status[:n]]
    dec_done = arrived & (dec_status == records.COMPLETED)
    dec_timed_out = arrived & (dec_status == records.TIMED_OUT)
    looks_done = dec_done | (dec_timed_out & quirks)  # BLIS's row for a timed-out decode
    pi = g.pi[:n].astype(np.int64)
    ttft_raw, sched = g.ttft[:n].astype(np.int64), g.sched[:n].astype(np.int64)
    ttft_set = ttft_raw >= 0  # it re-prefilled after a preemption
    first_itl = g.itl_buf[np.asarray(consts.itl_offset)[:n]].astype(np.int64)
    itl_sum = g.itl_sum[:n].astype(np.int64)
    nr = records.NOT_RECORDED
    split = phase != WHOLE
    status = np.where(routed & np.isin(pre_status, (records.TIMED_OUT, records.DROPPED)),
                      pre_status, records.UNFINISHED)
    status = np.where(dropped, records.COMPLETED if quirks else records.DROPPED, status)
    status = np.where(arrived, dec_status, status)
    status = np.where(looks_done, records.COMPLETED, status)
    ttft = np.where(pre_done & ~(dropped & ~quirks), g.ttft[pre], nr)
    ttft = np.where(looks_done & (pi > l_in) & (sched >= 0), sched + first_itl, ttft)
    dec_e2e = records.e2e_us(np.where(ttft_set, ttft_raw, 0), itl_sum, out,
                             st.settings.post_decode_us)
    e2e = np.full(n, nr, np.int64)
    e2e = np.where(dropped & quirks, q.transfer_start_us[:n] - arrival, e2e)
    e2e = np.where(dec_done, dec_e2e + np.where(ttft_set, 0, sched), e2e)
    e2e = np.where(dec_timed_out & quirks,
                   np.maximum(deadline, q.transfer_end_us[:n]) - arrival, e2e)
    pre_sched = g.sched[pre].astype(np.int64)
    delay = np.where(looks_done | (dropped & quirks), pre_sched, nr)
    preemptions = np.where(routed, g.preempt[pre], 0) + np.where(arrived, g.preempt[:n], 0)
    fields = dict(
        status=status, ttft_us=ttft, e2e_us=e2e, scheduling_delay_us=delay,
        itl_sum_us=np.where(dec_done, itl_sum, 0), itl_count=np.where(dec_done, pi - l_in, 0),
        output_tokens_done=np.where(dec_done, records.output_tokens_done(pi, l_in, out), 0),
        preemptions=preemptions,
        length_capped=dec_done & rows["length_capped"])
    for name, value in fields.items():
        rows[name] = np.where(split, value, rows[name]).astype(rows[name].dtype)
    return records.PDCounters(
        prefill_instance=q.prefill_instance[:n].astype(np.int32),
        transfer_start_us=q.transfer_start_us[:n].astype(np.int64),
        transfer_end_us=q.transfer_end_us[:n].astype(np.int64),
        role=q.role.astype(np.int8), prefill_completed=int(q.prefill_completed),
        in_transfer=int(np.sum(pre_done & (phase == TRANSFER))),
        dropped_at_decode_kv=int(q.dropped_kv), peak_transfers=int(q.peak),
        transfer_depth_sum=int(q.depth_sum), transfer_starts=int(q.starts), blis_quirks=quirks)


def _tier_counters(st: EngineStatic, g, n: int) -> records.KVTierCounters | None:
    """The lane's CPU-tier counters (None where it has no tier, as the reference)."""
    if not st.tiered or int(g.tier.capacity) == 0:
        return None
    t = g.tier
    i64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    per_row = i64(t.request_reloads)
    # a request's reloads are its sub-requests' together (``PDCluster``: they share its index)
    pre = st.shapes.num_requests + 1
    per_request = per_row[:n] + per_row[pre:pre + n] if st.features.pd else per_row[:n]
    return records.KVTierCounters(
        reloads=i64(t.reloads), cpu_misses=i64(t.cpu_misses),
        mirror_stores=i64(t.mirror_stores), cpu_evictions=i64(t.evictions),
        request_reloads=per_request, thrash_reloads=i64(t.thrash_reloads))


def own_clusters(st: EngineStatic, results: list, params) -> list:
    """Each lane's result over its own cluster (the ``cluster.num_instances`` knob: the
    program's first instances; the router never picks the others, so they did nothing).
    Lifecycles and P/D pools choose their instances themselves (``_lane_slots``)."""
    if st.features.lifecycle or st.features.pd:
        return results
    active = np.atleast_1d(np.asarray(params.active_instances))
    return [_own_instances(res, int(active[k])) for k, res in enumerate(results)]


def _own_instances(result: records.RunResult, count: int) -> records.RunResult:
    """``result`` over its first ``count`` instances."""
    if count == result.num_instances:
        return result
    tier = result.kv_tier
    if tier is not None:  # its per-instance counters (per request: all of them)
        tier = tier._replace(**{f: getattr(tier, f)[:count] for f in tier._fields
                                if f != "request_reloads"})
    pd = result.pd
    if pd is not None:  # its instances' roles
        pd = pd._replace(role=pd.role[:count])
    return dataclasses.replace(result, num_instances=count, kv_tier=tier, pd=pd,
                               **{f: getattr(result, f)[:count] for f in _PER_INSTANCE})
