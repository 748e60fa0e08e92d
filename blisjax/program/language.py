"""The policy-program language: Python expression syntax over observables and parameters.

A program is one expression (docs/policy-programs.md)::

    score_prefix_affinity if queue_depth < w else score_queue_depth
    clip(1.0 - kv_utilization, 0, 1) * 2 + log1p(cached_blocks)

Grammar: numbers, observable names (``blisjax.program.observables``), parameter names,
``+ - * /``, unary ``-`` and ``+``, comparisons ``< <= > >= == !=`` (chains allowed),
``and``/``or``/``not``, ``a if c else b``, and the functions ``min max abs clip log1p``.
Nothing else parses. A decision tree (``{if: cond, then: node, else: node}``, leaves
expressions) is the same language: ``tree_node`` turns it into an ``if`` expression.

This module parses and prints; it evaluates nothing (each engine has its own evaluator:
``blisjax.reference.program`` and ``blisjax.engine.program``).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blisjax.config._checks import ConfigError

__all__ = ["BINARY", "FUNCTIONS", "Node", "ProgramError", "names_in", "parse", "size",
           "to_text", "tree_node", "tree_text"]


class ProgramError(ConfigError):
    """A program that does not parse, uses a forbidden construct or names nothing it may read."""


@dataclass(frozen=True)
class Node:
    """One node of a program's expression tree.

    ``op``: ``const`` (``value``), ``name`` (an observable or parameter, ``name``), a binary
    operator (``BINARY``), ``neg``, ``not``, ``if`` (args: condition, then, else) or a function
    (``FUNCTIONS``: ``min``/``max`` with two or more args, ``abs``/``log1p`` one, ``clip`` three).
    """

    op: str
    args: tuple[Node, ...] = ()
    value: float = 0.0
    name: str = ""


#: Binary operators: the node op of each Python operator, and its text.
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "and", "or": "or"}
_AST_BINOP = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_AST_CMP = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq",
            ast.NotEq: "ne"}
#: Functions: name → number of arguments (None: two or more).
FUNCTIONS = {"min": None, "max": None, "abs": 1, "log1p": 1, "clip": 3}
#: Longest program text accepted, characters.
MAX_TEXT = 20_000


def parse(text: Any, *, path: str) -> Node:
    """The expression tree of program ``text``; ``path`` names the field in errors."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ProgramError(path, f"must be an expression (text), got {text!r}")
    text = str(text)
    if len(text) > MAX_TEXT:
        raise ProgramError(path, f"is {len(text)} characters long; at most {MAX_TEXT}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ProgramError(path, f"does not parse: {e.msg} in {text!r}") from None
    return _node(tree.body, path, text)


def _const(value: float, path: str, text: str) -> Node:
    if not math.isfinite(value):
        raise ProgramError(path, f"constant {value!r} is not finite in {text!r}")
    return Node("const", value=float(value))


def _node(e: ast.AST, path: str, text: str) -> Node:
    where = f"in {text!r}"
    if isinstance(e, ast.Constant):
        if isinstance(e.value, bool) or not isinstance(e.value, (int, float)):
            raise ProgramError(path, f"only numbers are constants, got {e.value!r} {where}")
        return _const(float(e.value), path, text)
    if isinstance(e, ast.Name):
        return Node("name", name=e.id)
    if isinstance(e, ast.BinOp) and type(e.op) in _AST_BINOP:
        return Node(_AST_BINOP[type(e.op)], (_node(e.left, path, text),
                                             _node(e.right, path, text)))
    if isinstance(e, ast.UnaryOp):
        inner = _node(e.operand, path, text)
        if isinstance(e.op, ast.UAdd):
            return inner
        if isinstance(e.op, ast.USub):
            if inner.op == "const":
                return _const(-inner.value, path, text)
            return Node("neg", (inner,))
        if isinstance(e.op, ast.Not):
            return Node("not", (inner,))
    if isinstance(e, ast.BoolOp):
        op = "and" if isinstance(e.op, ast.And) else "or"
        out = _node(e.values[0], path, text)
        for v in e.values[1:]:
            out = Node(op, (out, _node(v, path, text)))
        return out
    if isinstance(e, ast.Compare):
        left = _node(e.left, path, text)
        out = None
        for cmp, right_e in zip(e.ops, e.comparators, strict=True):
            if type(cmp) not in _AST_CMP:
                raise ProgramError(path, f"comparison {type(cmp).__name__} is not allowed {where}")
            right = _node(right_e, path, text)
            term = Node(_AST_CMP[type(cmp)], (left, right))
            out = term if out is None else Node("and", (out, term))
            left = right
        return out
    if isinstance(e, ast.IfExp):
        return Node("if", (_node(e.test, path, text), _node(e.body, path, text),
                           _node(e.orelse, path, text)))
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.keywords:
        fn = e.func.id
        if fn not in FUNCTIONS:
            allowed = ", ".join(FUNCTIONS)
            raise ProgramError(path, f"function {fn!r} is not allowed (allowed: {allowed}) "
                               f"{where}")
        arity, n = FUNCTIONS[fn], len(e.args)
        if (arity is None and n < 2) or (arity is not None and n != arity):
            wanted = "two or more arguments" if arity is None else f"{arity} argument(s)"
            raise ProgramError(path, f"{fn}() takes {wanted}, got {n} {where}")
        args = tuple(_node(a, path, text) for a in e.args)
        if fn in ("min", "max"):  # left fold: min(a, b, c) = min(min(a, b), c)
            out = Node(fn, args[:2])
            for a in args[2:]:
                out = Node(fn, (out, a))
            return out
        return Node(fn, args)
    raise ProgramError(path, f"{type(e).__name__} is not allowed {where} (numbers, names, "
                       "+ - * /, comparisons, and/or/not, a if c else b, min max abs clip "
                       "log1p)")


def tree_node(tree: Any, *, path: str) -> Node:
    """The expression of a decision tree: a node is ``{if: cond, then: node, else: node}``, a
    leaf an expression (text or number)."""
    if isinstance(tree, Mapping):
        keys = set(tree)
        if keys != {"if", "then", "else"}:
            raise ProgramError(path, "a tree node needs exactly the keys if, then and else, "
                               f"got {sorted(map(str, keys))}")
        return Node("if", (parse(tree["if"], path=f"{path}.if"),
                           tree_node(tree["then"], path=f"{path}.then"),
                           tree_node(tree["else"], path=f"{path}.else")))
    return parse(tree, path=path)


def names_in(node: Node) -> set[str]:
    """Every name the expression reads."""
    out = {node.name} if node.op == "name" else set()
    for a in node.args:
        out |= names_in(a)
    return out


def size(node: Node) -> int:
    """Nodes in the tree (``clip`` counts as the two it stands for: max then min)."""
    return 1 + (node.op == "clip") + sum(size(a) for a in node.args)


# ---- printing --------------------------------------------------------------------------------

# Python's precedence, loosest first: if, or, and, not, comparisons, + -, * /, unary -.
_LEVEL = {"if": 0, "or": 1, "and": 2, "not": 3, "lt": 4, "le": 4, "gt": 4, "ge": 4, "eq": 4,
          "ne": 4, "add": 5, "sub": 5, "mul": 6, "div": 6, "neg": 7}
_ATOM = 9


def _number(x: float) -> str:
    if x == int(x) and abs(x) < 1e15:
        return str(int(x)) if x != 0 or math.copysign(1, x) > 0 else "-0.0"
    return repr(x)


def _text(node: Node) -> tuple[str, int]:
    op = node.op
    if op == "const":
        t = _number(node.value)
        return t, (7 if t.startswith("-") else _ATOM)
    if op == "name":
        return node.name, _ATOM
    if op in FUNCTIONS:
        return f"{op}({', '.join(_text(a)[0] for a in node.args)})", _ATOM
    level = _LEVEL[op]

    def part(a: Node, strict: bool) -> str:
        t, lv = _text(a)
        return f"({t})" if lv < level or (strict and lv == level) else t

    if op == "neg":
        return f"-{part(node.args[0], False)}", level
    if op == "not":
        return f"not {part(node.args[0], False)}", level
    if op == "if":
        c, a, b = node.args
        return f"{part(a, True)} if {part(c, True)} else {part(b, False)}", level
    chain = level == 4  # comparisons do not chain when printed: parenthesise both sides
    return f"{part(node.args[0], chain)} {BINARY[op]} {part(node.args[1], True)}", level


def to_text(node: Node) -> str:
    """The program as one expression (parses back to the same tree)."""
    return _text(node)[0]


def tree_text(node: Node, indent: str = "") -> str:
    """The program as an indented decision tree: ``if`` nodes as branches, the rest as
    expressions."""
    if node.op != "if":
        return f"{indent}{to_text(node)}"
    c, a, b = node.args
    return (f"{indent}if {to_text(c)}:\n{tree_text(a, indent + '    ')}\n"
            f"{indent}else:\n{tree_text(b, indent + '    ')}")
