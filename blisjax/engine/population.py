"""Populations of policies from named knobs: grid, random and explicit lists.

A *knob* is a dotted name of a per-lane policy setting:

* ``admission.<field>``, ``priority.<field>``, ``routing.policy``, ``scheduler.policy`` — any
  field of ``AdmissionConfig``/``PriorityConfig``/``RoutingConfig``/``SchedulerConfig``
  (e.g. ``admission.token_bucket_capacity``, ``priority.policy``);
* ``routing.scorers.<scorer>`` — the weight of a weighted-routing scorer (added if absent);
* policy programs (docs/policy-programs.md): ``routing.program``, ``admission.program`` and
  ``priority.program`` (an expression; with ``<site>.policy: program``), and
  ``<site>.params.<name>`` — a named parameter of the site's program (added if absent);
* instance lifecycles (the base configuration must model them: an autoscaler, node pools,
  loading or warm-up): ``autoscaler.<field>`` — any field of ``AutoscalerConfig`` (its policy,
  thresholds, windows, cooldown, replica bounds up to the base's ``max_replicas``, drain
  policy); ``cluster.lifecycle.<field>`` — any field of ``LifecycleConfig``;
* ``hardware`` — the GPU type of the lane's instances (a name of the shipped
  ``hardware_config.json``): its latency (the blackbox coefficients BLIS's table has for the
  model on that GPU, or the roofline's and physics's FLOP rates and bandwidth) and its price
  (``metrics.gpu_price_per_hour`` unset); it must give the base's KV blocks per instance
  (set ``engine.total_kv_blocks`` for GPUs of other memory sizes);
* ``cluster.num_instances`` — the cluster's size, 1 up to the base configuration's count (the
  program's); a lane of k instances routes among the first k and its results are those of a
  k-instance cluster (not with lifecycles or P/D pools, which decide their instances
  themselves);
* ``engine.preemption_policy``, and the CPU tier of the KV cache: ``engine.kv_cpu_blocks``,
  ``engine.kv_transfer_bandwidth``, ``engine.kv_transfer_base_latency_us`` (the program's
  tier capacity is the largest lane's size, or ``build_static(cpu_tier_blocks=...)``);
* the scheduler's batch size, token budget and chunking: ``engine.max_num_running_reqs`` and
  ``engine.max_num_scheduled_tokens`` (up to the base configuration's, whose batch slots and
  step tables the program holds; not with the physics latency model, whose constants read
  them) and
  ``engine.long_prefill_token_threshold``; the GPU KV cache's size ``engine.total_kv_blocks``
  (up to the base configuration's; not with the physics model, nor beside P/D pools of their
  own KV sizes); the cluster's latencies:
  ``cluster.admission_latency_us``, ``cluster.routing_latency_us`` and
  ``cluster.snapshot_refresh_interval_us`` (``params.LaneSettings``);
* P/D pools (the base configuration must have pools, so the program models them):
  ``cluster.pd.<field>`` — any field of ``PDConfig`` (e.g. ``cluster.pd.decider``,
  ``cluster.pd.prefix_threshold_tokens``, ``cluster.pd.transfer_bandwidth_gbps``);
  ``cluster.pd.split`` — k prefill instances and the other ``num_instances - k`` decode
  ones (no shared ones); ``cluster.pd.prefill_scorers.<scorer>`` and
  ``cluster.pd.decode_scorers.<scorer>`` — a pool's scorer weight (added if absent).

Knobs are applied to the base ``SimConfig`` with full validation, then turned into
``PolicyParams`` — so every lane is a configuration the reference engine can run as well.
Settings that change array shapes beyond a bound (block size, instance count above the base's,
…) are not knobs: sweep them across separate calls.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from blisjax.config import ConfigError, ScorerWeight, SimConfig, available_hardware, load_hardware
from blisjax.engine.params import (
    LANE_SETTINGS,
    PHYSICS_READS_SIZES,
    SIZED_SETTINGS,
    params_from_config,
    stack_params,
)
from blisjax.engine.run import simulate_population
from blisjax.metrics import config_metrics
from blisjax.rules import uses_lifecycle

_POLICY_SECTIONS = ("admission", "priority", "routing", "scheduler", "autoscaler")
#: ``EngineConfig`` fields that are per-lane knobs (``PolicyParams``).
ENGINE_KNOBS = ("preemption_policy", "kv_cpu_blocks", "kv_transfer_bandwidth",
                "kv_transfer_base_latency_us", "max_num_running_reqs",
                "max_num_scheduled_tokens", "long_prefill_token_threshold", "total_kv_blocks")
#: Knobs of the settings that size the program (``params.SIZED_SETTINGS``).
_SIZED_KNOBS = frozenset(LANE_SETTINGS[name] for name in SIZED_SETTINGS)
#: ``ClusterConfig`` fields that are per-lane knobs (``PolicyParams.settings``).
CLUSTER_KNOBS = ("admission_latency_us", "routing_latency_us", "snapshot_refresh_interval_us")


def _with_weight(scorers: tuple[ScorerWeight, ...], name: str, value) -> tuple:
    """``scorers`` with scorer ``name``'s weight set to ``value`` (appended if absent)."""
    old = [s.name for s in scorers]
    kept = [s for s in scorers if s.name != name]
    kept.insert(old.index(name) if name in old else len(kept), ScorerWeight(name, float(value)))
    return tuple(kept)


def _set_pd_knob(cfg: SimConfig, parts: list[str], value) -> SimConfig:
    """``cluster.pd.<field>``, ``cluster.pd.split`` and ``cluster.pd.<pool>_scorers.<scorer>``."""
    pd = cfg.cluster.pd
    if len(parts) == 4 and parts[2] in ("prefill_scorers", "decode_scorers"):
        changes = {parts[2]: _with_weight(getattr(pd, parts[2]), parts[3], value)}
    elif len(parts) == 3 and parts[2] == "split":
        k, n = int(value), cfg.cluster.num_instances
        if not 1 <= k < n:
            raise ConfigError("cluster.pd.split", f"must be 1 .. {n - 1} (prefill instances; "
                              f"the other ones decode), got {value!r}")
        changes = dict(prefill_instances=k, decode_instances=n - k, shared_instances=0)
    elif len(parts) == 3 and parts[2] in {f.name for f in dataclasses.fields(pd)}:
        changes = {parts[2]: value}
    else:
        raise ConfigError(f"knob {'.'.join(parts)!r}: cluster.pd has no such knob")
    cluster = dataclasses.replace(cfg.cluster, pd=dataclasses.replace(pd, **changes))
    return dataclasses.replace(cfg, cluster=cluster)


def _set_size(cfg: SimConfig, value) -> SimConfig:
    """``cluster.num_instances``: 1 .. the base configuration's count."""
    if cfg.cluster.pd.enabled or uses_lifecycle(cfg):
        raise ConfigError("knob 'cluster.num_instances'", "not a per-lane knob with instance "
                          "lifecycles or P/D pools (the autoscaler and the pools decide which "
                          "instances serve)")
    n = cfg.cluster.num_instances
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= n:
        raise ConfigError("knob 'cluster.num_instances'", f"must be an integer in [1, {n}] "
                          f"(the base configuration's instances, the program's), got {value!r}")
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster,
                                                                num_instances=value))


def _set_hardware(cfg: SimConfig, value) -> SimConfig:
    """``hardware``: a GPU type of the shipped table (its latency and price per lane)."""
    if not isinstance(value, str):
        raise ConfigError("knob 'hardware'", f"must be a GPU name ({', '.join(available_hardware())}), "
                          f"got {value!r}")
    load_hardware(value)  # ConfigError naming ``hardware`` and the known GPUs
    return dataclasses.replace(cfg, hardware=value)


def set_knob(cfg: SimConfig, name: str, value) -> SimConfig:
    """A copy of ``cfg`` with knob ``name`` set to ``value`` (validated)."""
    parts = name.split(".")
    if parts == ["hardware"]:
        return _set_hardware(cfg, value)
    if parts[:2] == ["routing", "scorers"] and len(parts) == 3:
        routing = dataclasses.replace(cfg.policy.routing, scorers=_with_weight(
            cfg.policy.routing.scorers, parts[2], value))
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, routing=routing))
    if parts == ["cluster", "num_instances"]:
        return _set_size(cfg, value)
    if len(parts) == 3 and parts[0] in ("routing", "admission", "priority") \
            and parts[1] == "params":
        section = getattr(cfg.policy, parts[0])
        params = dict(section.params)
        params[parts[2]] = value
        section = dataclasses.replace(section, params=tuple(params.items()))
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy,
                                                                   **{parts[0]: section}))
    if parts[:2] == ["cluster", "pd"]:
        if not cfg.cluster.pd.enabled:
            raise ConfigError(f"knob {name!r}: the base configuration has no P/D pools "
                              "(cluster.pd), so its program does not model them")
        return _set_pd_knob(cfg, parts, value)
    if parts[0] == "autoscaler" or parts[:2] == ["cluster", "lifecycle"]:
        if not uses_lifecycle(cfg):
            raise ConfigError(f"knob {name!r}: the base configuration has no instance "
                              "lifecycles (an autoscaler, node pools, loading or warm-up), so "
                              "its program does not model them")
    if parts[:2] == ["cluster", "lifecycle"] and len(parts) == 3:
        life = cfg.cluster.lifecycle
        if parts[2] not in {f.name for f in dataclasses.fields(life)}:
            raise ConfigError(f"knob {name!r}: cluster.lifecycle has no field {parts[2]!r}")
        cluster = dataclasses.replace(cfg.cluster, lifecycle=dataclasses.replace(
            life, **{parts[2]: value}))
        return dataclasses.replace(cfg, cluster=cluster)
    if name in _SIZED_KNOBS:
        if cfg.latency.model == "physics":
            raise ConfigError(f"knob '{name}'", "not a per-lane knob with the physics latency "
                              f"model ({PHYSICS_READS_SIZES}): sweep it across calls")
        most = getattr(cfg.engine, parts[1])
        if value is None and most is not None:  # a lane's blocks computed from its GPU anew
            raise ConfigError(f"knob '{name}'", f"must be an integer up to {most} (the base "
                              "configuration gives its KV blocks), got None")
        if most is not None and isinstance(value, int | float) and not isinstance(value, bool) \
                and value > most:
            raise ConfigError(f"knob '{name}'", f"must be at most {most} (the base "
                              "configuration's, whose batch slots, KV blocks and step tables "
                              f"the program holds), got {value!r}")
    if len(parts) == 2 and parts[0] == "engine" and parts[1] in ENGINE_KNOBS:
        return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine,
                                                                   **{parts[1]: value}))
    if len(parts) == 2 and parts[0] == "cluster" and parts[1] in CLUSTER_KNOBS:
        return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster,
                                                                    **{parts[1]: value}))
    if len(parts) == 2 and parts[0] in _POLICY_SECTIONS:
        section = getattr(cfg.policy, parts[0])
        if parts[1] not in {f.name for f in dataclasses.fields(section)}:
            raise ConfigError(f"knob {name!r}: {parts[0]} has no field {parts[1]!r}")
        section = dataclasses.replace(section, **{parts[1]: value})
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy,
                                                                   **{parts[0]: section}))
    raise ConfigError(f"knob {name!r}: not a per-lane policy knob (allowed: admission.<field>, "
                      "priority.<field>, routing.<field>, routing.scorers.<scorer>, hardware, "
                      "<routing|admission|priority>.params.<name>, "
                      "scheduler.policy, cluster.num_instances, engine.<field> for "
                      f"{', '.join(ENGINE_KNOBS)}, cluster.<field> for "
                      f"{', '.join(CLUSTER_KNOBS)}, cluster.pd.<field>, cluster.pd.split, "
                      "cluster.pd.prefill_scorers.<scorer>, cluster.pd.decode_scorers.<scorer>, "
                      "autoscaler.<field>, cluster.lifecycle.<field>)")


#: Sections whose program knobs are set together (``apply_knobs``).
_PROGRAM_SITES = ("routing", "admission", "priority")


def _program_knob(name: str) -> str | None:
    """The site of a knob that is part of a site's program (its policy, program, tree or a
    parameter), else None."""
    parts = name.split(".")
    if parts[0] in _PROGRAM_SITES and (parts[1:] in (["policy"], ["program"], ["tree"])
                                       or (len(parts) == 3 and parts[1] == "params")):
        return parts[0]
    return None


def _set_program_knobs(cfg: SimConfig, site: str, knobs: dict) -> SimConfig:
    """A site's policy, program, tree and parameter knobs applied at once, so a program may
    name a parameter the same knob set introduces (one validation of the result)."""
    section = getattr(cfg.policy, site)
    params = dict(section.params)
    changes = {}
    for name, value in knobs.items():
        field = name.split(".")[1]
        if field == "params":
            params[name.split(".")[2]] = value
        else:
            changes[field] = value
    if "tree" in changes:
        changes.setdefault("program", "")
    section = dataclasses.replace(section, params=tuple(params.items()), **changes)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, **{site: section}))


def apply_knobs(cfg: SimConfig, knobs) -> SimConfig:
    """``cfg`` with every knob of the mapping ``knobs`` set (each validated by ``set_knob``);
    a site's program knobs (``<site>.policy``, ``.program``, ``.tree``, ``.params.<name>``)
    together, after the others."""
    by_site: dict[str, dict] = {}
    for name, value in knobs.items():
        site = _program_knob(name)
        if site is None:
            cfg = set_knob(cfg, name, value)
        else:
            by_site.setdefault(site, {})[name] = value
    for site, site_knobs in by_site.items():
        cfg = _set_program_knobs(cfg, site, site_knobs)
    return cfg


def grid(**axes) -> list[dict]:
    """Cartesian product of knob values, e.g.
    ``grid(**{"routing.scorers.queue-depth": [1, 2]})``."""
    names = list(axes)
    return [dict(zip(names, values, strict=True))
            for values in itertools.product(*(axes[n] for n in names))]


def random_knobs(space: dict, count: int, seed: int) -> list[dict]:
    """``count`` random knob sets: a (lo, hi) tuple draws uniformly, a list draws a choice."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        point = {}
        for name, dom in space.items():
            if isinstance(dom, tuple) and len(dom) == 2:
                point[name] = float(rng.uniform(dom[0], dom[1]))
            else:
                point[name] = dom[int(rng.integers(len(dom)))]
        out.append(point)
    return out


@dataclass(frozen=True)
class PopulationResult:
    """Per-lane outcome: ``configs[k]`` produced ``results[k]`` / ``metrics[k]``; ``fitness[k]``
    is the configured fitness (NaN where no fitness weights are configured)."""

    knobs: list[dict]
    configs: list[SimConfig]
    results: list
    metrics: list[dict]
    fitness: np.ndarray


def evaluate_population(resolved, workload, knob_sets: list[dict], static=None, phase=None,
                        **capacities):
    """Evaluate one lane per knob set in a single compiled call of the JAX engine (``static``,
    ``phase``: see ``simulate_population``; ``phase=print`` shows when compiling starts)."""
    configs = [apply_knobs(resolved.config, knobs) for knobs in knob_sets]
    params = stack_params([params_from_config(c, workload.tenant_names) for c in configs])
    results = simulate_population(resolved, workload, params, static=static, phase=phase,
                                  **capacities)
    metrics = [config_metrics(r, workload, c)
               for r, c in zip(results, configs, strict=True)]
    fitness = np.array([m.get("fitness", np.nan) for m in metrics], dtype=np.float64)
    return PopulationResult(list(knob_sets), configs, results, metrics, fitness)
