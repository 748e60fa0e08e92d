"""Host API of the JAX engine: run one lane or a population of lanes in lockstep.

The compiled program is one ``lax.while_loop`` whose body advances every lane through its
cheap events up to and including its next step (``vmap`` of ``lane_advance``); finished lanes
idle until the slowest lane is done. A device with more than ``LANE_BLOCK`` lanes runs them as
consecutive blocks (``lax.map``), each its own loop: a block's state stays cache-sized and its
lanes idle only until the block's slowest is done. With a CPU tier the blocks are smaller and
hold lanes of similar tier sizes (``TIERED_LANE_BLOCK``).

Counterpart: ``blisjax.reference.cluster.simulate`` (``simulate`` here) and
``ClusterSimulator._result`` (``lane_result``: the same ``RunResult`` fields).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

from blisjax.config.codes import HOLDING_STATES, AdmissionPolicy  # noqa: E402
from blisjax.engine import progcache  # noqa: E402
from blisjax.engine.cluster import lane_advance, next_event  # noqa: E402
from blisjax.engine.consts import build_consts, check_gpus, lane_consts  # noqa: E402
from blisjax.engine.initial import init_state  # noqa: E402
from blisjax.engine.lanes import FLAT_MIN_LANES, release_queued  # noqa: E402
from blisjax.engine.latency_rows import for_hardware  # noqa: E402
from blisjax.engine.lockstep import LANES  # noqa: E402
from blisjax.engine.params import (  # noqa: E402
    PolicyParams,
    fit_instances,
    params_from_config,
    stack_params,
)
from blisjax.engine.state import (  # noqa: E402
    DECODE,
    DROPPED_AT_DECODE,
    PREFILL,
    TRANSFER,
    WHOLE,
)
from blisjax.engine.static import EngineStatic, build_static, for_lanes  # noqa: E402
from blisjax.metrics import records  # noqa: E402
from blisjax.rules import held_cost  # noqa: E402

# Lanes per lockstep loop on a CPU device: 32–128 lanes cost about the same per lane-event, and
# far larger loops miss the cache (docs/performance.md, What the engine does for speed; Ideas
# tried).
LANE_BLOCK = 64
# On an accelerator every lane of a device runs in one loop: a loop iteration costs the same
# kernel launches at 64 lanes or thousands, so consecutive blocks would only multiply them.
ACCELERATOR_LANE_BLOCK = 1 << 20
# Lanes per loop on a CPU device for a population with CPU tiers smaller than a GPU cache. A
# lane whose tier is smaller than a mirror pass's distinct blocks takes the pass's exact
# stack-distance path (``kvtier._pass_stores``, work per lane) at nearly every step, and a
# block runs it whenever one of its lanes needs it; so such populations run in small blocks
# whose lanes are ordered by tier size (``_lane_order``): thrashing tiers share their blocks
# (docs/performance.md, A population of CPU tiers).
TIERED_LANE_BLOCK = 4


def default_lane_block(devices=None, st: EngineStatic | None = None,
                       params: PolicyParams | None = None) -> int:
    """Lanes per lockstep loop where ``lane_block`` is not given: ``ACCELERATOR_LANE_BLOCK``
    (all of a device's lanes in one loop) unless every device is a CPU; there
    ``TIERED_LANE_BLOCK`` for a program ``st`` with a CPU tier where some lane of ``params``
    (None: any) has a tier smaller than the GPU's KV cache (``small_tiers``), else
    ``LANE_BLOCK``. ``devices``: default, JAX's local devices."""
    devices = jax.local_devices() if devices is None else devices
    if not all(d.platform == "cpu" for d in devices):
        return ACCELERATOR_LANE_BLOCK
    if st is not None and st.tiered and (params is None or small_tiers(st, params)):
        return TIERED_LANE_BLOCK
    return LANE_BLOCK


def small_tiers(st: EngineStatic, params: PolicyParams) -> bool:
    """Whether some lane has a CPU tier smaller than an instance's GPU blocks: a mirror pass
    can then hold more distinct blocks than the tier (it thrashes); a bigger tier never
    evicts a pass's own blocks before they recur."""
    tiers = np.asarray(params.kv_cpu_blocks)
    return bool(np.any((tiers > 0) & (tiers < st.kv_blocks)))


def _lane_blocks(lanes: int, block: int) -> tuple[int, int]:
    """(blocks, lanes per block) for ``lanes`` lanes of one device: as few blocks as possible
    of at most ``block`` lanes, sized evenly so padding is under one lane per block."""
    count = max(1, -(-lanes // block))
    return count, -(-lanes // count)


def _run_local(st: EngineStatic, lane_block: int, consts, params: PolicyParams):
    """The lanes of one device, at most ``lane_block`` at a time (the lane count is a multiple
    of the block size chosen by ``_lane_blocks``; ``_placement`` pads it)."""
    lanes = int(params.admission.policy.shape[0])
    count, size = _lane_blocks(lanes, lane_block)
    if count == 1:
        return _run_block(st, consts, params)
    order = _lane_order(st, params)
    if order is not None:
        params = jax.tree_util.tree_map(lambda x: x[order], params)
    blocks = jax.tree_util.tree_map(lambda x: x.reshape(count, size, *x.shape[1:]), params)
    out = jax.lax.map(lambda p: _run_block(st, consts, p), blocks)
    out = jax.tree_util.tree_map(lambda x: x.reshape(lanes, *x.shape[2:]), out)
    if order is None:
        return out
    back = jnp.zeros_like(order).at[order].set(jnp.arange(lanes, dtype=order.dtype))
    return jax.tree_util.tree_map(lambda x: x[back], out)


def _lane_order(st: EngineStatic, params: PolicyParams):
    """The order in which a device's lanes are cut into blocks, or None (as given): with a
    CPU tier, by tier size (stable), so that lanes whose small tiers take the mirror pass's
    exact path at every step share their blocks. Lanes are independent: the order changes no
    lane's results, only which lanes wait for which."""
    if not st.tiered:
        return None
    return jnp.argsort(params.kv_cpu_blocks, stable=True)


def _initial_states(st: EngineStatic, params: PolicyParams):
    """Each lane's state before its first event (``params`` stacked)."""
    return jax.vmap(lambda p: init_state(
        st, p.admission.tb_capacity, p.admission.rl_burst, p.admission.policy,
        AdmissionPolicy.RATE_LIMIT, router_rng=p.routing.router_rng,
        kv_cpu_blocks=p.kv_cpu_blocks, kv_reload_us=p.kv_reload_us, pd_rng=p.pd.pool_rng,
        pd_role=p.pd.role, pd_pools=p.pd.pools, params=p))(params)


# Device memory of a population over its lanes' states, measured on an H200 (4,096 lanes of
# 5.7 MB: peak 1.16× the states; docs/performance.md, GPU), with a margin.
MEMORY_PER_STATE = 1.3


def state_bytes_per_lane(st: EngineStatic, params: PolicyParams) -> int:
    """Bytes of one lane's simulation state (shapes only: nothing is computed)."""
    one = jax.tree_util.tree_map(lambda x: x[:1], params)
    shapes = jax.eval_shape(lambda p: _initial_states(st, p), one)
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))


def check_memory(st: EngineStatic, placed: Placement, limit_bytes: int | None = None) -> None:
    """Refuse a population whose states cannot fit in device memory, before compiling.

    ``limit_bytes``: memory of one device (default: what the first device reports, as
    accelerators do; a CPU reports none and is not checked). Each device holds its share of
    the lanes, about ``MEMORY_PER_STATE`` times their states."""
    if limit_bytes is None:
        stats = placed.devices[0].memory_stats() or {}
        limit_bytes = stats.get("bytes_limit")
        if limit_bytes is None:
            return
    share = int(np.shape(placed.params.admission.policy)[0]) // len(placed.devices)
    per_lane = state_bytes_per_lane(st, placed.params)
    need = MEMORY_PER_STATE * per_lane * share
    if need <= limit_bytes:
        return
    fit = int(limit_bytes // (MEMORY_PER_STATE * per_lane)) * len(placed.devices)
    gib = 1 << 30
    raise ValueError(
        f"population: {placed.lanes} lanes need about {need / gib:.1f} GiB per device "
        f"({per_lane / 1e6:.2f} MB of state per lane, {share} lanes per device), and a device "
        f"holds {limit_bytes / gib:.1f} GiB: at most {fit} lanes fit in one call on "
        f"{len(placed.devices)} device{'s' if len(placed.devices) > 1 else ''}; split the "
        "population over several calls")


def _run_block(st: EngineStatic, consts, params: PolicyParams):
    """One block of lanes: one ``while_loop``; each iteration advances every lane through its
    next step (``lane_advance``)."""
    init = _initial_states(st, params)
    # With enough lanes, completions queue their releases and the queues of all lanes run
    # as one pass per iteration (``lanes.release_queued``); a few lanes release in place.
    defer = int(params.admission.policy.shape[0]) >= FLAT_MIN_LANES
    advance = jax.vmap(lambda s, ev, p: lane_advance(s, ev, st, lane_consts(st, consts, p), p,
                                                     defer), axis_name=LANES)

    def cond(carry):
        return ~jnp.all(carry[0].run.done)

    def body(carry):
        s, ev = advance(*carry, params)
        return (release_queued(s, st) if defer else s), ev

    first = jax.vmap(lambda s, p: next_event(s, st, lane_consts(st, consts, p)))(init, params)
    return jax.lax.while_loop(cond, body, (init, first))[0]


# Not used: XLA's ``xla_cpu_copy_insertion_use_region_analysis`` removes most full-array copies
# in inner loops but produced wrong results on parity edge cases (preemption-storm, horizon-cut)
# with jax 0.10.2 — an unsafe in-place update. Parity first; ``lockstep.after_reads`` avoids
# the copies.
@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _run_sharded(st: EngineStatic, consts, params: PolicyParams, devices: tuple,
                 lane_block: int):
    if len(devices) == 1:
        return _run_local(st, lane_block, consts, params)
    mesh = Mesh(np.array(devices), ("devices",))
    # Each device runs its own event loop over its share of the lanes (no per-event sync).
    return jax.shard_map(functools.partial(_run_local, st, lane_block), mesh=mesh,
                         in_specs=(PartitionSpec(), PartitionSpec("devices")),
                         out_specs=PartitionSpec("devices"), check_vma=False)(consts, params)


class Placement(NamedTuple):
    """Where a population runs (``_placement``)."""

    devices: tuple  # the devices used
    params: PolicyParams  # the population, padded to a whole number of lane blocks per device
    lanes: int  # the population's own lane count (its first lanes)
    lane_block: int  # lanes per lockstep loop (at most a device's share)


def _placement(st: EngineStatic, params: PolicyParams, devices,
               lane_block: int | None) -> Placement:
    """Lanes split evenly over the devices, each device's share a whole number of lane blocks
    (``lane_block`` lanes at most; ``None``: ``default_lane_block`` for ``st``); a population
    is padded with copies of its last lane (their results are dropped)."""
    devices = tuple(jax.local_devices() if devices is None else devices)
    if lane_block is None:
        lane_block = default_lane_block(devices, st, params)
    if lane_block < 1:
        raise ValueError(f"lane_block must be >= 1, got {lane_block}")
    lanes = int(np.shape(params.admission.policy)[0])
    devices = devices[:max(min(lanes, len(devices)), 1)]
    count, size = _lane_blocks(-(-lanes // len(devices)), lane_block)
    pad = count * size * len(devices) - lanes
    if pad:
        params = jax.tree_util.tree_map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]), params)
    return Placement(devices, params, lanes, min(lane_block, count * size))


_MAPS = "/proc/self/maps"
_MAP_LIMIT = "/proc/sys/vm/max_map_count"


def _count_lines(path: str) -> int | None:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux, or /proc not mounted: nothing to guard
        return None


def mapping_headroom_guard(fraction: float = 0.5) -> bool:
    """Drop JAX's compiled programs when the process holds more than ``fraction`` of Linux's
    memory-mapping limit; returns whether it did.

    Each engine program XLA:CPU compiles keeps ~2,000–3,000 memory mappings, and past
    ``vm.max_map_count`` (65,530 by default) XLA aborts the whole process inside the next
    compilation (measured: the ~25th program of one process). Programs are cheap to rebuild
    next to an abort, so a long-lived process (a search loop over many shapes, a pytest
    run) is guarded before every engine run; reading the map costs a few milliseconds.
    """
    used = _count_lines(_MAPS)
    if used is None:
        return False
    try:
        with open(_MAP_LIMIT) as f:
            limit = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        limit = 65_530  # Linux's default
    if used <= fraction * limit:
        return False
    jax.clear_caches()
    progcache.forget_loaded()
    return True


def run_lanes(st: EngineStatic, consts, params: PolicyParams, devices=None,
              lane_block: int | None = None):
    """Simulate a population (``params`` has a leading lane axis) on ``devices`` (default: all
    local devices), at most ``lane_block`` lanes per lockstep loop. Returns the final states,
    one per lane.

    When the population was padded (its size is not a whole number of equal lane blocks per
    device) the padding is sliced off on the devices, which copies every lane's state
    (docs/performance.md, What the engine does for speed); ``simulate_population`` reads the
    padded states in place instead."""
    final, lanes = _run_padded(st, consts, params, devices, lane_block)
    return _drop_padding(final, lanes)


def _run_padded(st: EngineStatic, consts, params: PolicyParams, devices,
                lane_block: int | None,
                phase: Callable[[str], None] | None = None):
    """(final states including any padding lanes, the population's own lane count): its first
    lanes are the population's. ``phase``, if given, is told "compiling …" and then
    "running …" (the program is then lowered and compiled explicitly, so the two are apart).
    With the program cache on (``progcache``) the compiled program comes from there."""
    mapping_headroom_guard()
    st = for_lanes(st, params)
    check_gpus(st, consts, params)
    params = _fit_instances(st, params)
    placed = _placement(st, params, devices, lane_block)
    check_memory(st, placed)
    lanes = placed.lanes
    if phase is None and not progcache.cacheable(st):  # jit's own in-process cache
        return _run_sharded(st, consts, placed.params, placed.devices, placed.lane_block), lanes
    if phase is not None:
        phase("compiling the JAX program (or loading it from the compile cache)")

    def lower():
        return _run_sharded.lower(st, consts, placed.params, placed.devices, placed.lane_block)

    def running():
        if phase is not None:
            phase(f"running {lanes} lane{'s' if lanes != 1 else ''} of {st.num_requests} "
                  "requests")

    final = progcache.run_program(st, lower, (consts, placed.params), placed.devices,
                                  placed.lane_block, running)
    return final, lanes


def _fit_instances(st: EngineStatic, params: PolicyParams) -> PolicyParams:
    """Stacked ``params`` with their per-instance fields as wide as the program's instances
    (``params.fit_instances``: a population whose lanes all have fewer stacks them narrower),
    the padded fields put on the device as they are."""
    fitted = fit_instances(params, st.num_instances)
    if fitted is params:
        return params
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, fitted)


def _drop_padding(final, lanes: int):
    """The first ``lanes`` lanes; without padding the states themselves (a slice copies every
    field)."""
    if int(final.run.done.shape[0]) == lanes:
        return final
    return jax.tree_util.tree_map(lambda x: x[:lanes], final)


def compile_lanes(st: EngineStatic, consts, params: PolicyParams, devices=None,
                  lane_block: int | None = None):
    """Compile once for these shapes (for timing compilation apart); returns ``run(consts,
    params)`` that behaves like ``run_lanes`` for populations of the same size."""
    mapping_headroom_guard()
    st = for_lanes(st, params)
    check_gpus(st, consts, params)
    params = _fit_instances(st, params)
    placed = _placement(st, params, devices, lane_block)
    check_memory(st, placed)
    block = placed.lane_block
    compiled = progcache.compiled_program(
        st, lambda: _run_sharded.lower(st, consts, placed.params, placed.devices, block),
        (consts, placed.params), placed.devices, block).compiled

    def run(consts, params):
        if for_lanes(st, params) != st:
            raise ValueError("these params list a scorer the compiled program does not "
                             "evaluate (precise-prefix-cache or no-hit-lru, which read the "
                             "instances' caches, or with closed-loop sessions prefix-affinity): "
                             "compile with params that list it")
        check_gpus(st, consts, params)
        again = _placement(st, _fit_instances(st, params), placed.devices, block)
        return _drop_padding(compiled(consts, again.params), again.lanes)

    return run


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
    n = st.num_requests
    pi = g.pi[:n].astype(np.int64)
    l_in = np.asarray(consts.input_tokens)[:n].astype(np.int64)
    out = np.asarray(consts.output_tokens)[:n].astype(np.int64)
    e2e = records.e2e_us(g.ttft[:n].astype(np.int64), g.itl_sum[:n].astype(np.int64), out,
                         st.post_decode_us)
    out_done = records.output_tokens_done(pi, l_in, out)
    # the cap of the instance it completed on (P/D pools of their own max-model-len)
    mml = (np.asarray(st.instance_max_model_len, np.int64)[np.maximum(g.instance[:n], 0)]
           if st.instance_max_model_len else st.max_model_len)
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


def lane_result(st: EngineStatic, consts, final, k: int) -> records.RunResult:
    """The k-th lane of a final state (or of its ``HostLanes``) as a ``RunResult`` (same
    fields as the reference)."""
    n = st.num_requests
    g = (final if isinstance(final, HostLanes) else HostLanes(final))(k)
    status = _status_codes(g.status[:n])
    done = status == records.COMPLETED
    derived = _completion_fields(st, consts, g, done)
    e2e, out_done, capped = derived.e2e_us, derived.output_tokens_done, derived.length_capped
    itl_count = derived.itl_count
    if st.itl_capacity > 0:
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
    if st.pd:
        for name, count in (("pd_transfers", g.pd.ovf_transfers),
                            ("pd_reserve", g.pd.ovf_reserve)):
            if int(count):
                overflow[name] = int(count)
    if st.lifecycle:
        for name, count in (("actuations", g.life.ovf_actuations),
                            ("instance_slots", g.life.ovf_slots),
                            ("lifecycle_draws", g.life.ovf_draws)):
            if int(count):
                overflow[name] = int(count)
        if int(g.life.tl_count) > st.timeline_slots:
            overflow["timeline"] = int(g.life.tl_count) - st.timeline_slots
    if st.gateway and int(g.gw.overflow):
        overflow["gateway"] = int(g.gw.overflow)
    if st.sessions and int(g.sess.rounds_overflow):
        overflow["session_rounds"] = int(g.sess.rounds_overflow)
    ended = int(np.max(np.minimum(clock, st.horizon_us))) if st.num_instances else 0
    rows = dict(
        status=status, instance=g.instance[:n].astype(np.int32),
        ttft_us=g.ttft[:n].astype(np.int64), e2e_us=e2e,
        scheduling_delay_us=g.sched[:n].astype(np.int64),
        itl_sum_us=np.where(done, g.itl_sum[:n], 0).astype(np.int64), itl_count=itl_count,
        output_tokens_done=out_done, preemptions=g.preempt[:n].astype(np.int32),
        length_capped=capped)
    # a lane without pools in a program with them: no P/D counters, as the reference
    pd_counters = _project_pd(st, consts, g, rows) if st.pd and bool(g.pd.pools) else None
    life = _lifecycle_counters(st, g, rows) if st.lifecycle else None
    sess = records.SessionRecords(
        np.where(np.asarray(consts.follow_up)[:n], g.sess.arrival_us[:n],
                 np.asarray(consts.arrival_us)[:n]).astype(np.int64),
        np.asarray(consts.input_tokens)[:n].astype(np.int64)) if st.sessions else None
    result = records.RunResult(
        **rows,
        itl_entries_us=itl_entries, itl_entry_request=itl_rows, sim_ended_us=ended,
        horizon_us=st.horizon_us,
        num_instances=st.num_instances,
        **{name: getattr(g.stats, field).astype(np.int64) for name, field in _STATS_FIELDS},
        still_queued=g.queue.length.astype(np.int64), still_running=g.batch.n_run.astype(np.int64),
        rejected_admission=int(g.admission.rejected),
        kv_total_blocks=np.array(st.instance_kv_blocks or [st.kv_blocks] * st.num_instances,
                                 np.int64),
        overflow=overflow,
        kv_tier=_tier_counters(st, g, n),
        pd=pd_counters,
        rejected_routing=int(g.life.rejected_routing) if st.lifecycle else 0,
        lifecycle=life,
        sessions=sess,
        # a lane without flow control in a program with it: no gateway counters
        gateway=records.GatewayCounters(int(g.gw.rejected), int(g.gw.count),
                                        int(g.gw.dispatched), int(g.gw.wait_sum))
        if st.gateway and bool(g.gw.on) else None,
    )
    return _lane_slots(result, int(g.life.lane_slots), bool(g.life.lane_on)) \
        if st.lifecycle else result


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


def _lifecycle_counters(st: EngineStatic, g, rows: dict) -> records.LifecycleCounters:
    """The lane's lifecycle counters, the instances still held settled at the run's end, as
    the reference's ``reference.lifecycle.Lifecycle.counters`` (read it for the rules); with
    --blis-quirks BLIS's after-the-run warm-up TTFT factor applied to ``rows``."""
    q = g.life
    end = min(int(q.last_event_us), st.horizon_us)
    state = q.state.astype(np.int8)
    replica_us = q.replica_us.astype(np.int64).copy()
    cost = q.cost.astype(np.float64).copy()
    for k in np.nonzero(np.isin(state, [int(x) for x in HOLDING_STATES]))[0].tolist():
        held = end - int(q.placed_us[k])
        replica_us[k] += held
        cost[k] += held_cost(held, float(q.cost_per_hour[k]))
    factor = float(q.warm_factor)
    if st.blis_quirks and factor > 1:
        n = st.num_requests
        ttft = rows["ttft_us"]
        marked = q.warm_routed[:n] & (ttft >= 0)
        ttft[marked] = (ttft[marked].astype(np.float64) * factor).astype(np.int64)
    count = min(int(q.tl_count), st.timeline_slots)
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
    n, q, quirks = st.num_requests, g.pd, st.blis_quirks
    c = lambda x: np.asarray(x)[:n].astype(np.int64)  # noqa: E731
    l_in, out, arrival, deadline = (c(consts.input_tokens), c(consts.output_tokens),
                                    c(consts.arrival_us), c(consts.deadline_us))
    if st.sessions:  # a follow-up's arrival is its creation's; its timeout counts from there
        follow = np.asarray(consts.follow_up)[:n]
        arrival = np.where(follow, g.sess.arrival_us[:n].astype(np.int64), arrival)
        deadline = np.where(follow & (deadline > 0), arrival + deadline,
                            np.where(follow, 0, deadline))
    phase = q.phase[:n]
    pre = np.arange(n) + n + 1
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
    dec_e2e = records.e2e_us(np.where(ttft_set, ttft_raw, 0), itl_sum, out, st.post_decode_us)
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
    per_request = per_row[:n] + per_row[n + 1:2 * n + 1] if st.pd else per_row[:n]
    return records.KVTierCounters(
        reloads=i64(t.reloads), cpu_misses=i64(t.cpu_misses),
        mirror_stores=i64(t.mirror_stores), cpu_evictions=i64(t.evictions),
        request_reloads=per_request, thrash_reloads=i64(t.thrash_reloads))


def _empty_result(resolved, workload) -> records.RunResult:
    """A run without requests: no event ever happens, so its result is the reference engine's
    (computed in microseconds); nothing is compiled."""
    from blisjax.reference import simulate as reference_simulate

    return reference_simulate(resolved, workload)


def simulate(resolved, workload, params: PolicyParams | None = None,
             phase: Callable[[str], None] | None = None, **capacities):
    """Run the JAX engine once (one lane); returns a ``RunResult`` like the reference engine.
    ``phase``: optional progress callback, told when compiling and running start.

    One lane compiles its step and release programs at full width only
    (``narrow_programs=False`` unless told otherwise): the narrower copies that pay off across
    a population make a single run's program several times larger and slower to load from the
    program cache, for a run hardly faster (docs/performance.md, Seconds to a first result)."""
    capacities.setdefault("narrow_programs", False)
    st = build_static(resolved, workload, **capacities)
    if st.num_requests == 0:
        return _empty_result(resolved, workload)
    if params is None:
        params = params_from_config(resolved.config, workload.tenant_names)
    st = for_hardware(st, resolved, workload, params)
    consts = build_consts(resolved, workload, st)
    final, lanes = _run_padded(st, consts, stack_params([params]), None, None, phase)
    return _own_clusters(st, [lane_result(st, consts, _drop_padding(final, lanes), 0)],
                         params)[0]


def simulate_population(resolved, workload, params: PolicyParams, static=None,
                        lane_block: int | None = None,
                        phase: Callable[[str], None] | None = None, **capacities):
    """Run a stacked population of params; returns one ``RunResult`` per lane. ``static``: a
    prebuilt ``EngineStatic`` (e.g. ``build_static_shared`` over several workloads, so they
    share one compiled program); default: built for this workload from ``capacities``.
    ``lane_block``: lanes per lockstep loop (see ``run_lanes``). ``phase``: told when
    compiling (or loading from the program cache) and running start, e.g. ``print``."""
    st = static if static is not None else build_static(resolved, workload, **capacities)
    if workload.num_requests == 0:
        if lane_block is not None and lane_block < 1:
            raise ValueError(f"lane_block must be >= 1, got {lane_block}")
        lanes = int(np.shape(params.admission.policy)[0])
        return [_empty_result(resolved, workload) for _ in range(lanes)]
    st = for_hardware(st, resolved, workload, params)
    consts = build_consts(resolved, workload, st)
    # padding lanes (if any) are skipped on the host, not sliced off on the devices
    final, lanes = _run_padded(st, consts, params, None, lane_block, phase)
    host = HostLanes(final)
    return _own_clusters(st, [lane_result(st, consts, host, k) for k in range(lanes)], params)


def _own_clusters(st: EngineStatic, results: list, params: PolicyParams) -> list:
    """Each lane's result over its own cluster (the ``cluster.num_instances`` knob: the
    program's first instances; the router never picks the others, so they did nothing).
    Lifecycles and P/D pools choose their instances themselves (``_lane_slots``)."""
    if st.lifecycle or st.pd:
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
