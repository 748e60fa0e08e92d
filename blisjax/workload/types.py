"""The workload every engine consumes: one request per row, as plain numpy arrays.

A ``Workload`` is produced by the generator (``blisjax.workload.generate``) or by reading a
BLIS TraceV2 trace (``blisjax.workload.trace``). Both engines read only these arrays.

Row order is the request index used for every tie-break ("request index asc"): rows are sorted
by ``arrival_us`` with ties kept in generation order, and ``request_id`` keeps the id the
trace/generator gave the request (printed in results).

Closed-loop sessions (``blisjax.workload.sessions``): a session's round 0 is an ordinary row; its
follow-up rounds are rows after all others (session by session, round by round) whose arrival
the simulation decides — ``arrival_us`` holds ``FOLLOW_UP_ARRIVAL_US`` until then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

#: SLO classes, in the order of their integer codes. Code 0 is the empty class "".
SLO_CLASSES: tuple[str, ...] = ("", "critical", "standard", "sheddable", "batch", "background")
SLO_CLASS_CODE: dict[str, int] = {name: i for i, name in enumerate(SLO_CLASSES)}

#: Prefix-group code of a request that belongs to no prefix group.
NO_PREFIX_GROUP = -1

#: Session code of a request that belongs to no closed-loop session.
NO_SESSION = -1

#: ``arrival_us`` of a follow-up round the simulation has not generated (yet): later than any
#: horizon, so such a row never counts as arrived.
FOLLOW_UP_ARRIVAL_US = 1 << 62


@dataclass(frozen=True, eq=False)
class Workload:
    """N requests as parallel arrays (all of length N, row = request index).

    Attributes:
      request_id: int64, id printed in results (trace ``request_id`` or generation order).
      arrival_us: int64 µs, non-decreasing.
      input_tokens: int64, prompt length **including** the shared prefix (BLIS ``len(InputTokens)``), ≥ 1.
      output_tokens: int64, output length N_out ≥ 0 (also the request's max output length).
      prefix_group: int32 index into ``prefix_group_names`` or ``NO_PREFIX_GROUP``.
      prefix_length: int64 tokens of shared prefix at the start of the input (0 without a group).
      tenant: int32 index into ``tenant_names`` (tenant "" is a valid name).
      client: int32 index into ``client_names``.
      slo_class: int32 code into ``SLO_CLASSES``.
      deadline_us: int64 absolute deadline in µs, 0 = none; for a follow-up round, its timeout
        in µs after its arrival (0 = none).
      session: int32 index into ``session_names`` or ``NO_SESSION`` (closed-loop sessions only).
      round_index: int32 round of the request in its session (0 without one). A follow-up round
        (round ≥ 1) has ``arrival_us = FOLLOW_UP_ARRIVAL_US`` and ``input_tokens`` = the length of
        its new message; the engines assemble its prompt (``sessions.prompt_tokens``).
      think_time_us: int64 µs between a follow-up's predecessor completing and its arrival (0
        for other rows, but a concurrency user's first request carries its user's, read when
        the user runs out of rows).
      tenant_names, client_names, prefix_group_names, session_names: names for the codes.
      session_accumulate: a follow-up's prompt is the conversation so far plus its message
        (BLIS ``context_growth: accumulate``); otherwise the shared prefix plus its message.
      session_unbounded: per session, whether its rows are a capacity rather than its end (a
        concurrency user's: it sends until the follow-up budget or the horizon stops it; a
        run in which it would need a row more is refused, ``workload.rounds_per_user``); ()
        = none is.
      follow_up_budget: most follow-ups a run creates, in creation order (BLIS's follow-up
        budget: the request count left after the first requests); -1 = no cap.
    """

    request_id: np.ndarray
    arrival_us: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_length: np.ndarray
    tenant: np.ndarray
    client: np.ndarray
    slo_class: np.ndarray
    deadline_us: np.ndarray
    tenant_names: tuple[str, ...] = ("",)
    client_names: tuple[str, ...] = ("",)
    prefix_group_names: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)
    session: np.ndarray | None = None
    round_index: np.ndarray | None = None
    think_time_us: np.ndarray | None = None
    session_names: tuple[str, ...] = ()
    session_accumulate: bool = False
    session_unbounded: tuple[bool, ...] = ()
    follow_up_budget: int = -1

    _INT_FIELDS = {
        "request_id": np.int64,
        "arrival_us": np.int64,
        "input_tokens": np.int64,
        "output_tokens": np.int64,
        "prefix_group": np.int32,
        "prefix_length": np.int64,
        "tenant": np.int32,
        "client": np.int32,
        "slo_class": np.int32,
        "deadline_us": np.int64,
        "session": np.int32,
        "round_index": np.int32,
        "think_time_us": np.int64,
    }
    #: Session columns and their value for a request outside any session (may be omitted).
    _SESSION_DEFAULTS = {"session": NO_SESSION, "round_index": 0, "think_time_us": 0}

    def __post_init__(self) -> None:
        n = None
        for name, dtype in self._INT_FIELDS.items():
            value = getattr(self, name)
            if value is None:  # session columns default to "no session"
                value = np.full(np.asarray(self.arrival_us).shape[0],
                                self._SESSION_DEFAULTS[name])
            arr = np.ascontiguousarray(np.asarray(value), dtype=dtype)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
            if arr.ndim != 1:
                raise ValueError(f"workload.{name}: expected a 1-D array, got shape {arr.shape}")
            if n is None:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise ValueError(f"workload.{name}: length {arr.shape[0]} differs from {n}")
        self.validate()

    @property
    def num_requests(self) -> int:
        return int(self.arrival_us.shape[0])

    def __len__(self) -> int:
        return self.num_requests

    @property
    def follow_up(self) -> np.ndarray:
        """bool [N]: the row is a follow-up round of a closed-loop session."""
        return (self.session != NO_SESSION) & (self.round_index > 0)

    @property
    def has_sessions(self) -> bool:
        """Some request belongs to a closed-loop session with a follow-up round."""
        return bool(np.any(self.follow_up))

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (in arrival order), name tables kept; with closed-loop
        sessions the first ``n`` of the rows that are not later rounds, and the later rounds of
        the sessions they start (sessions renumbered in order)."""
        initial = ~self.follow_up
        if n >= int(np.count_nonzero(initial)):
            return self
        keep = np.arange(self.num_requests) < n
        fields = {}
        if self.has_sessions:
            heads = self.session[:n][self.session[:n] != NO_SESSION]
            keep |= self.follow_up & np.isin(self.session, heads)
            code = np.full(len(self.session_names) + 1, NO_SESSION, dtype=np.int64)
            code[heads] = np.arange(heads.size)
            fields = dict(session_names=tuple(self.session_names[k] for k in heads.tolist()))
            if self.session_unbounded:
                fields["session_unbounded"] = tuple(self.session_unbounded[k]
                                                    for k in heads.tolist())
        arrays = {f.name: getattr(self, f.name)[keep] for f in dataclasses.fields(self)
                  if isinstance(getattr(self, f.name), np.ndarray)}
        if self.has_sessions:
            arrays["session"] = code[arrays["session"]]
        return dataclasses.replace(self, **arrays, **fields)

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field and the allowed range."""
        n = self.num_requests
        if n and np.any(self.arrival_us < 0):
            raise ValueError("workload.arrival_us: must be >= 0")
        initial = ~self.follow_up
        first = self.arrival_us[initial]
        if first.size > 1 and np.any(np.diff(first) < 0):
            raise ValueError("workload.arrival_us: must be non-decreasing (sort requests by arrival)")
        if n and np.any(np.diff(initial.astype(np.int8)) > 0):
            raise ValueError("workload.round_index: follow-up rounds must come after every "
                             "other request")
        self._validate_sessions()
        if n and np.any(self.input_tokens < 1):
            raise ValueError("workload.input_tokens: must be >= 1")
        if n and np.any(self.output_tokens < 0):
            raise ValueError("workload.output_tokens: must be >= 0")
        # a follow-up's input_tokens is its message; its prompt starts with the whole prefix
        long_prefix = (self.prefix_length > self.input_tokens) & ~self.follow_up
        if n and np.any((self.prefix_length < 0) | long_prefix):
            raise ValueError("workload.prefix_length: must be in [0, input_tokens]")
        ng = len(self.prefix_group_names)
        if n and np.any((self.prefix_group < NO_PREFIX_GROUP) | (self.prefix_group >= ng)):
            raise ValueError(f"workload.prefix_group: must be -1 or in [0, {ng - 1}]")
        if n and np.any((self.prefix_group == NO_PREFIX_GROUP) & (self.prefix_length != 0)):
            raise ValueError("workload.prefix_length: must be 0 for requests without a prefix group")
        for name, names in (("tenant", self.tenant_names), ("client", self.client_names)):
            codes = getattr(self, name)
            if n and np.any((codes < 0) | (codes >= len(names))):
                raise ValueError(f"workload.{name}: codes must be in [0, {len(names) - 1}]")
        if n and np.any((self.slo_class < 0) | (self.slo_class >= len(SLO_CLASSES))):
            raise ValueError(f"workload.slo_class: codes must be in [0, {len(SLO_CLASSES) - 1}]")
        if n and np.any(self.deadline_us < 0):
            raise ValueError("workload.deadline_us: must be >= 0 (0 = no deadline)")

    def _validate_sessions(self) -> None:
        n = self.num_requests
        ns = len(self.session_names)
        if n and np.any((self.session < NO_SESSION) | (self.session >= max(ns, 0))):
            raise ValueError(f"workload.session: must be -1 or in [0, {ns - 1}]")
        if n and np.any(self.round_index < 0):
            raise ValueError("workload.round_index: must be >= 0")
        if n and np.any((self.session == NO_SESSION) & (self.round_index != 0)):
            raise ValueError("workload.round_index: must be 0 for requests outside a session")
        if n and np.any(self.think_time_us < 0):
            raise ValueError("workload.think_time_us: must be >= 0")
        if self.session_unbounded and len(self.session_unbounded) != ns:
            raise ValueError(f"workload.session_unbounded: one entry per session ({ns}), got "
                             f"{len(self.session_unbounded)}")
        budget = self.follow_up_budget
        if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < -1:
            raise ValueError(f"workload.follow_up_budget: must be an integer >= -1 (-1: no "
                             f"cap), got {budget!r}")
        follow = self.follow_up
        if not np.any(follow):
            return
        # each session: one round 0 among the initial rows, then rounds 1.. in order
        rounds = self.round_index[follow]
        sess = self.session[follow]
        expected = np.ones_like(rounds)
        expected[1:] = np.where(sess[1:] == sess[:-1], rounds[:-1] + 1, 1)
        if np.any(rounds != expected):
            raise ValueError("workload.round_index: a session's follow-up rounds must be "
                             "consecutive rows numbered 1, 2, …")
        heads = self.session[~follow & (self.session != NO_SESSION)]
        if np.unique(heads).size != heads.size or not np.all(np.isin(sess, heads)):
            raise ValueError("workload.session: every session needs exactly one round 0")
        if np.unique(sess).size != np.count_nonzero(np.diff(sess, prepend=-2) != 0):
            raise ValueError("workload.session: a session's follow-up rounds must be adjacent")
        timeouts = self.deadline_us[follow]
        if np.any((sess[1:] == sess[:-1]) & (timeouts[1:] != timeouts[:-1])):
            raise ValueError("workload.deadline_us: a session's follow-up rounds must share one "
                             "timeout")

    def content_equal(self, other: Workload) -> bool:
        """True when every per-request array and every name table is identical (metadata ignored)."""
        if not isinstance(other, Workload):
            return False
        same_arrays = all(
            np.array_equal(getattr(self, name), getattr(other, name)) for name in self._INT_FIELDS
        )
        return same_arrays and all(
            getattr(self, name) == getattr(other, name)
            for name in ("tenant_names", "client_names", "prefix_group_names", "session_names",
                         "session_accumulate", "session_unbounded", "follow_up_budget")
        )

    def canonical(self) -> Workload:
        """The same requests with tenant/client/prefix-group codes renumbered by first appearance
        in row order and unused names dropped (the form ``read_trace`` returns)."""

        def recode(codes: np.ndarray, names: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...]]:
            valid = codes >= 0  # NO_PREFIX_GROUP stays as it is
            _, first = np.unique(codes[valid], return_index=True)
            used = codes[valid][np.sort(first)]  # old codes in order of first appearance
            mapping = np.full(len(names) + 1, NO_PREFIX_GROUP, dtype=np.int32)
            mapping[used] = np.arange(used.size, dtype=np.int32)
            new = np.where(valid, mapping[np.where(valid, codes, 0)], codes)
            return new, tuple(names[c] for c in used)

        tenant, tenant_names = recode(self.tenant, self.tenant_names)
        client, client_names = recode(self.client, self.client_names)
        group, group_names = recode(self.prefix_group, self.prefix_group_names)
        fields = {name: getattr(self, name) for name in self._INT_FIELDS}
        fields.update(tenant=tenant, client=client, prefix_group=group)
        return Workload(
            **fields,
            tenant_names=tenant_names or ("",),
            client_names=client_names or ("",),
            prefix_group_names=group_names,
            metadata=dict(self.metadata),
            session_names=self.session_names,
            session_accumulate=self.session_accumulate,
            session_unbounded=self.session_unbounded,
            follow_up_budget=self.follow_up_budget,
        )
