"""Host API of the JAX engine: run one lane or a population of lanes in lockstep.

The compiled program is one ``lax.while_loop`` whose body advances every lane through its
cheap events up to and including its next step (``vmap`` of ``lane_advance``); finished lanes
idle until the slowest lane is done. A device with more than ``LANE_BLOCK`` lanes runs them as
consecutive blocks (``lax.map``), each its own loop: a block's state stays cache-sized and its
lanes idle only until the block's slowest is done. With a CPU tier the blocks are smaller and
hold lanes of similar tier sizes (``TIERED_LANE_BLOCK``).

Counterpart: ``blisjax.reference.cluster.simulate`` (``simulate`` here); each lane's
``RunResult`` is read from its final state by ``results.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

from blisjax.config.codes import AdmissionPolicy  # noqa: E402
from blisjax.engine import progcache  # noqa: E402
from blisjax.engine.cluster import lane_advance, next_event  # noqa: E402
from blisjax.engine.consts import build_consts, check_gpus, lane_consts  # noqa: E402
from blisjax.engine.initial import init_state  # noqa: E402
from blisjax.engine.lanes import FLAT_MIN_LANES, release_queued  # noqa: E402
from blisjax.engine.latency_rows import for_hardware  # noqa: E402
from blisjax.engine.lockstep import LANES  # noqa: E402
from blisjax.engine.params import (  # noqa: E402
    PolicyParams,
    fit_instances,
    params_from_config,
    stack_params,
)
from blisjax.engine.results import HostLanes, lane_result, own_clusters  # noqa: E402
from blisjax.engine.static import EngineStatic, build_static, lane_settings_run  # noqa: E402
from blisjax.engine.static_lanes import for_lanes  # noqa: E402
from blisjax.metrics import records  # noqa: E402

# Lanes per lockstep loop on a CPU device: 32–128 lanes cost about the same per lane-event, and
# far larger loops miss the cache (docs/performance.md, What the engine does for speed; Ideas
# tried).
LANE_BLOCK = 64
# On an accelerator every lane of a device runs in one loop: a loop iteration costs the same
# kernel launches at 64 lanes or thousands, so consecutive blocks would only multiply them.
ACCELERATOR_LANE_BLOCK = 1 << 20
# Lanes per loop on a CPU device for a population with CPU tiers smaller than a GPU cache. A
# lane whose tier is smaller than a mirror pass's distinct blocks takes the pass's exact
# stack-distance path (``kvtier._pass_stores``, work per lane) at nearly every step, and a
# block runs it whenever one of its lanes needs it; so such populations run in small blocks
# whose lanes are ordered by tier size (``_lane_order``): thrashing tiers share their blocks
# (docs/performance.md, A population of CPU tiers).
TIERED_LANE_BLOCK = 2
# A lone lane on a CPU device whose program this process compiles for itself (no program
# cache) runs beside a copy of itself: XLA:CPU compiles the engine's program markedly faster
# with two entries on the lane axis than with one, and the copy, whose events are the lane's
# own, only widens each vector to two. A program stored in the program cache keeps one lane:
# later runs load it, and would pay for the copy every time (docs/performance.md, Seconds to a
# first result).
CPU_LONE_LANE_COPIES = 2


def default_lane_block(devices=None, st: EngineStatic | None = None,
                       params: PolicyParams | None = None) -> int:
    """Lanes per lockstep loop where ``lane_block`` is not given: ``ACCELERATOR_LANE_BLOCK``
    (all of a device's lanes in one loop) unless every device is a CPU; there
    ``TIERED_LANE_BLOCK`` for a program ``st`` with a CPU tier where some lane of ``params``
    (None: any) has a tier smaller than the GPU's KV cache (``small_tiers``), else
    ``LANE_BLOCK``. ``devices``: default, JAX's local devices."""
    devices = jax.local_devices() if devices is None else devices
    if not _all_cpus(devices):
        return ACCELERATOR_LANE_BLOCK
    if st is not None and st.tiered and (params is None or small_tiers(st, params)):
        return TIERED_LANE_BLOCK
    return LANE_BLOCK


def _all_cpus(devices) -> bool:
    return all(d.platform == "cpu" for d in devices)


def small_tiers(st: EngineStatic, params: PolicyParams) -> bool:
    """Whether some lane has a CPU tier smaller than an instance's GPU blocks: a mirror pass
    can then hold more distinct blocks than the tier (it thrashes); a bigger tier never
    evicts a pass's own blocks before they recur."""
    tiers = np.asarray(params.kv_cpu_blocks)
    return bool(np.any((tiers > 0) & (tiers < st.shapes.kv_blocks)))


def _lane_blocks(lanes: int, block: int) -> tuple[int, int]:
    """(blocks, lanes per block) for ``lanes`` lanes of one device: as few blocks as possible
    of at most ``block`` lanes, sized evenly so padding is under one lane per block."""
    count = max(1, -(-lanes // block))
    return count, -(-lanes // count)


def _run_local(st: EngineStatic, lane_block: int, consts, params: PolicyParams):
    """The lanes of one device, at most ``lane_block`` at a time (the lane count is a multiple
    of the block size chosen by ``_lane_blocks``; ``_placement`` pads it)."""
    lanes = int(params.admission.policy.shape[0])
    count, size = _lane_blocks(lanes, lane_block)
    if count == 1:
        return _run_block(st, consts, params)
    order = _lane_order(st, params)
    if order is not None:
        params = jax.tree_util.tree_map(lambda x: x[order], params)
    blocks = jax.tree_util.tree_map(lambda x: x.reshape(count, size, *x.shape[1:]), params)
    out = jax.lax.map(lambda p: _run_block(st, consts, p), blocks)
    out = jax.tree_util.tree_map(lambda x: x.reshape(lanes, *x.shape[2:]), out)
    if order is None:
        return out
    back = jnp.zeros_like(order).at[order].set(jnp.arange(lanes, dtype=order.dtype))
    return jax.tree_util.tree_map(lambda x: x[back], out)


def _lane_order(st: EngineStatic, params: PolicyParams):
    """The order in which a device's lanes are cut into blocks, or None (as given): with a
    CPU tier, by tier size (stable), so that lanes whose small tiers take the mirror pass's
    exact path at every step share their blocks. Lanes are independent: the order changes no
    lane's results, only which lanes wait for which."""
    if not st.tiered:
        return None
    return jnp.argsort(params.kv_cpu_blocks, stable=True)


def _initial_states(st: EngineStatic, params: PolicyParams):
    """Each lane's state before its first event (``params`` stacked)."""
    return jax.vmap(lambda p: init_state(
        st, p.admission.tb_capacity, p.admission.rl_burst, p.admission.policy,
        AdmissionPolicy.RATE_LIMIT, router_rng=p.routing.router_rng,
        kv_cpu_blocks=p.kv_cpu_blocks, kv_reload_us=p.kv_reload_us, pd_rng=p.pd.pool_rng,
        pd_role=p.pd.role, pd_pools=p.pd.pools, params=p))(params)


def state_bytes_per_lane(st: EngineStatic, params: PolicyParams) -> int:
    """Bytes of one lane's simulation state (shapes only: nothing is computed)."""
    one = jax.tree_util.tree_map(lambda x: x[:1], params)
    shapes = jax.eval_shape(lambda p: _initial_states(st, p), one)
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))


# Device memory of a population over its lanes' states when no compiled program's footprint
# is at hand: a margin over the peak measured on a GPU (docs/performance.md, On a GPU).
MEMORY_PER_STATE = 1.3
_ALLOCATOR_NOTE = ("JAX's allocator takes 75 % of a GPU's memory unless "
                   "XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise")


def _device_limit(placed: Placement, limit_bytes: int | None) -> int | None:
    """Memory of one device in bytes: ``limit_bytes``, else what the first device reports
    (accelerators do; a CPU reports none)."""
    if limit_bytes is not None:
        return limit_bytes
    return (placed.devices[0].memory_stats() or {}).get("bytes_limit")


def _lanes_per_device(placed: Placement) -> int:
    """Lanes one device holds, padding included."""
    return int(np.shape(placed.params.admission.policy)[0]) // len(placed.devices)


def _refuse(placed: Placement, need: float, limit_bytes: int, what: str) -> None:
    """Raise the population's memory refusal: ``need`` bytes per device, ``what`` they are."""
    share = _lanes_per_device(placed)
    fit = int(limit_bytes * share // need) * len(placed.devices)
    gib = 1 << 30
    raise ValueError(
        f"population: {placed.lanes} lanes need about {need / gib:.1f} GiB per device "
        f"({what}, {share} lanes per device), and a device holds {limit_bytes / gib:.1f} GiB: "
        f"at most {fit} lanes fit in one call on {len(placed.devices)} "
        f"device{'s' if len(placed.devices) > 1 else ''}; split the population over several "
        f"calls ({_ALLOCATOR_NOTE})")


def check_memory(st: EngineStatic, placed: Placement, limit_bytes: int | None = None, *,
                 factor: float = 1.0) -> None:
    """Refuse, before compiling, a population whose lane states times ``factor`` cannot fit in
    one device's memory (``limit_bytes``, default what the device reports; a CPU reports none
    and is not checked). Where the compiled program is at hand its whole footprint is checked
    before it runs (``check_program_memory``) and ``factor`` is 1: the states alone; where jit
    compiles and runs at once, ``MEMORY_PER_STATE``."""
    limit_bytes = _device_limit(placed, limit_bytes)
    if limit_bytes is None:
        return
    per_lane = state_bytes_per_lane(st, placed.params)
    need = int(np.ceil(factor * per_lane * _lanes_per_device(placed)))
    if need > limit_bytes:
        what = f"{per_lane / 1e6:.2f} MB of state per lane"
        _refuse(placed, need, limit_bytes, what if factor == 1.0 else f"{factor}× {what}")


def program_bytes(compiled) -> int | None:
    """Device memory one device needs to run ``compiled`` (a ``jax.stages.Compiled``): its
    arguments, outputs and temporaries as XLA's buffer assignment sizes them, less what
    outputs share with arguments; ``None`` when XLA reports no analysis."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 -- a backend or a deserialized program without one
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def check_program_memory(compiled, st: EngineStatic, placed: Placement,
                         limit_bytes: int | None = None) -> None:
    """Refuse to run a compiled population program that cannot fit in one device's memory:
    its footprint from XLA (``program_bytes``), else ``MEMORY_PER_STATE`` times the states."""
    limit_bytes = _device_limit(placed, limit_bytes)
    if limit_bytes is None:
        return
    need = program_bytes(compiled)
    what = "the compiled program's states and temporaries"
    if need is None:
        need = int(np.ceil(MEMORY_PER_STATE * state_bytes_per_lane(st, placed.params)
                           * _lanes_per_device(placed)))
        what = f"{MEMORY_PER_STATE}× the lanes' states"
    if need > limit_bytes:
        _refuse(placed, need, limit_bytes, what)


def _run_block(st: EngineStatic, consts, params: PolicyParams):
    """One block of lanes: one ``while_loop``; each iteration advances every lane through its
    next step (``lane_advance``)."""
    if st.features.lane_settings:  # the lanes' settings as run, once before the loop
        params = params.replace(settings=lane_settings_run(st, params.settings))
    init = _initial_states(st, params)
    # With enough lanes, completions queue their releases and the queues of all lanes run
    # as one pass per iteration (``lanes.release_queued``); a few lanes release in place.
    defer = int(params.admission.policy.shape[0]) >= FLAT_MIN_LANES
    advance = jax.vmap(lambda s, ev, p: lane_advance(s, ev, st, lane_consts(st, consts, p), p,
                                                     defer), axis_name=LANES)

    def cond(carry):
        return ~jnp.all(carry[0].run.done)

    def body(carry):
        s, ev = advance(*carry, params)
        return (release_queued(s, st) if defer else s), ev

    first = jax.vmap(lambda s, p: next_event(s, st, lane_consts(st, consts, p)))(init, params)
    return jax.lax.while_loop(cond, body, (init, first))[0]


def _run_devices(st: EngineStatic, consts, params: PolicyParams, devices: tuple,
                 lane_block: int):
    if len(devices) == 1:
        return _run_local(st, lane_block, consts, params)
    mesh = Mesh(np.array(devices), ("devices",))
    # Each device runs its own event loop over its share of the lanes (no per-event sync).
    return jax.shard_map(functools.partial(_run_local, st, lane_block), mesh=mesh,
                         in_specs=(PartitionSpec(), PartitionSpec("devices")),
                         out_specs=PartitionSpec("devices"), check_vma=False)(consts, params)


#: Short runs on CPUs are compiled without XLA's loop-invariant code motion and while-loop
#: simplifier, which XLA:CPU runs to a fixed point over every nested loop of the program:
#: ~40 % less XLA compile time for a small tiered program with lifecycles, ~15 % for scenario
#: S, at ~3–4 % more run time (docs/performance.md, "Short runs"). A run is short when its
#: lanes × requests are at most ``SHORT_RUN_REQUEST_LANES`` (a single run of BLIS's anchor
#: trace is; a population of 64 lanes over 2,000 requests is not). The passes only optimise:
#: both programs compute the same values.
#: Not used: ``xla_cpu_copy_insertion_use_region_analysis`` removes most full-array copies in
#: inner loops but produced wrong results on parity edge cases (preemption-storm, horizon-cut)
#: with jax 0.10.2 — an unsafe in-place update. Parity first; ``lockstep.after_reads`` avoids
#: the copies.
SHORT_RUN_COMPILER_OPTIONS = {
    "xla_disable_hlo_passes": "while-loop-invariant-code-motion,simplify-while-loops"}
SHORT_RUN_REQUEST_LANES = 20_000


def short_run(st: EngineStatic, lanes: int, devices: tuple) -> bool:
    """Whether a run of ``lanes`` lanes of ``st`` on ``devices`` is compiled as a short run
    (``SHORT_RUN_COMPILER_OPTIONS``): every device a CPU, lanes × requests at most
    ``SHORT_RUN_REQUEST_LANES``."""
    return _all_cpus(devices) and lanes * st.shapes.num_requests <= SHORT_RUN_REQUEST_LANES


class _Program:
    """The engine's jitted program (``_run_devices``; static: the ``EngineStatic``, the
    devices and the lane block): short runs (``short_run``) compiled with
    ``SHORT_RUN_COMPILER_OPTIONS``, the others with XLA's defaults."""

    def __init__(self, fn: Callable):
        self._short = jax.jit(fn, static_argnums=(0, 3, 4),
                              compiler_options=SHORT_RUN_COMPILER_OPTIONS)
        self._long = jax.jit(fn, static_argnums=(0, 3, 4))

    def _for(self, st: EngineStatic, params: PolicyParams, devices: tuple):
        lanes = int(params.admission.policy.shape[0])
        return self._short if short_run(st, lanes, devices) else self._long

    def __call__(self, st: EngineStatic, consts, params: PolicyParams, devices: tuple,
                 lane_block: int):
        return self._for(st, params, devices)(st, consts, params, devices, lane_block)

    def lower(self, st: EngineStatic, consts, params: PolicyParams, devices: tuple,
              lane_block: int):
        return self._for(st, params, devices).lower(st, consts, params, devices, lane_block)

    def _cache_size(self) -> int:
        return self._short._cache_size() + self._long._cache_size()


_run_sharded = _Program(_run_devices)


class Placement(NamedTuple):
    """Where a population runs (``_placement``)."""

    devices: tuple  # the devices used
    params: PolicyParams  # the population, padded to a whole number of lane blocks per device
    lanes: int  # the population's own lane count (its first lanes)
    lane_block: int  # lanes per lockstep loop (at most a device's share)


def _placement(st: EngineStatic, params: PolicyParams, devices,
               lane_block: int | None) -> Placement:
    """Lanes split evenly over the devices, each device's share a whole number of lane blocks
    (``lane_block`` lanes at most; ``None``: ``default_lane_block`` for ``st``); a population
    is padded with copies of its last lane (their results are dropped), and a lone lane on a
    CPU device beside ``CPU_LONE_LANE_COPIES - 1`` copies where its program is not cached
    (``progcache.cacheable``) and ``lane_block`` is not 1."""
    devices = tuple(jax.local_devices() if devices is None else devices)
    if lane_block is None:
        lane_block = default_lane_block(devices, st, params)
    if lane_block < 1:
        raise ValueError(f"lane_block must be >= 1, got {lane_block}")
    lanes = int(np.shape(params.admission.policy)[0])
    devices = devices[:max(min(lanes, len(devices)), 1)]
    count, size = _lane_blocks(-(-lanes // len(devices)), lane_block)
    if count * size == 1 and lane_block > 1 and _all_cpus(devices) \
            and not progcache.cacheable(st):
        size = CPU_LONE_LANE_COPIES
    pad = count * size * len(devices) - lanes
    if pad:
        params = jax.tree_util.tree_map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]), params)
    return Placement(devices, params, lanes, min(lane_block, count * size))


_MAPS = "/proc/self/maps"
_MAP_LIMIT = "/proc/sys/vm/max_map_count"


def _count_lines(path: str) -> int | None:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux, or /proc not mounted: nothing to guard
        return None


def mapping_headroom_guard(fraction: float = 0.5) -> bool:
    """Drop JAX's compiled programs when the process holds more than ``fraction`` of Linux's
    memory-mapping limit; returns whether it did.

    Each engine program XLA:CPU compiles keeps ~2,000–3,000 memory mappings, and past
    ``vm.max_map_count`` (65,530 by default) XLA aborts the whole process inside the next
    compilation (measured: the ~25th program of one process). Programs are cheap to rebuild
    next to an abort, so a long-lived process (a search loop over many shapes, a pytest
    run) is guarded before every engine run; reading the map costs a few milliseconds.
    """
    used = _count_lines(_MAPS)
    if used is None:
        return False
    try:
        with open(_MAP_LIMIT) as f:
            limit = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        limit = 65_530  # Linux's default
    if used <= fraction * limit:
        return False
    jax.clear_caches()
    progcache.forget_loaded()
    return True


def run_lanes(st: EngineStatic, consts, params: PolicyParams, devices=None,
              lane_block: int | None = None):
    """Simulate a population (``params`` has a leading lane axis) on ``devices`` (default: all
    local devices), at most ``lane_block`` lanes per lockstep loop. Returns the final states,
    one per lane.

    When the population was padded (its size is not a whole number of equal lane blocks per
    device) the padding is sliced off on the devices, which copies every lane's state
    (docs/performance.md, What the engine does for speed); ``simulate_population`` reads the
    padded states in place instead."""
    final, lanes = _run_padded(st, consts, params, devices, lane_block)
    return _drop_padding(final, lanes)


def _run_padded(st: EngineStatic, consts, params: PolicyParams, devices,
                lane_block: int | None,
                phase: Callable[[str], None] | None = None):
    """(final states including any padding lanes, the population's own lane count): its first
    lanes are the population's. ``phase``, if given, is told "compiling …" and then
    "running …" (the program is then lowered and compiled explicitly, so the two are apart).
    With the program cache on (``progcache``) the compiled program comes from there."""
    mapping_headroom_guard()
    st = for_lanes(st, params)
    check_gpus(st, consts, params)
    params = _fit_instances(st, params)
    placed = _placement(st, params, devices, lane_block)
    jit_only = phase is None and not progcache.cacheable(st)  # jit's own in-process cache
    # jit compiles and runs at once, leaving no program to ask: a margin over the states
    check_memory(st, placed, factor=MEMORY_PER_STATE if jit_only else 1.0)
    lanes = placed.lanes
    if jit_only:
        return _run_sharded(st, consts, placed.params, placed.devices, placed.lane_block), lanes
    if phase is not None:
        phase("compiling the JAX program (or loading it from the compile cache)")

    def lower():
        return _run_sharded.lower(st, consts, placed.params, placed.devices, placed.lane_block)

    def running(compiled):
        check_program_memory(compiled, st, placed)
        if phase is not None:
            phase(f"running {lanes} lane{'s' if lanes != 1 else ''} of {st.shapes.num_requests} "
                  "requests")

    final = progcache.run_program(st, lower, (consts, placed.params), placed.devices,
                                  placed.lane_block, running)
    return final, lanes


def _fit_instances(st: EngineStatic, params: PolicyParams) -> PolicyParams:
    """Stacked ``params`` with their per-instance fields as wide as the program's instances
    (``params.fit_instances``: a population whose lanes all have fewer stacks them narrower),
    the padded fields put on the device as they are."""
    fitted = fit_instances(params, st.shapes.num_instances)
    if fitted is params:
        return params
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, fitted)


def _drop_padding(final, lanes: int):
    """The first ``lanes`` lanes; without padding the states themselves (a slice copies every
    field)."""
    if int(final.run.done.shape[0]) == lanes:
        return final
    return jax.tree_util.tree_map(lambda x: x[:lanes], final)


def compile_lanes(st: EngineStatic, consts, params: PolicyParams, devices=None,
                  lane_block: int | None = None):
    """Compile once for these shapes (for timing compilation apart); returns ``run(consts,
    params)`` that behaves like ``run_lanes`` for populations of the same size."""
    mapping_headroom_guard()
    st = for_lanes(st, params)
    check_gpus(st, consts, params)
    params = _fit_instances(st, params)
    placed = _placement(st, params, devices, lane_block)
    check_memory(st, placed)
    block = placed.lane_block
    compiled = progcache.compiled_program(
        st, lambda: _run_sharded.lower(st, consts, placed.params, placed.devices, block),
        (consts, placed.params), placed.devices, block).compiled
    check_program_memory(compiled, st, placed)

    def run(consts, params):
        if for_lanes(st, params) != st:
            raise ValueError("these params list a scorer the compiled program does not "
                             "evaluate (precise-prefix-cache or no-hit-lru, which read the "
                             "instances' caches, or with closed-loop sessions prefix-affinity): "
                             "compile with params that list it")
        check_gpus(st, consts, params)
        again = _placement(st, _fit_instances(st, params), placed.devices, block)
        return _drop_padding(compiled(consts, again.params), again.lanes)

    return run


def _empty_result(resolved, workload) -> records.RunResult:
    """A run without requests: no event ever happens, so its result is the reference engine's
    (computed in microseconds); nothing is compiled."""
    from blisjax.reference import simulate as reference_simulate

    return reference_simulate(resolved, workload)


def simulate(resolved, workload, params: PolicyParams | None = None,
             phase: Callable[[str], None] | None = None, **capacities):
    """Run the JAX engine once (one lane); returns a ``RunResult`` like the reference engine.
    ``phase``: optional progress callback, told when compiling and running start.

    One lane compiles its step and release programs at full width only
    (``narrow_programs=False`` unless told otherwise): the narrower copies that pay off across
    a population make a single run's program several times larger and slower to load from the
    program cache, for a run hardly faster (docs/performance.md, Seconds to a first result)."""
    capacities.setdefault("narrow_programs", False)
    st = build_static(resolved, workload, **capacities)
    if st.shapes.num_requests == 0:
        return _empty_result(resolved, workload)
    if params is None:
        params = params_from_config(resolved.config, workload.tenant_names)
    st = for_hardware(st, resolved, workload, params)
    consts = build_consts(resolved, workload, st)
    final, _ = _run_padded(st, consts, stack_params([params]), None, None, phase)
    return own_clusters(st, [lane_result(st, consts, final, 0)], params)[0]


def simulate_population(resolved, workload, params: PolicyParams, static=None,
                        lane_block: int | None = None,
                        phase: Callable[[str], None] | None = None, **capacities):
    """Run a stacked population of params; returns one ``RunResult`` per lane. ``static``: a
    prebuilt ``EngineStatic`` (e.g. ``build_static_shared`` over several workloads, so they
    share one compiled program); default: built for this workload from ``capacities``.
    ``lane_block``: lanes per lockstep loop (see ``run_lanes``). ``phase``: told when
    compiling (or loading from the program cache) and running start, e.g. ``print``."""
    st = static if static is not None else build_static(resolved, workload, **capacities)
    if workload.num_requests == 0:
        if lane_block is not None and lane_block < 1:
            raise ValueError(f"lane_block must be >= 1, got {lane_block}")
        lanes = int(np.shape(params.admission.policy)[0])
        return [_empty_result(resolved, workload) for _ in range(lanes)]
    st = for_hardware(st, resolved, workload, params)
    consts = build_consts(resolved, workload, st)
    # padding lanes (if any) are skipped on the host, not sliced off on the devices
    final, lanes = _run_padded(st, consts, params, None, lane_block, phase)
    host = HostLanes(final)
    return own_clusters(st, [lane_result(st, consts, host, k) for k in range(lanes)], params)
