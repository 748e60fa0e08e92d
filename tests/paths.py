"""Where the tests find BLIS's reference outputs (``tests/data/`` inside the repository) and the
benchmark scripts whose tools they check."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "tests" / "data"
GOLDEN_DIR = DATA_DIR / "blis-golden"


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/{name}.py`` loaded as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# The five BLIS golden-dataset cases. Tests enumerate them by number, never by listing the folder,
# so a missing file fails its test instead of leaving nothing to run.
GOLDEN_CASES = range(5)


def golden_case(case: int, suffix: str = ".json") -> Path:
    """Path of ``golden_case{case}{suffix}`` (``.json`` BLIS's output, ``.csv`` its trace)."""
    return GOLDEN_DIR / f"golden_case{case}{suffix}"


GOLDEN_NEXT_DIR = DATA_DIR / "blis-golden-next"

# BLIS replays that exercise routing ties and BLIS HEAD's inputs (copied from BLIS's
# blis-golden-next runs: case JSON, trace header and trace data per name).
GOLDEN_NEXT_CASES = ("bb_leastloaded_4inst_ties", "bb_weighted_prefix_affinity_3inst",
                     "weighted_default_scorers_4inst")

# BLIS HEAD replays with a CPU tier (BLIS's behaviour, so --blis-quirks): reloads without
# preemption, and reloads meeting 63 preemptions.
GOLDEN_NEXT_TIERED = "kv_tiered_reload"
GOLDEN_NEXT_TIERED_PREEMPT = "kv_tiered_preempt"
GOLDEN_NEXT_TIERED_CASES = (GOLDEN_NEXT_TIERED, GOLDEN_NEXT_TIERED_PREEMPT)
GOLDEN_NEXT_SESSIONS = "sessions_closed_loop"

# BLIS HEAD replays with prefill/decode pools (BLIS's behaviour, so --blis-quirks).
GOLDEN_NEXT_PD = ("pd_1p2d_always_rr", "pd_2p2d_prefix_threshold_ll",
                  "pd_contention_pool_scorers")
