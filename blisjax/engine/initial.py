"""The initial ``SimState`` of one lane.

Counterpart: the constructors of the reference engine's ``ClusterSimulator``, ``Instance`` and
``KVCache`` (every queue empty, every block free in id order, the token bucket full). Each
feature module builds its own part (``kvtier.init_tier``, ``pd.init_pd``,
``lifecycle.init_lifecycle``); this module sits above them and ``engine.state``.
"""

from __future__ import annotations

import jax.numpy as jnp

from blisjax.engine import kvblocks
from blisjax.engine.gateway import init_gateway
from blisjax.engine.kvtier import init_tier
from blisjax.engine.lifecycle import init_lifecycle
from blisjax.engine.pd import init_pd
from blisjax.engine.recent import init_recent
from blisjax.engine.sessions import init_sessions
from blisjax.engine.state import DEFERRED_RELEASES, NIL, SimState
from blisjax.engine.static import EngineStatic
from blisjax.gorand import STATE_WORDS, TAP_LAG
from blisjax.rules import KV_UTIL_BUCKETS

__all__ = ["init_state"]


def init_state(st: EngineStatic, tb_capacity, rl_burst, admission_code, rate_limit_code,
               router_rng=None, kv_cpu_blocks=0, kv_reload_us=0, pd_rng=None,
               pd_role=None, pd_pools=False, params=None):
    """Initial state of one lane. The bucket starts full (token-bucket or rate-limit size);
    ``router_rng``: the seeded words of the "router" stream (``PolicyParams.routing.router_rng``;
    zeros if not given); ``pd_rng``, ``pd_role``, ``pd_pools``: the P/D pools' streams, the
    instances' roles and whether the lane has pools (``PolicyParams.pd``: ``pool_rng``,
    ``role``, ``pools``);
    ``params``: the lane's ``PolicyParams``, which place its initial instances when the
    program models lifecycles (``engine.lifecycle``)."""
    n, i, t = st.request_rows, st.num_instances, st.num_tenants  # + sink row (+ P/D rows)
    q, e, mb, k = st.queue_slots, st.pending_slots, st.max_blocks_per_request, st.kv_blocks
    b, slots = st.batch_slots, st.slot_count
    g, jg = st.num_groups, st.group_blocks_max
    i32, i64, f64 = jnp.int32, jnp.int64, jnp.float64
    zi = lambda *shape: jnp.zeros(shape, i64)  # noqa: E731
    zi32 = lambda *shape: jnp.zeros(shape, i32)  # noqa: E731
    free = kvblocks.empty_free_list(st)
    bucket = jnp.where(admission_code == rate_limit_code, rl_burst, tb_capacity)
    return SimState(
        status=zi32(n).astype(jnp.int8), instance=jnp.full(n, NIL, i32), pi=zi32(n),
        computed=zi32(n), num_new=zi32(n), prio=jnp.zeros(n, f64),
        ttft=jnp.full(n, -1, i64), itl_sum=zi(n), sched=jnp.full(n, -1, i64), preempt=zi32(n),
        enq_seq=zi(n), tdone=jnp.zeros(n, bool), itl_buf=zi32(max(st.itl_capacity, 1)),
        adm_cursor=jnp.asarray(0, i32), route_cursor=jnp.asarray(0, i32),
        dl_cursor=jnp.asarray(0, i32), route_seq=jnp.asarray(0, i64),
        enq_counter=jnp.asarray(0, i64), in_flight=zi32(i), tenant_in_flight=zi32(t),
        rr=jnp.asarray(0, i32), bucket=jnp.asarray(bucket, f64), bucket_last=jnp.asarray(0, i64),
        tenant_bucket=(jnp.asarray(params.admission.tt_capacity, f64) if params is not None
                       else jnp.zeros(t, f64)),  # each tenant's bucket starts full
        tenant_bucket_last=zi(t),
        snap_qd=zi32(i), snap_bs=zi32(i), snap_kv=jnp.zeros(i, f64), snap_last=jnp.asarray(0, i64),
        rejected=jnp.asarray(0, i32),
        rng_words=(jnp.zeros(STATE_WORDS, i64) if router_rng is None
                   else jnp.asarray(router_rng, i64)),
        rng_tap=jnp.asarray(0, i32), rng_feed=jnp.asarray(STATE_WORDS - TAP_LAG, i32),
        cold_stamp=jnp.full(i, -1, i64), cold_clock=jnp.asarray(0, i64),
        cache_copy=jnp.zeros(st.group_slots + st.session_slots if st.cache_copy_on else 1,
                             bool),
        cache_copy_last=jnp.asarray(0, i64),
        lru_pos=jnp.full((i, g, jg), -1, i64), lru_own_at=zi(i, g, jg), lru_clock=zi(i),
        lru_own=zi(i),
        pend_req=jnp.full((i, e), NIL, i32), pend_time=zi(i, e), pend_seq=zi(i, e),
        step_time=jnp.full(i, -1, i64), stretch_steps=zi32(i), stretch_d=zi(i),
        stretch_offset=zi(i, st.stretch_offset_slots),
        stretch_ema=jnp.zeros((i, st.stretch_ema_slots), f64),
        stretch_cum=zi32(i, st.block_size), clock=zi(i), last_left=zi(i),
        q_buf=jnp.full((i, q), NIL, i32), q_head=zi32(i), q_len=zi32(i),
        order=jnp.full((i, b), NIL, i32), n_run=zi32(i),
        slot_req=jnp.full((i, slots), NIL, i32), bt=jnp.full((i, slots, mb), NIL, i32),
        blen=zi32(i, slots), step_cached=zi32(i, slots),
        ema=jnp.zeros(i, f64),
        kv_ref=zi32(i, k), kv_tok=zi32(i, k), kv_slot=jnp.full((i, k), NIL, i32),
        **{name: jnp.broadcast_to(x, (i, *x.shape)) for name, x in free._asdict().items()},
        slot_block=jnp.full(st.hash_slots + 1, NIL, i32),
        slot_seq=jnp.full(st.hash_slots + 1, -1, i64), slot_clock=jnp.asarray(0, i64),
        tier=init_tier(st, kv_cpu_blocks, kv_reload_us), pd=init_pd(st, pd_rng, pd_role, pd_pools),
        life=init_lifecycle(st, params), recent=init_recent(st), sess=init_sessions(st),
        gw=init_gateway(st, params),
        rel_inst=jnp.asarray(0, i32), rel_slots=zi32(DEFERRED_RELEASES),
        rel_count=jnp.asarray(0, i32),
        hits=zi(i), misses=zi(i), preempt_count=zi(i), completed=zi(i), dropped=zi(i),
        timed_out=zi(i), capped_count=zi(i), alloc_failures=zi(i), input_tokens=zi(i), steps=zi(i),
        busy=zi(i),
        qdepth_time=zi(i), peak_used=zi(i), kv_time=zi(i),
        kv_util=jnp.zeros((i, KV_UTIL_BUCKETS + 1), i64),
        done=jnp.asarray(False), iters=jnp.asarray(0, i64), stretched=jnp.asarray(0, i64),
        ovf_queue=jnp.asarray(0, i32), ovf_pending=jnp.asarray(0, i32),
        ovf_blocks=jnp.asarray(0, i32), ovf_deadline=jnp.asarray(0, i32),
    )
