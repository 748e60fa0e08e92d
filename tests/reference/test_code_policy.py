"""Code policies (``blisjax.reference.code_policy``): functions in place of templates.

Expected results come from the templates themselves, an independent implementation of the
same decisions: a route-scores function of minus the load is least-loaded routing with the
lowest index winning ties, and a priority function of the SLO class's score is the
``slo-class`` template.
"""

from __future__ import annotations

import numpy as np
import pytest

from blisjax.config import PriorityConfig, RoutingConfig
from blisjax.reference import ClusterSimulator, CodePolicy, CodePolicyError
from tests.reference.conftest import make_resolved, make_workload

ROWS = [dict(arrival=3_000 * i, input=40 + 16 * (i % 5), output=5 + 7 * (i % 9),
             slo="critical" if i % 3 == 0 else "batch") for i in range(60)]


def _run(code=None, **cfg):
    return ClusterSimulator(make_resolved(**cfg), make_workload(ROWS), check_invariants=True,
                            code_policy=code).run()


def _same(a, b) -> None:
    for field in ("instance", "ttft_us", "e2e_us", "status"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_minus_load_is_least_loaded_routing():
    def least_load(request, instances):
        return [-(x.queue_depth + x.batch_size + x.in_flight) for x in instances]

    template = _run(instances=3, routing=RoutingConfig(policy="least-loaded",
                                                       tie_break="lowest-index"))
    code = _run(CodePolicy(route_scores=least_load), instances=3,
                routing=RoutingConfig(policy="round-robin"))
    _same(code, template)
    assert len(set(template.instance.tolist())) == 3


def test_class_scores_are_the_slo_class_priority():
    scores = {"critical": 4.0, "batch": -1.0}

    def by_class(request, now_us):
        assert not hasattr(request, "output_tokens")  # a scheduler cannot know it
        return scores[request.slo_class]

    kw = dict(instances=1, max_running=2, scheduler="priority-fcfs")
    template = _run(priority=PriorityConfig(policy="slo-class"), **kw)
    code = _run(CodePolicy(priority=by_class), **kw)
    _same(code, template)
    fcfs = _run(instances=1, max_running=2, scheduler="fcfs")
    assert not np.array_equal(template.ttft_us, fcfs.ttft_us)  # the order mattered


@pytest.mark.parametrize("code, message", [
    (CodePolicy(route_scores=lambda r, xs: [0.0]), "route_scores returned 1 scores for 2"),
    (CodePolicy(route_scores=lambda r, xs: [float("nan")] * len(xs)), "non-finite score"),
    (CodePolicy(route_scores=lambda r, xs: "ab"), "must return a list of numbers"),
    (CodePolicy(route_scores=lambda r, xs: 1 / 0), "route_scores raised ZeroDivisionError"),
    (CodePolicy(priority=lambda r, now: None), "priority must return a number"),
])
def test_invalid_decisions_stop_the_run(code, message):
    with pytest.raises(CodePolicyError, match=message):
        _run(code, instances=2, max_running=1, scheduler="priority-fcfs")


def test_traced_code_routing_names_the_function_and_its_scores():
    """A trace of a code policy's routing: the reason names the function and the scores are
    the function's, one per candidate."""
    from blisjax.trace import of_kind, simulate_traced

    def by_index(request, instances):
        return [float(x.index) for x in instances]

    _, trace = simulate_traced(make_resolved(instances=3), make_workload(ROWS[:5]),
                               code_policy=CodePolicy(route_scores=by_index))
    routing = of_kind(trace.lines(), "routing")
    assert [(r["reason"], r["chosen_instance"], r["scores"]) for r in routing] == [
        ("code:route_scores", 2, [0.0, 1.0, 2.0])] * 5
