"""Where the tests find the shared reference data (``shared/`` beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BLISJAX_SHARED", REPO.parent / "shared"))
GOLDEN_DIR = SHARED / "blis-golden"
