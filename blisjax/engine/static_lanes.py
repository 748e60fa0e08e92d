"""What a population's lanes add to a program's static configuration: the features some lane
needs that its base configuration does not use (a cache-reading scorer, a gateway, program
interpreters, sized lanes, a larger CPU tier, the sessions' prefix index, settings of their
own), and the checks that every lane fits the program (``for_lanes``); and one program for
runs of several configurations and workloads (``for_runs``).

Counterpart: none — the reference engine runs one configuration at a time; each lane's run
there is the reference (``blisjax.reference.simulate``).
"""

from __future__ import annotations

import numpy as np

from blisjax.config._checks import ConfigError
from blisjax.config.codes import (
    CACHE_SCORERS,
    AdmissionPolicy,
    PDDecider,
    PDRole,
    PriorityPolicy,
    RoutingPolicy,
    Scorer,
)
from blisjax.engine.latency_rows import check_pool_rows
from blisjax.engine.params import LANE_SETTINGS, PHYSICS_READS_SIZES, SIZED_SETTINGS
from blisjax.engine.static import (
    LANE_SETTING_FIELDS,
    EngineStatic,
    _check_sized,
    build_static,
    lane_settings_run,
    stretches_pay_off,
    with_gateway,
)
from blisjax.engine.static_parts import FIELD_GROUP
from blisjax.program.observables import SITES as PROGRAM_SITES


def with_program_sites(st: EngineStatic, sites) -> EngineStatic:
    """``st`` with the program interpreters of ``sites`` (and those it has) compiled in, and a
    routing program's cache query; a search over programs builds its program so, once, for
    its configured policy and its programs alike."""
    sites = tuple(x for x in PROGRAM_SITES if x in st.features.program_sites or x in sites)
    if sites == st.features.program_sites:
        return st
    return st.replace(program_sites=sites,
                      cache_scorers=st.features.cache_scorers or "routing" in sites)


def for_lanes(st: EngineStatic, params) -> EngineStatic:
    """``st``, with the cache query compiled in if a lane of ``params`` (stacked
    ``PolicyParams``, host or device arrays) lists a scorer that needs it — a population may
    add scorers its base configuration does not use. Whether the lane routes with weights is
    not consulted: a search's lanes keep their scorer lists from one generation to the next
    while a ``routing.policy`` knob changes, and one program must serve them all."""
    most = int(np.max(np.asarray(params.autoscaler.max), initial=0))
    if st.features.lifecycle and most > st.shapes.num_instances:
        raise ConfigError("policy.autoscaler.max_replicas", "a lane's max_replicas exceeds "
                          f"the program's {st.shapes.num_instances} instance slots (the base "
                          "configuration's max_replicas): raise the base's")
    if not (st.features.lifecycle or st.features.pd):
        active = np.asarray(params.active_instances)
        if int(np.max(active, initial=0)) > st.shapes.num_instances:
            raise ConfigError("cluster.num_instances", f"a lane has "
                              f"{int(np.max(active))} instances, more than the program's "
                              f"{st.shapes.num_instances} (the base configuration's): raise "
                              "the base's")
        if int(np.min(active, initial=st.shapes.num_instances)) < st.shapes.num_instances \
                and not st.features.sized_lanes:
            st = st.replace(sized_lanes=_check_sized(st))
    if bool(np.any(np.asarray(params.gateway.on))):
        st = with_gateway(st)
    if st.features.pd and not st.features.pd_own_index and _pd_prefix_index_twice(params):
        st = st.replace(pd_own_index=True)
    if st.settings.instance_rows:
        check_pool_rows(st, params)
    st = _with_lane_settings(st, params.settings)
    cpu = int(np.max(np.asarray(params.kv_cpu_blocks), initial=0))
    if cpu > st.shapes.cpu_tier_blocks:  # a lane sizes a CPU tier larger than the base's
        st = st.replace(cpu_tier_blocks=cpu)
    codes = {"routing": (params.routing.policy, RoutingPolicy.PROGRAM),
             "admission": (params.admission.policy, AdmissionPolicy.PROGRAM),
             "priority": (params.priority.policy, PriorityPolicy.PROGRAM)}
    st = with_program_sites(st, tuple(
        site for site in PROGRAM_SITES
        if bool(np.any(np.asarray(codes[site][0]) == int(codes[site][1])))))
    order = np.asarray(params.routing.scorer_order)
    pool_order = np.asarray(params.pd.pool_order) if st.features.pd else order
    if st.features.sessions and not st.features.session_prefix_index and (
            bool(np.any(np.asarray(params.routing.prefix_index_on)))
            or bool(np.isin(order, [int(Scorer.PREFIX_AFFINITY)]).any())
            or bool(np.isin(pool_order, [int(Scorer.PREFIX_AFFINITY)]).any())):
        st = st.replace(session_prefix_index=True)
    if st.features.cache_scorers:
        return st
    needed = bool(np.isin(order, [int(x) for x in CACHE_SCORERS]).any())
    return st.replace(cache_scorers=True) if needed else st


def _with_lane_settings(st: EngineStatic, lanes) -> EngineStatic:
    """``st`` reading each lane's own settings (``Features.lane_settings``) where some lane's
    differ from the program's (``params.LaneSettings``, stacked); a lane's running requests,
    token budget and KV blocks may not exceed the program's, whose arrays and step tables hold
    that many, except running requests where the batch slots already hold every request row
    (``EngineStatic.every_row_runs``: a larger cap is the same as the slots'); KV blocks of a
    lane's own not beside P/D pools of their own KV sizes (the program holds each instance's)."""
    for name, what in SIZED_SETTINGS.items():
        values = _effective(st, name, lanes)
        field = LANE_SETTING_FIELDS.get(name, name)
        most = int(np.max(values, initial=0))
        if most > st.field(field):
            raise ConfigError(LANE_SETTINGS[name], f"a lane's {most} exceeds the program's "
                              f"{st.field(field)} (the base configuration's: its {what}): "
                              "raise the base's")
        if _latency_reads_engine_sizes(st) and bool(np.any(values != st.field(field))):
            raise ConfigError(LANE_SETTINGS[name], "is not a per-lane knob with the physics "
                              "latency model or a model evaluated on the host "
                              f"({PHYSICS_READS_SIZES}): sweep it across calls")
    kv = _effective(st, "kv_blocks", lanes)
    if st.settings.instance_kv_blocks and bool(np.any(kv != st.shapes.kv_blocks)):
        raise ConfigError(LANE_SETTINGS["kv_blocks"], "is not a per-lane knob with P/D pools of "
                          "their own KV sizes (cluster.pd.prefill / decode): sweep it across "
                          "calls")
    if st.features.lane_settings:
        return st
    differs = any(bool(np.any(_effective(st, name, lanes)
                              != st.field(LANE_SETTING_FIELDS.get(name, name))))
                  for name in LANE_SETTINGS)
    return st.replace(lane_settings=True) if differs else st


def _effective(st: EngineStatic, name: str, lanes) -> np.ndarray:
    """The lanes' setting ``name`` as the program runs it (``static.lane_settings_run``)."""
    return np.asarray(getattr(lane_settings_run(st, lanes, np), name))


def _latency_reads_engine_sizes(st: EngineStatic) -> bool:
    """Whether the program's step times read the running requests, token budget and KV blocks
    of the base configuration: the physics model's constants (vLLM's max_num_seqs,
    max_num_batched_tokens and the GPU's KV blocks) and a model evaluated on the host are the
    base's."""
    return st.settings.latency_model == "physics" or st.features.latency is not None


def _pd_prefix_index_twice(params) -> bool:
    """Whether some lane's router prefix index sees a disaggregated request twice: P/D pools
    with shared instances (serving both roles), both pools routed with the lane's router (no
    scorers of their own) and its prefix index on. The request's prefill routing then can
    match, on a shared instance, the own prompt blocks its decode routing indexed there."""
    pd = params.pd
    shared = np.any(np.asarray(pd.role) == int(PDRole.SHARED), axis=-1)
    own = np.asarray(pd.pool_own)
    twice = (np.asarray(pd.pools) & shared & (np.asarray(pd.decider) != int(PDDecider.NEVER))
             & ~own[..., 0] & ~own[..., 1] & np.asarray(params.routing.prefix_index_on))
    return bool(np.any(twice))


#: Shapes every run of one program shares: the layout of the params (tenants) and of node
#: pools, and the router's prefix-index capacity (a setting: its LRU order evicts at it).
_SAME_SHAPES = ("num_tenants", "num_pools", "num_nodes", "num_variants",
                "prefix_index_capacity")
#: Features a program may compile in for runs that do not use them (inert there).
_ANY_FEATURES = ("pd", "lifecycle", "gateway", "cache_scorers", "sized_lanes",
                 "session_prefix_index", "pd_own_index", "open_sessions", "lane_settings")


def for_runs(runs, **capacities) -> EngineStatic:
    """One ``EngineStatic`` under which each of ``runs`` gives its own result, so that one
    compiled program serves them all (hand cases of several configurations, a sweep of
    settings across calls). A run is ``(resolved, workload)`` or ``(resolved, workload,
    params)``, its lanes' stacked ``PolicyParams`` (what they add: ``for_lanes``).

    The program takes each run's largest capacity (request rows, queues, KV blocks, ...), the
    features any run compiles in (inert in the others: a run without pools in a program with
    them), each lane's own settings that are knobs (``params.LaneSettings``) where runs differ
    in them, and lanes of their own instance count where runs differ in it (``sized_lanes``;
    not with lifecycles or P/D pools). Everything else must be the same in every run — block
    size, max-model-len, latency model, tenants, node pools, the prefix index's capacity,
    tuning — or ValueError names the field. ``capacities`` go to ``build_static`` for every
    run; decode stretches are decided once, from every run's output lengths, unless given."""
    runs = [tuple(run) for run in runs]
    if not runs:
        raise ValueError("for_runs: no runs given")
    if capacities.get("decode_stretches") is None:
        capacities["decode_stretches"] = stretches_pay_off(np.concatenate(
            [np.asarray(run[1].output_tokens) for run in runs]))
    statics = []
    for run in runs:
        st = build_static(run[0], run[1], **capacities)
        statics.append(for_lanes(st, run[2]) if len(run) > 2 else st)
    return _covering(statics)


def _covering(statics: list[EngineStatic]) -> EngineStatic:
    """The smallest ``EngineStatic`` covering every one of ``statics`` (``for_runs``)."""
    base = statics[0]
    per_lane = {LANE_SETTING_FIELDS.get(name, name) for name in LANE_SETTINGS}
    changes: dict = {}
    for name, group in FIELD_GROUP.items():
        values = [st.field(name) for st in statics]
        if all(v == values[0] for v in values):
            continue
        if name in per_lane:
            changes[name], changes["lane_settings"] = max(values), True
        elif name == "num_instances" and not (base.features.lifecycle or base.features.pd):
            changes[name], changes["sized_lanes"] = max(values), _check_sized(base)
        elif group == "shapes" and name not in _SAME_SHAPES or name == "running_width":
            changes[name] = max(values)
        elif name in _ANY_FEATURES:
            changes[name] = changes.get(name, False) or any(values)
        elif name == "program_sites":
            changes[name] = tuple(x for x in PROGRAM_SITES if any(x in v for v in values))
        else:
            raise ValueError(f"runs differ in {name} ({sorted(set(map(str, values)))}): they "
                             "cannot share one program")
    return base.replace(**changes)
