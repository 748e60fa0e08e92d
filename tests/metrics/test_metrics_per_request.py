"""Per-request rows and the atomic JSON writer."""

from __future__ import annotations

import json
import os

import pytest

from blisjax.metrics.per_request import per_request_rows, write_json_atomic
from blisjax.metrics.records import COMPLETED, REJECTED, TIMED_OUT
from blisjax.workload.types import SLO_CLASS_CODE


def test_rows_sorted_by_request_id_with_status_fields(make_workload, make_result):
    workload = make_workload(
        3,
        request_id=[7, 3, 5],
        arrival_us=[0, 10, 20],
        output_tokens=[5, 1, 4],
        tenant=[1, 0, 1],
        tenant_names=("t0", "t1"),
        slo_class=[SLO_CLASS_CODE["batch"], 0, 0],
    )
    result = make_result(
        3,
        status=[COMPLETED, REJECTED, TIMED_OUT],
        instance=[1, -1, 0],
        num_instances=2,
        ttft_us=[1500, -1, 800],
        e2e_us=[9000, -1, -1],
        scheduling_delay_us=[40, -1, 60],
        itl_sum_us=[400, 0, 0],
        itl_count=[4, 0, 0],
        preemptions=[2, 0, 0],
    )
    rows = per_request_rows(result, workload)
    assert [r["request_id"] for r in rows] == [3, 5, 7]
    rejected, timed_out, done = rows
    assert rejected == {
        "request_id": 3,
        "status": "rejected",
        "instance": None,
        "tenant": "t0",
        "slo_class": "",
        "arrival_us": 10,
        "input_tokens": 100,
        "output_tokens": 1,
        "scheduling_delay_us": None,
        "preemptions": 0,
    }
    assert timed_out["status"] == "timed-out" and timed_out["ttft_us"] == 800
    assert "e2e_us" not in timed_out
    assert done["status"] == "completed" and done["slo_class"] == "batch"
    assert (done["instance"], done["ttft_us"], done["e2e_us"]) == (1, 1500, 9000)
    assert done["itl_mean_ms"] == 0.1  # 400 µs / (5 - 1) = 100 µs
    assert done["preemptions"] == 2 and done["tenant"] == "t1"


def test_write_json_atomic_round_trip(tmp_path):
    path = tmp_path / "out.json"
    obj = {"z": 1, "a": [1.5, {"k": None}]}
    write_json_atomic(path, obj)
    text = path.read_text()
    assert json.loads(text) == obj
    assert text.index('"z"') < text.index('"a"')  # insertion order, not sorted
    assert '\n  "z": 1' in text  # indent 2
    assert os.listdir(tmp_path) == ["out.json"]


def test_write_json_atomic_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "out.json"
    write_json_atomic(path, {"ok": True})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"bad": float("nan")})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": True}
    assert os.listdir(tmp_path) == ["out.json"]


def test_write_json_atomic_accepts_numpy_scalars(tmp_path):
    import numpy as np

    path = tmp_path / "np.json"
    write_json_atomic(str(path), {"i": np.int64(3), "f": np.float64(0.5), "a": np.arange(2)})
    assert json.loads(path.read_text()) == {"i": 3, "f": 0.5, "a": [0, 1]}
