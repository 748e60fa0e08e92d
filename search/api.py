"""High-level policy search and sweeps: validate everything, then run, then write the outputs.

:func:`prepare` checks every input (configuration, space, strategy settings, expressions
against the configuration's real metric keys, seeds, the results directory and — when resuming —
the checkpoint's settings) *without writing anything*, and returns a :class:`Plan`.
:func:`execute` runs the plan and writes the results directory:

* ``history.csv`` — one row per evaluated candidate (see :func:`search.runner.history_columns`);
* ``checkpoint.npz`` — strategy state + history, rewritten after every generation;
* ``summary.json`` — best candidate (knobs, objectives, metrics per seed), baseline (the
  configuration's own policy on the same seeds), Pareto front, held-out comparison;
* ``best_policy.yaml`` — the best policy as a BLIS policy bundle
  (``blisjax run --config CONFIG --policy-config best_policy.yaml``), and ``best_config.yaml``
  — the whole experiment with that policy (``blisjax run --config best_config.yaml``);
* ``endpoint_picker.yaml`` — the best policy's weighted routing as an llm-d
  ``EndpointPickerConfig`` (:mod:`search.llmd`); absent, with the reason in the summary, when
  the policy has no llm-d counterpart;
* ``best_program.txt`` — a program search's (``--strategy gp``) best program as an expression
  and as a decision tree (also ``summary.json``'s ``best.program``);
* ``pareto.csv`` (several objectives), ``convergence.png``, ``pareto.png`` (several
  objectives), ``sweep.png`` (sweeps over 1–2 knobs; more: the first two, best over the rest).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from blisjax.config import ConfigError, SimConfig, config_to_dict, load_config, resolve_config
from blisjax.devices import usable_cores
from blisjax.engine.params import LANE_SETTINGS
from search.backends.reference import ReferenceBackend
from search.evaluate import (
    SimulationProblem,
    apply_knobs,
    default_seeds,
    make_workload,
    probe_metrics,
)
from search.expr import compile_constraint, compile_expression, flatten_metrics
from search.io import (
    CHECKPOINT,
    bundle_left_out,
    endpoint_picker_name,
    json_safe,
    load_checkpoint,
    write_csv_atomic,
    write_json_atomic,
    write_policy_exports,
    write_text_atomic,
)
from search.llmd import (
    DEFAULT_API_VERSION,
    ENDPOINT_PICKER,
    check_api_version,
    endpoint_picker_config,
)
from search.objectives import CONSTRAINT_MODES, ROBUST_STATISTICS, Robust, Scoring
from search.plots import plot_convergence, plot_pareto, plot_sweep
from search.runner import (
    GenerationReport,
    Record,
    SearchResult,
    diff_keys,
    fingerprint_text,
    run_search,
)
from search.space import ChoiceKnob, SearchSpace, load_space
from search.strategies import STRATEGIES, GridSweep, make_strategy

__all__ = ["MAX_POPULATION", "Plan", "execute", "prepare"]

MAX_POPULATION = 4096
MAX_GENERATIONS = 100_000
MAX_SEEDS = 64
MAX_GRID_POINTS = 100_000
SEED_MAX = 2**63 - 1


@dataclass
class Plan:
    """A validated search or sweep, ready to run (nothing written yet)."""

    kind: str  # "search" | "sweep"
    config: SimConfig
    resolved: Any
    space: SearchSpace
    scoring: Scoring
    strategy: str
    population: int
    generations: int
    seed: int
    seeds: tuple[int, ...]
    holdout_seeds: tuple[int, ...] = ()
    out_dir: Path | None = None
    resume: bool = False
    sigma: float | None = None
    learning_rate: float | None = None
    grid: list[dict] = field(default_factory=list)
    config_label: str = ""
    warnings: list[str] = field(default_factory=list)
    #: apiVersion of ``endpoint_picker.yaml`` (post-processing only, not part of the
    #: fingerprint, so a resumed run may change it).
    llmd_api_version: str = DEFAULT_API_VERSION
    #: "jax", "reference" or "auto" (``choose_engine``); not part of the fingerprint: both
    #: engines give the same bits, so a resumed run may change it.
    engine: str = "auto"

    @property
    def fingerprint(self) -> dict:
        """Settings that must match to resume (everything but the generation count and the
        held-out seeds, which only affect post-processing)."""
        return {"kind": self.kind, "config": config_to_dict(self.config),
                "space": self.space.to_mapping(), "strategy": self.strategy,
                "population": self.population, "seed": self.seed, "seeds": list(self.seeds),
                "objectives": list(self.scoring.objective_texts),
                "constraints": list(self.scoring.constraint_texts),
                "robust": self.scoring.robust.statistic, "cvar_alpha": self.scoring.robust.alpha,
                "constraint_mode": self.scoring.constraint_mode,
                "penalty": self.scoring.penalty, "sigma": self.sigma,
                "learning_rate": self.learning_rate}


# ---- validation helpers ----------------------------------------------------------------------


def check_int(flag: str, value: Any, low: int, high: int) -> int:
    """An integer in [low, high] (strings are parsed), else ConfigError naming ``flag``."""
    text = value
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(flag, f"must be an integer in [{low}, {high}], got {text!r}") \
                from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not low <= int(value) <= high:
        raise ConfigError(flag, f"must be an integer in [{low}, {high}], got {text!r}")
    return int(value)


def check_float(flag: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    """A finite number in [low, high] (or (low, high]), else ConfigError naming ``flag``."""
    text = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    rng = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value > high or value < low \
            or (low_open and value == low):
        raise ConfigError(flag, f"must be a number in {rng}, got {text!r}")
    return float(value)


def parse_seed_list(flag: str, text: str | Sequence[int]) -> tuple[int, ...]:
    """``"1,2,3"`` (or a sequence) → distinct seeds in [0, 2^63 − 1], at most 64."""
    items = text.split(",") if isinstance(text, str) else list(text)
    seeds = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            raise ConfigError(flag, f"must be a comma-separated list of integers, got {text!r}")
        seeds.append(check_int(flag, item, 0, SEED_MAX))
    if not seeds or len(seeds) > MAX_SEEDS:
        raise ConfigError(flag, f"needs 1 to {MAX_SEEDS} seeds, got {len(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(flag, f"must not repeat a seed, got {text!r}")
    return tuple(seeds)


def _load(config: str | Path | SimConfig) -> tuple[SimConfig, str]:
    if isinstance(config, SimConfig):
        return config, "<config>"
    path = Path(config)
    if not path.is_file():
        raise ConfigError("CONFIG", f"no such file: {str(config)!r}")
    return load_config(path), path.name


def _check_out_dir(out_dir: Path | None, resume: bool, fingerprint: dict,
                   generations: int) -> None:
    if out_dir is None:
        if resume:
            raise ConfigError("--resume", "needs --out DIR (the directory of the run)")
        return
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("--out", f"{str(out_dir)!r} exists and is not a directory")
    ckpt = out_dir / CHECKPOINT
    if resume:
        if not ckpt.is_file():
            raise ConfigError("--resume", f"no checkpoint in {str(out_dir)!r} (start without "
                              "--resume)")
        try:
            _, meta = load_checkpoint(ckpt)
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError("--resume", f"unreadable checkpoint {str(ckpt)!r}: {err}") \
                from None
        stored = meta.get("fingerprint", {})
        if fingerprint_text(stored) != fingerprint_text(fingerprint):
            raise ConfigError("--resume", f"the run in {str(out_dir)!r} used different "
                              f"settings ({', '.join(diff_keys(stored, fingerprint))}); give "
                              "the original arguments or a new --out")
        done = int(meta.get("generation", 0))
        if generations < done:
            raise ConfigError("--generations", f"the run in {str(out_dir)!r} already has {done}"
                              f" generations; give at least {done}")
    elif ckpt.exists():
        raise ConfigError("--out", f"{str(out_dir)!r} already holds a run; use --resume to "
                          "continue it or choose a new directory")


def _scoring(config: SimConfig, objectives: Sequence[str] | None,
             constraints: Sequence[str], robust: str, cvar_alpha: Any, constraint_mode: str,
             penalty: Any) -> Scoring:
    if not objectives:
        if not config.metrics.fitness_weights:
            raise ConfigError("--objective", "not given, and the configuration has no "
                              "metrics.fitness_weights for the default objective 'fitness'; "
                              "give an expression, e.g. --objective=-ttft_p99_ms")
        objectives = ["fitness"]
    if robust not in ROBUST_STATISTICS:
        raise ConfigError("--robust", f"must be one of {', '.join(ROBUST_STATISTICS)}, got "
                          f"{robust!r}")
    if constraint_mode not in CONSTRAINT_MODES:
        raise ConfigError("--constraint-mode", f"must be one of {', '.join(CONSTRAINT_MODES)},"
                          f" got {constraint_mode!r}")
    alpha = check_float("--cvar-alpha", cvar_alpha, 0.0, 1.0, low_open=True)
    pen = check_float("--penalty", penalty, 0.0, 1e15)
    objs = tuple(compile_expression(o, "--objective") for o in objectives)
    texts = [o.text for o in objs]
    if len(set(texts)) != len(texts):
        raise ConfigError("--objective", f"repeats an expression: {texts}")
    cons = tuple(compile_constraint(c, "--constraint") for c in constraints)
    return Scoring(objs, cons, Robust(robust, alpha), constraint_mode, pen)


def prepare(kind: str, config: str | Path | SimConfig, *, space: SearchSpace | str | Path | None
            = None, grid: Sequence[tuple[str, Sequence[Any]]] = (), strategy: str = "cma",
            population: Any = 8, generations: Any = 10, seed: Any = 0,
            objectives: Sequence[str] | None = None, constraints: Sequence[str] = (),
            seeds: str | Sequence[int] | None = None, holdout_seeds: str | Sequence[int] | None
            = None, robust: str = "mean", cvar_alpha: Any = 0.25, constraint_mode: str =
            "filter", penalty: Any = 1000.0, out_dir: str | Path | None = None,
            resume: bool = False, sigma: Any = None, learning_rate: Any = None,
            batch: Any = None, llmd_api_version: str = DEFAULT_API_VERSION,
            engine: str = "auto", traces: Sequence[tuple[str, str]] | None = None) -> Plan:
    """Validate a search (``kind="search"``, with ``space``) or a sweep (``kind="sweep"``, with
    ``grid`` = [(knob, values), ...]) and return its :class:`Plan`. Writes nothing.
    ``llmd_api_version`` is the apiVersion of ``endpoint_picker.yaml``
    (``search.llmd.API_VERSIONS``). ``traces``: (header, data) paths of TraceV2 traces that
    replace the configuration's workload section (``workload.traces``; seed k is the k-th
    trace). ``engine``: where candidates are simulated — "jax" (one
    population call per generation and seed), "reference" (one reference run per candidate
    and seed) or "auto" (``choose_engine``: whichever is estimated to finish first).

    Raises:
      ConfigError: the first invalid input, naming the argument and the allowed values.
    """
    if kind not in ("search", "sweep"):
        raise ValueError(f"kind must be 'search' or 'sweep', got {kind!r}")
    if engine not in ENGINES:
        raise ConfigError("--engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    cfg, label = _load(config)
    if traces:
        cfg = dataclasses.replace(cfg, workload={"traces": [
            {"header": str(h), "data": str(d)} for h, d in traces]})
    resolved = resolve_config(cfg)
    train_seeds = parse_seed_list("--seeds", seeds) if seeds is not None else default_seeds(cfg)
    held = parse_seed_list("--holdout-seeds", holdout_seeds) if holdout_seeds else ()
    overlap = sorted(set(held) & set(train_seeds))
    if overlap:
        raise ConfigError("--holdout-seeds", f"must not repeat a training seed (--seeds), got "
                          f"{overlap}")
    grid_points: list[dict] = []
    if kind == "search":
        if space is None:
            raise ConfigError("--space", "is required")
        space_obj = space if isinstance(space, SearchSpace) else load_space(space)
        if strategy not in STRATEGIES:
            raise ConfigError("--strategy", f"must be one of {', '.join(STRATEGIES)}, got "
                              f"{strategy!r}")
        _check_program_strategy(space_obj, strategy)
        pop = check_int("--population", population, 2, MAX_POPULATION)
        if space_obj.program is not None and len(space_obj.program.seeds) > pop:
            raise ConfigError("--population", f"must be at least the number of seed programs "
                              f"(space.program.seeds: {len(space_obj.program.seeds)}), got {pop}")
        if space_obj.param_names():
            cfg = space_obj.declare_params(cfg)
            resolved = resolve_config(cfg)
        if strategy == "openes" and pop % 2:
            raise ConfigError("--population", f"must be even for openes (antithetic pairs), "
                              f"got {pop}")
        gens = check_int("--generations", generations, 1, MAX_GENERATIONS)
    else:
        if not grid:
            raise ConfigError("--grid", "needs at least one knob=values axis")
        space_obj = SearchSpace(tuple(ChoiceKnob(name, tuple(values)) for name, values in grid))
        total = math.prod(len(v) for _, v in grid)
        if total > MAX_GRID_POINTS:
            raise ConfigError("--grid", f"has {total} points, at most {MAX_GRID_POINTS}")
        grid_points = space_obj.grid_points()
        pop = check_int("--batch", batch, 1, MAX_POPULATION) if batch is not None \
            else min(len(grid_points), 64)
        gens = math.ceil(len(grid_points) / pop)
        strategy = "grid"
    seed_value = check_int("--seed", seed, 0, SEED_MAX)
    api_version = check_api_version(llmd_api_version)
    sig = check_float("--sigma", sigma, 0.0, 10.0, low_open=True) if sigma is not None else None
    lr = (check_float("--learning-rate", learning_rate, 0.0, 10.0, low_open=True)
          if learning_rate is not None else None)
    space_obj.validate_against(cfg)
    scoring = _scoring(cfg, objectives, constraints, robust, cvar_alpha, constraint_mode,
                       penalty)
    workload = make_workload(cfg, train_seeds[0])
    scoring.check_names(probe_metrics(resolved, workload))
    plan = Plan(kind, cfg, resolved, space_obj, scoring, strategy, pop, gens, seed_value,
                train_seeds, held, Path(out_dir) if out_dir is not None else None, resume, sig,
                lr, grid_points, label, llmd_api_version=api_version, engine=engine)
    _check_out_dir(plan.out_dir, resume, plan.fingerprint, gens)
    plan.warnings = _warnings(cfg, space_obj)
    return plan


def _check_program_strategy(space: SearchSpace, strategy: str) -> None:
    """A program section needs ``--strategy gp`` and ``gp`` needs one."""
    if strategy == "gp" and space.program is None:
        raise ConfigError("--space", "--strategy gp searches over a policy program: the space "
                          "needs a program section (program: {site: routing, ...})")
    if space.program is not None and strategy != "gp":
        raise ConfigError("--strategy", f"the space has a program section, which only "
                          f"--strategy gp searches, got {strategy!r}")


def _warnings(cfg: SimConfig, space: SearchSpace) -> list[str]:
    """Settings that are valid but probably not what was meant."""
    out = []
    scorers = [n for n in space.names if n.startswith("routing.scorers.")]
    if scorers and "routing.policy" not in space.names \
            and cfg.policy.routing.policy != "weighted":
        out.append(f"routing.policy is {cfg.policy.routing.policy!r}, so the scorer weights "
                   f"{', '.join(scorers)} have no effect (set policy.routing.policy: weighted)")
    return out


# ---- running ----------------------------------------------------------------------------------

#: ``--engine`` values of sweep, search and the adapters.
ENGINES = ("auto", "jax", "reference")
#: Seconds to compile one population program, as ``choose_engine`` estimates it: the order
#: measured on 2 cores whatever the cluster's size (docs/performance.md, Policy search: 38–51 s
#: for 1 to 16 instances, P/D pools and CPU tiers included).
JAX_COMPILE_S = 45.0
#: How many times faster than a reference run ``choose_engine`` takes a JAX lane to be, when
#: one call runs ``lanes`` of them: ``1 + lanes / JAX_LANES_PER_SPEEDUP`` (lanes share each
#: lockstep iteration's work), at most ``JAX_SPEEDUP_PER_CORE`` per usable core. Measured on
#: 2 cores it ranges from 5–6× (the cost example, 16 and 32 lanes; P/D pools, 16 lanes) to
#: 16–32× (64 lanes of the anchor workload and scenario S; docs/performance.md); the rule
#: keeps to the low side of that.
JAX_LANES_PER_SPEEDUP = 8.0
JAX_SPEEDUP_PER_CORE = 10.0
#: The configuration or the space holds a CPU tier: lanes whose tiers thrash run in small
#: lane blocks, about as fast as the reference (1.06× at 64 lanes, docs/performance.md).
JAX_TIER_SPEEDUP = 1.0
#: Requests of the reference probe that times one simulation (scaled to the workload's).
_PROBE_REQUESTS = 200


def planned_simulations(plan: Plan) -> int:
    """Simulations a plan runs: every candidate (and the baseline) on every seed, the held-out
    comparison (baseline and best on each held-out seed) and the llm-d approximation."""
    candidates = len(plan.grid) if plan.kind == "sweep" else plan.population * plan.generations
    return (candidates + 2) * len(plan.seeds) + 2 * len(plan.holdout_seeds)


def reference_seconds(plan: Plan) -> float:
    """Estimated seconds of one reference run of the plan's workload: a timed run of its
    first requests, scaled by the request count."""
    from blisjax.reference import simulate

    workload = make_workload(plan.config, plan.seeds[0])
    n = workload.num_requests
    head = workload.head(min(n, _PROBE_REQUESTS))
    start = time.perf_counter()
    simulate(plan.resolved, head)
    return (time.perf_counter() - start) * n / max(head.num_requests, 1)


def jax_speedup(plan: Plan) -> float:
    """Estimated speed of one JAX lane against a reference run of the plan's workload
    (``JAX_LANES_PER_SPEEDUP``, ``JAX_SPEEDUP_PER_CORE``, ``JAX_TIER_SPEEDUP``)."""
    if "engine.kv_cpu_blocks" in plan.space.names or plan.config.engine.kv_cpu_blocks > 0:
        return JAX_TIER_SPEEDUP
    return min(1.0 + plan.population / JAX_LANES_PER_SPEEDUP,
               JAX_SPEEDUP_PER_CORE * usable_cores())


def choose_engine(plan: Plan) -> tuple[str, str]:
    """(engine, why) for a plan whose ``engine`` is "auto": the reference engine when its
    runs are estimated to take no longer than compiling the JAX program and running the
    lanes there (``JAX_COMPILE_S``, ``jax_speedup``); else JAX."""
    if plan.engine != "auto":
        return plan.engine, f"--engine {plan.engine}"
    sims = planned_simulations(plan)
    one = reference_seconds(plan)
    on_reference = sims * one
    speedup = jax_speedup(plan)  # held-out seeds run on the search's program (extra_seeds)
    on_jax = JAX_COMPILE_S + on_reference / speedup
    engine = "reference" if on_reference <= on_jax else "jax"
    return engine, (f"--engine auto: {sims} simulations of ~{one:.2f} s on the reference "
                    f"engine (~{on_reference:.0f} s) against ~{on_jax:.0f} s on the JAX engine "
                    f"(~{JAX_COMPILE_S:.0f} s of compile; {plan.population} lanes "
                    f"~{speedup:.1f}x a reference run)")


def _strategy(plan: Plan) -> Any:
    template = plan.space.template()
    if plan.kind == "sweep":
        return GridSweep(template, plan.space.encode(plan.grid), plan.population)
    return make_strategy(plan.strategy, template, plan.population,
                         num_objectives=len(plan.scoring.objectives), sigma=plan.sigma,
                         learning_rate=plan.learning_rate, program=plan.space.program)


def _chosen(result: SearchResult, scoring: Scoring) -> Record | None:
    """The exported candidate: the best (one objective) or the front member with the highest
    first objective (several objectives)."""
    if not scoring.multi_objective or not result.front:
        return result.best
    return max((result.records[i] for i in result.front),
               key=lambda r: (r.objectives[0], -r.generation, -r.candidate))


def _metrics_of(result: SearchResult, chosen: Record | None) -> list:
    return result.best_metrics if chosen is result.best else []


def _named_values(e, names: Sequence[str]) -> dict:
    """The metric values an evaluation's expressions read (first seed), e.g. slo_attainment."""
    if not e.metrics:
        return {}
    flat = flatten_metrics(e.metrics[0])
    return {n: flat[n] for n in dict.fromkeys(names) if n in flat}


def holdout_comparison(problem: SimulationProblem, chosen: Record, seeds: Sequence[int]
                       ) -> dict:
    """Baseline (the configuration's policy) vs ``chosen`` on held-out seeds, per seed."""
    per_seed: dict[str, Any] = {}
    texts = problem.scoring.objective_texts
    base_vals: list[list[float]] = []
    best_vals: list[list[float]] = []
    held = problem.with_seeds(list(seeds))  # one engine program covers every held-out seed
    for s in seeds:
        one = held.with_seeds([s], same_program=True)
        base, best = one.evaluate([{}, dict(chosen.knobs)])
        base_vals.append(list(base.objectives))
        best_vals.append(list(best.objectives))
        cons = problem.scoring.constraint_texts
        names = [n for e in (*problem.scoring.objectives, *problem.scoring.constraints)
                 for n in e.names]
        per_seed[str(s)] = {
            "baseline_values": _named_values(base, names),
            "best_values": _named_values(best, names),
            "baseline": dict(zip(texts, base.objectives, strict=True)),
            "best": dict(zip(texts, best.objectives, strict=True)),
            "baseline_violations": dict(zip(cons, base.violations, strict=True)),
            "best_violations": dict(zip(cons, best.violations, strict=True)),
            "baseline_feasible": base.feasible, "best_feasible": best.feasible}
    b, w = np.array(base_vals), np.array(best_vals)
    return {"seeds": list(seeds), "per_seed": per_seed,
            "baseline_mean": dict(zip(texts, b.mean(axis=0), strict=True)),
            "best_mean": dict(zip(texts, w.mean(axis=0), strict=True)),
            "best_wins": {t: int(np.sum(w[:, j] > b[:, j])) for j, t in enumerate(texts)}}


def _record_summary(rec: Record, scoring: Scoring) -> dict:
    return {"generation": rec.generation, "candidate": rec.candidate, "knobs": rec.knobs,
            "fitness": rec.fitness,
            "objectives": dict(zip(scoring.objective_texts, rec.objectives, strict=True)),
            "violations": dict(zip(scoring.constraint_texts, rec.violations, strict=True)),
            "feasible": rec.feasible, "note": rec.note}


def llmd_approximation(problem: SimulationProblem, plan: Plan, chosen: Record) -> dict | None:
    """When the chosen policy's llm-d EndpointPickerConfig cannot carry every scorer
    (``search.llmd``), the policy llm-d would run from it, simulated on the search's seeds:
    the left-out scorers, the knobs simulated, and its objectives beside the searched
    policy's. None when the export is exact or there is none."""
    cfg = apply_knobs(plan.config, chosen.knobs)
    export = endpoint_picker_config(cfg, plan.llmd_api_version)
    if export.text is None or not export.left_out:
        return None
    knobs = {**chosen.knobs, **export.knobs}
    approx = problem.evaluate([knobs])[0]
    texts, cons = plan.scoring.objective_texts, plan.scoring.constraint_texts
    return {"exact": False, "left_out": list(export.left_out), "knobs": knobs,
            "objectives": dict(zip(texts, approx.objectives, strict=True)),
            "violations": dict(zip(cons, approx.violations, strict=True)),
            "feasible": approx.feasible, "note": approx.note,
            "searched_objectives": dict(zip(texts, chosen.objectives, strict=True)),
            "searched_feasible": chosen.feasible}


def _report_llmd(llmd: dict, stream: TextIO) -> None:
    """The llm-d approximation's score beside the searched policy's, on ``stream``."""
    print(f"warning: {ENDPOINT_PICKER} is an approximation, llm-d routes without: "
          + "; ".join(llmd["left_out"]), file=stream)
    for text, value in llmd["objectives"].items():
        print(f"  {text}: searched policy {llmd['searched_objectives'][text]!r}, "
              f"as llm-d would run it {value!r}", file=stream)
    print(f"  feasible: searched policy {llmd['searched_feasible']}, as llm-d would run it "
          f"{llmd['feasible']}", file=stream, flush=True)


def finalize(plan: Plan, result: SearchResult, holdout: dict | None = None,
             llmd: dict | None = None) -> dict:
    """Write summary.json, the policy exports, pareto.csv and the plots; return the summary.
    ``llmd``: the llm-d approximation's evaluation (``llmd_approximation``)."""
    scoring, space = plan.scoring, plan.space
    chosen = _chosen(result, scoring)
    summary: dict[str, Any] = {
        "kind": plan.kind, "config": plan.config_label, "strategy": plan.strategy,
        "population": plan.population, "generations": result.generations, "seed": plan.seed,
        "workload_seeds": list(plan.seeds), "objectives": list(scoring.objective_texts),
        "constraints": list(scoring.constraint_texts), "robust": scoring.robust.statistic,
        "constraint_mode": scoring.constraint_mode, "evaluations": len(result.records),
        "feasible_evaluations": sum(r.feasible for r in result.records),
        "baseline": ({**result.baseline, "knobs": baseline_knobs(plan)}
                     if result.baseline is not None else None),
        "best": _record_summary(chosen, scoring) if chosen is not None else None,
    }
    if chosen is not None and space.program is not None:
        summary["best"]["program"] = program_summary(space.program.site,
                                                     chosen.knobs[space.program.knob])
    if chosen is not None:
        summary["best"]["metrics_per_seed"] = _metrics_of(result, chosen)
    if scoring.multi_objective:
        summary["pareto_front"] = [_record_summary(result.records[i], scoring)
                                   for i in result.front]
    if holdout is not None:
        summary["holdout"] = holdout
    out = plan.out_dir
    if out is None:
        return json_safe(summary)
    files = {"history": "history.csv", "checkpoint": CHECKPOINT, "summary": "summary.json"}
    if chosen is not None:
        header = [f"blisjax {plan.kind} best policy ({plan.config_label}, strategy "
                  f"{plan.strategy}, seed {plan.seed})",
                  "objectives (maximised): " + "; ".join(
                      f"{t} = {v!r}" for t, v in zip(scoring.objective_texts, chosen.objectives,
                                                     strict=True)),
                  "knobs: " + ", ".join(f"{k}={v!r}" for k, v in chosen.knobs.items())]
        cfg = apply_knobs(plan.config, chosen.knobs)
        left_out = bundle_left_out(chosen.knobs)
        write_policy_exports(out, cfg, header, llmd_api_version=plan.llmd_api_version,
                             left_out=left_out)
        if left_out:
            summary["policy_bundle_left_out"] = left_out
        files.update(best_policy="best_policy.yaml", best_config="best_config.yaml")
        if space.program is not None:
            write_text_atomic(out / BEST_PROGRAM, program_file_text(summary["best"]["program"]))
            files["best_program"] = BEST_PROGRAM
        picker = endpoint_picker_config(cfg, plan.llmd_api_version)
        if picker.text is not None:
            files["endpoint_picker"] = endpoint_picker_name()
            summary["endpoint_picker"] = llmd if llmd is not None else {"exact": True}
        else:
            summary["endpoint_picker_note"] = picker.reason
    if result.records:
        plot_convergence(result.records, out / "convergence.png", scoring.objective_texts,
                         result.baseline, title=f"{plan.kind} {plan.strategy}: "
                                                f"{plan.config_label}")
        files["convergence_plot"] = "convergence.png"
    if scoring.multi_objective:
        cols = [*space.names, *(f"objective[{t}]" for t in scoring.objective_texts)]
        rows = [[*(result.records[i].knobs[n] for n in space.names),
                 *result.records[i].objectives] for i in result.front]
        write_csv_atomic(out / "pareto.csv", cols, rows)
        files["pareto"] = "pareto.csv"
        plot_pareto(result.records, result.front, out / "pareto.png", scoring.objective_texts,
                    result.baseline, title=plan.config_label)
        files["pareto_plot"] = "pareto.png"
    if plan.kind == "sweep" and result.records:
        plot_sweep(result.records, space.names[:2], out / "sweep.png",
                   scoring.objective_texts[0], title=plan.config_label)
        files["sweep_plot"] = "sweep.png"
    summary["files"] = files
    write_json_atomic(out / "summary.json", summary)
    return json_safe(summary)


def execute(plan: Plan, *, progress: bool | TextIO = True,
            callback: Callable[[GenerationReport], None] | None = None,
            problem: SimulationProblem | None = None, backend=None) -> dict:
    """Run a prepared plan and write its results directory; returns the summary dict.
    ``backend``: where the simulations run (``search.backends``; default this process) —
    the files written are the same bytes on every backend."""
    if problem is None and backend is None:
        engine, why = choose_engine(plan)
        if progress:
            print(f"{plan.kind}: {engine} engine ({why})",
                  file=sys.stderr if progress is True else progress, flush=True)
        if engine == "reference":
            backend = ReferenceBackend()
    elif plan.engine == "reference":
        raise ConfigError("--engine", "reference runs in this process: not with a backend "
                          "(--ray) or a prepared problem")
    if problem is None:
        sites = (plan.space.program.site,) if plan.space.program is not None else ()
        problem = SimulationProblem(plan.resolved, plan.seeds, plan.scoring, plan.population,
                                    capacities=search_capacities(plan.space), backend=backend,
                                    program_sites=sites, extra_seeds=plan.holdout_seeds)
    elif backend is not None:
        raise ValueError("give the backend to the SimulationProblem, not to execute, when "
                         "passing a problem")
    result = run_search(plan.space, _strategy(plan), problem.evaluate, plan.scoring,
                        generations=plan.generations, seed=plan.seed, out_dir=plan.out_dir,
                        resume=plan.resume, fingerprint=plan.fingerprint,
                        robust_columns=plan.scoring.robust if len(plan.seeds) > 1 else None,
                        baseline={}, progress=progress, callback=callback, label=plan.kind)
    holdout = None
    chosen = _chosen(result, plan.scoring)
    if plan.holdout_seeds and chosen is not None:
        if progress:
            print(f"{plan.kind}: comparing the best policy with the configured one on held-out "
                  f"seeds {', '.join(map(str, plan.holdout_seeds))}",
                  file=sys.stderr if progress is True else progress, flush=True)
        holdout = holdout_comparison(problem, chosen, plan.holdout_seeds)
    llmd = llmd_approximation(problem, plan, chosen) if chosen is not None else None
    if llmd is not None and progress:
        _report_llmd(llmd, sys.stderr if progress is True else progress)
    return finalize(plan, result, holdout, llmd)


#: The best program of a program search, as text and as a decision tree.
BEST_PROGRAM = "best_program.txt"


def program_summary(site: str, text: str) -> dict[str, Any]:
    """A program's entry in ``summary.json``: its site, text, node count and decision tree
    (``blisjax.program.tree_text``, one list item per line)."""
    from blisjax.program.language import parse, size, tree_text

    node = parse(text, path=f"{site}.program")
    return {"site": site, "text": text, "nodes": size(node),
            "tree": tree_text(node).splitlines()}


def program_file_text(program: Mapping[str, Any]) -> str:
    """``best_program.txt``: the site and size as comments, the expression, then the tree."""
    return (f"# best {program['site']} program ({program['nodes']} nodes)\n"
            f"{program['text']}\n\n# as a decision tree\n" + "\n".join(program["tree"]) + "\n")


def search_capacities(space) -> dict[str, Any]:
    """JAX-engine capacities a space needs beyond its base configuration's, so that every
    generation runs one program: a CPU-tier size knob compiles the tier at its largest value,
    a cluster-size knob compiles the routing among each lane's own instances, a GPU-type knob
    the latency of each of its GPUs, a knob of the cluster's settings (the token budget, the
    latencies, …) each lane's reading of its own."""
    out: dict[str, Any] = {}
    if "cluster.num_instances" in space.names:  # one program for every generation's sizes
        out["sized_lanes"] = True
    if "hardware" in space.names:
        out["gpus"] = tuple(space.knob("hardware").extremes())
    if "engine.kv_cpu_blocks" in space.names:
        out["cpu_tier_blocks"] = int(max(space.knob("engine.kv_cpu_blocks").extremes()))
    if any(name in LANE_SETTINGS.values() for name in space.names):
        out["lane_settings"] = True
    return out


def baseline_knobs(plan: Plan) -> Mapping[str, Any]:
    """The base configuration's values of the searched knobs (for reports). With a program
    section: also ``<site>.policy``; the program and its parameters are None unless the
    configured policy there is ``program`` (``declare_params`` may have added them unused)."""
    from search.space import get_knob

    out = {name: get_knob(plan.config, name) for name in plan.space.names}
    spec = plan.space.program
    if spec is not None:
        policy = get_knob(plan.config, spec.policy_knob)
        if policy != "program":
            out.update((name, None) for name in out
                       if name == spec.knob or name.startswith(f"{spec.site}.params."))
        out[spec.policy_knob] = policy
    return out
