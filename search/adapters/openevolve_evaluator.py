"""OpenEvolve's evaluation file for blisjax policy programs: give OpenEvolve this file's path.

OpenEvolve (``openevolve>=0.4``) evolves a file between ``# EVOLVE-BLOCK-START`` and
``# EVOLVE-BLOCK-END`` and scores each version by calling this module's functions with the
file's path. The file is one of:

* a *programs file*: YAML mapping sites (``routing``, ``admission``, ``priority``) to policy
  programs (``blisjax.program``), each an expression or a mapping with ``program`` (or
  ``tree``) and ``params``. Programs are data checked by the program grammar, so they need no
  sandbox: they are scored as the GEPA adapter scores program components
  (``search.adapters.core.evaluate_candidates``: per case, one JAX population call for every
  file of a batch, ``evaluate_batch``), and the summary is a traced reference run;
* Python for ``search.adapters.sandbox``: a *bundle program* (``policy()`` returns
  policy-bundle sections) or a *code policy* (``route_scores`` / ``priority`` functions). Each
  evaluation runs it in the sandbox (a subprocess with wall-time, CPU-time and memory limits
  and an import allowlist) and simulates it in the reference engine.

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
``BLISJAX_OPENEVOLVE_KIND``            ``auto`` | ``bundle`` | ``code`` | ``programs``
                                       (default ``auto``: a YAML mapping naming a site is a
                                       programs file, anything else Python)
``BLISJAX_OPENEVOLVE_ENGINE``          programs files: ``auto`` | ``jax`` | ``reference``
                                       (default ``auto``: the JAX engine)
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

import yaml

from search.adapters.core import ENGINES, PROGRAM_SITES
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

__all__ = ["ENV", "KINDS", "OpenEvolveReport", "ScriptRule", "ScriptedLLM", "Settings",
           "configure", "current_program", "evaluate", "evaluate_batch", "evaluate_stage1",
           "evaluate_stage2", "openevolve_evaluate", "programs_candidate", "scripted_client",
           "settings_from_env"]

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
    engine: str = "auto"


#: The environment variable of each setting.
ENV = {"config_path": "BLISJAX_OPENEVOLVE_CONFIG", "seeds": "BLISJAX_OPENEVOLVE_SEEDS",
       "holdout_seeds": "BLISJAX_OPENEVOLVE_HOLDOUT_SEEDS",
       "objective": "BLISJAX_OPENEVOLVE_OBJECTIVE",
       "objective_range": "BLISJAX_OPENEVOLVE_OBJECTIVE_RANGE",
       "time_limit_s": "BLISJAX_OPENEVOLVE_TIME_LIMIT",
       "cpu_limit_s": "BLISJAX_OPENEVOLVE_CPU_LIMIT",
       "memory_mb": "BLISJAX_OPENEVOLVE_MEMORY_MB",
       "stage1_requests": "BLISJAX_OPENEVOLVE_STAGE1_REQUESTS",
       "kind": "BLISJAX_OPENEVOLVE_KIND", "summary_tokens": "BLISJAX_OPENEVOLVE_SUMMARY_TOKENS",
       "engine": "BLISJAX_OPENEVOLVE_ENGINE"}
#: What a candidate file may be: the sandbox's Python kinds, or ``programs`` (a programs file).
KINDS = PROGRAM_KINDS + ("programs",)


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
          "memory_mb": int, "stage1_requests": int, "kind": str, "summary_tokens": int,
          "engine": str}


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
        (settings.kind not in KINDS,
         f"kind must be one of {', '.join(KINDS)}, got {settings.kind!r}"),
        (settings.engine not in ENGINES,
         f"engine must be one of {', '.join(ENGINES)}, got {settings.engine!r}"),
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


# ---- programs files --------------------------------------------------------------------------


def _program_text(site: str, value: Any) -> str:
    """A programs file's entry as a program component's text (``core.program_section``)."""
    from blisjax.config import ConfigError

    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # a constant program
    if isinstance(value, dict):
        return yaml.safe_dump(value, sort_keys=False)
    raise ConfigError(f"programs.{site}", f"must be an expression or a mapping with program (or "
                                          f"tree) and params, got {value!r}")


def programs_candidate(source: str, kind: str = "auto") -> dict[str, str] | None:
    """The candidate a programs file holds — ``{"<site>.program": text}`` — or None when
    ``source`` is Python for the sandbox (``kind`` ``bundle`` or ``code``; with ``auto``, a
    source that is not a YAML mapping naming a program site). Raises ``ConfigError`` naming the
    problem of a file that is one but is not valid (an unknown site, an empty file, ...)."""
    from blisjax.config import ConfigError

    if kind in PROGRAM_KINDS[1:]:
        return None
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as e:
        if kind == "programs":
            raise ConfigError("programs", f"is not valid YAML: {e}") from None
        return None
    if not (isinstance(data, dict) and any(key in PROGRAM_SITES for key in data)):
        if kind == "programs":
            raise ConfigError("programs", f"must be a YAML mapping of sites "
                                          f"({', '.join(PROGRAM_SITES)}) to programs")
        return None
    unknown = sorted(str(key) for key in data if key not in PROGRAM_SITES)
    if unknown:
        raise ConfigError("programs", f"unknown site(s) {', '.join(unknown)}; sites: "
                                      f"{', '.join(PROGRAM_SITES)}")
    return {f"{site}.program": _program_text(site, value) for site, value in data.items()}


def _workload_cases(stage: int, settings: Settings) -> list[Any]:
    """The stage's cases (``_cases``) as ``core.WorkloadCase`` s of the experiment."""
    from blisjax.config import load_config
    from search.adapters.core import WorkloadCase

    config = load_config(settings.config_path)
    return [WorkloadCase(c.name, config, config.seed if c.seed is None else int(c.seed),
                         c.requests) for c in _cases(stage, settings)]


def _outcome_rows(candidates: Sequence[Mapping[str, str]], cases: Sequence[Any],
                  settings: Settings) -> list[list[Any]]:
    """``[candidate][case]`` outcomes of one ``evaluate_candidates`` call (one JAX population
    call per case). When the simulation raises, each candidate alone, so that only one that
    breaks it fails; a ``ConfigError`` (the objective) is the settings' and propagates."""
    from blisjax.config import ConfigError
    from search.adapters.core import FAILED_SCORE, CaseOutcome, evaluate_candidates

    try:
        return evaluate_candidates(candidates, cases, settings.objective, settings.engine)
    except ConfigError:
        raise
    except Exception as e:
        if len(candidates) > 1:
            return [_outcome_rows([c], cases, settings)[0] for c in candidates]
        return [[CaseOutcome(case, FAILED_SCORE, {}, None,
                             f"the simulation failed: {type(e).__name__}: {e}")
                 for case in cases]]


def _summary_text(case: Any, candidate: Mapping[str, str], settings: Settings) -> str:
    """The decision-trace text summary of the candidate on ``case`` (a traced reference run)."""
    from search.adapters.core import feedback_text

    spec = SummarySpec(max_tokens=settings.summary_tokens)
    try:
        return feedback_text(case, candidate, spec.strategy, spec.max_tokens,
                             spec.counterfactual_k)
    except Exception as e:  # the score stands without its summary
        return f"(no trace summary: the summariser failed: {type(e).__name__}: {e})\n"


def _programs_result(candidate: Mapping[str, str], outcomes: Sequence[Any],
                     requests: Sequence[int], settings: Settings) -> SandboxResult:
    """A programs file's outcomes as a sandbox result: ``invalid_policy`` when a program is
    not valid, ``crash`` when a run failed; a NaN objective is a case's NaN (``_scored``)."""
    invalid = next((o for o in outcomes if o.invalid), None)
    if invalid is not None:
        return SandboxResult("programs", (), "", SandboxError("invalid_policy", invalid.error),
                             "")
    failed = next((o for o in outcomes if o.error is not None and not o.metrics), None)
    if failed is not None:
        return SandboxResult("programs", (), "",
                             SandboxError("crash", f"{failed.case.name}: {failed.error}"), "")
    cases = tuple(CaseResult(o.case.name, o.case.seed, n,
                             o.score if o.error is None else math.nan, o.metrics)
                  for o, n in zip(outcomes, requests, strict=True))
    return SandboxResult("programs", cases, _summary_text(outcomes[0].case, candidate, settings),
                         None, "")


def _evaluate_programs(candidates: Sequence[Mapping[str, str]], stage: int,
                       settings: Settings) -> list[SandboxResult]:
    """Score programs files' candidates on the stage's cases, all of them in one population
    call per case."""
    from search.adapters.core import case_workload

    cases = _workload_cases(stage, settings)
    requests = [int(case_workload(case).num_requests) for case in cases]
    rows = _outcome_rows(candidates, cases, settings)
    return [_programs_result(c, row, requests, settings)
            for c, row in zip(candidates, rows, strict=True)]


# ---- stages ----------------------------------------------------------------------------------


def _sandboxed(source: str, stage: int, settings: Settings) -> SandboxResult:
    """A Python program run in the sandbox on the stage's cases."""
    limits = Limits(settings.time_limit_s, settings.cpu_limit_s or settings.time_limit_s,
                    settings.memory_mb)
    return run_program(source, settings.config_path, _cases(stage, settings),
                       settings.objective, settings.kind, limits,
                       SummarySpec(max_tokens=settings.summary_tokens))


def _evaluate_stage_batch(program_paths: Sequence[str | Path], stage: int,
                          settings: Settings | None = None) -> list[_Scored]:
    """Score files on a stage: the programs files together (``_evaluate_programs``), each
    Python file in the sandbox; every failure is a 0 score with the reason."""
    try:
        settings = settings_from_env() if settings is None else check_settings(settings)
    except ValueError as e:
        logger.error("blisjax OpenEvolve evaluator: %s", e)
        return [_failure(SandboxError("settings", str(e))) for _ in program_paths]
    from blisjax.config import ConfigError

    out: list[_Scored | None] = [None] * len(program_paths)
    programs: dict[int, dict[str, str]] = {}
    sources: dict[int, str] = {}
    for i, path in enumerate(program_paths):
        try:
            sources[i] = Path(path).read_text(encoding="utf-8")
            candidate = programs_candidate(sources[i], settings.kind)
        except OSError as e:
            out[i] = _failure(SandboxError("settings", str(e)))
            continue
        except ConfigError as e:
            out[i] = _failure(SandboxError("invalid_policy", str(e)))
            continue
        if candidate is not None:
            programs[i] = candidate
    try:
        if programs:
            for i, result in zip(programs, _evaluate_programs(list(programs.values()), stage,
                                                              settings), strict=True):
                out[i] = _scored(result, stage, settings)
    except ConfigError as e:  # the experiment or the objective: the operator's error
        out = [_failure(SandboxError("settings", str(e))) if i in programs else o
               for i, o in enumerate(out)]
    except Exception as e:  # an evaluator bug must not stop the evolution: score 0, say why
        logger.exception("blisjax OpenEvolve evaluator failed on programs files")
        out = [_failure(SandboxError("internal", f"{type(e).__name__}: {e}")) if i in programs
               else o for i, o in enumerate(out)]
    for i, source in sources.items():
        if out[i] is not None:
            continue
        try:
            out[i] = _scored(_sandboxed(source, stage, settings), stage, settings)
        except Exception as e:  # an evaluator bug must not stop the evolution: score 0, say why
            logger.exception("blisjax OpenEvolve evaluator failed on %s", program_paths[i])
            out[i] = _failure(SandboxError("internal", f"{type(e).__name__}: {e}"))
    return out  # type: ignore[return-value]


def _evaluate_stage(program_path: str | Path, stage: int,
                    settings: Settings | None = None) -> _Scored:
    """Score a file on a stage; every failure is a 0 score with the reason."""
    return _evaluate_stage_batch([program_path], stage, settings)[0]


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


def evaluate_batch(program_paths: Sequence[str], stage: int = 2) -> list[Any]:
    """Score many files on a stage (1 or 2) at once: what ``evaluate_stage1`` /
    ``evaluate_stage2`` give each, with every programs file of the batch a lane of one JAX
    population call per case. Returns ``EvaluationResult`` s in the paths' order."""
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    return [_openevolve_result(s) for s in _evaluate_stage_batch(program_paths, stage)]


def openevolve_evaluate(program_path: str | Path, config_path: str | Path,
                        seeds: Sequence[int] | None = None,
                        objective: str = "slo_attainment", stage: int = 2, *,
                        holdout_seeds: Sequence[int] = (),
                        objective_range: tuple[float, float] = (0.0, 1.0),
                        time_limit_s: float = 60.0, kind: str = "auto",
                        stage1_requests: int = 50, summary_tokens: int = 1500,
                        engine: str = "auto") -> OpenEvolveReport:
    """Score one program file as OpenEvolve's evaluator would (``stage`` 1 or 2), without the
    environment: what ``blisjax openevolve-evaluate`` prints. Raises ``ValueError`` for invalid
    arguments; the program's own failures are the report's ``error``."""
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    settings = check_settings(Settings(
        str(Path(config_path).resolve()), tuple(int(s) for s in seeds or ()),
        tuple(int(s) for s in holdout_seeds), objective,
        (float(objective_range[0]), float(objective_range[1])), float(time_limit_s), None,
        Settings().memory_mb, int(stage1_requests), kind, int(summary_tokens), engine))
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
