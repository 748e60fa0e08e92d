"""Workload-spec parsing and validation: BLIS YAML keys, v1 upgrade, errors name the field."""

import math

import pytest
import yaml

from blisjax.workload import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    WorkloadSpec,
    distribution_spec,
    parse_workload_spec,
)

GAUSS = {"type": "gaussian", "params": {"mean": 100, "std_dev": 10, "min": 1, "max": 200}}


def client(**overrides):
    data = {
        "id": "c",
        "rate_fraction": 1.0,
        "arrival": {"process": "poisson"},
        "input_distribution": GAUSS,
        "output_distribution": GAUSS,
    }
    data.update(overrides)
    return data


def spec_dict(*clients, **top):
    data = {"version": "2", "aggregate_rate": 10.0, "num_requests": 50, "clients": list(clients)}
    data.update(top)
    return data


FULL_YAML = """
version: "2"
seed: 7
category: language
aggregate_rate: 25.5
horizon: 60000000
num_requests: 1000
clients:
  - id: chat
    tenant_id: acme
    slo_class: critical
    rate_fraction: 0.7
    arrival: {process: gamma, cv: 2.5}
    input_distribution:
      type: gaussian
      params: {mean: 512, std_dev: 256, min: 2, max: 7000}
    output_distribution:
      type: exponential
      params: {mean: 128}
    prefix_group: sys
    prefix_length: 300
    timeout: 5000000
    slo_target_us: 200000
    model: llama
    streaming: true
  - id: batch
    slo_class: batch
    rate_fraction: 0.3
    arrival: {process: weibull, cv: 0.5}
    input_distribution:
      type: empirical
      params: {"64": 0.25, "128": 0.75}
    output_distribution: {type: constant, params: {value: 16}}
    prefix_group: sys
"""


def test_parse_full_yaml_file(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(FULL_YAML)
    spec = parse_workload_spec(path)
    assert (spec.version, spec.seed, spec.category) == ("2", 7, "language")
    assert (spec.aggregate_rate, spec.horizon_us, spec.num_requests) == (25.5, 60_000_000, 1000)
    chat, batch = spec.clients
    assert (chat.id, chat.tenant_id, chat.slo_class, chat.rate_fraction) == (
        "chat",
        "acme",
        "critical",
        0.7,
    )
    assert chat.arrival == ArrivalSpec("gamma", cv=2.5)
    assert chat.input_distribution == DistSpec(
        "gaussian", {"mean": 512, "std_dev": 256, "min": 2, "max": 7000}
    )
    assert chat.output_distribution == DistSpec("exponential", {"mean": 128})
    assert (chat.prefix_group, chat.prefix_length) == ("sys", 300)
    assert (chat.timeout_us, chat.slo_target_us) == (5_000_000, 200_000)
    assert batch.input_distribution.bins == (64, 128)
    assert batch.input_distribution.probabilities == (0.25, 0.75)
    assert batch.prefix_length == 50  # BLIS default when the key is absent
    assert batch.timeout_us is None


def test_parse_accepts_a_loaded_mapping():
    spec = parse_workload_spec(yaml.safe_load(FULL_YAML))
    assert len(spec.clients) == 2


def test_v1_class_names_are_upgraded():
    data = spec_dict(client(slo_class="realtime"), client(slo_class="interactive"), version="1")
    spec = parse_workload_spec(data)
    assert [c.slo_class for c in spec.clients] == ["critical", "standard"]
    assert spec.version == "2"


def test_v1_class_name_in_a_v2_spec_is_an_error():
    with pytest.raises(ValueError, match=r"clients\[0\]\.slo_class.*v1 name"):
        parse_workload_spec(spec_dict(client(slo_class="realtime")))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (spec_dict(client(), horizn=5), r"^horizn: unknown key"),
        (spec_dict(client(), client(rate_fractoin=1)), r"^clients\[1\]\.rate_fractoin: unknown"),
        (spec_dict(client(arrival={"process": "gamma", "cvv": 2})), r"clients\[0\]\.arrival\.cvv"),
        (
            spec_dict(client(input_distribution={"type": "gaussian", "parms": {}})),
            r"clients\[0\]\.input_distribution\.parms: unknown key",
        ),
        (
            spec_dict(client(output_distribution={"type": "exponential", "params": {"mu": 1}})),
            r"clients\[0\]\.output_distribution\.params\.mu: unknown parameter",
        ),
    ],
)
def test_unknown_keys_are_named(data, where):
    with pytest.raises(ValueError, match=where):
        parse_workload_spec(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (spec_dict(client(), client(arrival={"process": "gamma", "cv": 0})),
         r"^clients\[1\]\.arrival\.cv: must be > 0"),
        (spec_dict(client(arrival={"process": "weibull", "cv": 20})),
         r"^clients\[0\]\.arrival\.cv: must be <= 10\.4"),
        (spec_dict(client(arrival={"process": "bursty", "pareto_alpha": 1.0})),
         r"^clients\[0\]\.arrival\.pareto_alpha: must be > 1"),
        (spec_dict(client(arrival={"process": "periodic", "period_us": 0})),
         r"^clients\[0\]\.arrival\.period_us: must be >= 1"),
        (spec_dict(client(arrival={"process": "periodic", "jitter_us": -3})),
         r"^clients\[0\]\.arrival\.jitter_us: must be >= 0"),
        (spec_dict(client(arrival={"process": "zipf"})),
         r"^clients\[0\]\.arrival\.process: unknown value 'zipf'"),
        (spec_dict(client(arrival={"cv": 1})), r"^clients\[0\]\.arrival\.process: required"),
        (spec_dict(client(rate_fraction=-1)), r"^clients\[0\]\.rate_fraction: must be > 0"),
        (spec_dict(client(slo_class="gold")), r"^clients\[0\]\.slo_class: unknown value 'gold'"),
        (spec_dict(client(timeout=-5)), r"^clients\[0\]\.timeout: must be >= 0"),
        (spec_dict(client(prefix_length=-1)), r"^clients\[0\]\.prefix_length: must be >= 0"),
        (spec_dict(client(), aggregate_rate=0), r"^aggregate_rate: must be > 0"),
        (spec_dict(client(), aggregate_rate=math.inf), r"^aggregate_rate: must be finite"),
        (spec_dict(client(), horizon=0), r"^horizon: must be >= 1"),
        (spec_dict(client(), category="video"), r"^category: unknown value"),
        (spec_dict(client(), version="3"), r"^version: must be"),
        (spec_dict(), r"^clients: must be a non-empty list"),
        (spec_dict(client(input_distribution=None)), r"^clients\[0\]\.input_distribution: required"),
        (spec_dict(client(input_distribution={"type": "gaussian", "params": {"mean": 5}})),
         r"^clients\[0\]\.input_distribution\.params\.std_dev: required"),
        (spec_dict(client(input_distribution={
            "type": "gaussian", "params": {"mean": 5, "std_dev": 1, "min": 9, "max": 3}})),
         r"^clients\[0\]\.input_distribution\.params\.min: must be <= max"),
        (spec_dict(client(input_distribution={
            "type": "gaussian", "params": {"mean": 5, "std_dev": -1, "min": 1, "max": 3}})),
         r"^clients\[0\]\.input_distribution\.params\.std_dev: must be >= 0"),
        (spec_dict(client(input_distribution={
            "type": "uniform", "params": {"min": 1.5, "max": 3}})),
         r"^clients\[0\]\.input_distribution\.params\.min: must be an integer"),
        (spec_dict(client(output_distribution={"type": "exponential", "params": {"mean": 0}})),
         r"^clients\[0\]\.output_distribution\.params\.mean: must be > 0"),
        (spec_dict(client(output_distribution={"type": "empirical", "params": {"x": 1}})),
         r"^clients\[0\]\.output_distribution\.params\.x: empirical bin must be an integer"),
        (spec_dict(client(output_distribution={"type": "empirical", "params": {"5": 0}})),
         r"^clients\[0\]\.output_distribution\.probabilities: must have a positive sum"),
        (spec_dict(client(output_distribution={
            "type": "empirical", "bins": [1, 2], "probabilities": [1.0]})),
         r"^clients\[0\]\.output_distribution\.probabilities: length 1 differs"),
        (spec_dict(client(output_distribution={"type": "beta"})),
         r"^clients\[0\]\.output_distribution\.type: unknown value 'beta'"),
        (spec_dict(client(output_distribution={"type": "constant", "file": "x.json"})),
         r"^clients\[0\]\.output_distribution\.file: .*not supported"),
    ],
)  # fmt: skip
def test_invalid_values_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        parse_workload_spec(data)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (spec_dict(client(), cohorts=[{"id": "x"}]), "cohorts"),
        (spec_dict(client(closed_loop=True)), r"clients\[0\]\.closed_loop"),
        (spec_dict(client(lifecycle=None), client(reasoning={"reason_ratio_distribution": {
            "type": "constant", "params": {"value": 0.5}}})),
         r"clients\[1\]\.reasoning"),
    ],
)  # fmt: skip
def test_unsupported_blis_features_are_rejected(data, key):
    with pytest.raises(ValueError, match=key + ".*not supported"):
        parse_workload_spec(data)


def test_blis_zero_conventions():
    spec = parse_workload_spec(
        spec_dict(client(prefix_group="g", prefix_length=0, timeout=0), num_requests=0, horizon=9)
    )
    assert spec.num_requests is None  # 0 = unlimited
    assert spec.clients[0].prefix_length == 50  # 0 with a group = default
    assert spec.clients[0].timeout_us == 0  # explicit 0 = no timeout


def test_integral_floats_from_yaml_become_ints():
    spec = parse_workload_spec(spec_dict(client(timeout=3.0e8), horizon=1.0e9))
    assert spec.clients[0].timeout_us == 300_000_000 and isinstance(spec.horizon_us, int)


def test_dataclasses_are_validated_on_construction():
    bad = ClientSpec(arrival=ArrivalSpec("gamma", cv=-1.0))
    with pytest.raises(ValueError, match=r"^clients\[1\]\.arrival\.cv: must be > 0"):
        WorkloadSpec(clients=(ClientSpec(), bad), num_requests=5)
    with pytest.raises(ValueError, match=r"clients\[0\]\.prefix_length: must be >= 1"):
        WorkloadSpec(clients=[ClientSpec(prefix_group="g", prefix_length=0)], num_requests=5)


def test_distribution_spec_matches_blis_cli_mode():
    spec = distribution_spec(10, 300, 70, 35, 2, 200, 215, 80, 1, 512, prefix_tokens=284)
    (c,) = spec.clients
    assert (spec.aggregate_rate, spec.num_requests, spec.horizon_us) == (10, 300, None)
    assert c.arrival.process == "constant"
    assert c.input_distribution == DistSpec(
        "gaussian", {"mean": 70, "std_dev": 35, "min": 2, "max": 200}
    )
    assert c.output_distribution == DistSpec(
        "gaussian", {"mean": 215, "std_dev": 80, "min": 1, "max": 512}
    )
    assert (c.prefix_group, c.prefix_length, c.timeout_us) == ("shared", 284, None)


def test_distribution_spec_defaults_and_no_prefix():
    (c,) = distribution_spec(1, 100).clients
    assert c.prefix_group == ""
    assert c.input_distribution.params == {"mean": 512, "std_dev": 256, "min": 2, "max": 7000}
    assert c.output_distribution.params == {"mean": 512, "std_dev": 256, "min": 2, "max": 7000}
