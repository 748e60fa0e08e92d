"""Instance lifecycles of one lane (docs/semantics.md Decision 16).

Counterpart: ``blisjax.reference.lifecycle`` (slots, node pools, delays, and ``Lifecycle``:
``_place`` as ``place_instance``, ``start_loading``, ``ready`` as ``_ready``,
``_terminate`` as ``terminate``, ``released`` and ``after_instance_event``; its ``tick`` is
``engine.autoscaler``'s; its ``actuate`` and ``_drain`` are ``engine.cluster_events``'
``actuation`` and ``_drain``, which move requests between instances). Read them for the
rules; this module does the same with arrays.

Every instance slot has a state (``config.codes.InstanceState``); the program's instance count
is the slot count (the largest lane's ``max_replicas``). The lane's pending lifecycle events
are a time per slot (its node provisioned, priority −2, while Scheduling; its model loaded,
priority −1, while Loading), the next tick (priority 8) and a few actuation slots
(priority 9, ``EngineStatic.shapes.actuation_slots``). Random delays are drawn on the host in
stream order (``LifecycleParams.*_delay_us``): the k-th draw of a stream is the k-th
entry. Compiled out of programs whose lanes have no lifecycle (``EngineStatic.features.lifecycle``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.config.autoscale import max_replicas
from blisjax.config.codes import AutoscalerPolicy, DrainPolicy, InstanceState
from blisjax.config.hardware import hardware_code
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import add, upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.state import NIL, SimState
from blisjax.gorand import blis_subsystem_rand
from blisjax.limits import INT64_MAX
from blisjax.rules import (
    NEVER_US,
    US_PER_HOUR,
    cost_order,
    delay_us,
    instance_variants,
    speed_gpu,
    uses_lifecycle,
)

F64 = jnp.float64
I32, I64 = jnp.int32, jnp.int64
UNUSED, SCHEDULING, LOADING, WARMING_UP, ACTIVE, DRAINING, TERMINATED = (
    int(x) for x in InstanceState)
NO_TIMER = jnp.iinfo(jnp.int64).min  # a stabilization window not started
#: Delay draws stored per random stream (a lane needing more overflows ``lifecycle_draws``).
DELAY_DRAWS = 64


@pytree_dataclass
class LifecycleState:
    """One lane's lifecycle and autoscaler state ([1] placeholders without lifecycles).

    Per slot [I]: ``state`` (int8), ``placed_us``, ``node`` (-1 without pools),
    ``cost_per_hour``, ``variant``, ``gpu`` (the ``hardware_code`` of the GPU whose latency
    its instance runs: its variant's, ``EngineStatic.features.variant_speed``), ``warm_left``
    (completions left to warm up),
    ``replica_us`` and ``cost`` (held time and its cost, settled at termination),
    ``placements``, ``dropped_at_drain``, ``ready_us``/``ready_seq`` (its pending provisioned
    or loaded event; INT64_MAX: none), ``snap_used`` (KV blocks in use, the router snapshot's).
    Per node [NODES]: ``node_free`` GPUs, ``node_ready_us`` (-1: not provisioned).
    Events: ``tick_us``; actuation slots [A] ``act_us`` (INT64_MAX: free), ``act_delta``,
    ``act_variant``, ``act_seq``, ``act_group`` (its scaling group); ``seq`` orders same-time
    pushes.
    Autoscaler, per scaling group [G] (``EngineStatic.scaling_groups``): cooldown clocks,
    stabilization timers, the last actuation's direction and time.
    Counters, draw cursors per stream, the state-change timeline [TL] and overflow counts.
    """

    state: jax.Array
    placed_us: jax.Array
    node: jax.Array
    cost_per_hour: jax.Array
    variant: jax.Array
    gpu: jax.Array
    warm_left: jax.Array
    replica_us: jax.Array
    cost: jax.Array
    placements: jax.Array
    dropped_at_drain: jax.Array
    ready_us: jax.Array
    ready_seq: jax.Array
    snap_used: jax.Array
    node_free: jax.Array
    node_ready_us: jax.Array
    pool_nodes: jax.Array
    tick_us: jax.Array
    act_us: jax.Array
    act_delta: jax.Array
    act_variant: jax.Array
    act_seq: jax.Array
    act_group: jax.Array
    seq: jax.Array
    last_up_us: jax.Array
    last_scale_us: jax.Array
    window_up_us: jax.Array
    window_down_us: jax.Array
    last_direction: jax.Array
    last_actuation_us: jax.Array
    unrouted: jax.Array  # admitted requests not yet routed (the tick's stop rule)
    warm_routed: jax.Array  # bool [N + 1] (--blis-quirks): among its instance's first routed
    warm_count: jax.Array  # int32 [I] (--blis-quirks): requests recorded per instance
    warm_factor: jax.Array  # float64: ``warm_up_factor`` (read after the run)
    clock_before: jax.Array  # int64 [I]: each instance's clock before its latest routings
    arrive_us: jax.Array  # int64 [I, E] (--blis-quirks): an α-window entry's arrival event
    #                       not yet run (its routing time; INT64_MAX: none) — BLIS's
    #                       ArrivalEvent, after which a draining instance may terminate
    lane_on: jax.Array  # bool: the lane itself models lifecycles (read after the run)
    lane_slots: jax.Array  # int32: the lane's own instance slots (read after the run)
    last_event_us: jax.Array  # the lane's last executed event (where held instances stop costing)
    scale_ups: jax.Array
    scale_downs: jax.Array
    added: jax.Array
    drained: jax.Array
    oscillations: jax.Array
    refused_no_room: jax.Array
    redirected: jax.Array
    rejected_routing: jax.Array
    load_draw: jax.Array
    act_draw: jax.Array
    prov_draw: jax.Array
    tl_us: jax.Array
    tl_slot: jax.Array
    tl_state: jax.Array
    tl_count: jax.Array
    ovf_actuations: jax.Array
    ovf_slots: jax.Array
    ovf_draws: jax.Array


# ---- knobs (PolicyParams fields) ----------------------------------------------------------------


def lifecycle_params(cfg) -> tuple[dict, dict]:
    """The autoscaler's and the lifecycle's knobs of ``cfg`` (the fields of
    ``params.AutoscalerParams`` and ``params.LifecycleParams``, the latter with the node
    pools'). Random delays are drawn here, in their streams' order."""
    a, life, pools = cfg.policy.autoscaler, cfg.cluster.lifecycle, cfg.cluster.node_pools
    tp = cfg.engine.tensor_parallel_size
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    i64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731

    def draws(spec, stream: str) -> np.ndarray:
        if not spec.random:
            return np.full(DELAY_DRAWS, delay_us(spec, None), np.int64)
        rng = blis_subsystem_rand(cfg.seed, stream)
        return np.asarray([delay_us(spec, rng) for _ in range(DELAY_DRAWS)], np.int64)

    variants = instance_variants(pools, cfg.hardware, life.cost_per_hour, tp)
    order = cost_order(variants)
    pool_list = pools or ()
    prov_rng = blis_subsystem_rand(cfg.seed, "node-provisioning")
    prov = np.zeros((max(len(pool_list), 1), DELAY_DRAWS), np.int64)
    if any(p.provisioning_delay.random for p in pool_list):  # one stream, any pool's spec
        normals = [prov_rng.norm_float64() for _ in range(DELAY_DRAWS)]
    for k, pool in enumerate(pool_list):
        spec = pool.provisioning_delay
        prov[k] = ([int(max(0.0, x * spec.stddev_s + spec.mean_s) * 1e6) for x in normals]
                   if spec.random else delay_us(spec, None))
    autoscaler = dict(
        policy=i32(a.code),
        interval_us=i64(a.interval_us),
        min=i32(a.min_replicas),
        max=i32(max_replicas(a, cfg.cluster.num_instances, pools, tp, cfg.cluster.pd)),
        up_step=i32(a.max_scale_up_step),
        down_step=i32(a.max_scale_down_step),
        cooldown_us=i64(a.cooldown_us),
        drain=i32(DrainPolicy.of(a.drain_policy)),
        up_util=f64(a.scale_up_utilization),
        down_util=f64(a.scale_down_utilization),
        target_util=f64(a.target_utilization),
        tolerance=f64(a.utilization_tolerance),
        target_qd=f64(a.target_queue_depth),
        kv_threshold=f64(a.kv_cache_threshold),
        sat_up=f64(a.saturation_up_threshold),
        sat_down=f64(a.saturation_down_boundary),
        avg_input=f64(a.avg_input_tokens),
        up_window_us=i64(a.scale_up_window_us),
        down_window_us=i64(a.scale_down_window_us),
        act_delay_us=draws(a.actuation_delay, "autoscaler"),
        act_random=np.asarray(a.actuation_delay.random),
    )
    lifecycle = dict(
        on=np.asarray(uses_lifecycle(cfg)),
        load_delay_us=draws(life.loading_delay, "instance-loading"),
        load_random=np.asarray(life.loading_delay.random),
        prov_delay_us=prov,
        prov_random=np.asarray([p.provisioning_delay.random for p in pool_list] or [False]),
        warm_start=np.asarray(life.warm_start_initial_instances),
        warm_requests=i32(life.warm_up_requests),
        warm_factor=f64(life.warm_up_factor),
        cost_per_hour=f64(life.cost_per_hour),
        pool_gpus=i32([p.gpus_per_node for p in pool_list] or [0]),
        pool_max_nodes=i32([p.max_nodes for p in pool_list] or [0]),
        pool_cost=f64([p.cost_per_hour for p in pool_list] or [0.0]),
        pool_variant=i32([next(v for v, x in enumerate(variants) if x.gpu_type == p.gpu_type)
                          for p in pool_list] or [0]),
        variant_cost=f64([v.cost_per_hour for v in variants]),
        variant_gpu=i32([hardware_code(speed_gpu(v.gpu_type, cfg.hardware,
                                                 cfg.compat.blis_quirks)) for v in variants]),
        variant_order=i32(order),
    )
    return autoscaler, lifecycle


# ---- initial state ------------------------------------------------------------------------------


def init_lifecycle(st, p) -> LifecycleState:
    """The lane's lifecycle state at time 0: the initial instances placed in the first slots
    (``Lifecycle.__init__``); placeholders without lifecycles."""
    on = st.features.lifecycle
    i = st.shapes.num_instances if on else 1
    nodes = st.shapes.num_nodes if on else 1
    a = st.shapes.actuation_slots if on else 1
    tl = st.shapes.timeline_slots if on else 1
    g = st.scaling_groups
    z = lambda n, dt=I64: jnp.zeros(n, dt)  # noqa: E731
    zero = lambda dt=I32: jnp.asarray(0, dt)  # noqa: E731
    node_ready = jnp.full(nodes, -1, I64)
    node_free = z(nodes, I32)
    pool_nodes = z(max(st.shapes.num_pools, 1), I32)
    if on and st.shapes.num_pools:  # the initial nodes are ready at 0
        first = st.settings.pool_first_node
        for k in range(st.shapes.num_pools):
            n0 = st.settings.pool_initial_nodes[k]
            node_ready = node_ready.at[first[k]:first[k] + n0].set(0)
            node_free = node_free.at[first[k]:first[k] + n0].set(p.lifecycle.pool_gpus[k])
            pool_nodes = pool_nodes.at[k].set(n0)
    life = LifecycleState(
        state=jnp.zeros(i, jnp.int8), placed_us=jnp.full(i, -1, I64), node=jnp.full(i, NIL, I32),
        cost_per_hour=z(i, F64), variant=z(i, I32), gpu=z(i, I32), warm_left=z(i, I32),
        replica_us=z(i),
        cost=z(i, F64), placements=z(i, I32), dropped_at_drain=z(i),
        ready_us=jnp.full(i, INT64_MAX, I64), ready_seq=z(i), snap_used=z(i, I32),
        node_free=node_free, node_ready_us=node_ready, pool_nodes=pool_nodes,
        tick_us=(jnp.where(p.autoscaler.policy != AutoscalerPolicy.NONE, 0, INT64_MAX).astype(I64)
                 if on else jnp.asarray(INT64_MAX, I64)),
        act_us=jnp.full(a, INT64_MAX, I64), act_delta=z(a, I32), act_variant=z(a, I32),
        act_seq=z(a), act_group=z(a, I32), seq=zero(I64),
        last_up_us=jnp.full(g, NEVER_US, I64), last_scale_us=jnp.full(g, NEVER_US, I64),
        window_up_us=jnp.full(g, NO_TIMER, I64), window_down_us=jnp.full(g, NO_TIMER, I64),
        last_direction=z(g, I32), last_actuation_us=z(g),
        unrouted=zero(), last_event_us=zero(I64),
        warm_routed=jnp.zeros(
            st.shapes.num_requests + 1 if on and st.settings.blis_quirks else 1, bool),
        warm_count=z(i, I32),
        warm_factor=jnp.asarray(p.lifecycle.warm_factor if on else 1.0, F64),
        clock_before=z(i),
        arrive_us=jnp.full(
            (i, st.shapes.pending_slots) if on and st.settings.blis_quirks else (1, 1),
            INT64_MAX, I64),
        lane_on=jnp.asarray(p.lifecycle.on if on else False),
        lane_slots=jnp.asarray(p.autoscaler.max if on else st.shapes.num_instances, I32),
        scale_ups=zero(), scale_downs=zero(), added=zero(), drained=zero(),
        oscillations=zero(), refused_no_room=zero(), redirected=zero(),
        rejected_routing=zero(), load_draw=zero(), act_draw=zero(), prov_draw=zero(),
        tl_us=z(tl), tl_slot=z(tl, I32), tl_state=jnp.zeros(tl, jnp.int8), tl_count=zero(),
        ovf_actuations=zero(), ovf_slots=zero(), ovf_draws=zero())
    if not on:
        return life
    go = jnp.asarray(True)
    for k in range(st.settings.initial_instances):  # in slot order, at time 0
        life, _ = place_instance(life, st, p, k, -1, 0, True, go)
    return life


# ---- small pieces -------------------------------------------------------------------------------


def set_state(life: LifecycleState, st, k, state, now, go) -> LifecycleState:
    """Slot k enters ``state`` at ``now`` where ``go``; the timeline records it."""
    n = life.tl_count
    at = jnp.where(go & (n < st.shapes.timeline_slots), n, st.shapes.timeline_slots)
    return life.replace(
        state=upd(life.state, k, jnp.asarray(state, jnp.int8), go),
        tl_us=life.tl_us.at[at].set(now, mode="drop"),
        tl_slot=life.tl_slot.at[at].set(k, mode="drop"),
        tl_state=life.tl_state.at[at].set(jnp.asarray(state, jnp.int8), mode="drop"),
        tl_count=n + go.astype(I32))


def draw(table, cursor, random, go):
    """The stream's next delay (µs) and its cursor after the draw (a fixed delay draws
    nothing); ``overflow``: a random stream ran past its stored draws."""
    k = jnp.minimum(cursor, DELAY_DRAWS - 1)
    take = go & random
    return table[k], cursor + take.astype(I32), take & (cursor >= DELAY_DRAWS)


def routable(life: LifecycleState):
    """[I] the slots the router may pick (WarmingUp or Active)."""
    return (life.state == WARMING_UP) | (life.state == ACTIVE)


def live(life: LifecycleState):
    """[I] the slots whose instance counts toward the replicas a scale-down leaves
    (Scheduling, Loading, WarmingUp or Active)."""
    return (life.state >= SCHEDULING) & (life.state <= ACTIVE)


def holding(life: LifecycleState):
    """[I] the slots holding an instance (live or Draining)."""
    return (life.state >= SCHEDULING) & (life.state <= DRAINING)


# ---- what the cluster and instances tell the lifecycle --------------------------------------------


def placement_counted(life: LifecycleState, no_slot, no_room) -> LifecycleState:
    """A scale-up's placement found no free instance slot (``no_slot``: the slots' capacity
    overflows) or no node with room (``no_room``: refused, as the reference's)."""
    return life.replace(ovf_slots=life.ovf_slots + no_slot.astype(jnp.int32),
                        refused_no_room=life.refused_no_room + no_room.astype(jnp.int32))


def dropped_at_drain(life: LifecycleState, v, count, go) -> LifecycleState:
    """Instance v dropped ``count`` requests as it drained (policy ``immediate``)."""
    return life.replace(dropped_at_drain=add(life.dropped_at_drain, v, count, go))


def snapshot_used(life: LifecycleState, used, due) -> LifecycleState:
    """The router snapshot's refresh where ``due``: the blocks in use [I] the autoscaler
    reads."""
    return life.replace(snap_used=jnp.where(due, used.astype(jnp.int32), life.snap_used))


def admitted(life: LifecycleState, count) -> LifecycleState:
    """``count`` requests admitted, not yet routed."""
    return life.replace(unrouted=life.unrouted + count.astype(jnp.int32))


def redirected(life: LifecycleState, count) -> LifecycleState:
    """``count`` requests taken from a draining instance to be routed again."""
    return life.replace(unrouted=life.unrouted + count, redirected=life.redirected + count)


def took_actuation(life: LifecycleState, a, go) -> LifecycleState:
    """Actuation slot ``a`` is carried out (and free again) where ``go``."""
    return life.replace(act_us=upd(life.act_us, a, INT64_MAX, go))


def saw_event(life: LifecycleState, t_us, live) -> LifecycleState:
    """An event of the reference's at ``t_us`` where ``live``: held instances cost until the
    run's last one."""
    return life.replace(last_event_us=jnp.where(live, t_us, life.last_event_us))


def arrival_due(life: LifecycleState, i, e, now, ok) -> LifecycleState:
    """With --blis-quirks: the arrival event of instance i's α-window entry e at ``now``."""
    return life.replace(arrive_us=upd(life.arrive_us, (i, e), now, ok))


def arrival_done(life: LifecycleState, i, e, go) -> LifecycleState:
    """With --blis-quirks: entry e's arrival event has run (or was cancelled)."""
    return life.replace(arrive_us=upd(life.arrive_us, (i, e), INT64_MAX, go))


def arrivals_cancelled(life: LifecycleState, i, go) -> LifecycleState:
    """With --blis-quirks: every arrival event pending on instance i is removed."""
    return life.replace(arrive_us=upd(life.arrive_us, i, INT64_MAX, go))


def clock_before_arrivals(life: LifecycleState, i, clock, first) -> LifecycleState:
    """Instance i's clock before this time's arrivals (where ``first``: the first arrival
    at this time), so that a drain at the same time can take them back."""
    return life.replace(clock_before=upd(life.clock_before, i, clock, first))


# ---- placement and coming up --------------------------------------------------------------------


def _place_on_node(life: LifecycleState, st, p, variant, now, go):
    """A node for one instance, its GPUs taken (``reference.lifecycle.Placement.place``):
    first fit over provisioned nodes in (pool, index) order, else (not with --blis-quirks)
    a new node of the first pool with room to grow. Returns (life, node, ok)."""
    tp = st.settings.gpus_per_instance
    pool_of = jnp.asarray(st.settings.node_pool, I32)
    wanted = (variant < 0) | (p.lifecycle.pool_variant == variant)  # [P]
    fits = (life.node_ready_us >= 0) & wanted[pool_of] & (life.node_free >= tp)
    node = jnp.argmax(fits).astype(I32)
    found = jnp.any(fits)
    if not st.settings.blis_quirks:
        grow = wanted & (life.pool_nodes < p.lifecycle.pool_max_nodes) \
            & (p.lifecycle.pool_gpus >= tp)
        pool = jnp.argmax(grow).astype(I32)
        new = go & ~found & jnp.any(grow)
        fresh = jnp.asarray(st.settings.pool_first_node, I32)[pool] + life.pool_nodes[pool]
        delay, cursor, ovf = draw(p.lifecycle.prov_delay_us[pool], life.prov_draw,
                                   p.lifecycle.prov_random[pool], new)
        life = life.replace(
            node_ready_us=upd(life.node_ready_us, fresh, now + delay, new),
            node_free=upd(life.node_free, fresh, p.lifecycle.pool_gpus[pool], new),
            pool_nodes=add(life.pool_nodes, pool, 1, new), prov_draw=cursor,
            ovf_draws=life.ovf_draws + ovf.astype(I32))
        node = jnp.where(found, node, fresh)
        found = found | new
    ok = go & found
    return life.replace(node_free=add(life.node_free, node, -tp, ok)), node, ok


def place_instance(life: LifecycleState, st, p, k, variant, now, initial: bool, go):
    """Place an instance in slot k (``Lifecycle._place``): ready at once (a warm
    initial instance), Scheduling until its node is ready, or Loading. Returns (life, ok).
    The caller resets the slot's instance state when it is reused (``reset_instance``)."""
    if st.shapes.num_pools:
        life, node, ok = _place_on_node(life, st, p, variant, now, go)
        pool = jnp.asarray(st.settings.node_pool, I32)[node]
        cost = p.lifecycle.pool_cost[pool]
        var = p.lifecycle.pool_variant[pool]
        node_ready = life.node_ready_us[node]
    else:  # BLIS (--blis-quirks) places no scale-up without node pools
        ok = go if initial or not st.settings.blis_quirks else jnp.asarray(False)
        node, cost, var, node_ready = NIL, p.lifecycle.cost_per_hour, 0, now
    life = life.replace(placed_us=upd(life.placed_us, k, now, ok),
                        node=upd(life.node, k, node, ok),
                        placements=add(life.placements, k, 1, ok),
                        cost_per_hour=upd(life.cost_per_hour, k, cost, ok),
                        variant=upd(life.variant, k, var, ok),
                        gpu=upd(life.gpu, k, p.lifecycle.variant_gpu[var], ok))
    # BLIS starts initial instances ready without node pools, whatever its lifecycle says
    warm_start = p.lifecycle.warm_start | (st.settings.blis_quirks and not st.shapes.num_pools)
    warm = ok & warm_start if initial else jnp.asarray(False)
    waits = ok & ~warm & (node_ready > now)
    life = _ready(life, st, p, k, now, warm)
    life = set_state(life, st, k, SCHEDULING, now, waits)
    life = _push_ready(life, k, node_ready, waits)
    return start_loading(life, st, p, k, now, ok & ~warm & ~waits), ok


def _push_ready(life: LifecycleState, k, t, go) -> LifecycleState:
    return life.replace(ready_us=upd(life.ready_us, k, t, go),
                        ready_seq=upd(life.ready_seq, k, life.seq, go),
                        seq=life.seq + go.astype(I64))


def start_loading(life: LifecycleState, st, p, k, now, go) -> LifecycleState:
    """Slot k starts loading its model (``Lifecycle.start_loading``)."""
    life = set_state(life, st, k, LOADING, now, go)
    delay, cursor, ovf = draw(p.lifecycle.load_delay_us, life.load_draw,
                               p.lifecycle.load_random, go)
    life = life.replace(load_draw=cursor, ovf_draws=life.ovf_draws + ovf.astype(I32))
    life = _ready(life, st, p, k, now, go & (delay == 0))
    return _push_ready(life, k, now + delay, go & (delay > 0))


def _ready(life: LifecycleState, st, p, k, now, go) -> LifecycleState:
    """Loaded: routable, warming up first when the lifecycle has a warm-up
    (``Lifecycle.ready``)."""
    warm = go & (p.lifecycle.warm_requests > 0)
    life = life.replace(warm_left=upd(life.warm_left, k, p.lifecycle.warm_requests, warm),
                        ready_us=upd(life.ready_us, k, INT64_MAX, go))
    return set_state(life, st, k, jnp.where(warm, WARMING_UP, ACTIVE), now, go)


def routed(life: LifecycleState, st, p, r, target, went, rejected) -> LifecycleState:
    """A routing decision's bookkeeping (``ClusterSimulator._route``): one request fewer
    awaits routing, a rejection is counted; with --blis-quirks the first ``warm_up_requests``
    routed to each instance are recorded (BLIS multiplies their TTFT after the run)."""
    life = life.replace(unrouted=life.unrouted - (went | rejected).astype(I32),
                        rejected_routing=life.rejected_routing + rejected.astype(I32))
    if not st.settings.blis_quirks:
        return life
    record = went & (life.warm_count[target] < p.lifecycle.warm_requests)
    return life.replace(
        warm_routed=life.warm_routed.at[jnp.where(record, r, st.shapes.num_requests)].set(True),
        warm_count=add(life.warm_count, target, 1, record))


def rejected(life: LifecycleState, mask) -> LifecycleState:
    """A request routed earlier was rejected at a later routing (P/D: no prefill instance
    routable, where ``mask``): counted."""
    return life.replace(rejected_routing=life.rejected_routing + mask.astype(I32))


def next_ready(life: LifecycleState):
    """(time, slot) of the lane's next provisioned or loaded event: by time, then priority
    (a node provisioned, −2, before a model loaded, −1), then push order."""
    t = jnp.min(life.ready_us)
    due = life.ready_us == t
    first_kind = jnp.where(jnp.any(due & (life.state == SCHEDULING)), SCHEDULING, LOADING)
    cand = due & (life.state == first_kind)
    k = jnp.argmin(jnp.where(cand, life.ready_seq, INT64_MAX)).astype(I32)
    return t, k


def ready_event(life: LifecycleState, st, p, now, go) -> LifecycleState:
    """The lane's provisioned or loaded event: a Scheduling slot starts loading, a Loading
    one is ready."""
    _, k = next_ready(life)
    scheduling = life.state[k] == SCHEDULING
    life = life.replace(ready_us=upd(life.ready_us, k, INT64_MAX, go))
    life = start_loading(life, st, p, k, now, go & scheduling)
    return _ready(life, st, p, k, now, go & ~scheduling)


def instance_consts(s: SimState, st, c, i):
    """The constants instance i reads: with variants of their own speed
    (``EngineStatic.features.variant_speed``) the latency rows of its GPU (``LifecycleState.gpu``,
    ``consts.queue_delay`` & co. read ``c.gpu``); ``c`` itself otherwise."""
    return c.replace(gpu=s.life.gpu[i]) if st.features.variant_speed else c


def warm_factor(s: SimState, st, p, i, completions=0):
    """The factor instance i's steps take longer by: ``warm_up_factor`` while it warms up
    (still warming after ``completions`` more), else 1 (``Instance.step_factor``); BLIS's
    warm-up (--blis-quirks) changes no step. None where the program has no lifecycles."""
    if not st.features.lifecycle or st.settings.blis_quirks:
        return None
    life = s.life
    left = life.warm_left[i] - jnp.minimum(completions, life.warm_left[i])
    return jnp.where((life.state[i] == WARMING_UP) & (left > 0), p.lifecycle.warm_factor, 1.0)


def slowed(d, factor):
    """A step of ``d`` µs at ``factor`` (None: unchanged): max(1, trunc(d · factor))."""
    if factor is None:
        return d
    return jnp.where(factor != 1.0, jnp.maximum(1, (d.astype(F64) * factor).astype(I64)), d)


def next_actuation(life: LifecycleState):
    """(time, slot) of the lane's next actuation: by time, then push order."""
    t = jnp.min(life.act_us)
    a = jnp.argmin(jnp.where(life.act_us == t, life.act_seq, INT64_MAX)).astype(I32)
    return t, a


# ---- actuation ----------------------------------------------------------------------------------


def free_slot(life: LifecycleState, st, p, *, member=None):
    """(slot, found): the lowest slot (of the scaling group's slots ``member``; None: any) a
    new instance may take — not holding one (with --blis-quirks never used), within the
    lane's ``max_replicas``."""
    free = life.state == UNUSED
    if not st.settings.blis_quirks:
        free = free | (life.state == TERMINATED)
    free = free & (jnp.arange(st.shapes.num_instances) < p.autoscaler.max)
    if member is not None:
        free = free & member
    return jnp.argmax(free).astype(I32), jnp.any(free)


def drain_victim(life: LifecycleState, st, variant, *, member=None):
    """(slot, found): the Active instance (of ``variant``, -1: any; of the scaling group's
    slots ``member``, None: any) a scale-down drains first (``Lifecycle._drain_order``): the
    earliest placed, then the lowest slot; with --blis-quirks BLIS's smallest ID string
    (autoscaled instances in creation order, then the initial ones by "instance_<i>" as
    text)."""
    cand = (life.state == ACTIVE) & ((variant < 0) | (life.variant == variant))
    if member is not None:
        cand = cand & member
    slot = jnp.arange(st.shapes.num_instances)
    if st.settings.blis_quirks:
        initial = jnp.asarray(st.settings.initial_name_rank + (0,) * (st.shapes.num_instances
                                                             - st.settings.initial_instances), I64)
        key = jnp.where(slot >= st.settings.initial_instances, slot,
                        st.shapes.num_instances + initial)
        return jnp.argmin(jnp.where(cand, key, INT64_MAX)).astype(I32), jnp.any(cand)
    first = jnp.min(jnp.where(cand, life.placed_us, INT64_MAX))
    return jnp.argmax(cand & (life.placed_us == first)).astype(I32), jnp.any(cand)


def terminate(life: LifecycleState, st, k, now, go) -> LifecycleState:
    """Slot k's instance terminates (``Lifecycle._terminate``): its held time is
    settled and its GPUs go back to its node."""
    held = now - life.placed_us[k]
    cost = ieee_divide(held.astype(F64) * life.cost_per_hour[k], US_PER_HOUR)
    node = life.node[k]
    life = set_state(life, st, k, TERMINATED, now, go)
    return life.replace(
        replica_us=add(life.replica_us, k, held, go),
        cost=add(life.cost, k, cost, go),
        node_free=add(life.node_free, jnp.maximum(node, 0), st.settings.gpus_per_instance,
                      go & (node >= 0)))


def actuated(life: LifecycleState, p, delta, done, now, go, *, g=0) -> LifecycleState:
    """An actuation's counts, and an oscillation when it scales against its scaling group
    g's previous one within the cooldown (``Lifecycle.actuate``)."""
    up, down = go & (delta > 0), go & (delta < 0)
    moved = (up | down) & (done > 0)
    direction = jnp.where(up, 1, -1)
    oscillates = moved & (life.last_direction[g] == -direction) & (
        now - life.last_actuation_us[g] < p.autoscaler.cooldown_us)
    return life.replace(
        added=life.added + jnp.where(up, done, 0), drained=life.drained + jnp.where(down, done, 0),
        scale_ups=life.scale_ups + (up & moved).astype(I32),
        scale_downs=life.scale_downs + (down & moved).astype(I32),
        oscillations=life.oscillations + oscillates.astype(I32),
        last_direction=upd(life.last_direction, g, direction, moved),
        last_actuation_us=upd(life.last_actuation_us, g, now, moved))


def released(s: SimState, st, d, now, go) -> SimState:
    """Where ``go``: a request bound for instance d went elsewhere (P/D: its prefill failed
    or was rejected, its KV reservation failed); a draining instance that now holds nothing
    terminates (``Lifecycle.released``)."""
    if not (st.features.lifecycle and st.features.pd):
        return s
    d = jnp.maximum(d, 0)
    idle = go & (s.life.state[d] == DRAINING) & holds_nothing(s, st, d)
    return s.replace(life=terminate(s.life, st, d, now, idle))


def holds_nothing(s: SimState, st, i):
    """A draining instance i may terminate (``Lifecycle._holds_nothing``): by default nothing
    in flight on it and (P/D) nothing bound for it; with --blis-quirks its queue and batch
    are empty."""
    if st.settings.blis_quirks:
        return (s.queue.length[i] == 0) & (s.batch.n_run[i] == 0)
    empty = s.router.in_flight[i] == 0
    return empty & (s.pd.headed[i] == 0) if st.features.pd else empty


def after_instance_event(s: SimState, st, i, completions, now, go) -> SimState:
    """After instance i's event (``Lifecycle.after_instance_event``): completions end
    a warm-up; a draining instance that holds nothing terminates (by default: nothing in
    flight on it; with --blis-quirks: its queue and batch are empty)."""
    life = s.life
    warming = go & (life.state[i] == WARMING_UP)
    left = life.warm_left[i] - jnp.minimum(jnp.asarray(completions, I32), life.warm_left[i])
    life = life.replace(warm_left=upd(life.warm_left, i, left, warming))
    life = set_state(life, st, i, ACTIVE, now, warming & (left == 0))
    life = terminate(life, st, i, now,
                     go & (life.state[i] == DRAINING) & holds_nothing(s, st, i))
    return s.replace(life=life)
