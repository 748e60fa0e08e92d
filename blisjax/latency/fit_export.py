"""Record blisjax's own runs as vLLM-style step and journey tables (the schema of
:mod:`blisjax.latency.fit`), so fitting can be tested end to end on known coefficients.

:class:`LatencyTraceRecorder` is a reference-engine observer: the engine calls ``on_queue`` when
an instance receives a request and ``on_step`` at every step, with the state its latency model
sees. Timestamps are ns: ``start_ns`` + simulated µs × 1000.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from blisjax.atomicio import write_text_atomic
from blisjax.latency.base import StepBatch
from blisjax.latency.fit_tables import (
    INSTANCE_COLUMN,
    JOURNEY_COLUMNS,
    JOURNEY_OPTIONAL,
    JOURNEY_STATE,
    SNAPSHOT_COLUMNS,
    STEP_COLUMNS,
    STEP_OPTIONAL,
)
from blisjax.latency.physics import PhysicsStepInputs

STEP_TABLE_COLUMNS = ((INSTANCE_COLUMN,) + STEP_COLUMNS[:2] + ("step.ts_start_ns", "step.ts_end_ns")
                      + STEP_COLUMNS[2:] + ("batch.num_finished", "kv.usage_gpu_ratio")
                      + ("request.id",) + SNAPSHOT_COLUMNS)
JOURNEY_TABLE_COLUMNS = ((INSTANCE_COLUMN,) + JOURNEY_COLUMNS + JOURNEY_STATE + JOURNEY_OPTIONAL)
assert set(STEP_OPTIONAL) <= set(STEP_TABLE_COLUMNS)


class LatencyTraceRecorder:
    """Observer that turns a reference run into step and journey rows (dicts)."""

    def __init__(self, start_ns: int = 0) -> None:
        self.start_ns = start_ns
        self.steps: list[dict[str, Any]] = []
        self.journeys: list[dict[str, Any]] = []
        self._step_count: dict[int, int] = {}
        self._journey_of: dict[int, dict[str, Any]] = {}

    def _ns(self, us: int) -> int:
        return self.start_ns + us * 1000

    def on_queue(self, *, instance: int, request: int, time_us: int, delay_us: int,
                 running_depth: int, waiting_depth: int, kv_used_blocks: int,
                 kv_total_blocks: int, prompt_tokens: int, prefix_cached_blocks: int,
                 preemption_ema: float) -> None:
        row = {
            INSTANCE_COLUMN: str(instance), "request.id": str(request),
            "ts.ARRIVED": self._ns(time_us), "ts.QUEUED": self._ns(time_us + delay_us),
            "prefill_total_tokens": prompt_tokens,
            "scheduler.step": self._step_count.get(instance, 0),
            "queue.running_depth": running_depth, "queue.waiting_depth": waiting_depth,
            "kv.blocks_total_gpu": kv_total_blocks,
            "kv.blocks_free_gpu": kv_total_blocks - kv_used_blocks,
            "kv.blocks_cached_gpu": prefix_cached_blocks,
        }
        self.journeys.append(row)
        self._journey_of[request] = row

    def on_step(self, *, instance: int, time_us: int, duration_us: int, batch: StepBatch,
                prefix_cached_tokens: Sequence[int], running_depth: int, waiting_depth: int,
                kv_used_blocks: int, kv_total_blocks: int, num_preempted: int,
                preemption_ema: float) -> None:
        sid = self._step_count.get(instance, 0) + 1
        self._step_count[instance] = sid
        agg = PhysicsStepInputs.from_batch(batch, block_size_tokens=1, preemption_ema=0.0,
                                           prefix_cached_tokens=list(prefix_cached_tokens))
        computed = [pi + c for pi, c in zip(batch.progress_index, prefix_cached_tokens,
                                            strict=True)]
        self.steps.append({
            INSTANCE_COLUMN: str(instance), "step.id": sid, "step.duration_us": duration_us,
            "step.ts_start_ns": self._ns(time_us),
            "step.ts_end_ns": self._ns(time_us + duration_us),
            "queue.running_depth": running_depth, "queue.waiting_depth": waiting_depth,
            "batch.num_prefill_reqs": agg.num_prefill_reqs,
            "batch.num_decode_reqs": agg.num_decode_reqs,
            "batch.scheduled_tokens": agg.scheduled_tokens,
            "batch.prefill_tokens": agg.prefill_tokens, "batch.decode_tokens": agg.decode_tokens,
            "batch.num_preempted": num_preempted,
            "kv.blocks_total_gpu": kv_total_blocks,
            "kv.blocks_free_gpu": kv_total_blocks - kv_used_blocks,
            "batch.num_finished": None,  # not observed at step time
            "kv.usage_gpu_ratio": kv_used_blocks / kv_total_blocks,
            "request.id": [],  # StepBatch carries no request ids
            "request.phase": ["PREFILL" if pi < l_in else "DECODE"
                              for pi, l_in in zip(batch.progress_index, batch.input_tokens,
                                                  strict=True)],
            "request.num_prompt_tokens": list(batch.input_tokens),
            "request.num_computed_tokens": computed,
            "request.scheduled_tokens_this_step": list(batch.new_tokens),
        })

    def finish(self, result, workload) -> None:
        """Add journey outcomes from the run result (SCHEDULED = last admission)."""
        from blisjax.metrics.records import NOT_RECORDED, STATUS_NAMES

        for req, row in self._journey_of.items():
            arrival = int(workload.arrival_us[req])
            for col, value in (("ts.SCHEDULED", result.scheduling_delay_us[req]),
                               ("ts.FIRST_TOKEN", result.ttft_us[req]),
                               ("ts.FINISHED", result.e2e_us[req])):
                row[col] = None if int(value) == NOT_RECORDED else self._ns(arrival + int(value))
            row["decode_max_tokens"] = int(workload.output_tokens[req])
            row["num_preemptions"] = int(result.preemptions[req])
            row["finish.status"] = STATUS_NAMES[int(result.status[req])]


def table_text(rows: Sequence[dict[str, Any]], columns: Sequence[str], path: str) -> str:
    """CSV (lists ``;``-joined, None empty) or JSON lines, chosen by the file extension."""
    if os.fspath(path).lower().endswith((".jsonl", ".ndjson", ".json")):
        return "".join(json.dumps({c: r.get(c) for c in columns}) + "\n" for r in rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        out = []
        for c in columns:
            v = r.get(c)
            out.append(";".join(str(x) for x in v) if isinstance(v, list)
                       else "" if v is None else v)
        w.writerow(out)
    return buf.getvalue()


def export_latency_tables(resolved, workload, steps_path: str, journeys_path: str, *,
                          start_ns: int = 0) -> tuple[int, int, Any]:
    """Simulate with the reference engine and write the step and journey tables atomically.

    Returns (step rows, journey rows, RunResult).
    """
    from blisjax.reference import ClusterSimulator

    rec = LatencyTraceRecorder(start_ns)
    result = ClusterSimulator(resolved, workload, observer=rec).run()
    rec.finish(result, workload)
    write_text_atomic(steps_path, table_text(rec.steps, STEP_TABLE_COLUMNS, steps_path))
    write_text_atomic(journeys_path, table_text(rec.journeys, JOURNEY_TABLE_COLUMNS,
                                                journeys_path))
    return len(rec.steps), len(rec.journeys), result
