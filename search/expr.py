"""A small, safe expression language over the aggregate metrics of one run.

Objectives and constraints are written as Python-like expressions whose names are metric keys
(``blisjax.metrics.aggregate_metrics``)::

    -e2e_p99_ms
    throughput_rps - 0.01 * ttft_mean_ms      # (throughput_rps is not a key: an error lists them)
    responses_per_sec - 0.01 * ttft_mean_ms
    slo_attainment >= 0.99                    # a constraint
    per_tenant["alice"].ttft_p99_ms <= 200    # nested metrics: attribute or ["key"] lookups

Grammar: numbers, metric names, ``+ - * / ** %``, unary ``-``/``+``, parentheses, the functions
``abs min max log log10 exp sqrt``, nested lookups ``a.b`` / ``a["b"]``, and — in constraints
only — one comparison ``<= < >= >``. Nothing else parses: no attribute access on Python objects,
no calls of other functions, no strings outside lookups. Nested metric groups are flattened to
dotted keys (``per_slo_class.critical.ttft_p99_ms``); a group with an ``overall`` entry may be
named by itself (``slo_attainment`` means ``slo_attainment.overall``). Arithmetic is IEEE:
division by zero gives ±inf/nan instead of raising.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from blisjax.config import ConfigError

__all__ = ["Constraint", "Expression", "ExpressionError", "compile_constraint",
           "compile_expression", "flatten_metrics"]

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow, ast.Mod: operator.mod}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS = {"abs": np.abs, "min": np.minimum, "max": np.maximum, "log": np.log,
          "log10": np.log10, "exp": np.exp, "sqrt": np.sqrt}
_FUNC_ARITY = {"abs": 1, "log": 1, "log10": 1, "exp": 1, "sqrt": 1, "min": None, "max": None}
_COMPARE = {ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Lt: "<"}
#: Key of a metric group that stands for the group when the group is named by itself.
GROUP_VALUE_KEY = "overall"


class ExpressionError(ConfigError):
    """An expression that does not parse, uses a forbidden construct, or names no metric."""


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a (nested) metrics dict as ``{"a.b.c": float}``.

    Strings and other non-numeric leaves are skipped; booleans become 0.0/1.0. A group with an
    ``overall`` entry is also available under its own name.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_metrics(value, f"{name}."))
            if GROUP_VALUE_KEY in value and _is_number(value[GROUP_VALUE_KEY]):
                out[name] = float(value[GROUP_VALUE_KEY])
        elif _is_number(value):
            out[name] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_))


def _path(node: ast.AST, text: str) -> str:
    """The dotted metric key of a Name / Attribute / Subscript chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_path(node.value, text)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, (str, int)) \
                and not isinstance(key.value, bool):
            return f"{_path(node.value, text)}.{key.value}"
    raise ExpressionError(f"expression {text!r}: metric lookups are name, name.key or "
                          f"name[\"key\"]; got {ast.unparse(node)!r}")


def _check(node: ast.AST, text: str, names: list[str]) -> None:
    """Reject every construct outside the grammar; collect metric names (in order)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"expression {text!r}: only numeric constants are allowed, "
                                  f"got {node.value!r}")
    elif isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        key = _path(node, text)
        if key not in names:
            names.append(key)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ExpressionError(f"expression {text!r}: operator "
                                  f"{type(node.op).__name__} is not allowed (+ - * / ** %)")
        _check(node.left, text, names)
        _check(node.right, text, names)
    elif isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise ExpressionError(f"expression {text!r}: unary {type(node.op).__name__} is "
                                  "not allowed (- +)")
        _check(node.operand, text, names)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
            raise ExpressionError(f"expression {text!r}: only the functions "
                                  f"{', '.join(sorted(_FUNCS))} may be called, got "
                                  f"{ast.unparse(node.func)!r}")
        arity = _FUNC_ARITY[node.func.id]
        if (arity is not None and len(node.args) != arity) or (arity is None
                                                               and len(node.args) < 2):
            want = f"exactly {arity}" if arity is not None else "at least 2"
            raise ExpressionError(f"expression {text!r}: {node.func.id}() takes {want} "
                                  f"argument(s), got {len(node.args)}")
        for arg in node.args:
            _check(arg, text, names)
    elif isinstance(node, ast.Compare):
        raise ExpressionError(f"expression {text!r}: comparisons are only allowed as the top "
                              "level of a constraint")
    else:
        raise ExpressionError(f"expression {text!r}: {type(node).__name__} is not allowed "
                              "(numbers, metric names, + - * / ** %, abs/min/max/log/log10/"
                              "exp/sqrt)")


def _eval(node: ast.AST, values: Mapping[str, float], text: str) -> np.float64:
    if isinstance(node, ast.Constant):
        return np.float64(node.value)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        return np.float64(values[_path(node, text)])
    if isinstance(node, ast.BinOp):
        return np.float64(_BINOPS[type(node.op)](_eval(node.left, values, text),
                                                 _eval(node.right, values, text)))
    if isinstance(node, ast.UnaryOp):
        return np.float64(_UNARY[type(node.op)](_eval(node.operand, values, text)))
    assert isinstance(node, ast.Call)
    args = [_eval(a, values, text) for a in node.args]
    fn = _FUNCS[node.func.id]  # type: ignore[union-attr]
    if fn in (np.minimum, np.maximum):
        out = args[0]
        for a in args[1:]:
            out = fn(out, a)
        return np.float64(out)
    return np.float64(fn(args[0]))


def _parse(text: str, what: str) -> ast.AST:
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(f"{what}: must be a non-empty expression, got {text!r}")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ExpressionError(f"{what}: cannot parse {text!r}: {err.msg}") from None


@dataclass(frozen=True, eq=False)
class Expression:
    """A compiled objective expression. ``names`` are the metric keys it reads, in order."""

    text: str
    tree: ast.AST
    names: tuple[str, ...]

    def check_names(self, available: Mapping[str, Any] | set[str], what: str = "") -> None:
        """Raise if a name is not a key of ``available`` (a flattened metrics dict or key set).

        A name whose first component is a known group (``per_tenant`` …) is accepted here;
        its full path is checked when evaluated (which groups exist depends on the workload).
        """
        keys = set(available)
        for name in self.names:
            head = name.split(".")[0]
            if name in keys or ("." in name and any(k.startswith(f"{head}.") for k in keys)):
                continue
            raise ExpressionError(_unknown_message(what or "expression", self.text, name, keys))

    def evaluate(self, metrics: Mapping[str, Any], what: str = "") -> float:
        """The value on one run's metrics (nested dict or already flattened)."""
        values = metrics if _is_flat(metrics) else flatten_metrics(metrics)
        for name in self.names:
            if name not in values:
                raise ExpressionError(_unknown_message(what or "expression", self.text, name,
                                                       set(values)))
        with np.errstate(all="ignore"):
            try:
                return float(_eval(self.tree, values, self.text))
            except (ZeroDivisionError, OverflowError):
                return math.nan


def _is_flat(metrics: Mapping[str, Any]) -> bool:
    return all(isinstance(v, float) for v in metrics.values())


def _unknown_message(what: str, text: str, name: str, keys: set[str]) -> str:
    top = sorted(k for k in keys if "." not in k)
    groups = sorted({k.split(".")[0] for k in keys if "." in k})
    extra = f"; nested groups (name.key): {', '.join(groups)}" if groups else ""
    return (f"{what}: unknown metric {name!r} in {text!r}; available metrics: "
            f"{', '.join(top)}{extra}")


def compile_expression(text: str, what: str = "--objective") -> Expression:
    """Parse and check an objective expression (no comparison allowed).

    Raises:
      ExpressionError: syntax error or forbidden construct, naming ``what`` and the text.
    """
    tree = _parse(text, what)
    names: list[str] = []
    try:
        _check(tree, text, names)
    except ExpressionError as err:
        raise ExpressionError(f"{what}: {err}") from None
    return Expression(text.strip(), tree, tuple(names))


@dataclass(frozen=True, eq=False)
class Constraint:
    """``lhs OP rhs`` with OP in ``>= > <= <``; the margin is ≥ 0 exactly when it holds
    (> 0 for the strict operators).

    ``margin = lhs − rhs`` for ``>=``/``>``, ``rhs − lhs`` for ``<=``/``<``; the violation is
    ``max(0, −margin)`` in the metric's own units.
    """

    text: str
    lhs: Expression
    op: str
    rhs: Expression

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.lhs.names + self.rhs.names))

    def check_names(self, available: Mapping[str, Any] | set[str], what: str = "") -> None:
        """Like :meth:`Expression.check_names`, for both sides."""
        self.lhs.check_names(available, what or "--constraint")
        self.rhs.check_names(available, what or "--constraint")

    def margin(self, metrics: Mapping[str, Any]) -> float:
        """How far inside the constraint one run is (negative = violated)."""
        lhs = self.lhs.evaluate(metrics, "--constraint")
        rhs = self.rhs.evaluate(metrics, "--constraint")
        return lhs - rhs if self.op in (">=", ">") else rhs - lhs

    def holds(self, margin: float) -> bool:
        """Whether a margin satisfies the constraint."""
        return margin > 0 if self.op in (">", "<") else margin >= 0


def compile_constraint(text: str, what: str = "--constraint") -> Constraint:
    """Parse ``lhs OP rhs`` (one comparison, OP in ``>= > <= <``).

    Raises:
      ExpressionError: not a single comparison, or a bad side.
    """
    tree = _parse(text, what)
    if not isinstance(tree, ast.Compare) or len(tree.ops) != 1 \
            or type(tree.ops[0]) not in _COMPARE:
        raise ExpressionError(f"{what}: {text!r} must be one comparison 'EXPR >= EXPR' "
                              "(operators: >= > <= <)")
    sides = []
    for node in (tree.left, tree.comparators[0]):
        names: list[str] = []
        try:
            _check(node, text, names)
        except ExpressionError as err:
            raise ExpressionError(f"{what}: {err}") from None
        sides.append(Expression(ast.unparse(node), node, tuple(names)))
    return Constraint(text.strip(), sides[0], _COMPARE[type(tree.ops[0])], sides[1])
