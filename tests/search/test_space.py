"""Search spaces: YAML parsing and errors, unit-cube mapping (bounds, log, int, categorical,
reflection), round trips, validation against a configuration, get_knob."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blisjax.config import ConfigError, load_config, resolve_config
from blisjax.engine.population import set_knob
from blisjax.engine.static import build_static
from search.evaluate import make_workload
from search.space import (
    ChoiceKnob,
    NumericKnob,
    SearchSpace,
    get_knob,
    load_space,
    reflect_unit,
    space_from_mapping,
)
from tests.paths import REPO
from tests.search.conftest import TINY_CONFIG, TINY_SPACE

SPACE = {"knobs": {
    "routing.scorers.prefix-affinity": {"low": 0.01, "high": 100, "scale": "log"},
    "admission.token_bucket_capacity": {"low": 1000, "high": 5000, "type": "int"},
    "admission.token_bucket_refill_rate": {"low": 10.0, "high": 20.0},
    "scheduler.policy": {"choices": ["fcfs", "priority-fcfs", "sjf"]},
}}


def test_linear_log_and_int_mapping_hand_values():
    s = space_from_mapping(SPACE)
    lin = s.knob("admission.token_bucket_refill_rate")
    assert lin.from_unit(0.0) == 10.0 and lin.from_unit(1.0) == 20.0
    assert lin.from_unit(0.25) == 12.5
    log = s.knob("routing.scorers.prefix-affinity")
    assert log.from_unit(0.5) == pytest.approx(1.0, rel=1e-12)  # geometric middle of 1e-2, 1e2
    assert log.from_unit(0.75) == pytest.approx(10.0, rel=1e-12)
    assert log.from_unit(0.0) == 0.01 and log.from_unit(1.0) == 100.0
    cap = s.knob("admission.token_bucket_capacity")
    assert cap.from_unit(0.5) == 3000 and isinstance(cap.from_unit(0.3), int)
    assert cap.from_unit(0.3) == 2200  # 1000 + 0.3 * 4000


def test_categorical_bins_and_centres():
    k = ChoiceKnob("scheduler.policy", ("fcfs", "priority-fcfs", "sjf"))
    assert [k.from_unit(u) for u in (0.0, 0.33, 0.34, 0.66, 0.67, 1.0)] == \
        ["fcfs", "fcfs", "priority-fcfs", "priority-fcfs", "sjf", "sjf"]
    assert k.to_unit("fcfs") == pytest.approx(1 / 6) and k.to_unit("sjf") == pytest.approx(5 / 6)
    with pytest.raises(ConfigError, match="not one of the choices"):
        k.to_unit("lifo")


def test_reflection_keeps_every_value_in_bounds():
    assert reflect_unit(1.2) == pytest.approx(0.8)
    assert reflect_unit(-0.1) == pytest.approx(0.1)
    assert reflect_unit(2.3) == pytest.approx(0.3)
    assert reflect_unit(-1.75) == pytest.approx(0.25)
    assert reflect_unit(float("nan")) == 0.5 and reflect_unit(float("inf")) == 0.5
    s = space_from_mapping(SPACE)
    rng = np.random.default_rng(0)
    pop = {n: rng.normal(0.5, 3.0, 200) for n in s.names}
    for knobs in s.decode(pop):
        for name, value in knobs.items():
            knob = s.knob(name)
            assert knob.contains(value), (name, value)


def test_round_trip_encode_decode():
    s = space_from_mapping(SPACE)
    sets = [{"routing.scorers.prefix-affinity": 0.37, "admission.token_bucket_capacity": 4321,
             "admission.token_bucket_refill_rate": 17.5, "scheduler.policy": "sjf"},
            {"routing.scorers.prefix-affinity": 100.0, "admission.token_bucket_capacity": 1000,
             "admission.token_bucket_refill_rate": 10.0, "scheduler.policy": "fcfs"}]
    back = s.decode(s.encode(sets))
    for a, b in zip(sets, back, strict=True):
        assert b["scheduler.policy"] == a["scheduler.policy"]
        assert b["admission.token_bucket_capacity"] == a["admission.token_bucket_capacity"]
        for name in ("routing.scorers.prefix-affinity", "admission.token_bucket_refill_rate"):
            assert b[name] == pytest.approx(a[name], rel=1e-12)
    assert space_from_mapping(s.to_mapping()) == s


def test_template_uses_init_or_centre():
    s = space_from_mapping({"knobs": {
        "routing.scorers.queue-depth": {"low": 0, "high": 4, "init": 1},
        "scheduler.policy": {"choices": ["fcfs", "sjf"], "init": "sjf"}}})
    t = s.template()
    assert float(t["routing.scorers.queue-depth"]) == 0.25
    assert float(t["scheduler.policy"]) == 0.75
    assert s.decode_one(t) == {"routing.scorers.queue-depth": 1.0, "scheduler.policy": "sjf"}


@pytest.mark.parametrize("knobs, match", [
    ({"a.b": {"low": 1, "high": 1}}, r"space.knobs.a.b.high: must be > low"),
    ({"a.b": {"low": 0, "high": 1, "scale": "log"}}, r"low: must be > 0 with scale 'log'"),
    ({"a.b": {"low": 0, "high": 1, "scale": "cubic"}}, r"scale: must be 'linear' or 'log'"),
    ({"a.b": {"low": 0, "high": 1, "step": 2}}, r"a.b.step: unknown key"),
    ({"a.b": {"high": 1}}, r"a.b.low: is required"),
    ({"a.b": {"choices": []}}, r"choices: must be a non-empty list"),
    ({"a.b": {"choices": ["x", "x"]}}, r"must not repeat"),
    ({"a.b": {"low": 0, "high": 1, "init": 2}}, r"init: must be a float in \[0.0, 1.0\]"),
    ({"a.b": {"low": 0.2, "high": 0.8, "type": "int"}}, r"no integer"),
    ({"a.b": "fast"}, r"must be a mapping"),
])
def test_space_errors_name_the_field(knobs, match):
    with pytest.raises(ConfigError, match=match):
        space_from_mapping({"knobs": knobs})


def test_space_top_level_errors():
    with pytest.raises(ConfigError, match="space.knobs: must be a non-empty mapping"):
        space_from_mapping({"knobs": {}})
    with pytest.raises(ConfigError, match="space.grid: unknown key"):
        space_from_mapping({"knobs": {"a.b": [1, 2]}, "grid": 3})
    with pytest.raises(ConfigError, match="duplicate knob"):
        SearchSpace((NumericKnob("a", 0, 1), NumericKnob("a", 0, 2)))


def test_validate_against_config_rejects_bad_knobs():
    cfg = load_config(TINY_CONFIG)
    load_space(TINY_SPACE).validate_against(cfg)
    bad_name = space_from_mapping({"knobs": {"routing.scorer.x": {"low": 0, "high": 1}}})
    with pytest.raises(ConfigError, match="routing.scorer.x"):
        bad_name.validate_against(cfg)
    bad_value = space_from_mapping({"knobs": {"scheduler.policy": {"choices": ["fcfs", "lifo"]}}})
    with pytest.raises(ConfigError, match="'lifo' is rejected"):
        bad_value.validate_against(cfg)
    negative = space_from_mapping({"knobs": {"admission.token_bucket_capacity":
                                             {"low": -5, "high": 5}}})
    with pytest.raises(ConfigError, match="-5.0 is rejected"):
        negative.validate_against(cfg)


def test_get_knob_inverts_set_knob():
    cfg = load_config(TINY_CONFIG)
    assert get_knob(cfg, "routing.scorers.load-balance") == 1.0
    assert get_knob(cfg, "routing.scorers.kv-utilization") == 0.0  # absent scorer = weight 0
    for name, value in (("routing.scorers.queue-depth", 2.5), ("scheduler.policy", "sjf"),
                        ("admission.token_bucket_capacity", 1234.0),
                        ("engine.preemption_policy", "priority"), ("priority.policy", "slo-class"),
                        ("engine.kv_cpu_blocks", 64), ("engine.kv_transfer_bandwidth", 8.0),
                        ("engine.kv_transfer_base_latency_us", 25), ("hardware", "A100-80"),
                        ("engine.total_kv_blocks", 100)):
        assert get_knob(set_knob(cfg, name, value), name) == value
    with pytest.raises(ConfigError, match="not a per-lane"):
        get_knob(cfg, "engine.block_size_tokens")


def test_load_space_reports_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="--space: cannot read"):
        load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("knobs: [unclosed")
    with pytest.raises(ConfigError, match="--space: cannot read"):
        load_space(bad)


def test_grid_points_cover_every_combination():
    s = space_from_mapping({"knobs": {"a.x": {"low": 0, "high": 1},
                                      "a.y": {"choices": ["p", "q"]}}})
    pts = s.grid_points(3)
    assert len(pts) == 6
    assert {(p["a.x"], p["a.y"]) for p in pts} == {(x, y) for x in (0.0, 0.5, 1.0)
                                                  for y in ("p", "q")}
    assert math.isclose(s.knob("a.x").grid(1)[0], 0.5)


def test_decoded_knobs_below_the_configs_smallest_magnitude_are_zero():
    # configs refuse nonzero policy floats below 1e-30 in magnitude (the JAX engine flushes
    # subnormals); a unit coordinate that lands there decodes to 0 instead of an error
    knob = NumericKnob("policy.routing.scorers.queue-depth", 0, 3)
    assert knob.from_unit(1e-32) == 0.0
    assert knob.from_unit(1e-20) == 0 + 1e-20 * 3  # the linear map, untouched


def test_a_cpu_tier_size_knob_compiles_the_tier_at_its_largest_size():
    """Every generation of a search over the tier's size runs one program: its capacity is
    the knob's upper bound, not the largest size a generation happens to draw."""
    from search.api import search_capacities

    space = load_space(REPO / "configs/search/cpu-tier-space.yaml")
    assert search_capacities(space) == {"cpu_tier_blocks": 1024}
    assert search_capacities(load_space(REPO / "configs/search/prefix-affinity-space.yaml")) == {}


def test_a_settings_knob_compiles_each_lanes_reading_of_its_own():
    """A search over the token budget or a latency runs one program in every generation, also
    one whose lanes all happen to draw the base configuration's value."""
    from search.api import search_capacities

    for name in ("engine.max_num_running_reqs", "cluster.routing_latency_us"):
        space = space_from_mapping({"knobs": {name: {"low": 1, "high": 8, "type": "int"}}})
        assert search_capacities(space) == {"lane_settings": True}
    resolved = resolve_config(load_config(TINY_CONFIG))
    w = make_workload(resolved.config, 1)
    assert build_static(resolved, w, lane_settings=True).features.lane_settings
    assert not build_static(resolved, w).features.lane_settings


def test_a_gpu_type_knob_compiles_every_choices_latency():
    """Every generation of a search over GPU types runs one program: it holds the latency of
    each choice from the start (``build_static(gpus=...)``), and the space is checked against
    the configuration before anything runs."""
    from search.api import search_capacities

    space = load_space(REPO / "configs/search/gpu-type-space.yaml")
    assert search_capacities(space) == {"sized_lanes": True,
                                        "gpus": ("H100", "A100-80", "A100-SXM")}
    space.validate_against(load_config(REPO / "configs/search/gpu-type.yaml"))
    bad = space_from_mapping({"knobs": {"hardware": {"choices": ["H100", "B200"]}}})
    with pytest.raises(ConfigError, match="hardware: unknown GPU 'B200'"):
        bad.validate_against(load_config(REPO / "configs/search/gpu-type.yaml"))
