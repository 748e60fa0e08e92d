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

:func:`run_program` (the parent side) starts ``python -m search.adapters.sandbox``, sends the
request as JSON on its stdin and reads the response as JSON from its stdout. The child loads the
experiment, sets its resource limits, loads the program under an import allowlist, simulates
every case in the reference engine (the first one traced when a summary is asked for) and
returns each case's flattened metrics and objective value, plus the decision-trace text summary
(``blisjax.trace.reflect``). Anything that goes wrong is a :class:`SandboxError` whose ``kind``
is one of ``ERROR_KINDS``:

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

Security: the allowlist (a restricted ``__import__``, stripped builtins, an AST check, module
proxies exposing only public non-module names) stops the mistakes and shortcuts LLM-written code
makes; it is not a security boundary against hostile code — Python cannot confine Python. The
subprocess with its rlimits is what contains a runaway program; run the search in a container
or VM when the programs' author is not trusted.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import linecache
import math
import os
import resource
import signal
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["ALLOWED_MODULES", "ERROR_KINDS", "Case", "CaseResult", "Limits", "SandboxError",
           "SandboxResult", "SummarySpec", "check_source", "run_program"]

#: Modules a policy program may import (``collections.abc`` as a submodule of ``collections``).
ALLOWED_MODULES = frozenset({
    "math", "statistics", "itertools", "functools", "collections", "collections.abc", "heapq",
    "bisect", "dataclasses", "typing", "numbers", "operator", "__future__"})
#: What a failed run's ``SandboxError.kind`` may be.
ERROR_KINDS = ("forbidden_import", "timeout", "memory", "crash", "invalid_policy", "settings")
#: Program kinds: ``auto`` tells them apart by the functions the program defines.
PROGRAM_KINDS = ("auto", "bundle", "code")
#: The program's file name in tracebacks.
PROGRAM_FILENAME = "<policy program>"
#: The module name the program's globals carry (``__module__`` of what it defines).
PROGRAM_MODULE = "policy_program"
#: Characters of the program's printed output kept, and traceback lines kept in a crash message.
OUTPUT_CHARS = 2000
TRACEBACK_LINES = 14
#: CPU seconds between the soft limit (SIGXCPU: a clean ``timeout``) and the hard one (SIGKILL).
HARD_CPU_GRACE_S = 5
#: Builtins a policy has no use for; calling one is a ``forbidden_import``.
FORBIDDEN_BUILTINS = frozenset({
    "open", "eval", "exec", "compile", "input", "breakpoint", "globals", "locals", "vars",
    "help", "exit", "quit", "copyright", "credits", "license"})
#: Private-looking attributes that are the public API of named tuples.
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
#: Dunder attributes that lead nowhere by themselves (``super().__init__(...)``, names).
SAFE_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__"})
#: Attributes that reach frames, code objects or other globals (the usual ways out of a
#: restricted namespace).
FRAME_ATTRIBUTES = frozenset({
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame",
    "ag_code", "ag_await", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame",
    "tb_next", "func_globals", "mro"})
#: Names the sandbox puts in the program's globals.
INJECTED_NAMES = ("RequestInfo", "InstanceInfo")
#: Public names of allowed modules that evaluate strings as code.
DENIED_MODULE_NAMES = {"typing": frozenset({"get_type_hints", "ForwardRef",
                                            "evaluate_forward_ref"})}
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


class SandboxError(NamedTuple):
    """Why a run failed: ``kind`` (one of ``ERROR_KINDS``) and a message for the program's
    author (a crash's message ends with the traceback's tail)."""

    kind: str
    message: str


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


# =============================================================================================
# The static check (parent and child)
# =============================================================================================


def attribute_allowed(name: str) -> bool:
    """Whether a program may read attribute ``name``: public names, the named-tuple API and a
    few harmless dunders, not frame/code attributes."""
    if name in FRAME_ATTRIBUTES:
        return False
    return not name.startswith("_") or name in NAMEDTUPLE_API or name in SAFE_DUNDERS


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: a block that never runs."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the program binds (so ``input = ...`` is the program's, not the builtin)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).partition(".")[0])
    return names


def _imported_names(tree: ast.AST) -> set[str]:
    """Names bound by the program's imports."""
    return {(alias.asname or alias.name).partition(".")[0] for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names}


def _chain_root(node: ast.expr) -> ast.expr:
    """``a`` of ``a.b.c`` (or of ``a.b[0].c``, ``a.b(x).c``)."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


class _Guard(ast.NodeVisitor):
    """Finds the first construct a policy program may not use."""

    def __init__(self, tree: ast.Module) -> None:
        self.bound = _bound_names(tree)
        # attribute stores on what the program imported or was given (modules, their classes,
        # builtins, the injected types) could change the simulator's behaviour under it
        self.shared = (_imported_names(tree) | set(INJECTED_NAMES)
                       | (set(vars(builtins)) - self.bound))
        self.problem: str | None = None

    def _flag(self, node: ast.AST, message: str) -> None:
        if self.problem is None:
            self.problem = f"line {getattr(node, 'lineno', '?')}: {message}"

    def _module(self, node: ast.AST, name: str) -> None:
        if name not in ALLOWED_MODULES:
            self._flag(node, f"import of {name!r} is not allowed; a policy program may import "
                             f"only {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))}")

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):  # the body never runs: imports there are for checkers
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self._flag(node, "relative imports are not allowed")
        else:
            self._module(node, node.module or "")

    def visit_Name(self, node: ast.Name) -> None:
        if _is_dunder(node.id) and node.id != "__name__":
            self._flag(node, f"the name {node.id} is not available to a policy program")
        elif node.id in FORBIDDEN_BUILTINS and node.id not in self.bound:
            self._flag(node, f"{node.id}() is not available to a policy program (no files, "
                             f"processes, network or dynamic code)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not attribute_allowed(node.attr):
            self._flag(node, f"attribute {node.attr!r} is not available to a policy program")
        elif isinstance(node.ctx, ast.Store | ast.Del):
            root = _chain_root(node.value)
            if isinstance(root, ast.Name) and root.id in self.shared:
                self._flag(node, f"setting attribute {node.attr!r} of {root.id} (imported or "
                                 f"given to the program) is not allowed")
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:  # ``case C(attr=...)`` reads attributes too
            if not attribute_allowed(name):
                self._flag(node, f"attribute {name!r} is not available to a policy program")
        self.generic_visit(node)


def check_source(source: str) -> SandboxError | None:
    """The static check of a program: None when it may run, else why not (``crash`` when it
    does not parse, ``forbidden_import`` for a construct outside the allowlist)."""
    try:
        tree = ast.parse(source, PROGRAM_FILENAME)
    except SyntaxError as e:
        return SandboxError("crash", f"the program does not parse: {e.msg} (line {e.lineno})")
    guard = _Guard(tree)
    guard.visit(tree)
    return None if guard.problem is None else SandboxError("forbidden_import", guard.problem)


# =============================================================================================
# The parent side
# =============================================================================================


class _WallTimeout(Exception):
    """The child ran past its wall-time limit and was killed."""


def _project_root() -> str:
    """The directory holding the ``search`` package (the child imports it from there)."""
    return str(Path(__file__).resolve().parents[2])


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


# =============================================================================================
# The child side: loading the program under the allowlist
# =============================================================================================


class Forbidden(BaseException):
    """The program used something outside the allowlist. A ``BaseException``, so neither the
    program's nor the engine's ``except Exception`` turns it into something else."""


class CpuTimeExceeded(BaseException):
    """SIGXCPU: the CPU-time limit passed (a ``BaseException`` for the same reason)."""


class Failure(Exception):
    """A failure the child has already classified."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Output:
    """The program's ``print``: a bounded buffer (stdout carries the response)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def print(self, *args: Any, sep: str | None = " ", end: str | None = "\n",
              file: Any = None, flush: bool = False) -> None:
        text = (" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None
                                                                     else end)
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * OUTPUT_CHARS:  # keep the tail only: a chatty loop must not grow it
            self.parts = [self.text()]
            self.size = len(self.parts[0])

    def text(self) -> str:
        """The last ``OUTPUT_CHARS`` characters printed."""
        return "".join(self.parts)[-OUTPUT_CHARS:]


def _checked_attribute(name: Any) -> None:
    if isinstance(name, str) and not attribute_allowed(name):
        raise Forbidden(f"attribute {name!r} is not available to a policy program")


def _is_own(obj: Any) -> bool:
    """Whether the program defined ``obj`` (or its class): only those may be changed."""
    cls = obj if isinstance(obj, type) else type(obj)
    return (getattr(obj, "__module__", None) == PROGRAM_MODULE
            or getattr(cls, "__module__", None) == PROGRAM_MODULE)


def _safe_getattr(obj: Any, name: str, *default: Any) -> Any:
    _checked_attribute(name)
    return getattr(obj, name, *default)


def _safe_hasattr(obj: Any, name: str) -> bool:
    _checked_attribute(name)
    return hasattr(obj, name)


def _safe_setattr(obj: Any, name: str, value: Any) -> None:
    _checked_attribute(name)
    if not _is_own(obj):
        raise Forbidden(f"setting attribute {name!r} of an object the program did not define "
                        f"is not allowed")
    setattr(obj, name, value)


def _safe_delattr(obj: Any, name: str) -> None:
    _checked_attribute(name)
    if not _is_own(obj):
        raise Forbidden(f"deleting attribute {name!r} of an object the program did not define "
                        f"is not allowed")
    delattr(obj, name)


def _forbidden_builtin(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Forbidden(f"{name}() is not available to a policy program (no files, processes, "
                        f"network or dynamic code)")

    refuse.__name__ = name
    return refuse


def _dotted_checked(factory: Callable[..., Any]) -> Callable[..., Any]:
    """``operator.attrgetter``/``methodcaller`` refusing the attributes ``getattr`` refuses."""
    def make(*names: Any, **kwargs: Any) -> Any:
        for name in names:
            if isinstance(name, str):
                for part in name.split("."):
                    _checked_attribute(part)
        return factory(*names, **kwargs)

    make.__name__ = factory.__name__
    return make


def _module_proxy(name: str) -> types.ModuleType:
    """A stand-in for module ``name``: its public attributes that are not modules (a real
    module would hand out ``sys`` and friends through its own imports)."""
    module = importlib.import_module(name)
    proxy = types.ModuleType(name, module.__doc__)
    denied = DENIED_MODULE_NAMES.get(name, frozenset())
    for attr, value in vars(module).items():
        if attr.startswith("_") or attr in denied or isinstance(value, types.ModuleType):
            continue
        setattr(proxy, attr, value)
    if name == "operator":
        proxy.attrgetter = _dotted_checked(module.attrgetter)
        proxy.methodcaller = _dotted_checked(module.methodcaller)
    return proxy


def _module_proxies() -> dict[str, types.ModuleType]:
    proxies = {name: _module_proxy(name) for name in sorted(ALLOWED_MODULES)}
    for name, proxy in proxies.items():  # submodules as attributes: ``collections.abc``
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(proxies[parent], child, proxy)
    return proxies


def _restricted_import(proxies: Mapping[str, types.ModuleType]) -> Callable[..., Any]:
    def restricted_import(name: str, globals: Any = None, locals: Any = None,
                          fromlist: Sequence[str] | None = (), level: int = 0) -> Any:
        if level:
            raise Forbidden("relative imports are not allowed")
        if name not in proxies:
            raise Forbidden(f"import of {name!r} is not allowed; a policy program may import "
                            f"only {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))}")
        return proxies[name] if fromlist else proxies[name.partition(".")[0]]

    return restricted_import


def _safe_builtins(output: _Output) -> dict[str, Any]:
    """The program's builtins: the harmless ones, checked attribute access, refusing stubs for
    ``FORBIDDEN_BUILTINS`` and an import of the allowlisted modules' proxies only."""
    safe = {name: value for name, value in vars(builtins).items()
            if not name.startswith("_") and name not in FORBIDDEN_BUILTINS}
    safe.update({name: _forbidden_builtin(name) for name in FORBIDDEN_BUILTINS})
    safe.update({"__build_class__": builtins.__build_class__,  # class statements need it
                 "__debug__": __debug__,
                 "__import__": _restricted_import(_module_proxies()),
                 "getattr": _safe_getattr, "hasattr": _safe_hasattr, "setattr": _safe_setattr,
                 "delattr": _safe_delattr, "print": output.print})
    return safe


def load_program(source: str, output: _Output) -> dict[str, Any]:
    """Run the program's module body under the allowlist: its globals. Raises ``Failure``
    (static check), ``Forbidden`` (at run time) or whatever the body raises."""
    from blisjax.reference.code_policy import InstanceInfo, RequestInfo

    problem = check_source(source)
    if problem is not None:
        raise Failure(problem.kind, problem.message)
    code = compile(source, PROGRAM_FILENAME, "exec", dont_inherit=True)
    # tracebacks show the program's lines
    linecache.cache[PROGRAM_FILENAME] = (len(source), None, source.splitlines(True),
                                         PROGRAM_FILENAME)
    namespace: dict[str, Any] = {"__builtins__": _safe_builtins(output),
                                 "__name__": PROGRAM_MODULE, "RequestInfo": RequestInfo,
                                 "InstanceInfo": InstanceInfo}
    exec(code, namespace)  # the program's own body, under the restricted builtins above
    return namespace


# =============================================================================================
# The child side: the policy and its simulations
# =============================================================================================


class Policy(NamedTuple):
    """A loaded program as a policy: its ``kind``, the experiment's configuration with the
    program's sections (bundle) and the program's functions (code; None for a bundle)."""

    kind: str
    config: Any  # SimConfig
    code_policy: Any  # CodePolicy | None


def _program_kind(namespace: Mapping[str, Any], kind: str) -> str:
    has_bundle = callable(namespace.get("policy"))
    has_code = any(callable(namespace.get(n)) for n in ("route_scores", "priority"))
    if kind == "auto":
        if has_bundle and has_code:
            raise Failure("invalid_policy", "the program defines both policy() and "
                                            "route_scores/priority; define one kind")
        kind = "bundle" if has_bundle else "code"
    if kind == "bundle" and not has_bundle:
        raise Failure("invalid_policy", "a bundle program must define policy() returning the "
                                        "policy-bundle sections")
    if kind == "code" and not has_code:
        raise Failure("invalid_policy", "the program defines neither policy() (a bundle) nor "
                                        "route_scores(request, instances) / "
                                        "priority(request, now_us) (a code policy)")
    return kind


def _bundle_sections(value: Any) -> dict[str, str]:
    """``policy()``'s value as candidate sections (YAML text per component)."""
    import yaml

    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise Failure("invalid_policy",
                          f"policy() returned YAML that does not parse: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Failure("invalid_policy", "policy() must return a dict of policy-bundle sections "
                                        f"(or their YAML), got {type(value).__name__}")
    sections = {}
    for name, body in value.items():
        try:
            sections[name] = body if isinstance(body, str) else yaml.safe_dump(
                {name: body}, sort_keys=False)
        except yaml.YAMLError as e:
            raise Failure("invalid_policy", f"section {name!r} is not plain data: {e}") from None
    return sections


def _policy(namespace: Mapping[str, Any], kind: str, config: Any) -> Policy:
    from blisjax.config import ConfigError, resolve_config
    from blisjax.reference.code_policy import CodePolicy

    kind = _program_kind(namespace, kind)
    if kind == "code":
        return Policy(kind, config, CodePolicy(namespace.get("route_scores"),
                                               namespace.get("priority")))
    from search.adapters.core import candidate_config

    sections = _bundle_sections(namespace["policy"]())
    try:
        cfg = candidate_config(config, sections)
        resolve_config(cfg)  # cross-field checks
    except (ConfigError, ValueError) as e:
        raise Failure("invalid_policy", str(e)) from None
    return Policy(kind, cfg, None)


class Experiment(NamedTuple):
    """The child's experiment: its configuration and the compiled objective."""

    config: Any  # SimConfig
    objective: Any  # search.expr.Expression


def _experiment(config_path: str, objective: str) -> Experiment:
    from blisjax.config import ConfigError, load_config
    from search.expr import compile_expression

    try:
        config = load_config(config_path)
        expr = compile_expression(objective)
    except (ConfigError, OSError, ValueError) as e:
        raise Failure("settings", str(e)) from None
    if config.workload is None:
        raise Failure("settings", f"{config_path} has no workload section (each case generates "
                                  f"its workload from it)")
    return Experiment(config, expr)


def _head(workload: Any, n: int | None) -> Any:
    """The first ``n`` requests of a workload (every per-request array cut; names kept)."""
    import dataclasses

    import numpy as np

    if n is None or n >= workload.num_requests:
        return workload
    cut = {f.name: getattr(workload, f.name)[:n] for f in dataclasses.fields(workload)
           if isinstance(getattr(workload, f.name), np.ndarray)}
    return dataclasses.replace(workload, **cut)


def _traced_run(resolved: Any, workload: Any, code_policy: Any,
                counterfactual_k: int) -> tuple[Any, list[dict[str, Any]]]:
    """A traced reference run at level ``decisions``: (result, trace lines)."""
    from blisjax.trace.run import simulate_traced

    result, trace = simulate_traced(resolved, workload, "decisions", counterfactual_k,
                                    code_policy=code_policy)
    return result, list(trace.lines())


def _code_policy_lines(lines: list[dict[str, Any]], code_policy: Any) -> list[dict[str, Any]]:
    """The trace as the summary should tell it: routing decisions made by ``route_scores``
    carry the configured template's label; name the function instead."""
    if code_policy is None or code_policy.route_scores is None:
        return lines
    return [{**line, "reason": "route_scores"} if line.get("kind") in (
        "routing", "prefill_routing") else line for line in lines]


def _code_policy_note(code_policy: Any) -> str:
    replaced = [text for fn, text in (
        (code_policy.route_scores, "routing by the program's route_scores"),
        (code_policy.priority, "queue priority by the program's priority")) if fn is not None]
    return (f"Note: this run is a code policy — {' and '.join(replaced)}; the configured "
            f"templates named below are replaced by the functions, so act on suggestions "
            f"that name template knobs by changing the functions.\n\n")


def _summary(policy: Policy, result: Any, workload: Any, metrics: dict[str, Any],
             lines: list[dict[str, Any]], spec: Mapping[str, Any]) -> str:
    """The text summary of a traced run (no program code runs here: a failure is the
    summariser's, so it is reported in the summary and does not fail the program)."""
    from blisjax.metrics import per_request_rows
    from blisjax.trace.reflect import reflection_text

    try:
        text = reflection_text(_code_policy_lines(lines, policy.code_policy), metrics,
                               policy.config, spec["strategy"], int(spec["max_tokens"]),
                               requests=per_request_rows(result, workload))
    except MemoryError:
        raise
    except Exception as e:
        text = f"(no trace summary: the summariser failed: {type(e).__name__}: {e})\n"
    return text if policy.code_policy is None else _code_policy_note(policy.code_policy) + text


def _run_case(experiment: Experiment, policy: Policy, case: Mapping[str, Any],
              summary: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """Simulate one case: (its JSON result, its summary or '')."""
    from blisjax.config import resolve_config
    from blisjax.metrics import aggregate_metrics
    from blisjax.reference.cluster import ClusterSimulator
    from blisjax.workload import generate_workload, parse_workload_spec
    from search.expr import flatten_metrics

    cfg = policy.config
    seed = experiment.config.seed if case.get("seed") is None else int(case["seed"])
    workload = _head(generate_workload(parse_workload_spec(cfg.workload), seed=seed),
                     case.get("requests"))
    resolved = resolve_config(cfg)
    if summary is not None:  # the traced run's result is the untraced run's, bit for bit
        result, lines = _traced_run(resolved, workload, policy.code_policy,
                                    int(summary["counterfactual_k"]))
    else:
        result = ClusterSimulator(resolved, workload, code_policy=policy.code_policy).run()
    metrics = aggregate_metrics(result, workload, cfg.metrics,
                                scheduler=cfg.policy.scheduler.policy)
    flat = flatten_metrics(metrics)
    try:
        value = experiment.objective.evaluate(flat, "objective")
    except (ValueError, KeyError) as e:  # ConfigError is a ValueError: an unknown metric name
        raise Failure("settings", str(e)) from None
    text = "" if summary is None else _summary(policy, result, workload, metrics, lines, summary)
    return ({"name": case["name"], "seed": seed, "requests": int(workload.num_requests),
             "objective": float(value), "metrics": flat}, text)


def _defines_policy(source: str) -> bool:
    """Whether the program defines ``policy`` at module level (a bundle program, probably)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return any((isinstance(n, ast.FunctionDef) and n.name == "policy")
               or (isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "policy" for t in n.targets))
               for n in body)


def _preload(bundle: bool) -> None:
    """Import what the run will need before the limits apply: the limits are the program's
    (and its simulations'), not the simulator's start-up. ``search.adapters.core`` (bundles
    only) brings JAX along, a second of start-up a code policy does without."""
    importlib.import_module("blisjax.metrics")
    importlib.import_module("blisjax.reference.cluster")
    importlib.import_module("blisjax.trace.run")
    importlib.import_module("blisjax.trace.reflect")
    importlib.import_module("blisjax.workload")
    importlib.import_module("yaml")
    if bundle:
        importlib.import_module("search.adapters.core")


def _on_cpu_limit(signum: int, frame: Any) -> None:
    raise CpuTimeExceeded


def _apply_limits(cpu_s: float, memory_mb: float) -> None:
    """CPU and address-space limits counted from now (start-up is the simulator's, not the
    program's): SIGXCPU at the soft CPU limit becomes ``CpuTimeExceeded``."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(math.ceil(usage.ru_utime + usage.ru_stime + cpu_s))
    _, hard_now = resource.getrlimit(resource.RLIMIT_CPU)
    hard = soft + HARD_CPU_GRACE_S
    if hard_now != resource.RLIM_INFINITY:
        soft, hard = min(soft, hard_now), min(hard, hard_now)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:  # Linux: the address space in use now, plus the program's share
        with open("/proc/self/statm") as fh:
            in_use = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return
    limit = in_use + int(memory_mb * 2**20)
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    if hard_as == resource.RLIM_INFINITY or limit <= hard_as:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit if hard_as ==
                                                resource.RLIM_INFINITY else hard_as))


def _traceback_tail(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    return "\n".join(lines[-TRACEBACK_LINES:])


def classify(exc: BaseException, cpu_s: float) -> SandboxError:
    """The ``SandboxError`` of an exception raised while loading or running the program."""
    from blisjax.reference.code_policy import CodePolicyError

    if isinstance(exc, Failure):
        return SandboxError(exc.kind, str(exc))
    if isinstance(exc, CpuTimeExceeded):
        return SandboxError("timeout", f"the program used more than {cpu_s:g} s of CPU time")
    if isinstance(exc, Forbidden):
        return SandboxError("forbidden_import", str(exc))
    if isinstance(exc, MemoryError) or isinstance(exc.__cause__, MemoryError):
        return SandboxError("memory", "the program ran out of memory")
    if isinstance(exc, CodePolicyError):
        if exc.__cause__ is None:  # a decision that is not a valid one
            return SandboxError("invalid_policy", str(exc))
        return SandboxError("crash", f"{exc}\n{_traceback_tail(exc.__cause__)}")
    return SandboxError("crash", f"{type(exc).__name__}: {exc}\n{_traceback_tail(exc)}")


def serve(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's work: the JSON response to a request (never raises for the program)."""
    import random

    # the allowlisted ``statistics.NormalDist.samples`` draws from the global generator when
    # unseeded: seeded, a program gets the same numbers in every run
    random.seed(0)
    output = _Output()
    kind: str | None = None
    try:
        experiment = _experiment(request["config_path"], request["objective"])
        _preload(request["kind"] == "bundle" or (
            request["kind"] == "auto" and _defines_policy(request["source"])))
        _apply_limits(float(request["cpu_s"]), float(request["memory_mb"]))
        policy = _policy(load_program(request["source"], output), request["kind"],
                         experiment.config)
        kind = policy.kind
        cases, summary = [], ""
        for i, case in enumerate(request["cases"]):
            result, text = _run_case(experiment, policy, case,
                                     request["summary"] if i == 0 else None)
            cases.append(result)
            summary = summary or text
        return {"kind": kind, "cases": cases, "summary": summary, "error": None,
                "output": output.text()}
    except BaseException as exc:  # the program's failure, whatever it is, is the response
        error = classify(exc, float(request.get("cpu_s", 0)))
        return {"kind": kind, "cases": [], "summary": "", "error": error._asdict(),
                "output": output.text()}


def main() -> int:
    """Child entry point: request JSON on stdin, response JSON on stdout."""
    response_fd = os.dup(1)
    os.dup2(2, 1)  # anything else printing to stdout must not corrupt the response
    sys.stdout = sys.stderr
    response = serve(json.loads(sys.stdin.read()))
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # the work is done: write the response
    with os.fdopen(response_fd, "w", encoding="utf-8") as fh:
        json.dump(response, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
