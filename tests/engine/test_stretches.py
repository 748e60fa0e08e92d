"""Decode stretches (``blisjax.engine.stretch``): runs of plain decode steps advanced at once
must leave exactly what the reference engine's step-by-step run leaves.

The formulas are checked against brute-force step-by-step counts; the engine against
independent reference runs (blackbox, roofline and physics latency) of a scenario in which
every kind of stretch end occurs: arrivals joining a decoding instance (with physics, whose
queueing delay reads the instance's KV use and EMA mid-stretch), completions, KV shortfalls
(preemption, which moves the physics EMA), timeouts of running requests, the horizon, a
request finishing exactly at the length cap, and routing decisions that read KV use while
other instances are mid-stretch.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.config import (
    LatencyConfig,
    PriorityConfig,
    RoutingConfig,
    ScorerWeight,
    resolve_config,
)
from blisjax.engine import params_from_config, stack_params, stretch
from blisjax.engine.consts import build_consts
from blisjax.engine.parity import first_divergence
from blisjax.engine.run import lane_result, run_lanes
from blisjax.engine.static import VARYING_PLAN, build_static
from blisjax.metrics import records
from blisjax.reference import simulate as reference
from tests.engine.conftest import PHYSICS
from tests.reference.conftest import make_resolved, make_workload

# ---- the growth formulas, by brute force ------------------------------------------------------


def _fresh_blocks_by_step(spares, steps: int, block_size: int) -> list[int]:
    """Blocks taken at each of ``steps`` plain steps, simulated token by token: a request
    whose last block has s free positions fills it, then takes a block when it is full."""
    free = list(spares)
    taken = []
    for _ in range(steps):
        now = 0
        for j, f in enumerate(free):
            if f == 0:  # the token needs a fresh block; it holds this token
                now += 1
                free[j] = block_size - 1
            else:
                free[j] = f - 1
        taken.append(now)
    return taken


def _cum(spares, block_size):
    return jnp.asarray([sum(1 for x in spares if x <= v) for v in range(block_size)], jnp.int32)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_blocks_taken_and_block_steps_match_token_by_token_growth(block_size):
    rng = np.random.default_rng(block_size)
    for _ in range(20):
        running = int(rng.integers(1, 9))
        spares = [int(x) for x in rng.integers(0, block_size, running)]
        per_step = _fresh_blocks_by_step(spares, 5 * block_size + 3, block_size)
        through = np.cumsum([0, *per_step])  # blocks taken by the first k steps
        cum = _cum(spares, block_size)
        for k in range(len(through)):
            got = stretch.blocks_taken(cum, jnp.int32(running), jnp.int32(k), block_size)
            assert int(got) == through[k], (spares, k)
        for g in range(int(through[-1])):  # the g-th block is taken at the first step where
            want = int(np.argmax(through > g)) - 1  # more than g blocks have been taken
            got = stretch._block_step(cum, jnp.int32(running), jnp.int32(g), block_size)
            assert int(got) == want, (spares, g)


def test_steps_before_counts_step_starts_strictly_before_or_at_a_time():
    """Virtual steps start at t0, t0 + d, … (blackbox) or at planned times (roofline): those
    starting before (or at) a time, and the next real step's start."""
    constant = SimpleNamespace(stretch_times_vary=False)
    varying = SimpleNamespace(stretch_times_vary=True)
    plans = (((7,) * 5, 5), ((7,) * 5, 2), ((1,), 0), ((3, 4, 9, 1, 1, 30), 6),
             ((2, 2, 5), 1))
    times = [(*d, *(1,) * (VARYING_PLAN - len(d))) for d, _ in plans]
    s = SimpleNamespace(
        batch=SimpleNamespace(step_time=jnp.full(len(plans), 100, jnp.int64)),
        stretch=SimpleNamespace(d=jnp.asarray([d[0] for d, _ in plans], jnp.int64),
                                steps=jnp.asarray([k for _, k in plans], jnp.int32),
                                offset=jnp.asarray(np.cumsum([[0, *d] for d in times], axis=1))))
    for now in range(90, 170):
        for inclusive in (False, True):
            got = {st.stretch_times_vary: np.asarray(stretch._steps_before(
                s, st, jnp.asarray(now), inclusive)) for st in (constant, varying)}
            for i, (d, k) in enumerate(plans):
                step_starts = 100 + np.cumsum([0, *d])[:k]
                want = sum(1 for x in step_starts if (x <= now if inclusive else x < now))
                assert got[True][i] == want, (now, inclusive, i)
                if len(set(d)) == 1:  # a constant plan: both representations
                    assert got[False][i] == want, (now, inclusive, i)
    assert np.asarray(stretch.next_step_us(s, varying)).tolist() == [135, 114, 100, 148, 102]
    assert np.asarray(stretch.next_step_us(s, constant))[:3].tolist() == [135, 114, 100]


def test_a_pass_writes_its_steps_itl_entries_and_no_earlier_or_other_requests_entries():
    """A pass of kc steps writes each running request's entries first .. first + kc - 1
    (step k's time at entry first + k), leaves its entries before them and every other
    request's entries as they were, and writes nothing for a request that is not running:
    also at a request's last entries, for a request of fewer entries than a window, whose
    neighbour's entries follow its own, and for a pass longer than a window (several windows
    per request). A request's entries after the pass's are scratch: later steps write them."""
    from blisjax.engine.request_rows import ITL_WINDOW, itl_allotted

    out = np.array([3, 40, 20, 1])  # ITL counts 2, 39, 19, 0
    allotted = itl_allotted(out, pd=False)
    assert ITL_WINDOW == 16
    assert allotted.tolist() == [2 + 15, 39 + 15, 19 + 15, 16]  # 15 spare, at least a window
    end = np.cumsum(allotted)
    offset = end - allotted
    capacity = int(end[-1])
    st = SimpleNamespace(shapes=SimpleNamespace(itl_capacity=capacity),
                         settings=SimpleNamespace(block_size=16), stretch_times_vary=False,
                         tiered=False)
    assert stretch.chunk_steps(st) > 2 * ITL_WINDOW  # a long pass: several windows a request
    c = SimpleNamespace(itl_end=jnp.asarray(end, jnp.int64))
    # (kc, step times, [(request, its first entry of the pass, running)])
    passes = ((2, jnp.asarray(7, jnp.int32), [(2, 5, True), (1, 37, True), (0, 0, True),
                                              (3, 0, False)]),
              (16, jnp.arange(100, 116, dtype=jnp.int32), [(0, 0, False), (1, 20, True),
                                                           (2, 3, True), (1, 0, False)]),
              (37, jnp.asarray(9, jnp.int32), [(1, 2, True), (2, 0, False), (0, 0, False)]),
              (19, jnp.arange(200, 264, dtype=jnp.int32), [(2, 0, True), (1, 20, True),
                                                           (0, 0, False), (3, 0, False)]))
    for kc, itl, cases in passes:
        before = -1 - np.arange(capacity, dtype=np.int32)  # every entry distinct
        first = np.array([offset[r] + e for r, e, _ in cases])
        got = np.asarray(stretch._itl_windows(
            jnp.asarray(before), st, c, jnp.asarray([r for r, *_ in cases], jnp.int32),
            first=jnp.asarray(first, jnp.int64), valid=jnp.asarray([v for *_, v in cases]),
            kc=jnp.asarray(kc, jnp.int32), itl=itl))
        want = before.copy()
        scratch = np.zeros(capacity, bool)
        for (r, _, running), f in zip(cases, first, strict=True):
            if running:
                want[f:f + kc] = int(itl) if itl.ndim == 0 else np.asarray(itl[:kc])
                scratch[f + kc:end[r]] = True
        assert (got[~scratch] == want[~scratch]).all(), (kc, np.flatnonzero(got != want))


# ---- a scenario with every kind of stretch end ------------------------------------------------


def _rows(scale: float = 1.0, delay_us: int = 0):
    """Staggered arrivals of 30–82 output tokens on two instances of 48 blocks of 4 tokens (a
    running request's decode growth preempts others), a third sharing a prefix block (free
    cached blocks that decode growth reclaims), two with deadlines that fall mid-decode, and
    one of 100 + 20 tokens that finishes exactly at the 120-token length cap. ``scale``
    stretches every time for a model with longer steps; ``delay_us``, a model's queueing delay,
    moves the deadlines by as much."""
    rows = []
    for k in range(18):
        arrival = int((k * 6_000 + (k % 3) * 1_000) * scale)
        row = dict(arrival=arrival, input=12 + 5 * (k % 4),
                   output=30 + 13 * (k % 5), tenant="a", slo=("critical", "batch")[k % 2])
        if k % 3 == 0:
            row.update(group=0, prefix=8)
        if k in (4, 11):
            row["deadline"] = arrival + delay_us + int(45_000 * scale)
        rows.append(row)
    rows.append(dict(arrival=int(20_000 * scale), input=100, output=20, tenant="a"))
    return sorted(rows, key=lambda r: r["arrival"])


HORIZON_US = 150_000  # requests are still decoding when it falls
# Times of the roofline and physics scenarios (llama-3.1-8b on an H100: decode steps of ~3 ms
# and, with the latency-fitting sample's coefficients, ~6 ms, against the blackbox test
# model's ~1.8 ms), so that they keep every kind of stretch end
SCALE = {"blackbox": 1.0, "roofline": 2.0, "physics": 3.5}
def _policies(base):
    """Routing that reads KV use (kv-utilization, snapshots refreshed at every decision) or
    only counts, each with both preemption orders: 8 lanes, so the block also queues its
    completions' releases (``lanes.release_queued``)."""
    kv_weighted = RoutingConfig(policy="weighted", scorers=(
        ScorerWeight("kv-utilization", 2.0), ScorerWeight("queue-depth", 1.0)))
    kv_only = RoutingConfig(policy="weighted", scorers=(ScorerWeight("kv-utilization", 1.0),))
    out = []
    for routing in (kv_weighted, kv_only, RoutingConfig(policy="least-loaded"),
                    RoutingConfig(policy="round-robin")):
        for preemption in ("fcfs", "priority"):
            policy = dataclasses.replace(base.policy, routing=routing,
                                         priority=PriorityConfig(policy="slo-class"))
            engine = dataclasses.replace(base.engine, preemption_policy=preemption)
            out.append(dataclasses.replace(base, policy=policy, engine=engine))
    return out


def stretch_scenario(latency: str = "blackbox"):
    """(resolved configuration, workload, lane configurations): the ``_rows`` on two instances
    of 48 blocks of 4 tokens, 8 running requests and a 120-token length cap, the ``_policies``
    lanes; ``latency`` "roofline" or "physics" (``PHYSICS``): BLIS's default model and GPU,
    times scaled by ``SCALE``. (tests/engine/test_program_cache.py compiles the blackbox
    program first: one compile for both.)"""
    scale = SCALE[latency]
    resolved = make_resolved(instances=2, block_size=4, kv_blocks=48, max_running=8,
                             max_model_len=120, horizon_us=int(HORIZON_US * scale))
    if latency != "blackbox":
        model = LatencyConfig(model="roofline") if latency == "roofline" else PHYSICS
        resolved = resolve_config(dataclasses.replace(resolved.config, latency=model))
    delay_us = int(PHYSICS.alpha_coeffs[3]) if latency == "physics" else 0
    return (resolved, make_workload(_rows(scale, delay_us), ("a",), ("g",)),
            _policies(resolved.config))


@pytest.mark.parametrize("latency", ["blackbox", "roofline", "physics"])
def test_stretch_ends_of_every_kind_match_the_reference_step_by_step(latency):
    resolved, w, configs = stretch_scenario(latency)
    st = build_static(resolved, w, decode_stretches=True)
    assert st.stretches and st.stretch_times_vary == (latency != "blackbox")
    consts = build_consts(resolved, w, st)
    final = run_lanes(st, consts, stack_params([params_from_config(c, w.tenant_names)
                                                for c in configs]))
    for k, cfg in enumerate(configs):
        want = reference(dataclasses.replace(resolved, config=cfg), w)
        got = lane_result(st, consts, final, k)
        assert first_divergence(want, got) is None, k
        if k == 0:  # the scenario has what the docstring promises (in the reference run)
            assert want.preemption_count.sum() > 0
            assert want.still_running.sum() > 0  # the horizon cut running requests
            timed_out_running = (want.status == records.TIMED_OUT) & (want.ttft_us >= 0)
            assert timed_out_running.sum() == 2
            assert want.status[w.input_tokens == 100][0] == records.COMPLETED
    steps = np.asarray(final.stats.steps).sum(axis=1)
    stretched = np.asarray(final.run.stretched)
    # under this much preemption still over 40 % of the steps ran inside stretches, in
    # every lane (about 55 %; roofline 40–56 %, its plans at most VARYING_PLAN steps long);
    # without stretches none would
    assert np.all(stretched > (0.35 if st.stretch_times_vary else 0.4) * steps), (
        stretched, steps)


def test_decode_stretches_switch_is_checked_and_compiled_for_in_program_models():
    resolved = make_resolved()
    w = make_workload([dict(arrival=0, input=8, output=4)])
    assert build_static(resolved, w, decode_stretches=True).stretches
    assert not build_static(resolved, w, decode_stretches=False).stretches
    with pytest.raises(ValueError, match=r"^decode_stretches must be True, False or None "
                                         r"\(decided by the workload\), got 1$"):
        build_static(resolved, w, decode_stretches=1)
    # by default only where outputs are long enough to pay for planning (mean >= 128 tokens)
    assert not build_static(resolved, w).stretches
    rows = [dict(arrival=0, input=8, output=n) for n in (100, 156)]
    assert build_static(resolved, make_workload(rows)).stretches
    assert not build_static(resolved, make_workload(rows[:1])).stretches
    # a model evaluated on the host (physics, or roofline beyond the program's exact range)
    # has no stretches; roofline in the program has stretches whose step times vary
    assert not build_static(resolved, w).replace(latency=object()).stretches
    roofline = resolve_config(dataclasses.replace(resolved.config,
                                                  latency=LatencyConfig(model="roofline")))
    st = build_static(roofline, w, decode_stretches=True)
    assert st.stretches and st.stretch_times_vary and st.stretch_offset_slots == VARYING_PLAN + 1
    assert st.stretch_ema_slots == 0
    assert not build_static(resolved, w, decode_stretches=True).stretch_times_vary
    # physics in the program: times that vary, and the preemption EMA after each planned step
    physics = resolve_config(dataclasses.replace(resolved.config, latency=PHYSICS))
    st = build_static(physics, w, decode_stretches=True)
    assert st.stretches and st.stretch_times_vary and st.stretch_ema_slots == VARYING_PLAN + 1
    assert not build_static(physics, w, decode_stretches=False).stretch_ema_slots
