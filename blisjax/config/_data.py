"""Locate the data shipped inside the package (works for editable and wheel installs)."""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only needed for annotations
    from importlib.resources.abc import Traversable


def data_root() -> Traversable:
    """The ``blisjax/data`` directory as an importlib resource."""
    return resources.files("blisjax") / "data"


def model_configs_root() -> Traversable:
    """``blisjax/data/model_configs``: one ``<name>/config.json`` per shipped model."""
    return data_root() / "model_configs"


def hardware_config_file() -> Traversable:
    """``blisjax/data/hardware_config.json`` (BLIS format: GPU name → specs)."""
    return data_root() / "hardware_config.json"


def blackbox_coefficients_file() -> Traversable:
    """``blisjax/data/coefficients/blackbox.yaml``: shipped blackbox α/β sets."""
    return data_root() / "coefficients" / "blackbox.yaml"
