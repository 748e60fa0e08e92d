"""The workload every engine consumes: one request per row, as plain numpy arrays.

A ``Workload`` is produced by the generator (``blisjax.workload.generate``) or by reading a
BLIS TraceV2 trace (``blisjax.workload.trace``). Both engines read only these arrays.

Row order is the request index used for every tie-break ("request index asc"): rows are sorted
by ``arrival_us`` with ties kept in generation order, and ``request_id`` keeps the id the
trace/generator gave the request (printed in results).
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
      deadline_us: int64 absolute deadline in µs, 0 = none.
      tenant_names, client_names, prefix_group_names: names for the integer codes.
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
    }

    def __post_init__(self) -> None:
        n = None
        for name, dtype in self._INT_FIELDS.items():
            arr = np.ascontiguousarray(np.asarray(getattr(self, name)), dtype=dtype)
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

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (in arrival order), name tables kept."""
        if n >= self.num_requests:
            return self
        return dataclasses.replace(self, **{f.name: getattr(self, f.name)[:n]
                                            for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), np.ndarray)})

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field and the allowed range."""
        n = self.num_requests
        if n and np.any(self.arrival_us < 0):
            raise ValueError("workload.arrival_us: must be >= 0")
        if n > 1 and np.any(np.diff(self.arrival_us) < 0):
            raise ValueError("workload.arrival_us: must be non-decreasing (sort requests by arrival)")
        if n and np.any(self.input_tokens < 1):
            raise ValueError("workload.input_tokens: must be >= 1")
        if n and np.any(self.output_tokens < 0):
            raise ValueError("workload.output_tokens: must be >= 0")
        if n and np.any((self.prefix_length < 0) | (self.prefix_length > self.input_tokens)):
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

    def content_equal(self, other: Workload) -> bool:
        """True when every per-request array and every name table is identical (metadata ignored)."""
        if not isinstance(other, Workload):
            return False
        same_arrays = all(
            np.array_equal(getattr(self, name), getattr(other, name)) for name in self._INT_FIELDS
        )
        return same_arrays and all(
            getattr(self, name) == getattr(other, name)
            for name in ("tenant_names", "client_names", "prefix_group_names")
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
        )
