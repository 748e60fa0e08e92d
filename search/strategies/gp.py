"""Genetic programming over the policy programs of one site (``blisjax.program``), each program
optionally paired with a vector of numeric knobs.

An *individual* is a program text of the site (``routing``, ``admission`` or ``priority``) and
the unit-cube coordinates of the search space's numeric knobs (:mod:`search.space`; none when
the space has only the program). ``ask`` returns the population pytree ``{"<site>.program":
str[P], <knob>: float64[P], ...}``; ``tell`` takes it back with fitness ``(P,)`` or ``(P, M)``
(maximised, NaN counts as −inf).

* **Grammar**: the observables and parameters a new subtree may read (``Grammar.names``: the
  site's observables, or a chosen subset, and the parameters ``<site>.params.<name>`` of the
  numeric knobs), the node operators (``OPERATOR_ARITY``; default all) and the range of new
  constants (an integer or a real of ``CONSTANT_DIGITS`` significant digits, each with
  probability 1/2, uniform in ``[low, high]``).
* **Generation 0**: the seed programs (with the template's coordinates: ``init`` or the
  middle), then ramped half-and-half trees — depths 1 … ``init_depth`` in turn, alternately
  *full* (operators down to the depth) and *grow* (a terminal with probability
  ``GROW_TERMINAL_RATE`` at each node) — each with uniform coordinates; no program twice.
* **Later generations**: each child comes from parents picked by tournament (the best of
  ``tournament`` uniform picks) and one variation, drawn with ``variation_weights``:
  ``crossover`` (a subtree of the first parent replaced by one of the second that fits the size
  limit; the coordinates by uniform crossover), ``subtree`` (a subtree replaced by a new *grow*
  tree of depth 0 … ``MUTATION_DEPTH``), ``point`` (an operator replaced by another of the same
  arity, or a terminal by a new terminal) and ``constant`` (one constant ``c`` moved by
  ``N(0, 1)·constant_sigma·max(|c|, 1)``, and every coordinate by ``N(0, sigma)``). Subtree
  points are internal nodes with probability ``INTERNAL_PICK_RATE`` (Koza's 90/10 rule).
* **Validity**: a child is printed and parsed back (its canonical text), must have at most
  ``max_nodes`` nodes (``blisjax.program.language.size``, which counts the instructions it
  compiles to) and must pass ``compile_program`` for the site; an invalid child or one already
  in the population (same text and coordinates) is drawn again, up to ``MAX_TRIES`` times, then
  the first parent is copied.
* **Survival**: (μ + λ) — the best P of parents and children, no re-evaluation (elitist); one
  objective ranks by fitness, then fewer nodes (parsimony); several by NSGA-II's order.

Randomness: generation ``g`` draws from ``rng_for(key, g, 0)`` only, so the same seed gives the
same populations and a restored state continues bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from blisjax.program import MAX_PROGRAM_LENGTH, Node, ProgramError, compile_program
from blisjax.program.language import parse, size, to_text
from blisjax.program.observables import SITES, visible_at
from search.pareto import nsga2_order
from search.strategies.base import PyTreeCodec, key_words, rng_for, sanitize_fitness

__all__ = ["CONSTANT_DIGITS", "DEFAULT_MAX_NODES", "GPState", "GeneticProgramming", "Grammar",
           "check_observables", "check_operators",
           "OPERATOR_ARITY", "VARIATIONS", "constant_perturbation", "point_mutation",
           "random_tree", "replace_at", "round_constant", "subtree_crossover", "subtree_mutation",
           "subtrees"]

#: Node operators of the language and their number of arguments (``blisjax.program.Node``).
OPERATOR_ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
                  "eq": 2, "ne": 2, "and": 2, "or": 2, "min": 2, "max": 2, "neg": 1, "not": 1,
                  "abs": 1, "log1p": 1, "if": 3, "clip": 3}
#: Variations of a child, in the order of ``variation_weights``.
VARIATIONS = ("crossover", "subtree", "point", "constant")
DEFAULT_VARIATION_WEIGHTS = (0.5, 0.2, 0.15, 0.15)
#: Default size limit, nodes (at most ``MAX_PROGRAM_LENGTH``).
DEFAULT_MAX_NODES = 31
#: Significant digits of new and perturbed constants (programs stay readable).
CONSTANT_DIGITS = 4
#: Largest magnitude of a constant.
MAX_CONSTANT = 1e9
#: Probability that a new terminal is a constant rather than a name.
TERMINAL_CONSTANT_RATE = 0.2
#: Probability that a *grow* tree stops at a terminal above its depth limit.
GROW_TERMINAL_RATE = 0.3
#: Probability that a crossover or subtree-mutation point is an internal node (when any).
INTERNAL_PICK_RATE = 0.9
#: Deepest subtree a subtree mutation inserts.
MUTATION_DEPTH = 3
#: Draws of an invalid or repeated individual before giving up.
MAX_TRIES = 20

Path = tuple[int, ...]


@dataclass(frozen=True)
class Grammar:
    """What new material is made of: ``names`` (observables and parameters), ``operators``
    (keys of ``OPERATOR_ARITY``) and the range ``constants`` = (low, high) of new constants."""

    names: tuple[str, ...]
    operators: tuple[str, ...]
    constants: tuple[float, float] = (-10.0, 10.0)


# ---- trees -----------------------------------------------------------------------------------


def subtrees(node: Node) -> list[tuple[Path, Node]]:
    """Every subtree with its path (argument indices from the root), in preorder."""
    out: list[tuple[Path, Node]] = [((), node)]
    for k, arg in enumerate(node.args):
        out += [((k, *path), sub) for path, sub in subtrees(arg)]
    return out


def replace_at(node: Node, path: Path, new: Node) -> Node:
    """``node`` with the subtree at ``path`` replaced by ``new``."""
    if not path:
        return new
    k = path[0]
    args = node.args[:k] + (replace_at(node.args[k], path[1:], new),) + node.args[k + 1:]
    return Node(node.op, args, node.value, node.name)


def round_constant(x: float) -> float:
    """``x`` clamped to ±``MAX_CONSTANT`` with ``CONSTANT_DIGITS`` significant digits (no
    negative zero)."""
    x = min(max(float(x), -MAX_CONSTANT), MAX_CONSTANT)
    return float(f"{x:.{CONSTANT_DIGITS}g}") + 0.0


def random_constant(rng: np.random.Generator, grammar: Grammar) -> Node:
    """A new constant: uniform in the grammar's range, an integer or a rounded real."""
    low, high = grammar.constants
    x = float(rng.uniform(low, high))
    value = float(round(x)) + 0.0 if rng.random() < 0.5 else round_constant(x)
    return Node("const", value=value)


def random_terminal(rng: np.random.Generator, grammar: Grammar) -> Node:
    """A name of the grammar, or a constant (``TERMINAL_CONSTANT_RATE``; always without
    names)."""
    if not grammar.names or rng.random() < TERMINAL_CONSTANT_RATE:
        return random_constant(rng, grammar)
    return Node("name", name=grammar.names[int(rng.integers(len(grammar.names)))])


def random_tree(rng: np.random.Generator, grammar: Grammar, depth: int, full: bool) -> Node:
    """A random tree at most ``depth`` operators deep: *full* puts operators on every level
    above ``depth``, *grow* stops early with probability ``GROW_TERMINAL_RATE`` per node."""
    if depth <= 0 or not grammar.operators or (not full and rng.random() < GROW_TERMINAL_RATE):
        return random_terminal(rng, grammar)
    op = grammar.operators[int(rng.integers(len(grammar.operators)))]
    return Node(op, tuple(random_tree(rng, grammar, depth - 1, full)
                          for _ in range(OPERATOR_ARITY[op])))


def _pick(rng: np.random.Generator, points: Sequence[tuple[Path, Node]]) -> tuple[Path, Node]:
    """A point: an internal node with probability ``INTERNAL_PICK_RATE`` when there is one,
    else a leaf (``points`` holds at least one leaf)."""
    internal = [p for p in points if p[1].args]
    leaves = [p for p in points if not p[1].args]
    group = internal if internal and (not leaves or rng.random() < INTERNAL_PICK_RATE) else leaves
    return group[int(rng.integers(len(group)))]


def subtree_mutation(rng: np.random.Generator, node: Node, grammar: Grammar,
                     depth: int = MUTATION_DEPTH) -> Node:
    """``node`` with one subtree replaced by a new *grow* tree of depth 0 … ``depth``."""
    path, _ = _pick(rng, subtrees(node))
    return replace_at(node, path, random_tree(rng, grammar, int(rng.integers(depth + 1)), False))


def subtree_crossover(rng: np.random.Generator, a: Node, b: Node, max_nodes: int) -> Node:
    """``a`` with one subtree replaced by a subtree of ``b`` small enough that the result has
    at most ``max_nodes`` nodes (when ``a`` has at most that many)."""
    path, old = _pick(rng, subtrees(a))
    budget = max(max_nodes - size(a) + size(old), 1)
    donors = [p for p in subtrees(b) if size(p[1]) <= budget]
    if not any(not n.args for _, n in donors):  # a leaf always fits a budget of 1
        return a
    _, donor = _pick(rng, donors)
    return replace_at(a, path, donor)


def point_mutation(rng: np.random.Generator, node: Node, grammar: Grammar) -> Node:
    """``node`` with one node changed: an operator to another of the grammar's with the same
    arity, or (a leaf, or an operator without such an alternative) a leaf to a new terminal."""
    points = subtrees(node)
    path, old = points[int(rng.integers(len(points)))]
    if old.args:
        same = [op for op in grammar.operators
                if op != old.op and OPERATOR_ARITY[op] == len(old.args)]
        if same:
            new_op = same[int(rng.integers(len(same)))]
            return replace_at(node, path, Node(new_op, old.args))
        leaves = [p for p in points if not p[1].args]
        path, old = leaves[int(rng.integers(len(leaves)))]
    return replace_at(node, path, random_terminal(rng, grammar))


def constant_perturbation(rng: np.random.Generator, node: Node, sigma: float) -> Node | None:
    """``node`` with one constant ``c`` moved by ``N(0, 1)·sigma·max(|c|, 1)`` (rounded to
    ``CONSTANT_DIGITS``), or None when it has no constant."""
    consts = [p for p in subtrees(node) if p[1].op == "const"]
    if not consts:
        return None
    path, old = consts[int(rng.integers(len(consts)))]
    moved = old.value + float(rng.standard_normal()) * sigma * max(abs(old.value), 1.0)
    return replace_at(node, path, Node("const", value=round_constant(moved)))


# ---- the strategy ----------------------------------------------------------------------------


class GPState(NamedTuple):
    """programs: str[P] parents best-first ("" before the first ``tell``); vectors:
    float64[P, d] their unit coordinates; fitness: float64[P, M]; has_parents: bool[];
    generation: int64[]; key: uint32[k]."""

    programs: np.ndarray
    vectors: np.ndarray
    fitness: np.ndarray
    has_parents: np.ndarray
    generation: np.ndarray
    key: np.ndarray


class GeneticProgramming:
    """Genetic programming over programs of ``site`` (see the module docstring).

    Args:
      site: "routing", "admission" or "priority".
      population_size: P >= 2.
      template: the numeric knobs' solution pytree ``{knob: float64[]}`` (unit coordinates;
        ``SearchSpace.template()``), or None. Its ``<site>.params.<name>`` knobs make ``name``
        a parameter programs may read.
      observables: the observables new subtrees read (default: all visible at the site).
      operators: node operators of new subtrees (default: all of ``OPERATOR_ARITY``).
      constants: (low, high) of new constants.
      max_nodes: size limit, 1 … ``MAX_PROGRAM_LENGTH`` nodes.
      seeds: program texts of the first generation (at most P; parsed and checked here).
      num_objectives: M; ``tell`` then takes fitness (P,) for M = 1 or (P, M).
      sigma: Gaussian step of the coordinates; constant_sigma: relative step of constants.
      tournament: parents per tournament (>= 1); init_depth: deepest first-generation tree.
      variation_weights: weights of ``VARIATIONS`` (crossover, subtree, point, constant).

    Raises:
      ValueError: an argument out of range; ProgramError: a seed that does not compile or is
        over ``max_nodes``.
    """

    def __init__(self, site: str, population_size: int, template: Any = None, *,
                 observables: Sequence[str] | None = None,
                 operators: Sequence[str] | None = None,
                 constants: tuple[float, float] = (-10.0, 10.0),
                 max_nodes: int = DEFAULT_MAX_NODES, seeds: Sequence[str] = (),
                 num_objectives: int = 1, sigma: float = 0.1, constant_sigma: float = 0.2,
                 tournament: int = 3, init_depth: int = 4,
                 variation_weights: Sequence[float] = DEFAULT_VARIATION_WEIGHTS) -> None:
        if site not in SITES:
            raise ValueError(f"site must be one of {', '.join(SITES)}, got {site!r}")
        if population_size < 2:
            raise ValueError(f"GP needs population_size >= 2, got {population_size}")
        if not 1 <= max_nodes <= MAX_PROGRAM_LENGTH:
            raise ValueError(f"max_nodes must be in [1, {MAX_PROGRAM_LENGTH}], got {max_nodes}")
        if num_objectives < 1 or tournament < 1 or init_depth < 1:
            raise ValueError("num_objectives, tournament and init_depth must be >= 1, got "
                             f"{num_objectives}, {tournament}, {init_depth}")
        weights = np.asarray(variation_weights, np.float64)
        if weights.shape != (len(VARIATIONS),) or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"variation_weights: {len(VARIATIONS)} weights >= 0 with a "
                             f"positive sum ({', '.join(VARIATIONS)}), got {variation_weights}")
        self.site = site
        self.knob = f"{site}.program"
        self.population_size = int(population_size)
        self.num_objectives = int(num_objectives)
        self.multi_objective = self.num_objectives > 1
        self.codec = PyTreeCodec(template if template is not None else {})
        prefix = f"{site}.params."
        #: The numeric knobs (the template's keys), sorted.
        self.numeric = tuple(sorted(template or {}))
        self.params = tuple(n[len(prefix):] for n in self.numeric if n.startswith(prefix))
        self.grammar = Grammar(_check_names(site, observables) + self.params,
                               _check_operators(operators), _check_range(constants))
        self.max_nodes = int(max_nodes)
        self.sigma, self.constant_sigma = float(sigma), float(constant_sigma)
        self.tournament, self.init_depth = int(tournament), int(init_depth)
        self.weights = weights / weights.sum()
        self.seeds = self._check_seeds(seeds)

    # -- validity ------------------------------------------------------------------------------

    def _check_seeds(self, seeds: Sequence[str]) -> tuple[str, ...]:
        if len(seeds) > self.population_size:
            raise ValueError(f"seeds: {len(seeds)} programs for a population of "
                             f"{self.population_size}")
        out: list[str] = []
        for k, text in enumerate(seeds):
            path = f"seeds[{k}]"
            node = parse(text, path=path)
            if size(node) > self.max_nodes:
                raise ProgramError(path, f"has {size(node)} nodes, more than max_nodes "
                                   f"({self.max_nodes}): {text!r}")
            compile_program(self.site, node=node, params=self._param_values(), path=path)
            if to_text(node) not in out:
                out.append(to_text(node))
        return tuple(out)

    def _param_values(self) -> dict[str, float]:
        return {p: 0.0 for p in self.params}

    def canonical(self, node: Node) -> Node | None:
        """``node`` as its text parses back, or None when it is over ``max_nodes`` or does not
        compile at the site."""
        try:
            node = parse(to_text(node), path=self.knob)
            if size(node) > self.max_nodes:
                return None
            compile_program(self.site, node=node, params=self._param_values(), path=self.knob)
        except ProgramError:
            return None
        return node

    # -- ask / tell ----------------------------------------------------------------------------

    def init(self, key: Any) -> GPState:
        p, d, m = self.population_size, self.codec.dim, self.num_objectives
        return GPState(programs=np.full(p, "", dtype=str), vectors=np.zeros((p, d)),
                       fitness=np.full((p, m), -np.inf), has_parents=np.asarray(False),
                       generation=np.asarray(0, np.int64), key=key_words(key))

    def ask(self, state: GPState) -> tuple[dict[str, np.ndarray], GPState]:
        """The first generation (seeds, then ramped half-and-half), else P children."""
        rng = rng_for(state.key, int(state.generation), 0)
        if not bool(state.has_parents):
            texts, vectors = self._initial(rng)
        else:
            texts, vectors = self._offspring(rng, state)
        return self._population(texts, vectors), state

    def tell(self, state: GPState, population: Mapping[str, Any], fitness: Any) -> GPState:
        """(μ + λ) survival of the best P of parents and children."""
        p = self.population_size
        f = sanitize_fitness(fitness, p, allow_matrix=True).reshape(p, -1)
        if f.shape[1] != self.num_objectives:
            raise ValueError(f"fitness has {f.shape[1]} objectives, the GP was built for "
                             f"{self.num_objectives}")
        texts = np.asarray(population[self.knob]).astype(str).reshape(-1)
        if texts.shape != (p,):
            raise ValueError(f"population[{self.knob!r}] must hold {p} programs, got "
                             f"{texts.shape}")
        x = (self.codec.ravel({k: population[k] for k in self.numeric}) if self.codec.dim
             else np.zeros((p, 0)))
        if bool(state.has_parents):
            texts = np.concatenate([state.programs, texts])
            x = np.concatenate([state.vectors, x])
            f = np.concatenate([state.fitness, f])
        if self.num_objectives == 1:
            nodes = np.array([size(parse(t, path=self.knob)) for t in texts])
            order = np.lexsort((nodes, -f[:, 0]))
        else:
            order = nsga2_order(f)
        keep = order[:p]
        return GPState(programs=texts[keep], vectors=x[keep], fitness=f[keep],
                       has_parents=np.asarray(True),
                       generation=np.asarray(int(state.generation) + 1, np.int64),
                       key=state.key)

    def best(self, state: GPState) -> dict[str, np.ndarray]:
        """The best parent (first objective / first of NSGA-II's order) as a population of 1."""
        return self._population(list(state.programs[:1]), state.vectors[:1])

    # -- internals -----------------------------------------------------------------------------

    def _population(self, texts: Sequence[str], vectors: np.ndarray) -> dict[str, np.ndarray]:
        out = {self.knob: np.asarray(list(texts), dtype=str)}
        if self.codec.dim:
            out.update(self.codec.unravel(np.asarray(vectors, np.float64)))
        return out

    def _initial(self, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
        """Seeds with the template's coordinates, then ramped half-and-half, no text twice."""
        d = self.codec.dim
        texts = list(self.seeds)
        vectors = [self.codec.center.copy() for _ in texts]
        k = 0
        while len(texts) < self.population_size:
            depth = 1 + k % self.init_depth
            full = (k // self.init_depth) % 2 == 0
            k += 1
            texts.append(to_text(self._fresh(rng, depth, full, set(texts))))
            vectors.append(rng.uniform(0.0, 1.0, d))
        return texts, np.asarray(vectors, np.float64).reshape(len(texts), d)

    def _fresh(self, rng: np.random.Generator, depth: int, full: bool, taken: set[str]) -> Node:
        """A valid random tree whose text is not ``taken`` (*grow* after half the tries; a
        random terminal when every try fails)."""
        for attempt in range(MAX_TRIES):
            node = self.canonical(random_tree(rng, self.grammar, depth,
                                              full and attempt < MAX_TRIES // 2))
            if node is not None and to_text(node) not in taken:
                return node
        return self.canonical(random_terminal(rng, self.grammar)) or Node("const", value=0.0)

    def _tournament(self, rng: np.random.Generator) -> int:
        """Index of the best of ``tournament`` uniform picks (parents are best-first)."""
        return int(rng.integers(0, self.population_size, size=self.tournament).min())

    def _vary(self, rng: np.random.Generator, nodes: Sequence[Node], vectors: np.ndarray
              ) -> tuple[Node | None, np.ndarray, int]:
        """One child (None when invalid), its coordinates and its first parent's index."""
        kind = VARIATIONS[int(rng.choice(len(VARIATIONS), p=self.weights))]
        i = self._tournament(rng)
        node, vec = nodes[i], vectors[i].copy()
        d = vec.shape[0]
        if kind == "crossover":
            j = self._tournament(rng)
            child = subtree_crossover(rng, node, nodes[j], self.max_nodes)
            vec = np.where(rng.random(d) < 0.5, vectors[j], vec)
        elif kind == "subtree":
            child = subtree_mutation(rng, node, self.grammar)
        elif kind == "point":
            child = point_mutation(rng, node, self.grammar)
        else:
            child = constant_perturbation(rng, node, self.constant_sigma)
            if d:
                vec = vec + rng.standard_normal(d) * self.sigma
                child = node if child is None else child
            elif child is None:
                child = point_mutation(rng, node, self.grammar)
        return self.canonical(child), vec, i

    def _offspring(self, rng: np.random.Generator, state: GPState
                   ) -> tuple[list[str], np.ndarray]:
        """P children, none equal (text and coordinates) to a parent or an earlier child."""
        nodes = [parse(t, path=self.knob) for t in state.programs]
        seen = {(str(t), v.tobytes()) for t, v in zip(state.programs, state.vectors,
                                                       strict=True)}
        texts: list[str] = []
        vectors: list[np.ndarray] = []
        for _ in range(self.population_size):
            for _attempt in range(MAX_TRIES):
                child, vec, parent = self._vary(rng, nodes, state.vectors)
                if child is not None and (to_text(child), vec.tobytes()) not in seen:
                    break
            else:
                child, vec = nodes[parent], state.vectors[parent].copy()
            text = to_text(child)
            seen.add((text, vec.tobytes()))
            texts.append(text)
            vectors.append(vec)
        return texts, np.asarray(vectors, np.float64).reshape(len(texts), -1)


def check_observables(site: str, observables: Sequence[str] | None) -> tuple[str, ...]:
    """``observables`` (default: every one the site reads) without repeats; ValueError naming
    the first the site cannot read."""
    visible = visible_at(site)
    if observables is None:
        return visible
    names = tuple(dict.fromkeys(observables))
    for name in names:
        if name not in visible:
            raise ValueError(f"{name!r} is not an observable of the {site} program (it reads: "
                             f"{', '.join(visible)})")
    return names


def check_operators(operators: Sequence[str] | None) -> tuple[str, ...]:
    """``operators`` (default: all of ``OPERATOR_ARITY``) without repeats; ValueError naming
    the first that is not one."""
    if operators is None:
        return tuple(OPERATOR_ARITY)
    ops = tuple(dict.fromkeys(operators))
    for op in ops:
        if op not in OPERATOR_ARITY:
            raise ValueError(f"{op!r} is not an operator (allowed: {', '.join(OPERATOR_ARITY)})")
    return ops


def _check_names(site: str, observables: Sequence[str] | None) -> tuple[str, ...]:
    try:
        return check_observables(site, observables)
    except ValueError as err:
        raise ValueError(f"observables: {err}") from None


def _check_operators(operators: Sequence[str] | None) -> tuple[str, ...]:
    try:
        return check_operators(operators)
    except ValueError as err:
        raise ValueError(f"operators: {err}") from None


def _check_range(constants: tuple[float, float]) -> tuple[float, float]:
    low, high = (float(c) for c in constants)
    if not (np.isfinite(low) and np.isfinite(high) and low <= high):
        raise ValueError(f"constants must be finite (low, high) with low <= high, got "
                         f"{constants}")
    return low, high
