"""Reflection text: a compact, actionable summary of a traced run, for an LLM to reflect on.

``reflection_text(lines, metrics, config, strategy, max_tokens, requests)`` reads a run's trace
records (``Trace.lines()`` or ``read_jsonl``), its metrics (``aggregate_metrics``), its
``SimConfig`` and optionally its ``per_request_rows``, and writes plain text with light markdown
headings in one of ``STRATEGIES``, at most ``max_tokens`` by ``approx_tokens``. The text is a
function of its inputs only: every ranking has a total order, every number a fixed format, and
no clock is read.

The modules, each importing only those listed before it:

* ``formats``: numbers, durations, times and lists as the text shows them; ``approx_tokens``.
* ``runview``: the records indexed once into a typed ``RunView`` (``index_run``).
* ``focus``: the knobs and settings a suggestion may name (``KNOBS``, ``SETTINGS``), the run's
  configuration as the text reads it, and the suggested-focus rules.
* ``decisions``: one routing decision judged (wait, targets missed, rank, alternative) and put
  in words.
* ``issues``: the issue detectors (``DETECTORS``, ``detect_issues``) and their severity.
* ``sections``: the text's sections, as blocks with priorities.
* ``text``: the strategies and the assembly of their sections within the budget
  (``reflection_text``).
"""

from blisjax.trace.reflect.focus import KNOBS, SETTINGS
from blisjax.trace.reflect.formats import approx_tokens
from blisjax.trace.reflect.text import MIN_TOKENS, STRATEGIES, reflection_text

__all__ = ["KNOBS", "MIN_TOKENS", "SETTINGS", "STRATEGIES", "approx_tokens", "reflection_text"]
