"""``blisjax explain``: re-run one candidate of a search or sweep, traced, in the reference engine.

A search scores candidates with the JAX engine; the reference engine reproduces any lane bit for
bit, so re-running a candidate there with a trace shows *why* it scored as it did. The results
directory gives everything: ``checkpoint.npz`` the evaluated candidates with their knobs (in
``history.csv`` order), ``best_config.yaml`` the experiment (with the best knobs, which the
candidate's own knobs replace: every candidate sets the same knobs), ``summary.json`` the
workload seeds. Outputs, in ``out_dir``: ``trace.jsonl``, ``timeline.json``, ``summary.txt``,
``metrics.json`` (with ``trace_summary``) and ``instances.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from blisjax.config import ConfigError, SimConfig, load_config, resolve_config
from blisjax.metrics import config_metrics, per_request_rows, write_json_atomic
from search.evaluate import apply_knobs, make_workload
from search.io import CHECKPOINT, load_checkpoint
from search.runner import Record

__all__ = ["Explained", "explain", "load_candidate"]

#: Counterfactual candidates kept per routing decision unless told otherwise.
DEFAULT_K = 3


class Explained(NamedTuple):
    """An explained candidate: which one, on which seed, its metrics, the text summary and the
    files written."""

    candidate: int
    knobs: dict[str, Any]
    seed: int
    metrics: dict[str, Any]
    text: str
    files: dict[str, Path]


def load_candidate(results_dir: Path, candidate: int | None) -> tuple[int, Record]:
    """The evaluated candidate number ``candidate`` (its ``history.csv`` row, from 0; None: the
    search's best) of a results directory."""
    ckpt = results_dir / CHECKPOINT
    if not ckpt.is_file():
        raise ConfigError("RESULTS_DIR", f"{str(results_dir)!r} has no {CHECKPOINT} (not a "
                                         "`blisjax search` or `sweep` results directory)")
    _, meta = load_checkpoint(ckpt)
    records = [Record.from_list(r) for r in meta["records"]]
    if candidate is None:
        if meta.get("best") is None:
            raise ConfigError("--candidate", "the run has no best candidate (none was valid); "
                                             "name one by its history.csv row")
        candidate = int(meta["best"])
    if not 0 <= candidate < len(records):
        raise ConfigError("--candidate", f"must be in [0, {len(records) - 1}] (the rows of "
                                         f"history.csv), got {candidate}")
    record = records[candidate]
    if not record.valid:
        raise ConfigError("--candidate", f"candidate {candidate} was not simulated as given "
                                         f"({record.note}); pick a valid one")
    return candidate, record


def _base_config(results_dir: Path, config_path: str | None) -> SimConfig:
    path = Path(config_path) if config_path else results_dir / "best_config.yaml"
    if not path.is_file():
        raise ConfigError("--config", f"{str(results_dir)!r} has no best_config.yaml (no valid "
                                      "candidate); give the experiment with --config")
    return load_config(path)


def _default_seed(results_dir: Path) -> int:
    summary = results_dir / "summary.json"
    if summary.is_file():
        seeds = json.loads(summary.read_text()).get("workload_seeds") or []
        if seeds:
            return int(seeds[0])
    raise ConfigError("--seed", f"{str(results_dir)!r} has no summary.json with workload seeds; "
                                "give the workload seed")


def explain(results_dir: str | Path, candidate: int | None = None, seed: int | None = None,
            config_path: str | None = None, out_dir: str | Path | None = None,
            level: str = "decisions", counterfactual_k: int = DEFAULT_K,
            strategy: str = "issue_focused") -> Explained:
    """Re-run a searched candidate traced, write its trace, timeline, text summary, metrics and
    per-instance plot, and return them (``out_dir`` default:
    ``RESULTS_DIR/explain/candidate-<N>-seed-<S>``)."""
    from blisjax.trace import simulate_traced
    from blisjax.trace.outputs import write_trace_outputs
    from blisjax.trace.plots import plot_instances

    results_dir = Path(results_dir)
    index, record = load_candidate(results_dir, candidate)
    base = _base_config(results_dir, config_path)
    seed = _default_seed(results_dir) if seed is None else seed
    cfg = apply_knobs(base, record.knobs)
    workload = make_workload(cfg, seed)
    result, trace = simulate_traced(resolve_config(cfg), workload, level, counterfactual_k)
    metrics = config_metrics(result, workload, cfg)
    metrics["trace_summary"] = trace.summary().as_json()
    out = (Path(out_dir) if out_dir is not None
           else results_dir / "explain" / f"candidate-{index}-seed-{seed}")
    files = write_trace_outputs(out, trace, metrics, cfg, strategy,
                                per_request_rows(result, workload))
    files["metrics"] = out / "metrics.json"
    write_json_atomic(files["metrics"], metrics)
    files["instances_plot"] = out / "instances.png"
    plot_instances(list(trace.lines()), files["instances_plot"],
                   title=f"candidate {index}, workload seed {seed}")
    return Explained(index, dict(record.knobs), seed, metrics,
                     files["summary"].read_text(encoding="utf-8"), files)
