"""SLO attainment (docs/semantics.md §6.4).

For each configured SLO class a *completed* request is good only if it meets every non-zero
threshold of its class: ``TTFT_ms ≤ ttft``, ``ITL_ms ≤ itl`` (the request's mean ITL, i.e. TPOT)
and ``E2E_ms ≤ e2e``. Attainment divides by the class's *arrivals*, so rejected, dropped,
timed-out and unfinished requests all count against it. Class ``"default"`` is the empty class.
Per-tenant targets (``tenant_slo_attainment``) apply the same rule to a tenant's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blisjax.workload.types import SLO_CLASS_CODE

__all__ = ["DEFAULT_CLASS_NAME", "class_code", "slo_attainment", "tenant_slo_attainment"]

#: Name under which the empty SLO class ``""`` is reported and configured.
DEFAULT_CLASS_NAME = "default"

#: (dimension label, target attribute) in report order.
_DIMENSIONS: tuple[tuple[str, str], ...] = (
    ("ttft", "ttft_ms"),
    ("itl", "itl_ms"),
    ("e2e", "e2e_ms"),
)


def class_code(name: str) -> int:
    """SLO class code for a configured class name (``"default"`` and ``""`` are the empty class)."""
    key = "" if name == DEFAULT_CLASS_NAME else name
    if key not in SLO_CLASS_CODE:
        valid = [DEFAULT_CLASS_NAME, *(c for c in SLO_CLASS_CODE if c)]
        raise ValueError(f"unknown SLO class {name!r} in slo_targets; valid: {valid}")
    return SLO_CLASS_CODE[key]


def _fraction(numerator: int, denominator: int) -> float:
    return float(numerator) / float(denominator) if denominator > 0 else 0.0


def slo_attainment(
    slo_targets: Sequence[tuple[str, Any]],
    slo_class: np.ndarray,
    arrived: np.ndarray,
    completed: np.ndarray,
    ttft_ms: np.ndarray,
    itl_ms: np.ndarray,
    e2e_ms: np.ndarray,
) -> dict:
    """Overall and per-class SLO attainment.

    Args:
      slo_targets: (class name, target) pairs; a target has ``ttft_ms``, ``itl_ms``, ``e2e_ms``
        (float ms, 0 = not checked).
      slo_class: int32 class code per request.
      arrived: bool per request, counted as an arrival (arrival within the horizon).
      completed: bool per request.
      ttft_ms, itl_ms, e2e_ms: float64 ms per request (read only where ``completed``).

    Returns:
      ``{"overall", "good", "injected", "per_class": {name: {"attainment", "good", "injected",
      "completed", "<dim>_attainment"...}}}``; per-dimension fractions use the class's completed
      requests as denominator and appear only for checked (non-zero) dimensions. Fractions with a
      zero denominator are 0.0.
    """
    groups = []
    seen_codes: dict[int, str] = {}
    for name, target in slo_targets:
        code = class_code(name)
        if code in seen_codes:
            raise ValueError(f"SLO class {name!r} configured twice (also as {seen_codes[code]!r})")
        seen_codes[code] = name
        groups.append((DEFAULT_CLASS_NAME if code == 0 else name, slo_class == code, target))
    return _attainment(groups, "per_class", arrived, completed, ttft_ms, itl_ms, e2e_ms)


def tenant_slo_attainment(
    tenant_targets: Sequence[tuple[str, Any]],
    tenant: np.ndarray,
    tenant_names: Sequence[str],
    arrived: np.ndarray,
    completed: np.ndarray,
    ttft_ms: np.ndarray,
    itl_ms: np.ndarray,
    e2e_ms: np.ndarray,
) -> dict:
    """Overall and per-tenant SLO attainment: ``slo_attainment``'s rule with the requests
    grouped by tenant (``tenant`` codes index ``tenant_names``). A configured tenant with no
    requests in the workload is reported with 0 arrivals (attainment 0.0).

    Returns:
      ``{"overall", "good", "injected", "per_tenant": {name: {...}}}``, entries as
      ``slo_attainment``'s per class, in the configured order.
    """
    codes = {name: code for code, name in enumerate(tenant_names)}
    groups = []
    for name, target in tenant_targets:
        in_tenant = (tenant == codes[name]) if name in codes else np.zeros(tenant.shape, bool)
        groups.append((name, in_tenant, target))
    return _attainment(groups, "per_tenant", arrived, completed, ttft_ms, itl_ms, e2e_ms)


def _attainment(groups, key: str, arrived, completed, ttft_ms, itl_ms, e2e_ms) -> dict:
    """Attainment of each (report name, member mask, target) group and of their union."""
    measured = {"ttft": ttft_ms, "itl": itl_ms, "e2e": e2e_ms}
    per_group: dict[str, dict] = {}
    total_good = 0
    total_injected = 0
    for report_name, in_class, target in groups:
        done = in_class & completed
        good = done.copy()
        dims: dict[str, float] = {}
        for label, attr in _DIMENSIONS:
            threshold_ms = float(getattr(target, attr, 0) or 0)
            if threshold_ms == 0.0:
                continue
            meets = done & (measured[label] <= threshold_ms)
            dims[f"{label}_attainment"] = _fraction(int(meets.sum()), int(done.sum()))
            good &= meets
        n_good = int(good.sum())
        n_injected = int((in_class & arrived).sum())
        per_group[report_name] = {
            "attainment": _fraction(n_good, n_injected),
            "good": n_good,
            "injected": n_injected,
            "completed": int(done.sum()),
            **dims,
        }
        total_good += n_good
        total_injected += n_injected
    return {
        "overall": _fraction(total_good, total_injected),
        "good": total_good,
        "injected": total_injected,
        key: per_group,
    }
