"""OpenEvolve's evaluation file for blisjax policy programs: give OpenEvolve this file's path.

OpenEvolve (``openevolve>=0.4``) evolves a Python program between ``# EVOLVE-BLOCK-START`` and
``# EVOLVE-BLOCK-END`` and scores each version by calling this module's functions with the
program's path. The program is a policy program of ``search.adapters.sandbox``: a *bundle
program* (``policy()`` returns policy-bundle sections) or a *code policy* (``route_scores`` /
``priority`` functions). Each evaluation runs it in the sandbox (a subprocess with wall-time,
CPU-time and memory limits and an import allowlist) and simulates it in the reference engine.

* ``evaluate_stage1(path)``: a cheap filter — the first ``stage1_requests`` requests of the
  first seed's workload;
* ``evaluate_stage2(path)`` (and ``evaluate(path)``, used without cascade evaluation): the
  whole workload on every configured seed, plus the held-out seeds.

Score. ``combined_score`` — what OpenEvolve ranks programs by and compares with its cascade
thresholds (0.5, 0.75, 0.9 by default) — is the objective normalised to [0, 1]:
``clip((objective − lo) / (hi − lo), 0, 1)`` with ``(lo, hi)`` = ``objective_range``, averaged
over the configured seeds. The default objective ``slo_attainment`` already lies in [0, 1]
(``lo, hi = 0, 1``), so a program passes stage 1 when at least half of the short workload's
requests meet their SLO. Held-out seeds are reported (``holdout_score``, ``holdout_objective``)
but not scored: scoring them would make them training seeds. A program that cannot run — a
forbidden import, a timeout, a crash, an invalid policy, too much memory — scores 0, with the
reason in the ``error`` artifact; nothing raises into OpenEvolve.

Artifacts (OpenEvolve shows them to the LLM in the next prompt): ``summary``, the decision-trace
text summary of the first case (``blisjax.trace.reflect``); ``error`` (``kind: message``) when
the program failed; ``program_output``, the tail of what the program printed, when it printed.

Settings come from environment variables — OpenEvolve's worker processes get the parent's
environment, so ``configure(...)`` (for in-process use) writes them too:

=====================================  =====================================================
``BLISJAX_OPENEVOLVE_CONFIG``          the experiment (YAML with a ``workload:`` section);
                                       required
``BLISJAX_OPENEVOLVE_SEEDS``           workload seeds, comma-separated (default: the
                                       experiment's ``seed``)
``BLISJAX_OPENEVOLVE_HOLDOUT_SEEDS``   held-out seeds for stage 2 (default: none)
``BLISJAX_OPENEVOLVE_OBJECTIVE``       ``search.expr`` objective, higher is better (default
                                       ``slo_attainment``)
``BLISJAX_OPENEVOLVE_OBJECTIVE_RANGE`` ``lo,hi``: the objective values scored 0 and 1
                                       (default ``0,1``)
``BLISJAX_OPENEVOLVE_TIME_LIMIT``      wall seconds per evaluation, sandbox start-up included
                                       (default 60; keep it below OpenEvolve's
                                       ``evaluator.timeout``)
``BLISJAX_OPENEVOLVE_CPU_LIMIT``       CPU seconds per evaluation (default: the time limit)
``BLISJAX_OPENEVOLVE_MEMORY_MB``       MiB the program and its simulations may use beyond
                                       the simulator's own (default 2048)
``BLISJAX_OPENEVOLVE_STAGE1_REQUESTS`` requests in stage 1's short workload (default 50)
``BLISJAX_OPENEVOLVE_KIND``            ``auto`` | ``bundle`` | ``code`` (default ``auto``)
``BLISJAX_OPENEVOLVE_SUMMARY_TOKENS``  approximate tokens of the summary (default 1500)
=====================================  =====================================================

``openevolve_evaluate`` scores one program file outside OpenEvolve (``blisjax
openevolve-evaluate``). ``ScriptedLLM`` / ``scripted_client`` are an offline LLM for
``LLMModelConfig.init_client``: deterministic replies chosen by the program being evolved (for
tests and ``examples/openevolve_run.py --offline``).

OpenEvolve loads this file after putting its directory on ``sys.path`` (for the rest of the
process), where its sibling modules become top-level names; they are named
(``openevolve_evaluator``, ``gepa_adapter``, ``core``, ``sandbox``) so that none shadows the
``openevolve`` or ``gepa`` package.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from search.adapters.sandbox import (
    PROGRAM_KINDS,
    Case,
    CaseResult,
    Limits,
    SandboxError,
    SandboxResult,
    SummarySpec,
    run_program,
)

__all__ = ["ENV", "OpenEvolveReport", "ScriptRule", "ScriptedLLM", "Settings", "configure",
           "current_program", "evaluate", "evaluate_stage1", "evaluate_stage2",
           "openevolve_evaluate", "scripted_client", "settings_from_env"]

logger = logging.getLogger(__name__)

#: Metrics reported by stage 2 besides the score (means over the configured seeds; latencies
#: in ms), so the LLM sees what moved.
REPORTED_METRICS = ("slo_attainment", "ttft_mean_ms", "ttft_p99_ms", "e2e_p99_ms",
                    "cache_hit_rate", "preemption_count", "completed_requests")


class Settings(NamedTuple):
    """What an evaluation simulates and how it is scored (see the module docstring)."""

    config_path: str | None = None
    seeds: tuple[int, ...] = ()  # () : the experiment's own seed
    holdout_seeds: tuple[int, ...] = ()
    objective: str = "slo_attainment"
    objective_range: tuple[float, float] = (0.0, 1.0)
    time_limit_s: float = 60.0
    cpu_limit_s: float | None = None  # None: time_limit_s
    memory_mb: int = 2048
    stage1_requests: int = 50
    kind: str = "auto"
    summary_tokens: int = 1500


#: The environment variable of each setting.
ENV = {"config_path": "BLISJAX_OPENEVOLVE_CONFIG", "seeds": "BLISJAX_OPENEVOLVE_SEEDS",
       "holdout_seeds": "BLISJAX_OPENEVOLVE_HOLDOUT_SEEDS",
       "objective": "BLISJAX_OPENEVOLVE_OBJECTIVE",
       "objective_range": "BLISJAX_OPENEVOLVE_OBJECTIVE_RANGE",
       "time_limit_s": "BLISJAX_OPENEVOLVE_TIME_LIMIT",
       "cpu_limit_s": "BLISJAX_OPENEVOLVE_CPU_LIMIT",
       "memory_mb": "BLISJAX_OPENEVOLVE_MEMORY_MB",
       "stage1_requests": "BLISJAX_OPENEVOLVE_STAGE1_REQUESTS",
       "kind": "BLISJAX_OPENEVOLVE_KIND", "summary_tokens": "BLISJAX_OPENEVOLVE_SUMMARY_TOKENS"}


class OpenEvolveReport(NamedTuple):
    """One evaluation outside OpenEvolve: the metrics OpenEvolve would get, the text summary
    ('' on error) and the error (``kind: message``; None on success)."""

    metrics: dict[str, float]
    summary: str
    error: str | None


class _Scored(NamedTuple):
    metrics: dict[str, float]
    artifacts: dict[str, str]


# ---- settings --------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _pair(text: str) -> tuple[float, float]:
    lo, hi = (float(x) for x in text.split(","))
    return lo, hi


_PARSE = {"config_path": str, "seeds": _ints, "holdout_seeds": _ints, "objective": str,
          "objective_range": _pair, "time_limit_s": float, "cpu_limit_s": float,
          "memory_mb": int, "stage1_requests": int, "kind": str, "summary_tokens": int}


def _env_text(name: str, value: Any) -> str:
    if name in ("seeds", "holdout_seeds", "objective_range"):
        return ",".join(str(x) for x in value)  # a float's str round-trips
    return str(value)


def _env_settings(environ: Mapping[str, str]) -> Settings:
    """The settings the environment variables give, unchecked (defaults for those unset)."""
    values: dict[str, Any] = {}
    for name, var in ENV.items():
        text = environ.get(var, "").strip()
        if not text:
            continue
        try:
            values[name] = _PARSE[name](text)
        except ValueError as e:
            raise ValueError(f"{var}={text!r} does not parse: {e}") from None
    return Settings(**values)


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings the environment variables give (defaults for those unset). Raises
    ``ValueError`` naming the variable whose value does not parse, or what is missing."""
    return check_settings(_env_settings(os.environ if environ is None else environ))


def check_settings(settings: Settings) -> Settings:
    """``settings`` when valid, else ``ValueError`` saying what is wrong."""
    lo, hi = settings.objective_range
    problems = [
        (settings.config_path is None,
         f"no experiment: set {ENV['config_path']} (or configure(config_path=...))"),
        (not hi > lo, f"objective_range needs lo < hi, got {settings.objective_range}"),
        (settings.kind not in PROGRAM_KINDS,
         f"kind must be one of {', '.join(PROGRAM_KINDS)}, got {settings.kind!r}"),
        (settings.time_limit_s <= 0, "time_limit_s must be > 0"),
        (settings.cpu_limit_s is not None and settings.cpu_limit_s <= 0, "cpu_limit_s must be > 0"),
        (settings.memory_mb <= 0, "memory_mb must be > 0"),
        (settings.stage1_requests < 1, "stage1_requests must be >= 1"),
        (settings.summary_tokens < 1, "summary_tokens must be >= 1")]
    for bad, message in problems:
        if bad:
            raise ValueError(message)
    return settings


def configure(config_path: str | Path | None = None, *, reset: bool = False,
              **changes: Any) -> Settings:
    """Set the evaluator's settings for this process and the OpenEvolve workers it starts (they
    copy its environment): the current settings (the defaults when ``reset``) with
    ``config_path`` and ``changes`` (``Settings`` fields) applied, written to the environment
    variables. Returns the settings; ``ValueError`` when they are not valid."""
    unknown = sorted(set(changes) - set(Settings._fields))
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(unknown)}; known: "
                        f"{', '.join(Settings._fields)}")
    if config_path is not None:
        changes["config_path"] = str(Path(config_path).resolve())
    for name in ("seeds", "holdout_seeds"):
        if name in changes:
            changes[name] = tuple(int(s) for s in changes[name] or ())
    if "objective_range" in changes:
        changes["objective_range"] = tuple(float(x) for x in changes["objective_range"])
    base = Settings() if reset else _env_settings(os.environ)
    settings = check_settings(base._replace(**changes))
    for name, var in ENV.items():
        value = getattr(settings, name)
        if value is None or value == getattr(Settings(), name):
            os.environ.pop(var, None)  # unset means the default
        else:
            os.environ[var] = _env_text(name, value)
    return settings


# ---- scoring ---------------------------------------------------------------------------------


def normalized(value: float, objective_range: tuple[float, float]) -> float:
    """An objective value on the [0, 1] score scale (0 for NaN)."""
    lo, hi = objective_range
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics OpenEvolve can compare and print (no NaN or inf)."""
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def _cases(stage: int, settings: Settings) -> list[Case]:
    seeds: Sequence[int | None] = settings.seeds or (None,)
    if stage == 1:
        return [Case("stage 1: first requests", seeds[0], settings.stage1_requests)]
    return ([Case(f"seed {s}" if s is not None else "experiment seed", s) for s in seeds]
            + [Case(f"held-out seed {s}", s) for s in settings.holdout_seeds])


def _stage1_metrics(cases: Sequence[CaseResult], settings: Settings) -> dict[str, float]:
    score = normalized(cases[0].objective, settings.objective_range)
    return _finite({"combined_score": score, "stage1_score": score,
                    "stage1_objective": cases[0].objective})


def _stage2_metrics(train: Sequence[CaseResult], held: Sequence[CaseResult],
                    settings: Settings) -> dict[str, float]:
    scores = [normalized(c.objective, settings.objective_range) for c in train]
    metrics = {"combined_score": sum(scores) / len(scores),
               "objective": _mean([c.objective for c in train])}
    metrics.update({f"objective_seed_{c.seed}": c.objective for c in train})
    if held:
        metrics["holdout_score"] = sum(normalized(c.objective, settings.objective_range)
                                       for c in held) / len(held)
        metrics["holdout_objective"] = _mean([c.objective for c in held])
    for key in REPORTED_METRICS:
        metrics[key] = _mean([c.metrics.get(key, math.nan) for c in train])
    return _finite(metrics)


def _failure(error: SandboxError, output: str = "") -> _Scored:
    artifacts = {"error": f"{error.kind}: {error.message}"}
    if output:
        artifacts["program_output"] = output
    return _Scored({"combined_score": 0.0}, artifacts)


def _scored(result: SandboxResult, stage: int, settings: Settings) -> _Scored:
    """A sandbox result as OpenEvolve metrics and artifacts."""
    if result.error is not None:
        return _failure(result.error, result.output)
    n_train = 1 if stage == 1 else len(settings.seeds or (None,))
    train, held = result.cases[:n_train], result.cases[n_train:]
    metrics = (_stage1_metrics(train, settings) if stage == 1
               else _stage2_metrics(train, held, settings))
    artifacts = {"summary": result.summary}
    nan_cases = [c.name for c in train if math.isnan(c.objective)]
    if nan_cases:
        artifacts["error"] = (f"objective: {settings.objective!r} is not a number on "
                              f"{', '.join(nan_cases)} (scored 0)")
    if result.output:
        artifacts["program_output"] = result.output
    return _Scored(metrics, artifacts)


def _evaluate_stage(program_path: str | Path, stage: int,
                    settings: Settings | None = None) -> _Scored:
    """Score a program file on a stage; every failure is a 0 score with the reason."""
    try:
        settings = settings_from_env() if settings is None else check_settings(settings)
        source = Path(program_path).read_text(encoding="utf-8")
    except (ValueError, OSError) as e:
        logger.error("blisjax OpenEvolve evaluator: %s", e)
        return _failure(SandboxError("settings", str(e)))
    try:
        limits = Limits(settings.time_limit_s, settings.cpu_limit_s or settings.time_limit_s,
                        settings.memory_mb)
        result = run_program(source, settings.config_path, _cases(stage, settings),
                             settings.objective, settings.kind, limits,
                             SummarySpec(max_tokens=settings.summary_tokens))
        return _scored(result, stage, settings)
    except Exception as e:  # an evaluator bug must not stop the evolution: score 0, say why
        logger.exception("blisjax OpenEvolve evaluator failed on %s", program_path)
        return _failure(SandboxError("internal", f"{type(e).__name__}: {e}"))


def _openevolve_result(scored: _Scored) -> Any:
    from openevolve.evaluation_result import EvaluationResult

    return EvaluationResult(metrics=scored.metrics, artifacts=scored.artifacts)


def evaluate_stage1(program_path: str) -> Any:
    """OpenEvolve cascade stage 1: the first ``stage1_requests`` requests of the first seed's
    workload. Returns an ``openevolve.evaluation_result.EvaluationResult``."""
    return _openevolve_result(_evaluate_stage(program_path, 1))


def evaluate_stage2(program_path: str) -> Any:
    """OpenEvolve cascade stage 2: the whole workload on every seed, plus the held-out seeds
    (reported, not scored). Returns an ``EvaluationResult``."""
    return _openevolve_result(_evaluate_stage(program_path, 2))


def evaluate(program_path: str) -> Any:
    """OpenEvolve's evaluation without cascade: stage 2's."""
    return evaluate_stage2(program_path)


def openevolve_evaluate(program_path: str | Path, config_path: str | Path,
                        seeds: Sequence[int] | None = None,
                        objective: str = "slo_attainment", stage: int = 2, *,
                        holdout_seeds: Sequence[int] = (),
                        objective_range: tuple[float, float] = (0.0, 1.0),
                        time_limit_s: float = 60.0, kind: str = "auto",
                        stage1_requests: int = 50,
                        summary_tokens: int = 1500) -> OpenEvolveReport:
    """Score one program file as OpenEvolve's evaluator would (``stage`` 1 or 2), without the
    environment: what ``blisjax openevolve-evaluate`` prints. Raises ``ValueError`` for invalid
    arguments; the program's own failures are the report's ``error``."""
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    settings = check_settings(Settings(
        str(Path(config_path).resolve()), tuple(int(s) for s in seeds or ()),
        tuple(int(s) for s in holdout_seeds), objective,
        (float(objective_range[0]), float(objective_range[1])), float(time_limit_s), None,
        Settings().memory_mb, int(stage1_requests), kind, int(summary_tokens)))
    scored = _evaluate_stage(program_path, stage, settings)
    return OpenEvolveReport(scored.metrics, scored.artifacts.get("summary", ""),
                            scored.artifacts.get("error"))


# ---- an offline LLM --------------------------------------------------------------------------

_CURRENT_PROGRAM = re.compile(r"# Current Program\s*\n```[\w+-]*\n(.*?)\n```", re.S)


def current_program(prompt: str) -> str:
    """The program being evolved, from an OpenEvolve prompt (its ``# Current Program`` code
    block; the whole prompt when there is none)."""
    match = _CURRENT_PROGRAM.search(prompt)
    return match.group(1) if match else prompt


class ScriptRule(NamedTuple):
    """Reply ``reply`` when the program being evolved contains ``when``."""

    when: str
    reply: str


#: What ``ScriptedLLM`` says when no rule matches (OpenEvolve finds no diff and moves on).
NO_CHANGE = "No change to suggest."


class ScriptedLLM:
    """An LLM for offline runs: the reply of the first rule whose ``when`` occurs in the
    program being evolved (``NO_CHANGE`` otherwise). Replies depend on the program only, not on
    the prompt's sampled context, so a run is reproducible whatever OpenEvolve samples.

    It implements ``openevolve.llm.base.LLMInterface`` and is registered as its (virtual)
    subclass by ``scripted_client``: importing OpenEvolve (over a second) is left to the
    processes that run it."""

    def __init__(self, rules: Sequence[ScriptRule], name: str = "scripted") -> None:
        self.model = name  # OpenEvolve's ensemble logs ``model``
        self.rules = tuple(rules)

    def reply(self, prompt: str) -> str:
        """The scripted reply to ``prompt``."""
        program = current_program(prompt)
        return next((r.reply for r in self.rules if r.when in program), NO_CHANGE)

    async def generate(self, prompt: str, **kwargs: Any) -> str:
        return self.reply(prompt)

    async def generate_with_context(self, system_message: str,
                                    messages: list[dict[str, str]], **kwargs: Any) -> str:
        return self.reply(messages[-1]["content"] if messages else "")


def scripted_client(rules: Sequence[ScriptRule], model_cfg: Any) -> ScriptedLLM:
    """``LLMModelConfig.init_client`` factory: pass ``functools.partial(scripted_client,
    rules)`` (module-level and picklable, as OpenEvolve's worker processes need)."""
    from openevolve.llm.base import LLMInterface

    LLMInterface.register(ScriptedLLM)
    return ScriptedLLM(rules, getattr(model_cfg, "name", None) or "scripted")
