"""Latency rows of a program: the GPU types its lanes run (the ``hardware`` knob), the P/D
pools of their own TP and GPU, and instance variants of their own speed — which rows
``WorkloadConsts`` holds (``EngineStatic.settings.gpus``, ``instance_rows``, ``instance_kv_blocks``,
``variant_speed``) and the checks that a population's lanes read rows the program has.

Counterpart: the reference engine resolves each instance's configuration itself
(``ResolvedConfig.for_instance``, ``ClusterSimulator.latency_on``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.config._checks import ConfigError
from blisjax.config.autoscale import max_replicas
from blisjax.config.codes import PDRole
from blisjax.config.hardware import hardware_code, load_hardware, shipped_hardware
from blisjax.engine.request_rows import engine_workload, max_pending
from blisjax.rules import slot_roles


def variant_gpus(cfg) -> list[str]:
    """The GPUs other than ``cfg.hardware`` whose speed instance variants run at."""
    from blisjax.rules import instance_variants, speed_gpu, uses_lifecycle

    if not uses_lifecycle(cfg):
        return []
    variants = instance_variants(cfg.cluster.node_pools, cfg.hardware,
                                 cfg.cluster.lifecycle.cost_per_hour,
                                 cfg.engine.tensor_parallel_size)
    speeds = {speed_gpu(v.gpu_type, cfg.hardware, cfg.compat.blis_quirks) for v in variants}
    return sorted(speeds - {cfg.hardware})


def with_variant_speed(st, resolved, workload, names):
    """``st`` with the latency rows of GPUs ``names`` and each instance reading its variant's
    (``variant_speed``); ``st`` itself without names."""
    if not names:
        return st
    if st.features.latency is not None:
        raise ConfigError("cluster.node_pools", "instances of another GPU's speed with a "
                          "roofline model the program evaluates on the host run in the "
                          "reference engine only (--engine reference)")
    if st.settings.instance_rows:
        raise ConfigError("cluster.node_pools", "instances of another GPU's speed with P/D "
                          "pools of their own settings (cluster.pd.prefill / decode) run in "
                          "the reference engine only (--engine reference)")
    try:
        st = with_gpus(st, resolved, workload, names)
    except ConfigError as err:
        raise ConfigError("cluster.node_pools", f"{err.path}: {err.problem}") from None
    return st if st.features.variant_speed else st.replace(variant_speed=True)


def pool_configs(resolved) -> tuple:
    """The P/D pools' own resolved configurations (``ResolvedConfig.pools``), if any."""
    return tuple(x for x in resolved.pools or () if x is not None)


def pool_shape(resolved) -> dict:
    """``EngineStatic``'s per-instance fields for P/D pools of their own (``instance_rows``,
    ``instance_kv_blocks``, ``instance_max_model_len``, ``row_roofline``; none without). The
    JAX engine runs pools that differ in TP, GPU, KV size, max-model-len and latency model
    (blackbox or roofline; physics in every pool or in none); physics mixed with another
    model it refuses, naming the setting."""
    if not pool_configs(resolved):
        return {}
    cfg = resolved.config
    for role, own in zip(("prefill", "decode"), resolved.pools, strict=True):
        if own is None:
            continue
        models = {cfg.latency.model, own.config.latency.model}
        if "physics" in models and len(models) > 1:
            raise ConfigError(f"cluster.pd.{role}.latency_model", "P/D pools whose latency "
                              "models mix physics with another run in the reference engine "
                              "only (--engine reference)")
    n = max_replicas(cfg.policy.autoscaler, cfg.cluster.num_instances, cfg.cluster.node_pools,
                     cfg.engine.tensor_parallel_size, cfg.cluster.pd)
    roles = slot_roles(cfg)
    rows = tuple(0 if resolved.for_instance(i) is resolved
                 else 1 if roles[i] == PDRole.PREFILL else 2 for i in range(n))
    blocks = tuple(int(resolved.for_instance(i).total_kv_blocks) for i in range(n))
    lengths = tuple(int(resolved.for_instance(i).max_model_len) for i in range(n))
    models = [x.config.latency.model for x in pool_row_configs(resolved)]
    return dict(instance_rows=rows,
                row_roofline=tuple(m == "roofline" for m in models) if len(set(models)) > 1
                else (),
                instance_kv_blocks=blocks if len(set(blocks)) > 1 else (),
                instance_max_model_len=lengths if set(lengths) != {int(resolved.max_model_len)}
                else ())


# Latency rows per GPU with P/D pools of their own: the configuration's, the prefill pool's,
# the decode pool's (``EngineStatic.settings.instance_rows`` values 0, 1, 2).
POOL_ROWS = 3


def pool_row_configs(resolved) -> list:
    """The resolved configuration of each latency row of ``EngineStatic.settings.instance_rows``:
    the configuration's, the prefill pool's, the decode pool's (the configuration's where a
    pool has no settings of its own)."""
    pools = resolved.pools or (None, None)
    return [resolved, *(resolved if x is None else x for x in pools)]


def gpu_resolved(resolved, name: str):
    """``resolved`` with GPU ``name`` (``hardware``): the configuration resolved again, as the
    reference engine resolves a lane's (``resolve_config``); it must keep the KV blocks per
    instance, a shape of the program."""
    from blisjax.config.resolve import resolve_config

    if name == resolved.config.hardware:
        return resolved
    try:
        other = resolve_config(dataclasses.replace(resolved.config, hardware=name))
    except ConfigError as err:
        raise ConfigError("hardware", f"GPU {name!r} as a lane's GPU type: {err}") from None
    if other.total_kv_blocks != resolved.total_kv_blocks:
        raise ConfigError("hardware", f"GPU {name!r} gives {other.total_kv_blocks} KV blocks "
                          f"per instance, the configuration's {resolved.config.hardware!r} "
                          f"{resolved.total_kv_blocks}: lanes of one program need one KV size "
                          "(set engine.total_kv_blocks)")
    return other


def with_gpus(st, resolved, workload, names):
    """``st`` with the latency of GPU types ``names`` per lane (and those it has, and the
    configuration's): ``EngineStatic.settings.gpus``, and pending slots for every GPU's α delays.
    ``st`` itself when every name is the configuration's GPU and it has no others."""
    base = resolved.config.hardware
    for name in names:
        if name != base:
            load_hardware(name)  # ConfigError naming ``hardware`` for an unknown GPU
    wanted = sorted(set(st.settings.gpus) | set(names) | {base}, key=hardware_code)
    if tuple(wanted) == st.settings.gpus or (not st.settings.gpus and wanted == [base]):
        return st
    if len({hardware_code(x) for x in wanted}) != len(wanted):
        raise ConfigError("hardware", f"GPU types {wanted} include two outside the shipped "
                          "table: a lane's GPU type must be a shipped one")
    if st.features.latency is not None:
        raise ConfigError("hardware", "per-lane GPU types with a roofline model the program "
                          "evaluates on the host (contexts of 2^25 tokens or more) run in the "
                          "reference engine only (--engine reference)")
    workload = engine_workload(workload, st.conversation_max_model_len, pd=st.features.pd)
    by_gpu = [gpu_resolved(resolved, x) for x in wanted]
    if st.settings.instance_rows:  # the pools' shapes are the program's on every GPU
        shape = pool_shape(resolved)
        for name, other in zip(wanted, by_gpu, strict=True):
            if pool_shape(other) != shape:
                raise ConfigError("hardware", f"GPU {name!r} gives the P/D pools other KV "
                                  "blocks or max-model-len than the configuration's "
                                  f"{resolved.config.hardware!r}: lanes of one program need "
                                  "one shape per pool (set the pools' KV size or hardware)")
    pending = max(max_pending(x, workload, pool_configs(x)) for x in by_gpu)
    return st.replace(gpus=tuple(wanted),
                               pending_slots=max(st.shapes.pending_slots, pending))


def for_hardware(st, resolved, workload, params):
    """``st`` with the GPU types of the lanes of ``params`` (stacked ``PolicyParams``) per lane
    when some lane runs another GPU than the configuration's (``with_gpus``)."""
    names = shipped_hardware()
    codes = {int(x) for x in np.unique(np.asarray(params.gpu))}
    lanes = [names[k] if k < len(names) else resolved.config.hardware for k in sorted(codes)]
    st = with_gpus(st, resolved, workload, lanes)
    if not st.features.lifecycle:
        return st
    # instance variants of their own speed (``rules.speed_gpu``) in some lane
    gpu = np.asarray(params.gpu).reshape(-1, 1)
    variant = np.asarray(params.lifecycle.variant_gpu).reshape(gpu.shape[0], -1)
    other = {int(x) for x in np.unique(variant[variant != gpu])}
    return with_variant_speed(st, resolved, workload,
                              [names[k] for k in sorted(other) if k < len(names)])


def check_pool_rows(st, params) -> None:
    """ConfigError unless every lane's split puts each instance in a pool of the settings the
    program holds for it (``instance_rows``: pools of their own are the base
    configuration's)."""
    rows = np.asarray(st.settings.instance_rows)
    role = np.atleast_2d(np.asarray(params.pd.role))[:, :rows.size]
    prefill = 1 if 1 in st.settings.instance_rows else 0
    decode = 2 if 2 in st.settings.instance_rows else 0
    lane_rows = np.where(role == int(PDRole.PREFILL), prefill,
                         np.where(role >= int(PDRole.DECODE), decode, 0))
    if not (np.all(np.asarray(params.pd.pools)) and np.all(lane_rows == rows[None, :])):
        raise ConfigError("cluster.pd", "with P/D pools of their own settings "
                          "(cluster.pd.prefill / decode) every lane keeps the base "
                          "configuration's split of the instances into pools")
