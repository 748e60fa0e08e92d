"""Shipped blackbox latency coefficients (``blisjax/data/coefficients/blackbox.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from blisjax.config._checks import check_float_tuple, check_int, check_str
from blisjax.config._data import blackbox_coefficients_file

#: The blackbox model has exactly three α terms and three β terms.
BLACKBOX_NUM_COEFFS = 3


@dataclass(frozen=True)
class BlackboxCoefficients:
    """One fitted coefficient set with its provenance.

    Attributes:
      model_id: model id as BLIS names it (``meta-llama/llama-3.1-8b-instruct``).
      gpu: GPU name (``H100``).
      tensor_parallelism: TP degree the set was fitted for.
      alpha: (α0 µs, α1 µs/input token, α2 µs per output token).
      beta: (β0 µs, β1 µs/prefill token, β2 µs/decode token).
      source: where the numbers come from.
    """

    model_id: str
    gpu: str
    tensor_parallelism: int
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    source: str

    def matches(self, model: str, gpu: str, tp: int) -> bool:
        """Case-insensitive model/GPU match; a bare model name matches the id's last part."""
        wanted = model.lower()
        mine = self.model_id.lower()
        same_model = wanted == mine or ("/" not in wanted and wanted == mine.rsplit("/", 1)[-1])
        return same_model and gpu.lower() == self.gpu.lower() and tp == self.tensor_parallelism


def _parse_entry(i: int, entry: object) -> BlackboxCoefficients:
    path = f"blackbox.yaml[{i}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: must be a mapping, got {entry!r}")
    alpha = check_float_tuple(f"{path}.alpha_coeffs", entry.get("alpha_coeffs"))
    beta = check_float_tuple(f"{path}.beta_coeffs", entry.get("beta_coeffs"))
    for name, values in (("alpha_coeffs", alpha), ("beta_coeffs", beta)):
        if len(values) != BLACKBOX_NUM_COEFFS:
            raise ValueError(f"{path}.{name}: must have 3 values, got {len(values)}")
    return BlackboxCoefficients(
        model_id=check_str(f"{path}.id", entry.get("id")),
        gpu=check_str(f"{path}.gpu", entry.get("gpu")),
        tensor_parallelism=check_int(
            f"{path}.tensor_parallelism", entry.get("tensor_parallelism"), min_value=1
        ),
        alpha=alpha,
        beta=beta,
        source=check_str(f"{path}.source", entry.get("source")),
    )


@lru_cache(maxsize=1)
def shipped_blackbox_coefficients() -> tuple[BlackboxCoefficients, ...]:
    """All shipped coefficient sets, in file order."""
    entries = yaml.safe_load(blackbox_coefficients_file().read_text())
    if not isinstance(entries, list):
        raise ValueError("blackbox.yaml: must hold a list of coefficient sets")
    return tuple(_parse_entry(i, e) for i, e in enumerate(entries))


def lookup_blackbox_coefficients(
    model: str, gpu: str, tp: int
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(alpha, beta) shipped for this model (case-insensitive), GPU and TP; None if none."""
    for entry in shipped_blackbox_coefficients():
        if entry.matches(model, gpu, tp):
            return entry.alpha, entry.beta
    return None
