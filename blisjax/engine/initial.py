"""The initial ``SimState`` of one lane.

Counterpart: the constructors of the reference engine's ``ClusterSimulator``, ``Instance`` and
``KVCache`` (every queue empty, every block free in id order, the token bucket full). Each
module builds the part it owns (``cluster_events.init_cursors``, ``policies.init_router``,
``kvblocks.init_kv``, ``kvtier.init_tier``, ``pd.init_pd``, ``lifecycle.init_lifecycle``, …);
this module sits above them and ``engine.state``.
"""

from __future__ import annotations

import jax.numpy as jnp

from blisjax.engine.batch import init_batch
from blisjax.engine.cluster_events import init_cursors, init_window
from blisjax.engine.gateway import init_gateway
from blisjax.engine.kvblocks import init_kv
from blisjax.engine.kvtier import init_tier
from blisjax.engine.lifecycle import init_lifecycle
from blisjax.engine.pd import init_pd
from blisjax.engine.policies import init_admission, init_router
from blisjax.engine.queues import init_queue
from blisjax.engine.recent import init_recent
from blisjax.engine.sessions import init_sessions
from blisjax.engine.state import NIL, SimState, init_run, init_stats
from blisjax.engine.static import EngineStatic
from blisjax.engine.stretch import init_stretch

__all__ = ["init_state"]


def init_state(st: EngineStatic, tb_capacity, rl_burst, admission_code, rate_limit_code, *,
               router_rng=None, kv_cpu_blocks=0, kv_reload_us=0, pd_rng=None,
               pd_role=None, pd_pools=False, params=None):
    """Initial state of one lane. The bucket starts full (token-bucket or rate-limit size);
    ``router_rng``: the seeded words of the "router" stream (``PolicyParams.routing.router_rng``;
    zeros if not given); ``pd_rng``, ``pd_role``, ``pd_pools``: the P/D pools' streams, the
    instances' roles and whether the lane has pools (``PolicyParams.pd``: ``pool_rng``,
    ``role``, ``pools``);
    ``params``: the lane's ``PolicyParams``, which place its initial instances when the
    program models lifecycles (``engine.lifecycle``)."""
    n = st.request_rows  # + sink row (+ P/D rows)
    i32, i64 = jnp.int32, jnp.int64
    bucket = jnp.where(admission_code == rate_limit_code, rl_burst, tb_capacity)
    return SimState(
        status=jnp.zeros(n, jnp.int8), instance=jnp.full(n, NIL, i32), pi=jnp.zeros(n, i32),
        computed=jnp.zeros(n, i32), num_new=jnp.zeros(n, i32), prio=jnp.zeros(n, jnp.float64),
        ttft=jnp.full(n, -1, i64), itl_sum=jnp.zeros(n, i64), sched=jnp.full(n, -1, i64),
        preempt=jnp.zeros(n, i32), enq_seq=jnp.zeros(n, i64), tdone=jnp.zeros(n, bool),
        itl_buf=jnp.zeros(max(st.shapes.itl_capacity, 1), i32),
        cursors=init_cursors(), router=init_router(st, router_rng),
        # each tenant's bucket starts full
        admission=init_admission(st, bucket, None if params is None
                                 else params.admission.tt_capacity),
        window=init_window(st), batch=init_batch(st), stretch=init_stretch(st),
        queue=init_queue(st),
        kv=init_kv(st, None if params is None else params.settings.kv_blocks),
        tier=init_tier(st, kv_cpu_blocks, kv_reload_us), pd=init_pd(st, pd_rng, pd_role, pd_pools),
        life=init_lifecycle(st, params), recent=init_recent(st), sess=init_sessions(st),
        gw=init_gateway(st, params), stats=init_stats(st), run=init_run())
