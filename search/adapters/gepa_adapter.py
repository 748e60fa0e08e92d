"""GEPA over blisjax: evolve a policy bundle's YAML sections with reflective LLM mutation.

`GEPA <https://github.com/gepa-ai/gepa>`_ optimizes a *candidate*, a mapping of named text
components, with an LLM that reads how the candidate did and proposes new text.
:class:`BlisjaxGEPAAdapter` is GEPA's adapter for blisjax: the components are the policy-bundle
sections of ``search.adapters.core`` (``admission``, ``priority``, ``routing``, ``scheduler``,
and ``autoscaler`` for experiments with instance lifecycles), the data instances are
:class:`~search.adapters.core.WorkloadCase` s, a candidate's score on a case is the objective
(higher is better; 0 for a candidate that is not a valid policy), and the reflective dataset
shows the reflection LM the run's metrics, the SLOs it missed and the decision-trace text
summary (``blisjax.trace.reflect``) of a traced reference run::

    import gepa
    from search.adapters.core import seed_candidate
    from search.adapters.gepa_adapter import REFLECTION_PROMPT, BlisjaxGEPAAdapter, load_cases

    train = load_cases(["configs/search/prefix-affinity.yaml"], [1, 2])
    adapter = BlisjaxGEPAAdapter(objective="slo_attainment")
    result = gepa.optimize(seed_candidate=seed_candidate(train[0].config), trainset=train,
                           adapter=adapter, reflection_lm="openai/gpt-4.1-mini",
                           reflection_prompt_template=REFLECTION_PROMPT, max_metric_calls=60)

``batch_evaluate`` scores many (candidate, batch) pairs with one engine call per distinct case
(every candidate that is a set of per-lane knobs is a lane of one JAX population call), and
gives exactly what sequential ``evaluate(..., capture_traces=True)`` calls give. The traced
feedback run is deferred until the reflective dataset reads it (:class:`TraceFeedback`), so
scoring many candidates — GEPA's validation-set evaluations go through ``batch_evaluate`` too —
pays for no traces.

GEPA skips reflecting on a minibatch whose every score reaches ``perfect_score`` (default 1.0,
right for ``slo_attainment``); for an objective on another scale pass ``perfect_score`` or
``skip_perfect_score=False``. Its objective frontiers (``frontier_type="objective"``) read each
example's ``objective`` and ``FRONTIER_METRICS``, all higher-is-better.

Program components. A candidate may hold ``routing.program``, ``admission.program`` or
``priority.program`` instead of (not besides) the site's section: a policy program
(``blisjax.program``) as an expression, or YAML with ``program`` (or ``tree``) and ``params``
(``search.adapters.core.program_section``). Such candidates are data, checked by the program
grammar, and every one is a set of per-lane knobs, so a batch of different programs is one JAX
population call per case. A program that does not parse, or reads what its site cannot, scores
0 with the grammar's message as its feedback. ``PROMPTS`` gives GEPA a reflection prompt per
component (``PROGRAM_REFLECTION_PROMPT`` for the program components)::

    from search.adapters.core import program_candidate
    from search.adapters.gepa_adapter import PROMPTS

    seed = program_candidate({"routing": "score_prefix_affinity - 0.1 * queue_depth"})
    gepa.optimize(seed_candidate=seed, ..., reflection_prompt_template=PROMPTS)

``gepa_evaluate`` scores one BLIS policy-bundle file (``blisjax run --policy-config``) the way
GEPA would, for the command line. The ``gepa`` package is imported only by the adapter's
methods, so ``gepa_evaluate`` works without it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from blisjax.config import ConfigError, SimConfig, load_config
from search.adapters.core import (
    FAILED_SCORE,
    PROGRAM_COMPONENTS,
    SECTIONS,
    CaseOutcome,
    WorkloadCase,
    check_engine,
    evaluate_candidates,
    feedback_text,
)

if TYPE_CHECKING:
    from gepa.core.adapter import EvaluationBatch

__all__ = ["KEY_METRICS", "PROGRAM_REFLECTION_PROMPT", "PROMPTS", "REFLECTION_PROMPT",
           "BlisjaxGEPAAdapter", "CaseTrajectory",
           "GepaReport", "TraceFeedback", "gepa_evaluate", "load_cases", "policy_candidate"]

#: Metrics reported per case (outputs, summaries): flattened key, label, unit, higher-is-better.
KEY_METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("slo_attainment", "SLO attainment", "", True),
    ("ttft_mean_ms", "TTFT mean", " ms", False),
    ("ttft_p99_ms", "TTFT p99", " ms", False),
    ("e2e_p99_ms", "E2E p99", " ms", False),
    ("responses_per_sec", "throughput", " req/s", True),
    ("cache_hit_rate", "prefix-cache hit rate", "", True),
    ("preemption_count", "preemptions", "", False),
    ("rejected_requests", "rejected", "", False),
    ("timed_out_requests", "timed out", "", False),
    ("completed_requests", "completed", "", True),
    ("injected_requests", "injected", "", True),
)
#: Metrics besides the objective that GEPA's objective frontiers track, named as ``blisjax
#: search`` objectives (a leading ``-`` negates a lower-is-better metric: GEPA maximizes).
FRONTIER_METRICS: tuple[str, ...] = ("slo_attainment", "-ttft_p99_ms")
#: Traced feedback runs remembered by an adapter (a parent is often re-selected on the same
#: minibatch; each text is a few kB).
FEEDBACK_MEMO_SIZE = 256

#: A reflection prompt for policy sections (GEPA's default asks for assistant instructions);
#: pass it as ``gepa.optimize(reflection_prompt_template=...)``. GEPA replaces ``<curr_param>``
#: with the component's current text and ``<side_info>`` with the reflective dataset, and takes
#: the new text from between the reply's first and last triple backticks.
REFLECTION_PROMPT = """You are tuning one section of the control policy of a simulated \
LLM-inference serving cluster (BLIS policy-bundle YAML, simulated by blisjax). The current \
section is:
```
<curr_param>
```

Below are workloads it was simulated on, the metrics it reached, and feedback: the score \
(higher is better), the SLOs missed, what the section controls, and a summary of the traced \
run (issues, worst decisions with the state they were taken in, suggested knobs):
```
<side_info>
```

Diagnose from the trace why the policy loses score, then write an improved version of this \
section only, as YAML with the section name as its top-level key, using only the policies, \
scorers and keys the feedback names. Return exactly one ``` block holding the YAML and nothing \
else inside it."""

#: The reflection prompt of a program component (``routing.program``, ...): the same frame as
#: ``REFLECTION_PROMPT``, asking for one expression of the program language.
PROGRAM_REFLECTION_PROMPT = """You are writing one policy program of a simulated LLM-inference \
serving cluster (simulated by blisjax): a single Python-syntax expression over named \
observables. The current program is:
```
<curr_param>
```

Below are workloads it was simulated on, the metrics it reached, and feedback: the score \
(higher is better), the SLOs missed, what the program decides, the language and the \
observables it may read (with units), and a summary of the traced run (issues, worst decisions \
with the state they were taken in):
```
<side_info>
```

Diagnose from the trace why the policy loses score, then write an improved program: one \
expression using only the observables, operators and functions the feedback names (or YAML \
with `program:` and `params:` when it uses named constants). Return exactly one ``` block \
holding the program and nothing else inside it."""

#: ``gepa.optimize(reflection_prompt_template=PROMPTS)``: the prompt of each component.
PROMPTS: dict[str, str] = {**{name: REFLECTION_PROMPT for name in SECTIONS},
                           **{name: PROGRAM_REFLECTION_PROMPT for name in PROGRAM_COMPONENTS}}


# ---- cases and candidates from files --------------------------------------------------------


def load_cases(config_paths: Sequence[str | Path], seeds: Sequence[int]) -> list[WorkloadCase]:
    """One case per experiment file and workload seed (configs outer, seeds inner), named
    ``<config stem>@seed<S>``."""
    cases = []
    for path in config_paths:
        config = load_config(path)
        cases.extend(WorkloadCase(f"{Path(path).stem}@seed{seed}", config, int(seed))
                     for seed in seeds)
    return cases


def _bundle_mapping(path: str | Path) -> dict[str, Any]:
    """The YAML mapping of a policy-bundle file (``ConfigError`` naming the file otherwise)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError("policy-config", f"cannot read {path}: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError("policy-config", f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("policy-config", f"{path} must hold a YAML mapping of policy sections")
    return data


def policy_candidate(path: str | Path) -> tuple[dict[str, str], dict[str, Any]]:
    """A policy-bundle file as a candidate — one YAML text per policy section it has — and
    its cluster sections (``node_pools``, ``instance_lifecycle``), which are no candidate
    component: they change the experiment (``apply_blis_bundle``)."""
    from blisjax.config.yaml_io import BUNDLE_CLUSTER_KEYS

    data = _bundle_mapping(path)
    unknown = sorted(set(data) - set(SECTIONS) - set(BUNDLE_CLUSTER_KEYS))
    if unknown:
        raise ConfigError("policy-config", f"{path}: unknown section(s) {', '.join(unknown)}; "
                          f"allowed: {', '.join(SECTIONS + tuple(BUNDLE_CLUSTER_KEYS))}")
    candidate = {name: yaml.safe_dump({name: data[name]}, sort_keys=False)
                 for name in SECTIONS if name in data}
    cluster = {key: data[key] for key in BUNDLE_CLUSTER_KEYS if key in data}
    return candidate, cluster


# ---- what the reflection LM reads ------------------------------------------------------------


def _number(value: float) -> str:
    """A metric value as the summaries print it (4 significant digits)."""
    return f"{value:.4g}"


def metrics_summary(outcome: CaseOutcome) -> str:
    """One line of a case's key metrics (milliseconds, requests per second); a run that did
    not happen says so (its reason is the record's feedback)."""
    if not outcome.metrics:
        return "no metrics: the policy was not simulated (see the feedback)"
    parts = [f"{label} {_number(outcome.metrics[key])}{unit}"
             for key, label, unit, _ in KEY_METRICS if key in outcome.metrics]
    return "; ".join(parts)


def slo_violations(outcome: CaseOutcome, config: SimConfig) -> str:
    """The SLO classes whose requests missed their targets, with the targets (ms) and the
    attainment; empty when every class met them (or the run has no metrics)."""
    targets = dict(config.metrics.slo_targets)
    lines = []
    prefix = "slo_attainment.per_class."
    for key in sorted(k for k in outcome.metrics if k.startswith(prefix)
                      and k.endswith(".attainment")):
        cls = key[len(prefix):-len(".attainment")]
        attainment = outcome.metrics[key]
        if attainment >= 1.0:
            continue
        good = outcome.metrics.get(f"{prefix}{cls}.good", math.nan)
        injected = outcome.metrics.get(f"{prefix}{cls}.injected", math.nan)
        target = targets.get(cls)
        goals = ", ".join(f"{name} <= {_number(getattr(target, f))} ms"
                          for f, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"),
                                          ("e2e_ms", "E2E"))
                          if target is not None and getattr(target, f) > 0)
        lines.append(f"class {cls or 'default'} ({goals or 'no latency target'}): "
                     f"{_number(good)} of {_number(injected)} requests met the SLO "
                     f"(attainment {_number(attainment)})")
    return "\n".join(lines)


def _client_text(client: Mapping[str, Any]) -> str:
    """One workload client in words (what the reflection LM needs to reason about routing)."""
    parts = [f"client {client.get('id', '?')}"]
    for key, label in (("tenant_id", "tenant"), ("slo_class", "SLO class"),
                       ("rate_fraction", "share of traffic")):
        if key in client:
            parts.append(f"{label} {client[key]}")
    if client.get("prefix_group"):
        parts.append(f"shared prefix {client['prefix_group']} of "
                     f"{client.get('prefix_length', '?')} tokens")
    for key, label in (("input_distribution", "input"), ("output_distribution", "output")):
        params = (client.get(key) or {}).get("params") or {}
        if "mean" in params:
            parts.append(f"{label} ~{params['mean']} tokens")
    return ", ".join(parts)


def workload_description(case: WorkloadCase) -> str:
    """The case's experiment in a few lines: cluster, traffic, clients, SLO targets (ms)."""
    config = case.config
    lines = [f"{config.cluster.num_instances} instances of {config.model} on {config.hardware}"
             + (f", {config.engine.total_kv_blocks} KV blocks each"
                if config.engine.total_kv_blocks else "")]
    spec = config.workload or {}
    traffic = [f"{spec[k]} {label}" for k, label in (("num_requests", "requests"),
                                                     ("aggregate_rate", "requests/s"))
               if k in spec]
    lines.append(f"workload seed {case.seed}" + (": " + " at ".join(traffic) if traffic else ""))
    lines.extend(_client_text(c) for c in spec.get("clients") or [] if isinstance(c, Mapping))
    targets = [f"{cls}: " + ", ".join(f"{name} <= {_number(getattr(t, f))} ms"
                                      for f, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"),
                                                      ("e2e_ms", "E2E"))
                                      if getattr(t, f) > 0)
               for cls, t in config.metrics.slo_targets]
    if targets:
        lines.append("SLO targets: " + "; ".join(targets))
    return "\n".join(lines)


#: What a program's value decides, per site.
_PROGRAM_VALUES = {
    "routing": "each candidate instance's score for the request; the highest scores wins",
    "admission": "whether an arriving request is admitted: admitted iff the value is > 0 (a "
                 "rejected request counts against SLO attainment)",
    "priority": "a waiting request's priority (higher = more urgent), which priority-aware "
                "schedulers order the wait queue by",
}


def program_role(site: str) -> str:
    """What a program component decides, the language, and the observables its site may read
    with their units (from ``blisjax.program``'s tables)."""
    from blisjax.program import MAX_PROGRAM_LENGTH, OBSERVABLES
    from blisjax.program.observables import visible_at

    visible = set(visible_at(site))
    observables = "\n".join(f"- {o.name} ({o.unit}): {o.meaning}" for o in OBSERVABLES
                             if o.name in visible)
    return (f"The {site}.program component is a policy program deciding {_PROGRAM_VALUES[site]}. "
            "It is one expression: numbers, observables, named parameters (YAML `params`), "
            "+ - * /, comparisons (chains allowed), and, or, not, `a if condition else b`, "
            "min, max, abs, clip(x, low, high), log1p; nothing else parses. Comparisons give 1 "
            f"or 0, x / 0 is 0; at most {MAX_PROGRAM_LENGTH} instructions (one per number, name "
            f"and operator). The {site} program may read:\n{observables}")


def component_role(name: str) -> str:
    """What a policy section (or a program component: ``program_role``) controls and the
    values it may take (from blisjax's tables)."""
    if name in PROGRAM_COMPONENTS:
        return program_role(name.split(".")[0])
    from blisjax.config.autoscale import AUTOSCALER_POLICIES
    from blisjax.config.fields import (
        ADMISSION_POLICIES,
        PRIORITY_POLICIES,
        ROUTING_POLICIES,
        SCHEDULER_POLICIES,
        SCORER_NAMES,
    )

    roles = {
        "admission": ("which arriving requests enter the cluster; a rejected request counts "
                      f"against SLO attainment. policy: {', '.join(ADMISSION_POLICIES)}"),
        "priority": ("the priority of each waiting request, which priority-aware schedulers "
                     f"order the wait queue by. policy: {', '.join(PRIORITY_POLICIES)}"),
        "routing": ("which instance each request is sent to; weighted routing sums "
                    "weight x score over its scorers (only weight ratios matter, at least one "
                    f"weight > 0). policy: {', '.join(ROUTING_POLICIES)}; scorers: "
                    f"{', '.join(SCORER_NAMES)}; tie_break: blis-random, lowest-index"),
        "scheduler": ("the order in which each instance admits waiting requests into its "
                      f"batch. One of: {', '.join(SCHEDULER_POLICIES)}"),
        "autoscaler": ("when instances are added or drained. policy: "
                       f"{', '.join(AUTOSCALER_POLICIES)}"),
    }
    return f"The {name} section controls {roles.get(name, 'part of the policy')}."


# ---- trajectories ----------------------------------------------------------------------------


class TraceFeedback:
    """The decision-trace feedback of one candidate on one case (``core.feedback_text``: a
    traced reference run's text summary), computed when ``text`` is first read and then kept.

    Deferred because a trace costs a reference run while GEPA scores far more (candidate, case)
    pairs than it reflects on. Two instances are equal when they describe the same run
    (case, candidate texts, strategy, token budget, counterfactual K), computed or not.
    """

    __slots__ = ("_key", "_text")

    def __init__(self, case: WorkloadCase, candidate: Mapping[str, str], strategy: str,
                 max_tokens: int, counterfactual_k: int) -> None:
        self._key = (case, tuple(sorted(candidate.items())), strategy, max_tokens,
                     counterfactual_k)
        self._text: str | None = None

    @property
    def text(self) -> str:
        """The feedback text (the validation message for an invalid candidate)."""
        if self._text is None:
            case, items, strategy, max_tokens, k = self._key
            self._text = feedback_text(case, dict(items), strategy, max_tokens, k)
        return self._text

    @property
    def computed(self) -> bool:
        """Whether the traced run has been made."""
        return self._text is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TraceFeedback) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"TraceFeedback({self._key[0].name!r}, computed={self.computed})"


class CaseTrajectory(NamedTuple):
    """What the reflective dataset needs of one (candidate, case) evaluation.

    ``summary``: key metrics in one line (``metrics_summary``); ``slo_violations``: the SLO
    classes that missed (empty when none); ``invalid``: the validation message when the
    candidate is not a valid policy for the case (then there is no run, and ``feedback`` is
    None); ``feedback``: the deferred decision-trace text.
    """

    case: str
    workload: str
    score: float
    engine: str | None
    error: str | None
    summary: str
    slo_violations: str
    invalid: str | None
    feedback: TraceFeedback | None


def _frontier_scores(outcome: CaseOutcome) -> dict[str, float]:
    """GEPA's per-example objective scores, every one higher-is-better: the objective, then
    ``FRONTIER_METRICS``; a metric a failed run lacks (or a NaN) counts as the worst value so
    a frontier never favours failing."""
    scores = {"objective": outcome.score}
    for name in FRONTIER_METRICS:
        sign = -1.0 if name.startswith("-") else 1.0
        value = outcome.metrics.get(name.lstrip("-"), math.nan)
        worst = FAILED_SCORE if sign > 0 else -math.inf
        scores[name] = worst if math.isnan(value) else sign * value
    return scores


def _output(outcome: CaseOutcome) -> dict[str, Any]:
    """GEPA's per-example output (kept in its state, so plain data): score, engine, error and
    the key metrics."""
    return {"case": outcome.case.name, "score": outcome.score, "engine": outcome.engine,
            "error": outcome.error,
            "metrics": {key: outcome.metrics[key] for key, *_ in KEY_METRICS
                        if key in outcome.metrics}}


def _component_label(name: str) -> str:
    """How a record's inputs name a component: ``<site> program`` or ``<name> section``."""
    return f"{name.split('.')[0]} program" if name in PROGRAM_COMPONENTS else f"{name} section"


def _candidate_key(candidate: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A hashable identity of a candidate's texts."""
    return tuple(sorted(candidate.items()))


# ---- the adapter -----------------------------------------------------------------------------


class BlisjaxGEPAAdapter:
    """GEPA's adapter protocol (``gepa.core.adapter.GEPAAdapter``) over blisjax.

    Args:
      objective: the metric expression to maximize (``search.expr``; e.g. ``slo_attainment``,
        ``-ttft_p99_ms``). ``fitness`` needs the experiment's ``metrics.fitness_weights``.
      engine: ``auto`` (knob-expressible candidates as lanes of one JAX call per case, the rest
        in the reference engine), ``jax`` or ``reference`` (``core.evaluate_candidates``).
      feedback_strategy: the decision-trace summary's strategy (``issue_focused``,
        ``decision_audit``, ``counterfactual``).
      feedback_tokens: the summary's budget, in approximate tokens.
      counterfactual_k: routing alternatives kept per decision in the traced run.
      feedback_cases: how many examples of a reflective dataset get a traced run (the
        lowest-scoring valid ones); the others show their metrics only.
    """

    #: GEPA reads this attribute: None means its reflection LM proposes the new texts.
    propose_new_texts = None

    def __init__(self, objective: str = "fitness", engine: str = "auto",
                 feedback_strategy: str = "issue_focused", feedback_tokens: int = 1500,
                 counterfactual_k: int = 3, feedback_cases: int = 3) -> None:
        from blisjax.trace.reflect import MIN_TOKENS, STRATEGIES
        from search.expr import compile_expression

        compile_expression(objective)  # a syntax error is the caller's, now
        check_engine(engine)
        if feedback_strategy not in STRATEGIES:
            raise ConfigError("feedback_strategy", f"must be one of {', '.join(STRATEGIES)}, "
                                                   f"got {feedback_strategy!r}")
        if feedback_tokens < MIN_TOKENS:
            raise ConfigError("feedback_tokens", f"must be >= {MIN_TOKENS}, got "
                                                 f"{feedback_tokens}")
        if counterfactual_k < 0 or feedback_cases < 0:
            raise ConfigError("counterfactual_k/feedback_cases", "must be >= 0")
        self.objective = objective
        self.engine = engine
        self.feedback_strategy = feedback_strategy
        self.feedback_tokens = feedback_tokens
        self.counterfactual_k = counterfactual_k
        self.feedback_cases = feedback_cases
        self._feedback: OrderedDict[Any, TraceFeedback] = OrderedDict()

    # -- scoring --

    def _case_outcomes(self, case: WorkloadCase,
                       candidates: list[Mapping[str, str]]) -> list[CaseOutcome]:
        """Every candidate on one case in one ``evaluate_candidates`` call (one JAX population
        call). If the simulation raises, each candidate alone, so that only a candidate that
        breaks it fails (score ``FAILED_SCORE``, the exception as its error); when the
        experiment's own policy breaks too, the failure is not the candidate's and propagates,
        as does an objective the metrics cannot evaluate (``ConfigError``)."""
        try:
            return [row[0] for row in evaluate_candidates(candidates, [case], self.objective,
                                                          self.engine)]
        except ConfigError:
            raise
        except Exception as e:
            if len(candidates) > 1:
                return [self._case_outcomes(case, [c])[0] for c in candidates]
            if not candidates[0] or not self._experiment_runs(case):
                raise
            return [CaseOutcome(case, FAILED_SCORE, {}, None,
                                f"the simulation failed: {type(e).__name__}: {e}")]

    def _experiment_runs(self, case: WorkloadCase) -> bool:
        """Whether the case's experiment runs with its own policy (the empty candidate): tells
        a candidate's failure from a systemic one (only asked after a failure)."""
        try:
            evaluate_candidates([{}], [case], self.objective, self.engine)
        except Exception:
            return False
        return True

    def _outcomes(self, items: Sequence[tuple[Mapping[str, str], Sequence[WorkloadCase]]]
                  ) -> list[list[CaseOutcome]]:
        """``[item][example]`` outcomes with one engine call per distinct case: the distinct
        candidates that any item scores on a case all go in that case's call."""
        wanted: dict[WorkloadCase, dict[Any, Mapping[str, str]]] = {}
        for candidate, batch in items:
            for case in batch:
                wanted.setdefault(case, {}).setdefault(_candidate_key(candidate), candidate)
        scored: dict[tuple[WorkloadCase, Any], CaseOutcome] = {}
        for case, candidates in wanted.items():
            outcomes = self._case_outcomes(case, list(candidates.values()))
            scored.update(((case, key), o) for key, o in zip(candidates, outcomes, strict=True))
        return [[scored[(case, _candidate_key(candidate))] for case in batch]
                for candidate, batch in items]

    def _trace_feedback(self, case: WorkloadCase, candidate: Mapping[str, str]) -> TraceFeedback:
        """The deferred feedback of (case, candidate), shared with earlier evaluations of the
        same pair so that a re-selected parent is not traced again."""
        fb = TraceFeedback(case, candidate, self.feedback_strategy, self.feedback_tokens,
                           self.counterfactual_k)
        known = self._feedback.get(fb)
        if known is not None:
            self._feedback.move_to_end(fb)
            return known
        self._feedback[fb] = fb
        if len(self._feedback) > FEEDBACK_MEMO_SIZE:
            self._feedback.popitem(last=False)
        return fb

    def _trajectory(self, candidate: Mapping[str, str], outcome: CaseOutcome) -> CaseTrajectory:
        invalid = outcome.error if outcome.invalid else None
        feedback = None if invalid else self._trace_feedback(outcome.case, candidate)
        return CaseTrajectory(outcome.case.name, workload_description(outcome.case),
                              outcome.score, outcome.engine, outcome.error,
                              metrics_summary(outcome), slo_violations(outcome,
                                                                       outcome.case.config),
                              invalid, feedback)

    def _evaluation_batch(self, candidate: Mapping[str, str], outcomes: list[CaseOutcome],
                          capture_traces: bool) -> EvaluationBatch:
        from gepa.core.adapter import EvaluationBatch

        trajectories = ([self._trajectory(candidate, o) for o in outcomes]
                        if capture_traces else None)
        return EvaluationBatch(outputs=[_output(o) for o in outcomes],
                               scores=[o.score for o in outcomes],
                               trajectories=trajectories,
                               objective_scores=[_frontier_scores(o) for o in outcomes])

    def evaluate(self, batch: list[WorkloadCase], candidate: dict[str, str],
                 capture_traces: bool = False) -> EvaluationBatch:
        """Score ``candidate`` on every case of ``batch`` (GEPA's ``evaluate``). A candidate
        that is not a valid policy, or whose run fails, scores ``FAILED_SCORE`` with the reason
        in its output and trajectory; nothing a candidate does raises."""
        return self._evaluation_batch(candidate, self._outcomes([(candidate, batch)])[0],
                                      capture_traces)

    def batch_evaluate(self, items: list[tuple[dict[str, str], list[WorkloadCase]]]
                       ) -> list[EvaluationBatch]:
        """Score many (candidate, batch) pairs with one engine call per distinct case; the
        result of each pair equals ``evaluate(batch, candidate, capture_traces=True)`` (GEPA's
        contract: batch evaluation always returns trajectories)."""
        return [self._evaluation_batch(candidate, outcomes, True)
                for (candidate, _), outcomes in zip(items, self._outcomes(items), strict=True)]

    # -- reflection --

    def _traced(self, trajectories: Sequence[CaseTrajectory]) -> set[int]:
        """The examples that get a traced run: the ``feedback_cases`` lowest-scoring runnable
        ones (ties by position), since a failing case says most about what to change."""
        runnable = [i for i, t in enumerate(trajectories) if t.feedback is not None]
        return set(sorted(runnable, key=lambda i: (trajectories[i].score, i))
                   [:self.feedback_cases])

    def _feedback_text(self, name: str, trajectory: CaseTrajectory, trace: str | None) -> str:
        """The Feedback of one record: score, SLO misses, the section's role, then the trace
        summary (or the validation message / failure reason)."""
        head = [f"Score {_number(trajectory.score)} (objective {self.objective}, higher is "
                f"better)."]
        if trajectory.slo_violations:
            head.append("SLOs missed:\n" + trajectory.slo_violations)
        head.append(component_role(name))
        if trajectory.invalid is not None:
            head.append(f"The candidate is not a valid policy: {trajectory.invalid}")
        elif trajectory.error is not None:
            head.append(f"The run failed: {trajectory.error}")
        if trace is not None:
            head.append(trace.strip())
        return "\n\n".join(head)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]
                                ) -> dict[str, list[dict[str, Any]]]:
        """Per component to update, one record per example: ``Inputs`` (case, workload, the
        section's current YAML), ``Generated Outputs`` (the metrics line) and ``Feedback``
        (``_feedback_text``). Deterministic: the texts are functions of the runs."""
        trajectories: list[CaseTrajectory] = list(eval_batch.trajectories or [])
        traced = self._traced(trajectories)
        traces = {i: trajectories[i].feedback.text for i in sorted(traced)}  # type: ignore[union-attr]
        return {name: [{"Inputs": {"case": t.case, "workload": t.workload,
                                   f"current {_component_label(name)}":
                                       candidate.get(name, "")},
                        "Generated Outputs": t.summary,
                        "Feedback": self._feedback_text(name, t, traces.get(i))}
                       for i, t in enumerate(trajectories)]
                for name in components_to_update}


# ---- the command line's evaluation -----------------------------------------------------------


class GepaReport(NamedTuple):
    """A policy bundle scored as GEPA scores a candidate: per case (``cases``, in order) its
    ``scores`` (the objective; ``FAILED_SCORE`` on error), ``engines`` and ``errors``; the
    ``mean_score``; and ``feedback``, the decision-trace text of the lowest-scoring case
    (``feedback_case``; the validation message when the bundle is not a valid policy)."""

    candidate: dict[str, str]
    cases: tuple[str, ...]
    scores: tuple[float, ...]
    engines: tuple[str | None, ...]
    errors: tuple[str | None, ...]
    mean_score: float
    feedback_case: str
    feedback: str


def gepa_evaluate(policy_config: str | Path, config_paths: Sequence[str | Path],
                  seeds: Sequence[int], objective: str = "fitness", engine: str = "auto", *,
                  feedback_strategy: str = "issue_focused", feedback_tokens: int = 1500,
                  counterfactual_k: int = 3) -> GepaReport:
    """Score a BLIS policy-bundle file (``blisjax run --policy-config``) on every experiment
    and seed as GEPA would score it as a candidate, with the feedback its reflection LM would
    read for the worst case. The bundle's cluster sections apply to every experiment; its
    absent policy sections keep each experiment's."""
    from blisjax.config.yaml_io import apply_blis_bundle

    if not config_paths or not seeds:
        raise ConfigError("gepa", "give at least one experiment and one seed")
    candidate, cluster = policy_candidate(policy_config)
    cases = load_cases(config_paths, seeds)
    if cluster:
        cases = [case._replace(config=apply_blis_bundle(case.config, cluster)) for case in cases]
    adapter = BlisjaxGEPAAdapter(objective, engine, feedback_strategy, feedback_tokens,
                                 counterfactual_k, feedback_cases=1)
    outcomes = adapter._outcomes([(candidate, cases)])[0]
    worst = min(range(len(outcomes)), key=lambda i: (outcomes[i].score, i))
    trajectory = adapter._trajectory(candidate, outcomes[worst])
    feedback = (trajectory.feedback.text if trajectory.feedback is not None
                else f"The candidate is not a valid policy: {trajectory.invalid}\n")
    scores = tuple(o.score for o in outcomes)
    return GepaReport(candidate, tuple(c.name for c in cases), scores,
                      tuple(o.engine for o in outcomes), tuple(o.error for o in outcomes),
                      sum(scores) / len(scores), cases[worst].name, feedback)
