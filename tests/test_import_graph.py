"""The package's import graph: the JAX engine has no import cycle, and the two engines share
code only through neutral modules (``blisjax.rules``, config, metrics, workload), never by
importing each other — the oracle and what it checks must not share an implementation.

Every import counts: module level, inside functions, under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "blisjax"

#: The one import of the reference engine by the JAX engine: a workload without requests has
#: nothing to simulate, so the JAX engine returns the reference engine's (trivial) result
#: without compiling a program (tests/engine/test_zero_requests.py).
ALLOWED = {("blisjax.engine.run", "blisjax.reference"),
           ("blisjax.engine.run", "blisjax.reference.simulate")}


def _modules(package: str) -> dict[str, Path]:
    root = PACKAGE.parent
    return {".".join(p.relative_to(root).with_suffix("").parts): p
            for p in (root / package.replace(".", "/")).rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Every module named by an import in ``path`` (``from a import b`` names ``a`` and
    ``a.b``, which may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    names = {m.removesuffix(".__init__") for m in modules}
    return {m.removesuffix(".__init__"): {t for t in _imports(p) if t in names}
            for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_engine_has_no_import_cycle():
    engine = _graph("blisjax.engine")
    engine.pop("blisjax.engine", None)  # the package re-exports its modules' names
    assert _cycle(engine) is None, " -> ".join(_cycle(engine))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_engines_do_not_import_each_other():
    crossing = set()
    for package, other in (("blisjax.engine", "blisjax.reference"),
                           ("blisjax.reference", "blisjax.engine")):
        for module, path in _modules(package).items():
            for target in _imports(path):
                if target == other or target.startswith(other + "."):
                    crossing.add((module, target))
    assert crossing == ALLOWED, sorted(crossing - ALLOWED)


def test_the_configuration_imports_no_metrics():
    """Metrics read configurations (costs, fitness weights); the configuration only names
    what it accepts (``config.codes``), so it never needs the metrics package back."""
    for module, path in _modules("blisjax.config").items():
        for target in _imports(path):
            assert not target.startswith("blisjax.metrics"), (module, target)


def test_shared_rules_import_neither_engine():
    for target in _imports(PACKAGE / "rules.py") | _imports(PACKAGE / "limits.py"):
        assert not target.startswith(("blisjax.engine", "blisjax.reference")), target


def test_the_shared_rules_import_first():
    """``blisjax.rules`` (what both engines import) can be a process's first import: the
    configuration package it reads imports metrics, which must not need the rules back."""
    import subprocess
    import sys

    for module in ("blisjax.rules", "blisjax.metrics", "blisjax.config.pd"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, cwd=PACKAGE.parent)
        assert done.returncode == 0, (module, done.stderr[-600:])
