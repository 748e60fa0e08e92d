"""BLIS TraceV2 I/O: a YAML header file plus a CSV with one row per request.

Column meaning as BLIS replay reads them (``LoadTraceV2Requests``):

* ``input_tokens`` excludes the shared prefix. A row with a non-empty ``prefix_group`` gets the
  group's prefix prepended, so ``Workload.input_tokens = input_tokens + group prefix length``.
  The group's prefix length is the first positive ``prefix_length`` of the group in file order
  (BLIS builds one prefix per group from that row); ``prefix_length`` without a group is ignored.
* ``server_input_tokens`` > 0 replaces ``input_tokens`` for rows without a prefix group
  (server-measured prompt length; 0 in generated traces).
* arrival = ``arrival_time_us`` (``use_send_time=True``: ``send_time_us`` when > 0, as BLIS HEAD);
  ``deadline_us`` is absolute, 0 = none.
* ``session_id``/``round_index``: with ``session_mode="fixed"`` (BLIS's default) every row is a
  plain open-loop request. With ``"closed-loop"`` a session's round 0 arrives from the trace and
  its later rounds are follow-ups the simulation creates (``blisjax.workload.sessions``; BLIS
  ``LoadTraceV2SessionBlueprints``): sessions in order of first appearance, each session's rows
  sorted by ``round_index``, which must be 0, 1, …; a follow-up's think time is
  ``think_time_us`` (constant) if given, else its row's optional ``think_time_us`` column when a
  round ≥ 1 of its session has a non-zero one (negative values count as 0), else the gap between
  its row's and its predecessor's ``arrival_time_us`` (at least 0); or drawn from a think-time
  distribution (``think_time_dist``, BLIS's ``--think-time-dist``). Tenant, client, SLO class
  and prefix group come from round 0. Header ``session_context_growth: accumulate`` makes a
  follow-up's prompt the conversation so far plus its message.

Rows are sorted stably by arrival (file order breaks ties, like BLIS's event sequence numbers);
a file whose rows are not in arrival order is accepted, as BLIS accepts it (its event queue
orders the arrivals), with an ``UnsortedTraceWarning`` naming the first line out of order;
tenant/client/prefix-group codes follow first appearance in that order (``Workload.canonical``).
Writes are atomic per file (temporary file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import csv
import io
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from blisjax.workload.clients import V1_SLO_CLASSES
from blisjax.workload.sessions import FOLLOW_UP_TIMEOUT_US
from blisjax.workload.types import (
    FOLLOW_UP_ARRIVAL_US,
    NO_PREFIX_GROUP,
    SLO_CLASS_CODE,
    SLO_CLASSES,
    Workload,
)

if TYPE_CHECKING:
    from blisjax.gorand import GoRand
    from blisjax.workload.think import ThinkTimeDist

#: BLIS draws each random token id as ``Intn(TOKEN_VOCABULARY)``.
TOKEN_VOCABULARY = 128_000

#: Exactly the columns of a BLIS TraceV2 CSV, in order.
TRACE_COLUMNS: tuple[str, ...] = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
    "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio",
    "model", "deadline_us", "server_input_tokens",
    "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us",
    "num_chunks", "status", "error_message", "finish_reason",
)  # fmt: skip

#: Integer columns and whether they must be >= 0.
_INT_COLUMNS: dict[str, bool] = {
    "request_id": True, "round_index": True, "prefix_length": True, "input_tokens": True,
    "output_tokens": True, "text_tokens": True, "image_tokens": True, "audio_tokens": True,
    "video_tokens": True, "deadline_us": True, "server_input_tokens": True,
    "arrival_time_us": True, "send_time_us": False, "first_chunk_time_us": False,
    "last_chunk_time_us": False, "num_chunks": True,
}  # fmt: skip

#: TraceV2 header versions read: 2 (blackbox-era BLIS) and 3 (BLIS HEAD: the same columns; the
#: header adds ``workload_seed``). Traces blisjax writes are version 2.
READABLE_TRACE_VERSIONS = (2, 3)

_HEADER_KEYS = frozenset(
    {"trace_version", "time_unit", "created_at", "mode", "warm_up_requests", "workload_seed",
     "workload_spec", "server", "network", "goodput_slo_targets", "session_context_growth"}
)  # fmt: skip
#: ``read_trace``'s session modes (BLIS ``--session-mode``).
SESSION_MODES = ("fixed", "closed-loop")
#: Values of the header's ``session_context_growth``.
CONTEXT_GROWTH = ("", "accumulate")
_DEFAULT_HEADER: dict[str, Any] = {
    "trace_version": 2,
    "time_unit": "microseconds",
    "mode": "generated",
    "warm_up_requests": 0,
}
_INT_RE = re.compile(r"[+-]?[0-9]+")
# Go strconv.ParseBool spellings.
_BOOLS = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True,
          "0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False}  # fmt: skip


# --------------------------------------------------------------------------- header


def _check_header(header: Any, where: str) -> dict[str, Any]:
    if not isinstance(header, Mapping):
        raise ValueError(f"{where}: trace header must be a YAML mapping")
    for key in header:
        if key not in _HEADER_KEYS:
            raise ValueError(f"{where}: unknown header key {key!r}")
    version = header.get("trace_version")
    if isinstance(version, bool) or version not in READABLE_TRACE_VERSIONS:
        raise ValueError(f"{where}: trace_version must be 2 or 3, got {version!r}")
    if header.get("time_unit") != "microseconds":
        raise ValueError(
            f"{where}: time_unit must be 'microseconds', got {header.get('time_unit')!r}"
        )
    warm = header.get("warm_up_requests", 0)
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        raise ValueError(f"{where}: warm_up_requests must be an integer >= 0, got {warm!r}")
    mode = header.get("mode", "")
    if not isinstance(mode, str):
        raise ValueError(f"{where}: mode must be a string, got {mode!r}")
    growth = header.get("session_context_growth", "")
    if growth not in CONTEXT_GROWTH:
        raise ValueError(f"{where}: session_context_growth must be '' or 'accumulate', "
                         f"got {growth!r}")
    return dict(header)


def read_trace_header(header_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a TraceV2 header (trace_version 2 or 3, time_unit microseconds)."""
    with open(header_path, encoding="utf-8") as f:
        return _check_header(yaml.safe_load(f), os.fspath(header_path))


# --------------------------------------------------------------------------- rows


@dataclass
class _Columns:
    """Parsed per-row values, in file order."""

    request_id: list[int] = field(default_factory=list)
    arrival_us: list[int] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)  # excluding any prefix
    output_tokens: list[int] = field(default_factory=list)
    prefix_group: list[str] = field(default_factory=list)
    prefix_length: list[int] = field(default_factory=list)
    tenant: list[str] = field(default_factory=list)
    client: list[str] = field(default_factory=list)
    slo_class: list[int] = field(default_factory=list)
    deadline_us: list[int] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    session: list[str] = field(default_factory=list)
    round_index: list[int] = field(default_factory=list)
    think_time_us: list[int] = field(default_factory=list)  # optional column; 0 when absent
    arrival_time_us: list[int] = field(default_factory=list)  # the column, never send time


class _RowReader:
    """Typed access to one CSV row; errors name the file, line and column."""

    def __init__(self, where: str, index: dict[str, int], row: list[str], line: int) -> None:
        self.where, self.index, self.row, self.line = where, index, row, line

    def error(self, column: str, message: str) -> ValueError:
        return ValueError(f"{self.where}: line {self.line}, column {column!r}: {message}")

    def text(self, column: str) -> str:
        return self.row[self.index[column]]

    def integer(self, column: str) -> int:
        raw = self.text(column).strip()
        if column not in _INT_COLUMNS:  # an optional signed column (think_time_us)
            if raw == "":
                return 0
            if not _INT_RE.fullmatch(raw):
                raise self.error(column, f"expected an integer, got {raw!r}")
            return int(raw)
        if not _INT_RE.fullmatch(raw):
            raise self.error(column, f"expected an integer, got {raw!r}")
        value = int(raw)
        if _INT_COLUMNS[column] and value < 0:
            raise self.error(column, f"must be >= 0, got {value}")
        if value > np.iinfo(np.int64).max or value < np.iinfo(np.int64).min:
            raise self.error(column, f"out of int64 range: {value}")
        return value


def _parse_row(r: _RowReader, cols: _Columns, use_send_time: bool) -> None:
    values = {name: r.integer(name) for name in _INT_COLUMNS}
    if r.text("streaming").strip() not in _BOOLS:
        raise r.error("streaming", f"expected true/false, got {r.text('streaming')!r}")
    try:
        ratio = float(r.text("reason_ratio"))
    except ValueError:
        raise r.error(
            "reason_ratio", f"expected a number, got {r.text('reason_ratio')!r}"
        ) from None
    if not 0.0 <= ratio <= 1.0:  # also rejects NaN
        raise r.error("reason_ratio", f"must be in [0, 1], got {ratio!r}")
    slo = r.text("slo_class")
    slo = V1_SLO_CLASSES.get(slo, slo)
    if slo not in SLO_CLASS_CODE:
        raise r.error("slo_class", f"unknown class {slo!r}; allowed: {', '.join(SLO_CLASSES)}")
    group = r.text("prefix_group")
    tokens = values["input_tokens"]
    if values["server_input_tokens"] > 0 and not group:
        tokens = values["server_input_tokens"]  # server count is authoritative (BLIS)
    arrival = values["arrival_time_us"]
    if use_send_time and values["send_time_us"] > 0:
        arrival = values["send_time_us"]
    cols.request_id.append(values["request_id"])
    cols.arrival_us.append(arrival)
    cols.input_tokens.append(tokens)
    cols.output_tokens.append(values["output_tokens"])
    cols.prefix_group.append(group)
    cols.prefix_length.append(values["prefix_length"])
    cols.tenant.append(r.text("tenant_id"))
    cols.client.append(r.text("client_id"))
    cols.slo_class.append(SLO_CLASS_CODE[slo])
    cols.deadline_us.append(values["deadline_us"])
    cols.line.append(r.line)
    cols.session.append(r.text("session_id"))
    cols.round_index.append(values["round_index"])
    cols.think_time_us.append(r.integer("think_time_us") if "think_time_us" in r.index else 0)
    cols.arrival_time_us.append(values["arrival_time_us"])


def _read_columns(data_path: str | os.PathLike[str], use_send_time: bool) -> _Columns:
    where = os.fspath(data_path)
    cols = _Columns()
    with open(data_path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{where}: empty file (no CSV header row)")
        if len(set(header)) != len(header):
            raise ValueError(f"{where}: duplicate column names in the header row")
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{where}: missing column(s) {', '.join(missing)}")
        index = {name: i for i, name in enumerate(header)}
        for row in reader:
            if not row:
                continue  # tolerate blank lines
            if len(row) != len(header):
                raise ValueError(
                    f"{where}: line {reader.line_num}: {len(row)} fields, expected {len(header)}"
                )
            _parse_row(_RowReader(where, index, row, reader.line_num), cols, use_send_time)
    return cols


def _group_prefix_lengths(cols: _Columns) -> dict[str, int]:
    """Each group's shared prefix: its first positive ``prefix_length`` in file order."""
    lengths: dict[str, int] = {}
    for group, length in zip(cols.prefix_group, cols.prefix_length, strict=True):
        if group and length > 0:
            lengths.setdefault(group, length)
    return lengths


def _codes(names: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    index: dict[str, int] = {}
    codes = [index.setdefault(name, len(index)) for name in names]
    return tuple(index), np.asarray(codes, dtype=np.int32)


def _check_rows(where: str, cols: _Columns, input_tokens: np.ndarray) -> None:
    seen: dict[int, int] = {}
    for rid, line in zip(cols.request_id, cols.line, strict=True):
        if rid in seen:
            raise ValueError(
                f"{where}: line {line}, column 'request_id': duplicate id {rid} (line {seen[rid]})"
            )
        seen[rid] = line
    empty = np.flatnonzero(input_tokens < 1)
    if empty.size:
        line = cols.line[int(empty[0])]
        raise ValueError(
            f"{where}: line {line}, column 'input_tokens': request has no input tokens"
        )


def read_trace(
    header_path: str | os.PathLike[str],
    data_path: str | os.PathLike[str],
    *,
    use_send_time: bool = False,
    session_mode: str = "fixed",
    think_time_us: int | None = None,
    think_time_dist: ThinkTimeDist | None = None,
    seed: int = 42,
) -> Workload:
    """Read a BLIS TraceV2 trace into a ``Workload`` (rows sorted stably by arrival).

    ``session_mode`` is ``"fixed"`` (every row an open-loop request) or ``"closed-loop"``
    (sessions replayed closed-loop; see the module docstring); ``think_time_us`` (closed-loop
    only, >= 0) replaces every follow-up's think time, or ``think_time_dist`` draws each from
    its session's random source (``blisjax.workload.think``; BLIS's sources, seeded from
    ``seed`` as BLIS's ``--seed``). Raises ValueError naming the file, line and column of the
    first invalid value, or the argument.
    """
    if session_mode not in SESSION_MODES:
        raise ValueError(f"session_mode: must be one of {', '.join(SESSION_MODES)}, "
                         f"got {session_mode!r}")
    if think_time_us is not None and (session_mode != "closed-loop" or think_time_us < 0):
        raise ValueError("think_time_us: needs session_mode 'closed-loop' and a value >= 0, "
                         f"got {think_time_us!r} with {session_mode!r}")
    if think_time_dist is not None and (session_mode != "closed-loop"
                                        or think_time_us is not None):
        raise ValueError("think_time_dist: needs session_mode 'closed-loop' and no "
                         "think_time_us")
    header = read_trace_header(header_path)
    where = os.fspath(data_path)
    cols = _read_columns(data_path, use_send_time)
    group_length = _group_prefix_lengths(cols)
    prefix = np.array([group_length.get(g, 0) for g in cols.prefix_group], dtype=np.int64)
    input_tokens = np.asarray(cols.input_tokens, dtype=np.int64) + prefix
    _check_rows(where, cols, input_tokens)
    arrival = np.asarray(cols.arrival_us, dtype=np.int64)
    sessions = _Sessions.of(where, cols) if session_mode == "closed-loop" else None
    if sessions is not None and not sessions.rounds:
        warnings.warn(f"{where}: closed-loop replay of a trace without sessions replays it "
                      "with its own timing", UserWarning, stacklevel=2)
        sessions = None
    if sessions is None:
        initial, follow = np.arange(len(arrival)), np.zeros(0, dtype=np.int64)
    else:
        initial, follow = sessions.initial_rows(), sessions.follow_up_rows()
    order = initial[np.argsort(arrival[initial], kind="stable")]
    early = np.flatnonzero(arrival[initial][1:] < arrival[initial][:-1])
    if early.size:  # BLIS accepts such traces: its event queue orders arrivals by time
        k = int(early[0])
        a, b = int(initial[k]), int(initial[k + 1])
        warnings.warn(f"{where}: line {cols.line[b]} arrives before line "
                      f"{cols.line[a]} ({arrival[b]} < {arrival[a]} us); "
                      "rows are replayed in arrival order, file order breaking ties, as BLIS "
                      "does", UnsortedTraceWarning, stacklevel=2)
    rows = np.concatenate([order, follow]).astype(np.int64)
    # a follow-up carries its session's round 0 (tenant, client, SLO class, prefix)
    head = sessions.head_rows(len(arrival))[rows] if sessions is not None else rows
    groups = [cols.prefix_group[i] for i in head]
    group_names, group_codes = _codes([g for g in groups if g])
    group_code = np.full(len(groups), NO_PREFIX_GROUP, dtype=np.int32)
    group_code[[i for i, g in enumerate(groups) if g]] = group_codes
    tenant_names, tenant = _codes([cols.tenant[i] for i in head])
    client_names, client = _codes([cols.client[i] for i in head])

    def take(values: list[int], at: np.ndarray = rows) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)[at]

    follow_up = np.arange(len(rows)) >= len(order)
    tokens = np.where(follow_up, take(cols.input_tokens), input_tokens[rows])
    session_fields = {}
    if sessions is not None:
        names, codes = _codes([cols.session[i] for i in rows if cols.session[i]])
        session = np.full(len(rows), -1, dtype=np.int32)
        session[[k for k, i in enumerate(rows) if cols.session[i]]] = codes
        think = sessions.think_times(cols, think_time_us) if think_time_dist is None \
            else sessions.drawn_think_times(cols, think_time_dist, seed, group_length)
        session_fields = dict(
            session=session, round_index=take(cols.round_index) * (session >= 0),
            think_time_us=np.asarray([think.get(int(i), 0) for i in rows], dtype=np.int64),
            session_names=names,
            session_accumulate=header.get("session_context_growth", "") == "accumulate")
    return Workload(
        request_id=take(cols.request_id),
        arrival_us=np.where(follow_up, FOLLOW_UP_ARRIVAL_US, take(cols.arrival_us)),
        input_tokens=tokens,
        output_tokens=take(cols.output_tokens),
        prefix_group=group_code,
        prefix_length=prefix[head],
        tenant=tenant,
        client=client,
        slo_class=take(cols.slo_class, head),
        deadline_us=np.where(follow_up, FOLLOW_UP_TIMEOUT_US, take(cols.deadline_us)),
        tenant_names=tenant_names or ("",),
        client_names=client_names or ("",),
        prefix_group_names=group_names,
        metadata={"source": "trace", "trace_header": header},
        **session_fields,
    )


@dataclass(frozen=True)
class _Sessions:
    """A trace's sessions for closed-loop replay: each session's rows (file indices) by round,
    sessions in order of first appearance."""

    rounds: dict[str, list[int]]
    loose: list[int]  # rows outside any session, in file order

    @classmethod
    def of(cls, where: str, cols: _Columns) -> _Sessions:
        rounds: dict[str, list[int]] = {}
        loose: list[int] = []
        for i, sid in enumerate(cols.session):
            if sid:
                rounds.setdefault(sid, []).append(i)
            else:
                loose.append(i)
        for sid, rows in rounds.items():
            rows.sort(key=lambda i: cols.round_index[i])  # stable: file order among equals
            for k, i in enumerate(rows):
                if cols.round_index[i] != k:
                    raise ValueError(
                        f"{where}: line {cols.line[i]}, column 'round_index': session {sid!r} "
                        f"has non-consecutive rounds (expected {k}, got {cols.round_index[i]})")
        return cls(rounds, loose)

    def initial_rows(self) -> np.ndarray:
        """Round 0 of every session in session order, then the rows outside sessions (BLIS's
        injection order, which breaks ties between equal arrivals)."""
        return np.asarray([r[0] for r in self.rounds.values()] + self.loose, dtype=np.int64)

    def follow_up_rows(self) -> np.ndarray:
        return np.asarray([i for r in self.rounds.values() for i in r[1:]], dtype=np.int64)

    def head_rows(self, n: int) -> np.ndarray:
        """int64 [n]: for each file row, its session's round-0 row (itself outside sessions)."""
        head = np.arange(n, dtype=np.int64)
        for r in self.rounds.values():
            head[r] = r[0]
        return head

    def think_times(self, cols: _Columns, constant: int | None) -> dict[int, int]:
        """Think time before each follow-up row (file index -> µs)."""
        out: dict[int, int] = {}
        for rows in self.rounds.values():
            follow = rows[1:]
            if constant is not None:
                values = [constant] * len(follow)
            elif any(cols.think_time_us[i] != 0 for i in follow):
                values = [max(cols.think_time_us[i], 0) for i in follow]
            else:
                values = [max(cols.arrival_time_us[b] - cols.arrival_time_us[a], 0)
                          for a, b in zip(rows[:-1], follow, strict=True)]
            out.update(zip(follow, values, strict=True))
        return out


    def drawn_think_times(self, cols: _Columns, dist: ThinkTimeDist, seed: int,
                          group_length: dict[str, int]) -> dict[int, int]:
        """Think time before each follow-up row drawn from ``dist`` as BLIS's replay draws it
        (``LoadTraceV2SessionBlueprints``, ``SessionManager.OnComplete``): a master source
        seeded with ``seed`` draws each prefix group's tokens (groups in order of first
        appearance), then one seed per session (in session order); a session's source draws
        its round 0's prompt and output tokens, then, for each later round, the think time
        before that round's message and output tokens. A token is one ``Intn(128000)``."""
        from blisjax.gorand import GoRand  # gorand imports the workload package

        master = GoRand(seed)
        for length in group_length.values():
            _draw_tokens(master, length)
        out: dict[int, int] = {}
        for rows in self.rounds.values():
            source = GoRand(master.int63())
            _draw_tokens(source, cols.input_tokens[rows[0]] + cols.output_tokens[rows[0]])
            for i in rows[1:]:
                out[i] = dist.sample(source)
                _draw_tokens(source, cols.input_tokens[i] + cols.output_tokens[i])
        return out


def _draw_tokens(source: GoRand, count: int) -> None:
    """Advance ``source`` past ``count`` random token ids (BLIS ``GenerateRandomTokenIDs``)."""
    for _ in range(count):
        source.intn(TOKEN_VOCABULARY)


class UnsortedTraceWarning(UserWarning):
    """A trace's rows are not in arrival order (they are replayed in arrival order)."""


# --------------------------------------------------------------------------- writing


def _header_for(workload: Workload) -> dict[str, Any]:
    header = dict(workload.metadata.get("trace_header") or _DEFAULT_HEADER)
    header.update(trace_version=2, time_unit="microseconds")
    seed = workload.metadata.get("seed")
    if "trace_header" not in workload.metadata and isinstance(seed, int):
        header["workload_seed"] = seed
    return _check_header(header, "write_trace")


def _check_group_lengths(workload: Workload) -> None:
    """Every request of a group must carry the same prefix length, or replay would change it."""
    for code, name in enumerate(workload.prefix_group_names):
        lengths = np.unique(workload.prefix_length[workload.prefix_group == code])
        if lengths.size > 1:
            raise ValueError(
                f"write_trace: prefix group {name!r} has differing prefix lengths {lengths.tolist()}"
            )


def _csv_text(workload: Workload) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    w = workload
    in_group = w.prefix_group != NO_PREFIX_GROUP
    suffix_tokens = w.input_tokens - np.where(in_group, w.prefix_length, 0)
    for i in range(w.num_requests):
        group = w.prefix_group_names[w.prefix_group[i]] if in_group[i] else ""
        arrival = int(w.arrival_us[i])
        writer.writerow((
            int(w.request_id[i]), w.client_names[w.client[i]], w.tenant_names[w.tenant[i]],
            SLO_CLASSES[w.slo_class[i]], "", 0, group, int(w.prefix_length[i]), "false",
            int(suffix_tokens[i]), int(w.output_tokens[i]), 0, 0, 0, 0, 0, "",
            int(w.deadline_us[i]), 0, arrival, arrival, 0, 0, 0, "ok", "", "",
        ))  # fmt: skip
    return buf.getvalue()


def _atomic_write(items: list[tuple[str | os.PathLike[str], str]]) -> None:
    """Write each text to a temporary file beside its target, then rename all into place.

    Nothing is replaced unless every temporary file was written completely.
    """
    temps: list[str] = []
    try:
        for path, text in items:
            target = os.path.abspath(os.fspath(path))
            fd, tmp = tempfile.mkstemp(
                dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.", suffix=".tmp"
            )
            temps.append(tmp)
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; traces are ordinary data files
        for (path, _), tmp in zip(items, temps, strict=True):
            os.replace(tmp, os.fspath(path))
    finally:
        for tmp in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_trace(
    workload: Workload,
    header_path: str | os.PathLike[str],
    data_path: str | os.PathLike[str],
) -> None:
    """Write ``workload`` as a BLIS TraceV2 header (YAML) and CSV, atomically.

    The header is ``workload.metadata["trace_header"]`` when present (so a read trace keeps its
    header), else BLIS's generated-trace header. ``input_tokens`` is written without the prefix
    and ``send_time_us`` equals the arrival; unmodelled columns get BLIS's neutral values.
    ``read_trace`` of the result equals ``workload.canonical()``.
    """
    _check_group_lengths(workload)
    if workload.has_sessions:
        raise ValueError("write_trace: a closed-loop session workload has no arrival times for "
                         "its follow-up rounds; write the trace it was read from instead")
    header_text = yaml.safe_dump(_header_for(workload), sort_keys=False, default_flow_style=False)
    _atomic_write([(header_path, header_text), (data_path, _csv_text(workload))])
