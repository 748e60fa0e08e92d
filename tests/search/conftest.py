"""Shared paths of the search tests: the tiny experiment (one JAX compile shape)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TINY_CONFIG = DATA / "tiny.yaml"
TINY_SPACE = DATA / "tiny-space.yaml"
#: Every simulation test uses these lanes and the config's own seed, so that the whole search
#: test suite compiles the JAX engine once.
TINY_LANES = 4
