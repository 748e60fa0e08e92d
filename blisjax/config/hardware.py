"""GPU specifications in BLIS's ``hardware_config.json`` format (docs/roofline.md §1.5)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blisjax.config._checks import ConfigError, check_float, check_str, set_field
from blisjax.config._data import hardware_config_file

#: JSON key → HardwareConfig field. Keys starting with "_" (comments) and others are ignored.
_JSON_KEYS = {
    "TFlopsPeak": "tflops_peak",
    "TFlopsFP8": "tflops_fp8",
    "BwPeakTBs": "bw_peak_tbs",
    "mfuPrefill": "mfu_prefill",
    "mfuDecode": "mfu_decode",
    "MemoryGiB": "memory_gib",
}


#: Indicative on-demand price of one GPU-hour per GPU type (US dollars), the default of
#: ``metrics.gpu_price_per_hour``. Round figures of the order of public cloud list prices, not
#: a quote: set ``metrics.gpu_price_per_hour`` to what your GPUs cost.
GPU_PRICE_PER_HOUR = {"H100": 3.0, "A100-SXM": 1.5, "A100-80": 2.0, "L40S": 1.0}


def gpu_price_per_hour(hardware: str) -> float:
    """The default price of one GPU-hour of ``hardware`` (1.0 when not listed)."""
    return GPU_PRICE_PER_HOUR.get(hardware, 1.0)


@dataclass(frozen=True)
class HardwareConfig:
    """One GPU type.

    Attributes:
      name: the key in hardware_config.json (``H100``).
      tflops_peak: dense BF16/FP16 peak, TFLOP/s (> 0).
      tflops_fp8: FP8 peak, TFLOP/s; 0 = no native FP8.
      bw_peak_tbs: HBM bandwidth, TB/s (> 0).
      mfu_prefill: model FLOP utilization reached in prefill, in (0, 1].
      mfu_decode: model FLOP utilization reached in decode, in (0, 1].
      memory_gib: HBM per GPU, GiB; 0 = unknown (BLIS then keeps 1,000,000 KV blocks).
    """

    name: str
    tflops_peak: float
    tflops_fp8: float
    bw_peak_tbs: float
    mfu_prefill: float
    mfu_decode: float
    memory_gib: float

    def __post_init__(self) -> None:
        p = f"hardware[{self.name!r}]"
        check_str("hardware.name", self.name)
        for name in ("tflops_peak", "bw_peak_tbs"):
            set_field(
                self,
                name,
                check_float(f"{p}.{name}", getattr(self, name), min_value=0, min_open=True),
            )
        for name in ("mfu_prefill", "mfu_decode"):
            value = check_float(
                f"{p}.{name}", getattr(self, name), min_value=0, min_open=True, max_value=1
            )
            set_field(self, name, value)
        # BLIS accepts 0 for these ("not available"), otherwise they must be finite positive.
        for name in ("tflops_fp8", "memory_gib"):
            set_field(self, name, check_float(f"{p}.{name}", getattr(self, name), min_value=0))

    @property
    def has_fp8(self) -> bool:
        """True iff the GPU has a native FP8 rate."""
        return self.tflops_fp8 > 0

    @classmethod
    def from_json_entry(cls, name: str, entry: Mapping[str, Any]) -> HardwareConfig:
        """Build from one hardware_config.json entry; a missing key reads as 0 (as Go does)."""
        if not isinstance(entry, Mapping):
            raise ConfigError(f"hardware[{name!r}]", f"must be a JSON object, got {entry!r}")
        values = {field: entry.get(key, 0.0) for key, field in _JSON_KEYS.items()}
        return cls(name=name, **values)


def _read_table(path: str | Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        source = hardware_config_file()
        return json.loads(source.read_text()), "shipped hardware_config.json"
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError("hardware", f"cannot read hardware file {str(path)!r}: {err}") from err
    if not isinstance(table, dict):
        raise ConfigError("hardware", f"{str(path)!r} must hold a JSON object of GPU entries")
    return table, repr(str(path))


def available_hardware(path: str | Path | None = None) -> tuple[str, ...]:
    """GPU names defined in the shipped table (or in ``path``)."""
    table, _ = _read_table(path)
    return tuple(k for k in table if not k.startswith("_"))


@functools.cache
def shipped_hardware() -> tuple[str, ...]:
    """GPU names of the shipped table, in its order (read once)."""
    return available_hardware()


def hardware_code(name: str) -> int:
    """The code of GPU ``name`` in a population (``PolicyParams.gpu``): its index in the
    shipped table; a GPU the table does not list (a user hardware file's) gets
    ``hardware_code_count() - 1``."""
    names = shipped_hardware()
    return names.index(name) if name in names else len(names)


def hardware_code_count() -> int:
    """Codes ``hardware_code`` gives: one per shipped GPU, plus one for any other."""
    return len(shipped_hardware()) + 1


def load_hardware(name: str, path: str | Path | None = None) -> HardwareConfig:
    """Look up a GPU by exact name in the shipped table, or in a user JSON of the same format.

    Raises:
      ConfigError: unknown name (the message lists the known ones) or invalid values.
    """
    table, origin = _read_table(path)
    if name.startswith("_") or name not in table:
        known = ", ".join(k for k in table if not k.startswith("_"))
        raise ConfigError("hardware", f"unknown GPU {name!r} in {origin}; known: {known}")
    return HardwareConfig.from_json_entry(name, table[name])
