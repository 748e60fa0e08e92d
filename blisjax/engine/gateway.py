"""The gateway queue in the JAX engine: BLIS's flow control (docs/semantics.md §5.12,
Decision 21).

Counterpart: ``blisjax.reference.gateway`` and ``ClusterSimulator._try_dispatch`` /
``_gateway_tick``. Compiled in only when some lane has flow control
(``EngineStatic.features.gateway``); otherwise ``GatewayState`` is a set of one-entry
placeholders and nothing here runs, so programs without it are the ones compiled before.

* The queue is ``gateway_slots`` entries (request, enqueue stamp, band, enqueue time); a
  request past them is counted in ``overflow`` and the lane's result refused (never a
  silently wrong number). Dispatch takes the smallest stamp (fifo) or, under band order,
  the highest band then the smallest stamp.
* Dispatched requests leave the admission pipeline: ``order[k]`` is the k-th request
  dispatched and ``route_us[k]`` its routing time (dispatch + routing latency), which the
  routing cursor follows. A lane without flow control dispatches each request at its
  admission, so its routings are those of the plain pipeline.
* ``tick_us``: the pending dispatch tick (INT64_MAX: none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blisjax.config.codes import SaturationDetector
from blisjax.engine.exactfloat import ieee_divide
from blisjax.engine.lockstep import upd
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.static import setting
from blisjax.limits import INT64_MAX

F64 = jnp.float64


@pytree_dataclass
class GatewayState:
    """Shapes: W queue entries (``EngineStatic.shapes.gateway_slots``), N + 1 request rows;
    one-entry placeholders without flow control."""

    req: jax.Array  # int32 [W]: the waiting request, N = free entry
    stamp: jax.Array  # int64 [W]: its enqueue stamp (INT64_MAX: free)
    band: jax.Array  # float64 [W]: its SLO-class priority
    since: jax.Array  # int64 µs [W]: its enqueue time
    count: jax.Array  # int32: requests waiting
    clock: jax.Array  # int64: the next enqueue stamp
    order: jax.Array  # int32 [N + 1]: the k-th request dispatched to routing
    route_us: jax.Array  # int64 µs [N + 1]: its routing time
    dispatched: jax.Array  # int32: requests dispatched
    tick_us: jax.Array  # int64 µs: the pending dispatch tick, INT64_MAX = none
    rejected: jax.Array  # int32: requests refused by a full queue
    wait_sum: jax.Array  # int64 µs: Σ dispatch − enqueue (flow-control lanes)
    overflow: jax.Array  # int32: requests refused for want of an entry (capacity)
    on: jax.Array  # bool: the lane has flow control (its results report the counters)


def init_gateway(st, params=None) -> GatewayState:
    i32, i64 = jnp.int32, jnp.int64
    zero = lambda dtype: jnp.asarray(0, dtype)  # noqa: E731
    w = st.shapes.gateway_slots if st.features.gateway else 1
    rows = st.shapes.num_requests + 1 if st.features.gateway else 1
    return GatewayState(
        req=jnp.full(w, st.shapes.num_requests, i32), stamp=jnp.full(w, INT64_MAX, i64),
        band=jnp.zeros(w, F64), since=jnp.zeros(w, i64), count=zero(i32), clock=zero(i64),
        order=jnp.full(rows, st.shapes.num_requests, i32), route_us=jnp.full(rows, INT64_MAX, i64),
        dispatched=zero(i32), tick_us=jnp.asarray(INT64_MAX, i64), rejected=zero(i32),
        wait_sum=zero(i64), overflow=zero(i32),
        on=jnp.asarray(False) if params is None or not st.features.gateway
        else jnp.asarray(params.gateway.on))


def to_routing(g: GatewayState, st, c, r, now, go) -> GatewayState:
    """Request r goes to routing now (its routing event at now + routing latency)."""
    k = jnp.where(go, g.dispatched, st.shapes.num_requests)
    return g.replace(order=g.order.at[k].set(r),
                     route_us=g.route_us.at[k].set(now + setting(st, c, "routing_latency_us")),
                     dispatched=g.dispatched + go.astype(jnp.int32))


def turned_away(g: GatewayState, mask) -> GatewayState:
    """Admitted requests the full queue turned away (where ``mask``)."""
    return g.replace(rejected=g.rejected + mask.astype(jnp.int32))


def tick_at(g: GatewayState, t_us, go) -> GatewayState:
    """The next dispatch tick at ``t_us`` (INT64_MAX: none) where ``go``."""
    return g.replace(tick_us=jnp.where(go, t_us, g.tick_us))


def full(g: GatewayState, p):
    """The lane's queue is at its ``max_queue_depth`` (0: unlimited)."""
    return (p.gateway.max_depth > 0) & (g.count >= p.gateway.max_depth)


def enqueue(g: GatewayState, st, c, p, r, now, go) -> GatewayState:
    """Hold request r (the caller checked ``full``); past the entries, overflow."""
    free = g.req == st.shapes.num_requests
    has = jnp.any(free)
    k = jnp.argmax(free)
    put = go & has
    return g.replace(
        req=upd(g.req, k, r, put), stamp=upd(g.stamp, k, g.clock, put),
        band=upd(g.band, k, p.priority.class_score[c.slo_class[r]], put),
        since=upd(g.since, k, now, put),
        count=g.count + put.astype(jnp.int32), clock=g.clock + put.astype(jnp.int64),
        overflow=g.overflow + (go & ~has).astype(jnp.int32))


def saturation(s, st, p, members):
    """The lane's detector over the routable instances ``members`` (bool [I]), summed in
    instance order as the reference (``reference.gateway.saturation``)."""
    n = jnp.sum(members.astype(jnp.int32))
    util = jnp.asarray(0.0, F64)
    for i in range(st.shapes.num_instances):  # sequential: the reference's order of additions
        q = ieee_divide(s.router.snap_qd[i].astype(F64), p.gateway.qd_threshold)
        kv = ieee_divide(s.router.snap_kv[i], p.gateway.kv_threshold)
        util = jnp.where(members[i], util + jnp.maximum(q, kv), util)
    util = ieee_divide(util, jnp.maximum(n, 1).astype(F64))
    busy = jnp.sum(jnp.where(members, s.router.in_flight, 0))
    conc = ieee_divide(busy.astype(F64), (jnp.maximum(n, 1) * p.gateway.max_conc).astype(F64))
    value = jnp.stack([jnp.asarray(0.0, F64), util, conc])[p.gateway.detector]
    none = (n == 0) & (p.gateway.detector != SaturationDetector.NEVER)
    return jnp.where(none, 1.0, value)


def pop(g: GatewayState, st, p, now, go):
    """Take the next request to dispatch where ``go``: (state, its row)."""
    used = g.req < st.shapes.num_requests
    top = jnp.max(jnp.where(used, g.band, -jnp.inf))
    eligible = used & (~p.gateway.by_band | (g.band == top))
    k = jnp.argmin(jnp.where(eligible, g.stamp, INT64_MAX))
    r = g.req[k]
    g = g.replace(req=upd(g.req, k, st.shapes.num_requests, go),
                  stamp=upd(g.stamp, k, INT64_MAX, go),
                  count=g.count - go.astype(jnp.int32),
                  wait_sum=g.wait_sum + jnp.where(go, now - g.since[k], 0))
    return g, r
