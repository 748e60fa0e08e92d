"""BLIS-named command-line flags and how they override a :class:`SimConfig`.

All flags default to None so "not given" is detectable. Precedence, as in BLIS: the config file,
then ``--policy-config`` (a BLIS policy bundle), then the explicit flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from blisjax.config._checks import ConfigError, check_float
from blisjax.config.flag_table import BLIS_FLAGS, parse_float, parse_int, parse_switch
from blisjax.config.sim import SimConfig
from blisjax.config.yaml_io import (
    apply_blis_bundle,
    blis_priority_overrides,
)

_BY_NAME = {name.lstrip("-"): f for f in BLIS_FLAGS for name in f.names}
_BY_NAME.update({f.dest: f for f in BLIS_FLAGS})
_BY_TARGET = {f.target: f for f in BLIS_FLAGS if f.target}


_METAVARS = {int: "N", float: "X"}


def add_blis_flags(parser: argparse.ArgumentParser) -> None:
    """Add the BLIS flags (all defaulting to None) to ``parser``.

    Policy names are listed in the help and checked by the configuration (so an unknown name is
    reported like any other bad value, naming the flag and the choices). Numbers are parsed by
    argparse (a malformed ``--tp x`` exits with argparse's usage error);
    lists (``--alpha-coeffs``, ``--routing-scorers``) are parsed by :func:`apply_blis_flags`.
    """
    group = parser.add_argument_group("BLIS-compatible flags")
    for f in BLIS_FLAGS:
        if f.parse is parse_switch or getattr(f.parse, "is_switch", False):
            group.add_argument(*f.names, dest=f.dest, action="store_const", const=True,
                               default=None, help=f.help)
            continue
        kind = {parse_int: int, parse_float: float}.get(f.parse, str)
        help_text = f.help
        if f.choices:
            help_text += ": " + " | ".join(f.choices)
        group.add_argument(
            *f.names,
            dest=f.dest,
            type=kind,
            default=None,
            help=help_text,
            metavar=f.metavar or ("NAME" if f.choices else _METAVARS.get(kind)),
        )


def _override_tree(values: Mapping[str, Any]) -> dict[str, Any]:
    """Nested {section: {field: value}} of the given flag values (parsed)."""
    tree: dict[str, Any] = {}
    for key, raw in values.items():
        flag = _BY_NAME.get(key.lstrip("-"))
        if flag is None:
            raise ConfigError(
                key, f"unknown BLIS flag; known: {', '.join(f.flag for f in BLIS_FLAGS)}"
            )
        if raw is None:
            continue
        value = flag.parse(flag.flag, raw)  # checked even when nothing takes it
        if not flag.target:
            continue
        node = tree
        *sections, leaf = flag.target.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree


def _latency_overrides(cfg: SimConfig, given: dict[str, Any]) -> dict[str, Any]:
    # Coefficients belong to one latency model: switching model drops inherited ones.
    if given.get("model", cfg.latency.model) != cfg.latency.model:
        given = {"alpha_coeffs": None, "beta_coeffs": None, "coefficients_file": None,
                 "vllm_version": None, **given}
    # --vllm-version asks for an entry of the shipped table, so it replaces coefficients
    # inherited from the file unless --alpha-coeffs/--beta-coeffs are given too.
    if "vllm_version" in given and "alpha_coeffs" not in given and "beta_coeffs" not in given:
        given = {"alpha_coeffs": None, "beta_coeffs": None, **given}
    return given


def _apply_tree(cfg: SimConfig, tree: dict[str, Any]) -> SimConfig:
    policy_tree = tree.pop("policy", {})
    if "priority" in policy_tree:
        policy_tree["priority"] = blis_priority_overrides(
            policy_tree["priority"], cfg.policy.priority
        )
    policy = dataclasses.replace(
        cfg.policy,
        **{
            name: dataclasses.replace(getattr(cfg.policy, name), **v)
            for name, v in policy_tree.items()
        },
    )
    if "latency" in tree:
        tree["latency"] = _latency_overrides(cfg, tree["latency"])
    for nested in ("pd", "gateway"):  # nested sections: the flags given update them
        if nested in tree.get("cluster", {}):
            tree["cluster"][nested] = dataclasses.replace(getattr(cfg.cluster, nested),
                                                          **tree["cluster"][nested])
    sections = {
        name: dataclasses.replace(getattr(cfg, name), **tree.pop(name))
        for name in ("engine", "latency", "cluster", "compat")
        if name in tree
    }
    return dataclasses.replace(cfg, policy=policy, **sections, **tree)


def _blame_flag(err: ConfigError) -> ConfigError:
    target = err.path.split("[")[0]
    while target and target not in _BY_TARGET:
        target = target.rpartition(".")[0]
    flag = _BY_TARGET.get(target)
    return ConfigError(flag.flag, f"{err.path}: {err.problem}") if flag else err


def apply_blis_flag_values(cfg: SimConfig, values: Mapping[str, Any]) -> SimConfig:
    """Override ``cfg`` with BLIS flag values keyed by flag name (``"tp"``, ``"--tp"``) or dest.

    Values may be typed (``4``) or text as on a command line (``"4"``, ``"1.5,2,0"``); None means
    not given. ``policy-config`` (a bundle path) is applied before the other flags.

    Raises:
      ConfigError: naming the flag whose value is malformed or invalid.
    """
    bundle = next(
        (v for k, v in values.items() if k.lstrip("-") in ("policy-config", "policy_config")), None
    )
    if bundle is not None:
        cfg = apply_blis_bundle(cfg, str(bundle))
    tree = _override_tree(values)
    try:
        cfg = _apply_tree(cfg, tree)
    except ConfigError as err:
        raise _blame_flag(err) from err
    given = {k.lstrip("-").replace("_", "-") for k, v in values.items() if v is not None}
    if "model-autoscaler-interval-us" in given:  # overrides the bundle's interval (BLIS)
        cfg = _autoscaler_interval(cfg, next(v for k, v in values.items() if k.lstrip("-")
                                             .replace("_", "-") == "model-autoscaler-interval-us"))
    if cfg.cluster.gateway.enabled and "admission-policy" in given \
            and cfg.policy.admission.policy != "always-admit":
        raise ConfigError("--admission-policy", "BLIS's --flow-control replaces the admission "
                          "policy by the gateway queue (blisjax composes them, docs/semantics.md "
                          "Decision 21): give only --flow-control, or set policy.admission in a "
                          "configuration file")
    if "pd-prefix-threshold" in given and cfg.cluster.pd.decider != "prefix-threshold":
        raise ConfigError("--pd-prefix-threshold", "is only used with --pd-decider "
                          f"prefix-threshold (the decider is {cfg.cluster.pd.decider!r})")
    return cfg


def _autoscaler_interval(cfg: SimConfig, raw: Any) -> SimConfig:
    """BLIS's ``--model-autoscaler-interval-us``: the tick period (truncated to µs); 0 turns
    the autoscaler off, a positive period turns BLIS's (blis-saturation) on when none is
    configured."""
    flag = "--model-autoscaler-interval-us"
    value = check_float(flag, parse_float(flag, raw), min_value=0)
    a = cfg.policy.autoscaler
    if int(value) == 0:
        a = dataclasses.replace(a, policy="none")
    else:
        a = dataclasses.replace(a, interval_us=int(value),
                                policy=a.policy if a.enabled else "blis-saturation")
    try:
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, autoscaler=a))
    except ConfigError as err:
        raise ConfigError(flag, f"{err.path}: {err.problem}") from err


def apply_blis_flags(cfg: SimConfig, ns: argparse.Namespace) -> SimConfig:
    """A new config with the flags given in ``ns`` (from :func:`add_blis_flags`) applied."""
    values = {f.dest: getattr(ns, f.dest, None) for f in BLIS_FLAGS}
    return apply_blis_flag_values(cfg, values)
