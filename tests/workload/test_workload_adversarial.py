"""Adversarial workload patterns: synchronized bursts, long-prompt floods, tenant surges.

The rules (docs/configuration.md, ``workload``): a pattern's requests are added to the clients'
own, which stay exactly as without the pattern. A burst fires ``size`` requests per targeted
client at ``start_us + k * period_us`` (bounded by count, end_us, horizon); a flood is a client
of its own at ``rate`` inside its window (first arrival one inter-arrival time after start_us);
a surge adds a stream at (factor - 1) x the client's rate inside the window.

Expected values are hand-computed (constant processes, burst instants) or come from Poisson
statistics (5 standard deviations: a false failure has probability < 1e-6 per check, and the
seeds are fixed, so every run gives the same verdict).
"""

import copy
import math
from collections import Counter

import numpy as np
import pytest

from blisjax.workload import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    LongPromptFlood,
    SynchronizedBurst,
    TenantSurge,
    WorkloadSpec,
    generate_workload,
    parse_workload_spec,
)
from blisjax.workload.generate import burst_instants

S = 1_000_000  # µs per second


def const(value):
    return {"type": "constant", "params": {"value": value}}


def base(**top):
    """Two Poisson clients at 10 req/s each (aggregate 20), 30 s; constant lengths so every
    request's owner is visible in its lengths (alice: 256-token prefix + 100 in, 10 out)."""
    data = {
        "version": "2",
        "aggregate_rate": 20,
        "horizon": 30 * S,
        "clients": [
            {"id": "a", "tenant_id": "alice", "slo_class": "critical", "rate_fraction": 1,
             "arrival": {"process": "poisson"}, "prefix_group": "sys", "prefix_length": 256,
             "timeout": 2 * S, "input_distribution": const(100),
             "output_distribution": const(10)},
            {"id": "b", "tenant_id": "bob", "slo_class": "standard", "rate_fraction": 1,
             "arrival": {"process": "poisson"}, "input_distribution": const(200),
             "output_distribution": const(20)},
        ],
    }  # fmt: skip
    data.update(top)
    return data


def gen(data, seed=7):
    return generate_workload(parse_workload_spec(data), seed=seed)


def row_set(w):
    """Every request as a comparable tuple (ids renumbered away), as a multiset."""
    groups = (*w.prefix_group_names, "")  # code -1 = last entry = no group
    return Counter(
        (int(t), int(i), int(o), w.client_names[c], w.tenant_names[n], int(s), groups[g],
         int(d))
        for t, i, o, c, n, s, g, d in zip(
            w.arrival_us, w.input_tokens, w.output_tokens, w.client, w.tenant, w.slo_class,
            w.prefix_group, w.deadline_us, strict=True)
    )  # fmt: skip


def extra_rows(with_patterns, without):
    """The rows a pattern added; fails unless the base workload's rows are all still there."""
    big, small = row_set(with_patterns), row_set(without)
    assert not small - big, "a pattern changed or removed a client's own requests"
    return sorted((big - small).elements())


def within(count, expected, sigmas=5.0):
    return abs(count - expected) <= sigmas * math.sqrt(expected)


# --------------------------------------------------------------------------- synchronized bursts


def test_burst_adds_size_requests_per_client_at_each_instant():
    burst = {"type": "synchronized_burst", "start_us": 1 * S, "period_us": 2 * S, "count": 3,
             "size": 5}
    w = gen(base(adversarial=[burst]))
    extra = extra_rows(w, gen(base()))
    # Instants 1 s, 3 s, 5 s; each client fires 5 requests at each: 3 x 2 x 5 = 30.
    assert len(extra) == 30
    by_time = Counter(r[0] for r in extra)
    assert by_time == {1 * S: 10, 3 * S: 10, 5 * S: 10}
    by_client = Counter((r[0], r[3]) for r in extra)
    assert set(by_client.values()) == {5}
    # Each request carries its client's labels, lengths (prefix included) and timeout.
    alice = (1 * S, 356, 10, "a", "alice", 1, "sys", 3 * S)
    bob = (1 * S, 200, 20, "b", "bob", 2, "", 0)
    assert extra.count(alice) == 5 and extra.count(bob) == 5
    assert w.metadata["adversarial_requests"] == 30
    # Ties: the clients' own requests come first, then the burst's in client order.
    at = np.flatnonzero(w.arrival_us == 3 * S)
    assert [w.client_names[c] for c in w.client[at]] == ["a"] * 5 + ["b"] * 5


@pytest.mark.parametrize(
    ("fields", "horizon", "expected"),
    [
        ({"count": 3}, None, [1, 3, 5]),
        ({"end_us": 6 * S}, None, [1, 3, 5]),  # ceil((6 - 1) / 2) = 3 instants below 6 s
        ({"end_us": 5 * S}, None, [1, 3]),  # end excluded
        ({"end_us": 5 * S + 1}, None, [1, 3, 5]),
        ({}, 5 * S, [1, 3]),  # the workload's horizon bounds the instants too
        ({"count": 10, "end_us": 20 * S}, 8 * S, [1, 3, 5, 7]),
        ({"period_us": None}, None, [1]),  # a single burst
        ({"start_us": 9 * S, "end_us": 20 * S}, 9 * S, []),  # starts at the horizon
    ],
)
def test_burst_instants(fields, horizon, expected):
    burst = SynchronizedBurst(**{"period_us": 2 * S, "start_us": 1 * S, **fields})
    got = burst_instants(burst, horizon)
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.int64) * S)
    assert got.dtype == np.int64


def test_burst_targets_and_spread():
    burst = {"type": "synchronized_burst", "start_us": 2 * S, "size": 40, "spread_us": 1000,
             "tenants": ["bob"]}
    extra = extra_rows(gen(base(adversarial=[burst])), gen(base()))
    assert len(extra) == 40 and {r[3] for r in extra} == {"b"}
    times = np.array([r[0] for r in extra])
    assert times.min() >= 2 * S and times.max() <= 2 * S + 1000
    # 40 uniform offsets in [0, 1000]: all equal would have probability 1001**-39.
    assert np.unique(times).size > 1
    targeted = {**burst, "tenants": None, "clients": ["a"]}
    extra = extra_rows(gen(base(adversarial=[targeted])), gen(base()))
    assert {r[3] for r in extra} == {"a"}


def test_burst_respects_client_lifecycle_and_horizon():
    data = base(adversarial=[{"type": "synchronized_burst", "start_us": 1 * S,
                              "period_us": 10 * S, "size": 3}])
    data["clients"][1]["lifecycle"] = {"windows": [{"start_us": 5 * S, "end_us": 15 * S}]}
    extra = extra_rows(gen(data), gen({**data, "adversarial": None}))
    # Instants 1, 11, 21 s (horizon 30 s): a fires at all three, b only at 11 s (its window).
    assert Counter((r[0], r[3]) for r in extra) == {
        (1 * S, "a"): 3, (11 * S, "a"): 3, (21 * S, "a"): 3, (11 * S, "b"): 3}


def test_spread_never_passes_the_horizon():
    # One burst 500 µs before the 30 s horizon, offsets in [0, 1000]: about half the requests
    # would land at or after the horizon; those are dropped, the others kept.
    burst = {"type": "synchronized_burst", "start_us": 30 * S - 500, "size": 200,
             "spread_us": 1000, "clients": ["a"]}
    times = np.array([r[0] for r in extra_rows(gen(base(adversarial=[burst])), gen(base()))])
    assert times.size and times.min() >= 30 * S - 500 and times.max() < 30 * S
    assert within(times.size, 100)  # Binomial(200, 500/1001): sd 7.1 < sqrt(100)


# --------------------------------------------------------------------------- long-prompt floods

FLOOD = {
    "type": "long_prompt_flood", "start_us": 10 * S, "end_us": 15 * S, "rate": 40,
    "id": "attacker", "tenant_id": "mallory", "slo_class": "batch",
    "input_distribution": {"type": "uniform", "params": {"min": 6000, "max": 8000}},
    "output_distribution": const(4),
}  # fmt: skip


def test_flood_window_lengths_labels_and_rate():
    w = gen(base(adversarial=[FLOOD]))
    extra = extra_rows(w, gen(base()))
    times = np.array([r[0] for r in extra])
    inputs = np.array([r[1] for r in extra])
    assert times.min() > 10 * S and times.max() < 15 * S  # first arrival one IAT after start
    assert inputs.min() >= 6000 and inputs.max() <= 8000
    assert inputs.max() - inputs.min() > 1000  # uniform draws, not one value
    assert {r[2:] for r in extra} == {(4, "attacker", "mallory", 4, "", 0)}
    assert within(len(extra), 40 * 5)  # Poisson(rate x window) = Poisson(200)
    # The flood is a client of its own, named after the clients.
    assert w.client_names == ("a", "b", "attacker")
    assert w.tenant_names == ("alice", "bob", "mallory")
    # Long prompts occur only inside the window.
    long = w.input_tokens >= 6000
    assert np.all((w.arrival_us[long] > 10 * S) & (w.arrival_us[long] < 15 * S))


def test_flood_constant_arrivals_are_exact():
    # 8 req/s constant: IAT trunc(1 / 8e-6) = 125,000 µs; arrivals at 10 s + k x 0.125 s for
    # k = 1..39 (k = 40 is at end_us, excluded).
    flood = {**FLOOD, "rate": 8, "arrival": {"process": "constant"}}
    extra = extra_rows(gen(base(adversarial=[flood])), gen(base()))
    np.testing.assert_array_equal([r[0] for r in extra], 10 * S + 125_000 * np.arange(1, 40))
    # The horizon cuts the window: 30 s horizon with a window [29 s, 40 s) leaves 7 arrivals.
    late = {**flood, "start_us": 29 * S, "end_us": 40 * S}
    extra = extra_rows(gen(base(adversarial=[late])), gen(base()))
    np.testing.assert_array_equal([r[0] for r in extra], 29 * S + 125_000 * np.arange(1, 8))


def test_flood_timeout_and_merged_tenant():
    flood = {**FLOOD, "id": "b", "tenant_id": "bob", "timeout": 1000}
    w = gen(base(adversarial=[flood]))
    assert w.client_names == ("a", "b") and w.tenant_names == ("alice", "bob")
    long = w.input_tokens >= 6000
    assert long.any()
    np.testing.assert_array_equal(w.deadline_us[long], w.arrival_us[long] + 1000)


# --------------------------------------------------------------------------- tenant surges


def test_surge_multiplies_the_tenants_rate_inside_the_window():
    # bob's share: 20 x 1/2 = 10 req/s. Factor 3 in [5 s, 25 s): 30 req/s there, 10 elsewhere.
    surge = {"type": "tenant_surge", "tenants": ["bob"], "start_us": 5 * S, "end_us": 25 * S,
             "factor": 3}
    w = gen(base(adversarial=[surge]), seed=11)
    extra_rows(w, gen(base(), seed=11))  # bob's own requests are all still there
    bob = w.arrival_us[w.client == w.client_names.index("b")]
    inside = np.count_nonzero((bob >= 5 * S) & (bob < 25 * S))
    outside = bob.size - inside
    # Sums of independent Poisson processes: Poisson(30 x 20 = 600) inside, Poisson(10 x 10).
    assert within(inside, 600) and not within(inside, 200)
    assert within(outside, 100)
    # alice is untouched: exactly her requests of the spec without the surge.
    alice = w.client == w.client_names.index("a")
    w0 = gen(base(), seed=11)
    np.testing.assert_array_equal(w.arrival_us[alice], w0.arrival_us[w0.client == 0])


def test_surge_constant_extra_stream_is_exact():
    # alice's share: 16 x 1/2 = 8 req/s. Factor 2 adds (2 - 1) x 8 req/s, constant: IAT
    # trunc(1 / 8e-6) = 125,000 µs, arrivals at 5 s + k x 0.125 s for k = 1..7 below 6 s.
    surge = {"type": "tenant_surge", "clients": ["a"], "start_us": 5 * S, "end_us": 6 * S,
             "factor": 2, "arrival": {"process": "constant"}}
    data = base(aggregate_rate=16, adversarial=[surge])
    extra = extra_rows(gen(data), gen({**data, "adversarial": None}))
    np.testing.assert_array_equal([r[0] for r in extra], 5 * S + 125_000 * np.arange(1, 8))
    assert {r[1:7] for r in extra} == {(356, 10, "a", "alice", 1, "sys")}
    assert all(r[7] == r[0] + 2 * S for r in extra)  # alice's 2 s timeout


def test_surge_fair_share_follows_rate_fractions():
    # Fractions 3 : 1 at 20 req/s: bob's share is 5 req/s; factor 5 over 20 s adds
    # (5 - 1) x 5 x 20 = 400 requests on average.
    data = base(adversarial=[{"type": "tenant_surge", "tenants": ["bob"], "start_us": 5 * S,
                              "end_us": 25 * S, "factor": 5}])
    data["clients"][0]["rate_fraction"] = 3
    no_surge = {**data, "adversarial": []}
    extra = extra_rows(gen(data), gen(no_surge))
    assert within(len(extra), 400) and not within(len(extra), 4 * 10 * 20)


# --------------------------------------------------------------------------- composition, seeds


ALL = [
    {"type": "synchronized_burst", "start_us": 5 * S, "period_us": 10 * S, "size": 7},
    FLOOD,
    {"type": "tenant_surge", "tenants": ["bob"], "start_us": 20 * S, "end_us": 25 * S,
     "factor": 4},
]


def test_same_spec_and_seed_give_identical_workloads():
    a, b = gen(base(adversarial=ALL), seed=3), gen(base(adversarial=ALL), seed=3)
    assert a.content_equal(b) and a.metadata == b.metadata
    assert not a.content_equal(gen(base(adversarial=ALL), seed=4))


def test_appending_a_pattern_moves_no_earlier_request():
    # Each pattern draws from streams keyed by its index: appending one keeps every request of
    # the spec without it (extra_rows checks) and adds only that pattern's requests.
    burst, flood, surge = (
        extra_rows(gen(base(adversarial=ALL[: j + 1])), gen(base(adversarial=ALL[:j])))
        for j in range(3)
    )
    assert {r[0] for r in burst} == {5 * S, 15 * S, 25 * S} and len(burst) == 3 * 2 * 7
    assert {r[3] for r in flood} == {"attacker"} and within(len(flood), 200)
    assert {r[3] for r in surge} == {"b"} and all(20 * S < r[0] < 25 * S for r in surge)
    assert within(len(surge), 3 * 10 * 5)  # (4 - 1) x 10 req/s x 5 s


def test_num_requests_truncates_after_the_patterns():
    data = base(horizon=None, num_requests=100,
                adversarial=[{"type": "synchronized_burst", "start_us": 0, "size": 30}])
    w = gen(data)
    assert w.num_requests == 100
    # The burst at t = 0 comes before any client arrival (the first is one IAT after 0).
    assert np.count_nonzero(w.arrival_us == 0) == 60
    assert w.metadata["adversarial_requests"] == 60


def test_dataclasses_build_the_same_spec_as_yaml():
    data = base(adversarial=ALL)
    clients = parse_workload_spec(base()).clients
    spec = WorkloadSpec(
        clients=clients, aggregate_rate=20, horizon_us=30 * S,
        adversarial=(
            SynchronizedBurst(period_us=10 * S, size=7, start_us=5 * S),
            LongPromptFlood(start_us=10 * S, end_us=15 * S, rate=40, id="attacker",
                            tenant_id="mallory", slo_class="batch",
                            input_distribution=DistSpec("uniform", {"min": 6000, "max": 8000}),
                            output_distribution=DistSpec("constant", {"value": 4})),
            TenantSurge(start_us=20 * S, end_us=25 * S, factor=4, tenants=("bob",)),
        ),
    )  # fmt: skip
    assert spec == parse_workload_spec(data)
    assert generate_workload(spec, seed=7).content_equal(gen(data))


# --------------------------------------------------------------------------- validation


def with_pattern(**fields):
    kind = fields.pop("type")
    pattern = copy.deepcopy({"synchronized_burst": ALL[0], "long_prompt_flood": FLOOD,
                             "tenant_surge": ALL[2]}[kind])
    for key, value in fields.items():
        if value is None:
            pattern.pop(key, None)
        else:
            pattern[key] = value
    return base(adversarial=[pattern])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (base(adversarial={"type": "tenant_surge"}), "adversarial: must be a list"),
        (base(adversarial=["burst"]), "adversarial[0]: must be a mapping with a type"),
        (base(adversarial=[{"size": 3}]), "adversarial[0].type: required"),
        (base(adversarial=[{"type": "ddos"}]), "adversarial[0].type: unknown value 'ddos'; "
         "allowed: 'synchronized_burst', 'long_prompt_flood', 'tenant_surge'"),
        (with_pattern(type="synchronized_burst", rate=3), "adversarial[0].rate: unknown key"),
        (with_pattern(type="synchronized_burst", size=None),
         "adversarial[0].size: required for 'synchronized_burst'"),
        (with_pattern(type="synchronized_burst", size=0), "adversarial[0].size: must be >= 1"),
        (with_pattern(type="synchronized_burst", size=2.5),
         "adversarial[0].size: must be an integer"),
        (with_pattern(type="synchronized_burst", period_us=0),
         "adversarial[0].period_us: must be >= 1"),
        (with_pattern(type="synchronized_burst", period_us=None, count=2),
         "adversarial[0].period_us: required when count > 1"),
        (with_pattern(type="synchronized_burst", start_us=-1),
         "adversarial[0].start_us: must be >= 0"),
        (with_pattern(type="synchronized_burst", end_us=5 * S),
         "adversarial[0].end_us: must be > start_us (5000000)"),
        (with_pattern(type="synchronized_burst", spread_us=-5),
         "adversarial[0].spread_us: must be >= 0"),
        (with_pattern(type="synchronized_burst", clients=["nobody"]),
         "adversarial[0].clients[0]: no client has id 'nobody'; known: 'a', 'b'"),
        (with_pattern(type="synchronized_burst", tenants="bob"),
         "adversarial[0].tenants: must be a list of names"),
        ({**with_pattern(type="synchronized_burst"), "horizon": None, "num_requests": 50},
         "adversarial[0].count: a repeating burst needs count or end_us"),
        (with_pattern(type="long_prompt_flood", rate=0), "adversarial[0].rate: must be > 0"),
        (with_pattern(type="long_prompt_flood", rate=None),
         "adversarial[0].rate: required for 'long_prompt_flood'"),
        (with_pattern(type="long_prompt_flood", end_us=None),
         "adversarial[0].end_us: required for 'long_prompt_flood'"),
        (with_pattern(type="long_prompt_flood", end_us=10 * S),
         "adversarial[0].end_us: must be > start_us"),
        (with_pattern(type="long_prompt_flood", input_distribution=None),
         "adversarial[0].input_distribution: required"),
        (with_pattern(type="long_prompt_flood",
                      input_distribution={"type": "uniform", "params": {"min": 9, "max": 2}}),
         "adversarial[0].input_distribution.params.min: must be <= max"),
        (with_pattern(type="long_prompt_flood", slo_class="gold"),
         "adversarial[0].slo_class: unknown value 'gold'"),
        (with_pattern(type="long_prompt_flood", timeout=-1),
         "adversarial[0].timeout: must be >= 0"),
        (with_pattern(type="long_prompt_flood", arrival={"process": "periodic",
                                                         "period_us": 100}),
         "adversarial[0].arrival.period_us: not allowed here"),
        (with_pattern(type="long_prompt_flood", arrival={"process": "gamma", "cv": 0}),
         "adversarial[0].arrival.cv: must be > 0"),
        (with_pattern(type="tenant_surge", factor=1), "adversarial[0].factor: must be > 1"),
        (with_pattern(type="tenant_surge", tenants=None),
         "adversarial[0].tenants: name at least one tenant"),
        (with_pattern(type="tenant_surge", tenants=["eve"]),
         "adversarial[0].tenants[0]: no client has tenant_id 'eve'; known: 'alice', 'bob'"),
        (with_pattern(type="tenant_surge", arrival={"process": "gamma", "cv": 2, "scale": 9}),
         "adversarial[0].arrival.scale: not allowed here"),
    ],
)
def test_invalid_patterns_name_the_field(data, message):
    with pytest.raises(ValueError) as err:
        parse_workload_spec(data)
    assert message in str(err.value)


def test_dataclasses_are_validated_on_construction():
    client = ClientSpec(id="a", arrival=ArrivalSpec("poisson"))
    with pytest.raises(ValueError, match=r"adversarial\[0\]: must be a SynchronizedBurst"):
        WorkloadSpec(clients=(client,), horizon_us=S, adversarial=("burst",))
    with pytest.raises(ValueError, match=r"adversarial\[1\]\.factor: must be > 1"):
        WorkloadSpec(clients=(client,), horizon_us=S, adversarial=(
            SynchronizedBurst(size=2), TenantSurge(end_us=S, factor=0.5, clients=("a",))))
    # A single burst is bounded without count, end or horizon.
    WorkloadSpec(clients=(client,), num_requests=5, adversarial=(SynchronizedBurst(size=2),))


# --------------------------------------------------------------------------- shipped examples


def test_shipped_adversarial_examples():
    import yaml

    from blisjax.config import load_config
    from search.space import load_space
    from tests.paths import REPO

    spec_file = REPO / "configs/workloads/adversarial.yaml"
    cfg = load_config(REPO / "configs/search/adversarial.yaml")
    # The search configuration carries the spec file's workload, unchanged.
    assert cfg.workload == yaml.safe_load(spec_file.read_text())
    load_space(REPO / "configs/search/adversarial-space.yaml").validate_against(cfg)
    spec = parse_workload_spec(spec_file)
    w = generate_workload(spec, seed=1)
    base_spec = parse_workload_spec({**cfg.workload, "adversarial": None})
    extra = extra_rows(w, generate_workload(base_spec, seed=1))
    # Bursts at 0.5, 5.5, 10.5, 15.5 s: 15 requests from each of the two clients.
    burst_times = Counter(r[0] for r in extra if r[0] in (500_000, 5_500_000, 10_500_000,
                                                          15_500_000))
    assert burst_times == {t: 30 for t in (500_000, 5_500_000, 10_500_000, 15_500_000)}
    flood = [r for r in extra if r[3] == "mallory-docs"]
    assert all(6 * S < r[0] < 12 * S and 6000 <= r[1] <= 8000 for r in flood)
    assert within(len(flood), 12 * 6)
    surge = [r for r in extra if r[3] == "bob-summarize" and r[0] not in burst_times]
    assert within(len(surge), 2 * 15 * 6)  # (3 - 1) x 15 req/s x 6 s
