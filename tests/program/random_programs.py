"""Random programs for tests: expression trees drawn from a numpy generator, independent of
the genetic-programming strategy's operators (search.strategies.gp)."""

from __future__ import annotations

import numpy as np

from blisjax.program import Node
from blisjax.program.bytecode import MAX_PROGRAM_LENGTH, assemble
from blisjax.program.observables import visible_at

BINARY = ("add", "sub", "mul", "div", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "min",
          "max")
UNARY = ("neg", "abs", "log1p", "not")
#: Constants that reach the arithmetic's edges: zero of both signs, tiny, huge, ±1.
CONSTANTS = (0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 1e-300, 1e300, 1.7976931348623157e308, 5e-324)


def random_node(rng: np.random.Generator, names: tuple[str, ...], depth: int) -> Node:
    """A tree of at most ``depth`` levels over ``names`` and ``CONSTANTS``."""
    if depth <= 1 or rng.random() < 0.25:
        if rng.random() < 0.6:
            return Node("name", name=str(rng.choice(names)))
        if rng.random() < 0.5:
            return Node("const", value=float(rng.choice(CONSTANTS)))
        return Node("const", value=float(rng.normal(0.0, 3.0)))
    kind = rng.random()
    sub = lambda: random_node(rng, names, depth - 1)  # noqa: E731
    if kind < 0.55:
        return Node(str(rng.choice(BINARY)), (sub(), sub()))
    if kind < 0.75:
        return Node(str(rng.choice(UNARY)), (sub(),))
    if kind < 0.9:
        return Node("if", (sub(), sub(), sub()))
    return Node("clip", (sub(), sub(), sub()))


def random_program(rng: np.random.Generator, site: str, depth: int = 5) -> Node:
    """A random program of ``site`` that fits ``MAX_PROGRAM_LENGTH`` instructions."""
    names = visible_at(site)
    while True:
        node = random_node(rng, names, depth)
        if len(assemble(node, {})) <= MAX_PROGRAM_LENGTH:
            return node
