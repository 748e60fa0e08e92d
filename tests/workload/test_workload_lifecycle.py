"""Client lifecycle windows: which arrivals are kept, rate normalisation, validation, determinism.

BLIS's rule (docs/configuration.md, ``workload``): a client with ``lifecycle.windows`` draws its
arrivals exactly as without windows (first arrival = first IAT after time 0, at the client's rate),
keeps those inside some window [start_us, end_us), and stops at the first arrival >= the largest
end_us. Its rate is aggregate * fraction / S, S = the fractions of the clients whose windows
overlap its own (itself included; a client without windows overlaps everyone).

Expected values come from hand computation or Poisson statistics (5 standard deviations).
"""

import math

import numpy as np
import pytest

from blisjax.workload import (
    ActiveWindow,
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    LifecycleSpec,
    WorkloadSpec,
    generate_workload,
    parse_workload_spec,
)
from blisjax.workload.generate import client_arrivals, client_rates_per_us
from tests.workload.test_workload_spec import client, spec_dict

S = 1_000_000  # µs per second
EXP = DistSpec("exponential", {"mean": 300})


def windows(*pairs):
    return LifecycleSpec(tuple(ActiveWindow(a, b) for a, b in pairs))


def poisson_client(cid="c", fraction=1.0, lifecycle=None):
    return ClientSpec(
        id=cid,
        rate_fraction=fraction,
        arrival=ArrivalSpec("poisson"),
        input_distribution=EXP,
        output_distribution=EXP,
        lifecycle=lifecycle,
    )


def within(count, expected, sigmas=5.0):
    """Poisson count within `sigmas` standard deviations of its mean."""
    return abs(count - expected) <= sigmas * math.sqrt(expected)


def rows(w, cid):
    code = w.client_names.index(cid)
    mask = w.client == code
    return w.arrival_us[mask], w.input_tokens[mask], w.output_tokens[mask]


# --------------------------------------------------------------------------- the arrival rule


def constant_spec(lifecycle, **top):
    # 4 req/s: IAT = trunc(1 / 4e-6) = 250,000 µs, so arrivals are at k * 0.25 s, k = 1, 2, ...
    client = ClientSpec(id="c", arrival=ArrivalSpec("constant"), lifecycle=lifecycle)
    return WorkloadSpec(clients=(client,), aggregate_rate=4.0, **top)


def test_constant_client_keeps_exactly_the_arrivals_inside_the_window():
    # Arrivals 0.25, 0.5, ..., window [1.0 s, 2.0 s): start included, end excluded.
    w = generate_workload(constant_spec(windows((1 * S, 2 * S)), horizon_us=10 * S))
    np.testing.assert_array_equal(w.arrival_us, [1_000_000, 1_250_000, 1_500_000, 1_750_000])
    # A window that does not start on an arrival: the clock does not restart at start_us.
    w = generate_workload(constant_spec(windows((1_100_000, 2_100_000)), horizon_us=10 * S))
    np.testing.assert_array_equal(w.arrival_us, [1_250_000, 1_500_000, 1_750_000, 2_000_000])


def test_constant_client_several_windows_unordered_and_overlapping():
    # Windows (any order, may overlap): [1.0, 1.5) ∪ [1.4, 2.0) ∪ [0, 0.6) seconds.
    life = windows((1 * S, 1_500_000), (1_400_000, 2 * S), (0, 600_000))
    w = generate_workload(constant_spec(life, horizon_us=10 * S))
    expected = [250_000, 500_000, 1_000_000, 1_250_000, 1_500_000, 1_750_000]
    np.testing.assert_array_equal(w.arrival_us, expected)


def test_horizon_and_num_requests_still_bound_a_windowed_client():
    life = windows((1 * S, 3 * S))
    w = generate_workload(constant_spec(life, horizon_us=1_600_000))  # arrival >= horizon stops
    np.testing.assert_array_equal(w.arrival_us, [1_000_000, 1_250_000, 1_500_000])
    # num_requests counts kept requests: the first 3 inside the window.
    w = generate_workload(constant_spec(life, num_requests=3))
    np.testing.assert_array_equal(w.arrival_us, [1_000_000, 1_250_000, 1_500_000])


def test_windows_alone_bound_generation():
    # No horizon and no num_requests: the last window end (2.0 s) stops every client.
    w = generate_workload(constant_spec(windows((1 * S, 2 * S))))
    np.testing.assert_array_equal(w.arrival_us, [1_000_000, 1_250_000, 1_500_000, 1_750_000])
    always_on = ClientSpec(id="b", arrival=ArrivalSpec("constant"))
    spec = WorkloadSpec(
        clients=(constant_spec(windows((0, S))).clients[0], always_on), aggregate_rate=4.0
    )
    with pytest.raises(ValueError, match=r"^horizon/num_requests: .*every client needs"):
        generate_workload(spec)


def test_client_arrivals_cap_counts_kept_arrivals_and_is_a_prefix():
    a, life = ArrivalSpec("poisson"), windows((2 * S, 3 * S), (5 * S, 6 * S))
    rng = np.random.default_rng
    full = client_arrivals(a, 1e-4, rng(5), None, None, life)
    capped = client_arrivals(a, 1e-4, rng(5), None, 150, life)
    assert capped.size == 150
    np.testing.assert_array_equal(capped, full[:150])


# --------------------------------------------------------------------------- Poisson statistics


def test_poisson_window_has_no_arrival_outside_and_rate_times_length_inside():
    # 200 req/s in [2 s, 7 s): 1000 expected, none before 2 s or from 7 s on.
    spec = WorkloadSpec(
        clients=(poisson_client(lifecycle=windows((2 * S, 7 * S))),),
        aggregate_rate=200.0,
        horizon_us=10 * S,
    )
    t = generate_workload(spec, seed=3).arrival_us
    assert t.min() >= 2 * S and t.max() < 7 * S
    assert within(t.size, 1000)
    # Arrivals spread evenly over the window (each half: Poisson with mean 500).
    assert within(np.sum(t < 4_500_000), 500) and within(np.sum(t >= 4_500_000), 500)


def test_windowed_arrivals_are_the_unwindowed_ones_inside_the_window():
    # Same rate (one client), same streams: the window only filters; the k-th kept request
    # takes the k-th input and output draws.
    base = WorkloadSpec(clients=(poisson_client(),), aggregate_rate=50.0, horizon_us=7 * S)
    windowed = WorkloadSpec(
        clients=(poisson_client(lifecycle=windows((2 * S, 7 * S))),),
        aggregate_rate=50.0,
        horizon_us=20 * S,
    )
    b, w = generate_workload(base, seed=11), generate_workload(windowed, seed=11)
    keep = b.arrival_us >= 2 * S
    np.testing.assert_array_equal(w.arrival_us, b.arrival_us[keep])
    n = w.num_requests
    np.testing.assert_array_equal(w.input_tokens, b.input_tokens[:n])
    np.testing.assert_array_equal(w.output_tokens, b.output_tokens[:n])


def test_poisson_several_windows_counts_per_window():
    life = windows((1 * S, 3 * S), (6 * S, 10 * S))  # 2 s and 4 s of activity
    spec = WorkloadSpec(
        clients=(poisson_client(lifecycle=life),), aggregate_rate=300.0, horizon_us=30 * S
    )
    t = generate_workload(spec, seed=4).arrival_us
    first, second = (t >= 1 * S) & (t < 3 * S), (t >= 6 * S) & (t < 10 * S)
    assert np.all(first | second)
    assert within(first.sum(), 600) and within(second.sum(), 1200)


# --------------------------------------------------------------------------- rates (BLIS rule)


def rates_of(*clients, aggregate=100.0):
    spec = WorkloadSpec(clients=clients, aggregate_rate=aggregate, horizon_us=S)
    return client_rates_per_us(spec) * 1e6


def test_rates_without_lifecycles_are_global_fractions():
    np.testing.assert_allclose(
        rates_of(poisson_client("a", 7.0), poisson_client("b", 3.0)), [70, 30], rtol=1e-14
    )


def test_rates_surge_client_overlapping_an_always_on_client():
    # steady 1 (always on) + surge 3 (6 s..18 s), 32 req/s: they overlap, S = 4 for both.
    got = rates_of(
        poisson_client("steady", 1.0),
        poisson_client("surge", 3.0, windows((6 * S, 18 * S))),
        aggregate=32.0,
    )
    np.testing.assert_allclose(got, [8, 24], rtol=1e-14)


def test_rates_non_overlapping_phases_each_run_at_the_aggregate_rate():
    p1 = windows((0, 50 * S))
    got = rates_of(
        poisson_client("p1a", 0.7, p1),
        poisson_client("p1b", 0.3, p1),
        poisson_client("p2", 1.0, windows((50 * S, 100 * S))),  # touches p1 at 50 s only
    )
    np.testing.assert_allclose(got, [70, 30, 100], rtol=1e-14)
    # A solo phase with fraction 0.7 still gets the whole aggregate rate.
    np.testing.assert_allclose(rates_of(poisson_client("x", 0.7, p1)), [100], rtol=1e-14)


def test_rates_always_on_client_overlapping_two_phases():
    # BLIS normalises per client, not per instant: the always-on client sees 0.5+0.5+0.5,
    # each phase client 0.5+0.5, so each phase totals 100/3 + 50 < 100.
    got = rates_of(
        poisson_client("always", 0.5),
        poisson_client("p1", 0.5, windows((0, 50 * S))),
        poisson_client("p2", 0.5, windows((50 * S, 100 * S))),
    )
    np.testing.assert_allclose(got, [100 / 3, 50, 50], rtol=1e-14)


def test_two_phase_workload_runs_each_phase_at_the_aggregate_rate():
    p1, p2 = windows((0, 50 * S)), windows((50 * S, 100 * S))
    spec = WorkloadSpec(
        clients=(
            poisson_client("p1a", 0.7, p1),
            poisson_client("p1b", 0.3, p1),
            poisson_client("p2", 1.0, p2),
        ),
        aggregate_rate=20.0,
    )
    w = generate_workload(spec, seed=8)
    t = w.arrival_us
    assert t.max() < 100 * S
    assert within(np.sum(t < 50 * S), 1000) and within(np.sum(t >= 50 * S), 1000)
    assert within(rows(w, "p1a")[0].size, 700) and within(rows(w, "p1b")[0].size, 300)


def test_diurnal_ramp_from_staggered_clients_rises_and_falls():
    # Five clients with nested windows [10k, 90 - 10k) s, k = 0..4: 1, 2, 3, 4, 5, 4, 3, 2, 1
    # clients active in the nine 10 s bins. All windows share [40, 50) s, so every client
    # overlaps every other, S = 5 and each runs at 50 / 5 = 10 req/s: 100 per client per bin.
    clients = tuple(
        poisson_client(f"c{k}", 1.0, windows((10 * k * S, (90 - 10 * k) * S))) for k in range(5)
    )
    spec = WorkloadSpec(clients=clients, aggregate_rate=50.0)
    np.testing.assert_allclose(client_rates_per_us(spec) * 1e6, [10] * 5, rtol=1e-14)
    t = generate_workload(spec, seed=21).arrival_us
    counts = np.bincount(t // (10 * S), minlength=9)
    assert counts.size == 9  # nothing at or after 90 s
    active = [1, 2, 3, 4, 5, 4, 3, 2, 1]
    for got, k in zip(counts, active, strict=True):
        assert within(got, 100 * k), (counts, active)
    assert np.all(np.diff(counts[:5]) > 0) and np.all(np.diff(counts[4:]) < 0), counts


# --------------------------------------------------------------------------- determinism


def test_same_spec_and_seed_give_identical_arrays():
    spec = WorkloadSpec(
        clients=(
            poisson_client("a"),
            poisson_client("b", 2.0, windows((3 * S, 8 * S), (12 * S, 15 * S))),
        ),
        aggregate_rate=80.0,
        horizon_us=20 * S,
    )
    x, y = generate_workload(spec, seed=5), generate_workload(spec, seed=5)
    for name in ("arrival_us", "input_tokens", "output_tokens", "client", "request_id"):
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name))


def test_a_clients_windows_leave_other_clients_draws_alone():
    # b's window overlaps the always-on a, so a's rate (80 * 1/3) is the same with or without
    # it, and a's requests are identical; b's windowed requests are its unwindowed ones inside.
    def spec(life):
        return WorkloadSpec(
            clients=(poisson_client("a"), poisson_client("b", 2.0, life)),
            aggregate_rate=80.0,
            horizon_us=20 * S,
        )

    plain, windowed = (
        generate_workload(spec(None), 9),
        generate_workload(spec(windows((5 * S, 9 * S))), 9),
    )
    for got, want in zip(rows(windowed, "a"), rows(plain, "a"), strict=True):
        np.testing.assert_array_equal(got, want)
    b_plain = rows(plain, "b")[0]
    np.testing.assert_array_equal(
        rows(windowed, "b")[0], b_plain[(b_plain >= 5 * S) & (b_plain < 9 * S)]
    )


# --------------------------------------------------------------------------- parsing, validation




def test_lifecycle_is_parsed_from_blis_yaml_keys():
    spec = parse_workload_spec(
        spec_dict(
            client(),
            client(lifecycle={"windows": [{"start_us": 6.0e6, "end_us": 18000000}, {"end_us": 5}]}),
            client(lifecycle=None),
        )
    )
    assert spec.clients[0].lifecycle is None and spec.clients[2].lifecycle is None
    life = spec.clients[1].lifecycle
    assert life.windows == (ActiveWindow(6_000_000, 18_000_000), ActiveWindow(0, 5))
    assert isinstance(life.windows[0].start_us, int) and life.end_us == 18_000_000


@pytest.mark.parametrize(
    ("lifecycle", "message"),
    [
        ({"windows": []}, r"^clients\[1\]\.lifecycle\.windows: must be a non-empty list"),
        ({}, r"^clients\[1\]\.lifecycle\.windows: must be a non-empty list"),
        ({"windows": [{"start_us": 6000000, "end_us": 6000000}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.end_us: must be > start_us \(6000000\), "
         r"got 6000000$"),
        ({"windows": [{"start_us": 0, "end_us": 10}, {"start_us": 9, "end_us": 3}]},
         r"^clients\[1\]\.lifecycle\.windows\[1\]\.end_us: must be > start_us \(9\), got 3$"),
        ({"windows": [{"start_us": -1, "end_us": 10}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.start_us: must be >= 0, got -1"),
        ({"windows": [{"start_us": 1.5, "end_us": 10}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.start_us: must be an integer"),
        ({"windows": [{"start_us": 0}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.end_us: required"),
        ({"windows": [{"start_us": 0, "end_us": 5, "stop_us": 7}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.stop_us: unknown key"),
        ({"windows": [{"start_us": 0, "end_us": 5, "trace_rate": 2.0}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.trace_rate: .*not supported"),
        ({"windows": [{"start_us": 0, "end_us": 5, "arrival": {"process": "gamma"}}]},
         r"^clients\[1\]\.lifecycle\.windows\[0\]\.arrival: .*not supported"),
        ({"phases": []}, r"^clients\[1\]\.lifecycle\.phases: unknown key"),
        ([1, 2], r"^clients\[1\]\.lifecycle: must be a mapping"),
    ],
)  # fmt: skip
def test_invalid_lifecycles_name_the_field(lifecycle, message):
    with pytest.raises(ValueError, match=message):
        parse_workload_spec(spec_dict(client(), client(lifecycle=lifecycle)))


def test_dataclasses_validate_lifecycles_on_construction():
    with pytest.raises(ValueError, match=r"^clients\[0\]\.lifecycle\.windows: at least one"):
        WorkloadSpec(clients=(ClientSpec(lifecycle=LifecycleSpec(())),), num_requests=5)
    with pytest.raises(ValueError, match=r"^clients\[0\]\.lifecycle\.windows\[0\]\.end_us: must"):
        WorkloadSpec(clients=(ClientSpec(lifecycle=windows((5, 5))),), num_requests=5)
    # (start, end) pairs are accepted for convenience.
    assert LifecycleSpec(((1, 2),)).windows == (ActiveWindow(1, 2),)


# --------------------------------------------------------------------------- BLIS surge case

# The workload of BLIS's autoscale_surge_rr golden run: 8 req/s steady + 24 req/s surge client
# active 6 s..18 s, 650 requests.
_SURGE_LENGTHS = {
    "type": "gaussian",
    "params": {"mean": 1200, "std_dev": 300, "min": 200, "max": 2400},
}
_SURGE_OUT = {"type": "gaussian", "params": {"mean": 300, "std_dev": 80, "min": 40, "max": 600}}
SURGE_SPEC = {
    "version": "2", "seed": 107, "category": "language", "aggregate_rate": 32.0,
    "num_requests": 650,
    "clients": [
        {"id": "steady", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
         "input_distribution": _SURGE_LENGTHS, "output_distribution": _SURGE_OUT, "timeout": 0},
        {"id": "surge", "rate_fraction": 3.0, "arrival": {"process": "poisson"},
         "input_distribution": _SURGE_LENGTHS, "output_distribution": _SURGE_OUT, "timeout": 0,
         "lifecycle": {"windows": [{"start_us": 6000000, "end_us": 18000000}]}},
    ],
}  # fmt: skip


def test_blis_surge_workload_is_accepted_and_keeps_the_surge_in_its_window():
    spec = parse_workload_spec(SURGE_SPEC)
    np.testing.assert_allclose(client_rates_per_us(spec) * 1e6, [8, 24], rtol=1e-14)
    w = generate_workload(spec)
    assert w.num_requests == 650
    surge, _, _ = rows(w, "surge")
    steady, _, _ = rows(w, "steady")
    assert surge.min() >= 6 * S and surge.max() < 18 * S
    assert within(surge.size, 24 * 12)  # 288
    assert within(np.sum((steady >= 6 * S) & (steady < 18 * S)), 8 * 12)  # 96
    assert within(np.sum(steady < 6 * S), 8 * 6)  # 48
