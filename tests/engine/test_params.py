"""Per-lane policy arrays: the JAX engine's knobs say what the configuration says."""

import dataclasses

import numpy as np

from blisjax.config import AdmissionConfig, PriorityConfig, RoutingConfig, ScorerWeight
from blisjax.config.codes import AdmissionPolicy, RoutingPolicy, Scorer, TieBreak
from blisjax.engine.params import params_from_config
from tests.reference.conftest import make_resolved


def test_unlisted_slo_classes_score_as_standard():
    # Classes missing from slo_class_scores score 3.0 (docs/semantics.md §5.5), "" included.
    cfg = make_resolved(priority=PriorityConfig(policy="slo-class",
                                                slo_class_scores={"critical": 1.0})).config
    p = params_from_config(cfg, ("",))
    np.testing.assert_array_equal(np.asarray(p.priority.class_score),
                                  [3.0, 1.0, 3.0, 3.0, 3.0, 3.0])


def test_tenant_tables_follow_the_workload_tenant_order():
    adm = AdmissionConfig(policy="tenant-quota", tenant_max_in_flight={"b": 2},
                          default_tenant_max_in_flight=7)
    pri = PriorityConfig(policy="tenant-priority", tenant_scores={"a": 1.5},
                         default_tenant_score=-2.0)
    cfg = make_resolved(admission=adm, priority=pri).config
    p = params_from_config(cfg, ("a", "b", "c"))
    np.testing.assert_array_equal(np.asarray(p.admission.tenant_quota), [7, 2, 7])
    np.testing.assert_array_equal(np.asarray(p.priority.tenant_score), [1.5, -2.0, -2.0])
    assert int(p.admission.policy) == AdmissionPolicy.TENANT_QUOTA


def test_scorers_keep_configuration_order_padded_with_minus_one():
    rt = RoutingConfig(policy="weighted", scorers=(ScorerWeight("load-balance", 1.0),
                                                   ScorerWeight("prefix-affinity", 2.0)))
    p = params_from_config(make_resolved(routing=rt).config, ("",))
    assert int(p.routing.policy) == RoutingPolicy.WEIGHTED
    pad = len(Scorer) - 2  # one slot per scorer the engine knows
    assert list(np.asarray(p.routing.scorer_order)) == [
        Scorer.LOAD_BALANCE, Scorer.PREFIX_AFFINITY, *[-1] * pad]
    # the weights over their sum, divided on the host as Python divides (1/3, 2/3)
    assert list(np.asarray(p.routing.scorer_weight)) == [1.0 / 3.0, 2.0 / 3.0, *[0.0] * pad]
    assert bool(p.routing.prefix_index_on)


def test_router_stream_is_blis_router_stream_of_the_seed():
    """The lane's tie-break state is Go's source seeded with seed XOR FNV-1a-64("router"):
    its first Int63 draws are those the reference's generator makes."""
    from blisjax.gorand import GoRand, GoSourceState, blis_subsystem_seed

    cfg = dataclasses.replace(make_resolved().config, seed=111)
    p = params_from_config(cfg, ("",))
    assert int(p.routing.tie_break) == TieBreak.BLIS_RANDOM
    words = tuple(int(w) for w in np.asarray(p.routing.router_rng))
    from_params = GoRand.from_state(GoSourceState(words, 0, 607 - 273))
    fresh = GoRand(blis_subsystem_seed(111, "router"))
    assert [from_params.int63() for _ in range(700)] == [fresh.int63() for _ in range(700)]


def test_cache_query_is_compiled_in_when_any_lane_lists_a_cache_scorer():
    """``for_lanes``: a lane listing precise-prefix-cache or no-hit-lru (whatever its routing
    policy: a search may switch it per generation) needs the cache query in the program."""
    from blisjax.engine.params import stack_params
    from blisjax.engine.static import build_static
    from blisjax.engine.static_lanes import for_lanes
    from tests.reference.conftest import make_workload

    plain = make_resolved(routing=RoutingConfig(policy="least-loaded"))
    st = build_static(plain, make_workload([dict(arrival=0, input=40, output=4)]))
    assert not st.features.cache_scorers
    lru = RoutingConfig(policy="round-robin", scorers=(ScorerWeight("no-hit-lru", 1.0),))
    lanes = [params_from_config(plain.config, ("",)),
             params_from_config(make_resolved(routing=lru).config, ("",))]
    assert for_lanes(st, stack_params(lanes)).features.cache_scorers
    assert for_lanes(st, stack_params(lanes[:1])) == st
