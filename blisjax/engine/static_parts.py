"""The four parts of the JAX engine's static configuration (``static.EngineStatic``): its
shapes (counts and capacities), the simulated cluster's settings the program is built for, the
features compiled in, and how the program is tuned; and which part holds each field.

Counterpart: the settings ``blisjax.reference.cluster.ClusterSimulator`` and ``Instance`` read
from the configuration in their constructors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Shapes:
    """Counts and capacities: the sizes of the program's arrays. A capacity's overflow is
    detected and reported per lane, never silently wrong.

      queue_slots: wait-queue ring size per instance.
      pending_slots: requests between routing and enqueue (the α-delay window) per instance.
      batch_slots: running-batch slots per instance: max_num_running_reqs, or the request
        rows (N, 2N with P/D pools) where they are fewer, since no more can ever run at once
        (``batch_slots_for``): a small workload compiles one narrow step program.
      max_blocks_per_request: KV blocks one request can hold (prompt + output).
      kv_blocks: GPU KV blocks per instance (the largest, where P/D pools' caches differ:
        ``Settings.instance_kv_blocks``).
      deadline_window: requests sharing one deadline that can be ordered exactly.
      itl_capacity: raw ITL entries of all requests (0 only when no request has any).
      cpu_tier_blocks: the CPU tier's capacity in blocks per instance (``engine.kv_cpu_blocks``;
        a lane's own size is ``PolicyParams.kv_cpu_blocks`` <= it); 0 = no CPU tier compiled
        in (``EngineStatic.tiered``).
      cpu_ext_slots: CPU keys of blocks past the full prompt blocks (``engine.kvtier``).
      offchain_generations: with a CPU tier, distinct predecessors per block content of the
        off-chain CPU keys; a lane that needs more overflows ``offchain``.
      kv_hold_slots: queued requests holding KV blocks per instance (batch slots past the P/D
        reservations): with ``blis_quirks`` a tiered admission that claims reloaded blocks and
        then fails its pre-check leaves the request holding them while it waits
        (``kvtiered.tiered_allocate``); a lane that needs more overflows ``kv_hold``.
      pd_reserve_slots, pd_transfer_slots: with P/D pools, decode sub-requests waiting with
        reserved KV per instance (batch slots past ``batch_slots``), and KV transfers pending
        or in flight per lane.
      num_sessions, session_blocks_max: with closed-loop sessions, the sessions (a
        workload's own are the first ones) and the hash slots of session-shared blocks: per
        (instance, session, block), ``session_blocks_max`` per session. A workload's initial
        rows come first, then its follow-ups (``WorkloadConsts.initial_rows``, ``rows``).
      gateway_slots: requests the gateway queue holds at most (past them a lane overflows
        ``gateway``).
      num_pools, num_nodes, num_variants, actuation_slots, timeline_slots: with instance
        lifecycles, the node pools, their nodes, the instance variants, the scale actuations
        pending at once per lane and the state changes recorded per lane.
      max_events: events one lane handles at most (0: ``consts.events_bound`` of each
        workload, a value of the run, not of the program); a lane reaching it with events
        left stops, flagged.
    """

    num_requests: int
    num_instances: int
    num_tenants: int
    queue_slots: int
    pending_slots: int
    batch_slots: int
    max_blocks_per_request: int
    max_prompt_blocks: int
    kv_blocks: int
    num_groups: int
    group_blocks_max: int
    own_slots: int
    prefix_index_capacity: int
    num_deadlines: int
    deadline_window: int
    itl_capacity: int
    cpu_tier_blocks: int = 0
    cpu_ext_slots: int = 1
    offchain_generations: int = 8
    kv_hold_slots: int = 0
    pd_reserve_slots: int = 0
    pd_transfer_slots: int = 0
    num_sessions: int = 1
    session_blocks_max: int = 1
    gateway_slots: int = 1
    num_pools: int = 0
    num_nodes: int = 1
    num_variants: int = 1
    actuation_slots: int = 0
    timeline_slots: int = 0
    max_events: int = 0


@dataclass(frozen=True)
class Settings:
    """The simulated cluster's settings that the program is built for (every lane shares
    them; what differs per lane is a ``PolicyParams`` knob). All times in µs.

      token_budget, long_prefill_threshold, admission_latency_us, routing_latency_us,
        refresh_interval_us: the base configuration's; with ``Features.lane_settings`` each
        lane runs its own (``params.LaneSettings``, read through ``setting``) and
        ``token_budget`` bounds them (the step tables' tokens).

      latency_model: ``latency.model``: step times (and physics queueing delays) are
        computed in the program with the reference's float operations in its order
        (``blisjax.engine.roofline``, ``blisjax.engine.physics``), unless
        ``Features.latency`` is set.
      cache_signal_delay_us: ``cluster.cache_signal_delay_us``: > 0, the cache query reads a
        periodic copy of the hash slots (``RouterState.cache_copy``), compiled in with the
        query.
      blis_quirks: ``compat.blis_quirks``: reproduce BLIS's own behaviour where it departs
        from a real cluster (docs/semantics.md Decision 12; the features with such quirks
        read it).
      kv_thrash_window_us: ``metrics.kv_thrash_window_us`` (the thrashing anomaly).
      gpus: per-lane GPU types (the ``hardware`` knob): the GPUs whose latency the program
        holds, each lane reading the rows of its own (``PolicyParams.gpu``, rows indexed by
        ``blisjax.config.hardware.hardware_code``: the α delays, the blackbox step tables or
        the roofline's FLOP rates and bandwidth, the output-token time). (): every lane runs
        the base configuration's GPU and nothing per lane is compiled in (``for_hardware``
        sets them from a population whose lanes run others).
      instance_rows, instance_kv_blocks: P/D pools with their own TP or GPU
        (``cluster.pd.prefill`` / ``decode``): each instance's latency row (0 the
        configuration's, 1 the prefill pool's, 2 the decode pool's; the rows of
        ``WorkloadConsts`` as with ``gpus``) and, where the pools' KV caches differ in size,
        each instance's KV blocks (``Shapes.kv_blocks`` is then the largest). (): one
        configuration for every instance, nothing per instance compiled in.
      instance_max_model_len: ... and where the pools' max-model-len differ, each
        instance's (0: none; ``max_model_len_of``); (): ``max_model_len`` for every instance.
      row_roofline: ... and where the pools' latency models differ (blackbox and roofline),
        whether each latency row runs the roofline model (``latency_model`` is then
        "roofline": both step times are computed, each instance taking its row's; no decode
        stretches). (): every row runs ``latency_model``.
      gpus_per_instance, node_pool, pool_first_node, pool_initial_nodes, initial_instances,
        initial_name_rank: with instance lifecycles, the TP degree, the node pools' layout
        (nodes pool-major: ``node_pool`` per node, ``pool_first_node`` and
        ``pool_initial_nodes`` per pool), the initial instances and the text order of their
        names (BLIS's drain order under --blis-quirks).
    """

    block_size: int
    token_budget: int
    long_prefill_threshold: int
    max_model_len: int
    admission_latency_us: int
    routing_latency_us: int
    refresh_interval_us: int
    prefix_caching: bool
    post_decode_us: int
    latency_model: str = "blackbox"
    cache_signal_delay_us: int = 0
    blis_quirks: bool = False
    kv_thrash_window_us: int = 0
    gpus: tuple[str, ...] = ()
    instance_rows: tuple[int, ...] = ()
    instance_kv_blocks: tuple[int, ...] = ()
    instance_max_model_len: tuple[int, ...] = ()
    row_roofline: tuple[bool, ...] = ()
    gpus_per_instance: int = 1
    node_pool: tuple = (0,)
    pool_first_node: tuple = (0,)
    pool_initial_nodes: tuple = (0,)
    initial_instances: int = 0
    initial_name_rank: tuple = ()


@dataclass(frozen=True)
class Features:
    """What the program compiles in. A feature no lane uses is compiled out; one that some
    lane uses runs for every lane of the program, inert where the lane's knobs leave it
    unused (``build_static`` from the configuration, ``static_lanes.for_lanes`` from a
    population).

      pd: P/D pools (``engine.pd``, ``cluster.pd``). A disaggregated request's prefill
        sub-request is request row N + 1 + r (``EngineStatic.request_rows``); its decode
        sub-request keeps row r.
      lifecycle: instance lifecycles (``engine.lifecycle``; autoscaling, node pools, loading,
        warm-up): the instance count is then the slot count (``max_replicas``).
      sessions: closed-loop sessions (``engine.sessions``): the workload has follow-up rounds.
      gateway: the gateway queue (``engine.gateway``; BLIS's flow control): some lane has it.
      cache_scorers: the precise-prefix-cache and no-hit-lru scorers' cache query (every
        instance's cached prefix of the request at routing): some lane lists one of them.
      program_sites: policy programs (``engine.program``): the sites ("routing",
        "admission", "priority") whose interpreter is compiled in, some lane's policy there
        being ``program``. A routing program also compiles the cache query in (its
        ``cached_blocks`` and cache scorers).
      sized_lanes: lanes of fewer instances than the program has
        (``PolicyParams.active_instances``, the ``cluster.num_instances`` knob): the router
        decides among each lane's own first instances. Not with lifecycles or P/D pools,
        which choose their instances themselves.
      session_prefix_index: with ``sessions``, the router's prefix index (prefix-affinity)
        also holds the blocks a session shares (``RouterState.lru_spos``): some lane lists
        the prefix-affinity scorer.
      pd_own_index: P/D pools with shared instances whose pools both route with the lane's
        router and its prefix index: a disaggregated request's decode routing indexes its
        own prompt blocks, which its prefill routing can then match on a shared instance
        (``PDState.own_clock``, ``policies.OwnEntries``).
      open_sessions: with ``sessions``, a follow-up budget or sessions whose rows are a
        capacity (concurrency users, ``Workload.session_unbounded``): follow-up creation
        counts against the budget and flags a user out of rows
        (``sessions.create_follow_ups``).
      variant_speed: instance variants of their own speed (node pools of a GPU the hardware
        table knows, ``rules.speed_gpu``): each instance reads the ``Settings.gpus`` rows of
        its variant's GPU (``LifecycleState.gpu``, ``lifecycle.instance_consts``) instead of
        its lane's.
      lane_settings: the cluster's settings that are per-lane knobs (``params.LaneSettings``:
        max running requests, token budget, long-prefill threshold, admission and routing
        latency, snapshot refresh interval, GPU KV blocks) are each lane's own
        (``static.setting``; the KV blocks in ``KVState.capacity``): some lane's differ from
        the program's (``static_lanes.for_lanes``), whose batch slots, token budget and KV
        blocks then bound the lanes' (the arrays and step tables hold that many).
      latency: a latency model object (hashable) evaluated on the host once per step through
        a callback (``blisjax.engine.hostlatency``): a roofline model whose configuration the
        program cannot evaluate exactly (``roofline.fits_the_program``: contexts of 2^25
        tokens or more with an unusual model), or any roofline or physics model set here by
        hand (for comparisons); None: the model runs in the program.
    """

    pd: bool = False
    lifecycle: bool = False
    sessions: bool = False
    gateway: bool = False
    cache_scorers: bool = False
    program_sites: tuple[str, ...] = ()
    sized_lanes: bool = False
    session_prefix_index: bool = False
    pd_own_index: bool = False
    open_sessions: bool = False
    variant_speed: bool = False
    lane_settings: bool = False
    latency: object = None


@dataclass(frozen=True)
class Tuning:
    """How the program computes, never what: results are identical for any tuning.

      running_width: vector width of the narrowest step program; wider ones grow from it up
        to the batch slots (``instance.step_widths``). Not a capacity: a step runs the
        narrowest program that holds every lane's running batch.
      narrow_programs: compile the narrower step and release programs at all
        (``running_width`` and up; ``kvcache.release_widths``). Off, one program of each at
        full width: a program a quarter the size, faster to compile and to load from the
        program cache, whose steps cost more while batches are small. ``simulate`` (one lane)
        turns it off.
      decode_stretches: advance runs of decode-only steps as one (``engine.stretch``) where
        the step times are computed in the program (blackbox, roofline). Off, every step is
        its own lockstep iteration. ``build_static`` decides it from the workload's output
        lengths unless told (``stretches_pay_off``).
    """

    running_width: int = 64
    narrow_programs: bool = True
    decode_stretches: bool = True


GROUPS = {"shapes": Shapes, "settings": Settings, "features": Features, "tuning": Tuning}
#: The group of each of ``EngineStatic``'s fields (``EngineStatic.of``, ``replace``).
FIELD_GROUP = {f.name: group for group, cls in GROUPS.items()
               for f in dataclasses.fields(cls)}


def by_group(fields: dict) -> dict[str, dict]:
    """``fields`` (by name) split by the group that holds each; TypeError for a name no
    group has."""
    parts: dict[str, dict] = {}
    for name, value in fields.items():
        if name not in FIELD_GROUP:
            raise TypeError(f"EngineStatic has no field {name!r}")
        parts.setdefault(FIELD_GROUP[name], {})[name] = value
    return parts
