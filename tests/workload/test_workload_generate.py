"""generate_workload: ordering, truncation, labels, prefixes, determinism and RNG isolation."""

import dataclasses
import math
import time

import numpy as np
import pytest

from blisjax.workload import (
    SLO_CLASSES,
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    WorkloadSpec,
    distribution_spec,
    generate_workload,
)
from blisjax.workload.generate import client_rates_per_us
from blisjax.workload.types import NO_PREFIX_GROUP

EXP = DistSpec("exponential", {"mean": 200})


def const(n):
    return DistSpec("constant", {"value": n})


def two_client_spec(**top):
    clients = (
        ClientSpec(id="a", tenant_id="t1", arrival=ArrivalSpec("poisson"), input_distribution=EXP),
        ClientSpec(
            id="b",
            tenant_id="t2",
            rate_fraction=3.0,
            arrival=ArrivalSpec("gamma", cv=2.0),
            output_distribution=EXP,
        ),
    )
    fields = {"clients": clients, "aggregate_rate": 50.0, "horizon_us": 60_000_000}
    fields.update(top)
    return WorkloadSpec(**fields)


def rows_of(w, client_code):
    """(arrival, input, output) of one client's requests, in order."""
    mask = w.client == client_code
    return w.arrival_us[mask], w.input_tokens[mask], w.output_tokens[mask]


def test_client_rates_follow_fractions():
    rates = client_rates_per_us(two_client_spec(aggregate_rate=10.0))
    np.testing.assert_allclose(rates, [2.5e-6, 7.5e-6], rtol=1e-15)


def test_rate_fractions_split_the_requests():
    w = generate_workload(two_client_spec(aggregate_rate=200.0))
    n = w.num_requests
    share = np.mean(w.client == 0)
    # arrivals are independent per client; client 0 has 1/4 of the rate
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n) + 0.01
    assert abs(n - 200 * 60) < 5 * math.sqrt(200 * 60 * 4)  # gamma cv 2 inflates the variance


def test_sorted_rows_ids_and_horizon():
    w = generate_workload(two_client_spec())
    assert np.all(np.diff(w.arrival_us) >= 0)
    np.testing.assert_array_equal(w.request_id, np.arange(w.num_requests))
    assert w.arrival_us.max() < 60_000_000 and w.arrival_us.min() >= 1


def test_truncation_cap_and_client_order_ties():
    # client 0: IAT trunc(1/0.75) = 1 µs; client 1: IAT trunc(1/0.3) = 3 µs.
    # With N = 5 each client makes at most 10 requests; merged: 1a 2a 3a 3b 4a.
    spec = WorkloadSpec(
        clients=(
            ClientSpec(id="a", rate_fraction=5, arrival=ArrivalSpec("constant")),
            ClientSpec(id="b", rate_fraction=2, arrival=ArrivalSpec("constant")),
        ),
        aggregate_rate=1.05e6,
        num_requests=5,
    )
    w = generate_workload(spec)
    np.testing.assert_array_equal(w.arrival_us, [1, 2, 3, 3, 4])
    np.testing.assert_array_equal(w.client, [0, 0, 0, 1, 0])
    np.testing.assert_array_equal(w.request_id, [0, 1, 2, 3, 4])


def test_num_requests_keeps_the_earliest_requests():
    by_count = generate_workload(two_client_spec(horizon_us=None, num_requests=300))
    by_time = generate_workload(two_client_spec(horizon_us=10**9))
    assert by_count.num_requests == 300
    for name in ("arrival_us", "input_tokens", "output_tokens", "client"):
        np.testing.assert_array_equal(getattr(by_count, name), getattr(by_time, name)[:300])


def test_generation_needs_a_bound():
    with pytest.raises(ValueError, match="horizon/num_requests"):
        generate_workload(two_client_spec(horizon_us=None))


def test_same_seed_identical_and_seed_argument_overrides_spec():
    spec = two_client_spec(seed=11)
    a, b = generate_workload(spec), generate_workload(spec)
    assert a.content_equal(b)
    assert generate_workload(spec, seed=11).content_equal(a)
    other = generate_workload(spec, seed=12)
    assert not np.array_equal(other.arrival_us[:50], a.arrival_us[:50])
    assert a.metadata["seed"] == 11 and other.metadata["seed"] == 12


def test_default_seed_is_blis_cli_default():
    spec = two_client_spec()
    assert generate_workload(spec).content_equal(generate_workload(spec, seed=42))


def test_changing_a_token_distribution_never_moves_an_arrival():
    base = two_client_spec(seed=3)
    clients = list(base.clients)
    clients[1] = dataclasses.replace(
        clients[1], input_distribution=DistSpec("uniform", {"min": 1, "max": 9})
    )
    changed = generate_workload(dataclasses.replace(base, clients=tuple(clients)))
    ref = generate_workload(base)
    np.testing.assert_array_equal(changed.arrival_us, ref.arrival_us)
    np.testing.assert_array_equal(changed.client, ref.client)
    np.testing.assert_array_equal(changed.output_tokens, ref.output_tokens)
    np.testing.assert_array_equal(rows_of(changed, 0)[1], rows_of(ref, 0)[1])
    assert not np.array_equal(rows_of(changed, 1)[1], rows_of(ref, 1)[1])
    assert rows_of(changed, 1)[1].max() <= 9


def test_appending_a_client_keeps_existing_draws():
    base = two_client_spec(seed=5)
    extra = ClientSpec(
        id="c", tenant_id="t3", rate_fraction=4.0, arrival=ArrivalSpec("weibull", cv=0.5)
    )
    # doubling the aggregate rate keeps the first two clients' rates unchanged
    grown = dataclasses.replace(base, clients=base.clients + (extra,), aggregate_rate=100.0)
    ref, new = generate_workload(base), generate_workload(grown)
    for c in (0, 1):
        for got, want in zip(rows_of(new, c), rows_of(ref, c), strict=True):
            np.testing.assert_array_equal(got, want)
    assert np.any(new.client == 2)


def test_labels_prefix_groups_and_deadlines():
    clients = (
        ClientSpec(id="x", tenant_id="acme", slo_class="critical", arrival=ArrivalSpec("constant"),
                   input_distribution=const(10), output_distribution=const(3),
                   prefix_group="sys", prefix_length=7, timeout_us=1_000),
        ClientSpec(id="y", tenant_id="", slo_class="batch", arrival=ArrivalSpec("constant"),
                   input_distribution=const(20), output_distribution=const(4), timeout_us=0),
        ClientSpec(id="x", tenant_id="acme", slo_class="sheddable", arrival=ArrivalSpec("constant"),
                   input_distribution=const(30), output_distribution=const(5),
                   prefix_group="sys", prefix_length=99),
    )  # fmt: skip
    w = generate_workload(WorkloadSpec(clients=clients, aggregate_rate=30.0, num_requests=9))
    # all three clients share IAT trunc(1e6/10) = 99999 µs: ties in client order
    np.testing.assert_array_equal(w.arrival_us, np.repeat([99999, 199998, 299997], 3))
    assert w.tenant_names == ("acme", "") and w.client_names == ("x", "y")
    assert w.prefix_group_names == ("sys",)
    np.testing.assert_array_equal(w.tenant, [0, 1, 0] * 3)
    np.testing.assert_array_equal(w.client, [0, 1, 0] * 3)
    codes = [SLO_CLASSES.index(c) for c in ("critical", "batch", "sheddable")]
    np.testing.assert_array_equal(w.slo_class, codes * 3)
    # prefix prepended; the group's length comes from its first client (7, not 99)
    np.testing.assert_array_equal(w.prefix_group, [0, NO_PREFIX_GROUP, 0] * 3)
    np.testing.assert_array_equal(w.prefix_length, [7, 0, 7] * 3)
    np.testing.assert_array_equal(w.input_tokens, [17, 20, 37] * 3)
    np.testing.assert_array_equal(w.output_tokens, [3, 4, 5] * 3)
    expected_deadline = np.zeros(9, dtype=np.int64)  # timeout 0 or None: no deadline
    expected_deadline[0::3] = w.arrival_us[0::3] + 1_000
    np.testing.assert_array_equal(w.deadline_us, expected_deadline)


def test_distribution_workload_shape():
    w = generate_workload(distribution_spec(10, 300, 70, 35, 2, 200, 215, 80, 1, 512, 284))
    assert w.num_requests == 300
    np.testing.assert_array_equal(w.arrival_us, 99999 * np.arange(1, 301))
    suffix = w.input_tokens - 284
    assert suffix.min() >= 2 and suffix.max() <= 200 and w.output_tokens.max() <= 512
    assert np.all(w.prefix_length == 284) and w.prefix_group_names == ("shared",)
    assert np.all(w.deadline_us == 0)


def test_hundred_thousand_requests_are_fast():
    spec = WorkloadSpec(
        clients=(
            ClientSpec(arrival=ArrivalSpec("poisson")),
            ClientSpec(id="g", arrival=ArrivalSpec("gamma", cv=3.0), prefix_group="p"),
            ClientSpec(id="w", arrival=ArrivalSpec("weibull", cv=0.5), output_distribution=EXP),
        ),
        aggregate_rate=1000.0,
        num_requests=100_000,
    )
    start = time.perf_counter()
    w = generate_workload(spec)
    elapsed = time.perf_counter() - start
    assert w.num_requests == 100_000
    assert elapsed < 1.0, f"generation took {elapsed:.2f} s"


def test_head_keeps_the_first_requests_and_the_name_tables():
    w = generate_workload(two_client_spec(), seed=3)
    head = w.head(7)
    assert head.num_requests == 7
    for name in ("request_id", "arrival_us", "input_tokens", "output_tokens", "tenant",
                 "client", "slo_class", "deadline_us", "prefix_group", "prefix_length"):
        assert np.array_equal(getattr(head, name), getattr(w, name)[:7]), name
    assert (head.tenant_names, head.client_names) == (w.tenant_names, w.client_names)
    assert w.head(w.num_requests + 5) is w
