"""A program as fixed-size per-lane arrays: the instructions the JAX engine interprets.

Each instruction writes one register, its own index: ``regs[k] = op(regs[a], regs[b],
regs[c])`` (or a constant, or an observable), operands always earlier registers; the value of
the program is its last register. Parameters are bound to their values when the arrays are
built, so a lane's parameters are constants of its own program. Padding past ``length`` is
never executed. ``clip(x, lo, hi)`` is ``min(max(x, lo), hi)``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from blisjax.program.language import Node
from blisjax.program.observables import index_of

__all__ = ["MAX_PROGRAM_LENGTH", "Bytecode", "Op", "assemble", "empty"]

#: Instructions a program may compile to (a static shape of the JAX engine's arrays).
MAX_PROGRAM_LENGTH = 64


class Op(IntEnum):
    """Instruction codes (``blisjax.engine.program`` selects by them)."""

    CONST = 0
    OBS = 1
    ADD = 2
    SUB = 3
    MUL = 4
    DIV = 5
    NEG = 6
    ABS = 7
    LOG1P = 8
    LT = 9
    LE = 10
    GT = 11
    GE = 12
    EQ = 13
    NE = 14
    AND = 15
    OR = 16
    NOT = 17
    MIN = 18
    MAX = 19
    SELECT = 20  # regs[a] != 0 ? regs[b] : regs[c]


_OP_OF = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV, "neg": Op.NEG,
          "abs": Op.ABS, "log1p": Op.LOG1P, "lt": Op.LT, "le": Op.LE, "gt": Op.GT,
          "ge": Op.GE, "eq": Op.EQ, "ne": Op.NE, "and": Op.AND, "or": Op.OR, "not": Op.NOT,
          "min": Op.MIN, "max": Op.MAX, "if": Op.SELECT}


class Bytecode(NamedTuple):
    """One program's instructions, ``MAX_PROGRAM_LENGTH`` each (host arrays).

    op: int32 ``Op`` codes; a, b, c: int32 operand registers (``OBS``: ``a`` is the
    observable's index); imm: float64 constants; length: int32 instructions in use (>= 1).
    """

    op: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    imm: np.ndarray
    length: np.ndarray


def assemble(node: Node, params: dict[str, float]) -> list[tuple[int, int, int, int, float]]:
    """The instructions of ``node`` in evaluation order (children first, left to right),
    names bound to ``params`` or else to observables."""
    out: list[tuple[int, int, int, int, float]] = []

    def emit(op: Op, a: int = 0, b: int = 0, c: int = 0, imm: float = 0.0) -> int:
        out.append((int(op), a, b, c, float(imm)))
        return len(out) - 1

    def walk(n: Node) -> int:
        if n.op == "const":
            return emit(Op.CONST, imm=n.value)
        if n.op == "name":
            if n.name in params:
                return emit(Op.CONST, imm=params[n.name])
            return emit(Op.OBS, a=index_of(n.name))
        regs = [walk(x) for x in n.args]
        if n.op == "clip":
            x, lo, hi = regs
            return emit(Op.MIN, emit(Op.MAX, x, lo), hi)
        return emit(_OP_OF[n.op], *regs)

    walk(node)
    return out


def empty() -> Bytecode:
    """The arrays of a site without a program (one ``CONST 0``; never executed)."""
    z = np.zeros(MAX_PROGRAM_LENGTH, np.int32)
    return Bytecode(z, z.copy(), z.copy(), z.copy(), np.zeros(MAX_PROGRAM_LENGTH, np.float64),
                    np.asarray(1, np.int32))


def to_arrays(code: list[tuple[int, int, int, int, float]]) -> Bytecode:
    """``code`` padded to ``MAX_PROGRAM_LENGTH`` (the caller checked its length)."""
    out = empty()
    for k, (op, a, b, c, imm) in enumerate(code):
        out.op[k], out.a[k], out.b[k], out.c[k], out.imm[k] = op, a, b, c, imm
    return out._replace(length=np.asarray(len(code), np.int32))
