"""``cluster.gateway`` (BLIS's flow control) and its BLIS flags: clear errors naming the field or
flag and the allowed range; BLIS's unmodelled flow-control flags refused unless at their
defaults."""

from __future__ import annotations

import pytest

from blisjax.config import (
    ClusterConfig,
    ConfigError,
    GatewayConfig,
    SimConfig,
    apply_blis_flag_values,
    config_from_dict,
    config_to_dict,
)


@pytest.mark.parametrize("field, value, message", [
    ("saturation_detector", "queue", "must be one of 'never', 'utilization', 'concurrency'"),
    ("dispatch_order", "slo-deadline", "must be one of 'fifo', 'priority'"),
    ("queue_depth_threshold", 0, "> 0"),
    ("kv_cache_util_threshold", -0.5, "> 0"),
    ("max_concurrency", 0, ">= 1"),
    ("max_queue_depth", -1, ">= 0"),
    ("dispatch_tick_interval_us", 0, "[1, "),
    ("enabled", "yes", ""),
])
def test_field_errors_name_the_field_and_range(field, value, message):
    with pytest.raises(ConfigError) as err:
        ClusterConfig(gateway={field: value})
    assert err.value.path == f"cluster.gateway.{field}"
    assert message in str(err.value)


def test_unknown_key_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match="cluster.gateway.depth: unknown key; allowed keys: "
                                          "enabled, saturation_detector"):
        ClusterConfig(gateway={"depth": 3})


def test_yaml_round_trip():
    cfg = SimConfig(cluster=ClusterConfig(gateway=GatewayConfig(
        enabled=True, saturation_detector="utilization", max_queue_depth=7,
        dispatch_order="priority", dispatch_tick_interval_us=250)))
    assert config_from_dict(config_to_dict(cfg)).cluster.gateway == cfg.cluster.gateway


def test_blis_flags():
    cfg = apply_blis_flag_values(SimConfig(), {
        "flow-control": True, "saturation-detector": "concurrency", "max-concurrency": "3",
        "dispatch-order": "priority", "max-gateway-queue-depth": "9",
        "dispatch-tick-interval": "0", "queue-depth-threshold": "2.5",
        "kv-cache-util-threshold": "0.5"})
    assert cfg.cluster.gateway == GatewayConfig(
        enabled=True, saturation_detector="concurrency", max_concurrency=3,
        dispatch_order="priority", max_queue_depth=9, dispatch_tick_interval_us=1000,
        queue_depth_threshold=2.5, kv_cache_util_threshold=0.5)


@pytest.mark.parametrize("flags, flag, message", [
    ({"max-gateway-queue-depth": -2}, "--max-gateway-queue-depth", "must be an integer >= 0"),
    ({"dispatch-tick-interval": -1}, "--dispatch-tick-interval", "must be >= 0"),
    ({"dispatch-order": "slo-deadline"}, "--dispatch-order", "'fifo', 'priority'"),
    ({"per-band-capacity": 4}, "--per-band-capacity", "not modelled"),
    ({"usage-limit-threshold": 0.5}, "--usage-limit-threshold", "not modelled"),
    ({"fairness-policy": "round-robin"}, "--fairness-policy", "not modelled"),
    ({"request-ttl": 5000}, "--request-ttl", "not modelled"),
    ({"queue-shedding": True}, "--queue-shedding", "not modelled"),
    ({"in-flight-eviction": True}, "--in-flight-eviction", "not modelled"),
    ({"slo-targets": "critical=100000"}, "--slo-targets", "not modelled"),
    ({"flow-control": True, "admission-policy": "token-bucket"}, "--admission-policy",
     "replaces the admission policy"),
])
def test_flag_errors_name_the_flag(flags, flag, message):
    with pytest.raises(ConfigError) as err:
        apply_blis_flag_values(SimConfig(), flags)
    assert err.value.path == flag
    assert message in str(err.value)


def test_unmodelled_flags_at_their_defaults_change_nothing():
    cfg = apply_blis_flag_values(SimConfig(), {
        "per-band-capacity": 0, "usage-limit-threshold": "1.0",
        "fairness-policy": "global-strict", "request-ttl": 0, "queue-shedding": False,
        "in-flight-eviction": "false", "slo-targets": ""})
    assert cfg == SimConfig()
