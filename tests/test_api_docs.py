"""docs/api.md documents exactly the public Python API, with the parameter names of the code.

The public API is the ``__all__`` of each module in ``PUBLIC_NAMES`` below, plus
``blisjax.devices.use_cpu_cores`` and ``blisjax.__version__``. The rules this test enforces:

1. docs/api.md has one ``## `module` `` section per public module. Other ``##`` sections (the
   introduction, "Typical flow") hold no entries, and a ``##`` heading that looks like a module
   (``blisjax…``, ``search…``) must be one of them, so a misspelt section cannot hide entries.
2. The ``### `name` `` headings of a module's section are exactly the module's public names:
   a public name without an entry fails, and so does an entry for a name that is not public
   (renamed or removed from ``__all__``), or an entry written twice.
3. Every entry opens with a ```` ```python ```` block whose first statement is its signature:

   * ``name(params) -> ret`` for functions and for classes built by calling them: the
     parameters (names and kinds: positional, ``*args``, keyword-only, ``**kwargs``, in order)
     must equal ``inspect.signature``'s. A parameter written as a bare ``...`` elides
     parameters; that is allowed only for dataclasses, whose fields their docstrings list (the
     rule for long records such as ``ModelConfig`` and ``RunResult``), and the parameters that
     are written must then appear in the code, in the same order.
   * ``class Name(Base, ...)`` for classes that have no constructor signature of their own
     (exceptions, protocols): each base must be in the class's MRO.
   * ``NAME: type`` for constants: the annotation's outer name is the value's type name.

   Further statements starting with ``.`` document members: ``.method(params) -> ret`` must
   match the method's parameters (without ``self``), ``.name: type`` must be a property.

The checks are pure functions of the page's text, so the tests below also show that they fail
on a mutated page (an entry deleted, a parameter renamed, an entry that is not public, …).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"

#: Module → how to list its public names. Modules with ``__all__`` use it; ``blisjax.devices``
#: and ``blisjax`` export one name each.
PUBLIC_NAMES: dict[str, Callable[[Any], list[str]]] = {
    "blisjax.config": lambda m: list(m.__all__),
    "blisjax.workload": lambda m: list(m.__all__),
    "blisjax.reference": lambda m: list(m.__all__),
    "blisjax.engine": lambda m: list(m.__all__),
    "blisjax.metrics": lambda m: list(m.__all__),
    "blisjax.trace": lambda m: list(m.__all__),
    "blisjax.latency": lambda m: list(m.__all__),
    "blisjax.program": lambda m: list(m.__all__),
    "search": lambda m: list(m.__all__),
    "blisjax.devices": lambda m: ["use_cpu_cores"],
    "blisjax": lambda m: ["__version__"],
}

#: A documented elision of parameters (``f(a, ..., z)``).
ELIDED = "..."


class Entry(NamedTuple):
    """One ``### name`` entry: its name, line number (1-based) and signature block (or None)."""

    name: str
    line: int
    signature: str | None


class Page(NamedTuple):
    """docs/api.md split into module sections (module → entries) and structural problems."""

    sections: dict[str, list[Entry]]
    problems: list[str]


def _heading_name(line: str, marks: str) -> str:
    return line[len(marks):].strip().strip("`").strip()


def parse_page(text: str) -> Page:
    """Split the page into ``## module`` sections of ``### name`` entries with their first
    ```python block (the signature)."""
    sections: dict[str, list[Entry]] = {}
    problems: list[str] = []
    current: str | None = None
    entry: tuple[str, int] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):  # skip a fenced block (it may hold lines starting with #)
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if entry is not None and line.strip() == "```python":
                assert current is not None
                sections[current].append(Entry(entry[0], entry[1], "\n".join(lines[i + 1:j])))
                entry = None
            i = j + 1
            continue
        if line.startswith("## ") or line.startswith("### "):
            if entry is not None and current is not None:
                sections[current].append(Entry(entry[0], entry[1], None))
            entry = None
        if line.startswith("## "):
            name = _heading_name(line, "## ")
            if name in PUBLIC_NAMES:
                if name in sections:
                    problems.append(f"line {i + 1}: section `{name}` appears twice")
                current = name
                sections.setdefault(name, [])
            else:
                if name.startswith(("blisjax", "search")):
                    problems.append(f"line {i + 1}: section `{name}` is not a public module "
                                    f"(known: {', '.join(PUBLIC_NAMES)})")
                current = None
        elif line.startswith("### "):
            name = _heading_name(line, "### ")
            if current is None:
                problems.append(f"line {i + 1}: entry `{name}` is outside a module section")
            else:
                entry = (name, i + 1)
        elif entry is not None and line.strip():
            # Prose before the signature block: the entry has no signature.
            assert current is not None
            sections[current].append(Entry(entry[0], entry[1], None))
            entry = None
        i += 1
    if entry is not None and current is not None:
        sections[current].append(Entry(entry[0], entry[1], None))
    for module in PUBLIC_NAMES:
        if module not in sections:
            problems.append(f"no `## {module}` section")
    return Page(sections, problems)


# ---- signatures --------------------------------------------------------------------------------


def _statements(block: str) -> list[str]:
    """The block's statements: a line at column 0 starts one, indented lines continue it."""
    out: list[str] = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line.strip())
    return out


def _split_top_level(params: str) -> list[str]:
    """Split a parameter list at the commas outside brackets and strings."""
    parts, depth, quote, start = [], 0, "", 0
    for k, ch in enumerate(params):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:k])
            start = k + 1
    parts.append(params[start:])
    return [p.strip() for p in parts if p.strip()]


class Params(NamedTuple):
    """Parameters written in a documented call signature."""

    name: str
    params: list[tuple[str, str]]  # (name, kind)
    elided: bool


def _kind_names(args: ast.arguments) -> list[tuple[str, str]]:
    out = [(a.arg, "POSITIONAL_ONLY") for a in args.posonlyargs]
    out += [(a.arg, "POSITIONAL_OR_KEYWORD") for a in args.args]
    if args.vararg is not None:
        out.append((args.vararg.arg, "VAR_POSITIONAL"))
    out += [(a.arg, "KEYWORD_ONLY") for a in args.kwonlyargs]
    if args.kwarg is not None:
        out.append((args.kwarg.arg, "VAR_KEYWORD"))
    return out


def parse_call(statement: str) -> Params:
    """``name(params) -> ret`` → its name and parameters (a bare ``...`` marks an elision)."""
    open_at = statement.index("(")
    depth = 0
    for close_at in range(open_at, len(statement)):
        depth += {"(": 1, ")": -1}.get(statement[close_at], 0)
        if depth == 0:
            break
    name = statement[:open_at].strip()
    parts = _split_top_level(statement[open_at + 1:close_at])
    kept = [p for p in parts if p != ELIDED]
    tree = ast.parse(f"def {name}({', '.join(kept)}){statement[close_at + 1:]}:\n    pass\n")
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    return Params(name, _kind_names(func.args), len(kept) != len(parts))


def _code_params(obj: Any, drop_self: bool = False) -> list[tuple[str, str]]:
    params = list(inspect.signature(obj).parameters.values())
    if drop_self and params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind.name) for p in params]


def _has_own_signature(obj: Any) -> bool:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    kinds = [p.kind for p in sig.parameters.values()]
    return kinds != [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def _is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def _check_params(where: str, documented: Params, code: list[tuple[str, str]],
                  may_elide: bool) -> list[str]:
    if documented.elided:
        if not may_elide:
            return [f"{where}: elides parameters with `...`, allowed only for dataclasses"]
        if not _is_subsequence(documented.params, code):
            return [f"{where}: documented parameters {documented.params} are not, in order, "
                    f"among the code's {code}"]
        return []
    if documented.params != code:
        return [f"{where}: documented parameters {documented.params} != code {code}"]
    return []


def _check_member(where: str, cls: type, statement: str) -> list[str]:
    body = statement[1:]
    if "(" in body.split(":")[0]:
        documented = parse_call(body)
        try:
            static = inspect.getattr_static(cls, documented.name)
        except AttributeError:
            return [f"{where}: `{cls.__name__}` has no method `{documented.name}`"]
        if isinstance(static, property) or not callable(getattr(cls, documented.name)):
            return [f"{where}: `{cls.__name__}.{documented.name}` is not a method"]
        code = _code_params(getattr(cls, documented.name),
                            drop_self=not isinstance(static, (staticmethod, classmethod)))
        return _check_params(f"{where} .{documented.name}", documented, code, may_elide=False)
    name = body.split(":")[0].strip()
    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        return [f"{where}: `{cls.__name__}` has no attribute `{name}`"]
    if not isinstance(static, property):
        return [f"{where}: `{cls.__name__}.{name}` is documented as `.{name}: type` but is not "
                "a property"]
    return []


def check_entry(module: str, entry: Entry, obj: Any) -> list[str]:
    """Problems of one entry's signature block against the object it documents."""
    where = f"line {entry.line} `{module}.{entry.name}`"
    if entry.signature is None:
        return [f"{where}: no ```python signature block right after the heading"]
    statements = _statements(entry.signature)
    if not statements:
        return [f"{where}: empty signature block"]
    head, members = statements[0], statements[1:]
    problems: list[str] = []
    if head.startswith("class "):
        tree = ast.parse(head + ":\n    pass\n").body[0]
        assert isinstance(tree, ast.ClassDef)
        if tree.name != entry.name:
            problems.append(f"{where}: signature names `{tree.name}`")
        if not inspect.isclass(obj):
            return [*problems, f"{where}: documented as a class, but it is not one"]
        if _has_own_signature(obj):
            problems.append(f"{where}: has a constructor signature; document it as a call")
        mro = {c.__name__ for c in obj.__mro__}
        for base in tree.bases:
            base_name = ast.unparse(base).split(".")[-1]
            if base_name not in mro:
                problems.append(f"{where}: `{base_name}` is not a base of `{entry.name}`")
    elif "(" in head.split(":")[0]:
        documented = parse_call(head)
        if documented.name != entry.name:
            problems.append(f"{where}: signature names `{documented.name}`")
        if not callable(obj):
            return [*problems, f"{where}: documented as a call, but it is not callable"]
        may_elide = inspect.isclass(obj) and dataclasses.is_dataclass(obj)
        problems += _check_params(where, documented, _code_params(obj), may_elide)
    else:
        tree = ast.parse(head).body[0]
        if not isinstance(tree, ast.AnnAssign) or not isinstance(tree.target, ast.Name):
            return [f"{where}: signature is neither `name(...)`, `class Name(Base)` nor "
                    "`NAME: type`"]
        if tree.target.id != entry.name:
            problems.append(f"{where}: signature names `{tree.target.id}`")
        annotation = tree.annotation
        outer = annotation.value if isinstance(annotation, ast.Subscript) else annotation
        if ast.unparse(outer) != type(obj).__name__:
            problems.append(f"{where}: documented type `{ast.unparse(annotation)}`, the value is "
                            f"a {type(obj).__name__}")
    for statement in members:
        if not statement.startswith("."):
            problems.append(f"{where}: unexpected signature line {statement!r}")
        elif not inspect.isclass(obj):
            problems.append(f"{where}: members documented for a non-class")
        else:
            problems += _check_member(where, obj, statement)
    return problems


def check_module(page: Page, module_name: str) -> list[str]:
    """Problems of one module's section: missing, extra or duplicate entries, bad signatures."""
    module = importlib.import_module(module_name)
    public = PUBLIC_NAMES[module_name](module)
    entries = page.sections.get(module_name, [])
    names = [e.name for e in entries]
    problems = [f"`{module_name}.{n}` is public but has no `### {n}` entry"
                for n in public if n not in names]
    problems += [f"line {e.line}: `### {e.name}` is under `## {module_name}` but not public "
                 f"there (not in its __all__)" for e in entries if e.name not in public]
    problems += [f"`### {n}` appears {names.count(n)} times under `## {module_name}`"
                 for n in sorted(set(names)) if names.count(n) > 1]
    for e in entries:
        if e.name in public:
            problems += check_entry(module_name, e, getattr(module, e.name))
    return problems


# ---- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page_text() -> str:
    return API_DOC.read_text(encoding="utf-8")


def test_page_structure(page_text: str) -> None:
    assert parse_page(page_text).problems == []


@pytest.mark.parametrize("module_name", list(PUBLIC_NAMES))
def test_every_public_name_is_documented_with_its_parameters(page_text: str,
                                                            module_name: str) -> None:
    assert check_module(parse_page(page_text), module_name) == []


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"mutation anchor {old!r} is not unique in docs/api.md"
    return text.replace(old, new)


def _drop_entry(text: str, name: str) -> str:
    """The page without the ``### `name` `` entry (up to the next heading)."""
    lines = text.splitlines()
    start = lines.index(f"### `{name}`")
    end = next(k for k in range(start + 1, len(lines)) if lines[k].startswith("#"))
    return "\n".join(lines[:start] + lines[end:])


def test_a_deleted_entry_fails(page_text: str) -> None:
    problems = check_module(parse_page(_drop_entry(page_text, "load_config")), "blisjax.config")
    assert problems == ["`blisjax.config.load_config` is public but has no `### load_config` "
                        "entry"]


def test_an_entry_that_is_not_public_fails(page_text: str) -> None:
    extra = "### `load_configuration`\n\n```python\nload_configuration(path: str)\n```\n\n"
    mutated = _replace_once(page_text, "### `load_config`\n", extra + "### `load_config`\n")
    problems = check_module(parse_page(mutated), "blisjax.config")
    assert len(problems) == 1 and "`### load_configuration` is under `## blisjax.config` but " \
        "not public" in problems[0]


def test_an_entry_in_the_wrong_module_section_fails(page_text: str) -> None:
    # aggregate_metrics moved from blisjax.metrics to blisjax.latency: both sections complain.
    entry_start = page_text.index("### `aggregate_metrics`")
    entry_end = page_text.index("### `BLIS_METRIC_KEYS`")
    entry = page_text[entry_start:entry_end]
    mutated = page_text[:entry_start] + page_text[entry_end:]
    mutated = _replace_once(mutated, "### `float_to_ticks`", entry + "### `float_to_ticks`")
    page = parse_page(mutated)
    assert any("aggregate_metrics" in p for p in check_module(page, "blisjax.metrics"))
    assert any("aggregate_metrics" in p for p in check_module(page, "blisjax.latency"))


def test_a_renamed_parameter_fails(page_text: str) -> None:
    mutated = _replace_once(page_text, "load_config(path: str | Path) -> SimConfig",
                            "load_config(filename: str | Path) -> SimConfig")
    problems = check_module(parse_page(mutated), "blisjax.config")
    assert len(problems) == 1 and "load_config" in problems[0] and "filename" in problems[0]


def test_a_missing_keyword_only_marker_fails(page_text: str) -> None:
    # read_trace's use_send_time is keyword-only in the code.
    mutated = _replace_once(page_text, "data_path: str | os.PathLike[str], *,\n",
                            "data_path: str | os.PathLike[str],\n")
    problems = check_module(parse_page(mutated), "blisjax.workload")
    assert len(problems) == 1 and "read_trace" in problems[0]


def test_a_wrong_method_signature_fails(page_text: str) -> None:
    mutated = _replace_once(page_text, ".grid_points(n: int = 5)", ".grid_points(count: int = 5)")
    problems = check_module(parse_page(mutated), "search")
    assert len(problems) == 1 and "grid_points" in problems[0]


def test_elision_is_refused_outside_dataclasses(page_text: str) -> None:
    mutated = _replace_once(page_text, "shipped_models() -> tuple[str, ...]\n",
                            "shipped_models(...) -> tuple[str, ...]\n")
    problems = check_module(parse_page(mutated), "blisjax.config")
    assert len(problems) == 1 and "allowed only for dataclasses" in problems[0]


def test_a_misspelt_module_section_fails(page_text: str) -> None:
    mutated = _replace_once(page_text, "## `blisjax.devices`", "## `blisjax.device`")
    page = parse_page(mutated)
    assert any("blisjax.device`" in p for p in page.problems)
    assert any("no `## blisjax.devices` section" in p for p in page.problems)


def test_a_wrong_constant_type_fails(page_text: str) -> None:
    mutated = _replace_once(page_text, "__version__: str", "__version__: tuple[int, ...]")
    problems = check_module(parse_page(mutated), "blisjax")
    assert len(problems) == 1 and "__version__" in problems[0]
