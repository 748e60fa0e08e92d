"""Our YAML schema: loading, unknown keys, round trips, shipped default experiment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from blisjax.config import (
    AdmissionConfig,
    ClusterConfig,
    ConfigError,
    EngineConfig,
    LatencyConfig,
    MetricsConfig,
    PolicyConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
    ScorerWeight,
    SimConfig,
    SLOTarget,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    resolve_config,
    save_config,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_YAML = REPO / "configs" / "default.yaml"
PACKAGED_DEFAULT_YAML = REPO / "blisjax" / "data" / "default.yaml"

CUSTOM = SimConfig(
    model="qwen/qwen2.5-7b-instruct",
    hardware="A100-80",
    engine=EngineConfig(
        tensor_parallel_size=4,
        data_parallel_size=2,
        max_num_running_reqs=64,
        total_kv_blocks=5000,
        gpu_memory_utilization=0.85,
        long_prefill_token_threshold=512,
        max_model_len=4096,
        enable_prefix_caching=False,
        preemption_policy="priority",
    ),
    latency=LatencyConfig(alpha_coeffs=(0.1, 1e-7, 3.0), beta_coeffs=(5752.705191348184, 0.1, 2.0)),
    cluster=ClusterConfig(
        num_instances=8,
        admission_latency_us=10,
        routing_latency_us=20,
        snapshot_refresh_interval_us=50000,
        prefix_index_capacity_blocks=500,
    ),
    policy=PolicyConfig(
        admission=AdmissionConfig(
            policy="tenant-quota", tenant_max_in_flight=(("alice", 3), ("", 9))
        ),
        priority=PriorityConfig(
            policy="slo-class",
            slo_class_scores=(("", -1.5), ("critical", 100.0)),
            tenant_scores=(("bob", 0.25),),
            age_weight=-2.0,
        ),
        routing=RoutingConfig(
            policy="weighted",
            scorers=(ScorerWeight("load-balance", 1.0), ScorerWeight("queue-depth", 0.0)),
        ),
        scheduler=SchedulerConfig(policy="sjf"),
    ),
    workload={"version": "2", "aggregate_rate": 5, "clients": [{"id": "c", "rate_fraction": 1}]},
    metrics=MetricsConfig(
        slo_targets=(("default", SLOTarget(ttft_ms=1.5)), ("critical", SLOTarget(10, 2, 300))),
        fitness_weights=(("throughput", 0.5), ("p99_ttft", 0.25)),
    ),
    seed=-7,
    horizon_us=10**12,
)


@pytest.mark.parametrize("cfg", [SimConfig(), CUSTOM], ids=["defaults", "custom"])
def test_dict_round_trip(cfg):
    assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize("cfg", [SimConfig(), CUSTOM], ids=["defaults", "custom"])
def test_yaml_file_round_trip(cfg, tmp_path):
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    loaded = load_config(path)
    assert loaded == cfg
    assert loaded.latency.beta_coeffs == cfg.latency.beta_coeffs  # floats written exactly
    assert loaded.workload == cfg.workload


def test_yaml_uses_mappings_for_tables():
    data = yaml.safe_load(dump_config(CUSTOM))
    assert data["policy"]["priority"]["slo_class_scores"] == {"": -1.5, "critical": 100.0}
    assert data["policy"]["routing"]["scorers"][0] == {"name": "load-balance", "weight": 1.0}
    assert data["metrics"]["slo_targets"]["critical"] == {
        "ttft_ms": 10.0,
        "itl_ms": 2.0,
        "e2e_ms": 300.0,
    }
    assert data["policy"]["scheduler"] == {"policy": "sjf"}


def test_partial_yaml_takes_defaults():
    cfg = config_from_dict({"engine": {"tensor_parallel_size": 2}, "policy": {"scheduler": "sjf"}})
    assert cfg.engine == EngineConfig(tensor_parallel_size=2)
    assert cfg.policy.scheduler.policy == "sjf"
    assert cfg.cluster == ClusterConfig()
    assert config_from_dict({}) == config_from_dict(None) == SimConfig()


def test_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == SimConfig()


@pytest.mark.parametrize(
    "data, path",
    [
        ({"engin": {}}, "engin"),
        ({"engine": {"tp": 2}}, "engine.tp"),
        ({"latency": {"alpha": [1, 2, 3]}}, "latency.alpha"),
        ({"cluster": {"instances": 2}}, "cluster.instances"),
        ({"policy": {"router": {}}}, "policy.router"),
        ({"policy": {"routing": {"weights": []}}}, "policy.routing.weights"),
        ({"policy": {"scheduler": {"name": "fcfs"}}}, "policy.scheduler.name"),
        ({"metrics": {"slo": {}}}, "metrics.slo"),
        (
            {"metrics": {"slo_targets": {"critical": {"ttft": 1}}}},
            "metrics.slo_targets['critical'].ttft",
        ),
    ],
)
def test_unknown_keys_named_with_allowed_list(data, path):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert err.value.path == path
    assert "unknown key; allowed keys:" in str(err.value)


def test_unknown_top_level_key_lists_sections():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"modle": "x"})
    for key in (
        "model",
        "hardware",
        "engine",
        "latency",
        "cluster",
        "policy",
        "workload",
        "metrics",
        "seed",
        "horizon_us",
    ):
        assert key in str(err.value)


@pytest.mark.parametrize(
    "data, path",
    [
        ({"engine": 5}, "engine"),
        ({"engine": {"block_size_tokens": "16"}}, "engine.block_size_tokens"),
        ({"latency": {"alpha_coeffs": 3}}, "latency.alpha_coeffs"),
        ({"policy": {"routing": {"scorers": [{"name": "queue-depth"}]}}}, "policy.routing.scorers"),
        (
            {"policy": {"admission": {"tenant_max_in_flight": [1, 2]}}},
            "policy.admission.tenant_max_in_flight",
        ),
        ({"workload": "spec.yaml"}, "workload"),
        ([1, 2], "config"),
    ],
)
def test_bad_values_named(data, path):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert err.value.path == path


def test_invalid_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("engine: [unclosed")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


# ----------------------------------------------------------------------------- shipped default


def test_default_yaml_loads_and_resolves():
    cfg = load_config(DEFAULT_YAML)
    assert cfg.model == "meta-llama/llama-3.1-8b-instruct" and cfg.hardware == "H100"
    assert cfg.engine.tensor_parallel_size == 1 and cfg.latency.model == "blackbox"
    assert cfg.cluster.num_instances == 4
    assert cfg.policy.routing.policy == "weighted"
    assert cfg.policy.routing.scorers == RoutingConfig().scorers
    clients = cfg.workload["clients"]
    assert {c["tenant_id"] for c in clients} == {"alice", "bob"}
    assert {c["slo_class"] for c in clients} == {"critical", "standard"}
    assert any("prefix_group" in c for c in clients)
    assert cfg.workload["aggregate_rate"] == 30 and cfg.workload["num_requests"] == 1000
    assert cfg.metrics.slo_targets and cfg.metrics.fitness_weights
    resolved = resolve_config(cfg)
    assert resolved.total_kv_blocks == 26312
    assert resolved.alpha == (232.46191091038054, 1.752360364195244, 3357.4400353290152)
    assert resolved.beta == (5752.705191348184, 17.25086436834028, 5.999143920128404)


def test_packaged_default_is_identical_to_configs_default():
    assert PACKAGED_DEFAULT_YAML.read_text() == DEFAULT_YAML.read_text()
