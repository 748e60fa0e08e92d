"""Static (compile-time) configuration of the JAX engine.

``EngineStatic`` is hashable: it fixes every array shape (capacities) and the configuration
that is not searched over. The workload's constants, traced arrays, are ``consts.WorkloadConsts``.

Counterpart: the settings ``blisjax.reference.cluster.ClusterSimulator`` and ``Instance`` read
from the configuration in their constructors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from blisjax.config._checks import ConfigError
from blisjax.config.autoscale import max_replicas
from blisjax.config.codes import (
    CACHE_SCORERS,
    Scorer,
)
from blisjax.engine.latency_rows import (
    pool_configs,
    pool_shape,
    variant_gpus,
    with_gpus,
    with_variant_speed,
)
from blisjax.engine.request_rows import (
    engine_workload,
    ext_counts,
    group_blocks,
    itl_allotted,
    max_pending,
    own_counts,
    session_blocks,
)
from blisjax.engine.roofline import fits_the_program as roofline_fits_the_program
from blisjax.engine.static_parts import (
    FIELD_GROUP,
    GROUPS,
    Features,
    Settings,
    Shapes,
    Tuning,
    by_group,
)
from blisjax.latency.factory import make_latency_model
from blisjax.program.observables import SITES as PROGRAM_SITES
from blisjax.rules import instance_variants, uses_lifecycle


@dataclass(frozen=True)
class EngineStatic:
    """What fixes a compiled program, hashable (a static argument of the jitted run): its
    shapes, the simulated cluster's settings, the features compiled in and how the program is
    tuned. Built by ``build_static`` (from a configuration and a workload) and ``of`` (from
    fields by name); ``replace`` changes fields by name."""

    shapes: Shapes
    settings: Settings
    features: Features
    tuning: Tuning

    @classmethod
    def of(cls, **fields) -> EngineStatic:
        """An ``EngineStatic`` from its fields by name (each routed to its group)."""
        parts = by_group(fields)
        return cls(**{group: kind(**parts.get(group, {})) for group, kind in GROUPS.items()})

    def replace(self, **fields) -> EngineStatic:
        """This static with the named fields changed (each in its group)."""
        return dataclasses.replace(self, **{
            group: dataclasses.replace(getattr(self, group), **kw)
            for group, kw in by_group(fields).items()})

    def field(self, name: str):
        """The field ``name``'s value, whichever group holds it."""
        return getattr(getattr(self, FIELD_GROUP[name]), name)

    def fields(self) -> dict:
        """Every field by name (group by group)."""
        return {name: self.field(name) for name in FIELD_GROUP}

    @property
    def request_rows(self) -> int:
        """Rows of the per-request state: N requests, the sink row N, and with P/D pools the
        prefill sub-requests' rows N + 1 .. 2N."""
        n = self.shapes.num_requests
        return n + 1 + (n if self.features.pd else 0)

    @property
    def every_row_runs(self) -> bool:
        """The batch slots hold every request row (``batch_slots_for``): a cap on running
        requests at or above them never binds."""
        return self.shapes.batch_slots >= running_rows(self.shapes.num_requests,
                                                       pd=self.features.pd)

    @property
    def slot_count(self) -> int:
        """Batch slots per instance: the running batch's, then (P/D) the reservations', then
        (a CPU tier with ``blis_quirks``) the queued holders'."""
        return self.shapes.batch_slots + self.shapes.pd_reserve_slots + self.shapes.kv_hold_slots

    @property
    def hold_base(self) -> int:
        """The first slot of queued requests holding KV blocks (``kv_hold_slots``)."""
        return self.shapes.batch_slots + self.shapes.pd_reserve_slots

    @property
    def scaling_groups(self) -> int:
        """Groups of instance slots the autoscaler scales on its own: with P/D pools and
        instance lifecycles the prefill and the decode pool (``autoscaler.group_members``),
        else one."""
        return 2 if self.features.pd and self.features.lifecycle else 1

    @property
    def conversation_max_model_len(self) -> int:
        """The length cap under which accumulating conversations are assembled
        (``ResolvedConfig.conversation_max_model_len``): the decode pool's where P/D pools have
        caps of their own (row 2 of ``instance_rows``: decode and shared instances, where
        requests complete), else ``max_model_len``."""
        if self.settings.instance_max_model_len and 2 in self.settings.instance_rows:
            return self.settings.instance_max_model_len[self.settings.instance_rows.index(2)]
        return self.settings.max_model_len

    @property
    def tiered(self) -> bool:
        """A CPU tier is compiled in (``engine.kvtier``)."""
        return self.shapes.cpu_tier_blocks > 0

    @property
    def own_per_instance(self) -> bool:
        """A request's own blocks have hash slots and CPU keys per instance: with P/D pools
        (its prefill and decode sub-requests hold them on two instances), and with a CPU tier
        and instance lifecycles (a redirected request runs on another instance than the one
        whose tier holds its blocks)."""
        return self.features.pd or (self.features.lifecycle and self.tiered)

    @property
    def own_copies(self) -> int:
        """Instances a request's own blocks can be cached on: one, or all of them
        (``own_per_instance``)."""
        return self.shapes.num_instances if self.own_per_instance else 1

    @property
    def cpu_true_keys(self) -> int:
        """CPU keys of blocks on their true hash chain: the hash slots, then extension keys."""
        return self.hash_slots + self.own_copies * self.shapes.cpu_ext_slots

    @property
    def cpu_off_slots(self) -> int:
        """Off-chain CPU keys: ``offchain_generations`` per true key with a CPU tier (one
        placeholder without)."""
        return self.shapes.offchain_generations * self.cpu_true_keys if self.tiered else 1

    @property
    def cpu_keys(self) -> int:
        """CPU keys: the true keys, then the off-chain keys."""
        return self.cpu_true_keys + self.cpu_off_slots

    @property
    def cpu_ring(self) -> int:
        """Ring entries per instance's CPU tier: the tier, one mirror pass's appends (its
        distinct keys: at most one per GPU block, and at most every block of a full batch)
        and the tier again, so compactions stay rare; no longer, since a pass scans the
        whole ring (``kvtier.mirror``)."""
        shapes = self.shapes
        return 2 * shapes.cpu_tier_blocks + min(shapes.kv_blocks,
                                                shapes.batch_slots * shapes.max_blocks_per_request)

    @property
    def stretches(self) -> bool:
        """Decode stretches are compiled in: asked for, and the plain steps' times are
        computed in the program (not through the host callback)."""
        # With a CPU tier a stretch's mirror passes are one pass at its end
        # (``stretch._by_tier``); a batch with off-chain hashes or blocks off their positions
        # is not planned (``stretch.outlook``).
        return (self.tuning.decode_stretches and self.features.latency is None
                and not self.settings.row_roofline)

    @property
    def stretch_times_vary(self) -> bool:
        """The plain steps of a stretch have times of their own (a roofline or physics step's
        grows with the contexts; a physics step's also follows the preemption EMA), planned a
        bounded number of steps ahead (``VARYING_PLAN``); under the blackbox model they all
        last the same (the batch's token counts alone)."""
        return self.stretches and self.settings.latency_model in ("roofline", "physics")

    @property
    def stretch_offset_slots(self) -> int:
        """Entries per instance of ``StretchState.offset``: the starts of a plan's steps
        and of the real step after them where the times vary, none otherwise."""
        return VARYING_PLAN + 1 if self.stretch_times_vary else 0

    @property
    def stretch_ema_slots(self) -> int:
        """Entries per instance of ``StretchState.ema``: the physics EMA after each of a
        plan's steps (and before the first), none for other models or without stretches."""
        return VARYING_PLAN + 1 if self.stretches and self.stateful_latency else 0

    @property
    def recent_signals(self) -> bool:
        """Instances keep their recent signals (``engine.recent``): routing programs read
        them."""
        return "routing" in self.features.program_sites

    @property
    def cache_copy_on(self) -> bool:
        """The cache query reads a periodic copy rather than the live hash slots."""
        return self.features.cache_scorers and self.settings.cache_signal_delay_us > 0

    @property
    def max_step_tokens(self) -> int:
        """Most tokens one step processes: prefill chunks within the token budget plus one
        per decoding request (rows of the roofline's token table)."""
        return self.settings.token_budget + self.shapes.batch_slots

    @property
    def stateful_latency(self) -> bool:
        """Physics: the queueing delay and step time read instance state (and an EMA)."""
        return self.settings.latency_model == "physics"

    @property
    def group_slots(self) -> int:
        return self.shapes.num_instances * self.shapes.num_groups * self.shapes.group_blocks_max

    @property
    def session_slots(self) -> int:
        """Hash slots of session-shared blocks, after the prefix groups' (0 without sessions)."""
        shapes = self.shapes
        return shapes.num_instances * shapes.num_sessions * shapes.session_blocks_max \
            if self.features.sessions else 0

    @property
    def hash_slots(self) -> int:
        return self.group_slots + self.session_slots + self.own_copies * self.shapes.own_slots


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)



#: The program's field of each ``params.LaneSettings`` field (the same name unless listed).
LANE_SETTING_FIELDS = {"max_running": "batch_slots"}


def setting(st, c, name: str):
    """The setting ``name`` of ``params.LaneSettings`` this lane runs: its own (a traced value
    of the lane's constants, ``consts.lane_consts``) where the program reads them per lane
    (``Features.lane_settings``), else the program's (a Python int, so code it decides is
    compiled out)."""
    if st.features.lane_settings:
        return getattr(c.settings, name)
    return st.field(LANE_SETTING_FIELDS.get(name, name))


def lane_settings_run(st, lane, xp=jnp):
    """A lane's settings (``params.LaneSettings``, one lane's or stacked) as the program runs
    them: running requests at most the batch slots where those hold every request row
    (``EngineStatic.every_row_runs``: a larger cap is the same), KV blocks of 0 the program's.
    ``xp``: ``numpy`` for the host's checks (``static_lanes``), ``jax.numpy`` in the program
    (once per lane block, before its loop: ``run._run_block``)."""
    running = xp.minimum(lane.max_running, st.shapes.batch_slots) if st.every_row_runs \
        else lane.max_running
    kv_blocks = xp.where(lane.kv_blocks > 0, lane.kv_blocks, st.shapes.kv_blocks)
    return lane.replace(max_running=running, kv_blocks=kv_blocks.astype(np.int32))


def caps_length(st) -> bool:
    """Some instance caps request lengths (max-model-len): the cap's rules are compiled in."""
    return st.settings.max_model_len > 0 or any(x > 0 for x in st.settings.instance_max_model_len)


def max_model_len_of(st, i):
    """Instance i's max-model-len, 0 = none: the configuration's (a Python int), or with P/D
    pools of their own max-model-len its pool's (an int32 array of i's shape)."""
    if not st.settings.instance_max_model_len:
        return st.settings.max_model_len
    return jnp.asarray(st.settings.instance_max_model_len, jnp.int32)[i]


def running_rows(num_requests: int, *, pd: bool) -> int:
    """The request rows that could run at once: N, or 2N with P/D pools (the decode and
    prefill sub-requests)."""
    return num_requests * (2 if pd else 1)


def batch_slots_for(max_running: int, num_requests: int, *, pd: bool) -> int:
    """Running-batch slots per instance: ``max_running`` (``engine.max_num_running_reqs``),
    at most the request rows that could run at once (``running_rows``), at least 1."""
    return max(1, min(int(max_running), running_rows(num_requests, pd=pd)))


def build_static(resolved, workload, *, queue_slots: int | None = None,
                 pending_slots: int | None = None, deadline_window: int = 8,
                 max_blocks_per_request: int | None = None,
                 running_width: int = 64, narrow_programs: bool = True,
                 decode_stretches: bool | None = None,
                 cpu_tier_blocks: int | None = None,
                 offchain_generations: int = 8,
                 kv_hold_slots: int = 8,
                 pd_reserve_slots: int | None = None,
                 pd_transfer_slots: int | None = None,
                 actuation_slots: int | None = None,
                 timeline_slots: int | None = None,
                 max_events: int | None = None,
                 sized_lanes: bool = False, gpus=None,
                 lane_settings: bool = False) -> EngineStatic:
    """Capacities derived from the configuration and the workload (docs/jax-engine.md, Capacities and overflow).

    Defaults are safe upper bounds: the queue can hold every request, the pending window the
    most requests whose α-delay windows overlap in time, and the block table the blocks of the
    longest request (prompt + output + 1 tokens), so none of them can overflow; pass smaller
    values to save memory. The deadline window (8) overflows when more requests than it holds
    share one deadline microsecond. ``cpu_tier_blocks``: the CPU tier's capacity per instance
    (default ``engine.kv_cpu_blocks``; a search over the tier size sets its largest value, so
    every generation runs one program). ``offchain_generations``: with a CPU tier, the
    distinct predecessors one block content's off-chain hashes may have
    (``engine.kvtier``; a lane needing more overflows ``offchain``); ``kv_hold_slots``: with
    ``blis_quirks`` and a CPU tier, the queued requests per instance that may hold KV blocks
    after a failed tiered admission (a lane needing more overflows ``kv_hold``). With P/D pools,
    ``pd_reserve_slots`` (decode sub-requests waiting with reserved KV on one instance;
    default: as many as requests or KV blocks, whichever is fewer) and ``pd_transfer_slots``
    (transfers pending or in flight; default: one per request). With instance lifecycles,
    ``actuation_slots`` (scale actuations pending at once per lane; default 8) and
    ``timeline_slots`` (lifecycle state changes recorded per lane; default 64 per instance
    slot + 64). ``max_events``: events one lane handles at most (default: 64 per token and
    request plus the horizon in µs, ``consts.events_bound``; a lane reaching it with events
    left stops, flagged ``events``: no run can loop forever). ``sized_lanes``: lanes may have fewer instances than the configuration
    (the ``cluster.num_instances`` knob; set by itself when a population has such lanes, set
    it to share one program between populations with and without them). ``gpus``: GPU types
    the lanes may run (the ``hardware`` knob; set by itself from a population whose lanes
    run other GPUs than the configuration's, set it to share one program between them).
    ``lane_settings``: each lane reads its own settings that are knobs (``params.LaneSettings``;
    set by itself when a population's lanes differ from the configuration's, set it to share
    one program between populations with and without such lanes).
    """
    for name, value in (("queue_slots", queue_slots), ("pending_slots", pending_slots),
                        ("deadline_window", deadline_window),
                        ("max_blocks_per_request", max_blocks_per_request),
                        ("running_width", running_width),
                        ("offchain_generations", offchain_generations),
                        ("kv_hold_slots", kv_hold_slots),
                        ("pd_reserve_slots", pd_reserve_slots),
                        ("pd_transfer_slots", pd_transfer_slots),
                        ("actuation_slots", actuation_slots),
                        ("timeline_slots", timeline_slots),
                        ("max_events", max_events)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int | np.integer) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1 (or left to its default), "
                             f"got {value!r}")
    if cpu_tier_blocks is not None and (isinstance(cpu_tier_blocks, bool)
                                        or not isinstance(cpu_tier_blocks, int | np.integer)
                                        or cpu_tier_blocks < 0):
        raise ValueError(f"cpu_tier_blocks must be an integer >= 0 (or left to its default), "
                         f"got {cpu_tier_blocks!r}")
    if not isinstance(narrow_programs, bool | np.bool_):
        raise ValueError(f"narrow_programs must be True or False, got {narrow_programs!r}")
    if decode_stretches is not None and not isinstance(decode_stretches, bool | np.bool_):
        raise ValueError("decode_stretches must be True, False or None (decided by the "
                         f"workload), got {decode_stretches!r}")
    cfg = resolved.config
    pd = cfg.cluster.pd.enabled
    pools = pool_shape(resolved)
    # KV blocks per instance: the largest, where P/D pools' caches differ in size
    kv_blocks = max([int(resolved.total_kv_blocks), *pools.get("instance_kv_blocks", ())])
    eng = cfg.engine
    bs = eng.block_size_tokens
    sessions = workload.has_sessions
    if sessions:  # decode stretches plan steps past a follow-up's arrival: off
        decode_stretches = False
    if cfg.cluster.gateway.enabled:
        decode_stretches = False
    workload = engine_workload(workload, int(resolved.conversation_max_model_len),
                               pd=cfg.cluster.pd.enabled)
    n = workload.num_requests
    inp = np.asarray(workload.input_tokens, dtype=np.int64)
    out = np.asarray(workload.output_tokens, dtype=np.int64)
    total = inp + out if n else np.zeros(1, np.int64)
    groups = len(workload.prefix_group_names)
    gb = group_blocks(workload, bs)
    full = inp // bs
    horizon = int(cfg.horizon_us)
    # a follow-up's deadline is relative to its arrival (engine.sessions), not in the order
    dl = np.where(workload.follow_up, 0, np.asarray(workload.deadline_us))
    num_deadlines = int(((dl > 0) & (dl <= horizon)).sum())
    model = make_latency_model(resolved)
    if decode_stretches is None:
        decode_stretches = stretches_pay_off(out)
    slots = batch_slots_for(eng.max_num_running_reqs, n, pd=pd)
    st = EngineStatic.of(
        num_requests=n,
        num_instances=max_replicas(cfg.policy.autoscaler, cfg.cluster.num_instances,
                                   cfg.cluster.node_pools, eng.tensor_parallel_size,
                                   cfg.cluster.pd),
        num_tenants=len(workload.tenant_names),
        queue_slots=int(max(n, 1) if queue_slots is None else queue_slots),
        pending_slots=int(max_pending(resolved, workload, pool_configs(resolved))
                          if pending_slots is None else pending_slots),
        batch_slots=slots,
        max_blocks_per_request=int(
            (_ceil_div(int(total.max()) + 1, bs) if n else 1) if max_blocks_per_request is None
            else max_blocks_per_request),
        max_prompt_blocks=int(full.max()) if n else 0,
        kv_blocks=kv_blocks,
        block_size=bs,
        token_budget=eng.max_num_scheduled_tokens,
        long_prefill_threshold=eng.long_prefill_token_threshold,
        max_model_len=int(resolved.max_model_len),
        admission_latency_us=cfg.cluster.admission_latency_us,
        routing_latency_us=cfg.cluster.routing_latency_us,
        refresh_interval_us=cfg.cluster.snapshot_refresh_interval_us,
        prefix_caching=bool(eng.enable_prefix_caching),
        num_groups=max(groups, 1),
        group_blocks_max=max(int(gb.max()) if n else 0, 1),
        own_slots=max(int(own_counts(workload, bs).sum()) if n else 0, 1),
        prefix_index_capacity=cfg.cluster.prefix_index_capacity_blocks,
        post_decode_us=int(model.post_decode_overhead_us),
        num_deadlines=num_deadlines,
        deadline_window=deadline_window,
        itl_capacity=int(itl_allotted(out, pd).sum()) if n else 0,
        running_width=max(1, min(int(running_width), slots)),
        narrow_programs=bool(narrow_programs),
        decode_stretches=bool(decode_stretches),
        latency_model=cfg.latency.model,
        # the prefix-threshold decider reads the cache query (any lane may use it)
        cache_scorers=pd or cfg.policy.routing.policy == "program"
        or any(Scorer.of(w.name) in CACHE_SCORERS for w in cfg.policy.routing.scorers),
        program_sites=tuple(site for site in PROGRAM_SITES
                            if getattr(cfg.policy, site).policy == "program"),
        session_prefix_index=sessions and any(
            Scorer.of(w.name) == Scorer.PREFIX_AFFINITY for w in (
                *cfg.policy.routing.scorers, *cfg.cluster.pd.prefill_scorers,
                *cfg.cluster.pd.decode_scorers)),
        cache_signal_delay_us=cfg.cluster.cache_signal_delay_us,
        blis_quirks=cfg.compat.blis_quirks,
        cpu_tier_blocks=int(max(eng.kv_cpu_blocks, cpu_tier_blocks or 0)),
        kv_thrash_window_us=int(cfg.metrics.kv_thrash_window_us),
        cpu_ext_slots=max(int(ext_counts(inp, out, bs).sum()) if n else 0, 1),
        offchain_generations=int(offchain_generations),
        kv_hold_slots=(int(kv_hold_slots) if eng.kv_cpu_blocks > 0 or cpu_tier_blocks else 0)
        if cfg.compat.blis_quirks else 0,
        pd=pd,
        pd_reserve_slots=(int(pd_reserve_slots or max(min(n, kv_blocks), 1)) if pd else 0),
        pd_transfer_slots=int(pd_transfer_slots or max(n, 1)) if pd else 0,
        **_lifecycle_shape(cfg, actuation_slots, timeline_slots),
        max_events=int(max_events or 0),
        **_session_shape(workload, bs),
        **pools,
    )
    if cfg.cluster.gateway.enabled:
        st = with_gateway(st)
    if sized_lanes:
        st = st.replace(sized_lanes=_check_sized(st))
    if lane_settings:
        st = st.replace(lane_settings=True)
    # Evaluated on the host through a callback: a roofline configuration the program cannot
    # evaluate exactly.
    if st.settings.row_roofline:  # a pool runs the roofline model, another blackbox
        st = st.replace(latency_model="roofline")
    on_host = (cfg.latency.model == "roofline"
               and not roofline_fits_the_program(model, st.max_step_tokens, int(total.max())))
    if pools and st.settings.latency_model == "roofline" and any(
            not roofline_fits_the_program(make_latency_model(x), st.max_step_tokens,
                                          int(total.max())) for x in pool_configs(resolved)
            if x.config.latency.model == "roofline"):
        raise ConfigError("cluster.pd", "P/D pools of their own with a roofline model the "
                          "program evaluates on the host (contexts of 2^25 tokens or more) run "
                          "in the reference engine only (--engine reference)")
    st = st.replace(latency=model) if on_host else st
    st = with_gpus(st, resolved, workload, gpus) if gpus else st
    return with_variant_speed(st, resolved, workload, variant_gpus(cfg))


def _lifecycle_shape(cfg, actuation_slots: int | None, timeline_slots: int | None) -> dict:
    """``EngineStatic``'s lifecycle fields (``engine.lifecycle``; all off without one)."""
    if not uses_lifecycle(cfg):
        return {}
    pools = cfg.cluster.node_pools
    tp = cfg.engine.tensor_parallel_size
    slots = max_replicas(cfg.policy.autoscaler, cfg.cluster.num_instances, pools, tp,
                         cfg.cluster.pd)
    first = tuple(int(x) for x in np.cumsum([0] + [p.max_nodes for p in pools])[:-1])
    n0 = cfg.cluster.num_instances
    names = sorted(range(n0), key=lambda i: f"instance_{i}")
    return dict(
        lifecycle=True, gpus_per_instance=tp,
        num_pools=len(pools), num_nodes=max(sum(p.max_nodes for p in pools), 1),
        node_pool=tuple(k for k, p in enumerate(pools) for _ in range(p.max_nodes)) or (0,),
        pool_first_node=first or (0,),
        pool_initial_nodes=tuple(p.initial_nodes for p in pools) or (0,),
        num_variants=len(instance_variants(pools, cfg.hardware,
                                           cfg.cluster.lifecycle.cost_per_hour, tp)),
        initial_instances=n0, initial_name_rank=tuple(names.index(i) for i in range(n0)),
        actuation_slots=int(actuation_slots or 8),
        timeline_slots=int(timeline_slots or 64 * slots + 64))


def _check_sized(st: EngineStatic) -> bool:
    """True, or ConfigError when the program chooses its instances itself."""
    if st.features.lifecycle or st.features.pd:
        raise ConfigError("cluster.num_instances", "is not a per-lane knob with instance "
                          "lifecycles or P/D pools (the autoscaler and the pools decide which "
                          "instances serve): sweep the base configuration's instead")
    return True


# Mean output tokens per request from which decode stretches are compiled in by default. Each
# step then also plans its stretch and may apply one: with short outputs most steps admit or
# complete a request and the planning is pure overhead: scenario S (64 ± 16 output tokens) is
# slower with stretches, BLIS's anchor workload (512 ± 256) much faster (docs/performance.md,
# BLIS's anchor workload with decode stretches). ``build_static(decode_stretches=...)``
# overrides it.
STRETCH_MIN_MEAN_OUTPUT = 128


def stretches_pay_off(output_tokens) -> bool:
    """Whether decode stretches are worth compiling in for these output lengths (by default)."""
    out = np.asarray(output_tokens)
    return bool(out.size) and float(out.mean()) >= STRETCH_MIN_MEAN_OUTPUT


# Plain steps planned at most at once where their times vary (roofline): each plan evaluates
# the model for every one of them over the whole batch, and the plan's step starts are state.
# At least ``stretch.CHUNK_STEPS`` (a pass reads the starts of its steps). 16 ran faster than
# 32 and 64 on the default experiment (docs/performance.md, "The plan bound").
VARYING_PLAN = 16

# Capacities that may be raised above what one workload needs (upper bounds, never semantics).
_SHAREABLE = ("queue_slots", "pending_slots", "max_blocks_per_request", "max_prompt_blocks",
              "num_groups", "group_blocks_max", "own_slots", "num_deadlines", "itl_capacity",
              "cpu_ext_slots", "offchain_generations", "kv_hold_slots", "pd_reserve_slots",
              "pd_transfer_slots", "actuation_slots", "timeline_slots", "session_blocks_max",
              "gateway_slots", "open_sessions", "max_events", "num_sessions")


#: Also shared: the request rows (a workload of fewer requests leaves the rest spare,
#: ``consts.WorkloadConsts.rows``), the batch slots that follow from them
#: (``batch_slots_for``: max-num-running-reqs, or the rows where those are fewer) and the
#: narrowest step program's width (tuning: results are the same).
_SHAREABLE_ROWS = ("num_requests", "batch_slots", "running_width")


def build_static_shared(resolved, workloads, **capacities) -> EngineStatic:
    """One ``EngineStatic`` whose capacities cover every workload (e.g. several seeds of one
    workload spec, or hand cases of one configuration), so a single compiled program serves
    them all. Workloads must agree on everything that is not a capacity (tenants, ...)."""
    if capacities.get("decode_stretches") is None:  # one decision for all of them
        capacities["decode_stretches"] = stretches_pay_off(np.concatenate(
            [np.asarray(w.output_tokens) for w in workloads] or [np.zeros(0)]))
    statics = [build_static(resolved, w, **capacities) for w in workloads]
    if not statics:
        raise ValueError("build_static_shared: no workloads given")
    base = statics[0]
    shareable = _SHAREABLE + _SHAREABLE_ROWS
    for other in statics[1:]:
        for name in FIELD_GROUP:
            if name not in shareable and other.field(name) != base.field(name):
                raise ValueError(f"workloads differ in {name} ({base.field(name)} vs "
                                 f"{other.field(name)}); they cannot share one program")
    return base.replace(**{name: max(s.field(name) for s in statics) for name in shareable})


def with_gateway(st: EngineStatic) -> EngineStatic:
    """``st`` with the gateway queue compiled in (holding every request at most)."""
    if st.features.gateway:
        return st
    # as ``build_static`` for a configuration with the gateway: no decode stretches
    return st.replace(gateway=True, decode_stretches=False,
                      gateway_slots=max(st.shapes.gateway_slots, st.shapes.num_requests, 1))


def _session_shape(workload, bs: int) -> dict:
    """``EngineStatic``'s session fields (all off without follow-ups)."""
    if not workload.has_sessions:
        return {}
    return dict(sessions=True,
                open_sessions=any(workload.session_unbounded) or workload.follow_up_budget >= 0,
                num_sessions=max(len(workload.session_names), 1),
                session_blocks_max=max(int(session_blocks(workload, bs).max()), 1))
