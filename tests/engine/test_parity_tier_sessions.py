"""Closed-loop sessions with a CPU tier of the KV cache in both engines.

A follow-up's prompt starts with its conversation, which earlier rounds left in the GPU cache
or, once evicted there, in the CPU tier: the follow-up reloads it (``TieredKVCache``,
docs/semantics.md §3.8 and §8.5). The JAX engine names a block's content by a CPU key
(``engine.kvtier``); a conversation's block is the same content in every round that holds
it, whether it was a prompt block or an output block of the round before, so it has one key,
its session's hash slot. Two checks: the keys themselves against the reference's content
identity (``blisjax.blockhash``), for every block position of a small conversation workload;
and populations of random policies and tier sizes on random conversations, each lane equal
to its own reference run, tier counters included."""

from __future__ import annotations

import dataclasses
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.blockhash import content_code
from blisjax.config import AdmissionConfig
from blisjax.engine import params_from_config, simulate_population, stack_params
from blisjax.engine.consts import build_consts
from blisjax.engine.kvcache import content_key
from blisjax.engine.parity import first_divergence
from blisjax.engine.request_rows import engine_workload
from blisjax.engine.state import NIL
from blisjax.engine.static import build_static, build_static_shared
from blisjax.workload.sessions import content_tokens
from tests.engine.conftest import LARGE_PROGRAM_MAPPINGS, room_for_a_program
from tests.engine.test_parity import _random_policy_configs
from tests.engine.test_parity_sessions import _with_prefix_affinity, random_session_workload
from tests.engine.test_parity_tier_hypothesis import _reference_run
from tests.reference.conftest import make_resolved

BLOCK = 4


def _engine(quirks: bool):
    """Two instances of 26 GPU blocks of 4 tokens (conversations outgrow them), a 40-block
    CPU tier, 4 running requests, a 24-token budget, prompts past 80 tokens dropped."""
    return make_resolved(instances=2, block_size=BLOCK, kv_blocks=26, max_running=4,
                         max_tokens=24, threshold=0, cpu_blocks=40, max_model_len=80,
                         horizon_us=150_000, refresh_us=1500, alpha=(80.25, 0.75, 12.5),
                         quirks=quirks, thrash_window_us=20_000)


def test_a_blocks_cpu_key_names_its_content_as_the_reference_hashes_it():
    """For every full block a request can hold (aligned or not), equal JAX names (CPU key,
    shift) iff equal reference content codes: a conversation's tokens have one name in every
    round (an output block of one round is a prompt block of the next; tokens off the block
    positions too), a round's own tokens one of their own."""
    base = _engine(quirks=False)
    w = random_session_workload(4, sessions=6, loose=3)
    st = build_static(base, w)
    c = build_consts(base, w, st)
    prompts = np.asarray(engine_workload(w, st.conversation_max_model_len,
                                         pd=st.features.pd).input_tokens)
    talk = content_tokens(w, prompts)
    rows, starts = [], []
    for r in range(w.num_requests):
        for first in range(int(prompts[r] + w.output_tokens[r]) - BLOCK + 1):
            rows.append(r)
            starts.append(first)
    rows_j = jnp.asarray(rows, jnp.int32)
    key = content_key(st, c, 0, rows_j, jnp.asarray(starts, jnp.int32),
                      jnp.full(len(rows), NIL, jnp.int32))
    ours = list(zip(np.asarray(key.true_key).tolist(), np.asarray(key.shift).tolist(),
                    strict=True))
    theirs = [content_code(r, int(w.prefix_group[r]), int(w.prefix_length[r]), first, BLOCK,
                           int(w.session[r]), int(talk[r]))
              for r, first in zip(rows, starts, strict=True)]
    by_ours: dict = {}
    by_theirs: dict = {}
    for a, b in zip(ours, theirs, strict=True):
        by_ours.setdefault(a, set()).add(b)
        by_theirs.setdefault(b, set()).add(a)
    assert all(len(v) == 1 for v in by_ours.values()), \
        [(k, v) for k, v in by_ours.items() if len(v) > 1][:5]
    assert all(len(v) == 1 for v in by_theirs.values()), \
        [(k, v) for k, v in by_theirs.items() if len(v) > 1][:5]
    # the workload has what the check is for: conversation blocks held by several rounds,
    # aligned and not
    shared = Counter(b for b in theirs if (b >> 62) == 0 or (b >> 60) & 0xF == 0xD)
    assert sum(n > 1 for n in shared.values()) >= 20


def _population(quirks: bool, seeds: tuple[int, ...]):
    """Lanes of random policies (always-admit in every other lane, prefix-affinity routing in
    every third) with their own tier sizes (none, 6, 16, 40 blocks) and transfer times, on
    conversations of ``seeds``; each lane against its reference run."""
    room_for_a_program(LARGE_PROGRAM_MAPPINGS)
    base = _engine(quirks)
    workloads = [random_session_workload(s, sessions=10) for s in seeds]
    rng = np.random.default_rng(0)
    configs = []
    for k, cfg in enumerate(_random_policy_configs(base.config, workloads[0].tenant_names, 8,
                                                   seed=11)):
        if k % 2:
            cfg = dataclasses.replace(cfg, policy=dataclasses.replace(
                cfg.policy, admission=AdmissionConfig(policy="always-admit")))
        if k % 3 == 0:
            cfg = _with_prefix_affinity(cfg)
        configs.append(dataclasses.replace(cfg, engine=dataclasses.replace(
            cfg.engine, kv_cpu_blocks=(0, 6, 16, 40)[k % 4],
            kv_transfer_bandwidth=float(rng.choice([0.5, 4.0, 100.0])),
            kv_transfer_base_latency_us=int(rng.integers(0, 300)))))
    params = stack_params([params_from_config(c, workloads[0].tenant_names) for c in configs])
    static = build_static_shared(base, workloads)
    tally: Counter = Counter()
    for w in workloads:
        lanes = simulate_population(base, w, params, static=static, lane_block=8)
        for k, (cfg, got) in enumerate(zip(configs, lanes, strict=True)):
            want, events = _reference_run(cfg, w)
            assert not got.overflow, (k, got.overflow)
            assert first_divergence(want, got, w.request_id) is None, (
                k, cfg.engine.kv_cpu_blocks, first_divergence(want, got, w.request_id))
            if want.kv_tier is None:
                continue
            for field in want.kv_tier._fields:
                assert np.array_equal(getattr(want.kv_tier, field),
                                      getattr(got.kv_tier, field)), (k, field)
            tally.update(events)
            tally["follow-up reloads"] += int(want.kv_tier.request_reloads[w.follow_up].sum())
            tally["thrashing"] += int(want.kv_tier.cpu_evictions.sum()) > 0
    return tally


def test_conversations_with_a_cpu_tier_match_reference():
    # BLIS's tiered allocation (--blis-quirks) also leaves blocks off their positions and
    # hashes off the chain
    tally = _population(quirks=True, seeds=(1, 3))
    # follow-ups reload their conversations from the CPU tier, tiers thrash
    assert tally["follow-up reloads"] >= 100 and tally["thrashing"] >= 4, tally
    assert tally["off-chain"] >= 2 and tally["misaligned"] >= 1, tally


@pytest.mark.slow
@pytest.mark.parametrize("quirks", [False, True])
def test_conversations_with_a_cpu_tier_match_reference_slow(quirks):
    tally = _population(quirks=quirks, seeds=(5, 6, 7, 8, 9))
    assert tally["follow-up reloads"] >= 200, tally
