"""The reflection text: its strategies, and its assembly from the sections within a budget.

``reflection_text(lines, metrics, config)`` writes plain text with light markdown headings in
one of ``STRATEGIES``:

* ``issue_focused`` (the default): Outcome / Key Issues (ranked by severity, with counts and up
  to three examples each) / Worst Decisions (the candidates the router saw, and the request's
  result) / Suggested Focus (rules that name this project's knobs);
* ``decision_audit``: Outcome / a deterministic sample of routing decisions spread evenly over
  the run plus the worst ones, each with its outcome / Other Decisions (preemptions, admission
  rejections, priority orderings, scale actions) / Issues / Suggested Focus;
* ``counterfactual``: Outcome / "had request X gone to instance B instead of A" for the
  highest-regret decisions / regret totals by instance and by time window / Issues / Suggested
  Focus.

Length: the text is made of blocks with priorities, and the most important ones are kept while
``approx_tokens`` stays within ``max_tokens``; a line says how many were left out. Nothing is
padded: the detail caps (examples per issue, decisions shown) give ``MIN_TOKENS`` or more on a
realistic run, but a run with little to say (a few requests, no issues) may give fewer.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from blisjax.trace.reflect.formats import approx_tokens
from blisjax.trace.reflect.issues import detect_issues
from blisjax.trace.reflect.runview import RunView, index_run
from blisjax.trace.reflect.sections import (
    Block,
    _audit_blocks,
    _counterfactual_blocks,
    _focus_blocks,
    _issue_blocks,
    _other_blocks,
    _outcome_blocks,
    _totals_blocks,
    _worst_blocks,
)

#: The reflection strategies, the first is the default.
STRATEGIES: tuple[str, ...] = ("issue_focused", "decision_audit", "counterfactual")

#: The length (``approx_tokens``) the detail caps are sized to reach on a realistic run.
MIN_TOKENS = 500


def _fit(blocks: list[Block], max_tokens: int) -> tuple[list[Block], int]:
    """The blocks kept within ``max_tokens`` (by ascending priority, skipping those that do
    not fit or whose parent was left out), in text order, and how many were left out."""
    kept: list[Block] = []
    orders: set[tuple[int, ...]] = set()
    total = 0
    for b in sorted(blocks, key=lambda b: (*b.priority, *b.order)):
        cost = sum(approx_tokens(line) for line in b.lines)
        if (b.parent is not None and b.parent not in orders) or total + cost > max_tokens:
            continue
        kept.append(b)
        orders.add(b.order)
        total += cost
    # A heading whose section kept nothing else would promise content that is not there.
    filled = Counter(b.order[0] for b in kept if not _only_headings(b))
    kept = [b for b in kept if filled[b.order[0]] or not _only_headings(b)]
    return sorted(kept, key=lambda b: b.order), len(blocks) - len(kept)


def _only_headings(b: Block) -> bool:
    return all(line == "" or line.startswith("## ") for line in b.lines)


def _render(blocks: list[Block], max_tokens: int) -> str:
    kept, left_out = _fit(blocks, max_tokens)
    note = "[{} detail blocks left out to stay within {} tokens]"
    reserve = approx_tokens(note.format(999, max_tokens))
    if left_out and reserve < max_tokens:  # say that detail is missing, when that fits
        kept, left_out = _fit(blocks, max_tokens - reserve)
        kept.append(Block((999,), (999, 0), ("", note.format(left_out, max_tokens))))
    return "\n".join(line for b in kept for line in b.lines).strip("\n") + "\n"


def _strategy_blocks(rv: RunView, strategy: str) -> list[Block]:
    issues = detect_issues(rv)
    title = {"issue_focused": "issue-focused", "decision_audit": "decision audit",
             "counterfactual": "counterfactual"}[strategy]
    blocks = [Block((0,), (0, 0), (f"# Reflection on a traced run ({title})",))]
    blocks += _outcome_blocks(rv, 1)
    if strategy == "issue_focused":
        blocks += _issue_blocks(issues, 2, True, "## Key Issues")
        blocks += _worst_blocks(rv, 3)
        blocks += _focus_blocks(rv, issues, 4)
    elif strategy == "decision_audit":
        blocks += _audit_blocks(rv, 2)
        blocks += _other_blocks(rv, 3)
        blocks += _issue_blocks(issues, 4, False, "## Issues")
        blocks += _focus_blocks(rv, issues, 5)
    else:
        blocks += _counterfactual_blocks(rv, 2)
        blocks += _totals_blocks(rv, 3)
        blocks += _issue_blocks(issues, 4, False, "## Issues")
        blocks += _focus_blocks(rv, issues, 5)
    return blocks


def reflection_text(lines: list[dict], metrics: dict, config: Any,
                    strategy: str = "issue_focused", max_tokens: int = 1500,
                    requests: list[dict] | None = None) -> str:
    """A compact, actionable text summary of a traced run, for LLM reflection.

    Args:
      lines: the trace's records as JSON objects (``Trace.lines()``, ``read_jsonl``), level
        ``decisions`` or ``full``; a counterfactual k > 0 adds the regret analyses.
      metrics: the run's ``aggregate_metrics`` dict (latencies in ms, throughput in req/s).
      config: the run's ``SimConfig`` (policies, SLO targets, engine settings).
      strategy: one of ``STRATEGIES``.
      max_tokens: the most ``approx_tokens`` the text may have (> 0).
      requests: optional ``blisjax.metrics.per_request_rows`` of the run, for each request's
        TTFT, E2E and status (the trace has no TTFT).

    Returns:
      Plain text with ``##`` headings, ending in a newline; see the module docstring.

    Raises:
      ValueError: an unknown ``strategy``, or ``max_tokens`` < 1.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown reflection strategy {strategy!r}; allowed: "
                         f"{', '.join(STRATEGIES)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rv = index_run(lines, metrics, config, requests)
    return _render(_strategy_blocks(rv, strategy), max_tokens)
