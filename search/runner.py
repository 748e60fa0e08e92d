"""The generation loop: ask → decode → evaluate → tell, with history, checkpoints and progress.

:func:`run_search` is independent of the simulator: ``evaluate`` is any callable from a list of
knob dicts to :class:`search.objectives.CandidateEval` (``SimulationProblem`` in practice, an
analytic function in tests).

Trust properties:

* **Reproducible**: the strategy's randomness comes from the seed and the generation number
  only, the simulator is deterministic, and files are written with round-trip ``repr`` numbers
  and no timestamps — the same inputs give byte-identical ``history.csv`` and ``summary.json``.
* **Checkpointed**: after every generation the strategy state, the history and the best-so-far
  are written atomically to ``checkpoint.npz`` (temp file + ``os.replace``), then
  ``history.csv``. A killed run resumed with ``resume=True`` loses at most the generation in
  flight and ends with exactly the files an uninterrupted run writes.
* **Guarded**: a run refuses to start in a directory that already holds a checkpoint unless
  resuming, and refuses to resume a checkpoint whose run settings (the ``fingerprint``) differ;
  only the number of generations may change, so a finished run can be extended.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from blisjax.progress import Progress as TickingLine
from search.io import (
    CHECKPOINT,
    HISTORY,
    json_safe,
    load_checkpoint,
    save_checkpoint,
    write_csv_atomic,
)
from search.objectives import CandidateEval, Robust, Scoring, strategy_fitness
from search.pareto import pareto_front
from search.space import SearchSpace
from search.strategies.base import restore_state, state_leaves

__all__ = ["GenerationReport", "Record", "SearchResult", "history_columns", "run_search"]


@dataclass(frozen=True)
class Record:
    """One evaluated candidate (a history row). Arrays are tuples of floats."""

    generation: int
    candidate: int
    knobs: dict
    fitness: float
    objectives: tuple[float, ...]
    objective_mean: tuple[float, ...]
    objective_tail: tuple[float, ...]
    violations: tuple[float, ...]
    feasible: bool
    valid: bool
    note: str

    def to_list(self) -> list:
        return [self.generation, self.candidate, self.knobs, self.fitness, list(self.objectives),
                list(self.objective_mean), list(self.objective_tail), list(self.violations),
                self.feasible, self.valid, self.note]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Record:
        g, c, knobs, fit, obj, mean, tail, viol, feas, valid, note = row
        return cls(int(g), int(c), dict(knobs), float(fit), tuple(map(float, obj)),
                   tuple(map(float, mean)), tuple(map(float, tail)), tuple(map(float, viol)),
                   bool(feas), bool(valid), str(note))


@dataclass(frozen=True)
class GenerationReport:
    """What a callback sees after generation ``generation`` has been checkpointed."""

    generation: int
    generations: int
    evaluations: int
    best: Record | None
    records: tuple[Record, ...]
    state: Any


@dataclass
class SearchResult:
    """Outcome of :func:`run_search`.

    records: every evaluated candidate in order; best: the best record (feasible first, then
    highest fitness; the first one on ties) or None; best_metrics: its per-seed metrics when
    the evaluator kept them; front: indices into ``records`` of the Pareto front of feasible
    candidates (duplicates of a knob set removed); state: the final strategy state;
    baseline: the baseline's CandidateEval summary (or None).
    """

    records: list[Record]
    best: Record | None
    best_metrics: list
    front: list[int]
    state: Any
    generations: int
    baseline: dict | None = None
    resumed_from: int | None = None
    extra: dict = field(default_factory=dict)


def history_columns(space: SearchSpace, scoring: Scoring, robust_columns: Robust | None
                    ) -> list[str]:
    """Header of ``history.csv``: generation, candidate, each knob, fitness, each
    ``objective[expr]`` (the robust statistic), with several seeds ``mean[expr]`` and
    ``worst[expr]`` (or ``cvarA[expr]``), each ``violation[constraint]``, feasible, note."""
    cols = ["generation", "candidate", *space.names, "fitness"]
    cols += [f"objective[{t}]" for t in scoring.objective_texts]
    if robust_columns is not None:
        cols += [f"mean[{t}]" for t in scoring.objective_texts]
        cols += [f"{robust_columns.tail_name}[{t}]" for t in scoring.objective_texts]
    cols += [f"violation[{t}]" for t in scoring.constraint_texts]
    return cols + ["feasible", "note"]


def _row(space: SearchSpace, rec: Record, robust_columns: Robust | None) -> list:
    row = [rec.generation, rec.candidate, *(rec.knobs[n] for n in space.names), rec.fitness,
           *rec.objectives]
    if robust_columns is not None:
        row += [*rec.objective_mean, *rec.objective_tail]
    return row + [*rec.violations, rec.feasible, rec.note]


def _better(a: Record, b: Record | None) -> bool:
    """Whether ``a`` beats the current best ``b`` (feasible first, then fitness; strict)."""
    if b is None:
        return True
    if a.feasible != b.feasible:
        return a.feasible
    return a.fitness > b.fitness


def _records(generation: int, evals: Sequence[CandidateEval], fitness: np.ndarray
             ) -> list[Record]:
    return [Record(generation, i, dict(e.knobs), float(fitness[i]),
                   tuple(map(float, e.objectives)), tuple(map(float, e.objective_mean)),
                   tuple(map(float, e.objective_tail)), tuple(map(float, e.violations)),
                   bool(e.feasible), bool(e.valid), e.note)
            for i, e in enumerate(evals)]


def front_indices(records: Sequence[Record], space: SearchSpace) -> list[int]:
    """Pareto front (all objectives maximised) of the feasible records, one per knob set."""
    seen: dict[tuple, int] = {}
    for i, r in enumerate(records):
        if r.feasible:
            seen.setdefault(tuple(repr(r.knobs[n]) for n in space.names), i)
    idx = list(seen.values())
    if not idx:
        return []
    F = np.array([records[i].objectives for i in idx], np.float64)
    return [idx[j] for j in pareto_front(F)]


class Progress:
    """A one-line text progress bar on stderr (``\\r``-rewritten on a terminal)."""

    def __init__(self, total: int, stream: TextIO | None = None, label: str = "search") -> None:
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def log(self, message: str) -> None:
        """A plain log line (``label: message``)."""
        print(f"{self.label}: {message}", file=self.stream, flush=True)

    def update(self, done: int, evaluations: int, best: Record | None, extra: str = "") -> None:
        width = 20
        filled = int(width * done / self.total)
        bar = "#" * filled + "." * (width - filled)
        if best is None:
            best_text = "none"
        else:
            best_text = f"{best.fitness:.6g}" + ("" if best.feasible else " (infeasible)")
        line = (f"{self.label}: gen {done}/{self.total} [{bar}] evals {evaluations} "
                f"best {best_text}{extra} {time.perf_counter() - self.start:.1f}s")
        end = "" if self.tty and done < self.total else "\n"
        print(("\r" if self.tty else "") + line, end=end, file=self.stream, flush=True)


def _ticking(bar: Progress | None, text: str) -> contextlib.AbstractContextManager:
    """While an engine call runs (a first call compiles for a minute or more): a line with the
    seconds spent, rewritten in place on a terminal; nothing otherwise."""
    if bar is None:
        return contextlib.nullcontext()
    ticker = TickingLine(enabled=bar.tty, stream=bar.stream)
    ticker.phase(text)
    return ticker


def fingerprint_text(fingerprint: Mapping[str, Any]) -> str:
    return json.dumps(json_safe(fingerprint), sort_keys=True)


def diff_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if fingerprint_text({k: a.get(k)}) != fingerprint_text({k: b.get(k)})]


def _candidate_summary(e: CandidateEval, scoring: Scoring) -> dict:
    return {"objectives": dict(zip(scoring.objective_texts, map(float, e.objectives),
                                   strict=True)),
            "violations": dict(zip(scoring.constraint_texts, map(float, e.violations),
                                   strict=True)),
            "feasible": bool(e.feasible), "valid": bool(e.valid), "note": e.note}


def run_search(space: SearchSpace, strategy: Any, evaluate: Callable[[list[dict]],
               Sequence[CandidateEval]], scoring: Scoring, *, generations: int, seed: int,
               out_dir: str | Path | None = None, resume: bool = False,
               fingerprint: Mapping[str, Any] | None = None,
               robust_columns: Robust | None = None, baseline: Mapping[str, Any] | None = None,
               progress: bool | TextIO = True,
               callback: Callable[[GenerationReport], None] | None = None,
               label: str = "search") -> SearchResult:
    """Run ``generations`` generations of ``strategy`` (see the module docstring).

    Args:
      space: maps the strategy's unit-cube pytrees to knob dicts.
      strategy: any object with ``init/ask/tell`` (``search.strategies``).
      evaluate: knob dicts → CandidateEval list (same order).
      scoring: the objectives/constraints the evaluations were scored with.
      generations: total generations (when resuming: including those already done).
      seed: strategy seed (``strategy.init(seed)``).
      out_dir: results directory for checkpoint.npz and history.csv (None: in memory only).
      resume: continue from ``out_dir/checkpoint.npz``.
      fingerprint: run settings stored in the checkpoint and compared when resuming.
      robust_columns: with several workload seeds, also write mean and tail columns.
      baseline: a knob set ({} = the base configuration) evaluated once before generation 0.
      progress: True = progress bar on stderr, False = silent, or a text stream.
      callback: called after every checkpointed generation (an exception aborts the run, as
        a kill would).
      label: prefix of the progress lines.
    """
    if generations < 1:
        raise ValueError(f"generations must be >= 1, got {generations}")
    fingerprint = dict(fingerprint or {})
    out = Path(out_dir) if out_dir is not None else None
    ckpt = out / CHECKPOINT if out is not None else None
    multi_strategy = bool(getattr(strategy, "multi_objective", False))
    records: list[Record] = []
    best: Record | None = None
    best_metrics: list = []
    baseline_summary: dict | None = None
    state = strategy.init(seed)
    start = 0
    resumed_from = None
    if resume:
        if ckpt is None or not ckpt.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt}")
        leaves, meta = load_checkpoint(ckpt)
        stored = meta.get("fingerprint", {})
        if fingerprint_text(stored) != fingerprint_text(fingerprint):
            raise ValueError(f"--resume: the checkpoint in {out} was written with different "
                             f"settings ({', '.join(diff_keys(stored, fingerprint))}); use a "
                             "new --out directory or the original settings")
        state = restore_state(state, leaves)
        records = [Record.from_list(r) for r in meta["records"]]
        best = records[meta["best"]] if meta["best"] is not None else None
        best_metrics = meta["best_metrics"]
        baseline_summary = meta["baseline"]
        start = resumed_from = int(meta["generation"])
        if start > generations:
            raise ValueError(f"--generations: the run in {out} already has {start} "
                             f"generations; give at least {start}")
    elif ckpt is not None and ckpt.exists():
        raise FileExistsError(f"--out: {out} already holds a search checkpoint; use --resume "
                              "or a new directory")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    bar = None
    if progress:
        bar = Progress(generations, None if progress is True else progress, label)
    if baseline is not None and baseline_summary is None:
        if bar is not None:
            bar.log("evaluating the configured policy (baseline; on the JAX engine the first "
                    "call per workload compiles)")
        with _ticking(bar, "evaluating the configured policy"):
            first = evaluate([dict(baseline)])[0]
        baseline_summary = {"knobs": dict(baseline), **_candidate_summary(first, scoring)}
    columns = history_columns(space, scoring, robust_columns)
    for g in range(start, generations):
        population, state = strategy.ask(state)
        knob_sets = space.decode(population)
        with _ticking(bar, f"generation {g + 1}/{generations}: evaluating {len(knob_sets)} "
                           "candidates"):
            evals = list(evaluate(knob_sets))
        told, column = strategy_fitness(scoring, evals, multi_strategy)
        state = strategy.tell(state, population, told)
        new = _records(g, evals, column)
        for rec, e in zip(new, evals, strict=True):
            if _better(rec, best):
                best, best_metrics = rec, list(e.metrics)
        best_index = None
        records.extend(new)
        if best is not None:
            best_index = next(i for i in range(len(records) - 1, -1, -1) if records[i] is best)
        if out is not None:
            meta = {"fingerprint": fingerprint, "generation": g + 1,
                    "records": [r.to_list() for r in records], "best": best_index,
                    "best_metrics": best_metrics, "baseline": baseline_summary}
            save_checkpoint(ckpt, state_leaves(state), meta)
            write_csv_atomic(out / HISTORY, columns,
                             [_row(space, r, robust_columns) for r in records])
        if bar is not None:
            extra = ""
            if scoring.multi_objective:
                extra = f" front {len(front_indices(records, space))}"
            bar.update(g + 1, len(records), best, extra)
        if callback is not None:
            callback(GenerationReport(g, generations, len(records), best, tuple(new), state))
    if out is not None and not (out / HISTORY).exists():
        write_csv_atomic(out / HISTORY, columns, [_row(space, r, robust_columns)
                                                  for r in records])
    return SearchResult(records, best, best_metrics, front_indices(records, space), state,
                        generations, baseline_summary, resumed_from)
