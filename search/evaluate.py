"""Evaluate knob sets by simulation: one ``evaluate_population`` call per workload seed.

:class:`SimulationProblem` owns the resolved base configuration, one generated workload per seed
(``blisjax.workload.generate_workload(parse_workload_spec(cfg.workload), seed)``, as ``blisjax
run`` does) and the scoring. ``evaluate(knob_sets)`` pads the knob sets to a fixed number of
lanes (the JAX program is compiled once per workload shape *and* lane count, so a fixed lane
count means one compile per seed for a whole search), runs every seed, and scores each
candidate. A knob set that is not a valid configuration (e.g. every routing weight 0) is not
simulated: its lane runs the base configuration and the candidate is reported invalid; so is a
lane whose engine capacities overflowed.

Where the engine calls run is the problem's *backend* (``search.backends``): this process by
default, or a Ray cluster (``RayBackend``); every call of one ``evaluate`` goes to the backend
at once, and the results are the same bits either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from blisjax.config import ConfigError, SimConfig
from blisjax.engine.population import apply_knobs
from blisjax.engine.static import build_static_shared
from blisjax.engine.static_lanes import with_program_sites
from blisjax.workload import Workload, section_traces, workload_from_section
from search.backends import LocalBackend, PopulationJob, Unit
from search.expr import flatten_metrics
from search.objectives import CandidateEval, Scoring, invalid_candidate, score_candidate

__all__ = ["SimulationProblem", "apply_knobs", "default_seeds", "make_workload", "probe_metrics"]


def make_workload(config: SimConfig, seed: int) -> Workload:
    """The workload of ``config``'s ``workload:`` section for ``seed``: generated with it, or
    the trace at that index of a section that lists traces
    (``blisjax.workload.workload_from_section``)."""
    if config.workload is None:
        raise ConfigError("workload", "the configuration has no workload section (policy "
                          "search generates one workload per seed from it, or reads one "
                          "trace per seed from workload.traces)")
    try:
        return workload_from_section(config.workload, seed)
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(str(err)) from None


def default_seeds(config: SimConfig) -> tuple[int, ...]:
    """Workload seeds when none are given: the configuration's seed, or the first trace."""
    return (0,) if section_traces(config.workload) is not None else (config.seed,)


def probe_metrics(resolved, workload: Workload, requests: int = 3) -> dict[str, float]:
    """Flattened metric keys of this configuration, from a reference-engine run of the first
    few requests (milliseconds; used to validate expressions before a search starts)."""
    from blisjax.metrics import config_metrics
    from blisjax.reference import simulate

    head = workload.head(requests)
    cfg = resolved.config
    result = simulate(resolved, head)
    return flatten_metrics(config_metrics(result, head, cfg))


def _shared_static(resolved, workloads: Mapping[int, Workload],
                   shape_workloads: Sequence[Workload], capacities: Mapping[str, Any]):
    """One ``EngineStatic`` for every seed's workload (of any request count: the smaller ones
    leave rows spare); when they cannot share one (traces of other tenants, say), one per
    seed: seed → static."""
    try:
        return build_static_shared(resolved, [*workloads.values(), *shape_workloads],
                                   **capacities)
    except ValueError:
        return {seed: build_static_shared(resolved, [w], **capacities)
                for seed, w in workloads.items()}


class SimulationProblem:
    """Knob sets → :class:`CandidateEval` via the JAX engine.

    Args:
      resolved: ``resolve_config(base_config)``; its policy is what knobs modify.
      seeds: workload seeds; every candidate is simulated on each.
      scoring: objectives, constraints, robust statistic.
      lanes: lanes per engine call (knob sets are padded to it, or split into chunks of it).
      capacities: passed to ``evaluate_population`` (queue_slots, pending_slots, …).
      keep_metrics: keep each candidate's per-seed metric dicts in its CandidateEval.
      backend: where the engine calls run (default ``LocalBackend()``: this process).
      program_sites: sites whose policy programs the candidates may set: their interpreters
        are compiled into the one program from the start (``with_program_sites``).
      extra_seeds: seeds a later ``with_seeds`` will ask for (held-out seeds): their workloads
        shape the one program too, so they need no program of their own.
    """

    def __init__(self, resolved, seeds: Sequence[int], scoring: Scoring, lanes: int,
                 capacities: Mapping[str, Any] | None = None, keep_metrics: bool = True,
                 shape_workloads: Sequence[Workload] = (), static=None, backend=None,
                 program_sites: Sequence[str] = (), extra_seeds: Sequence[int] = ()) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        if not seeds:
            raise ValueError("at least one workload seed is needed")
        self.resolved = resolved
        self.seeds = tuple(int(s) for s in seeds)
        self.scoring = scoring
        self.lanes = int(lanes)
        self.capacities = dict(capacities or {})
        self.keep_metrics = keep_metrics
        self.workloads = {s: make_workload(resolved.config, s) for s in self.seeds}
        # One engine program for every seed (capacities cover all of them, ``extra_seeds``'
        # workloads and ``shape_workloads`` too): a seed then costs a run, not a compile.
        self.program_sites = tuple(program_sites)
        extra = [make_workload(resolved.config, s) for s in dict.fromkeys(extra_seeds)
                 if s not in self.workloads]
        self.static = static if static is not None else _shared_static(
            resolved, self.workloads, [*shape_workloads, *extra], self.capacities)
        # the seeds whose workloads the one program was built to cover
        self.covered = frozenset(self.seeds) | (
            frozenset(int(s) for s in extra_seeds) if static is None else frozenset())
        if self.program_sites:  # the programs' interpreters in the one program, baseline too
            self.static = ({k: with_program_sites(v, self.program_sites)
                            for k, v in self.static.items()} if isinstance(self.static, dict)
                           else with_program_sites(self.static, self.program_sites))
        self.job = PopulationJob(resolved, self.workloads, self.static)
        self.backend = backend if backend is not None else LocalBackend()

    def with_seeds(self, seeds: Sequence[int], same_program: bool = False) -> SimulationProblem:
        """The same problem on other workload seeds (e.g. held-out seeds), on this problem's
        engine program where it covers them (``extra_seeds``) or ``same_program`` says so
        (its capacities must cover ``seeds``, as for a subset of a problem built over a
        superset of seeds); else on a program of their own."""
        shared = not isinstance(self.static, dict) and {int(s) for s in seeds} <= self.covered
        if same_program or shared:
            return SimulationProblem(self.resolved, seeds, self.scoring, self.lanes,
                                     self.capacities, self.keep_metrics, static=self.static,
                                     backend=self.backend, program_sites=self.program_sites)
        return SimulationProblem(self.resolved, seeds, self.scoring, self.lanes,
                                 self.capacities, self.keep_metrics,
                                 shape_workloads=tuple(self.workloads.values()),
                                 backend=self.backend, program_sites=self.program_sites)

    def check_knobs(self, knobs: Mapping[str, Any]) -> str:
        """'' when ``knobs`` form a valid configuration, else the reason."""
        try:
            apply_knobs(self.resolved.config, knobs)
        except ConfigError as err:
            return f"invalid: {err}"
        return ""

    def metrics(self, knob_sets: Sequence[Mapping[str, Any]]) -> list[list[dict | str]]:
        """Per knob set, per seed: the metrics dict, or a reason string when not evaluated.
        Knob sets go to the engine in chunks of ``lanes``, each chunk on every seed: one
        backend call for all of them."""
        reasons = [self.check_knobs(k) for k in knob_sets]
        chunks = [range(start, min(start + self.lanes, len(knob_sets)))
                  for start in range(0, len(knob_sets), self.lanes)]
        units = [Unit(seed, tuple(dict(knob_sets[i]) if not reasons[i] else {} for i in chunk))
                 for chunk in chunks for seed in self.seeds]
        outcomes = iter(self.backend.run(self.job, units, self.lanes))
        out: list[list[dict | str]] = [[] for _ in knob_sets]
        for chunk in chunks:
            for _seed in self.seeds:
                for i, lane in zip(chunk, next(outcomes), strict=True):
                    if reasons[i]:
                        out[i].append(reasons[i])
                    elif lane.overflow:
                        out[i].append(f"engine overflow {lane.overflow} (raise capacities)")
                    else:
                        out[i].append(lane.metrics)
        return out

    def evaluate(self, knob_sets: Sequence[Mapping[str, Any]]) -> list[CandidateEval]:
        """Score every knob set on every seed."""
        results = []
        for knobs, per_seed in zip(knob_sets, self.metrics(knob_sets), strict=True):
            reasons = [m for m in per_seed if isinstance(m, str)]
            if reasons:
                results.append(invalid_candidate(self.scoring, knobs, reasons[0]))
            else:
                results.append(score_candidate(self.scoring, knobs, per_seed,
                                               keep_metrics=self.keep_metrics))
        return results

    __call__ = evaluate
