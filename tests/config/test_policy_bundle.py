"""BLIS policy-bundle files (``--policy-config``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blisjax.config import (
    AdmissionConfig,
    ConfigError,
    PolicyConfig,
    PriorityConfig,
    RoutingConfig,
    SchedulerConfig,
    ScorerWeight,
    load_blis_policy_config,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "policies" / "example-policy.yaml"

BLIS_BUNDLE = """\
admission:
  policy: token-bucket
  token_bucket_capacity: 500
  token_bucket_refill_rate: 250.5
priority:
  policy: slo-based
routing:
  policy: weighted
  scorers:
    - name: queue-depth
      weight: 1
    - name: prefix-affinity
      weight: 5
scheduler: priority-fcfs
"""


def test_blis_bundle_file(tmp_path):
    path = tmp_path / "bundle.yaml"
    path.write_text(BLIS_BUNDLE)
    policy = load_blis_policy_config(path, PolicyConfig())
    assert policy == PolicyConfig(
        admission=AdmissionConfig(
            policy="token-bucket", token_bucket_capacity=500.0, token_bucket_refill_rate=250.5
        ),
        priority=PriorityConfig(policy="slo-based"),
        routing=RoutingConfig(
            policy="weighted",
            scorers=(ScorerWeight("queue-depth", 1.0), ScorerWeight("prefix-affinity", 5.0)),
        ),
        scheduler=SchedulerConfig(policy="priority-fcfs"),
    )
    assert load_blis_policy_config(str(path)) == policy  # str path, default base


def test_missing_and_empty_fields_keep_base():
    base = PolicyConfig(
        admission=AdmissionConfig(policy="rate-limit", rate_limit_rps=7.0),
        routing=RoutingConfig(policy="least-loaded", scorers=(ScorerWeight("load-balance", 1.0),)),
        scheduler=SchedulerConfig(policy="sjf"),
    )
    policy = load_blis_policy_config(
        {
            "admission": {"policy": "", "token_bucket_capacity": 9},
            "routing": {"scorers": []},
            "scheduler": "",
        },
        base,
    )
    assert policy.admission == AdmissionConfig(
        policy="rate-limit", rate_limit_rps=7.0, token_bucket_capacity=9.0
    )
    assert policy.routing == base.routing
    assert policy.scheduler == base.scheduler
    assert load_blis_policy_config({}, base) == base


def test_scheduler_as_mapping_and_extra_knobs():
    policy = load_blis_policy_config(
        {
            "scheduler": {"policy": "sjf"},
            "priority": {"policy": "tenant-priority", "tenant_scores": {"alice": 2}},
            "admission": {"policy": "tenant-quota", "tenant_max_in_flight": {"bob": 4}},
        },
        PolicyConfig(),
    )
    assert policy.scheduler.policy == "sjf"
    assert policy.priority.tenant_scores == (("alice", 2.0),)
    assert policy.admission.tenant_max_in_flight == (("bob", 4),)


def test_inverted_slo_maps_to_negative_age_weight():
    policy = load_blis_policy_config({"priority": {"policy": "inverted-slo"}}, PolicyConfig())
    assert policy.priority.policy == "slo-based" and policy.priority.age_weight == -1.0
    policy = load_blis_policy_config(
        {"priority": {"policy": "inverted-slo", "age_weight": 3}}, PolicyConfig()
    )
    assert policy.priority.age_weight == -3.0


@pytest.mark.parametrize(
    "bundle, path",
    [
        ({"autoscale": {}}, "policy-config.autoscale"),
        ({"admission": {"capacity": 1}}, "policy-config.admission.capacity"),
        ({"routing": {"cache_weight": 0.6}}, "policy-config.routing.cache_weight"),
        ({"scheduler": {"type": "fcfs"}}, "policy-config.scheduler.type"),
        ({"routing": "weighted"}, "policy-config.routing"),
    ],
)
def test_unknown_keys_rejected(bundle, path):
    with pytest.raises(ConfigError) as err:
        load_blis_policy_config(bundle, PolicyConfig())
    assert err.value.path == path


@pytest.mark.parametrize(
    "bundle, path",
    [
        ({"admission": {"policy": "tier-shed"}}, "policy.admission.policy"),
        ({"admission": {"token_bucket_capacity": -1}}, "policy.admission.token_bucket_capacity"),
        ({"routing": {"policy": "prefix-affinity"}}, "policy.routing.policy"),
        ({"routing": {"scorers": [{"name": "nope", "weight": 1}]}}, "policy.routing.scorers.name"),
        ({"scheduler": "reverse-priority"}, "policy.scheduler.policy"),
    ],
)
def test_invalid_values_rejected(bundle, path):
    with pytest.raises(ConfigError) as err:
        load_blis_policy_config(bundle, PolicyConfig())
    assert err.value.path == path


def test_unreadable_bundle(tmp_path):
    with pytest.raises(ConfigError, match="policy-config: cannot read"):
        load_blis_policy_config(tmp_path / "missing.yaml", PolicyConfig())


def test_shipped_example_policy():
    policy = load_blis_policy_config(EXAMPLE, PolicyConfig())
    assert policy.admission.policy == "token-bucket"
    assert policy.priority.policy == "slo-based"
    assert policy.routing.policy == "weighted" and len(policy.routing.scorers) == 3
    assert policy.scheduler.policy == "priority-fcfs"


BLIS_AUTOSCALE_BUNDLE = """\
node_pools:
  - name: east
    gpu_type: H100
    gpus_per_node: 6
    gpu_memory_gib: 80
    initial_nodes: 1
    min_nodes: 1
    max_nodes: 2
    provisioning_delay: {mean: 30, stddev: 0}
    cost_per_hour: 12
autoscaler:
  interval_us: 1500000.7
  scale_up_stabilization_window_us: 1500000
  scale_down_stabilization_window_us: 4500000
  hpa_scrape_delay: {mean: 0.25, stddev: 0}
  analyzer: {kv_cache_threshold: 0.75, scale_up_threshold: 0, avg_input_tokens: 1024}
instance_lifecycle:
  loading_delay: {mean: 2, stddev: 0.5}
"""


def test_blis_autoscaler_sections(tmp_path):
    """BLIS's autoscaling sections (docs/autoscaling.md): the blis-saturation policy with
    BLIS's windows (µs, truncated) and scrape delay, analyzer zeros keeping their defaults; the
    node pool with its delays in seconds; warm start false unless given (BLIS's default)."""
    from blisjax.config import SimConfig, apply_blis_bundle

    path = tmp_path / "bundle.yaml"
    path.write_text(BLIS_AUTOSCALE_BUNDLE)
    cfg = apply_blis_bundle(SimConfig(), path)
    a = cfg.policy.autoscaler
    assert (a.policy, a.interval_us, a.scale_up_window_us, a.scale_down_window_us) == (
        "blis-saturation", 1_500_000, 1_500_000, 4_500_000)
    assert (a.actuation_delay.mean_s, a.kv_cache_threshold, a.saturation_up_threshold,
            a.saturation_down_boundary, a.avg_input_tokens) == (0.25, 0.75, 0.8, 0.4, 1024.0)
    (pool,) = cfg.cluster.node_pools
    assert (pool.name, pool.gpus_per_node, pool.max_nodes, pool.provisioning_delay.mean_s,
            pool.cost_per_hour) == ("east", 6, 2, 30.0, 12.0)
    life = cfg.cluster.lifecycle
    assert (life.loading_delay.mean_s, life.loading_delay.stddev_s,
            life.warm_start_initial_instances) == (2.0, 0.5, False)


def test_blis_autoscaler_bundle_errors_name_the_field(tmp_path):
    from blisjax.config import SimConfig, apply_blis_bundle

    with pytest.raises(ConfigError, match="policy-config.autoscaler.analyzer.typo"):
        apply_blis_bundle(SimConfig(), {"autoscaler": {"interval_us": 1, "analyzer": {"typo": 1}}})
    with pytest.raises(ConfigError, match="node_pools.*max_nodes"):
        apply_blis_bundle(SimConfig(), {"node_pools": [{"name": "p", "max_nodes": 0}]})
    with pytest.raises(ConfigError, match=r"hpa_scrape_delay\.mean: must be"):
        apply_blis_bundle(SimConfig(), {"autoscaler": {"interval_us": 1,
                                                       "hpa_scrape_delay": {"mean": -1}}})
