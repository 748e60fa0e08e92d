"""Search spaces over named policy knobs, and their map to and from the unit cube.

A space is a list of knobs (the dotted names of :mod:`blisjax.engine.population`, e.g.
``routing.scorers.prefix-affinity``, ``admission.token_bucket_capacity``,
``scheduler.policy``). Strategies never see knob values: every knob is one coordinate ``u`` of
the unit cube ``[0, 1]^d`` and the space maps between the two:

* ``u`` is first *reflected* into ``[0, 1]`` (a triangle wave: 1.2 → 0.8, −0.1 → 0.1, 2.3 →
  0.3), so a strategy may sample anywhere on the real line and always gets a valid value, with
  no flat plateau outside the cube (unlike clipping);
* a **numeric** knob ``{low, high, scale: linear|log, type: float|int}`` maps
  ``x = low + u·(high − low)`` (linear) or ``x = low·(high/low)^u`` (log, ``low > 0``); ``int``
  knobs round to the nearest integer;
* a **categorical** knob ``{choices: [a, b, c]}`` splits ``[0, 1]`` into ``k`` equal bins:
  ``index = min(floor(u·k), k − 1)``; a choice encodes to its bin centre ``(i + 0.5)/k``.

The strategies' solution pytree is ``{knob name: float}`` (unit coordinates); a population is the
same dict with arrays of shape ``(P,)``. YAML form::

    knobs:
      routing.scorers.prefix-affinity: {low: 0.01, high: 100, scale: log}
      admission.token_bucket_capacity: {low: 1000, high: 100000, scale: log, type: int}
      scheduler.policy: {choices: [fcfs, sjf]}

Each knob may also give ``init`` (a value inside its range): the starting centre of the
distribution-based strategies (default: the middle of the unit interval).

A space may also search over the *structure* of one site's policy program
(``blisjax.program``; ``--strategy gp``): a ``program`` section (:class:`ProgramSpec`) adds the
knob ``<site>.program`` (a program text, the first column), and every decoded knob set also
sets ``<site>.policy: program``. Numeric knobs ``<site>.params.<name>`` are the parameters the
programs may read::

    program:
      site: routing
      observables: [queue_depth, kv_utilization, score_prefix_affinity]   # default: all
      max_nodes: 31
      seeds: ["score_queue_depth"]
    knobs:
      routing.params.w: {low: 0, high: 10}
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from blisjax.config import ConfigError, SimConfig
from blisjax.config.fields import KNOB_MAGNITUDE
from blisjax.engine.population import CLUSTER_KNOBS, ENGINE_KNOBS, set_knob
from blisjax.program import MAX_PROGRAM_LENGTH, SITES, ProgramError, compile_program
from blisjax.program.language import parse, size, to_text

__all__ = ["ChoiceKnob", "NumericKnob", "ProgramSpec", "SearchSpace", "get_knob", "load_space",
           "reflect_unit", "space_from_mapping"]

_NUMERIC_KEYS = ("low", "high", "scale", "type", "init")
_CHOICE_KEYS = ("choices", "init")


def reflect_unit(u: float) -> float:
    """``u`` reflected into [0, 1] (period 2 triangle wave); non-finite → 0.5."""
    u = float(u)
    if not math.isfinite(u):
        return 0.5
    r = math.fmod(abs(u), 2.0)
    return 2.0 - r if r > 1.0 else r


@dataclass(frozen=True)
class NumericKnob:
    """A real or integer knob in ``[low, high]``, linear or log scale."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    init: float | None = None

    def from_unit(self, u: float) -> float | int:
        """The knob value of unit coordinate ``u`` (reflected into [0, 1])."""
        u = reflect_unit(u)
        if u == 0.0 or u == 1.0:  # the bounds exactly (no log/exp rounding)
            x = self.low if u == 0.0 else self.high
        elif self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            x = math.exp(lo + u * (hi - lo))
        else:
            x = self.low + u * (self.high - self.low)
        x = min(max(x, self.low), self.high)
        if self.integer:
            return int(min(max(round(x), math.ceil(self.low)), math.floor(self.high)))
        if abs(x) < KNOB_MAGNITUDE[0] and self.low <= 0 <= self.high:
            x = 0.0  # nonzero knobs below this magnitude are refused (config.fields.check_knob)
        return float(x)

    def to_unit(self, value: Any) -> float:
        """The unit coordinate of ``value`` (must lie in [low, high])."""
        x = float(value)
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            return (math.log(x) - lo) / (hi - lo)
        return (x - self.low) / (self.high - self.low)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a number in ``[low, high]`` (and an integer for int knobs)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            return False
        if self.integer and float(value) != round(float(value)):
            return False
        return self.low <= float(value) <= self.high

    def extremes(self) -> tuple[Any, ...]:
        """Values to validate against the configuration: both bounds."""
        return (self.from_unit(0.0), self.from_unit(1.0))

    def grid(self, n: int) -> tuple[Any, ...]:
        """``n`` evenly spaced values in unit space (both bounds included)."""
        if n == 1:
            return (self.from_unit(0.5),)
        return tuple(self.from_unit(i / (n - 1)) for i in range(n))


@dataclass(frozen=True)
class ChoiceKnob:
    """A categorical knob: one of ``choices`` (strings, numbers or booleans)."""

    name: str
    choices: tuple[Any, ...]
    init: Any = None

    def from_unit(self, u: float) -> Any:
        """The choice whose bin holds ``u`` (reflected into [0, 1])."""
        u = reflect_unit(u)
        k = len(self.choices)
        return self.choices[min(int(math.floor(u * k)), k - 1)]

    def to_unit(self, value: Any) -> float:
        """The centre of ``value``'s bin."""
        return (self._index(value) + 0.5) / len(self.choices)

    def _index(self, value: Any) -> int:
        for i, choice in enumerate(self.choices):
            if type(choice) is type(value) and choice == value:
                return i
        for i, choice in enumerate(self.choices):
            if choice == value and not isinstance(value, bool):
                return i
        raise ConfigError(self.name, f"{value!r} is not one of the choices {list(self.choices)}")

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one of the choices."""
        try:
            self._index(value)
        except ConfigError:
            return False
        return True

    def extremes(self) -> tuple[Any, ...]:
        """Values to validate against the configuration: every choice."""
        return self.choices

    def grid(self, n: int | None = None) -> tuple[Any, ...]:
        """Every choice (``n`` is ignored)."""
        return self.choices


Knob = NumericKnob | ChoiceKnob

#: Largest ``max_nodes`` of a program section: what compiles within the engine's instructions.
MAX_NODES = MAX_PROGRAM_LENGTH
#: Default ``constants`` range of a program section.
DEFAULT_CONSTANTS = (-10.0, 10.0)
_PROGRAM_KEYS = ("site", "observables", "operators", "constants", "max_nodes", "seeds")


@dataclass(frozen=True)
class ProgramSpec:
    """The program section of a space: the grammar of ``search.strategies.gp``.

    site: "routing", "admission" or "priority"; observables: what new subtrees read (every
    observable visible at the site when the YAML omits it); operators: node operators of new
    subtrees (``search.strategies.gp.OPERATOR_ARITY``; all when omitted); constants: (low,
    high) of new constants; max_nodes: size limit, 1 … ``MAX_NODES``; seeds: program texts of
    the first generation (canonical text).
    """

    site: str
    observables: tuple[str, ...]
    operators: tuple[str, ...]
    constants: tuple[float, float] = DEFAULT_CONSTANTS
    max_nodes: int = 31
    seeds: tuple[str, ...] = ()

    @property
    def knob(self) -> str:
        """The knob holding the program text: ``<site>.program``."""
        return f"{self.site}.program"

    @property
    def policy_knob(self) -> str:
        """The knob every candidate sets to ``program``: ``<site>.policy``."""
        return f"{self.site}.policy"

    def to_mapping(self) -> dict[str, Any]:
        """The YAML form of the section."""
        return {"site": self.site, "observables": list(self.observables),
                "operators": list(self.operators), "constants": list(self.constants),
                "max_nodes": self.max_nodes, "seeds": list(self.seeds)}


@dataclass(frozen=True)
class SearchSpace:
    """An ordered tuple of knobs, and optionally a program section; the order (the program
    first) is the column order of every output."""

    knobs: tuple[Knob, ...]
    program: ProgramSpec | None = None

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        if not names and self.program is None:
            raise ConfigError("space.knobs", "must declare at least one knob (or a program "
                              "section)")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError("space.knobs", f"duplicate knob {dupes[0]!r}")
        if self.program is not None:
            site = self.program.site
            for name in names:
                if name in (f"{site}.policy", f"{site}.program", f"{site}.tree"):
                    raise ConfigError(f"space.knobs.{name}", "is set by the program section "
                                      f"(every candidate runs its own {site} program)")

    @property
    def names(self) -> tuple[str, ...]:
        """Column names: the program knob (with a program section), then the knobs in
        declaration order."""
        head = (self.program.knob,) if self.program is not None else ()
        return head + tuple(k.name for k in self.knobs)

    @property
    def dim(self) -> int:
        """Number of unit coordinates (one per knob; the program has none)."""
        return len(self.knobs)

    def param_names(self) -> tuple[str, ...]:
        """The program's parameters: ``<name>`` of each knob ``<site>.params.<name>``, sorted
        (none without a program section)."""
        if self.program is None:
            return ()
        prefix = f"{self.program.site}.params."
        return tuple(sorted(k.name[len(prefix):] for k in self.knobs
                            if k.name.startswith(prefix)))

    def declare_params(self, config: SimConfig) -> SimConfig:
        """``config`` with the program's parameters declared in ``policy.<site>.params`` (so
        that each candidate's ``<site>.program`` and ``<site>.params.<name>`` knobs can be set
        one after the other; unchanged without a program section or parameters). A site without
        a program gets the placeholder ``0``, never run: its policy is unchanged."""
        params = self.param_names()
        if self.program is None or not params:
            return config
        site = self.program.site
        section = getattr(config.policy, site)
        declared = dict(section.params)
        for name in params:
            declared.setdefault(name, 0.0)
        section = dataclasses.replace(section, program=section.program or "0",
                                      params=tuple(declared.items()))
        return dataclasses.replace(config, policy=dataclasses.replace(config.policy,
                                                                      **{site: section}))

    def knob(self, name: str) -> Knob:
        """The knob called ``name``."""
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def template(self) -> dict[str, np.ndarray]:
        """The centre solution pytree: ``{name: float64[]}`` unit coordinates (``init`` or 0.5)."""
        return {k.name: np.asarray(0.5 if k.init is None else k.to_unit(k.init), np.float64)
                for k in self.knobs}

    def decode_one(self, unit: Mapping[str, Any]) -> dict[str, Any]:
        """One solution (``{name: scalar}``, unit coordinates; with a program section also
        ``{"<site>.program": text}``) → ``{name: knob value}``."""
        return self.decode({name: np.asarray(value).reshape(1)
                            for name, value in unit.items()})[0]

    def decode(self, population: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A population pytree ``{name: float[P]}`` → P knob dicts (in declaration order).

        With a program section the population also holds ``{"<site>.program": str[P]}``, and
        each knob dict is ``<site>.program`` (the text), the knobs, then ``<site>.policy:
        program`` — the order in which ``set_knob`` accepts them."""
        cols: dict[str, np.ndarray] = {
            k.name: np.asarray(population[k.name], np.float64).reshape(-1) for k in self.knobs}
        if self.program is not None:
            cols = {self.program.knob: np.asarray(population[self.program.knob]).astype(str)
                    .reshape(-1), **cols}
        sizes = {c.size for c in cols.values()}
        if len(sizes) != 1:
            raise ValueError(f"population leaves have different sizes: {sorted(sizes)}")
        n = sizes.pop()
        out = []
        for i in range(n):
            knobs: dict[str, Any] = {}
            if self.program is not None:
                knobs[self.program.knob] = str(cols[self.program.knob][i])
            knobs.update((k.name, k.from_unit(float(cols[k.name][i]))) for k in self.knobs)
            if self.program is not None:
                knobs[self.program.policy_knob] = "program"
            out.append(knobs)
        return out

    def encode(self, knob_sets: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """P knob dicts → a population pytree ``{name: float64[P]}`` of unit coordinates."""
        return {k.name: np.array([k.to_unit(ks[k.name]) for ks in knob_sets], np.float64)
                for k in self.knobs}

    def grid_points(self, n: int = 5) -> list[dict[str, Any]]:
        """The Cartesian grid: every choice of categorical knobs, ``n`` values of numeric ones."""
        axes = [k.grid(n) for k in self.knobs]
        return [dict(zip(self.names, values, strict=True)) for values in itertools.product(*axes)]

    def validate_against(self, config: SimConfig) -> None:
        """Check every knob name and bound value against ``config`` (via ``set_knob``).

        Raises:
          ConfigError: naming the knob and the engine's complaint.
        """
        for knob in self.knobs:
            for value in knob.extremes():
                try:
                    set_knob(config, knob.name, value)
                except ConfigError as err:
                    raise ConfigError(f"space.knobs.{knob.name}",
                                      f"value {value!r} is rejected by the configuration: "
                                      f"{err}") from None
        if self.program is not None:
            spec = self.program
            for k, text in enumerate(spec.seeds or ("0",)):
                try:
                    set_knob(set_knob(config, spec.knob, text), spec.policy_knob, "program")
                except ConfigError as err:
                    field = f"seeds[{k}]" if spec.seeds else "site"
                    raise ConfigError(f"space.program.{field}", "is rejected by the "
                                      f"configuration: {err}") from None

    def to_mapping(self) -> dict[str, Any]:
        """The YAML form (``space_from_mapping(s.to_mapping()) == s``)."""
        out: dict[str, Any] = {}
        for k in self.knobs:
            if isinstance(k, ChoiceKnob):
                entry: dict[str, Any] = {"choices": list(k.choices)}
            else:
                entry = {"low": k.low, "high": k.high, "scale": "log" if k.log else "linear",
                         "type": "int" if k.integer else "float"}
            if k.init is not None:
                entry["init"] = k.init
            out[k.name] = entry
        if self.program is not None:
            return {"program": self.program.to_mapping(), "knobs": out}
        return {"knobs": out}


def _number(path: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number, got {value!r}")
    return float(value)


def _knob_from_mapping(name: str, spec: Any) -> Knob:
    path = f"space.knobs.{name}"
    if isinstance(spec, (list, tuple)):
        spec = {"choices": list(spec)}
    if not isinstance(spec, Mapping):
        raise ConfigError(path, f"must be a mapping with low/high or choices, got {spec!r}")
    if "choices" in spec:
        unknown = sorted(set(spec) - set(_CHOICE_KEYS))
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}",
                              f"unknown key; allowed keys: {', '.join(_CHOICE_KEYS)}")
        choices = spec["choices"]
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ConfigError(f"{path}.choices", f"must be a non-empty list, got {choices!r}")
        for c in choices:
            if not isinstance(c, (str, int, float, bool)):
                raise ConfigError(f"{path}.choices", f"entries must be scalars, got {c!r}")
        if len({(type(c), c) for c in choices}) != len(choices):
            raise ConfigError(f"{path}.choices", f"must not repeat a value, got {list(choices)}")
        knob = ChoiceKnob(name, tuple(choices), spec.get("init"))
        if knob.init is not None and not knob.contains(knob.init):
            raise ConfigError(f"{path}.init", f"must be one of {list(choices)}, got "
                              f"{knob.init!r}")
        return knob
    unknown = sorted(set(spec) - set(_NUMERIC_KEYS))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}",
                          f"unknown key; allowed keys: {', '.join(_NUMERIC_KEYS)} (or choices)")
    for key in ("low", "high"):
        if key not in spec:
            raise ConfigError(f"{path}.{key}", "is required for a numeric knob")
    low, high = _number(f"{path}.low", spec["low"]), _number(f"{path}.high", spec["high"])
    if not low < high:
        raise ConfigError(f"{path}.high", f"must be > low ({low}), got {high}")
    scale = spec.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise ConfigError(f"{path}.scale", f"must be 'linear' or 'log', got {scale!r}")
    if scale == "log" and low <= 0:
        raise ConfigError(f"{path}.low", f"must be > 0 with scale 'log', got {low}")
    kind = spec.get("type", "float")
    if kind not in ("float", "int"):
        raise ConfigError(f"{path}.type", f"must be 'float' or 'int', got {kind!r}")
    if kind == "int" and math.floor(high) < math.ceil(low):
        raise ConfigError(f"{path}", f"int knob has no integer in [{low}, {high}]")
    init = spec.get("init")
    knob = NumericKnob(name, low, high, scale == "log", kind == "int", None)
    if init is not None:
        if not knob.contains(init):
            raise ConfigError(f"{path}.init", f"must be a {kind} in [{low}, {high}], got {init!r}")
        knob = dataclasses.replace(knob, init=init)
    return knob


def _names_list(path: str, value: Any) -> tuple[str, ...]:
    """A non-empty list of distinct strings."""
    if not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, f"must be a non-empty list of names, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(path, f"must not repeat a name, got {list(value)}")
    return tuple(value)


def _program_from_mapping(spec: Any, params: tuple[str, ...]) -> ProgramSpec:
    """The ``program`` section; ``params``: the parameter names its seeds may read."""
    from search.strategies.gp import check_observables, check_operators

    path = "space.program"
    if not isinstance(spec, Mapping):
        raise ConfigError(path, f"must be a mapping with a 'site' key, got {spec!r}")
    unknown = sorted(set(map(str, spec)) - set(_PROGRAM_KEYS))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}",
                          f"unknown key; allowed keys: {', '.join(_PROGRAM_KEYS)}")
    site = spec.get("site")
    if site not in SITES:
        raise ConfigError(f"{path}.site", f"must be one of {', '.join(SITES)}, got {site!r}")
    try:
        observables = check_observables(site, _names_list(
            f"{path}.observables", spec["observables"]) if "observables" in spec else None)
    except ValueError as err:
        raise ConfigError(f"{path}.observables", str(err)) from None
    try:
        operators = check_operators(_names_list(f"{path}.operators", spec["operators"])
                                    if "operators" in spec else None)
    except ValueError as err:
        raise ConfigError(f"{path}.operators", str(err)) from None
    constants = spec.get("constants", list(DEFAULT_CONSTANTS))
    if not isinstance(constants, (list, tuple)) or len(constants) != 2:
        raise ConfigError(f"{path}.constants", f"must be [low, high], got {constants!r}")
    low = _number(f"{path}.constants", constants[0])
    high = _number(f"{path}.constants", constants[1])
    if low > high:
        raise ConfigError(f"{path}.constants", f"low must be <= high, got {list(constants)}")
    max_nodes = spec.get("max_nodes", 31)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) \
            or not 1 <= max_nodes <= MAX_NODES:
        raise ConfigError(f"{path}.max_nodes", f"must be an integer in [1, {MAX_NODES}] (the "
                          f"engine runs programs of at most {MAX_PROGRAM_LENGTH} instructions),"
                          f" got {max_nodes!r}")
    seeds = spec.get("seeds", [])
    if not isinstance(seeds, (list, tuple)):
        raise ConfigError(f"{path}.seeds", f"must be a list of program texts, got {seeds!r}")
    texts: list[str] = []
    for k, text in enumerate(seeds):
        where = f"{path}.seeds[{k}]"
        node = parse(text, path=where)
        if size(node) > max_nodes:
            raise ConfigError(where, f"has {size(node)} nodes, more than max_nodes "
                              f"({max_nodes}): {text!r}")
        try:
            compile_program(site, node=node, params={p: 0.0 for p in params}, path=where)
        except ProgramError as err:
            raise ConfigError(where, err.problem) from None
        if to_text(node) not in texts:
            texts.append(to_text(node))
    return ProgramSpec(site, observables, operators, (low, high), max_nodes, tuple(texts))


def space_from_mapping(data: Any) -> SearchSpace:
    """Build a space from its YAML form (see the module docstring).

    Raises:
      ConfigError: naming the offending ``space.knobs.<name>.<key>`` (or
        ``space.program.<key>``) and the allowed values.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("space", f"must be a mapping with a 'knobs' key, got {data!r}")
    unknown = sorted(set(data) - {"knobs", "program"})
    if unknown:
        raise ConfigError(f"space.{unknown[0]}", "unknown key; allowed keys: knobs, program")
    knobs = data.get("knobs")
    if "program" in data and knobs is None:
        knobs = {}
    elif not isinstance(knobs, Mapping) or not knobs:
        raise ConfigError("space.knobs", f"must be a non-empty mapping of knob name → range, "
                          f"got {knobs!r}")
    parsed = tuple(_knob_from_mapping(str(name), spec) for name, spec in knobs.items())
    program = None
    if "program" in data:
        site = data["program"].get("site") if isinstance(data["program"], Mapping) else None
        prefix = f"{site}.params."
        params = tuple(k.name[len(prefix):] for k in parsed if k.name.startswith(prefix))
        program = _program_from_mapping(data["program"], params)
    return SearchSpace(parsed, program)


def load_space(path: str | Path) -> SearchSpace:
    """Read a space YAML file (see the module docstring)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError("--space", f"cannot read {str(path)!r}: {err}") from None
    return space_from_mapping(data)


def get_knob(config: SimConfig, name: str) -> Any:
    """The current value of knob ``name`` in ``config`` (the inverse of ``set_knob``).

    A ``routing.scorers.<scorer>`` knob absent from the scorer list reads as 0.0 (weight 0);
    a program parameter ``<site>.params.<name>`` not declared reads as None.
    """
    parts = name.split(".")
    if parts[:2] == ["routing", "scorers"] and len(parts) == 3:
        weights = {s.name: s.weight for s in config.policy.routing.scorers}
        return weights.get(parts[2], 0.0)
    if len(parts) == 3 and parts[0] in ("routing", "admission", "priority") \
            and parts[1] == "params":
        return dict(getattr(config.policy, parts[0]).params).get(parts[2])
    if len(parts) == 2 and parts[0] == "engine" and parts[1] in ENGINE_KNOBS:
        return getattr(config.engine, parts[1])
    if len(parts) == 2 and parts[0] == "cluster" and parts[1] in CLUSTER_KNOBS:
        return getattr(config.cluster, parts[1])
    if len(parts) == 2 and parts[0] in ("admission", "priority", "routing", "scheduler",
                                        "autoscaler"):
        return getattr(getattr(config.policy, parts[0]), parts[1])
    if parts[:2] == ["cluster", "lifecycle"] and len(parts) == 3:
        return getattr(config.cluster.lifecycle, parts[2])
    if parts == ["cluster", "num_instances"]:
        return config.cluster.num_instances
    if parts == ["hardware"]:
        return config.hardware
    pd = config.cluster.pd
    if parts[:2] == ["cluster", "pd"] and len(parts) == 4 and parts[2] in ("prefill_scorers",
                                                                           "decode_scorers"):
        return {s.name: s.weight for s in getattr(pd, parts[2])}.get(parts[3], 0.0)
    if parts[:2] == ["cluster", "pd"] and len(parts) == 3:
        if parts[2] == "split":  # prefill instances (the others decode)
            return pd.prefill_instances
        if hasattr(pd, parts[2]):
            return getattr(pd, parts[2])
    raise ConfigError(f"knob {name!r}: not a per-lane policy knob")
