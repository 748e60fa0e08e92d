"""Policy programs in the JAX engine: a per-lane interpreter of the programs' instructions.

Counterpart: ``blisjax.reference.program`` (the expression tree evaluated in plain Python).
A program is ``MAX_PROGRAM_LENGTH`` instructions (``blisjax.program.bytecode``), each writing
one register of a ``[MAX_PROGRAM_LENGTH, N]`` register file from earlier registers, so one
compiled loop runs any program of any lane: its trips are the block's longest program, and a
lane's finished program leaves its registers unchanged. ``N`` is what the program is evaluated
for at once: the candidate instances of a routing decision, or queued requests.

The arithmetic is the reference's, operation by operation (docs/policy-programs.md,
Arithmetic): products are formed by ``exact_mul`` (no fused multiply-add) and quotients by
``ieee_divide``; ``log1p`` runs the reference's series with the same operations in the same
order.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from blisjax.engine import recent, sessions
from blisjax.engine.exactfloat import exact_mul, ieee_divide
from blisjax.engine.lockstep import lane_while, upd
from blisjax.program import MAX_PROGRAM_LENGTH, OBSERVABLES, Bytecode
from blisjax.program.arithmetic import LN2, LOG_SERIES, MAX_FLOAT, MIN_NORMAL, SQRT_HALF
from blisjax.program.bytecode import Op
from blisjax.program.observables import RECENT_WINDOW_US, SLO_CLASS_RANK, index_of

F64 = jnp.float64
_EXP_MASK = 0x7FF0000000000000


def _finite(x):
    """``reference.program.finite``: clamped to ±MAX_FLOAT, 0.0 below ``MIN_NORMAL``."""
    return jnp.where(jnp.abs(x) < MIN_NORMAL, 0.0, jnp.clip(x, -MAX_FLOAT, MAX_FLOAT))


def log1p(x):
    """``reference.program.log1p``, elementwise (float64 in, float64 out)."""
    low = x <= -1.0
    # behind a barrier: XLA would otherwise rewrite (1 + x) - 1 as x, the rounding the
    # correction below exists to undo
    u = lax.optimization_barrier(1.0 + jnp.where(low, 0.0, x))
    exact = u == 1.0
    bits = lax.bitcast_convert_type(jnp.where(exact, 2.0, u), jnp.uint64)
    e = ((bits >> jnp.uint64(52)) & jnp.uint64(0x7FF)).astype(jnp.int64) - 1022
    m = lax.bitcast_convert_type((bits & ~jnp.uint64(_EXP_MASK)) | jnp.uint64(1022 << 52), F64)
    small = m < SQRT_HALF
    m = jnp.where(small, m * 2.0, m)
    e = jnp.where(small, e - 1, e)
    f = m - 1.0
    s = ieee_divide(f, 2.0 + f)
    z = exact_mul(s, s)
    poly = jnp.full_like(s, LOG_SERIES[-1])
    for coefficient in reversed(LOG_SERIES[:-1]):
        poly = coefficient + exact_mul(z, poly)
    log_u = exact_mul(e.astype(F64), jnp.full_like(s, LN2)) + exact_mul(2.0 * s, poly)
    out = exact_mul(log_u, ieee_divide(x, jnp.where(exact, 1.0, u - 1.0)))
    return jnp.where(low, -MAX_FLOAT, jnp.where(exact, x, out))


def _results(op_values, x, y, z):
    """Every instruction's result from operands x, y, z (one per ``Op`` code, in code order;
    ``CONST`` and ``OBS`` are filled in by the caller), before ``_finite``."""
    t = lambda b: b.astype(F64)  # noqa: E731
    zero_div = y == 0.0
    return {
        Op.ADD: x + y, Op.SUB: x - y, Op.MUL: exact_mul(x, y),
        Op.DIV: jnp.where(zero_div, 0.0, ieee_divide(x, jnp.where(zero_div, 1.0, y))),
        Op.NEG: -x, Op.ABS: jnp.abs(x), Op.LOG1P: log1p(x),
        Op.LT: t(x < y), Op.LE: t(x <= y), Op.GT: t(x > y), Op.GE: t(x >= y),
        Op.EQ: t(x == y), Op.NE: t(x != y),
        Op.AND: t((x != 0.0) & (y != 0.0)), Op.OR: t((x != 0.0) | (y != 0.0)),
        Op.NOT: t(x == 0.0), Op.MIN: jnp.where(y < x, y, x), Op.MAX: jnp.where(y > x, y, x),
        Op.SELECT: jnp.where(x != 0.0, y, z), **op_values}


def run(code: Bytecode, observables):
    """The program's value for each of N items: ``observables`` [K, N] float64 (one row per
    ``OBSERVABLES`` entry; rows the program does not read may hold anything). Returns
    float64 [N]."""
    n = observables.shape[1]
    regs = jnp.zeros((MAX_PROGRAM_LENGTH, n), F64)

    def cond(carry):
        return carry[0] < code.length

    def body(carry, go):
        pc, regs = carry
        op = code.op[pc]
        x, y, z = regs[code.a[pc]], regs[code.b[pc]], regs[code.c[pc]]
        loaded = {Op.CONST: jnp.full((n,), code.imm[pc], F64),
                  Op.OBS: observables[jnp.clip(code.a[pc], 0, len(OBSERVABLES) - 1)]}
        by_op = _results(loaded, x, y, z)
        value = _finite(jnp.stack([by_op[o] for o in Op])[op])
        regs = upd(regs, pc, value, go)
        return pc + go.astype(jnp.int32), regs

    _, regs = lane_while(cond, body, (jnp.asarray(0, jnp.int32), regs))
    return regs[code.length - 1]


# ---- observables (docs/policy-programs.md, Observables) -----------------------------------------


def rows(n: int, values: dict):
    """The [K, n] observable matrix: ``values`` name → [n] or scalar; the rest zeros."""
    zero = jnp.zeros((n,), F64)
    filled = [zero] * len(OBSERVABLES)
    for name, v in values.items():
        filled[index_of(name)] = jnp.broadcast_to(jnp.asarray(v, F64), (n,))
    return jnp.stack(filled)


def request_values(s, st, c, r, now) -> dict:
    """The request observables of request(s) r at ``now`` (``request_observables``)."""
    rank = jnp.asarray(SLO_CLASS_RANK, F64)
    age = (now - sessions.arrival_us(s, st, c, r)).astype(F64)
    return {"input_tokens": c.input_tokens[r].astype(F64),
            "prefix_tokens": c.prefix_tokens[r].astype(F64),
            "slo_class_rank": rank[c.slo_class[r]],
            "tenant_in_flight": s.admission.tenant_in_flight[c.tenant[r]].astype(F64),
            "age_ms": ieee_divide(age, jnp.full_like(age, 1000.0))}


def cluster_load(s, members):
    """``(queued requests, mean KV utilization, instance count)`` over the instances
    ``members`` (bool [I]) from the router's snapshots, the KV utilizations summed in instance
    order as the reference sums them (``cluster_observables``); float64, int32, int32."""
    kv = jnp.asarray(0.0, F64)
    for i in range(members.shape[0]):  # left to right, as the reference sums
        kv = jnp.where(members[i], kv + s.router.snap_kv[i], kv)
    count = jnp.sum(members)
    mean = jnp.where(count > 0, ieee_divide(kv, jnp.maximum(count, 1).astype(F64)), 0.0)
    return jnp.sum(jnp.where(members, s.router.snap_qd, 0)), mean, count


def cluster_values(s, st, c, members, now) -> dict:
    """The cluster observables over the instances ``members`` (bool [I]), summed in instance
    order, and the recent arrival rate at ``now`` (``cluster_observables``)."""
    queued, mean, count = cluster_load(s, members)
    return {"cluster_queue_depth": queued.astype(F64),
            "cluster_in_flight": jnp.sum(jnp.where(members, s.router.in_flight, 0)).astype(F64),
            "cluster_kv_utilization": mean, "instances": count.astype(F64),
            "arrival_rate": ieee_divide(recent.arrivals(s, st, c, now).astype(F64),
                                        jnp.asarray(RECENT_WINDOW_US / 1e6, F64))}
