"""blisjax as the evaluator of text-evolved policies: the part GEPA and OpenEvolve share.

A *candidate* is a policy written as text: one BLIS policy-bundle section per component
(``admission``, ``priority``, ``routing``, ``scheduler``, and ``autoscaler`` when the experiment
has instance lifecycles), each a YAML mapping. A *case* is one workload to score it on: an
experiment (``SimConfig``, whose own policy the candidate's sections replace) and a workload
seed. Scoring a candidate on a case simulates the experiment with the candidate's policy and
reads one metric expression (``fitness`` by default; any expression of ``search.expr`` over
the metrics) — higher is better, and a candidate that is not a valid policy scores 0 with the
validation message as its feedback.

A candidate may also carry *program components*, ``routing.program``, ``admission.program`` and
``priority.program``: a policy program of that site (``blisjax.program``, docs/policy-programs.md)
as an expression, or as YAML with ``program`` (or ``tree``) and ``params``. The component sets the
site's policy to ``program``; it is data, checked by the program grammar, and a population of
different programs is one JAX call (each program a set of ``<site>.policy``, ``<site>.program``
and ``<site>.params.<name>`` knobs).

``evaluate_candidates`` scores many candidates on many cases with as few engine calls as
possible: per case, every candidate whose policy differs from the experiment's only in per-lane
knobs (``blisjax.engine.population.set_knob``) is one lane of a single JAX population; the
others (a policy the compiled program does not model, e.g. an autoscaler on an experiment
without lifecycles) run in the reference engine. Both engines give the same numbers bit for bit,
so which one ran never changes a score. ``feedback_text`` re-runs one (candidate, case) traced in
the reference engine and returns the decision-trace text summary (``blisjax.trace.reflect``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import yaml

from blisjax.config import (
    ConfigError,
    SimConfig,
    config_to_dict,
    load_blis_policy_config,
    resolve_config,
)
from search.expr import Expression, compile_expression, flatten_metrics

__all__ = ["ENGINES", "PROGRAM_COMPONENTS", "PROGRAM_SITES", "CaseOutcome", "WorkloadCase",
           "candidate_config", "case_workload", "check_engine", "evaluate_candidates",
           "feedback_text", "policy_knobs", "program_candidate", "program_section",
           "seed_candidate", "sections_of"]

#: Policy-bundle sections a candidate may carry, in bundle order.
SECTIONS = ("admission", "priority", "routing", "scheduler", "autoscaler")
#: Sites a policy program may set (``blisjax.program.SITES``).
PROGRAM_SITES = ("routing", "admission", "priority")
#: The program component of each site: ``<site>.program``.
PROGRAM_COMPONENTS = tuple(f"{site}.program" for site in PROGRAM_SITES)
#: Keys of a program component written as YAML.
PROGRAM_KEYS = ("policy", "program", "tree", "params")
#: Score of a candidate that could not be simulated on a case.
FAILED_SCORE = 0.0
#: Fewest lanes of a JAX call (``lane_bucket``).
MIN_LANES = 4


class WorkloadCase(NamedTuple):
    """One workload a candidate is scored on: ``config``'s experiment (its workload section
    generated with ``seed``; only its first ``requests`` requests, in arrival order, when not
    None); ``name`` labels it in feedback."""

    name: str
    config: SimConfig
    seed: int
    requests: int | None = None


class CaseOutcome(NamedTuple):
    """A candidate on a case: its ``score`` (the objective, higher is better; ``FAILED_SCORE``
    when ``error``), the flattened ``metrics`` (empty on error), which ``engine`` ran it
    (``"jax"``, ``"reference"``, or None on error), ``error``, the reason it could not run,
    and ``invalid``: whether that reason is that the candidate is not a valid policy."""

    case: WorkloadCase
    score: float
    metrics: dict[str, float]
    engine: str | None
    error: str | None
    invalid: bool = False


# ---- candidates as text ----------------------------------------------------------------------


def _has_lifecycle(config: SimConfig) -> bool:
    from blisjax.rules import uses_lifecycle

    return uses_lifecycle(config)


def sections_of(config: SimConfig) -> tuple[str, ...]:
    """The components of a candidate for this experiment: the four policy sections, and the
    autoscaler when the experiment models instance lifecycles."""
    return SECTIONS if _has_lifecycle(config) else SECTIONS[:4]


def seed_candidate(config: SimConfig) -> dict[str, str]:
    """The experiment's own policy as a candidate: one YAML section per component."""
    policy = config_to_dict(config)["policy"]
    policy["scheduler"] = policy["scheduler"]["policy"]
    return {name: yaml.safe_dump({name: policy[name]}, sort_keys=False,
                                 default_flow_style=False)
            for name in sections_of(config)}


_POLICY_FIELD = re.compile(r"^(policy-config|policy)\.")
_FENCE = re.compile(r"^\s*```[A-Za-z]*\s*\n(.*?)\n\s*```\s*$", re.S)


def _section_data(name: str, text: str) -> Any:
    """A component's YAML: ``<name>: {...}`` or the section's body alone (a bare scheduler
    name for ``scheduler``); a markdown code fence around it is ignored."""
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"candidate.{name}", f"is not valid YAML: {e}") from None
    if isinstance(data, dict) and set(data) == {name}:
        return data[name]
    if isinstance(data, dict) and name in data:
        others = sorted(k for k in data if k != name)
        raise ConfigError(f"candidate.{name}", f"holds other sections too ({', '.join(others)}); "
                                               f"give only the {name} section")
    return data


def _program_data(site: str, text: str) -> Mapping[str, Any]:
    """A program component's text as a mapping of ``PROGRAM_KEYS``: YAML with those keys
    (optionally under the site's name), or else the whole text as the expression."""
    name = f"candidate.{site}.program"
    if not isinstance(text, str):
        raise ConfigError(name, f"must be text (an expression or YAML), got {text!r}")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    if not text.strip():
        raise ConfigError(name, "is empty; give an expression, or YAML with program (or tree) "
                                "and params")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None  # not YAML: an expression, which the program grammar judges
    if isinstance(data, dict) and set(data) == {site} and isinstance(data[site], dict):
        data = data[site]
    if not isinstance(data, dict):
        return {"program": text.strip()}
    unknown = sorted(str(k) for k in data if k not in PROGRAM_KEYS)
    if unknown:
        raise ConfigError(name, f"unknown key(s) {', '.join(unknown)}; a program component is "
                                f"an expression, or YAML with {', '.join(PROGRAM_KEYS[1:])}")
    if data.get("policy", "program") != "program":
        raise ConfigError(f"{name}.policy", f"a program component's policy is 'program', got "
                                            f"{data['policy']!r}")
    return data


def program_section(site: str, text: str) -> dict[str, Any]:
    """The ``site`` policy section a program component's ``text`` stands for: ``{policy:
    program, program: <expression>, params: {name: value}}``, the program checked by
    ``blisjax.program.compile_program`` (a tree written as its expression). Raises
    ``ConfigError`` naming ``candidate.<site>.program`` (or ``.params.<name>``, ``.tree``)."""
    from blisjax.program import compile_program

    if site not in PROGRAM_SITES:
        raise ConfigError("candidate", f"no program site {site!r}; sites: "
                                       f"{', '.join(PROGRAM_SITES)}")
    data = _program_data(site, text)
    program = data.get("program")
    if isinstance(program, (int, float)) and not isinstance(program, bool):
        program = str(program)  # YAML read a constant program as a number
    compiled = compile_program(site, program=program, tree=data.get("tree"),
                               params=data.get("params"), path=f"candidate.{site}")
    return {"policy": "program", "program": compiled.text, "params": dict(compiled.params)}


def program_candidate(programs: Mapping[str, Any]) -> dict[str, str]:
    """A candidate of program components from ``{site: program}``: each program an expression,
    or a mapping with ``program`` (or ``tree``) and ``params`` (written as YAML text)."""
    unknown = sorted(set(programs) - set(PROGRAM_SITES))
    if unknown:
        raise ConfigError("candidate", f"unknown program site(s) {', '.join(unknown)}; sites: "
                                       f"{', '.join(PROGRAM_SITES)}")
    return {f"{site}.program": (value if isinstance(value, str)
                                else yaml.safe_dump(dict(value), sort_keys=False))
            for site, value in programs.items()}


def candidate_config(config: SimConfig, candidate: Mapping[str, str]) -> SimConfig:
    """``config`` with the candidate's policy sections and programs (components absent from
    the candidate keep the experiment's). Raises ``ConfigError`` naming the component and the
    problem."""
    allowed = SECTIONS + PROGRAM_COMPONENTS
    unknown = sorted(set(candidate) - set(allowed))
    if unknown:
        raise ConfigError("candidate", f"unknown component(s) {', '.join(unknown)}; allowed: "
                                       f"{', '.join(allowed)}")
    both = [site for site in PROGRAM_SITES if site in candidate and f"{site}.program" in candidate]
    if both:
        raise ConfigError(f"candidate.{both[0]}.program", f"the candidate has a {both[0]} "
                                                          "section too; give one of them")
    data = {name: _section_data(name, text) for name, text in candidate.items()
            if name in SECTIONS}
    data.update({site: program_section(site, candidate[f"{site}.program"])
                 for site in PROGRAM_SITES if f"{site}.program" in candidate})
    try:
        policy = load_blis_policy_config(data, config.policy)
    except ConfigError as e:  # name the candidate's component, not a configuration file's
        raise ConfigError(_POLICY_FIELD.sub("candidate.", str(e), count=1)) from None
    return dataclasses.replace(config, policy=policy)


#: The fields of a site's section that its program knobs set (``apply_knobs`` sets a site's
#: ``policy``, ``program`` and ``params.<name>`` together).
_PROGRAM_FIELDS = ("policy", "program", "tree", "params")


def _program_knobs(site: str, old: Any, new: Any) -> dict[str, Any]:
    """The knobs turning section ``old`` of ``site`` into ``new`` in its policy, program and
    parameters: ``<site>.policy``, ``<site>.program`` (the expression; a configuration holds a
    tree as its expression) and ``<site>.params.<name>`` per parameter that is new or changed."""
    knobs: dict[str, Any] = {}
    if old.policy != new.policy:
        knobs[f"{site}.policy"] = new.policy
    if old.program != new.program:
        knobs[f"{site}.program"] = new.program
    before = dict(old.params)
    for name, value in new.params:
        if before.get(name) != value:
            knobs[f"{site}.params.{name}"] = value
    return knobs


def policy_knobs(base: SimConfig, config: SimConfig) -> dict[str, Any] | None:
    """The per-lane knobs that turn ``base``'s policy into ``config``'s (None when some
    difference is not a knob, or the configurations differ outside their policies): what lets
    a candidate be one lane of the experiment's compiled JAX program."""
    if dataclasses.replace(config, policy=base.policy) != base:
        return None
    knobs: dict[str, Any] = {}
    old, new = base.policy, config.policy
    for section in ("admission", "priority", "routing", "autoscaler"):
        a, b = getattr(old, section), getattr(new, section)
        skip = ("scorers",) + _PROGRAM_FIELDS if section in PROGRAM_SITES else ()
        for f in dataclasses.fields(a):
            if f.name not in skip and getattr(a, f.name) != getattr(b, f.name):
                knobs[f"{section}.{f.name}"] = getattr(b, f.name)
        if section in PROGRAM_SITES:
            knobs.update(_program_knobs(section, a, b))
    if old.scheduler != new.scheduler:
        knobs["scheduler.policy"] = new.scheduler.policy
    weights = {s.name: s.weight for s in new.routing.scorers}
    for name in dict.fromkeys([s.name for s in old.routing.scorers] + list(weights)):
        if weights.get(name, 0.0) != next((s.weight for s in old.routing.scorers
                                           if s.name == name), None):
            knobs[f"routing.scorers.{name}"] = weights.get(name, 0.0)
    from search.evaluate import apply_knobs  # (imports the JAX engine)

    try:
        if apply_knobs(base, knobs) != config:  # e.g. scorers in another order
            return None
    except ConfigError:
        return None
    return knobs


# ---- scoring ---------------------------------------------------------------------------------


def _outcome(case: WorkloadCase, objective: Expression, metrics: dict[str, Any],
             engine: str) -> CaseOutcome:
    """The scored outcome of one run (a NaN objective, e.g. a division by zero, fails)."""
    flat = flatten_metrics(metrics)
    score = objective.evaluate(flat, "objective")
    if math.isnan(score):
        return CaseOutcome(case, FAILED_SCORE, flat, engine,
                           f"the objective {objective.text!r} is not a number on this run")
    return CaseOutcome(case, score, flat, engine, None)


#: Which engine scores candidates (``evaluate_candidates``).
ENGINES = ("auto", "jax", "reference")


def check_engine(engine: str) -> None:
    """``ConfigError`` unless ``engine`` is one of ``ENGINES``."""
    if engine not in ENGINES:
        raise ConfigError("engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")


def evaluate_candidates(candidates: Sequence[Mapping[str, str]], cases: Sequence[WorkloadCase],
                        objective: str = "fitness", engine: str = "auto"
                        ) -> list[list[CaseOutcome]]:
    """Score every candidate on every case: ``[candidate][case]`` outcomes.

    ``engine``: ``"auto"`` (per case, the candidates expressible as knobs of the experiment in
    one JAX population call, the rest in the reference engine), ``"jax"`` (refuse the rest:
    they get an error outcome) or ``"reference"`` (every candidate in the reference engine).
    An objective that a case's metrics cannot evaluate is a ``ConfigError``; everything a
    candidate gets wrong is its own outcome's ``error``.
    """
    check_engine(engine)
    expr = compile_expression(objective)
    out: list[list[CaseOutcome | None]] = [[None] * len(cases) for _ in candidates]
    for j, case in enumerate(cases):
        lanes: list[tuple[int, dict[str, Any]]] = []
        for i, cand in enumerate(candidates):
            try:
                cfg = candidate_config(case.config, cand)
                resolve_config(cfg)  # cross-field checks
            except (ConfigError, ValueError) as e:
                out[i][j] = CaseOutcome(case, FAILED_SCORE, {}, None, str(e), invalid=True)
                continue
            knobs = policy_knobs(case.config, cfg) if engine != "reference" else None
            if knobs is not None:
                lanes.append((i, knobs))
            elif engine == "jax":
                out[i][j] = CaseOutcome(case, FAILED_SCORE, {}, None,
                                        "the policy is not a set of per-lane knobs of the "
                                        "experiment's JAX program")
            else:
                out[i][j] = _reference_outcome(case, cfg, expr)
        if lanes:
            for (i, _), outcome in zip(lanes, _jax_outcomes(case, [k for _, k in lanes], expr),
                                       strict=True):
                out[i][j] = outcome
    return out  # type: ignore[return-value]


def _reference_outcome(case: WorkloadCase, cfg: SimConfig, expr: Expression) -> CaseOutcome:
    from blisjax.metrics import config_metrics
    from blisjax.reference import simulate

    workload = case_workload(case)
    result = simulate(resolve_config(cfg), workload)
    metrics = config_metrics(result, workload, cfg)
    return _outcome(case, expr, metrics, "reference")


def make_workload(config: SimConfig, seed: int):
    """The experiment's workload for ``seed`` (``search.evaluate.make_workload``, imported when
    needed: that module starts JAX)."""
    from search.evaluate import make_workload as generate

    return generate(config, seed)


def case_workload(case: WorkloadCase):
    """The case's workload: its seed's, cut to its first ``requests`` requests when set (the
    policy does not change a workload, so the experiment's serves every candidate)."""
    workload = make_workload(case.config, case.seed)
    return workload if case.requests is None else workload.head(case.requests)


def lane_bucket(n: int) -> int:
    """Lanes of the JAX call for ``n`` candidates: the next power of two, at least
    ``MIN_LANES`` — the program is compiled per lane count, so a few sizes serve every batch
    (the padding lanes repeat the first candidate and are dropped)."""
    lanes = MIN_LANES
    while lanes < n:
        lanes *= 2
    return lanes


#: Per experiment (its YAML) and request cut, the workloads its cases have used, by seed: one
#: compiled program (``build_static_shared``) covers them all, so scoring a new minibatch of
#: seeds recompiles only when a workload needs larger capacities than every earlier one.
_SEEN: dict[tuple[str, int | None], dict[int, Any]] = {}


def _workload_and_program(case: WorkloadCase, resolved) -> tuple[Any, Any]:
    """The case's workload and the shared program shape (``EngineStatic``) of its experiment;
    None when the workloads cannot share one (e.g. their tenants differ: per-case shapes)."""
    from blisjax.config import dump_config
    from blisjax.engine.static import build_static_shared

    seen = _SEEN.setdefault((dump_config(case.config), case.requests), {})
    if case.seed not in seen:
        seen[case.seed] = case_workload(case)
    try:
        return seen[case.seed], build_static_shared(resolved, list(seen.values()))
    except ValueError:
        return seen[case.seed], None


def _jax_outcomes(case: WorkloadCase, knob_sets: list[dict[str, Any]],
                  expr: Expression) -> list[CaseOutcome]:
    """One JAX population call: a lane per knob set on the case's experiment."""
    from blisjax.engine.population import evaluate_population

    resolved = resolve_config(case.config)
    workload, static = _workload_and_program(case, resolved)
    padded = knob_sets + [knob_sets[0]] * (lane_bucket(len(knob_sets)) - len(knob_sets))
    population = evaluate_population(resolved, workload, padded, static=static)
    out = []
    for metrics, result in zip(population.metrics[:len(knob_sets)],
                               population.results[:len(knob_sets)], strict=True):
        if result.overflow:
            out.append(CaseOutcome(case, FAILED_SCORE, {}, None,
                                   f"JAX engine capacity exceeded: {result.overflow}"))
            continue
        out.append(_outcome(case, expr, metrics, "jax"))
    return out


def feedback_text(case: WorkloadCase, candidate: Mapping[str, str],
                  strategy: str = "issue_focused", max_tokens: int = 1500,
                  counterfactual_k: int = 3) -> str:
    """The decision-trace text summary of ``candidate`` on ``case`` (a traced reference run);
    for an invalid candidate, the validation message."""
    from blisjax.metrics import config_metrics, per_request_rows
    from blisjax.trace import simulate_traced
    from blisjax.trace.reflect import reflection_text

    try:
        cfg = candidate_config(case.config, candidate)
        resolved = resolve_config(cfg)
    except (ConfigError, ValueError) as e:
        return f"The candidate is not a valid policy: {e}\n"
    workload = case_workload(case)
    result, trace = simulate_traced(resolved, workload, "decisions", counterfactual_k)
    metrics = config_metrics(result, workload, cfg)
    return reflection_text(list(trace.lines()), metrics, cfg, strategy, max_tokens,
                           requests=per_request_rows(result, workload))
