"""Conversations from the workload spec (``reasoning.multi_turn``): generation, validation,
and a search population over a generated multi-turn workload in the JAX engine equal to the
reference (blisjax.workload.sessions, docs/configuration.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blisjax.config import load_config, resolve_config
from blisjax.engine.parity import first_divergence
from blisjax.engine.population import evaluate_population
from blisjax.reference import simulate as reference
from blisjax.workload.generate import generate_workload
from blisjax.workload.sessions import prompt_tokens
from blisjax.workload.spec import parse_workload_spec
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US
from tests.paths import GOLDEN_NEXT_DIR, REPO


def _spec(**turns):
    return {"version": "2", "seed": 3, "aggregate_rate": 10, "num_requests": 12,
            "clients": [
                {"id": "chat", "tenant_id": "t", "arrival": {"process": "poisson"},
                 "input_distribution": {"type": "constant", "params": {"value": 20}},
                 "output_distribution": {"type": "constant", "params": {"value": 5}},
                 "timeout": 7000,
                 "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 1500,
                                              **turns}}},
                {"id": "plain", "tenant_id": "t", "arrival": {"process": "poisson"},
                 "input_distribution": {"type": "constant", "params": {"value": 30}},
                 "output_distribution": {"type": "constant", "params": {"value": 4}}}]}


def test_each_request_of_a_multi_turn_client_starts_a_conversation():
    w = generate_workload(parse_workload_spec(_spec(context_growth="accumulate")))
    chat = w.client_names.index("chat")
    heads = np.flatnonzero(~w.follow_up & (w.client == chat))
    assert w.has_sessions and w.session_accumulate
    assert len(w.session_names) == heads.size  # one conversation per round-0 request
    assert int(w.follow_up.sum()) == 2 * heads.size  # rounds 1 and 2 of each
    assert (w.arrival_us[w.follow_up] == FOLLOW_UP_ARRIVAL_US).all()
    assert (w.think_time_us[w.follow_up] == 1500).all()
    assert (w.deadline_us[w.follow_up] == 7000).all()  # the client's timeout, from arrival
    assert (w.session[w.client != chat] == -1).all()
    # constant lengths: prompts 20; 20 + 4 + 20 = 44; 44 + 4 + 20 = 68
    first = np.flatnonzero(w.session == 0)
    assert prompt_tokens(w, 0)[first].tolist() == [20, 44, 68]


def test_conversations_are_deterministic_and_do_not_move_other_requests():
    spec = parse_workload_spec(_spec())
    a, b = generate_workload(spec), generate_workload(spec)
    assert a.content_equal(b)
    single = dict(_spec())
    single["clients"] = [dict(single["clients"][0], reasoning=None), single["clients"][1]]
    plain = generate_workload(parse_workload_spec(single))
    n = plain.num_requests
    assert np.array_equal(a.arrival_us[:n], plain.arrival_us)  # round 0s as without turns
    assert np.array_equal(a.input_tokens[:n], plain.input_tokens)


@pytest.mark.parametrize(("turns", "field"), [
    ({"max_rounds": 0}, "max_rounds"), ({"think_time_us": -1}, "think_time_us"),
    ({"context_growth": "sliding"}, "context_growth"), ({"rounds": 2}, "rounds")])
def test_bad_multi_turn_settings_name_the_field(turns, field):
    with pytest.raises(ValueError, match=rf"clients\[0\]\.reasoning\.multi_turn.*{field}"):
        parse_workload_spec(_spec(**turns))


def test_reasoning_tokens_and_mixed_context_growth_are_refused():
    spec = _spec()
    spec["clients"][0]["reasoning"]["reason_ratio_distribution"] = {
        "type": "gaussian", "params": {"mean": 0.3, "std_dev": 0.1, "min": 0, "max": 1}}
    with pytest.raises(ValueError, match="reason_ratio_distribution"):
        parse_workload_spec(spec)
    mixed = _spec(context_growth="accumulate")
    mixed["clients"][1]["reasoning"] = {"multi_turn": {"max_rounds": 2}}
    with pytest.raises(ValueError, match="context_growth"):
        parse_workload_spec(mixed)


def test_blis_session_spec_is_read():
    spec = parse_workload_spec(GOLDEN_NEXT_DIR / "sessions_chat.workload.yaml")
    turns = spec.clients[0].multi_turn
    assert (turns.max_rounds, turns.think_time_us, turns.context_growth) == (
        4, 800_000, "accumulate")


def test_a_search_population_over_conversations_matches_the_reference():
    """configs/search/sessions.yaml at 40 conversations, four router weightings in one
    compiled call, each lane equal to its reference run."""
    cfg = load_config(REPO / "configs/search/sessions.yaml")
    cfg = dataclasses.replace(cfg, workload={**cfg.workload, "num_requests": 40})
    resolved = resolve_config(cfg)
    workload = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    knobs = [{"routing.scorers.precise-prefix-cache": w, "routing.scorers.queue-depth": 1.0}
             for w in (0.0, 0.5, 3.0, 50.0)]
    evaluated = evaluate_population(resolved, workload, knobs)
    hits = []
    for config, got in zip(evaluated.configs, evaluated.results, strict=True):
        want = reference(dataclasses.replace(resolved, config=config), workload)
        assert first_divergence(want, got, workload.request_id) is None
        hits.append(float(np.sum(want.cache_hits)))
    assert hits[0] < min(hits[1:])  # the cache scorer brings rounds back to their history
    assert evaluated.metrics[0]["sessions"]["sessions"] == 40
