"""The allowlist a policy program runs under: the static check of its source (``check_source``,
run by the parent and again by the child) and the restricted builtins, ``__import__`` and module
proxies its module body runs with (``load_program``, child only)."""

from __future__ import annotations

import ast
import builtins
import importlib
import linecache
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from search.adapters.sandbox.errors import Failure, Forbidden, SandboxError

__all__ = ["ALLOWED_MODULES", "check_source", "load_program"]

#: Modules a policy program may import (``collections.abc`` as a submodule of ``collections``).
ALLOWED_MODULES = frozenset({
    "math", "statistics", "itertools", "functools", "collections", "collections.abc", "heapq",
    "bisect", "dataclasses", "typing", "numbers", "operator", "__future__"})
#: The program's file name in tracebacks.
PROGRAM_FILENAME = "<policy program>"
#: The module name the program's globals carry (``__module__`` of what it defines).
PROGRAM_MODULE = "policy_program"
#: Characters of the program's printed output kept.
OUTPUT_CHARS = 2000
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
# Loading the program under the allowlist (child)
# =============================================================================================


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
