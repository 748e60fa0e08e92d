"""Think-time distributions of closed-loop replay (BLIS's ``--think-time-dist``).

A spec is ``type:key=value,...``:

* ``constant:value=T`` — every follow-up waits T;
* ``lognormal:mu=M,sigma=S[,min=T][,max=T]`` — ln of the think time in *seconds* is normal with
  mean M and standard deviation S > 0; a draw is ``round(exp((M + ln 1e6) + S·Z))`` µs, Z one
  ``NormFloat64`` of the session's random source, clamped to [min, max] (each bound only when
  given and > 0) and to at least 1 µs; ``exp`` overflowing gives min (or 1).

Times take the suffixes ``s``, ``ms`` or ``us``; a bare number is milliseconds; each is
truncated to whole µs and must be finite and >= 0. Duplicate keys are refused. (BLIS
``sim/workload``: ``ParseThinkTimeDist``, ``LognormalSampler``, ``ConstantSampler``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blisjax.gorand import GoRand, go_log

__all__ = ["ThinkTimeDist", "parse_think_time_dist"]

_KINDS = ("lognormal", "constant")


@dataclass(frozen=True)
class ThinkTimeDist:
    """A parsed think-time distribution: ``kind`` lognormal (``mu_us`` = mu + ln 1e6, ``sigma``,
    ``min_us``/``max_us``, 0 = no bound) or constant (``value_us``)."""

    kind: str
    mu_us: float = 0.0
    sigma: float = 0.0
    min_us: int = 0
    max_us: int = 0
    value_us: int = 0

    @property
    def draws(self) -> bool:
        """It draws from the session's random source (lognormal)."""
        return self.kind == "lognormal"

    def sample(self, rng: GoRand) -> int:
        """One think time, µs (a lognormal draw takes one ``NormFloat64`` of ``rng``)."""
        if self.kind == "constant":
            return self.value_us
        exponent = self.mu_us + self.sigma * rng.norm_float64()
        try:
            value = math.exp(exponent)
        except OverflowError:  # Go's Exp gives +Inf
            value = math.inf
        if math.isinf(value) or math.isnan(value):
            return self.min_us if self.min_us > 0 else 1
        result = _go_round(value)
        if self.min_us > 0 and result < self.min_us:
            result = self.min_us
        if self.max_us > 0 and result > self.max_us:
            result = self.max_us
        return max(result, 1)


def _go_round(x: float) -> int:
    """Go ``math.Round``: half away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _time_us(text: str, what: str) -> int:
    """A time with suffix s, ms or us (bare: ms), truncated to µs."""
    for suffix, scale in (("us", 1), ("ms", 1_000), ("s", 1_000_000)):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], scale
            break
    else:
        number, factor = text, 1_000
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{what}: expected a time such as 500ms, 3s or 250us, got "
                         f"{text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: must be a non-negative finite time, got {text!r}")
    return int(value * factor)


def _params(text: str, kind: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{kind}: invalid parameter {item!r}, expected key=value")
        if key in out:
            raise ValueError(f"{kind}: duplicate parameter {key!r}")
        out[key] = value
    return out


def _number(params: dict[str, str], key: str, kind: str) -> float:
    if key not in params:
        raise ValueError(f"{kind} needs parameter {key!r}")
    try:
        value = float(params[key])
    except ValueError:
        raise ValueError(f"{kind}: {key} must be a number, got {params[key]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{kind}: {key} must be finite, got {params[key]!r}")
    return value


def parse_think_time_dist(spec: str) -> ThinkTimeDist:
    """Parse a ``--think-time-dist`` spec (module docstring).

    Raises:
      ValueError: naming what is wrong (format, kind, parameter, bound order).
    """
    kind, colon, rest = spec.partition(":")
    if not colon:
        raise ValueError(f"expected type:key=value,... (e.g. constant:value=500ms), got {spec!r}")
    if kind not in _KINDS:
        raise ValueError(f"unknown type {kind!r}; allowed: {', '.join(_KINDS)}")
    params = _params(rest, kind)
    allowed = {"lognormal": {"mu", "sigma", "min", "max"}, "constant": {"value"}}[kind]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"{kind}: unknown parameter {unknown[0]!r}; allowed: "
                         f"{', '.join(sorted(allowed))}")
    if kind == "constant":
        if "value" not in params:
            raise ValueError("constant needs parameter 'value'")
        return ThinkTimeDist("constant", value_us=_time_us(params["value"], "constant value"))
    mu = _number(params, "mu", kind)
    sigma = _number(params, "sigma", kind)
    if sigma <= 0:
        raise ValueError(f"lognormal: sigma must be > 0, got {params['sigma']!r}")
    low = _time_us(params["min"], "lognormal min") if "min" in params else 0
    high = _time_us(params["max"], "lognormal max") if "max" in params else 0
    if low > 0 and high > 0 and low > high:
        raise ValueError(f"lognormal: min ({low} us) must be <= max ({high} us)")
    return ThinkTimeDist("lognormal", mu_us=mu + go_log(1e6), sigma=sigma, min_us=low,
                         max_us=high)
