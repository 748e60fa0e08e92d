"""Files of a search run: atomic writes, the history CSV, checkpoints, policy exports (BLIS
policy bundle, full configuration, llm-d EndpointPickerConfig).

Every file is written to a temporary file in the destination directory and ``os.replace``d into
place, so a killed run never leaves a half-written file. Numbers are written with Python's
shortest round-trip ``repr``, so the same run gives the same bytes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from blisjax.atomicio import write_bytes_atomic, write_text_atomic
from blisjax.config import SimConfig, config_to_dict, dump_config
from search.llmd import DEFAULT_API_VERSION, ENDPOINT_PICKER, endpoint_picker_config

__all__ = ["BUNDLE_SECTIONS", "CHECKPOINT", "HISTORY", "bundle_left_out", "endpoint_picker_name", "json_safe", "load_checkpoint", "policy_bundle_yaml",
           "save_checkpoint", "write_bytes_atomic", "write_csv_atomic", "write_json_atomic",
           "write_policy_exports", "write_text_atomic"]

CHECKPOINT = "checkpoint.npz"
HISTORY = "history.csv"
_FORMAT = 1


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars/arrays as Python data and non-finite floats as strings
    (``"inf"``, ``"-inf"``, ``"nan"``) so it is valid JSON."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else repr(f)
    return value


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """JSON (indent 2, keys in insertion order), atomically; non-finite floats as strings."""
    write_text_atomic(path, json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")


def format_cell(value: Any) -> str:
    """One CSV cell: floats by ``repr`` (round-trip exact), booleans as 1/0."""
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def write_csv_atomic(path: str | os.PathLike, columns: Sequence[str],
                     rows: Sequence[Sequence[Any]]) -> None:
    """A CSV table (header + rows, ``\\n`` line ends), atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([format_cell(v) for v in row])
    write_text_atomic(path, buf.getvalue())


def save_checkpoint(path: str | os.PathLike, leaves: Sequence[np.ndarray],
                    meta: Mapping[str, Any]) -> None:
    """Strategy-state arrays + JSON metadata in one ``.npz``, atomically.

    ``meta`` may hold non-finite floats (stored as JSON ``Infinity``/``NaN``, read back exactly).
    """
    buf = io.BytesIO()
    arrays = {f"state_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    text = json.dumps({"format": _FORMAT, **meta}, allow_nan=True)
    np.savez(buf, meta=np.frombuffer(text.encode("utf-8"), dtype=np.uint8), **arrays)
    write_bytes_atomic(path, buf.getvalue())


def load_checkpoint(path: str | os.PathLike) -> tuple[list[np.ndarray], dict[str, Any]]:
    """(state arrays, metadata) of a checkpoint written by :func:`save_checkpoint`."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        n = sum(1 for k in data.files if k.startswith("state_"))
        leaves = [data[f"state_{i}"] for i in range(n)]
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    return leaves, meta


class _BundleDumper(yaml.SafeDumper):
    """Writes the empty SLO-class key as ``'': 3.0`` instead of a ``? ''`` complex key."""

    def check_simple_key(self) -> bool:
        if isinstance(self.event, yaml.ScalarEvent) and self.event.value == "":
            return True
        return super().check_simple_key()


#: Sections of a BLIS policy bundle; a knob outside them cannot be expressed in one.
BUNDLE_SECTIONS = ("admission", "priority", "routing", "scheduler")


def bundle_left_out(knobs: Mapping[str, Any]) -> list[str]:
    """The searched knobs a BLIS policy bundle cannot carry (``name=value``): everything outside
    its four sections (cluster size, CPU tier, P/D pools, autoscaler, preemption victim)."""
    return [f"{name}={value!r}" for name, value in knobs.items()
            if name.split(".")[0] not in BUNDLE_SECTIONS]


def policy_bundle_yaml(config: SimConfig, header: Sequence[str] = (),
                       left_out: Sequence[str] = ()) -> str:
    """The policy of ``config`` as a BLIS policy bundle (``--policy-config`` YAML).

    Every field of the four sections is written (not only the searched ones), so the bundle
    reproduces the policy on top of any base configuration. ``engine.preemption_policy`` is not
    part of a bundle; it is noted in the header when it differs from the default, and so are
    ``left_out``, the searched knobs outside the bundle (``bundle_left_out``).
    """
    policy = config_to_dict(config)["policy"]
    policy["scheduler"] = policy["scheduler"]["policy"]
    lines = [f"# {h}" for h in header]
    if config.engine.preemption_policy != "fcfs":
        lines.append(f"# engine.preemption_policy: {config.engine.preemption_policy} is not "
                     "part of a policy bundle; see best_config.yaml")
    for item in left_out:
        if not item.startswith("engine.preemption_policy="):
            lines.append(f"# {item} is not part of a policy bundle: this bundle alone does not "
                         "reproduce the searched policy; see best_config.yaml")
    text = yaml.dump(policy, Dumper=_BundleDumper, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + ("\n" if lines else "") + text


def write_policy_exports(out_dir: Path, config: SimConfig, header: Sequence[str],
                         stem: str = "best",
                         llmd_api_version: str = DEFAULT_API_VERSION,
                         left_out: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``<stem>_policy.yaml`` (policy bundle) and ``<stem>_config.yaml`` (the full
    experiment with that policy, for ``blisjax run --config``); returns both paths.

    Beside them, ``endpoint_picker.yaml`` (stem ``best``; ``<stem>_endpoint_picker.yaml``
    otherwise): the routing as an llm-d EndpointPickerConfig with apiVersion
    ``llmd_api_version`` (:func:`search.llmd.endpoint_picker_config`). A policy without an llm-d
    counterpart gets none, and a file left by an earlier best policy of the same run is removed.
    """
    bundle = out_dir / f"{stem}_policy.yaml"
    full = out_dir / f"{stem}_config.yaml"
    write_text_atomic(bundle, policy_bundle_yaml(config, header, left_out))
    write_text_atomic(full, "".join(f"# {h}\n" for h in header) + dump_config(config))
    picker = out_dir / endpoint_picker_name(stem)
    export = endpoint_picker_config(config, llmd_api_version, header)
    if export.text is not None:
        write_text_atomic(picker, export.text)
    else:
        picker.unlink(missing_ok=True)
    return bundle, full


def endpoint_picker_name(stem: str = "best") -> str:
    """File name of the llm-d export written by :func:`write_policy_exports` for ``stem``."""
    return ENDPOINT_PICKER if stem == "best" else f"{stem}_{ENDPOINT_PICKER}"
