"""BLIS replays with routing ties and BLIS HEAD inputs reproduce BLIS request by request.

Cases from ``tests/data/blis-golden-next`` (real BLIS runs; README there): least-loaded and
weighted routing over mostly idle instances, where BLIS breaks ties with its "router" random
stream (BLIS 4e179804, trace_version 2), and BLIS HEAD's default weighted profile with the
precise-prefix-cache scorer over a trace_version 3 file (BLIS f90a1e3a,
``--cache-signal-delay 0``). `blisjax replay` with BLIS's exact command line must give every
request the instance BLIS routed it to (BLIS's debug routing lines), and BLIS's TTFT, E2E and
token counts, in both engines; aggregate metrics equal up to float round-off.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.blis_replay import assert_matches_blis, replay
from tests.paths import GOLDEN_NEXT_CASES, GOLDEN_NEXT_DIR

_ROUTED = re.compile(r"req request_(\d+) → instance instance_(\d+) ")

# One JAX case in the default tier (ties and HEAD scorers together; each case compiles its
# own program, ~30 s on 2 cores); the other two in the slow tier.
_JAX_DEFAULT = "weighted_default_scorers_4inst"


def _case(name: str) -> dict:
    return json.loads((GOLDEN_NEXT_DIR / f"{name}.json").read_text())


def _replay(case: dict, tmp_path: Path, capsys, engine: str) -> tuple[dict, dict[int, dict]]:
    return replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys, ("--engine", engine))


def _check(case: dict, metrics: dict, rows: dict[int, dict]) -> None:
    routed = {int(m.group(1)): int(m.group(2))
              for m in map(_ROUTED.search, case["routing"]["lines"]) if m}
    assert len(routed) == len(case["results"])
    assert {k: rows[k]["instance"] for k in routed} == routed
    assert_matches_blis(case, metrics, rows)


@pytest.mark.parametrize("name", GOLDEN_NEXT_CASES)
def test_reference_engine_reproduces_blis(name, tmp_path, capsys):
    case = _case(name)
    _check(case, *_replay(case, tmp_path, capsys, "reference"))


@pytest.mark.parametrize("name", [n if n == _JAX_DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in GOLDEN_NEXT_CASES])
def test_jax_engine_reproduces_blis(name, tmp_path, capsys):
    case = _case(name)
    _check(case, *_replay(case, tmp_path, capsys, "jax"))


@pytest.mark.parametrize("name", GOLDEN_NEXT_CASES)
def test_lowest_index_ties_do_not_reproduce_blis(name, tmp_path, capsys):
    """The cases really depend on BLIS's random tie-breaks: with the lowest index instead,
    requests go elsewhere."""
    case = _case(name)
    case["command"] += " --routing-tie-break lowest-index"
    _, rows = _replay(case, tmp_path, capsys, "reference")
    moved = sum(rows[w["request_id"]]["ttft_us"] != w["ttft_us"] for w in case["results"])
    assert moved > len(case["results"]) // 5
