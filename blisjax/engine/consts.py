"""The workload constants of the JAX engine: per-request arrays and host-precomputed float
tables, passed to the program as *traced* arrays (never baked in) so XLA cannot constant-fold or
rewrite the arithmetic that touches them; and the reads that pick the latency rows of a lane's
GPU or of an instance's P/D pool.

Counterpart: the constant fields of each ``blisjax.reference`` ``SimRequest`` and the latency
model's tables.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.config._checks import ConfigError
from blisjax.config.hardware import hardware_code, hardware_code_count, shipped_hardware
from blisjax.engine.latency_rows import POOL_ROWS, gpu_resolved, pool_row_configs
from blisjax.engine.params import LaneSettings, lane_settings
from blisjax.engine.physics import PhysicsConsts, physics_consts
from blisjax.engine.pytree import pytree_dataclass
from blisjax.engine.request_rows import (
    engine_workload,
    ext_counts,
    group_blocks,
    itl_allotted,
    own_counts,
    queue_delays,
    session_tokens,
)
from blisjax.engine.roofline import RooflineConsts, roofline_consts
from blisjax.engine.static import EngineStatic
from blisjax.latency.factory import make_latency_model
from blisjax.limits import INT64_MAX
from blisjax.workload.sessions import next_round


@pytree_dataclass
class WorkloadConsts:
    """Per-request constants (length N, the program's request rows) and float tables, shared
    by every lane. A workload of fewer requests than the program's rows fills the first
    ``rows`` of them; the spare rows never arrive (``arrival_us`` INT64_MAX)."""

    rows: jax.Array  # int32: the workload's requests (rows ``rows`` .. N − 1 are spare)
    initial_rows: jax.Array  # int32: its rows that are not follow-ups (they come first)
    horizon_us: jax.Array  # int64: the simulation's horizon (INT64_MAX: none)
    arrival_us: jax.Array
    input_tokens: jax.Array
    output_tokens: jax.Array
    deadline_us: jax.Array
    tenant: jax.Array
    slo_class: jax.Array
    group: jax.Array
    group_blocks: jax.Array  # prompt blocks shared with the prefix group
    prefix_tokens: jax.Array  # the shared prefix's tokens (0 without a prefix group)
    full_blocks: jax.Array  # full prompt blocks = input_tokens // block_size
    session: jax.Array  # closed-loop session (-1: none)
    session_blocks: jax.Array  # leading blocks shared with the session (engine.sessions)
    session_tokens: jax.Array  # leading tokens shared with the session (its conversation)
    reg_blocks: jax.Array  # blocks registered when they fill: prompt or session blocks
    next_row: jax.Array  # the session's next round (-1: none)
    think_us: jax.Array  # µs between a follow-up's predecessor completing and its arrival
    follow_up: jax.Array  # bool: a follow-up round (its arrival is the simulation's)
    follow_start: jax.Array  # int32 [S]: each session's first follow-up row (N: none)
    open_row: jax.Array  # bool: a row of a session whose rows are a capacity (a concurrency
    #                      user's, ``Workload.session_unbounded``)
    follow_up_budget: jax.Array  # int32: most follow-ups a run creates (-1: no cap)
    max_events: jax.Array  # int64: events a lane handles at most (``events_bound``)
    own_base: jax.Array  # hash slot of own block j is group_slots + own_base + j
    ext_base: jax.Array  # CPU key of block j >= full_blocks is ext_base + j (engine.kvtier)
    queue_delay_us: jax.Array
    itl_offset: jax.Array  # int64: the request's first raw ITL entry in the ITL buffer
    itl_end: jax.Array  # int64: the end of its entries (``request_rows.itl_allotted``)
    deadline_order: jax.Array  # requests with 0 < deadline <= horizon, by (deadline, index)
    step_prefill: jax.Array  # float64[budget+1]: (0 + β0) + β1·prefill_tokens
    step_decode: jax.Array  # float64[batch+1]: β2·decode_tokens
    # Per-lane GPU types (``EngineStatic.settings.gpus``): queue_delay_us, step_prefill,
    # step_decode and the roofline's prefill_flops, decode_flops and bandwidth gain a leading
    # axis of one row per ``hardware_code``; otp_us holds each row's output-token time (µs;
    # one row, the configuration's, without them: a traced value, so runs of other α2 share
    # a program); gpu is the lane's code (set per lane in the run, ``lane_consts``).
    # gpu_rows: the codes whose rows hold their own GPU's latency (the base's alone without
    # per-lane GPUs; a host-side check).
    gpu: jax.Array
    otp_us: jax.Array
    gpu_rows: jax.Array
    # P/D pools of their own (``EngineStatic.settings.instance_rows``): the same tables with a
    # leading axis of three rows (the configuration's, the prefill pool's, the decode pool's; with
    # per-lane GPU types three per GPU code, row = code × POOL_ROWS + pool row), the roofline
    # and physics constants stacked whole (TP changes them all); instance_row (int32 [I]) is
    # each instance's pool row ([1] otherwise).
    instance_row: jax.Array
    pd_rank: jax.Array  # P/D: rank of the prefill sub-request's id text ("request_<id>_prefill"),
    #                     BLIS's order of same-event transfer starts ([1] without pools)
    pd_kv_bytes: jax.Array  # float64 P/D: bytes of the request's prompt KV a transfer moves
    one_e6: jax.Array  # 1e6, 1e-6 and the KV size as traced values (no constant rewriting)
    one_e_6: jax.Array
    kv_blocks_f: jax.Array
    # the per-lane settings (``params.LaneSettings``): the configuration's, or in the lanes'
    # ``vmap`` the lane's own (``lane_consts``); read through ``setting``
    settings: LaneSettings
    roofline: RooflineConsts  # roofline tables and constants (a placeholder for other models)
    physics: PhysicsConsts  # physics coefficients, tables and constants (a placeholder for others)


def _follow_starts(workload, st: EngineStatic) -> np.ndarray:
    """int32 [S]: each session's first follow-up row (the sink row N for none)."""
    out = np.full(max(st.shapes.num_sessions, 1), st.shapes.num_requests, np.int32)
    follow = np.flatnonzero(workload.follow_up)
    for row in follow[::-1].tolist():  # last to first: the first row of each session stays
        out[int(workload.session[row])] = row
    return out


def events_bound(workload, horizon_us: int) -> int:
    """Events one lane handles at most, unless ``EngineStatic.shapes.max_events`` sets it: 64 per
    prompt and output token and per request (a step processes at least one token of some
    request; a request's own events are a few), plus one per µs of a finite horizon
    (periodic ticks). A lane that reaches it with events left stops, flagged
    (``overflow["events"]``): an instance stepping empty without a horizon, or ticks that
    never end, cannot hang a run."""
    tokens = int(np.sum(np.asarray(workload.input_tokens, np.int64))
                 + np.sum(np.asarray(workload.output_tokens, np.int64)))
    horizon = horizon_us if horizon_us < 1 << 50 else 0
    return 64 * (tokens + 8 * workload.num_requests + 64) + int(horizon)


def _open_rows(workload) -> np.ndarray:
    """bool [N]: the rows of sessions whose rows are a capacity (``session_unbounded``)."""
    session = np.asarray(workload.session)
    if not any(workload.session_unbounded):
        return np.zeros(session.shape, bool)
    return np.asarray(workload.session_unbounded, bool)[np.maximum(session, 0)] & (session >= 0)


def _checked_rows(workload, st: EngineStatic) -> int:
    """The workload's request count, which the program's request rows and sessions must hold
    (ValueError otherwise)."""
    n, rows = workload.num_requests, st.shapes.num_requests
    if n > rows:
        raise ValueError(f"the program has {rows} request rows (EngineStatic num_requests); "
                         f"a workload of {n} requests needs at most that many")
    sessions = len(workload.session_names) if workload.has_sessions else 0
    if sessions > st.shapes.num_sessions:
        raise ValueError(f"the program has {st.shapes.num_sessions} sessions (EngineStatic "
                         f"num_sessions); a workload of {sessions} needs at most that many")
    return n


class LatencyRows(NamedTuple):
    """Host tables of each GPU row (``_latency_rows``)."""

    codes: list  # the hardware codes whose rows hold their own GPU's latency
    resolved: list  # per row: the configuration resolved with the row's GPU
    qdelay: list  # per row: int64 [N] α delays
    step_prefill: list  # per row: float64 [budget + 1]
    step_decode: list  # per row: float64 [batch + 1]
    otp_us: list  # per row: int µs the output-token time adds to each step's ITL and TTFT


def _latency_rows(resolved, workload, st: EngineStatic) -> LatencyRows:
    """The GPU-dependent tables with the reference's own float formulas, on the host: the
    configuration's alone, or one row per ``hardware_code`` with ``st.settings.gpus`` (rows of codes
    no lane runs repeat the configuration's)."""
    base = hardware_code(resolved.config.hardware)
    if st.settings.instance_rows and st.settings.gpus:  # row = GPU code × POOL_ROWS + pool row
        named = {hardware_code(x): gpu_resolved(resolved, x) for x in st.settings.gpus}
        per_row = [r for k in range(hardware_code_count())
                   for r in pool_row_configs(named.get(k, resolved))]
        codes = sorted(named)
    elif st.settings.instance_rows:
        per_row = pool_row_configs(resolved)
        codes = [base]
    elif st.settings.gpus:
        named = {hardware_code(x): gpu_resolved(resolved, x) for x in st.settings.gpus}
        per_row = [named.get(k, resolved) for k in range(hardware_code_count())]
        codes = sorted(named)
    else:
        per_row, codes = [resolved], [base]
    out = LatencyRows(codes, per_row, [], [], [], [])
    for r in per_row:
        beta = tuple(r.beta) if r.config.latency.model == "blackbox" \
            else (0.0, 0.0, 0.0)  # unused
        out.qdelay.append(queue_delays(r, workload))
        budget, slots = st.settings.token_budget, st.shapes.batch_slots
        out.step_prefill.append(np.array([(0.0 + beta[0]) + beta[1] * float(c)
                                          for c in range(budget + 1)], np.float64))
        out.step_decode.append(np.array([beta[2] * float(c) for c in range(slots + 1)],
                                        np.float64))
        out.otp_us.append(int(make_latency_model(r).output_token_processing_us))
    return out


def lane_consts(st: EngineStatic, consts: WorkloadConsts, params) -> WorkloadConsts:
    """The constants one lane reads: with per-lane GPU types its GPU code set (``gpu``), so the
    GPU-dependent reads (``queue_delay``, ``step_tables``, ``roofline_of``, ``otp``) take its
    rows; with per-lane settings (``EngineStatic.features.lane_settings``) its own
    (``setting``); ``consts`` itself otherwise. Inside the lanes' ``vmap``."""
    if st.settings.gpus:
        consts = consts.replace(gpu=params.gpu)
    if st.features.lane_settings:  # as run (``static.lane_settings_run``, in ``_run_block``)
        consts = consts.replace(settings=params.settings)
        if not st.settings.instance_kv_blocks:  # P/D pools' own sizes: every lane's alike
            consts = consts.replace(kv_blocks_f=params.settings.kv_blocks.astype(jnp.float64))
    return consts



def _row(st: EngineStatic, c: WorkloadConsts, i):
    """The latency row instance i reads: the lane's GPU's, the instance's pool's, or with
    both the pool's on the lane's GPU; None with one row."""
    if st.settings.instance_rows and st.settings.gpus:
        return c.gpu * POOL_ROWS + c.instance_row[i]
    if st.settings.instance_rows:
        return c.instance_row[i]
    return c.gpu if st.settings.gpus else None


def queue_delay(st: EngineStatic, c: WorkloadConsts, r, i):
    """int64 µs α delay of request row r on instance i (its GPU, its pool)."""
    row = _row(st, c, i)
    return c.queue_delay_us[r] if row is None else c.queue_delay_us[row, r]


def step_tables(st: EngineStatic, c: WorkloadConsts, i):
    """(prefill, decode) blackbox step tables of instance i."""
    row = _row(st, c, i)
    if row is None:
        return c.step_prefill, c.step_decode
    return c.step_prefill[row], c.step_decode[row]


def roofline_of(st: EngineStatic, c: WorkloadConsts, i) -> RooflineConsts:
    """The roofline constants of instance i (its GPU's FLOP rates and bandwidth; with pools
    of their own, its pool's constants whole)."""
    rc = c.roofline
    if st.settings.instance_rows:
        row = _row(st, c, i)
        return jax.tree.map(lambda x: x[row], rc)
    if not st.settings.gpus:
        return rc
    return rc._replace(prefill_flops=rc.prefill_flops[c.gpu],
                       decode_flops=rc.decode_flops[c.gpu], bandwidth=rc.bandwidth[c.gpu])


def physics_of(st: EngineStatic, c: WorkloadConsts, i) -> PhysicsConsts:
    """The physics constants of instance i (with pools of their own its pool's, with per-lane
    GPU types the lane's GPU's: the row's constants whole)."""
    row = _row(st, c, i) if st.settings.latency_model == "physics" else None
    return c.physics if row is None else jax.tree.map(lambda x: x[row], c.physics)


def otp(st: EngineStatic, c: WorkloadConsts, i):
    """µs the output-token time adds to each step's ITL and TTFT on instance i (α2)."""
    row = _row(st, c, i)
    return c.otp_us[0 if row is None else row]


def check_gpus(st: EngineStatic, consts: WorkloadConsts, params) -> None:
    """ConfigError unless every lane's GPU type has its rows in ``consts`` (host-side)."""
    have = {int(x) for x in np.asarray(consts.gpu_rows)}
    lanes = {int(x) for x in np.unique(np.asarray(params.gpu))}
    if st.features.variant_speed:  # the instances' variants' GPUs
        lanes |= {int(x) for x in np.unique(np.asarray(params.lifecycle.variant_gpu))}
    missing = sorted(lanes - have)
    if missing:
        names = shipped_hardware()
        raise ConfigError("hardware", "lanes run GPU types the program holds no latency for ("
                          + ", ".join(names[k] if k < len(names) else "another" for k in missing)
                          + "): build the program with build_static(gpus=...) or for_hardware, "
                          "and its constants after")


def _stacked_rows(configs, tables):
    """``tables(config)`` (a pytree of arrays) for each latency row's resolved configuration,
    stacked along a leading row axis on the device; rows of one configuration share a table."""
    built = {}
    for r in configs:
        if id(r) not in built:
            built[id(r)] = tables(r)
    return jax.tree.map(lambda *xs: jax.device_put(np.stack([np.asarray(x) for x in xs])),
                        *(built[id(r)] for r in configs))


def build_consts(resolved, workload, st: EngineStatic) -> WorkloadConsts:
    """Host-side preparation of per-request constants and exact float tables."""
    bs = st.settings.block_size
    original = workload
    workload = engine_workload(workload, st.conversation_max_model_len, pd=st.features.pd)
    inp = np.asarray(workload.input_tokens, dtype=np.int64)
    out = np.asarray(workload.output_tokens, dtype=np.int64)
    gb = group_blocks(workload, bs)
    full = inp // bs
    own_count = own_counts(workload, bs)
    n = _checked_rows(workload, st)
    own_start = np.concatenate([[0], np.cumsum(own_count)[:-1]]) if n else own_count
    starts = lambda counts: np.concatenate([[0], np.cumsum(counts)[:-1]]) \
        if n else np.zeros(0, np.int64)  # noqa: E731
    ext_start = starts(ext_counts(inp, out, bs))
    rows = _latency_rows(resolved, workload, st)
    talk = session_tokens(workload) if st.features.sessions \
        else np.zeros(workload.num_requests, np.int64)
    shared = talk // bs
    dl = np.asarray(workload.deadline_us, dtype=np.int64)
    # a follow-up's deadline is relative to its arrival (engine.sessions), not in the order
    horizon = int(resolved.config.horizon_us)
    has = np.nonzero((dl > 0) & (dl <= horizon) & ~workload.follow_up)[0]
    order = has[np.lexsort((has, dl[has]))] if has.size else np.zeros(0, np.int64)
    itl_end = np.cumsum(itl_allotted(out, st.features.pd)) if n else np.zeros(0, np.int64)
    itl_off = np.concatenate([[0], itl_end[:-1]]) if n else np.zeros(0, np.int64)
    spare = st.shapes.num_requests - n

    # Every per-request array holds the workload's rows, then the spare rows up to N (with
    # ``value``, or ``never`` where given), then one "sink" row (index N): masked scatters
    # write there. With P/D pools the prefill sub-requests' rows follow, each its request's
    # constants (``shadow``: what differs; it has no output tokens), then spare rows again.
    # Built on the host and put on the device as they are: ``jnp.asarray`` would compile a
    # small program per array (docs/performance.md, Seconds to first result).
    def pad(x, value, dtype, shadow=None, never=None):
        x = np.asarray(x)
        unused = np.full(spare, value if never is None else never)
        rows = [x, unused, [value]]
        if st.features.pd:
            rows += [x if shadow is None else shadow, unused]
        return jax.device_put(np.concatenate(rows).astype(dtype))

    i32, i64 = np.int32, np.int64
    if st.features.pd:
        ids = [f"request_{int(x)}_prefill" for x in np.asarray(workload.request_id).tolist()]
        rank = np.empty(len(ids), np.int64)
        rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
        pd_rank = pad(rank, 0, i32)
        # bytes = ceil(L_in / B) · (B · KV bytes per token), in the reference's float order
        per_block = float(bs) * float(resolved.pd_kv_bytes_per_token)
        pd_kv_bytes = pad([float(-(-int(x) // bs)) * per_block for x in inp], 0.0, np.float64)
    else:
        pd_rank = jax.device_put(np.zeros(1, i32))
        pd_kv_bytes = jax.device_put(np.zeros(1, np.float64))
    model = make_latency_model(resolved) if resolved.config.latency.model != "blackbox" \
        else None
    by_gpu = (lambda xs: np.stack(xs)) if st.settings.gpus or st.settings.instance_rows \
        else (lambda xs: xs[0])  # noqa: E731
    roofline = roofline_consts(model if resolved.config.latency.model == "roofline" else None,
                               st.max_step_tokens)
    if st.settings.instance_rows:  # each pool's constants whole
        # a blackbox row among roofline ones holds a roofline row's constants (unread)
        runs = [r for r in rows.resolved if r.config.latency.model == "roofline"]
        roofline = _stacked_rows(rows.resolved, lambda r: roofline_consts(
            make_latency_model(r if any(r is x for x in runs) else runs[0])
            if st.settings.latency_model == "roofline" else None, st.max_step_tokens))
    elif st.settings.gpus and st.settings.latency_model == "roofline":  # the GPU's rates per row
        rates = [make_latency_model(r).rates for r in rows.resolved]
        roofline = roofline._replace(**{name: jax.device_put(np.array(
            [float(getattr(x, name)) for x in rates], np.float64))
            for name in ("prefill_flops", "decode_flops", "bandwidth")})
    physics = physics_consts(model if st.settings.latency_model == "physics" else None,
                             st.max_step_tokens, st.shapes.queue_slots)
    if (st.settings.instance_rows or st.settings.gpus) and st.settings.latency_model == "physics":
        # each row's model whole (a pool's, a GPU's)
        physics = _stacked_rows(rows.resolved, lambda r: physics_consts(
            make_latency_model(r), st.max_step_tokens, st.shapes.queue_slots))
    return WorkloadConsts(
        rows=jax.device_put(np.int32(n)),
        initial_rows=jax.device_put(np.int32(np.count_nonzero(~np.asarray(original.follow_up)))),
        horizon_us=jax.device_put(np.int64(horizon)),
        arrival_us=pad(workload.arrival_us, 0, i64, never=INT64_MAX),
        input_tokens=pad(inp, 1, i32), output_tokens=pad(out, 0, i32, np.zeros_like(out)),
        deadline_us=pad(dl, 0, i64),
        tenant=pad(workload.tenant, 0, i32), slo_class=pad(workload.slo_class, 0, i32),
        group=pad(workload.prefix_group, -1, i32), group_blocks=pad(gb, 0, i32),
        prefix_tokens=pad(np.where(np.asarray(workload.prefix_group) >= 0,
                                   np.asarray(workload.prefix_length, np.int64), 0), 0, i32),
        full_blocks=pad(full, 0, i32),
        own_base=pad(own_start - np.maximum(gb, shared), 0, i32),
        session=pad(original.session, -1, i32), session_blocks=pad(shared, 0, i32),
        session_tokens=pad(talk, 0, i32),
        reg_blocks=pad(np.maximum(full, shared), 0, i32),
        next_row=pad(next_round(original), -1, i32),
        think_us=pad(original.think_time_us, 0, i64),
        follow_up=pad(original.follow_up, False, bool),
        follow_start=jax.device_put(_follow_starts(original, st)),
        open_row=pad(_open_rows(original), False, bool),
        follow_up_budget=jax.device_put(np.int32(original.follow_up_budget)),
        max_events=jax.device_put(np.int64(st.shapes.max_events
                                                or events_bound(workload, horizon))),
        ext_base=pad(st.hash_slots + ext_start - full, 0, i32),
        queue_delay_us=jax.device_put(by_gpu([np.asarray(pad(q, 0, i64)) for q in rows.qdelay])),
        itl_offset=pad(itl_off, 0, i64),
        itl_end=pad(itl_end, 0, i64),
        deadline_order=jax.device_put(np.concatenate(
            [order, np.full(st.shapes.num_deadlines + 1 - order.size, -1)]).astype(i32)),
        step_prefill=jax.device_put(by_gpu(rows.step_prefill)),
        step_decode=jax.device_put(by_gpu(rows.step_decode)),
        gpu=jax.device_put(np.int32(hardware_code(resolved.config.hardware))),
        otp_us=jax.device_put(np.array(rows.otp_us, np.int64)),
        gpu_rows=jax.device_put(np.array(rows.codes, np.int32)),
        instance_row=jax.device_put(np.array(st.settings.instance_rows or (0,), np.int32)),
        pd_rank=pd_rank, pd_kv_bytes=pd_kv_bytes,
        one_e6=jax.device_put(np.float64(1e6)), one_e_6=jax.device_put(np.float64(1e-6)),
        kv_blocks_f=jax.device_put(
            np.array(st.settings.instance_kv_blocks, np.float64)
            if st.settings.instance_kv_blocks else np.float64(st.shapes.kv_blocks)),
        settings=jax.tree.map(jax.device_put, lane_settings(resolved.config)),
        roofline=roofline,
        physics=physics,
    )
