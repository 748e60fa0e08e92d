"""The trace tables the latency fit reads (docs/latency-models.md §P.9): their columns, and
readers that turn each row into a ``StepRecord`` or ``JourneyRecord``, naming the file, row and
column of any bad value (``FitDataError``).

Two tables, CSV or JSON lines (``.jsonl``/``.ndjson``), with vLLM's tracing attribute names as
columns: the **step table** (one row per scheduler step, ``step.BATCH_SUMMARY``, with the
rich-mode ``step.REQUEST_SNAPSHOT`` fields of its scheduled requests as per-row lists: a JSON
array, or ``;``-separated in CSV) and the **journey table** (one row per request an instance
received: journey timestamps ``ts.<EVENT>`` in ns and the queue-time state).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blisjax.latency.base import StepBatch
from blisjax.latency.physics import (
    PhysicsStepInputs,
)

# ---------------------------------------------------------------------------------- schema

#: Identifies one trace (one vLLM instance / blisjax instance); optional, default "0". Not a
#: vLLM attribute: a trace file holds one instance, a table may concatenate several.
INSTANCE_COLUMN = "instance.id"

#: Required step-summary columns (vLLM ``step.BATCH_SUMMARY``, docs/latency-models.md §P.9).
STEP_COLUMNS = (
    "step.id",
    "step.duration_us",
    "queue.running_depth",
    "queue.waiting_depth",
    "batch.num_prefill_reqs",
    "batch.num_decode_reqs",
    "batch.scheduled_tokens",
    "batch.prefill_tokens",
    "batch.decode_tokens",
    "batch.num_preempted",
    "kv.blocks_total_gpu",
    "kv.blocks_free_gpu",
)
#: Optional step-summary columns (read when present, never needed by the features).
STEP_OPTIONAL = ("step.ts_start_ns", "step.ts_end_ns", "batch.num_finished", "kv.usage_gpu_ratio")
#: Required rich-mode snapshot columns (``step.REQUEST_SNAPSHOT``): one list entry per scheduled
#: request. ``request.num_computed_tokens`` counts tokens computed before the step, prefix-cache
#: hits included (vLLM semantics).
SNAPSHOT_COLUMNS = (
    "request.phase",
    "request.num_prompt_tokens",
    "request.num_computed_tokens",
    "request.scheduled_tokens_this_step",
)
SNAPSHOT_OPTIONAL = ("request.id",)

#: Required journey columns (vLLM request journey, §P.9): timestamps in ns, ``scheduler.step`` =
#: the id of the instance's latest step when the request arrived (0 = none yet).
JOURNEY_COLUMNS = ("request.id", "ts.ARRIVED", "ts.QUEUED", "prefill_total_tokens",
                   "scheduler.step")
#: Queue-time state at arrival. When absent, taken from the step summary ``scheduler.step``
#: (the latest step before the request arrived) and ``kv.blocks_cached_gpu`` = 0 (no prefix hit
#: known); docs/latency-models.md §P.9 step 2.
JOURNEY_STATE = ("queue.running_depth", "queue.waiting_depth", "kv.blocks_total_gpu",
                 "kv.blocks_free_gpu")
JOURNEY_OPTIONAL = ("kv.blocks_cached_gpu", "ts.SCHEDULED", "ts.FIRST_TOKEN", "ts.FINISHED",
                    "decode_max_tokens", "num_preemptions", "finish.status")

PHASES = ("PREFILL", "DECODE")

class FitDataError(ValueError):
    """A trace table is unusable; the message names the file, row and column."""


# ---------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class StepRecord:
    """One step of one instance, as read from the step table."""

    instance: str
    step_id: int
    duration_us: float
    running_depth: int
    waiting_depth: int
    num_preempted: int
    kv_total_blocks: int
    kv_free_blocks: int
    batch: StepBatch
    ts_end_ns: int | None = None
    row: int = 0


@dataclass(frozen=True)
class JourneyRecord:
    """One request's arrival at an instance, as read from the journey table."""

    instance: str
    request_id: str
    arrived_ns: int
    queued_ns: int
    prompt_tokens: int
    scheduler_step: int
    running_depth: int | None = None
    waiting_depth: int | None = None
    kv_total_blocks: int | None = None
    kv_free_blocks: int | None = None
    cached_blocks: int = 0
    scheduled_ns: int | None = None
    row: int = 0


# ---------------------------------------------------------------------------------- readers


def _rows(path: str | os.PathLike) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """(columns, [(row number, mapping)]) of a CSV or JSON-lines file; row numbers are lines."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise FitDataError(f"{p}: cannot read: {err}") from err
    if p.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows, columns = [], []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise FitDataError(f"{p}: row {n}: invalid JSON: {err.msg}") from err
            if not isinstance(obj, dict):
                raise FitDataError(f"{p}: row {n}: must be a JSON object, got {obj!r:.60}")
            for key in obj:
                if key not in columns:
                    columns.append(key)
            rows.append((n, obj))
        return columns, rows
    reader = csv.DictReader(text.splitlines())
    columns = list(reader.fieldnames or [])
    return columns, [(n, r) for n, r in enumerate(reader, start=2)]


def _need(path, columns: Sequence[str], required: Sequence[str], what: str) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise FitDataError(f"{path}: row 1: missing {what} column(s) {', '.join(missing)}")


def _int(path, n: int, row: dict, col: str, *, minimum: int = 0) -> int:
    v = row.get(col)
    try:
        if isinstance(v, bool):
            raise ValueError
        x = int(v) if not isinstance(v, float) else (int(v) if v.is_integer() else None)
        if x is None:
            raise ValueError
    except (TypeError, ValueError):
        raise FitDataError(f"{path}: row {n}, column {col!r}: must be an integer, "
                           f"got {v!r}") from None
    if x < minimum:
        raise FitDataError(f"{path}: row {n}, column {col!r}: must be >= {minimum}, got {x}")
    return x


def _opt_int(path, n, row, col) -> int | None:
    v = row.get(col)
    return None if v is None or v == "" else _int(path, n, row, col)


def _float(path, n: int, row: dict, col: str) -> float:
    v = row.get(col)
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise FitDataError(f"{path}: row {n}, column {col!r}: must be a number, "
                           f"got {v!r}") from None
    if not math.isfinite(x) or x < 0:
        raise FitDataError(f"{path}: row {n}, column {col!r}: must be finite and >= 0, got {x}")
    return x


def _list(path, n: int, row: dict, col: str) -> list:
    v = row.get(col)
    if isinstance(v, list):
        return v
    if v is None:
        raise FitDataError(f"{path}: row {n}, column {col!r}: missing")
    if isinstance(v, str):
        return [] if v.strip() == "" else [s.strip() for s in v.split(";")]
    raise FitDataError(f"{path}: row {n}, column {col!r}: must be a list or a ';'-separated "
                       f"string, got {v!r}")


def _int_list(path, n, row, col) -> list[int]:
    out = []
    for i, v in enumerate(_list(path, n, row, col)):
        try:
            if isinstance(v, bool):
                raise ValueError
            x = int(v)
            if x < 0 or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
        except (TypeError, ValueError):
            raise FitDataError(f"{path}: row {n}, column {col!r}[{i}]: must be an integer "
                               f">= 0, got {v!r}") from None
        out.append(x)
    return out


def read_step_table(path: str | os.PathLike) -> list[StepRecord]:
    """Read and validate a step table (see the module docstring).

    Validates: required columns; integer/number fields; snapshot lists of equal length; phases
    consistent with progress; the summary counts equal the snapshot aggregates; free blocks <=
    total; step ids unique and contiguous per instance (the EMA needs every step).

    Raises:
      FitDataError: naming the file, row and column.
    """
    columns, rows = _rows(path)
    if not rows:
        raise FitDataError(f"{path}: no data rows")
    _need(path, columns, STEP_COLUMNS, "step-summary")
    if any(c not in columns for c in SNAPSHOT_COLUMNS):
        missing = [c for c in SNAPSHOT_COLUMNS if c not in columns]
        raise FitDataError(
            f"{path}: row 1: missing rich-mode snapshot column(s) {', '.join(missing)}: "
            "per-request context lengths are required (chunked-prefill training data "
            "without REQUEST_SNAPSHOT is rejected, docs/latency-models.md §P.9)")
    out = []
    for n, r in rows:
        prompt = _int_list(path, n, r, "request.num_prompt_tokens")
        computed = _int_list(path, n, r, "request.num_computed_tokens")
        new = _int_list(path, n, r, "request.scheduled_tokens_this_step")
        phases = [str(x).strip().upper() for x in _list(path, n, r, "request.phase")]
        for col, lst in (("request.num_computed_tokens", computed),
                         ("request.scheduled_tokens_this_step", new), ("request.phase", phases)):
            if len(lst) != len(prompt):
                raise FitDataError(f"{path}: row {n}, column {col!r}: has {len(lst)} entries, "
                                   f"request.num_prompt_tokens has {len(prompt)}")
        for i, (ph, c, l_in) in enumerate(zip(phases, computed, prompt, strict=True)):
            if ph not in PHASES:
                raise FitDataError(f"{path}: row {n}, column 'request.phase'[{i}]: must be "
                                   f"PREFILL or DECODE, got {ph!r}")
            if (ph == "PREFILL") != (c < l_in):
                raise FitDataError(
                    f"{path}: row {n}, column 'request.phase'[{i}]: {ph} contradicts "
                    f"num_computed_tokens={c}, num_prompt_tokens={l_in}")
        # Decode requests have output tokens to produce; the output length itself does not
        # enter the features (only "> 0" does, through the classification).
        batch = StepBatch(new_tokens=new, progress_index=computed, input_tokens=prompt,
                          output_tokens=[1 if ph == "DECODE" else 0 for ph in phases])
        agg = PhysicsStepInputs.from_batch(batch, block_size_tokens=1, preemption_ema=0.0)
        for col, value in (("batch.prefill_tokens", agg.prefill_tokens),
                           ("batch.decode_tokens", agg.decode_tokens),
                           ("batch.num_prefill_reqs", agg.num_prefill_reqs),
                           ("batch.num_decode_reqs", agg.num_decode_reqs),
                           ("batch.scheduled_tokens", agg.scheduled_tokens)):
            got = _int(path, n, r, col)
            if got != value:
                raise FitDataError(f"{path}: row {n}, column {col!r}: {got} disagrees with the "
                                   f"request snapshot ({value})")
        total = _int(path, n, r, "kv.blocks_total_gpu", minimum=1)
        free = _int(path, n, r, "kv.blocks_free_gpu")
        if free > total:
            raise FitDataError(f"{path}: row {n}, column 'kv.blocks_free_gpu': {free} exceeds "
                               f"kv.blocks_total_gpu {total}")
        out.append(StepRecord(
            instance=str(r.get(INSTANCE_COLUMN, "0") or "0"),
            step_id=_int(path, n, r, "step.id", minimum=1),
            duration_us=_float(path, n, r, "step.duration_us"),
            running_depth=_int(path, n, r, "queue.running_depth"),
            waiting_depth=_int(path, n, r, "queue.waiting_depth"),
            num_preempted=_int(path, n, r, "batch.num_preempted"),
            kv_total_blocks=total, kv_free_blocks=free, batch=batch,
            ts_end_ns=_opt_int(path, n, r, "step.ts_end_ns"), row=n))
    by_inst: dict[str, list[StepRecord]] = {}
    for s in out:
        by_inst.setdefault(s.instance, []).append(s)
    for inst, steps in by_inst.items():
        steps.sort(key=lambda s: s.step_id)
        for prev, s in zip(steps, steps[1:], strict=False):
            if s.step_id != prev.step_id + 1:
                what = "duplicate" if s.step_id == prev.step_id else "non-contiguous"
                raise FitDataError(
                    f"{path}: row {s.row}, column 'step.id': {what} step id {s.step_id} for "
                    f"instance {inst!r} after {prev.step_id} (the preemption EMA needs every "
                    "step: trace with --step-tracing-sample-rate 1.0)")
    return [s for inst in sorted(by_inst) for s in by_inst[inst]]


def read_journey_table(path: str | os.PathLike) -> list[JourneyRecord]:
    """Read and validate a journey table (see the module docstring).

    Raises:
      FitDataError: naming the file, row and column.
    """
    columns, rows = _rows(path)
    if not rows:
        raise FitDataError(f"{path}: no data rows")
    _need(path, columns, JOURNEY_COLUMNS, "journey")
    has_state = [c in columns for c in JOURNEY_STATE]
    if any(has_state) and not all(has_state):
        _need(path, columns, JOURNEY_STATE, "queue-state")
    out = []
    for n, r in rows:
        arrived = _int(path, n, r, "ts.ARRIVED")
        queued = _int(path, n, r, "ts.QUEUED")
        if queued < arrived:
            raise FitDataError(f"{path}: row {n}, column 'ts.QUEUED': {queued} precedes "
                               f"ts.ARRIVED {arrived}")
        state = {}
        if all(has_state):
            total = _int(path, n, r, "kv.blocks_total_gpu", minimum=1)
            free = _int(path, n, r, "kv.blocks_free_gpu")
            if free > total:
                raise FitDataError(f"{path}: row {n}, column 'kv.blocks_free_gpu': {free} "
                                   f"exceeds kv.blocks_total_gpu {total}")
            state = dict(running_depth=_int(path, n, r, "queue.running_depth"),
                         waiting_depth=_int(path, n, r, "queue.waiting_depth"),
                         kv_total_blocks=total, kv_free_blocks=free)
        scheduled = _opt_int(path, n, r, "ts.SCHEDULED")
        if scheduled is not None and scheduled < queued:
            raise FitDataError(f"{path}: row {n}, column 'ts.SCHEDULED': {scheduled} precedes "
                               f"ts.QUEUED {queued}")
        out.append(JourneyRecord(
            instance=str(r.get(INSTANCE_COLUMN, "0") or "0"),
            request_id=str(r["request.id"]), arrived_ns=arrived, queued_ns=queued,
            prompt_tokens=_int(path, n, r, "prefill_total_tokens"),
            scheduler_step=_int(path, n, r, "scheduler.step"),
            cached_blocks=_opt_int(path, n, r, "kv.blocks_cached_gpu") or 0,
            scheduled_ns=scheduled, row=n, **state))
    return out
