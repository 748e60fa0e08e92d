"""Run a policy program — Python written by an LLM, so untrusted — in a subprocess, and score it.

A *policy program* is Python source of one of two kinds:

* a **bundle program** defines ``policy()`` returning the policy-bundle sections (a dict
  ``{"routing": {...}, "scheduler": "fcfs", ...}``, each value a section mapping or its YAML
  text, or one YAML string of the whole bundle); the sections replace the experiment's
  (``search.adapters.core.candidate_config`` semantics);
* a **code policy** defines ``route_scores(request, instances)`` and/or
  ``priority(request, now_us)`` (``blisjax.reference.code_policy``); the functions replace the
  routing and priority templates. ``RequestInfo`` and ``InstanceInfo`` are in the program's
  globals for annotations and construction.

:func:`run_program` (the parent side, ``parent``) starts ``python -m search.adapters.sandbox``,
sends the request as JSON on its stdin and reads the response as JSON from its stdout. The child
(``child``, run by ``__main__``) loads the experiment, sets its resource limits, loads the
program under an import allowlist, simulates every case in the reference engine (the first one
traced when a summary is asked for) and returns each case's flattened metrics and objective
value, plus the decision-trace text summary (``blisjax.trace.reflect``). Anything that goes
wrong is a :class:`SandboxError` whose ``kind`` is one of ``ERROR_KINDS``:

* ``forbidden_import``: an import outside ``ALLOWED_MODULES``, or a capability a policy has no
  use for (``open``, ``eval``, ``exec``, ``compile``, ``__import__``, dunder or frame
  attributes, setting attributes of modules, builtins or other objects the program did not
  define);
* ``timeout``: past the CPU-time limit (``RLIMIT_CPU``) or the wall-time limit (the parent kills
  the child's process group);
* ``memory``: past the address-space limit (``RLIMIT_AS``), or killed by the kernel;
* ``crash``: the program raised (the message ends with the traceback's tail) or does not parse;
* ``invalid_policy``: the program's decisions or sections are not a valid policy
  (``ConfigError`` / ``CodePolicyError``'s message);
* ``settings``: the experiment or objective is wrong — the operator's error, not the program's.

Determinism: the child runs with ``PYTHONHASHSEED=0`` and the program gets no clock, no random
numbers and no I/O, so the same program, experiment and cases give the same result.

Security: the allowlist (``guard``: a restricted ``__import__``, stripped builtins, an AST
check, module proxies exposing only public non-module names) stops the mistakes and shortcuts
LLM-written code makes; it is not a security boundary against hostile code — Python cannot
confine Python. The subprocess with its rlimits is what contains a runaway program; run the
search in a container or VM when the programs' author is not trusted.

Modules: ``errors`` (``SandboxError`` and the exceptions the child classifies), ``guard`` (the
static check and the restricted builtins, imports and module proxies), ``parent``
(``run_program`` and its request and result types) and ``child`` (``serve``: limits,
simulations, ``classify``); ``errors`` <- ``guard`` <- ``parent`` / ``child``, and importing the
package imports neither the child nor the simulator.
"""

from search.adapters.sandbox.errors import ERROR_KINDS, SandboxError
from search.adapters.sandbox.guard import ALLOWED_MODULES, check_source
from search.adapters.sandbox.parent import (
    PROGRAM_KINDS,
    Case,
    CaseResult,
    Limits,
    SandboxResult,
    SummarySpec,
    run_program,
)

__all__ = ["ALLOWED_MODULES", "ERROR_KINDS", "PROGRAM_KINDS", "Case", "CaseResult", "Limits",
           "SandboxError", "SandboxResult", "SummarySpec", "check_source",
           "run_program"]
