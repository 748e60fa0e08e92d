"""Physics coefficient files: YAML with provenance metadata (docs/latency-models.md §P.8).

Format (one file per trained set)::

    physics_coefficients:
      spec_version: "1.0"          # feature specification version; must equal SPEC_VERSION
      status: trained              # trained | illustrative (placeholder, not for predictions)
      source: "..."                # optional free text: where the numbers come from
      trained_on:
        model: meta-llama/llama-3.1-8b-instruct    # required
        hardware: H100                             # required
        tp: 1                                      # required, >= 1
        vllm_version: "0.6.0"                      # optional (null allowed)
        training_date: "2026-02-17"                # optional
        n_samples_alpha: 5000                      # optional, >= 0
        n_samples_beta: 12000                      # optional, >= 0
        lambda_alpha: 0.1                          # optional, >= 0
        lambda_beta: 1.0                           # optional, >= 0
        gamma: 0.3                                 # preemption-EMA decay, in (0, 1]; default 0.3
        hold_out_rmse_alpha: 12.5                  # optional, µs, >= 0
        hold_out_rmse_beta: 45.2                   # optional, µs, >= 0
      alpha_coefficients: [...]    # exactly 11 finite numbers, µs per alpha-feature unit
      beta_coefficients: [...]     # exactly 16 finite numbers, µs per beta-feature unit

Unknown keys are errors; every error names the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from blisjax.config._checks import ConfigError
from blisjax.config._data import data_root
from blisjax.latency.physics.features import NUM_ALPHA_FEATURES, NUM_BETA_FEATURES
from blisjax.latency.physics.inputs import DEFAULT_PREEMPTION_EMA_GAMMA

#: Version of the feature specification this implementation computes
#: (docs/latency-models.md §P.1).
SPEC_VERSION = "1.0"
COEFFICIENT_STATUSES = ("trained", "illustrative")

_TOP_KEYS = (
    "spec_version",
    "status",
    "source",
    "trained_on",
    "alpha_coefficients",
    "beta_coefficients",
)
_OPTIONAL_STR = ("vllm_version", "training_date")
_OPTIONAL_COUNT = ("n_samples_alpha", "n_samples_beta")
_OPTIONAL_NONNEG = ("lambda_alpha", "lambda_beta", "hold_out_rmse_alpha", "hold_out_rmse_beta")
_TRAINED_ON_KEYS = (
    ("model", "hardware", "tp", "gamma") + _OPTIONAL_STR + _OPTIONAL_COUNT + (_OPTIONAL_NONNEG)
)


@dataclass(frozen=True)
class PhysicsCoefficients:
    """One validated coefficient set and its provenance.

    Attributes:
      alpha: 11 coefficients, µs per alpha-feature unit, in feature order.
      beta: 16 coefficients, µs per beta-feature unit, in feature order.
      model, hardware, tp: the deployment the set was trained on.
      gamma: preemption-EMA decay used in training (the simulator must use the same).
      status: "trained" or "illustrative".
      spec_version: feature specification version.
      source: free-text provenance ("" if absent).
      metadata: the remaining ``trained_on`` entries (training date, λ, RMSE, …).
    """

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    model: str
    hardware: str
    tp: int
    gamma: float = DEFAULT_PREEMPTION_EMA_GAMMA
    status: str = "trained"
    spec_version: str = SPEC_VERSION
    source: str = ""
    metadata: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "alpha", _coeffs("alpha_coefficients", self.alpha, NUM_ALPHA_FEATURES)
        )
        object.__setattr__(self, "beta", _coeffs("beta_coefficients", self.beta, NUM_BETA_FEATURES))
        object.__setattr__(self, "gamma", _gamma("trained_on.gamma", self.gamma))

    def compatibility_warnings(self, model: str, hardware: str, tp: int) -> list[str]:
        """Mismatches between the training deployment and a simulated one (empty = none)."""
        out = []
        if self.status != "trained":
            out.append(f"coefficients are {self.status}, not trained: predictions are not real")
        if model.lower().rsplit("/", 1)[-1] != self.model.lower().rsplit("/", 1)[-1]:
            out.append(f"trained on model {self.model!r}, simulating {model!r}")
        if hardware.lower() != self.hardware.lower():
            out.append(f"trained on hardware {self.hardware!r}, simulating {hardware!r}")
        if tp != self.tp:
            out.append(f"trained at tp={self.tp}, simulating tp={tp}")
        return out


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coeffs(path: str, values: Any, count: int) -> tuple[float, ...]:
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise ConfigError(path, f"must be a list of {count} finite numbers, got {values!r}")
    items = tuple(values)
    if len(items) != count:
        raise ConfigError(path, f"must have exactly {count} values, got {len(items)}")
    out = []
    for i, x in enumerate(items):
        if not _is_real(x) or not math.isfinite(x):
            raise ConfigError(f"{path}[{i}]", f"must be a finite number, got {x!r}")
        out.append(float(x))
    return tuple(out)


def _gamma(path: str, value: Any) -> float:
    if not _is_real(value) or not math.isfinite(value) or not 0 < value <= 1:
        raise ConfigError(path, f"must be a finite number in (0, 1], got {value!r}")
    return float(value)


def _str(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"must be a non-empty string, got {value!r}")
    return value


def _check_keys(path: str, mapping: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", f"unknown key; allowed keys: {', '.join(allowed)}")


def _trained_on(path: str, raw: Any) -> tuple[str, str, int, float, tuple[tuple[str, Any], ...]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"must be a mapping, got {raw!r}")
    _check_keys(path, raw, _TRAINED_ON_KEYS)
    for key in ("model", "hardware", "tp"):
        if key not in raw:
            raise ConfigError(f"{path}.{key}", "is required")
    model = _str(f"{path}.model", raw["model"])
    hardware = _str(f"{path}.hardware", raw["hardware"])
    tp = raw["tp"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"{path}.tp", f"must be an integer >= 1, got {tp!r}")
    gamma = _gamma(f"{path}.gamma", raw.get("gamma", DEFAULT_PREEMPTION_EMA_GAMMA))
    meta: list[tuple[str, Any]] = []
    for key in _OPTIONAL_STR + _OPTIONAL_COUNT + _OPTIONAL_NONNEG:
        value = raw.get(key)
        if value is None:
            continue
        if key in _OPTIONAL_STR:
            value = _str(f"{path}.{key}", str(value) if not isinstance(value, str) else value)
        elif key in _OPTIONAL_COUNT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{path}.{key}", f"must be an integer >= 0, got {value!r}")
        elif not _is_real(value) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{path}.{key}", f"must be a finite number >= 0, got {value!r}")
        meta.append((key, value))
    return model, hardware, tp, gamma, tuple(meta)


def parse_physics_coefficients(
    document: Any, origin: str = "physics_coefficients"
) -> PhysicsCoefficients:
    """Validate a decoded YAML document (see the module docstring for the format).

    Raises:
      ConfigError: naming the field (``physics_coefficients.alpha_coefficients``, …).
    """
    root = "physics_coefficients"
    if not isinstance(document, Mapping) or set(document) != {root}:
        raise ConfigError(origin, f"must be a mapping with the single key {root!r}")
    body = document[root]
    if not isinstance(body, Mapping):
        raise ConfigError(root, f"must be a mapping, got {body!r}")
    _check_keys(root, body, _TOP_KEYS)
    for key in ("spec_version", "status", "trained_on", "alpha_coefficients", "beta_coefficients"):
        if key not in body:
            raise ConfigError(f"{root}.{key}", "is required")
    version = body["spec_version"]
    if version != SPEC_VERSION:
        raise ConfigError(
            f"{root}.spec_version",
            f"must be {SPEC_VERSION!r} (the implemented feature specification), got {version!r}",
        )
    status = body["status"]
    if status not in COEFFICIENT_STATUSES:
        raise ConfigError(
            f"{root}.status", f"must be one of {', '.join(COEFFICIENT_STATUSES)}, got {status!r}"
        )
    source = body.get("source", "")
    if source is None:
        source = ""
    if not isinstance(source, str):
        raise ConfigError(f"{root}.source", f"must be a string, got {source!r}")
    model, hardware, tp, gamma, meta = _trained_on(f"{root}.trained_on", body["trained_on"])
    return PhysicsCoefficients(
        alpha=_coeffs(f"{root}.alpha_coefficients", body["alpha_coefficients"], NUM_ALPHA_FEATURES),
        beta=_coeffs(f"{root}.beta_coefficients", body["beta_coefficients"], NUM_BETA_FEATURES),
        model=model,
        hardware=hardware,
        tp=tp,
        gamma=gamma,
        status=status,
        spec_version=version,
        source=source,
        metadata=meta,
    )


def load_physics_coefficients(path: str | Path) -> PhysicsCoefficients:
    """Read and validate one coefficient YAML file.

    Raises:
      ConfigError: unreadable file, invalid YAML, or an invalid field (named in the message).
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError("physics_coefficients", f"cannot read {str(path)!r}: {err}") from err
    return _parse_text(text, str(path))


def _parse_text(text: str, origin: str) -> PhysicsCoefficients:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("physics_coefficients", f"{origin}: invalid YAML: {err}") from err
    return parse_physics_coefficients(document, origin)


def shipped_physics_coefficients() -> dict[str, PhysicsCoefficients]:
    """Every file in ``blisjax/data/coefficients/physics/`` by file name, validated."""
    folder = data_root() / "coefficients" / "physics"
    out = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yaml", ".yml")):
            out[entry.name] = _parse_text(entry.read_text(), entry.name)
    return out
