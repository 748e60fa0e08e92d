"""Shipped blackbox latency coefficients and BLIS's rule for choosing one set.

``blisjax/data/coefficients/blackbox.yaml`` is BLIS 4e179804's ``defaults.yaml`` table, generated
by ``tools/gen_blackbox_coefficients.py``: a ``defaults:`` map (model id → the GPU, tensor
parallelism and vLLM version BLIS assumes for that model) and a ``models:`` list of every fitted
entry (model id, GPU, TP, vLLM version, α, β) in BLIS's order, duplicates included.

The selection rule is BLIS 4e179804's (``cmd/root.go`` and ``GetDefaultSpecs`` /
``GetCoefficients`` in ``cmd/default_config.go``) when ``--alpha-coeffs``/``--beta-coeffs``
are absent:

1. The model name is lowercased (BLIS lowercases ``--model`` before any lookup). Nothing else is
   normalised: no bare-name or partial match.
2. The model's ``defaults:`` entry supplies whatever was not given: the vLLM version when
   ``--vllm-version`` is absent (BLIS also fills ``--hardware`` and ``--tp`` this way; in blisjax
   the GPU and TP always have values, ``hardware`` and ``engine.tensor_parallel_size``). A model
   without a ``defaults:`` entry and no ``--vllm-version`` looks for the version "", which no
   entry has.
3. The *first* ``models:`` entry whose id, GPU, TP and vLLM version all equal the wanted ones is
   used; the comparison is exact and case-sensitive (``H100``, not ``h100``). Later entries with
   the same key are never reached.
4. No match, or a match whose α and β are all zero, is an error (BLIS: "No trained coefficients
   found"); blisjax's message lists the GPU/TP/vLLM-version combinations the table has for the
   model.

So llama-3.1-8b-instruct on H100 with TP 1 gets the vLLM v0.11.0 entry (α 10326.27…, 0, 0;
β 6472.01…, 19.80…, 304.40…), exactly what ``blis run``/``blis replay --latency-model blackbox``
uses without coefficient flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import yaml

from blisjax.config._checks import check_float_tuple, check_int, check_str
from blisjax.config._data import blackbox_coefficients_file

#: The blackbox model has exactly three α terms and three β terms.
BLACKBOX_NUM_COEFFS = 3

_FILE = "blackbox.yaml"


@dataclass(frozen=True)
class BlackboxCoefficients:
    """One fitted coefficient set of BLIS's table with its provenance.

    Attributes:
      model_id: model id as BLIS names it, lowercase (``meta-llama/llama-3.1-8b-instruct``).
      gpu: GPU name as BLIS writes it (``H100``, ``A100-80``).
      tensor_parallelism: TP degree the set was fitted for.
      vllm_version: vLLM image the set was fitted on (``vllm/vllm-openai:v0.11.0``).
      alpha: (α0 µs, α1 µs per input token, α2 µs per output token).
      beta: (β0 µs, β1 µs per prefill token, β2 µs per decode token).
      source: where the numbers come from (``BLIS 4e179804 defaults.yaml``).
    """

    model_id: str
    gpu: str
    tensor_parallelism: int
    vllm_version: str
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    source: str

    def matches(self, model: str, gpu: str, tp: int, vllm_version: str) -> bool:
        """BLIS's match: lowercased model id, then exact id, GPU, TP and vLLM version."""
        return (
            self.model_id == model.lower()
            and self.gpu == gpu
            and self.tensor_parallelism == tp
            and self.vllm_version == vllm_version
        )


class BlackboxModelDefaults(NamedTuple):
    """A ``defaults:`` entry: what BLIS assumes for a model when flags leave it open."""

    gpu: str
    tensor_parallelism: int
    vllm_version: str


class BlackboxTable(NamedTuple):
    """The whole shipped table: ``defaults`` by model id and ``models`` in BLIS's order."""

    defaults: dict[str, BlackboxModelDefaults]
    models: tuple[BlackboxCoefficients, ...]
    source: str


def _parse_entry(i: int, entry: object, source: str) -> BlackboxCoefficients:
    path = f"{_FILE}: models[{i}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: must be a mapping, got {entry!r}")
    alpha = check_float_tuple(f"{path}.alpha_coeffs", entry.get("alpha_coeffs"))
    beta = check_float_tuple(f"{path}.beta_coeffs", entry.get("beta_coeffs"))
    for name, values in (("alpha_coeffs", alpha), ("beta_coeffs", beta)):
        if len(values) != BLACKBOX_NUM_COEFFS:
            raise ValueError(f"{path}.{name}: must have 3 values, got {len(values)}")
    return BlackboxCoefficients(
        model_id=check_str(f"{path}.id", entry.get("id")),
        gpu=check_str(f"{path}.GPU", entry.get("GPU")),
        tensor_parallelism=check_int(
            f"{path}.tensor_parallelism", entry.get("tensor_parallelism"), min_value=1
        ),
        vllm_version=check_str(f"{path}.vllm_version", entry.get("vllm_version")),
        alpha=alpha,
        beta=beta,
        source=source,
    )


def _parse_defaults(raw: object) -> dict[str, BlackboxModelDefaults]:
    if not isinstance(raw, dict):
        raise ValueError(f"{_FILE}: defaults must be a mapping, got {raw!r}")
    out: dict[str, BlackboxModelDefaults] = {}
    for model_id, spec in raw.items():
        path = f"{_FILE}: defaults[{model_id!r}]"
        if not isinstance(spec, dict):
            raise ValueError(f"{path}: must be a mapping, got {spec!r}")
        out[check_str(path, model_id)] = BlackboxModelDefaults(
            gpu=check_str(f"{path}.GPU", spec.get("GPU")),
            tensor_parallelism=check_int(
                f"{path}.tensor_parallelism", spec.get("tensor_parallelism"), min_value=1
            ),
            vllm_version=check_str(f"{path}.vllm_version", spec.get("vllm_version")),
        )
    return out


@lru_cache(maxsize=1)
def blackbox_table() -> BlackboxTable:
    """The shipped table (read once and cached)."""
    # libyaml's parser when present: ~9 ms instead of ~75 ms for the 111 entries; the values are
    # built by the same safe constructor either way.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    raw: Any = yaml.load(blackbox_coefficients_file().read_text(), Loader=loader)
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), list):
        raise ValueError(f"{_FILE}: must hold `source`, `defaults` and a `models` list")
    source = check_str(f"{_FILE}: source", raw.get("source"))
    models = tuple(_parse_entry(i, e, source) for i, e in enumerate(raw["models"]))
    return BlackboxTable(_parse_defaults(raw.get("defaults")), models, source)


def shipped_blackbox_coefficients() -> tuple[BlackboxCoefficients, ...]:
    """Every fitted set of the shipped table, in BLIS's order (duplicates included)."""
    return blackbox_table().models


def default_vllm_version(model: str) -> str | None:
    """The vLLM version BLIS assumes for ``model`` (lowercased), or None if it has no default."""
    spec = blackbox_table().defaults.get(model.lower())
    return None if spec is None else spec.vllm_version


def lookup_blackbox_coefficients(
    model: str, gpu: str, tp: int, vllm_version: str | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``(alpha, beta)`` BLIS picks for this model, GPU, TP and vLLM version; None if none.

    ``vllm_version`` None = the model's default version (``defaults:``). The rule is the module
    docstring's; an entry whose α and β are all zero counts as no match.
    """
    entry = _first_match(model, gpu, tp, vllm_version)
    return None if entry is None else (entry.alpha, entry.beta)


def select_blackbox_coefficients(
    model: str, gpu: str, tp: int, vllm_version: str | None = None
) -> BlackboxCoefficients:
    """The entry BLIS picks, as :func:`lookup_blackbox_coefficients`, or a descriptive error.

    Raises:
      LookupError: no entry matches; the message names the model, GPU, TP and vLLM version
        looked for and lists the combinations the table has for this model.
    """
    entry = _first_match(model, gpu, tp, vllm_version)
    if entry is not None:
        return entry
    version = _wanted_version(model, vllm_version)
    wanted = (
        f"model {model.lower()!r}, GPU {gpu!r}, TP {tp}, vLLM version "
        f"{version!r}" + (" (the model's default)" if vllm_version is None else "")
    )
    table = blackbox_table()
    same_model = [e for e in table.models if e.model_id == model.lower()]
    if same_model:
        combos = sorted({(e.gpu, e.tensor_parallelism, e.vllm_version) for e in same_model})
        have = "; ".join(f"{g} TP {t} {v!r}" for g, t, v in combos)
        hint = f"{table.source} has for this model: {have}"
    else:
        short = model.lower().rsplit("/", 1)[-1]
        near = sorted({e.model_id for e in table.models if e.model_id.endswith("/" + short)})
        hint = f"{table.source} has no entry for this model" + (
            f" (did you mean {', '.join(near)}?)" if near else ""
        )
    raise LookupError(f"no shipped blackbox coefficients for {wanted}; {hint}")


def _wanted_version(model: str, vllm_version: str | None) -> str:
    if vllm_version is not None:
        return vllm_version
    # BLIS looks for the version "" when neither the flag nor defaults.yaml gives one.
    return default_vllm_version(model) or ""


def _first_match(
    model: str, gpu: str, tp: int, vllm_version: str | None
) -> BlackboxCoefficients | None:
    version = _wanted_version(model, vllm_version)
    for entry in blackbox_table().models:
        if entry.matches(model, gpu, tp, version):
            # BLIS treats an all-zero match as "No trained coefficients found".
            if any(entry.alpha) or any(entry.beta):
                return entry
            return None
    return None
