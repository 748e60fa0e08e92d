"""Field checks and names shared by the configuration sections: the accepted policy names,
the SLO-class score table, the knob magnitude range and the small converters each section's
``__post_init__`` uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from blisjax.config._checks import (
    ConfigError,
    check_choice,
    check_float,
    check_int,
    check_str,
)
from blisjax.config.codes import (
    AdmissionPolicy,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)
from blisjax.workload.types import SLO_CLASSES

#: SLO classes a request can carry ("" = no class). Same names as ``blisjax.workload``.
SLO_CLASS_NAMES = SLO_CLASSES
LATENCY_MODELS = ("blackbox", "roofline", "physics")
# Accepted policy names, in code order (``blisjax.config.codes``).
PREEMPTION_POLICIES = PreemptionPolicy.labels()
ADMISSION_POLICIES = AdmissionPolicy.labels()
PRIORITY_POLICIES = PriorityPolicy.labels()
ROUTING_POLICIES = RoutingPolicy.labels()
SCORER_NAMES = Scorer.labels()
TIE_BREAKS = TieBreak.labels()
SCHEDULER_POLICIES = SchedulerPolicy.labels()
#: SLO-target class names: "default" stands for the empty class "".
SLO_TARGET_CLASSES = ("default",) + SLO_CLASS_NAMES[1:]
#: BLIS's static SLO-class scores (docs/semantics.md §5.5); higher = more urgent.
DEFAULT_SLO_CLASS_SCORES: tuple[tuple[str, float], ...] = (
    ("critical", 4.0),
    ("standard", 3.0),
    ("", 3.0),
    ("batch", -1.0),
    ("sheddable", -2.0),
    ("background", -3.0),
)
#: Score of a class missing from ``slo_class_scores`` (BLIS: unknown classes score as standard).
UNKNOWN_SLO_CLASS_SCORE = 3.0
#: BLIS rejects SLO-class score overrides outside this range.
SLO_CLASS_SCORE_LIMIT = 100.0


def non_negative_int(path: str, value: Any) -> int:
    return check_int(path, value, min_value=0)


#: Nonzero policy weights, scores, rates and sizes lie within these magnitudes. The JAX engine
#: runs on XLA:CPU, which treats subnormal floats (below ~2.2e-308) as zero; within this range
#: no product or ratio of two knobs with the engine's other quantities comes near one, so both
#: engines compute the same values.
KNOB_MAGNITUDE = (1e-30, 1e30)


def check_knob(path: str, value: Any, **bounds: Any) -> float:
    """A finite policy knob within ``bounds`` (see ``check_float``) that is 0 or of a magnitude
    in ``KNOB_MAGNITUDE``."""
    value = check_float(path, value, **bounds)
    low, high = KNOB_MAGNITUDE
    if value != 0 and not low <= abs(value) <= high:
        raise ConfigError(path, f"must be 0 or between {low:g} and {high:g} in magnitude "
                                f"(the JAX engine flushes subnormal floats to zero), got {value!r}")
    return value


def knob(path: str, value: Any) -> float:
    return check_knob(path, value)


def name_key(path: str, value: Any) -> str:
    return check_str(f"{path} key", value, nonempty=False)


def choice_key(choices: tuple[str, ...]) -> Any:
    def check(path: str, value: Any) -> str:
        return check_choice(f"{path} key", value, choices)

    return check


def ensure_type(path: str, value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        raise ConfigError(path, f"must be a {cls.__name__}, got {type(value).__name__}")


def as_section(value: Any, cls: type, path: str, what: str) -> Any:
    """``value`` as a ``cls`` section at ``path``: itself, or built from a mapping whose keys
    are ``cls``'s fields (an unknown key is named with the allowed ones)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        allowed = tuple(f.name for f in dataclasses.fields(cls))
        for key in value:
            if key not in allowed:
                raise ConfigError(f"{path}.{key}",
                                  f"unknown key; allowed keys: {', '.join(allowed)}")
        return cls(**value)
    raise ConfigError(path, f"must be a mapping of {what}, got {value!r}")
