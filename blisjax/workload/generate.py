"""Synthetic workload generation from a ``WorkloadSpec`` (docs/semantics.md §8).

Per client ``c`` (rate ``aggregate_rate * fraction_c / S_c / 1e6`` req/µs, where ``S_c`` sums the
fractions of the clients active together with ``c``; see ``client_rates_per_us``):

1. inter-arrival times (IATs, integer µs >= 1) from ``stream("workload", c, "arrival")``; the
   first arrival is the first IAT, arrivals are cumulative sums, generation stops at the first
   arrival >= horizon, and at most ``2 * num_requests`` requests per client when a count is set;
   a client with a lifecycle draws the same arrivals, keeps only those inside one of its windows
   ``[start_us, end_us)`` (the cap counts kept ones) and also stops at the first arrival >= its
   largest ``end_us`` (BLIS ``GenerateRequests``);
2. the k-th kept request's input length is the k-th draw of ``stream("workload", c, "input")``,
   its output length the k-th draw of ``stream("workload", c, "output")``.

Three streams per client, keyed by the client's index, make generation isolated: changing one
client's token distribution never moves an arrival, and appending a client never changes any
draw of the existing ones. All requests are then stably sorted by arrival (ties in client
order), truncated to ``num_requests`` and numbered 0..N-1 in that order.

Adversarial patterns (``spec.adversarial``, pattern ``j``; docs/configuration.md, ``workload``)
add requests after the clients': a synchronized burst or tenant surge adds, per targeted client
``c``, requests drawn from ``stream("workload", "adversarial", j, c, "arrival" | "input" |
"output")`` with ``c``'s labels; a long-prompt flood is a client of its own (labels after the
clients') with streams ``("workload", "adversarial", j, "arrival" | ...)``. The clients' own
streams are untouched, so a spec with patterns generates every request of the spec without
them, plus the patterns' requests (before the ``num_requests`` truncation). Ties in arrival
keep the clients' requests first, then the patterns' in list order.

Concurrency clients (``ClientSpec.concurrency``, ``_Users``, ``_with_users``) have no rate:
their users' first requests join after the truncation to ``num_requests`` while it leaves
room, and each user's later requests are follow-up rows of a session of its own, drawn in order
from ``stream("workload", c, "user", u, "input" | "output")``.

Statistical parity with BLIS only (numpy streams, not Go's ``math/rand``; docs/semantics.md Decision 10).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from blisjax.workload.adversarial import (
    LongPromptFlood,
    SynchronizedBurst,
    TenantSurge,
    pattern_targets,
)
from blisjax.workload.clients import ArrivalSpec, ClientSpec, LifecycleSpec
from blisjax.workload.lengths import sample_lengths
from blisjax.workload.rng import DEFAULT_SEED, PartitionedRNG
from blisjax.workload.spec import WorkloadSpec
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, NO_PREFIX_GROUP, SLO_CLASS_CODE, Workload

#: BLIS floors a client's rate here (req/µs) to avoid dividing by zero.
_MIN_RATE_PER_US = 1e-15
#: Float samples are clipped to this before integer conversion: no overflow, and any realistic
#: horizon ends generation long before an IAT this large (2**53 µs ≈ 285 years).
_MAX_FLOAT_TICKS = float(2**53)
_INT64_MAX = np.iinfo(np.int64).max
#: Gamma shapes below this fall back to Poisson (BLIS; the sampler degenerates for CV > 10).
_MIN_GAMMA_SHAPE = 0.01
#: Largest number of IATs drawn in one vectorised chunk.
_MAX_CHUNK = 1 << 22


# --------------------------------------------------------------------------- rounding


def _to_ticks(x: np.ndarray) -> np.ndarray:
    """Truncate float µs toward zero (Go ``int64(x)``), at least 1, as int64."""
    return np.clip(np.trunc(x), 1.0, _MAX_FLOAT_TICKS).astype(np.int64)


# --------------------------------------------------------------------------- arrival processes


def weibull_shape_from_cv(target_cv: float) -> float:
    """Weibull k with CV(k) = target, by bisection on [0.1, 100] to |CV - target| < 1e-3 (BLIS).

    CV(k)^2 = Γ(1 + 2/k) / Γ(1 + 1/k)^2 - 1 decreases in k. At most 100 halvings; if the
    tolerance is never met (target outside CV([0.1, 100])) the last midpoint is returned.
    """
    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        cv = weibull_cv(mid)
        if abs(cv - target_cv) < 1e-3:
            return mid
        if cv > target_cv:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def weibull_cv(k: float) -> float:
    """Coefficient of variation of a Weibull distribution with shape ``k``."""
    g1 = math.gamma(1.0 + 1.0 / k)
    g2 = math.gamma(1.0 + 2.0 / k)
    return math.sqrt(g2 / (g1 * g1) - 1.0)


def _gamma_params(arrival: ArrivalSpec, mean_us: float) -> tuple[float, float]:
    cv = arrival.cv if arrival.cv is not None else 1.0
    shape = arrival.shape if arrival.shape is not None else 1.0 / (cv * cv)
    # Default scale keeps the mean IAT at 1/rate (equals cv²/rate for the cv-derived shape).
    scale = arrival.scale if arrival.scale is not None else mean_us / shape
    return shape, scale


def _weibull_params(arrival: ArrivalSpec, mean_us: float) -> tuple[float, float]:
    cv = arrival.cv if arrival.cv is not None else 1.0
    k = arrival.shape if arrival.shape is not None else weibull_shape_from_cv(cv)
    scale = arrival.scale if arrival.scale is not None else mean_us / math.gamma(1.0 + 1.0 / k)
    return k, scale


def sample_iats(
    arrival: ArrivalSpec, rate_per_us: float, rng: np.random.Generator, n: int
) -> np.ndarray:
    """``n`` inter-arrival times in integer µs (>= 1, int64) for a client at ``rate_per_us``.

    poisson: trunc(Exp(1) / rate). constant: trunc(1 / rate), no draws. gamma: Gamma(shape,
    scale), shape 1/cv² and mean 1/rate unless given; shape < 0.01 falls back to Poisson.
    weibull: scale * Weibull(k), k from cv by bisection, scale = mean / Γ(1 + 1/k).
    bursty: Pareto(alpha) with x_m = mean * (alpha - 1) / alpha, so the mean stays 1/rate.
    periodic: period (default 1/rate) + Uniform(-jitter, +jitter). All truncated toward zero.
    """
    rate = max(rate_per_us, _MIN_RATE_PER_US)
    mean_us = 1.0 / rate
    process = arrival.process
    if process == "gamma":
        shape, scale = _gamma_params(arrival, mean_us)
        if shape < _MIN_GAMMA_SHAPE:
            process = "poisson"
        else:
            return _to_ticks(rng.gamma(shape, scale, n))
    if process == "poisson":
        return _to_ticks(rng.standard_exponential(n) / rate)
    if process == "constant":
        return np.full(n, max(1, int(1.0 / rate)), dtype=np.int64)
    if process == "weibull":
        k, scale = _weibull_params(arrival, mean_us)
        return _to_ticks(scale * rng.weibull(k, n))
    if process == "bursty":
        alpha = arrival.pareto_alpha
        x_m = mean_us * (alpha - 1.0) / alpha
        # numpy's pareto() is Lomax (Pareto II); 1 + Lomax is Pareto I with x_m = 1.
        return _to_ticks(x_m * (1.0 + rng.pareto(alpha, n)))
    if process == "periodic":
        period = float(arrival.period_us) if arrival.period_us is not None else mean_us
        if arrival.jitter_us == 0:
            return np.full(n, max(1, int(period)), dtype=np.int64)
        jitter = float(arrival.jitter_us)
        return _to_ticks(period + rng.uniform(-jitter, jitter, n))
    raise ValueError(f"arrival.process: unknown value {arrival.process!r}")


def _cumulative(start_us: int, iats: np.ndarray, horizon_us: int) -> np.ndarray:
    """Arrival times ``start + cumsum(iats)`` strictly below the horizon, without overflow."""
    if float(start_us) + float(iats.sum(dtype=np.float64)) < 2.0**62:
        times = start_us + np.cumsum(iats)
        return times[: int(np.searchsorted(times, horizon_us, side="left"))]
    # Pathological IATs: exact Python integers, stopping at the horizon.
    out: list[int] = []
    t = start_us
    for iat in iats.tolist():
        t += iat
        if t >= horizon_us:
            break
        out.append(t)
    return np.asarray(out, dtype=np.int64)


def client_arrivals(
    arrival: ArrivalSpec,
    rate_per_us: float,
    rng: np.random.Generator,
    horizon_us: int | None,
    max_requests: int | None,
    lifecycle: LifecycleSpec | None = None,
) -> np.ndarray:
    """One client's arrival times (int64 µs, increasing): first arrival = first IAT.

    Stops at the first arrival >= ``horizon_us`` (None = no limit) or after ``max_requests``.
    With a ``lifecycle``, the same arrivals are drawn but only those inside a window are kept
    (``max_requests`` counts kept arrivals), and drawing also stops at the first arrival >= the
    largest window end. IATs are drawn in growing vectorised chunks; numpy draws element by
    element, so the result does not depend on the chunking.
    """
    if horizon_us is None and max_requests is None and lifecycle is None:
        raise ValueError("client_arrivals: needs a horizon, a request cap or a lifecycle")
    horizon = _INT64_MAX if horizon_us is None else int(horizon_us)
    if lifecycle is not None:
        horizon = min(horizon, lifecycle.end_us)
    bounded = horizon_us is not None or lifecycle is not None
    expected = horizon * rate_per_us if bounded else float(max_requests or 0)
    chunk = int(min(expected * 1.05 + 16, _MAX_CHUNK))
    parts: list[np.ndarray] = []
    t, count = 0, 0
    # Without windows every drawn arrival is kept, so a chunk never needs to pass the cap.
    uncapped = max_requests is None or lifecycle is not None
    while max_requests is None or count < max_requests:
        n = chunk if uncapped else min(chunk, max_requests - count)
        iats = sample_iats(arrival, rate_per_us, rng, n)
        times = _cumulative(t, iats, horizon)
        crossed = times.size < n  # crossed the horizon inside this chunk
        if not crossed:
            t = int(times[-1])
        if lifecycle is not None:
            times = times[lifecycle.contains(times)]
        parts.append(times)
        count += times.size
        if crossed:
            break
        chunk = min(chunk * 2, _MAX_CHUNK)
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return out if max_requests is None else out[:max_requests]


# --------------------------------------------------------------------------- workload assembly


def lifecycles_overlap(a: LifecycleSpec | None, b: LifecycleSpec | None) -> bool:
    """Whether two clients are ever active at the same time (None = always active)."""
    return a is None or b is None or a.overlaps(b)


def client_rates_per_us(spec: WorkloadSpec) -> np.ndarray:
    """Per-client rate in requests/µs (BLIS ``normalizeRateFractions``).

    Client ``c`` gets ``aggregate * (fraction_c / S_c) / 1e6`` where ``S_c`` is the sum, in client
    order, of the fractions of every client whose lifecycle overlaps ``c``'s (``c`` included; a
    client without a lifecycle overlaps every client). Without lifecycles ``S_c`` is the sum of
    all fractions. The rate is constant: it does not change as other clients' windows open and
    close.
    """
    rates = []
    for c in spec.clients:
        if c.concurrency:  # its users send at their own pace (``_with_users``)
            rates.append(0.0)
            continue
        total = sum(
            o.rate_fraction for o in spec.clients if lifecycles_overlap(c.lifecycle, o.lifecycle)
        )
        rates.append(spec.aggregate_rate * (c.rate_fraction / total) / 1e6)
    return np.array(rates)


# --------------------------------------------------------------------------- adversarial patterns


def burst_instants(
    burst: SynchronizedBurst, horizon_us: int | None, max_bursts: int | None = None
) -> np.ndarray:
    """The instants of a synchronized burst (int64 µs, increasing).

    ``start_us + k * period_us`` for k = 0, 1, … while k < ``count`` (and < ``max_bursts``) and
    the instant is < ``end_us`` and < ``horizon_us``; a single instant when ``period_us`` is None.
    """
    stop = _INT64_MAX
    for bound in (burst.end_us, horizon_us):
        if bound is not None:
            stop = min(stop, int(bound))
    start = int(burst.start_us)
    if start >= stop:
        return np.zeros(0, dtype=np.int64)
    if burst.period_us is None:
        return np.array([start], dtype=np.int64)
    period = int(burst.period_us)
    n = -(-(stop - start) // period)  # instants below stop: ceil((stop - start) / period)
    for bound in (burst.count, max_bursts):
        if bound is not None:
            n = min(n, int(bound))
    if stop == _INT64_MAX and burst.count is None and max_bursts is None:
        raise ValueError("burst_instants: a repeating burst needs count, end_us or a horizon")
    return start + period * np.arange(n, dtype=np.int64)


def window_arrivals(
    arrival: ArrivalSpec,
    rate_per_us: float,
    rng: np.random.Generator,
    start_us: int,
    end_us: int,
    horizon_us: int | None,
    max_requests: int | None = None,
) -> np.ndarray:
    """Arrivals of a process that starts at ``start_us`` (first arrival = start + first IAT)
    and stops at the first arrival >= ``end_us`` or >= ``horizon_us`` (int64 µs, increasing)."""
    stop = int(end_us) if horizon_us is None else min(int(end_us), int(horizon_us))
    if stop <= start_us:
        return np.zeros(0, dtype=np.int64)
    return int(start_us) + client_arrivals(arrival, rate_per_us, rng, stop - int(start_us),
                                           max_requests)


def _burst_times(burst: SynchronizedBurst, instants: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    times = np.repeat(instants, int(burst.size))
    if burst.spread_us > 0:
        offsets = rng.integers(0, int(burst.spread_us), size=times.size, endpoint=True)
        times = np.sort(times + offsets, kind="stable")
    return times


def _pattern_requests(
    spec: WorkloadSpec,
    rates: np.ndarray,
    rng: PartitionedRNG,
    cap: int | None,
) -> list[tuple[np.ndarray, ClientSpec, tuple, int]]:
    """Every adversarial stream as (arrival times, owning client, stream name prefix, owner
    index into clients + floods), in generation order."""
    out = []
    floods = 0
    for j, pattern in enumerate(spec.adversarial):
        if isinstance(pattern, LongPromptFlood):
            names = ("workload", "adversarial", j)
            times = window_arrivals(pattern.arrival, pattern.rate / 1e6,
                                    rng.stream(*names, "arrival"), pattern.start_us,
                                    pattern.end_us, spec.horizon_us, cap)
            out.append((times, pattern.as_client(), names, len(spec.clients) + floods))
            floods += 1
            continue
        if isinstance(pattern, SynchronizedBurst):
            instants = burst_instants(pattern, spec.horizon_us, cap)
        for i in pattern_targets(pattern, spec.clients):
            client = spec.clients[i]
            names = ("workload", "adversarial", j, i)
            arrival_rng = rng.stream(*names, "arrival")
            if isinstance(pattern, SynchronizedBurst):
                times = _burst_times(pattern, instants, arrival_rng)
                if spec.horizon_us is not None:
                    times = times[times < spec.horizon_us]
            else:
                assert isinstance(pattern, TenantSurge)
                extra = (pattern.factor - 1.0) * float(rates[i])
                times = window_arrivals(pattern.arrival, extra, arrival_rng, pattern.start_us,
                                        pattern.end_us, spec.horizon_us,
                                        cap if client.lifecycle is None else None)
            if client.lifecycle is not None:
                times = times[client.lifecycle.contains(times)]
            out.append((times if cap is None else times[:cap], client, names, i))
    return out


def _first_appearance(names: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Distinct names in first-appearance order, and each input's code."""
    index: dict[str, int] = {}
    codes = [index.setdefault(name, len(index)) for name in names]
    return tuple(index), np.asarray(codes, dtype=np.int32)


@dataclass(frozen=True)
class _ClientLabels:
    """Per-client constant columns (arrays of length #clients)."""

    tenant: np.ndarray
    client: np.ndarray
    slo_class: np.ndarray
    prefix_group: np.ndarray
    prefix_length: np.ndarray
    timeout_us: np.ndarray
    tenant_names: tuple[str, ...]
    client_names: tuple[str, ...]
    prefix_group_names: tuple[str, ...]


def _client_labels(clients: tuple[ClientSpec, ...]) -> _ClientLabels:
    tenant_names, tenant = _first_appearance([c.tenant_id for c in clients])
    client_names, client = _first_appearance([c.id for c in clients])
    group_names, _ = _first_appearance([c.prefix_group for c in clients if c.prefix_group])
    # A group's prefix length is that of its first client; later clients inherit it (BLIS).
    group_length: dict[str, int] = {}
    for c in clients:
        if c.prefix_group:
            group_length.setdefault(c.prefix_group, int(c.prefix_length))
    group_code = {name: i for i, name in enumerate(group_names)}
    return _ClientLabels(
        tenant=tenant,
        client=client,
        slo_class=np.array([SLO_CLASS_CODE[c.slo_class] for c in clients], dtype=np.int32),
        prefix_group=np.array(
            [group_code.get(c.prefix_group, NO_PREFIX_GROUP) for c in clients], dtype=np.int32
        ),
        prefix_length=np.array([group_length.get(c.prefix_group, 0) for c in clients]),
        timeout_us=np.array([c.timeout_us or 0 for c in clients], dtype=np.int64),
        tenant_names=tenant_names,
        client_names=client_names,
        prefix_group_names=group_names,
    )


def generate_workload(spec: WorkloadSpec, seed: int | None = None) -> Workload:
    """Generate the requests of ``spec`` (see the module docstring for the exact procedure).

    ``seed`` overrides ``spec.seed`` (like BLIS ``--seed``); with neither, 42 (BLIS default).
    Returns a ``Workload`` of N rows sorted by arrival; ``input_tokens`` includes the shared
    prefix; ``deadline_us`` = arrival + timeout for clients with a positive timeout, else 0.
    Conversations' later rounds and concurrency users' later requests follow as follow-up rows
    (``_with_conversations``, ``_with_users``).
    """
    if (
        spec.horizon_us is None
        and spec.num_requests is None
        and any(c.lifecycle is None and not c.concurrency for c in spec.clients)
    ):
        raise ValueError(
            "horizon/num_requests: at least one must be set to bound generation "
            "(or every client needs a lifecycle)"
        )
    seed = seed if seed is not None else spec.seed if spec.seed is not None else DEFAULT_SEED
    rng = PartitionedRNG(seed)
    cap = 2 * spec.num_requests if spec.num_requests is not None else None
    rates = client_rates_per_us(spec)
    arrivals, inputs, outputs, owners = [], [], [], []
    for i, client in enumerate(spec.clients):
        if client.concurrency:
            continue
        arrival_rng = rng.stream("workload", i, "arrival")
        times = client_arrivals(
            client.arrival, float(rates[i]), arrival_rng, spec.horizon_us, cap, client.lifecycle
        )
        n = times.size
        arrivals.append(times)
        input_rng = rng.stream("workload", i, "input")
        output_rng = rng.stream("workload", i, "output")
        inputs.append(sample_lengths(client.input_distribution, input_rng, n))
        outputs.append(sample_lengths(client.output_distribution, output_rng, n))
        owners.append(np.full(n, i, dtype=np.int64))
    base_rows = sum(a.size for a in arrivals)
    for times, client, names, owner in _pattern_requests(spec, rates, rng, cap):
        n = times.size
        arrivals.append(times)
        inputs.append(sample_lengths(client.input_distribution, rng.stream(*names, "input"), n))
        outputs.append(sample_lengths(client.output_distribution, rng.stream(*names, "output"), n))
        owners.append(np.full(n, owner, dtype=np.int64))
    n_other = sum(a.size for a in arrivals)
    arrival_us = np.concatenate(arrivals) if arrivals else np.zeros(0, np.int64)
    order = np.argsort(arrival_us, kind="stable")  # ties stay in client, then pattern, order
    if spec.num_requests is not None:
        order = order[: spec.num_requests]
    users = _Users.of(spec, order.size, rng)
    if users.count:  # their first requests join, after the others at equal times (BLIS)
        arrival_us = np.concatenate([arrival_us, users.first_us])
        inputs.append(np.array([x[0] for x in users.inputs], dtype=np.int64))
        outputs.append(np.array([x[0] for x in users.outputs], dtype=np.int64))
        owners.append(users.client)
        kept = np.concatenate([order, n_other + np.arange(users.count)])
        order = kept[np.argsort(arrival_us[kept], kind="stable")]
    owner = np.concatenate(owners)[order] if owners else np.zeros(0, np.int64)
    floods = tuple(p.as_client() for p in spec.adversarial if isinstance(p, LongPromptFlood))
    labels = _client_labels(spec.clients + floods)
    prefix_length = labels.prefix_length[owner]
    timeout = labels.timeout_us[owner]
    arrival_sorted = arrival_us[order]
    concat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    workload = Workload(
        request_id=np.arange(order.size, dtype=np.int64),
        arrival_us=arrival_sorted,
        input_tokens=prefix_length + concat(inputs)[order],
        output_tokens=concat(outputs)[order],
        prefix_group=labels.prefix_group[owner],
        prefix_length=prefix_length,
        tenant=labels.tenant[owner],
        client=labels.client[owner],
        slo_class=labels.slo_class[owner],
        deadline_us=np.where(timeout > 0, arrival_sorted + timeout, 0),
        tenant_names=labels.tenant_names,
        client_names=labels.client_names,
        prefix_group_names=labels.prefix_group_names,
        metadata={
            "source": "generated",
            "seed": int(seed),
            "slo_target_us": {
                c.id: c.slo_target_us for c in spec.clients if c.slo_target_us is not None
            },
            **({"adversarial_requests": int(np.count_nonzero((order >= base_rows)
                                                              & (order < n_other)))}
               if spec.adversarial else {}),
        },
    )
    own = np.where(order < base_rows, owner, -1)  # a pattern's requests start no conversation
    workload = _with_conversations(workload, spec, own, rng)
    return _with_users(workload, users, order - n_other, spec)


def _with_conversations(workload: Workload, spec: WorkloadSpec, owner: np.ndarray,
                        rng: PartitionedRNG) -> Workload:
    """``workload`` with a conversation for every request of a multi-turn client
    (``ClientSpec.multi_turn``; rows: ``owner`` = its client, -1 for none): its rounds 1 ..
    max_rounds − 1 as follow-up rows after all others, conversation by conversation, their
    message and output lengths drawn on the client's own streams in conversation order."""
    turns = [c.multi_turn if c.multi_turn is not None and c.multi_turn.max_rounds > 1 else None
             for c in spec.clients]
    starts = [i for i in range(workload.num_requests)
              if owner[i] >= 0 and turns[int(owner[i])] is not None]
    if not starts:
        return workload
    w = workload
    follow: dict[int, list[tuple[int, int]]] = {}  # row -> [(message, output)] for its rounds
    for k, client in enumerate(spec.clients):
        mine = [i for i in starts if int(owner[i]) == k]
        if not mine:
            continue
        extra = turns[k].max_rounds - 1
        count = len(mine) * extra
        msgs = sample_lengths(client.input_distribution,
                              rng.stream("workload", k, "turn_input"), count)
        outs = sample_lengths(client.output_distribution,
                              rng.stream("workload", k, "turn_output"), count)
        for j, i in enumerate(mine):
            follow[i] = list(zip(msgs[j * extra:(j + 1) * extra].tolist(),
                                 outs[j * extra:(j + 1) * extra].tolist(), strict=True))
    n, rows = w.num_requests, [(i, r) for i in starts for r in range(1, len(follow[i]) + 1)]
    src = np.array([i for i, _ in rows], dtype=np.int64)
    rounds = np.array([r for _, r in rows], dtype=np.int64)
    session = np.full(n + len(rows), -1, dtype=np.int64)
    code = {i: s for s, i in enumerate(starts)}
    session[starts] = np.arange(len(starts))
    session[n:] = [code[i] for i in src.tolist()]
    timeout = np.array([c.timeout_us or 0 for c in spec.clients], dtype=np.int64)
    think = np.array([t.think_time_us if t is not None else 0 for t in turns], dtype=np.int64)

    def extend(arr, tail):
        return np.concatenate([np.asarray(arr), np.asarray(tail, dtype=np.asarray(arr).dtype)])

    message = [follow[i][r - 1][0] for i, r in rows]
    output = [follow[i][r - 1][1] for i, r in rows]
    growth = next(t.context_growth for t in turns if t is not None)
    return dataclasses.replace(
        w, request_id=np.arange(n + len(rows), dtype=np.int64),
        arrival_us=extend(w.arrival_us, np.full(len(rows), FOLLOW_UP_ARRIVAL_US)),
        input_tokens=extend(w.input_tokens, message),
        output_tokens=extend(w.output_tokens, output),
        prefix_group=extend(w.prefix_group, w.prefix_group[src]),
        prefix_length=extend(w.prefix_length, w.prefix_length[src]),
        tenant=extend(w.tenant, w.tenant[src]), client=extend(w.client, w.client[src]),
        slo_class=extend(w.slo_class, w.slo_class[src]),
        deadline_us=extend(w.deadline_us, timeout[owner[src]]),
        session=session, round_index=np.concatenate([np.zeros(n, np.int64), rounds]),
        think_time_us=np.concatenate([np.zeros(n, np.int64), think[owner[src]]]),
        session_names=tuple(f"{w.client_names[int(w.client[i])]}/{s}"
                            for s, i in enumerate(starts)),
        session_accumulate=growth == "accumulate")


@dataclass(frozen=True)
class _Users:
    """The concurrency clients' users (``ClientSpec.concurrency``; BLIS ``GenerateWorkload``),
    in client order then user order: user j of client ``client[j]`` sends its first request
    at ``first_us[j]`` and at most ``len(inputs[j])`` requests, the k-th with ``inputs[j][k]``
    tokens past its prefix and ``outputs[j][k]`` output tokens, drawn in order from its own
    streams ``("workload", client, "user", u, "input" | "output")``."""

    client: np.ndarray  # int64 [U]
    user: np.ndarray  # int64 [U]: the user's index within its client
    first_us: np.ndarray  # int64 [U]
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]
    budget: int  # follow-ups a run may create, -1 = no cap

    @property
    def count(self) -> int:
        return int(self.client.size)

    @staticmethod
    def of(spec: WorkloadSpec, n_first: int, rng: PartitionedRNG) -> _Users:
        """The users of ``spec`` when ``n_first`` other requests start the workload: users are
        seeded while the request count leaves room (BLIS never generates more first requests
        than ``num_requests``); the follow-up budget is the count left after them."""
        limit = spec.num_requests
        picked: list[tuple[int, int]] = []
        for k, client in enumerate(spec.clients):
            for u in range(client.concurrency):
                if limit is not None and n_first + len(picked) >= limit:
                    break
                picked.append((k, u))
        budget = -1 if limit is None or not picked else max(limit - n_first - len(picked), 0)
        first, inputs, outputs = [], [], []
        for k, u in picked:
            client = spec.clients[k]
            think, users = client.think_time_us, client.concurrency
            first.append(u * think // users if think > 0 and users > 1 else 0)
            rounds = client.rounds_per_user
            if rounds is None:  # limit is set (WorkloadSpec.check)
                rounds = 2 * -(-budget // len(picked)) + 2
            if budget >= 0:
                rounds = min(rounds, budget + 1)
            inputs.append(sample_lengths(client.input_distribution,
                                         rng.stream("workload", k, "user", u, "input"), rounds))
            outputs.append(sample_lengths(client.output_distribution,
                                          rng.stream("workload", k, "user", u, "output"), rounds))
        return _Users(client=np.array([k for k, _ in picked], dtype=np.int64),
                      user=np.array([u for _, u in picked], dtype=np.int64),
                      first_us=np.array(first, dtype=np.int64), inputs=tuple(inputs),
                      outputs=tuple(outputs), budget=budget)


def _with_users(workload: Workload, users: _Users, seed_of_row: np.ndarray,
                spec: WorkloadSpec) -> Workload:
    """``workload`` with each concurrency user a session (``Workload.session_unbounded``):
    its first request (the row whose ``seed_of_row`` is the user's index; others < 0) is round
    0, its later requests rounds 1, 2, … as follow-up rows after all others, user by user,
    each sent ``think_time_us`` after the one before completes; the workload's follow-up
    budget is the users'. No conversation: a later request's prompt is the client's prefix
    and its own message."""
    if not users.count:
        return workload
    w = workload
    n = w.num_requests
    row_of = np.empty(users.count, dtype=np.int64)
    mine = np.flatnonzero(seed_of_row >= 0)
    row_of[seed_of_row[mine]] = mine
    base = len(w.session_names)
    src = np.concatenate([np.full(len(x) - 1, j, np.int64) for j, x in enumerate(users.inputs)])
    rounds = np.concatenate([np.arange(1, len(x), dtype=np.int64) for x in users.inputs])
    rows = row_of[src]
    think = np.array([spec.clients[int(k)].think_time_us for k in users.client], np.int64)
    timeout = np.array([spec.clients[int(k)].timeout_us or 0 for k in users.client], np.int64)
    session = np.asarray(w.session, np.int64).copy()
    session[row_of] = base + np.arange(users.count)
    first_think = np.asarray(w.think_time_us, np.int64).copy()
    first_think[row_of] = think

    def extend(arr, tail):
        return np.concatenate([np.asarray(arr), np.asarray(tail, dtype=np.asarray(arr).dtype)])

    client_names = w.client_names
    return dataclasses.replace(
        w, request_id=np.arange(n + src.size, dtype=np.int64),
        arrival_us=extend(w.arrival_us, np.full(src.size, FOLLOW_UP_ARRIVAL_US)),
        input_tokens=extend(w.input_tokens, np.concatenate([x[1:] for x in users.inputs])),
        output_tokens=extend(w.output_tokens, np.concatenate([x[1:] for x in users.outputs])),
        prefix_group=extend(w.prefix_group, w.prefix_group[rows]),
        prefix_length=extend(w.prefix_length, w.prefix_length[rows]),
        tenant=extend(w.tenant, w.tenant[rows]), client=extend(w.client, w.client[rows]),
        slo_class=extend(w.slo_class, w.slo_class[rows]),
        deadline_us=extend(w.deadline_us, timeout[src]),
        session=extend(session, base + src),
        round_index=extend(w.round_index, rounds),
        think_time_us=extend(first_think, think[src]),
        session_names=w.session_names + tuple(
            f"concurrency_{client_names[int(w.client[r])]}_user_{int(u)}"
            for r, u in zip(row_of.tolist(), users.user.tolist(), strict=True)),
        session_unbounded=(tuple(w.session_unbounded) or (False,) * base)
        + (True,) * users.count,
        follow_up_budget=users.budget)
