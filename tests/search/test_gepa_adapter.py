"""GEPA's adapter over blisjax (search.adapters.gepa_adapter): a full offline GEPA run on the
prefix-affinity scenario, batched evaluation against sequential evaluation, the failure path,
the policy-bundle evaluation of the command line, and the example's offline run.

Expected values come from plain reference-engine runs (``blisjax.reference.simulate`` +
``aggregate_metrics``) of configurations built here, or from the scenario's known answer
(affinity-pinned routing meets every TTFT target on these seeds).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import yaml

gepa = pytest.importorskip("gepa")

from blisjax.config import (  # noqa: E402
    ScorerWeight,
    SimConfig,
    SLOTarget,
    load_config,
    resolve_config,
)
from blisjax.metrics import aggregate_metrics  # noqa: E402
from blisjax.reference import simulate  # noqa: E402
from blisjax.workload import generate_workload, parse_workload_spec  # noqa: E402
from search.adapters.core import WorkloadCase, seed_candidate  # noqa: E402
from search.adapters.gepa_adapter import (  # noqa: E402
    REFLECTION_PROMPT,
    BlisjaxGEPAAdapter,
    gepa_evaluate,
    load_cases,
)
from search.expr import flatten_metrics  # noqa: E402
from tests.search.conftest import TINY_CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "configs" / "search" / "prefix-affinity.yaml"
EXAMPLE = ROOT / "examples" / "gepa_optimize.py"
#: The scenario's answer: prefix affinity above the load weight, load weight > 0.
AFFINITY_ROUTING = """routing:
  policy: weighted
  scorers:
  - name: prefix-affinity
    weight: 3.0
  - name: load-balance
    weight: 1.0
  tie_break: lowest-index
"""
SWAPPED_ROUTING = """routing:
  policy: weighted
  scorers:
  - {name: load-balance, weight: 1.0}
  - {name: prefix-affinity, weight: 3.0}
"""


# ---- independent expectations ----------------------------------------------------------------


def reference_metrics(config: SimConfig, seed: int) -> dict[str, float]:
    """Flattened metrics of a plain reference-engine run of ``config`` on workload ``seed``."""
    workload = generate_workload(parse_workload_spec(config.workload), seed=seed)
    result = simulate(resolve_config(config), workload)
    return flatten_metrics(aggregate_metrics(result, workload, config.metrics,
                                             scheduler=config.policy.scheduler.policy))


def with_routing(config: SimConfig, *scorers: tuple[str, float], **fields) -> SimConfig:
    routing = dataclasses.replace(config.policy.routing,
                                  scorers=tuple(ScorerWeight(n, w) for n, w in scorers), **fields)
    return dataclasses.replace(config, policy=dataclasses.replace(config.policy, routing=routing))


def with_scheduler(config: SimConfig, name: str) -> SimConfig:
    scheduler = dataclasses.replace(config.policy.scheduler, policy=name)
    return dataclasses.replace(config,
                               policy=dataclasses.replace(config.policy, scheduler=scheduler))


class Quiet:
    """GEPA's logger protocol, silenced."""

    def log(self, message: str) -> None:
        pass


# ---- a full offline GEPA run -----------------------------------------------------------------


class ScriptedLM:
    """A reflection LM with a script: an invalid section on its first call (the failure path),
    then the scenario's answer whenever GEPA asks about routing and the section unchanged
    otherwise. It records every prompt (for the determinism check)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        # REFLECTION_PROMPT shows the current section in its first ``` block.
        current = prompt.split("```\n", 1)[1].split("\n```", 1)[0]
        name = current.split(":", 1)[0].strip()
        if len(self.prompts) == 1:
            return f"A bold idea:\n```yaml\n{name}:\n  policy: no-such-policy\n```\n"
        if name == "routing":
            return f"Pin tenants by prefix.\n```yaml\n{AFFINITY_ROUTING}```"
        return f"```\n{current}\n```"


class ChildScores:
    """GEPA callback recording every proposed child's minibatch evaluation."""

    def __init__(self) -> None:
        self.children: list[tuple[list[float], list]] = []

    def on_evaluation_end(self, event) -> None:
        if event["candidate_idx"] is None:
            self.children.append((list(event["scores"]), list(event["trajectories"] or [])))


def run_gepa(train: list[WorkloadCase], val: list[WorkloadCase]):
    lm, children = ScriptedLM(), ChildScores()
    result = gepa.optimize(
        seed_candidate=seed_candidate(train[0].config), trainset=train, valset=val,
        adapter=BlisjaxGEPAAdapter(objective="slo_attainment", engine="reference"),
        reflection_lm=lm, reflection_prompt_template=REFLECTION_PROMPT,
        reflection_minibatch_size=len(train), max_metric_calls=22, seed=0, run_dir=None,
        logger=Quiet(), callbacks=[children], raise_on_exception=True)
    return result, lm, children


def test_gepa_optimize_finds_prefix_affinity_routing_deterministically():
    train = load_cases([SCENARIO], [1, 2])
    val = load_cases([SCENARIO], [1, 2, 3])
    result, lm, children = run_gepa(train, val)

    config = load_config(SCENARIO)
    seed_val = [reference_metrics(config, s)["slo_attainment"] for s in (1, 2, 3)]
    assert result.val_aggregate_scores[0] == pytest.approx(sum(seed_val) / 3, abs=1e-12)
    assert result.val_aggregate_scores[0] < 0.3
    best = result.best_candidate
    assert yaml.safe_load(best["routing"]) == yaml.safe_load(AFFINITY_ROUTING)
    assert result.val_aggregate_scores[result.best_idx] == 1.0  # the scenario's answer
    assert best["scheduler"] == seed_candidate(config)["scheduler"]

    # The scripted invalid section was scored 0 on both cases, with its validation message.
    failed = [(s, t) for s, t in children.children if s == [0.0, 0.0]]
    assert failed
    assert all("no-such-policy" in t.invalid for t in failed[0][1])
    assert len(lm.prompts) >= 3  # the invalid one, an unchanged one, the routing answer

    again, lm2, _ = run_gepa(train, val)
    assert again.candidates == result.candidates
    assert again.val_aggregate_scores == result.val_aggregate_scores
    assert again.val_subscores == result.val_subscores
    assert again.best_idx == result.best_idx
    assert lm2.prompts == lm.prompts  # identical reflective datasets and feedback


# ---- batch_evaluate against evaluate (one JAX compile shape) ---------------------------------


def tiny_cases() -> list[WorkloadCase]:
    """The tiny experiment and a stricter-SLO copy (metrics only: same compiled program), both
    on the config's own seed, so the JAX engine compiles once for 4 lanes."""
    config = load_config(TINY_CONFIG)
    strict = dataclasses.replace(config, metrics=dataclasses.replace(
        config.metrics, slo_targets=(("critical", SLOTarget(ttft_ms=12.0)),
                                     ("standard", SLOTarget(ttft_ms=15.0)))))
    return [WorkloadCase("tiny@seed7", config, config.seed),
            WorkloadCase("tiny-strict@seed7", strict, config.seed)]


def test_batch_evaluate_equals_sequential_evaluate():
    a, b = tiny_cases()
    seed = seed_candidate(a.config)
    affinity = dict(seed, routing=AFFINITY_ROUTING.replace("  tie_break: lowest-index\n", ""))
    sjf = dict(seed, scheduler="scheduler: sjf\n")
    swapped = dict(seed, routing=SWAPPED_ROUTING)  # not a set of knobs: the reference engine
    broken = dict(seed, routing="routing: [")
    # At most 3 knob candidates per case: every engine call is one 4-lane program.
    items = [(seed, [a, b]), (affinity, [a]), (sjf, [b, a]), (swapped, [a, b]), (broken, [b]),
             (seed, [a, a])]
    batched = BlisjaxGEPAAdapter(objective="fitness").batch_evaluate(items)
    sequential = BlisjaxGEPAAdapter(objective="fitness")
    assert batched == [sequential.evaluate(batch, cand, capture_traces=True)
                       for cand, batch in items]

    engines = [[o["engine"] for o in r.outputs] for r in batched]
    assert engines == [["jax", "jax"], ["jax"], ["jax", "jax"], ["reference", "reference"],
                       [None], ["jax", "jax"]]
    configs = {
        "seed": a.config,
        "affinity": with_routing(a.config, ("prefix-affinity", 3.0), ("load-balance", 1.0)),
        "sjf": with_scheduler(a.config, "sjf"),
        "swapped": with_routing(a.config, ("load-balance", 1.0), ("prefix-affinity", 3.0)),
    }

    def expected(name: str, case: WorkloadCase) -> float:
        cfg = dataclasses.replace(configs[name], metrics=case.config.metrics)
        return reference_metrics(cfg, case.seed)["fitness"]

    names = ["seed", "affinity", "sjf", "swapped"]
    for name, (_, batch), result in zip(names, items, batched, strict=False):
        assert result.scores == [expected(name, case) for case in batch]
    assert batched[4].scores == [0.0]
    assert batched[5].scores == [expected("seed", a)] * 2
    # the stricter case really is another case (its SLO attainment differs)
    assert batched[0].outputs[0]["metrics"]["slo_attainment"] != \
        batched[0].outputs[1]["metrics"]["slo_attainment"]
    assert all(not t.feedback.computed for r in batched[:4] for t in r.trajectories)


# ---- the failure path ------------------------------------------------------------------------


@pytest.mark.parametrize("routing,message", [
    ("routing: [", "is not valid YAML"),
    ("routing:\n  policy: weighted\n  scorers:\n  - {name: load-balance, weight: -1.0}\n",
     "weight"),
    ("routing:\n  policy: teleport\n", "teleport"),
])
def test_invalid_candidate_scores_zero_with_its_message(routing, message):
    cases = load_cases([TINY_CONFIG], [7])
    adapter = BlisjaxGEPAAdapter(objective="fitness", engine="reference")
    candidate = dict(seed_candidate(cases[0].config), routing=routing)
    result = adapter.evaluate(cases, candidate, capture_traces=True)
    assert result.scores == [0.0]
    assert result.objective_scores[0]["objective"] == 0.0
    assert result.objective_scores[0]["-ttft_p99_ms"] == -math.inf
    (trajectory,) = result.trajectories
    assert message in trajectory.invalid and trajectory.feedback is None
    assert message in result.outputs[0]["error"]
    dataset = adapter.make_reflective_dataset(candidate, result, ["routing", "scheduler"])
    assert set(dataset) == {"routing", "scheduler"}
    (record,) = dataset["routing"]
    assert message in record["Feedback"] and "not a valid policy" in record["Feedback"]
    assert "routing section controls" in record["Feedback"]
    assert record["Inputs"]["current routing section"] == routing
    assert record["Inputs"]["case"] == "tiny@seed7"
    assert adapter.make_reflective_dataset(candidate, result, ["routing"]) == \
        {"routing": dataset["routing"]}


def test_a_crashing_candidate_fails_alone_and_a_crashing_experiment_raises(monkeypatch):
    import search.adapters.gepa_adapter as module

    real = module.evaluate_candidates

    def crashing(candidates, cases, objective, engine):
        # A stand-in simulator bug: any candidate whose routing says "boom", or everything.
        if any("boom" in c.get("routing", "") or crash_all for c in candidates):
            raise RuntimeError("boom")
        return real(candidates, cases, objective, engine)

    monkeypatch.setattr(module, "evaluate_candidates", crashing)
    cases = load_cases([TINY_CONFIG], [7])
    seed = seed_candidate(cases[0].config)
    boom = dict(seed, routing="routing:\n  policy: round-robin\n# boom\n")
    adapter = BlisjaxGEPAAdapter(objective="fitness", engine="reference")
    crash_all = False
    ok, failed = adapter.batch_evaluate([(seed, cases), (boom, cases)])
    assert ok.scores == [reference_metrics(cases[0].config, 7)["fitness"]]
    assert failed.scores == [0.0]
    assert failed.outputs[0]["error"] == "the simulation failed: RuntimeError: boom"
    assert failed.trajectories[0].invalid is None  # a valid policy: its trace can be read
    crash_all = True
    with pytest.raises(RuntimeError, match="boom"):
        adapter.evaluate(cases, seed)


def test_reflective_dataset_traces_the_worst_cases_only():
    cases = load_cases([SCENARIO], [1, 2])
    adapter = BlisjaxGEPAAdapter(objective="slo_attainment", engine="reference",
                                 feedback_cases=1)
    candidate = seed_candidate(cases[0].config)
    result = adapter.evaluate(cases, candidate, capture_traces=True)
    expected = [reference_metrics(cases[0].config, s)["slo_attainment"] for s in (1, 2)]
    assert result.scores == expected
    records = adapter.make_reflective_dataset(candidate, result, ["routing"])["routing"]
    worst = min(range(2), key=lambda i: expected[i])
    assert "# Reflection on a traced run" in records[worst]["Feedback"]
    assert "# Reflection on a traced run" not in records[1 - worst]["Feedback"]
    assert "SLOs missed" in records[worst]["Feedback"]
    assert records[worst]["Generated Outputs"].startswith(
        f"SLO attainment {expected[worst]:.4g};")


# ---- the command line's evaluation and the example -------------------------------------------


def test_gepa_evaluate_scores_a_policy_bundle(tmp_path):
    bundle = tmp_path / "policy.yaml"
    bundle.write_text(AFFINITY_ROUTING + "scheduler: fcfs\n", encoding="utf-8")
    report = gepa_evaluate(bundle, [SCENARIO], [1, 3], objective="slo_attainment",
                           engine="reference")
    assert report.cases == ("prefix-affinity@seed1", "prefix-affinity@seed3")
    assert report.scores == (1.0, 1.0) and report.mean_score == 1.0
    assert report.engines == ("reference", "reference")
    assert set(report.candidate) == {"routing", "scheduler"}
    assert report.feedback_case == "prefix-affinity@seed1"
    assert "# Reflection on a traced run" in report.feedback

    bundle.write_text("scheduler: lifo\n", encoding="utf-8")
    report = gepa_evaluate(bundle, [SCENARIO], [1], objective="slo_attainment",
                           engine="reference")
    assert report.scores == (0.0,) and "lifo" in report.errors[0]
    assert report.feedback.startswith("The candidate is not a valid policy")


def test_example_offline_run():
    spec = importlib.util.spec_from_file_location("gepa_optimize_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    try:
        spec.loader.exec_module(example)
        outcome = example.main(["--offline", "--train-seeds", "1", "--val-seeds", "2",
                                "--max-metric-calls", "12"])
    finally:
        del sys.modules[spec.name]
    config = load_config(SCENARIO)
    assert outcome.seed_score == reference_metrics(config, 2)["slo_attainment"]
    assert outcome.best_score == 1.0
    assert "prefix-affinity" in outcome.best_candidate["routing"]
