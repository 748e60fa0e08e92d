"""Policy programs as the search adapters' candidates: GEPA's program components and
OpenEvolve's programs files are parsed by the program grammar, scored as lanes of one JAX
population call per case, and a bad program scores 0 with the grammar's message.

Expected values: configurations written out by hand here, and plain reference-engine runs of
them (``blisjax.reference.simulate``); every JAX run shares one compile shape (the tiny
experiment, seed 7, 4 lanes, a routing program).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from blisjax.cli import main
from blisjax.config import ConfigError, SimConfig, load_config, resolve_config
from blisjax.metrics import aggregate_metrics
from blisjax.reference import simulate
from blisjax.workload import generate_workload, parse_workload_spec
from search.adapters import openevolve_evaluator as oe
from search.adapters.core import (
    WorkloadCase,
    candidate_config,
    evaluate_candidates,
    policy_knobs,
    program_candidate,
)
from search.expr import flatten_metrics
from tests.search.conftest import TINY_CONFIG

#: Routing programs of the tiny experiment (two instances, a prefix group per tenant).
AFFINITY = "score_prefix_affinity - 0.1 * queue_depth"
CACHED = "cached_blocks - w * in_flight"
LEAST = "-in_flight"


def with_program(config: SimConfig, site: str, program: str, **params: float) -> SimConfig:
    """``config`` with ``site``'s policy the program ``program`` and ``params``."""
    section = dataclasses.replace(getattr(config.policy, site), policy="program",
                                  program=program, params=tuple(params.items()))
    return dataclasses.replace(config, policy=dataclasses.replace(config.policy,
                                                                  **{site: section}))


def reference_metrics(config: SimConfig, seed: int, requests: int | None = None
                      ) -> dict[str, float]:
    """Flattened metrics of a plain reference-engine run (the first ``requests`` requests)."""
    workload = generate_workload(parse_workload_spec(config.workload), seed=seed)
    if requests is not None:
        workload = workload.head(requests)
    result = simulate(resolve_config(config), workload)
    return flatten_metrics(aggregate_metrics(result, workload, config.metrics,
                                             scheduler=config.policy.scheduler.policy))


@pytest.fixture
def population_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[dict]]:
    """Every JAX population call's knob sets (the real call still runs)."""
    import blisjax.engine.population as population

    calls: list[list[dict]] = []
    real = population.evaluate_population

    def recording(resolved, workload, knob_sets, *args, **kwargs):
        calls.append([dict(k) for k in knob_sets])
        return real(resolved, workload, knob_sets, *args, **kwargs)

    monkeypatch.setattr(population, "evaluate_population", recording)
    return calls


# ---- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, program, params", [
    (AFFINITY, AFFINITY, ()),
    (f"program: {CACHED}\nparams: {{w: 2}}\n", CACHED, (("w", 2.0),)),
    (f"```\n{LEAST}\n```", LEAST, ()),
    ("routing:\n  tree:\n    if: kv_utilization > 0.8\n    then: -in_flight\n"
     "    else: cached_blocks\n", "-in_flight if kv_utilization > 0.8 else cached_blocks", ()),
], ids=["expression", "yaml-params", "fenced", "tree"])
def test_a_program_component_sets_the_site_and_its_knobs(text, program, params):
    config = load_config(TINY_CONFIG)
    cfg = candidate_config(config, {"routing.program": text})
    routing = cfg.policy.routing
    assert (routing.policy, routing.program, routing.params) == ("program", program, params)
    assert cfg.policy.routing.scorers == config.policy.routing.scorers  # the rest kept
    knobs = {"routing.policy": "program", "routing.program": program}
    knobs.update({f"routing.params.{k}": v for k, v in params})
    assert policy_knobs(config, cfg) == knobs


def test_a_program_section_is_a_set_of_knobs_too():
    config = load_config(TINY_CONFIG)
    section = f"routing:\n  policy: program\n  program: {CACHED}\n  params: {{w: 0.5}}\n"
    cfg = candidate_config(config, {"routing": section})
    assert cfg == with_program(config, "routing", CACHED, w=0.5)
    assert policy_knobs(config, cfg) == {"routing.policy": "program",
                                         "routing.program": CACHED, "routing.params.w": 0.5}
    # a changed parameter of the experiment's own program is its one knob
    assert policy_knobs(cfg, with_program(config, "routing", CACHED, w=3.0)) == \
        {"routing.params.w": 3.0}


@pytest.mark.parametrize("component, text, fragments", [
    ("routing.program", "sqrt(queue_depth)", ("candidate.routing.program", "'sqrt'")),
    ("routing.program", "queue_lenght + 1", ("candidate.routing.program", "'queue_lenght'")),
    ("admission.program", "queue_depth < 4", ("candidate.admission.program", "'queue_depth'",
                                              "cannot be read by the admission program")),
    ("priority.program", "age_ms +", ("candidate.priority.program", "does not parse")),
    ("routing.program", "program: w * in_flight\nparams: {w: x}\n",
     ("candidate.routing.params.w", "finite number")),
    ("routing.program", "program: in_flight\nweights: 1\n",
     ("candidate.routing.program", "unknown key(s) weights")),
    ("routing.program", "  ", ("candidate.routing.program", "is empty")),
    ("queue.program", "1", ("unknown component(s) queue.program",)),
], ids=["function", "unknown-name", "wrong-site", "syntax", "bad-param", "bad-key", "empty",
        "no-site"])
def test_a_bad_program_names_the_problem(component, text, fragments):
    with pytest.raises(ConfigError) as error:
        candidate_config(load_config(TINY_CONFIG), {component: text})
    for fragment in fragments:
        assert fragment in str(error.value)


def test_a_site_takes_a_section_or_a_program_not_both():
    with pytest.raises(ConfigError, match="candidate.routing.program: the candidate has a "
                                          "routing section too"):
        candidate_config(load_config(TINY_CONFIG), {"routing": "routing: {policy: weighted}",
                                                    "routing.program": LEAST})


def test_programs_files_and_python_files_are_told_apart():
    source = (f"# EVOLVE-BLOCK-START\nrouting:\n  program: {CACHED}\n  params: {{w: 2}}\n"
              "admission: slo_class_rank < 3\npriority: 1\n# EVOLVE-BLOCK-END\n")
    candidate = oe.programs_candidate(source)
    assert set(candidate) == {"routing.program", "admission.program", "priority.program"}
    cfg = candidate_config(load_config(TINY_CONFIG), candidate)
    assert (cfg.policy.routing.program, cfg.policy.routing.params) == (CACHED, (("w", 2.0),))
    assert (cfg.policy.admission.policy, cfg.policy.admission.program) == \
        ("program", "slo_class_rank < 3")
    assert (cfg.policy.priority.policy, cfg.policy.priority.program) == ("program", "1")
    assert program_candidate({"routing": {"program": CACHED, "params": {"w": 2}}}) == \
        {"routing.program": f"program: {CACHED}\nparams:\n  w: 2\n"}
    python = "def route_scores(request, instances):\n    return [0.0 for i in instances]\n"
    assert oe.programs_candidate(python) is None
    assert oe.programs_candidate(source, "code") is None
    with pytest.raises(ConfigError, match="programs: must be a YAML mapping of sites"):
        oe.programs_candidate(python, "programs")
    with pytest.raises(ConfigError, match="unknown site.s. scheduler"):
        oe.programs_candidate("routing: -in_flight\nscheduler: fcfs\n")
    with pytest.raises(ConfigError, match="programs.routing: must be an expression"):
        oe.programs_candidate("routing: [1, 2]\n")


# ---- GEPA: a batch of programs is one population call ----------------------------------------


def test_gepa_scores_a_batch_of_programs_in_one_jax_call(population_calls):
    pytest.importorskip("gepa")
    from search.adapters.gepa_adapter import BlisjaxGEPAAdapter, load_cases

    (case,) = load_cases([TINY_CONFIG], [7])
    candidates = [
        program_candidate({"routing": AFFINITY}),
        program_candidate({"routing": {"program": CACHED, "params": {"w": 2.0}}}),
        {"routing": f"routing:\n  policy: program\n  program: {LEAST}\n"},
        program_candidate({"routing": "sqrt(in_flight)"}),
    ]
    adapter = BlisjaxGEPAAdapter(objective="fitness", engine="auto")
    results = adapter.batch_evaluate([(c, [case]) for c in candidates])

    (call,) = population_calls  # one case: one population call for every valid program
    assert [k["routing.program"] for k in call] == [AFFINITY, CACHED, LEAST, AFFINITY]
    assert call[1]["routing.params.w"] == 2.0
    config = load_config(TINY_CONFIG)
    expected = [reference_metrics(with_program(config, "routing", AFFINITY), 7),
                reference_metrics(with_program(config, "routing", CACHED, w=2.0), 7),
                reference_metrics(with_program(config, "routing", LEAST), 7)]
    for result, want in zip(results[:3], expected, strict=True):
        assert result.outputs[0]["engine"] == "jax"
        assert result.scores == [want["fitness"]]
        assert result.outputs[0]["metrics"]["ttft_p99_ms"] == want["ttft_p99_ms"]

    bad = results[3]
    assert bad.scores == [0.0] and bad.outputs[0]["engine"] is None
    assert "function 'sqrt' is not allowed" in bad.outputs[0]["error"]
    records = adapter.make_reflective_dataset(candidates[3], bad, ["routing.program"])
    (record,) = records["routing.program"]
    assert record["Inputs"]["current routing program"] == "sqrt(in_flight)"
    assert "The candidate is not a valid policy: candidate.routing.program: function " \
           "'sqrt' is not allowed" in record["Feedback"]
    assert "The routing.program component is a policy program" in record["Feedback"]
    assert "- cached_blocks (blocks):" in record["Feedback"]


def test_program_feedback_is_a_traced_reference_run():
    pytest.importorskip("gepa")
    from search.adapters.gepa_adapter import BlisjaxGEPAAdapter, load_cases

    cases = load_cases([TINY_CONFIG], [7])
    candidate = program_candidate({"routing": LEAST})
    adapter = BlisjaxGEPAAdapter(objective="fitness", engine="reference")
    result = adapter.evaluate(cases, candidate, capture_traces=True)
    want = reference_metrics(with_program(load_config(TINY_CONFIG), "routing", LEAST), 7)
    assert result.scores == [want["fitness"]]
    (record,) = adapter.make_reflective_dataset(candidate, result,
                                                ["routing.program"])["routing.program"]
    assert "# Reflection on a traced run" in record["Feedback"]


def test_admission_and_priority_programs_on_a_cut_workload():
    config = load_config(TINY_CONFIG)
    case = WorkloadCase("tiny@seed7", config, 7, requests=12)
    candidate = program_candidate({"admission": "slo_class_rank < 1",
                                   "priority": "-input_tokens"})
    (outcome,), = evaluate_candidates([candidate], [case], "fitness", "reference")
    cfg = with_program(with_program(config, "admission", "slo_class_rank < 1"),
                       "priority", "-input_tokens")
    want = reference_metrics(cfg, 7, requests=12)
    assert outcome.engine == "reference" and outcome.score == want["fitness"]
    # the first 12 requests: the admitted (critical, rank 0) and the rejected (standard)
    assert outcome.metrics["injected_requests"] + outcome.metrics["rejected_requests"] == 12
    assert outcome.metrics["rejected_requests"] == want["rejected_requests"] > 0


# ---- OpenEvolve: programs files --------------------------------------------------------------


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny experiment on its own seed; every variable first set (empty = unset) through
    monkeypatch, which restores them after the test."""
    for var in oe.ENV.values():
        monkeypatch.setenv(var, "")
    oe.configure(TINY_CONFIG, seeds=[7])


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_openevolve_scores_programs_files_in_one_jax_call(tmp_path, settings, population_calls):
    pytest.importorskip("openevolve")
    paths = [write(tmp_path, "a.yaml", f"routing: {AFFINITY}\n"),
             write(tmp_path, "b.yaml", f"routing:\n  program: {CACHED}\n  params: {{w: 2}}\n"),
             write(tmp_path, "bad.yaml", "routing: in_flight ** 2\n"),
             write(tmp_path, "code.py", "def route_scores(request, instances):\n"
                                        "    return [-float(i.in_flight) for i in instances]\n")]
    results = oe.evaluate_batch(paths, stage=2)

    (call,) = population_calls
    assert [k["routing.program"] for k in call] == [AFFINITY, CACHED, AFFINITY, AFFINITY]
    config = load_config(TINY_CONFIG)
    for result, cfg in zip(results[:2], [with_program(config, "routing", AFFINITY),
                                         with_program(config, "routing", CACHED, w=2.0)],
                           strict=True):
        want = reference_metrics(cfg, 7)
        assert result.metrics["combined_score"] == want["slo_attainment"]
        assert result.metrics["objective_seed_7"] == want["slo_attainment"]
        assert result.metrics["ttft_p99_ms"] == want["ttft_p99_ms"]
        assert "## Outcome" in result.artifacts["summary"] and "error" not in result.artifacts
    bad = results[2]
    assert bad.metrics == {"combined_score": 0.0}
    assert bad.artifacts["error"].startswith("invalid_policy: candidate.routing.program: ")
    # the Python file still runs in the sandbox (least in-flight, lowest index on ties)
    assert "error" not in results[3].artifacts and results[3].metrics["combined_score"] > 0


def test_openevolve_stage1_cuts_the_workload(tmp_path, settings):
    pytest.importorskip("openevolve")
    oe.configure(stage1_requests=10, engine="reference")
    path = write(tmp_path, "p.yaml", f"routing: {LEAST}\npriority: age_ms\n")
    result = oe.evaluate_stage1(path)
    cfg = with_program(with_program(load_config(TINY_CONFIG), "routing", LEAST),
                       "priority", "age_ms")
    want = reference_metrics(cfg, 7, requests=10)["slo_attainment"]
    assert result.metrics["stage1_objective"] == want
    assert result.metrics["combined_score"] == want
    assert "error" not in result.artifacts


def test_openevolve_evaluate_command_reads_a_programs_file(tmp_path, capsys):
    path = write(tmp_path, "p.yaml", f"routing: {LEAST}\n")
    code = main(["openevolve-evaluate", path, "--config", str(TINY_CONFIG), "--seeds", "7",
                 "--engine", "reference", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    want = reference_metrics(with_program(load_config(TINY_CONFIG), "routing", LEAST), 7)
    assert report["error"] is None
    assert report["metrics"]["combined_score"] == want["slo_attainment"]
    write(tmp_path, "p.yaml", "routing: queue_depth +\n")
    assert main(["openevolve-evaluate", path, "--config", str(TINY_CONFIG), "--seeds", "7",
                 "--kind", "programs", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metrics"]["combined_score"] == 0.0
    assert report["error"].startswith("invalid_policy: candidate.routing.program: does not "
                                      "parse")
