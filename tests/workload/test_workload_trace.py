"""TraceV2 read/write: BLIS golden traces, round trips, validation and atomic writes."""

import json
import os

import numpy as np
import pytest

from blisjax.workload import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    Workload,
    WorkloadSpec,
    generate_workload,
    read_trace,
    write_trace,
)
from blisjax.workload import trace as trace_module
from blisjax.workload.trace import TRACE_COLUMNS, UnsortedTraceWarning
from blisjax.workload.types import NO_PREFIX_GROUP, SLO_CLASS_CODE
from tests.paths import GOLDEN_CASES, GOLDEN_DIR, golden_case

GOLDEN = GOLDEN_DIR
CASES = [golden_case(n, ".csv") for n in GOLDEN_CASES]
HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"

def row(**values):
    """A CSV data row with BLIS's neutral values, overridden by ``values``."""
    base = dict.fromkeys(TRACE_COLUMNS, "0")
    base.update(client_id="", tenant_id="", slo_class="", session_id="", prefix_group="",
                streaming="false", model="", status="ok", error_message="", finish_reason="")  # fmt: skip
    base.update({k: str(v) for k, v in values.items()})
    return ",".join(base[c] for c in TRACE_COLUMNS)


def write_files(tmp_path, rows, header=HEADER, columns=TRACE_COLUMNS):
    h, d = tmp_path / "h.yaml", tmp_path / "d.csv"
    h.write_text(header)
    d.write_text("\n".join([",".join(columns), *rows]) + "\n")
    return h, d


# --------------------------------------------------------------------------- golden traces


@pytest.mark.parametrize("csv_path", CASES, ids=lambda p: p.stem)
def test_golden_token_counts_match_blis_results(csv_path):
    expected = json.loads(csv_path.with_suffix(".json").read_text())
    w = read_trace(GOLDEN / "header.yaml", csv_path)
    assert int(w.input_tokens.sum()) == expected["metrics"]["total_input_tokens"]
    by_id = {int(r): i for i, r in enumerate(w.request_id)}
    assert len(expected["results"]) > 0
    for result in expected["results"]:
        i = by_id[result["request_id"]]
        assert w.input_tokens[i] == result["input_tokens"], result["request_id"]
        assert w.output_tokens[i] == result["output_tokens"], result["request_id"]


@pytest.mark.parametrize("csv_path", CASES, ids=lambda p: p.stem)
def test_golden_rewrite_is_byte_identical(csv_path, tmp_path):
    w = read_trace(GOLDEN / "header.yaml", csv_path)
    write_trace(w, tmp_path / "h.yaml", tmp_path / "d.csv")
    assert (tmp_path / "h.yaml").read_bytes() == (GOLDEN / "header.yaml").read_bytes()
    assert (tmp_path / "d.csv").read_bytes() == csv_path.read_bytes()


def test_golden_arrivals_are_blis_constant_rate_iats():
    # BLIS --rate 10 spaces requests by trunc(1/(10/1e6)) = 99999 µs
    w = read_trace(GOLDEN / "header.yaml", CASES[0])
    assert np.all(np.diff(w.arrival_us) == 99999)
    assert w.metadata["trace_header"]["mode"] == "generated"


# --------------------------------------------------------------------------- round trip


def rich_workload():
    clients = (
        ClientSpec(id="chat", tenant_id="acme", slo_class="critical", arrival=ArrivalSpec("poisson"),
                   prefix_group="sys", prefix_length=128, timeout_us=2_000_000),
        ClientSpec(id="", tenant_id="", slo_class="", arrival=ArrivalSpec("gamma", cv=3.0),
                   output_distribution=DistSpec("exponential", {"mean": 50})),
        ClientSpec(id="bulk", tenant_id="acme", slo_class="batch", rate_fraction=0.5,
                   arrival=ArrivalSpec("bursty"), prefix_group="docs", prefix_length=64),
    )  # fmt: skip
    return generate_workload(WorkloadSpec(clients=clients, aggregate_rate=40.0, num_requests=400))


def test_write_then_read_round_trips_exactly(tmp_path):
    w = rich_workload()
    write_trace(w, tmp_path / "h.yaml", tmp_path / "d.csv")
    back = read_trace(tmp_path / "h.yaml", tmp_path / "d.csv")
    assert back.content_equal(w.canonical())
    assert len(back.prefix_group_names) == 2 and np.any(back.deadline_us > 0)
    # a read trace is already canonical: a second round trip is the identity
    write_trace(back, tmp_path / "h2.yaml", tmp_path / "d2.csv")
    assert read_trace(tmp_path / "h2.yaml", tmp_path / "d2.csv").content_equal(back)
    assert back.metadata["trace_header"]["workload_seed"] == 42


def test_empty_workload_round_trips(tmp_path):
    empty = rich_workload()
    keep = np.zeros(0, dtype=np.int64)
    fields = {n: getattr(empty, n)[keep] for n in Workload._INT_FIELDS}
    w = Workload(**fields)
    write_trace(w, tmp_path / "h.yaml", tmp_path / "d.csv")
    assert read_trace(tmp_path / "h.yaml", tmp_path / "d.csv").num_requests == 0


def test_input_tokens_column_excludes_the_prefix(tmp_path):
    w = rich_workload()
    write_trace(w, tmp_path / "h.yaml", tmp_path / "d.csv")
    lines = (tmp_path / "d.csv").read_text().splitlines()
    assert lines[0] == ",".join(TRACE_COLUMNS)
    first = dict(zip(TRACE_COLUMNS, lines[1].split(","), strict=True))
    expected_prefix = int(w.prefix_length[0])
    assert int(first["input_tokens"]) == w.input_tokens[0] - expected_prefix
    assert int(first["prefix_length"]) == expected_prefix
    assert first["send_time_us"] == first["arrival_time_us"] == str(w.arrival_us[0])


# --------------------------------------------------------------------------- read semantics


def test_prefix_sorting_and_labels(tmp_path):
    rows = [
        row(request_id=7, arrival_time_us=300, input_tokens=5, output_tokens=2, prefix_group="g",
            prefix_length=10, tenant_id="t", client_id="c", slo_class="batch", deadline_us=900),
        row(request_id=3, arrival_time_us=100, input_tokens=4, output_tokens=1, prefix_length=6),
        row(request_id=9, arrival_time_us=300, input_tokens=8, output_tokens=0, prefix_group="g",
            prefix_length=12, slo_class="realtime"),
        row(request_id=1, arrival_time_us=200, input_tokens=1, server_input_tokens=40),
    ]  # fmt: skip
    # Out of order (BLIS accepts it: its event queue orders arrivals): a warning names the
    # first row that arrives before the row above it, here file line 3 (after the header).
    with pytest.warns(UnsortedTraceWarning, match=r"d.csv: line 3 arrives before line 2 "
                                                  r"\(100 < 300 us\)"):
        w = read_trace(*write_files(tmp_path, rows))
    np.testing.assert_array_equal(w.request_id, [3, 1, 7, 9])  # stable sort by arrival
    np.testing.assert_array_equal(w.arrival_us, [100, 200, 300, 300])
    # group "g" shares the first row's prefix (10); a prefix length without a group is ignored;
    # server_input_tokens replaces input_tokens outside a group
    np.testing.assert_array_equal(w.input_tokens, [4, 40, 15, 18])
    np.testing.assert_array_equal(w.prefix_length, [0, 0, 10, 10])
    np.testing.assert_array_equal(w.prefix_group, [NO_PREFIX_GROUP, NO_PREFIX_GROUP, 0, 0])
    np.testing.assert_array_equal(w.output_tokens, [1, 0, 2, 0])
    np.testing.assert_array_equal(w.deadline_us, [0, 0, 900, 0])
    assert w.tenant_names == ("", "t") and w.client_names == ("", "c")
    codes = [SLO_CLASS_CODE[c] for c in ("", "", "batch", "critical")]  # v1 name upgraded
    np.testing.assert_array_equal(w.slo_class, codes)


def test_send_time_option(tmp_path):
    paths = write_files(tmp_path, [row(arrival_time_us=50, send_time_us=80, input_tokens=3)])
    assert read_trace(*paths).arrival_us[0] == 50
    assert read_trace(*paths, use_send_time=True).arrival_us[0] == 80


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("trace_version: 1\ntime_unit: microseconds\n", "trace_version must be 2 or 3"),
        ("trace_version: 4\ntime_unit: microseconds\n", "trace_version must be 2 or 3"),
        ("trace_version: 2\ntime_unit: milliseconds\n", "time_unit must be 'microseconds'"),
        ("trace_version: 2\ntime_unit: microseconds\ncolour: red\n", "unknown header key 'colour'"),
        ("trace_version: 2\ntime_unit: microseconds\nwarm_up_requests: -1\n", "warm_up_requests"),
        ("- 1\n", "must be a YAML mapping"),
    ],
)
def test_header_validation(tmp_path, header, message):
    with pytest.raises(ValueError, match=message):
        read_trace(*write_files(tmp_path, [row(input_tokens=3)], header=header))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"input_tokens": "12x"}, r"line 3, column 'input_tokens': expected an integer"),
        ({"output_tokens": -1}, r"line 3, column 'output_tokens': must be >= 0"),
        ({"arrival_time_us": "1.5"}, r"line 3, column 'arrival_time_us': expected an integer"),
        ({"slo_class": "gold"}, r"line 3, column 'slo_class': unknown class 'gold'"),
        ({"streaming": "yes"}, r"line 3, column 'streaming'"),
        ({"reason_ratio": "2"}, r"line 3, column 'reason_ratio': must be in \[0, 1\]"),
        ({"deadline_us": -5}, r"line 3, column 'deadline_us': must be >= 0"),
        ({"request_id": 0}, r"line 3, column 'request_id': duplicate id 0 \(line 2\)"),
        ({"input_tokens": 0}, r"line 3, column 'input_tokens': request has no input tokens"),
    ],
)
def test_row_validation_names_line_and_column(tmp_path, bad, message):
    good = row(request_id=0, input_tokens=3)
    values = {"request_id": 1, "input_tokens": 3, **bad}
    with pytest.raises(ValueError, match=message):
        read_trace(*write_files(tmp_path, [good, row(**values)]))


def test_missing_column_and_field_count(tmp_path):
    columns = tuple(c for c in TRACE_COLUMNS if c != "deadline_us")
    with pytest.raises(ValueError, match="missing column.*deadline_us"):
        read_trace(*write_files(tmp_path, [], columns=columns))
    with pytest.raises(ValueError, match="line 2: 3 fields, expected 27"):
        read_trace(*write_files(tmp_path, ["1,2,3"]))


def test_write_rejects_inconsistent_prefix_groups(tmp_path):
    w = rich_workload()
    fields = {n: getattr(w, n) for n in Workload._INT_FIELDS}
    lengths = w.prefix_length.copy()
    first_in_group = int(np.flatnonzero(w.prefix_group == 0)[0])
    lengths[first_in_group] -= 1
    broken = Workload(**{**fields, "prefix_length": lengths}, tenant_names=w.tenant_names,
                      client_names=w.client_names, prefix_group_names=w.prefix_group_names)  # fmt: skip
    with pytest.raises(ValueError, match="differing prefix lengths"):
        write_trace(broken, tmp_path / "h.yaml", tmp_path / "d.csv")


# --------------------------------------------------------------------------- atomic writes


def test_failed_write_leaves_old_files_and_no_temporaries(tmp_path, monkeypatch):
    h, d = tmp_path / "h.yaml", tmp_path / "d.csv"
    h.write_text("old header")
    d.write_text("old data")
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd):  # the header temp file syncs fine, the data temp file fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        real_fsync(fd)

    monkeypatch.setattr(trace_module.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_trace(rich_workload(), h, d)
    assert h.read_text() == "old header" and d.read_text() == "old data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "h.yaml"]
