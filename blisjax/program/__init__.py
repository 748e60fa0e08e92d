"""Policy programs: routing, admission and priority written as expressions or decision trees.

``compile_program`` checks a program against what its site may read and binds its named
parameters; the result carries the expression tree (which the reference engine evaluates) and
its fixed-size instructions (which the JAX engine interprets, ``bytecode``). The language,
the observables and the arithmetic are in docs/policy-programs.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blisjax.program.bytecode import MAX_PROGRAM_LENGTH, Bytecode, assemble, to_arrays
from blisjax.program.language import (
    Node,
    ProgramError,
    names_in,
    parse,
    to_text,
    tree_node,
    tree_text,
)
from blisjax.program.observables import OBSERVABLES, SITES, visible_at

__all__ = ["MAX_PROGRAM_LENGTH", "OBSERVABLES", "SITES", "Bytecode", "Node", "PolicyProgram",
           "ProgramError", "compile_program", "parse", "to_text", "tree_text"]

_OBSERVABLE_NAMES = frozenset(o.name for o in OBSERVABLES)


@dataclass(frozen=True)
class PolicyProgram:
    """A checked program of one site, its parameters bound.

    site: "routing", "admission" or "priority"; node: the expression tree; params: (name,
    value) pairs in the configuration's order; reads: observable names it reads, sorted.
    """

    site: str
    node: Node
    params: tuple[tuple[str, float], ...]
    reads: tuple[str, ...]

    @property
    def text(self) -> str:
        """The program as one expression."""
        return to_text(self.node)

    @property
    def tree(self) -> str:
        """The program as an indented decision tree."""
        return tree_text(self.node)

    def bytecode(self) -> Bytecode:
        """The instructions the JAX engine runs (``MAX_PROGRAM_LENGTH`` slots)."""
        return to_arrays(assemble(self.node, dict(self.params)))

    def with_params(self, params: Mapping[str, Any]) -> PolicyProgram:
        """The same structure with other parameter values (names must match)."""
        return compile_program(self.site, node=self.node, params=params,
                               path=f"policy.{self.site}")


def _check_params(params: Mapping[str, Any] | None, path: str) -> tuple[tuple[str, float], ...]:
    if params is None:
        return ()
    if not isinstance(params, Mapping):
        raise ProgramError(f"{path}.params", f"must be a mapping of names to numbers, got "
                           f"{params!r}")
    out = []
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ProgramError(f"{path}.params", f"names must be identifiers, got {name!r}")
        if name in _OBSERVABLE_NAMES:
            raise ProgramError(f"{path}.params.{name}", "is an observable's name; name the "
                               "parameter otherwise")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(float(value)):
            raise ProgramError(f"{path}.params.{name}", f"must be a finite number, got "
                               f"{value!r}")
        out.append((name, float(value)))
    return tuple(out)


def compile_program(site: str, *, program: Any = None, tree: Any = None, node: Node | None = None,
                    params: Mapping[str, Any] | None = None, path: str | None = None
                    ) -> PolicyProgram:
    """Check and bind the program of ``site``: exactly one of ``program`` (an expression),
    ``tree`` (a decision tree) or ``node`` (a parsed tree); ``params`` name → number.
    ``path`` names the configuration field in errors (default ``policy.<site>``)."""
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, got {site!r}")
    path = path or f"policy.{site}"
    given = [x is not None for x in (program, tree, node)]
    if sum(given) != 1:
        raise ProgramError(path, "give exactly one of program (an expression) and tree "
                           "(a decision tree)")
    if program is not None:
        node = parse(program, path=f"{path}.program")
    elif tree is not None:
        node = tree_node(tree, path=f"{path}.tree")
    bound = _check_params(params, path)
    names = dict(bound)
    visible = set(visible_at(site))
    reads = set()
    for name in sorted(names_in(node)):
        if name in names:
            continue
        if name in visible:
            reads.add(name)
            continue
        if name in _OBSERVABLE_NAMES:
            raise ProgramError(f"{path}.program", f"{name!r} cannot be read by the {site} "
                               f"program (it reads: {', '.join(visible_at(site))})")
        raise ProgramError(f"{path}.program", f"{name!r} is neither an observable of the {site} "
                           f"program nor a parameter (observables: "
                           f"{', '.join(visible_at(site))}; parameters: "
                           f"{', '.join(names) or 'none'})")
    compiled = PolicyProgram(site, node, bound, tuple(sorted(reads)))
    length = len(assemble(node, names))
    if length > MAX_PROGRAM_LENGTH:
        raise ProgramError(f"{path}.program", f"compiles to {length} instructions; at most "
                           f"{MAX_PROGRAM_LENGTH} (blisjax.program.MAX_PROGRAM_LENGTH)")
    return compiled
