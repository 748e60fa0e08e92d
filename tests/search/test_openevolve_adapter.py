"""OpenEvolve integration: the sandbox's refusals and limits, the evaluator's scores against
plain reference runs, and an offline OpenEvolve run with a scripted LLM."""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("openevolve")

from openevolve.api import run_evolution  # noqa: E402
from openevolve.config import Config, LLMModelConfig  # noqa: E402
from openevolve.evaluation_result import EvaluationResult  # noqa: E402

from blisjax.config import load_config, resolve_config  # noqa: E402
from blisjax.metrics import aggregate_metrics  # noqa: E402
from blisjax.reference import ClusterSimulator, CodePolicy, simulate  # noqa: E402
from search.adapters import openevolve_evaluator as adapter  # noqa: E402
from search.adapters.core import candidate_config  # noqa: E402
from search.adapters.sandbox import Case, run_program  # noqa: E402
from search.adapters.sandbox.guard import _module_proxies  # noqa: E402
from search.evaluate import make_workload  # noqa: E402
from search.expr import flatten_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "configs" / "search" / "prefix-affinity.yaml"
INITIAL_CODE = ROOT / "examples" / "openevolve" / "initial_code_policy.py"
INITIAL_BUNDLE = ROOT / "examples" / "openevolve" / "initial_bundle_program.py"
LEAST_LOAD_LINE = ("    return [-float(i.queue_depth + i.batch_size + i.in_flight) "
                   "for i in instances]")


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario on seeds 1 and 2; ``configure`` writes the environment, so every variable
    is first set (empty = unset) through monkeypatch, which restores them after the test."""
    for var in adapter.ENV.values():
        monkeypatch.setenv(var, "")
    adapter.configure(SCENARIO, seeds=[1, 2], time_limit_s=60)


def evaluate(tmp_path: Path, source: str, stage: int = 1) -> EvaluationResult:
    path = tmp_path / "program.py"
    path.write_text(source, encoding="utf-8")
    result = (adapter.evaluate_stage1 if stage == 1 else adapter.evaluate_stage2)(str(path))
    assert isinstance(result, EvaluationResult)
    return result


def assert_failed(result: EvaluationResult, kind: str, *fragments: str) -> None:
    """A 0 score with the reason in the ``error`` artifact."""
    assert result.metrics["combined_score"] == 0.0
    error = result.artifacts["error"]
    assert error.startswith(f"{kind}: "), error
    for fragment in fragments:
        assert fragment in error, error


def slo_attainment(config, seed: int, code_policy: CodePolicy | None = None) -> float:
    """A plain in-process reference run's objective (the evaluator's default)."""
    workload = make_workload(config, seed)
    resolved = resolve_config(config)
    result = (simulate(resolved, workload) if code_policy is None
              else ClusterSimulator(resolved, workload, code_policy=code_policy).run())
    metrics = aggregate_metrics(result, workload, config.metrics,
                                scheduler=config.policy.scheduler.policy)
    return flatten_metrics(metrics)["slo_attainment"]


# ---- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("source, fragment", [
    ("import os\n", "'os'"),
    ("from subprocess import run\n", "'subprocess'"),
    ("import importlib\n", "'importlib'"),
    ("x = __import__('subprocess')\n", "__import__"),
    ("def route_scores(request, instances):\n    return open('/etc/passwd')\n", "open()"),
    ("def route_scores(request, instances):\n    return eval('[0.0, 0.0]')\n", "eval()"),
    ("import math\nroot = math.__loader__\n", "__loader__"),
    ("def route_scores(request, instances):\n    return [i.__class__ for i in instances]\n",
     "__class__"),
    ("import collections\ncollections.Counter.most_common = None\n", "setting attribute"),
    ("from collections import Counter\nCounter.most_common = None\n", "setting attribute"),
], ids=["import-os", "from-subprocess", "importlib", "dunder-import", "open", "eval",
        "dunder-attribute", "class-escape", "patch-module", "patch-class"])
def test_forbidden_constructs_are_scored_zero_with_the_reason(tmp_path, settings, source,
                                                              fragment):
    assert_failed(evaluate(tmp_path, source), "forbidden_import", fragment, "line ")


def test_forbidden_attribute_at_run_time_is_scored(tmp_path, settings):
    source = ("def route_scores(request, instances):\n"
              "    name = '__cla' + 'ss__'\n"
              "    return [0.0 if getattr(i, name) else 1.0 for i in instances]\n")
    assert_failed(evaluate(tmp_path, source), "forbidden_import", "'__class__'")


def test_module_proxies_hand_out_no_modules_and_no_string_evaluation():
    proxies = _module_proxies()
    for name, proxy in proxies.items():
        for attr, value in vars(proxy).items():
            assert not isinstance(value, types.ModuleType) or value in proxies.values(), (
                f"{name}.{attr}")
    assert not hasattr(proxies["typing"], "get_type_hints")
    assert not hasattr(proxies["collections"], "_sys")
    with pytest.raises(BaseException, match="__globals__"):
        proxies["operator"].attrgetter("__globals__")


# ---- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limits, fragment", [
    ({"time_limit_s": 30, "cpu_limit_s": 1}, "CPU time"),
    ({"time_limit_s": 3, "cpu_limit_s": 60}, "wall-time"),
], ids=["cpu", "wall"])
def test_runaway_loop_times_out(tmp_path, settings, limits, fragment):
    adapter.configure(**limits)
    source = ("def route_scores(request, instances):\n"
              "    while True:\n"
              "        pass\n")
    started = time.monotonic()
    result = evaluate(tmp_path, source)
    assert_failed(result, "timeout", fragment)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("source, kind, fragments", [
    ("def route_scores(request, instances):\n    return [1 / 0 for i in instances]\n",
     "crash", ("ZeroDivisionError", '"<policy program>", line 2')),
    ("raise RuntimeError('boom')\n", "crash", ("RuntimeError: boom",)),
    ("def route_scores(request, instances)\n    return []\n", "crash", ("does not parse",)),
    ("def route_scores(request, instances):\n    return [1.0]\n",
     "invalid_policy", ("returned 1 scores for 2 instances",)),
    ("def route_scores(request, instances):\n    return [float('nan') for i in instances]\n",
     "invalid_policy", ("non-finite",)),
    ("def policy():\n    return {'routing': {'policy': 'nope'}}\n",
     "invalid_policy", ("routing.policy", "'nope'")),
    ("def policy():\n    return ['routing']\n", "invalid_policy", ("dict",)),
    ("LIMIT = 3\n", "invalid_policy", ("route_scores",)),
    ("hoard = bytearray(300 * 2 ** 20)\n", "memory", ("memory",)),
], ids=["raises", "module-raises", "syntax", "wrong-length", "nan", "bad-section",
        "not-a-dict", "no-policy", "memory"])
def test_failing_programs_are_scored_zero_with_the_reason(tmp_path, settings, source, kind,
                                                          fragments):
    adapter.configure(memory_mb=64)  # 300 MiB would fit without the limit
    assert_failed(evaluate(tmp_path, source), kind, *fragments)


def test_same_program_same_result():
    # str hashes differ between processes unless the sandbox pins them
    source = ("def route_scores(request, instances):\n"
              "    home = hash(request.tenant) % len(instances)\n"
              "    return [1.0 if i.index == home else 0.0 for i in instances]\n")
    cases = [Case("head", 1, 50)]
    first, second = (run_program(source, SCENARIO, cases) for _ in range(2))
    assert first.error is None and first == second


# ---- scores ----------------------------------------------------------------------------------

CODE_POLICY = """\
def route_scores(request, instances):
    # a weak preference for cached prefixes: the score lands between the extremes
    return [0.1 * i.cached_blocks - (i.queue_depth + i.batch_size + i.in_flight)
            for i in instances]


def priority(request, now_us):
    return -request.input_tokens
"""


def weak_affinity(request, instances):
    """The test's own copy of CODE_POLICY's routing."""
    return [0.1 * i.cached_blocks - (i.queue_depth + i.batch_size + i.in_flight)
            for i in instances]


def test_code_policy_score_equals_a_plain_reference_run(tmp_path, settings):
    adapter.configure(holdout_seeds=[101])
    result = evaluate(tmp_path, CODE_POLICY, stage=2)
    config = load_config(SCENARIO)
    policy = CodePolicy(route_scores=weak_affinity, priority=lambda r, now: -r.input_tokens)
    expected = {seed: slo_attainment(config, seed, policy) for seed in (1, 2, 101)}
    assert 0.0 < min(expected.values()) and max(expected.values()) < 1.0
    m = result.metrics
    assert (m["objective_seed_1"], m["objective_seed_2"]) == (expected[1], expected[2])
    assert m["combined_score"] == (expected[1] + expected[2]) / 2
    assert m["holdout_objective"] == expected[101]
    summary = result.artifacts["summary"]
    assert "## Outcome" in summary and "route_scores" in summary
    assert "error" not in result.artifacts


def test_bundle_program_score_equals_a_plain_reference_run(tmp_path, settings):
    source = INITIAL_BUNDLE.read_text(encoding="utf-8").replace(
        '{"name": "prefix-affinity", "weight": 0.0}', '{"name": "prefix-affinity", "weight": 0.2}')
    result = evaluate(tmp_path, source, stage=2)
    config = load_config(SCENARIO)
    routing = {"policy": "weighted", "tie_break": "lowest-index",
               "scorers": [{"name": "prefix-affinity", "weight": 0.2},
                           {"name": "load-balance", "weight": 1.0}]}
    candidate = candidate_config(config, {"routing": yaml.safe_dump({"routing": routing})})
    expected = [slo_attainment(candidate, seed) for seed in (1, 2)]
    assert [result.metrics["objective_seed_1"], result.metrics["objective_seed_2"]] == expected
    assert result.metrics["combined_score"] == sum(expected) / 2


def test_cli_report_matches_the_stage_result(tmp_path):
    report = adapter.openevolve_evaluate(INITIAL_CODE, SCENARIO, seeds=[1], stage=1)
    config = load_config(SCENARIO)
    assert report.error is None and "## Outcome" in report.summary
    assert 0.0 < report.metrics["combined_score"] < 0.5  # the baseline fails stage 1 ...
    assert slo_attainment(config, 1) < 0.5  # ... and the whole workload
    with pytest.raises(ValueError, match="stage"):
        adapter.openevolve_evaluate(INITIAL_CODE, SCENARIO, stage=3)


# ---- an offline OpenEvolve run ---------------------------------------------------------------

#: The scripted LLM: least-load → prefix-aware routing (the winner), then a weaker variant.
RULES = (
    adapter.ScriptRule("8.0 * i.cached_blocks", """\
Maybe the cache weight is too strong.

<<<<<<< SEARCH
    return [8.0 * i.cached_blocks - float(i.queue_depth + i.batch_size + i.in_flight)
=======
    return [0.02 * i.cached_blocks - float(i.queue_depth + i.batch_size + i.in_flight)
>>>>>>> REPLACE
"""),
    adapter.ScriptRule(LEAST_LOAD_LINE.strip(), f"""\
Route each tenant to the instance that caches its prefix; break ties by load.

<<<<<<< SEARCH
{LEAST_LOAD_LINE}
=======
    return [8.0 * i.cached_blocks - float(i.queue_depth + i.batch_size + i.in_flight)
            for i in instances]
>>>>>>> REPLACE
"""),
)


def offline_config() -> Config:
    """One worker, one island, fixed seeds: a reproducible run."""
    config = Config()
    config.random_seed = 42
    config.log_level = "WARNING"
    config.checkpoint_interval = 1000
    config.database.num_islands = 1
    config.database.population_size = 20
    config.evaluator.parallel_evaluations = 1
    config.evaluator.max_retries = 0
    config.evaluator.timeout = 120
    config.evaluator.cascade_evaluation = True
    config.llm.models = [LLMModelConfig(
        name="scripted", init_client=functools.partial(adapter.scripted_client, RULES))]
    config.llm.evaluator_models = []
    return config


@contextlib.contextmanager
def openevolve_side_effects() -> Iterator[None]:
    """Undo what an OpenEvolve run leaves in the process: its SIGINT/SIGTERM handlers, the
    evaluation file's directory on ``sys.path`` (search/adapters/, whose modules would become
    top-level names) and the root logger's handlers."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    path = list(sys.path)
    root = logging.getLogger()
    log_handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.path[:] = path
        for handler in set(root.handlers) - set(log_handlers):
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_offline_openevolve_run_improves_and_is_deterministic(tmp_path, settings):
    initial = evaluate(tmp_path, INITIAL_CODE.read_text(encoding="utf-8"))
    runs = []
    for i in range(2):
        with openevolve_side_effects():
            runs.append(run_evolution(str(INITIAL_CODE), adapter.__file__,
                                      config=offline_config(), iterations=3,
                                      output_dir=str(tmp_path / f"run{i}"), cleanup=False))
    first, second = runs
    assert first.best_score > initial.metrics["combined_score"]
    assert first.best_score == 1.0
    assert "8.0 * i.cached_blocks" in first.best_code
    assert (second.best_score, second.best_code) == (first.best_score, first.best_code)
    assert second.metrics == first.metrics


def test_scripted_llm_reads_the_current_program():
    from openevolve.llm.base import LLMInterface

    llm = adapter.scripted_client(RULES, LLMModelConfig(name="scripted"))
    assert isinstance(llm, LLMInterface) and llm.model == "scripted"
    prompt = ("# Current Program\n```python\n" + LEAST_LOAD_LINE + "\n```\n"
              "# Other Programs\n```python\n8.0 * i.cached_blocks\n```\n")
    assert llm.reply(prompt) == RULES[1].reply
    assert llm.reply("# Current Program\n```python\npass\n```\n") == adapter.NO_CHANGE


def test_program_state_in_its_own_objects_is_allowed(tmp_path, settings):
    source = """\
import collections
from dataclasses import dataclass


@dataclass
class Seen:
    count: int = 0


seen = Seen()
per_tenant = collections.defaultdict(int)


def route_scores(request, instances):
    seen.count += 1
    per_tenant[request.tenant] += 1
    return [-float(i.queue_depth + i.batch_size + i.in_flight) for i in instances]
"""
    result = evaluate(tmp_path, source)
    assert "error" not in result.artifacts and result.metrics["combined_score"] > 0
