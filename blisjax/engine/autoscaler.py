"""The autoscaler's tick in the JAX engine: each scaling group's reading, its policy's
decision, the replica bounds, cooldowns and stabilization windows, and the actuation it
schedules (docs/autoscaling.md, The tick; Decision 16).

Counterpart: ``blisjax.reference.autoscaler`` (the policies' decisions) and
``blisjax.reference.lifecycle.Lifecycle``'s ``tick`` and ``_bounded`` (read them for the
rules; this module does the same with arrays). The actuation itself, which moves requests
between instances, is ``engine.cluster_events.actuation``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.config.codes import AutoscalerPolicy, PDRole
from blisjax.engine import kvblocks, lifecycle, sessions
from blisjax.engine.exactfloat import exact_mul, ieee_divide
from blisjax.engine.lifecycle import (
    F64,
    I32,
    I64,
    LOADING,
    NO_TIMER,
    SCHEDULING,
    LifecycleState,
)
from blisjax.engine.lockstep import upd
from blisjax.engine.state import SimState
from blisjax.limits import INT64_MAX


def _sequential_sum(values, mask):
    """Σ values where mask, added in index order (as the reference's loops add)."""
    total = jnp.asarray(0.0, F64)
    for k in range(values.shape[0]):
        total = total + jnp.where(mask[k], values[k], 0.0)
    return total


def _ceil_int(x):
    return jnp.ceil(jnp.clip(x, -1e15, 1e15)).astype(I64)


def _floor_int(x):
    return jnp.floor(jnp.clip(x, -1e15, 1e15)).astype(I64)


def _template_delta(s: SimState, st, c, p, rt, n, live):
    """The seed templates' raw decisions (``reference.autoscaler``): threshold,
    target-utilization, queue-depth; [3] in that order."""
    life = s.life
    util = ieee_divide(life.snap_used.astype(F64), c.kv_blocks_f)
    mean = jnp.where(n > 0, ieee_divide(_sequential_sum(util, rt), jnp.maximum(n, 1).astype(F64)),
                     0.0)
    threshold = jnp.where(mean > p.autoscaler.up_util, 1,
                          jnp.where(mean < p.autoscaler.down_util, -1, 0))
    within = jnp.abs(ieee_divide(mean, p.autoscaler.target_util) - 1.0) <= p.autoscaler.tolerance
    desired = _ceil_int(ieee_divide(live.astype(F64) * mean, p.autoscaler.target_util))
    target = jnp.where((n == 0) | within, 0, desired - live)
    load = jnp.sum(jnp.where(rt, s.router.snap_qd + s.router.snap_bs, 0)).astype(I64)
    queue = jnp.where(n == 0, 0,
                      _ceil_int(ieee_divide(load.astype(F64), p.autoscaler.target_qd)) - live)
    return threshold.astype(I64), target.astype(I64), queue.astype(I64)


def _saturation(s: SimState, st, p, rt, n, *, member=None):
    """blis-saturation's analyzer and unlimited engine (``reference.autoscaler.
    saturation_decision``) over the routable slots ``rt`` of a scaling group (slots
    ``member``; None: every slot): (delta, variant)."""
    life = s.life
    v_count = st.shapes.num_variants
    bs = st.settings.block_size
    # each slot's KV capacity in tokens (P/D pools of their own size: per slot; lanes of
    # their own settings: the lane's, traced)
    if st.features.lane_settings:
        tokens = kvblocks.capacity(s, st).astype(I64) * bs
    else:
        tokens = [(st.settings.instance_kv_blocks[k] if st.settings.instance_kv_blocks
                   else st.shapes.kv_blocks) * bs
                  for k in range(st.shapes.num_instances)]
    count = jnp.zeros(v_count, I64)
    supply = jnp.zeros(v_count, F64)
    demand = jnp.zeros(v_count, F64)
    for k in range(st.shapes.num_instances):  # replica order
        v, m = life.variant[k], rt[k]
        # a replica's supply; products formed exactly (no FMA with the sums)
        k1 = exact_mul(tokens[k].astype(F64) if st.features.lane_settings else float(tokens[k]),
                       p.autoscaler.kv_threshold)
        d = (life.snap_used[k] * bs).astype(F64) + exact_mul(s.router.snap_qd[k].astype(F64),
                                                             p.autoscaler.avg_input)
        count = count.at[v].add(m.astype(I64))
        supply = supply.at[v].set(jnp.where(m, supply[v] + k1, supply[v]))
        demand = demand.at[v].set(jnp.where(m, demand[v] + d, demand[v]))
    order = p.lifecycle.variant_order
    total_supply = total_demand = jnp.asarray(0.0, F64)
    for j in range(v_count):  # cost order
        v = order[j]
        total_supply = total_supply + jnp.where(count[v] > 0, supply[v], 0.0)
        total_demand = total_demand + jnp.where(count[v] > 0, demand[v], 0.0)
    coming = (life.state == SCHEDULING) | (life.state == LOADING)
    if member is not None:
        coming = coming & member
    pending = jnp.sum(jnp.where(coming, jnp.asarray(tokens, I64), 0)).astype(F64)  # exact
    pending_supply = exact_mul(pending, p.autoscaler.kv_threshold)
    required = ieee_divide(total_demand, p.autoscaler.sat_up) - (total_supply + pending_supply)
    present = count[order] > 0
    cheapest = order[jnp.argmax(present)]
    per_cheap = ieee_divide(supply[cheapest], jnp.maximum(count[cheapest], 1).astype(F64))
    up = jnp.where(per_cheap <= 0, 1,
                   jnp.maximum(1, _ceil_int(ieee_divide(required, per_cheap))))
    spare = total_supply - ieee_divide(total_demand, p.autoscaler.sat_down)
    per = ieee_divide(supply, jnp.maximum(count, 1).astype(F64))
    max_per = jnp.max(jnp.where(count > 0, per, -jnp.inf))
    cost = p.lifecycle.variant_cost[order]
    dear_rank = jnp.argmax(present & (cost == jnp.max(jnp.where(present, cost, -jnp.inf))))
    dearest = order[dear_rank]
    down = -jnp.minimum(jnp.maximum(_floor_int(ieee_divide(spare, per[dearest])), 1),
                        count[dearest])
    shrink = (n >= 2) & (spare > 0) & (total_supply - max_per
                                       > ieee_divide(total_demand, p.autoscaler.sat_down))
    delta = jnp.where(n == 0, 0, jnp.where(required > 0, up, jnp.where(shrink, down, 0)))
    variant = jnp.where(required > 0, cheapest, dearest)
    return delta.astype(I64), variant.astype(I32)


def _stabilized(life: LifecycleState, p, delta, now, *, g: int):
    """BLIS's stabilization windows of scaling group g (``Autoscaler._stabilized``): (life,
    passes)."""
    sign = jnp.sign(delta)
    up_timer = jnp.where(sign > 0, life.window_up_us[g], NO_TIMER)
    down_timer = jnp.where(sign < 0, life.window_down_us[g], NO_TIMER)
    timer = jnp.where(sign > 0, up_timer, down_timer)
    window = jnp.where(sign > 0, p.autoscaler.up_window_us, p.autoscaler.down_window_us)
    unset = timer == NO_TIMER
    passes = (sign != 0) & jnp.where(unset, window == 0, now - timer >= window)
    new_timer = jnp.where(unset & (window > 0), now, jnp.where(passes, NO_TIMER, timer))
    return life.replace(
        window_up_us=life.window_up_us.at[g].set(jnp.where(sign > 0, new_timer, NO_TIMER)),
        window_down_us=life.window_down_us.at[g].set(jnp.where(sign < 0, new_timer, NO_TIMER)),
    ), passes


def group_members(st, p):
    """bool [G, I]: the slots of each scaling group (``reference.lifecycle.scaling_groups``):
    with P/D pools and instance lifecycles the prefill pool's and the decode pool's (a lane
    without pools has every slot in the first); otherwise one group of every slot."""
    every = jnp.ones(st.shapes.num_instances, bool)
    if st.scaling_groups == 1:
        return every[None, :]
    role = p.pd.role
    pools = p.pd.pools
    own = jnp.arange(st.shapes.num_instances) < p.autoscaler.max  # the lane's own slots
    return jnp.stack([own & jnp.where(pools, role == PDRole.PREFILL, every),
                      own & pools & (role == PDRole.DECODE)])


def bounded(life: LifecycleState, st, p, delta, *, member=None):
    """A decision within the replica bounds and step limits (``Lifecycle._bounded``): for the
    scaling group of slots ``member`` (None: every slot, at most the lane's ``max_replicas``)
    at most its slots' instances held."""
    mine = (lambda x: x) if member is None else (lambda x: x & member)  # noqa: E731
    live = jnp.sum(mine(lifecycle.live(life))).astype(I64)
    holding = jnp.sum(mine(lifecycle.holding(life))).astype(I64)
    most = (p.autoscaler.max if member is None else jnp.sum(member)).astype(I64)
    up = delta if st.settings.blis_quirks else jnp.minimum(delta, most - holding)
    up = jnp.where(p.autoscaler.up_step > 0, jnp.minimum(up, p.autoscaler.up_step), up)
    down = jnp.maximum(delta, p.autoscaler.min - live)
    down = jnp.where(p.autoscaler.down_step > 0, jnp.maximum(down, -p.autoscaler.down_step), down)
    return jnp.where(delta > 0, jnp.maximum(up, 0), jnp.where(delta < 0, jnp.minimum(down, 0), 0))


def tick(s: SimState, st, c, p, now, go) -> SimState:
    """The autoscaler's tick (``Lifecycle.tick``): each scaling group in order reads,
    decides and schedules its actuation; the caller refreshed the snapshots at ``now``."""
    members = group_members(st, p)
    for g in range(st.scaling_groups):
        s = _tick_group(s, st, c, p, now, go, g=g,
                        member=None if st.scaling_groups == 1 else members[g])
    life = s.life
    # the next tick, unless an unbounded run has nothing left to do
    awaiting = sessions.arrivals_known(s, st, c) - s.cursors.admit + life.unrouted
    idle = (awaiting <= 0) & (jnp.sum(s.router.in_flight) == 0)
    if st.scaling_groups > 1:  # requests on their way to a decode instance
        idle = idle & (jnp.sum(s.pd.headed) == 0)
    stop = (c.horizon_us == INT64_MAX) & idle
    nxt = jnp.where(stop, INT64_MAX, now + p.autoscaler.interval_us)
    return s.replace(life=life.replace(tick_us=jnp.where(go, nxt, life.tick_us)))


def _tick_group(s: SimState, st, c, p, now, go, *, g: int, member) -> SimState:
    """Scaling group g's part of a tick (slots ``member``; None: every slot)."""
    life = s.life
    mine = (lambda x: x) if member is None else (lambda x: x & member)  # noqa: E731
    rt = mine(lifecycle.routable(life))
    n = jnp.sum(rt).astype(I64)
    live = jnp.sum(mine(lifecycle.live(life))).astype(I64)
    threshold, target, queue = _template_delta(s, st, c, p, rt, n, live)
    sat_delta, sat_variant = _saturation(s, st, p, rt, n, member=member)
    saturation = p.autoscaler.policy == AutoscalerPolicy.BLIS_SATURATION
    stabilized_life, stable = _stabilized(life, p, sat_delta, now, g=g)
    life = jax.tree_util.tree_map(lambda a, b: jnp.where(go & saturation, a, b),
                                  stabilized_life, life)
    raw = jnp.where(p.autoscaler.policy == AutoscalerPolicy.THRESHOLD, threshold,
                    jnp.where(p.autoscaler.policy == AutoscalerPolicy.TARGET_UTILIZATION, target,
                              jnp.where(p.autoscaler.policy == AutoscalerPolicy.QUEUE_DEPTH, queue,
                                        jnp.where(stable, sat_delta, 0))))
    delta = bounded(life, st, p, raw, member=member)
    last = jnp.where(delta > 0, life.last_up_us[g], life.last_scale_us[g])
    cooled = saturation | (now - last >= p.autoscaler.cooldown_us)
    passed = go & (delta != 0) & cooled
    life = life.replace(last_scale_us=upd(life.last_scale_us, g, now, passed),
                        last_up_us=upd(life.last_up_us, g, now, passed & (delta > 0)))
    # the actuation, after the HPA scrape delay
    free = life.act_us == INT64_MAX
    a = jnp.argmax(free)
    room = jnp.any(free)
    delay, cursor, ovf = lifecycle.draw(p.autoscaler.act_delay_us, life.act_draw,
                               p.autoscaler.act_random, passed)
    push = passed & room
    life = life.replace(
        act_us=upd(life.act_us, a, now + delay, push),
        act_delta=upd(life.act_delta, a, delta.astype(I32), push),
        act_variant=upd(life.act_variant, a, jnp.where(saturation, sat_variant, -1), push),
        act_group=upd(life.act_group, a, g, push),
        act_seq=upd(life.act_seq, a, life.seq, push), seq=life.seq + push.astype(I64),
        act_draw=cursor, ovf_draws=life.ovf_draws + ovf.astype(I32),
        ovf_actuations=life.ovf_actuations + (passed & ~room).astype(I32))
    return s.replace(life=life)
