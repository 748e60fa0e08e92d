"""The parent side of the sandbox: ``run_program`` checks the program, starts
``python -m search.adapters.sandbox`` in its own session, sends the request as JSON on its stdin,
kills its process group past the wall-time limit and reads the response as JSON from its
stdout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from search.adapters.sandbox.errors import TRACEBACK_LINES, SandboxError
from search.adapters.sandbox.guard import check_source

__all__ = ["PROGRAM_KINDS", "Case", "CaseResult", "Limits", "SandboxResult", "SummarySpec",
           "run_program"]

#: Program kinds: ``auto`` tells them apart by the functions the program defines.
PROGRAM_KINDS = ("auto", "bundle", "code")
#: What ``python -m`` runs as the child (the package's ``__main__``: ``child.main``).
_CHILD_MODULE = "search.adapters.sandbox"


class Limits(NamedTuple):
    """Resource limits of one sandboxed run.

    ``wall_s``: seconds of wall time for the whole child, its ~1 s start-up included (the parent
    kills it after that); ``cpu_s``: CPU seconds for the program and its simulations, counted
    from the end of start-up; ``memory_mb``: MiB of address space the program and its
    simulations may add to the simulator's own.
    """

    wall_s: float = 60.0
    cpu_s: float = 60.0
    memory_mb: int = 2048


class Case(NamedTuple):
    """A workload to simulate: the experiment's workload section generated with ``seed`` (None:
    the experiment's own ``seed``), cut to its first ``requests`` requests (None: all)."""

    name: str
    seed: int | None = None
    requests: int | None = None


class SummarySpec(NamedTuple):
    """How to summarise the first case's traced run (``blisjax.trace.reflect``): the reflection
    ``strategy``, at most ``max_tokens`` (approximate tokens), and the routing decisions'
    ``counterfactual_k`` (candidates kept for the regret analysis)."""

    strategy: str = "issue_focused"
    max_tokens: int = 1500
    counterfactual_k: int = 3


#: The defaults of ``run_program``.
DEFAULT_LIMITS = Limits()
DEFAULT_SUMMARY = SummarySpec()


class CaseResult(NamedTuple):
    """A case's outcome: the seed and request count simulated, the ``objective`` value (NaN
    when the expression is not a number on this run) and the flattened metrics (latencies in
    ms, rates per second, fractions in [0, 1])."""

    name: str
    seed: int
    requests: int
    objective: float
    metrics: dict[str, float]


class SandboxResult(NamedTuple):
    """A sandboxed run: the program ``kind`` (``"bundle"`` / ``"code"``, None when unknown), the
    cases' results (empty on error), the text summary ('' when not asked for or on error), the
    ``error`` (None on success) and the tail of what the program printed."""

    kind: str | None
    cases: tuple[CaseResult, ...]
    summary: str
    error: SandboxError | None
    output: str

    @property
    def ok(self) -> bool:
        """Whether every case ran."""
        return self.error is None



class _WallTimeout(Exception):
    """The child ran past its wall-time limit and was killed."""


def _project_root() -> str:
    """The directory holding the ``search`` package (the child imports it from there)."""
    return str(Path(__file__).resolve().parents[3])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"  # str hashes (set order, hash()) alike in every run
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_project_root(), env.get("PYTHONPATH"))
                                        if p)
    env.setdefault("JAX_PLATFORMS", "cpu")  # never probe accelerators from a sandbox
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")  # one thread: less address space, no oversubscription
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (its own session: only what it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_child(payload: bytes, wall_s: float) -> tuple[bytes, bytes, int]:
    """Run the child on ``payload``: (stdout, stderr, return code); ``_WallTimeout`` when it
    ran past ``wall_s`` seconds."""
    proc = subprocess.Popen([sys.executable, "-m", _CHILD_MODULE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(),
                            start_new_session=True)
    try:
        out, err = proc.communicate(payload, timeout=wall_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise _WallTimeout from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    return out, err, proc.returncode


def _failed(kind: str, message: str, program_kind: str | None = None,
            output: str = "") -> SandboxResult:
    return SandboxResult(program_kind, (), "", SandboxError(kind, message), output)


def _tail(data: bytes, lines: int = TRACEBACK_LINES) -> str:
    return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-lines:])


def _result_of(data: Mapping[str, Any]) -> SandboxResult:
    """The child's JSON response as a ``SandboxResult``."""
    cases = tuple(CaseResult(c["name"], int(c["seed"]), int(c["requests"]),
                             float(c["objective"]), dict(c["metrics"]))
                  for c in data.get("cases", ()))
    error = data.get("error")
    return SandboxResult(data.get("kind"), cases, data.get("summary", ""),
                         None if error is None else SandboxError(error["kind"], error["message"]),
                         data.get("output", ""))


def _read_response(out: bytes, err: bytes, returncode: int, limits: Limits) -> SandboxResult:
    """The child's response, or the reason it gave none."""
    if returncode == 0:
        try:
            return _result_of(json.loads(out))
        except (ValueError, KeyError, TypeError) as e:
            return _failed("crash", f"the sandbox returned no readable result ({e})\n"
                                    f"{_tail(err)}")
    if returncode == -signal.SIGXCPU:
        return _failed("timeout", f"the program used more than {limits.cpu_s:g} s of CPU time")
    if returncode == -signal.SIGKILL:
        return _failed("memory", f"the sandbox was killed (SIGKILL): out of memory (limit "
                                 f"{limits.memory_mb} MiB) or far past the CPU-time limit")
    return _failed("crash", f"the sandbox exited with status {returncode}\n{_tail(err)}")


def run_program(source: str, config_path: str | Path, cases: Sequence[Case],
                objective: str = "slo_attainment", kind: str = "auto",
                limits: Limits = DEFAULT_LIMITS,
                summary: SummarySpec | None = DEFAULT_SUMMARY) -> SandboxResult:
    """Simulate a policy program on ``cases`` of the experiment at ``config_path``, in a
    subprocess under ``limits``.

    Args:
      source: the program's Python source.
      config_path: the experiment (any file ``blisjax.config.load_config`` reads, with a
        ``workload:`` section).
      cases: the workloads to simulate (at least one).
      objective: a ``search.expr`` expression over a case's flattened metrics.
      kind: ``"bundle"``, ``"code"`` or ``"auto"`` (``policy()`` → bundle; ``route_scores`` /
        ``priority`` → code).
      limits: wall time, CPU time and memory of the child.
      summary: how to summarise the first case (None: no summary, no traced run).

    Returns:
      The ``SandboxResult``; a failure of the program is its ``error``, never an exception.

    Raises:
      ValueError: no cases or an unknown ``kind`` (the caller's mistake).
    """
    if kind not in PROGRAM_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PROGRAM_KINDS)}, got {kind!r}")
    if not cases:
        raise ValueError("at least one case is needed")
    problem = check_source(source)  # cheap, and spares a subprocess for the common refusals
    if problem is not None:
        return SandboxResult(None, (), "", problem, "")
    request = {"source": source, "config_path": str(Path(config_path).resolve()),
               "cases": [c._asdict() for c in cases], "objective": objective, "kind": kind,
               "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
               "summary": None if summary is None else summary._asdict()}
    try:
        out, err, code = _run_child(json.dumps(request).encode(), limits.wall_s)
    except _WallTimeout:
        return _failed("timeout", f"the program ran past the {limits.wall_s:g} s wall-time "
                                  f"limit and was stopped")
    return _read_response(out, err, code, limits)
