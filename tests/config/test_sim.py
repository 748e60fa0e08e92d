"""SimConfig dataclasses: defaults, BC-2 (docs/semantics.md §11), and field-naming validation
errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

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
)

# ----------------------------------------------------------------------------- defaults / BC-2


def test_default_engine_config_values():
    e = EngineConfig()
    assert e.tensor_parallel_size == 1
    assert e.max_num_running_reqs == 256
    assert e.max_num_scheduled_tokens == 2048
    assert e.block_size_tokens == 16
    assert e.total_kv_blocks is None
    assert e.gpu_memory_utilization == 0.9
    assert e.enable_prefix_caching is True
    assert e.preemption_policy == "fcfs"


def test_total_gpus():
    assert (
        EngineConfig(
            tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=4
        ).total_gpus
        == 16
    )


def test_effective_expert_parallelism():
    assert (
        EngineConfig(tensor_parallel_size=2, data_parallel_size=4).effective_expert_parallelism == 8
    )


def test_reject_tensor_parallel_zero():
    with pytest.raises(
        ConfigError, match=r"^engine\.tensor_parallel_size: must be an integer >= 1, got 0$"
    ):
        EngineConfig(tensor_parallel_size=0)


def test_reject_gpu_memory_utilization_1_5():
    with pytest.raises(
        ConfigError, match=r"^engine\.gpu_memory_utilization: must be a finite number in \(0, 1\]"
    ):
        EngineConfig(gpu_memory_utilization=1.5)


def test_message_format_from_brief():
    with pytest.raises(ConfigError) as err:
        EngineConfig(max_num_running_reqs=0)
    assert str(err.value) == "engine.max_num_running_reqs: must be an integer >= 1, got 0"
    assert isinstance(err.value, ValueError)


# --------------------------------------------------------------------- every field names itself

BAD_VALUES = [
    (EngineConfig, "tensor_parallel_size", 0, "engine.tensor_parallel_size"),
    (EngineConfig, "pipeline_parallel_size", -1, "engine.pipeline_parallel_size"),
    (EngineConfig, "data_parallel_size", 0, "engine.data_parallel_size"),
    (EngineConfig, "max_num_running_reqs", 2.0, "engine.max_num_running_reqs"),
    (EngineConfig, "max_num_scheduled_tokens", 0, "engine.max_num_scheduled_tokens"),
    (EngineConfig, "block_size_tokens", True, "engine.block_size_tokens"),
    (EngineConfig, "total_kv_blocks", 0, "engine.total_kv_blocks"),
    (EngineConfig, "gpu_memory_utilization", 0.0, "engine.gpu_memory_utilization"),
    (EngineConfig, "gpu_memory_utilization", math.nan, "engine.gpu_memory_utilization"),
    (EngineConfig, "long_prefill_token_threshold", -1, "engine.long_prefill_token_threshold"),
    (EngineConfig, "max_model_len", -5, "engine.max_model_len"),
    (EngineConfig, "enable_prefix_caching", "yes", "engine.enable_prefix_caching"),
    (EngineConfig, "preemption_policy", "lifo", "engine.preemption_policy"),
    (LatencyConfig, "model", "trained-physics", "latency.model"),
    (LatencyConfig, "alpha_coeffs", (1.0, 2.0), "latency.alpha_coeffs"),
    (LatencyConfig, "alpha_coeffs", (1.0, math.inf, 2.0), "latency.alpha_coeffs[1]"),
    (LatencyConfig, "beta_coeffs", (1.0, 2.0, 3.0, 4.0), "latency.beta_coeffs"),
    (LatencyConfig, "beta_coeffs", "1,2,3", "latency.beta_coeffs"),
    (LatencyConfig, "beta_coeffs", (), "latency.beta_coeffs"),
    (LatencyConfig, "preemption_ema_gamma", 0.0, "latency.preemption_ema_gamma"),
    (LatencyConfig, "preemption_ema_gamma", 1.5, "latency.preemption_ema_gamma"),
    (ClusterConfig, "num_instances", 0, "cluster.num_instances"),
    (ClusterConfig, "admission_latency_us", -1, "cluster.admission_latency_us"),
    (ClusterConfig, "routing_latency_us", 1.5, "cluster.routing_latency_us"),
    (ClusterConfig, "snapshot_refresh_interval_us", -1, "cluster.snapshot_refresh_interval_us"),
    (ClusterConfig, "prefix_index_capacity_blocks", 0, "cluster.prefix_index_capacity_blocks"),
    (AdmissionConfig, "policy", "tier-shed", "policy.admission.policy"),
    (AdmissionConfig, "token_bucket_capacity", -1.0, "policy.admission.token_bucket_capacity"),
    (
        AdmissionConfig,
        "token_bucket_refill_rate",
        math.inf,
        "policy.admission.token_bucket_refill_rate",
    ),
    (AdmissionConfig, "rate_limit_rps", -0.1, "policy.admission.rate_limit_rps"),
    (AdmissionConfig, "rate_limit_burst", "10", "policy.admission.rate_limit_burst"),
    (
        AdmissionConfig,
        "tenant_max_in_flight",
        (("a", -1),),
        "policy.admission.tenant_max_in_flight['a']",
    ),
    (
        AdmissionConfig,
        "tenant_max_in_flight",
        (("a", 1), ("a", 2)),
        "policy.admission.tenant_max_in_flight",
    ),
    (AdmissionConfig, "tenant_max_in_flight", 5, "policy.admission.tenant_max_in_flight"),
    (
        AdmissionConfig,
        "default_tenant_max_in_flight",
        -1,
        "policy.admission.default_tenant_max_in_flight",
    ),
    (PriorityConfig, "policy", "inverted-slo", "policy.priority.policy"),
    (PriorityConfig, "age_weight", math.nan, "policy.priority.age_weight"),
    (PriorityConfig, "slo_class_scores", (("vip", 1.0),), "policy.priority.slo_class_scores key"),
    (
        PriorityConfig,
        "slo_class_scores",
        (("critical", 101.0),),
        "policy.priority.slo_class_scores['critical']",
    ),
    (PriorityConfig, "tenant_scores", (("t", math.inf),), "policy.priority.tenant_scores['t']"),
    (PriorityConfig, "default_tenant_score", None, "policy.priority.default_tenant_score"),
    (PriorityConfig, "no_deadline_slack_s", 0.0, "policy.priority.no_deadline_slack_s"),
    (RoutingConfig, "policy", "prefix-affinity", "policy.routing.policy"),
    (RoutingConfig, "scorers", (("queue-depth", 0.0),), "policy.routing.scorers"),
    (RoutingConfig, "scorers", "queue-depth:1", "policy.routing.scorers"),
    (SchedulerConfig, "policy", "reverse-priority", "policy.scheduler.policy"),
    (SLOTarget, "ttft_ms", -1.0, "metrics.slo_targets.ttft_ms"),
    (SLOTarget, "itl_ms", math.nan, "metrics.slo_targets.itl_ms"),
    (SLOTarget, "e2e_ms", "1", "metrics.slo_targets.e2e_ms"),
    (MetricsConfig, "slo_targets", (("", SLOTarget()),), "metrics.slo_targets key"),
    (MetricsConfig, "slo_targets", (("critical", 5),), "metrics.slo_targets['critical']"),
    (MetricsConfig, "fitness_weights", (("p90_ttft", 1.0),), "metrics.fitness_weights key"),
    (
        MetricsConfig,
        "fitness_weights",
        (("p99_ttft", -1.0),),
        "metrics.fitness_weights['p99_ttft']",
    ),
    (SimConfig, "model", "", "model"),
    (SimConfig, "hardware", None, "hardware"),
    (SimConfig, "engine", {"tensor_parallel_size": 1}, "engine"),
    (SimConfig, "policy", RoutingConfig(), "policy"),
    (SimConfig, "workload", ["not", "a", "mapping"], "workload"),
    (SimConfig, "seed", 2**63, "seed"),
    (SimConfig, "horizon_us", 0, "horizon_us"),
    (PolicyConfig, "routing", AdmissionConfig(), "policy.routing"),
]


@pytest.mark.parametrize(
    "cls, field, value, path", BAD_VALUES, ids=[f"{c.__name__}.{f}" for c, f, _, _ in BAD_VALUES]
)
def test_error_names_field(cls, field, value, path):
    with pytest.raises(ConfigError) as err:
        cls(**{field: value})
    assert err.value.path == path
    assert str(err.value).startswith(f"{path}: ")
    assert str(err.value) != f"{path}: "


def test_scorer_weight_errors_name_field():
    with pytest.raises(ConfigError, match=r"^policy\.routing\.scorers\.name: must be one of"):
        ScorerWeight("lora-affinity", 1.0)  # a BLIS scorer blisjax does not model
    with pytest.raises(
        ConfigError, match=r"^policy\.routing\.scorers\['queue-depth'\]\.weight: .*>= 0"
    ):
        ScorerWeight("queue-depth", -1.0)


def test_weighted_needs_a_scorer():
    with pytest.raises(ConfigError, match="policy.routing.scorers: must list at least one scorer"):
        RoutingConfig(policy="weighted", scorers=())
    assert RoutingConfig(policy="round-robin", scorers=()).scorers == ()


def test_max_model_len_must_fit_explicit_kv_blocks():
    EngineConfig(max_model_len=4096, total_kv_blocks=256, block_size_tokens=16)
    with pytest.raises(ConfigError, match=r"^engine\.max_model_len: .*ceil\(4097/16\) = 257"):
        EngineConfig(max_model_len=4097, total_kv_blocks=256, block_size_tokens=16)


def test_roofline_rules():
    LatencyConfig(model="roofline", alpha_coeffs=(1.0, 2.0, 3.0))
    with pytest.raises(ConfigError, match=r"^latency\.beta_coeffs: must be null"):
        LatencyConfig(model="roofline", beta_coeffs=(1.0, 2.0, 3.0))
    with pytest.raises(ConfigError, match=r"^engine\.data_parallel_size: must be 1"):
        SimConfig(
            latency=LatencyConfig(model="roofline"), engine=EngineConfig(data_parallel_size=2)
        )


def test_physics_accepts_any_coefficient_count():
    lat = LatencyConfig(model="physics", alpha_coeffs=(1.0,), beta_coeffs=tuple(range(11)))
    assert lat.beta_coeffs == tuple(float(x) for x in range(11))


# ------------------------------------------------------------------------ normalization, hashing


def test_values_are_normalized():
    e = EngineConfig(tensor_parallel_size=np.int64(2), gpu_memory_utilization=1)
    assert type(e.tensor_parallel_size) is int and type(e.gpu_memory_utilization) is float
    lat = LatencyConfig(alpha_coeffs=[1, 2, 3], beta_coeffs=np.array([4.0, 5.0, 6.0]))
    assert lat.alpha_coeffs == (1.0, 2.0, 3.0) and isinstance(lat.beta_coeffs, tuple)
    adm = AdmissionConfig(tenant_max_in_flight={"alice": 3, "bob": 5})
    assert adm.tenant_max_in_flight == (("alice", 3), ("bob", 5))
    routing = RoutingConfig(scorers=[("queue-depth", 1), {"name": "load-balance", "weight": 2}])
    assert routing.scorers == (ScorerWeight("queue-depth", 1.0), ScorerWeight("load-balance", 2.0))
    metrics = MetricsConfig(
        slo_targets={"critical": {"ttft_ms": 5}}, fitness_weights={"throughput": 1}
    )
    assert metrics.slo_targets == (("critical", SLOTarget(ttft_ms=5.0)),)


def test_configs_are_hashable_and_frozen():
    a = SimConfig(workload={"version": "2", "clients": []})
    b = SimConfig(workload={"version": "2", "clients": []})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, SimConfig()}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.seed = 1  # type: ignore[misc]


def test_workload_is_copied():
    spec = {"version": "2", "clients": [{"id": "x"}]}
    cfg = SimConfig(workload=spec)
    spec["clients"][0]["id"] = "changed"
    assert cfg.workload["clients"][0]["id"] == "x"


def test_policy_helpers():
    pri = PriorityConfig(tenant_scores={"alice": 2.0}, default_tenant_score=-1.0)
    assert pri.slo_class_score("critical") == 4.0 and pri.slo_class_score("") == 3.0
    assert pri.slo_class_score("background") == -3.0
    assert PriorityConfig(slo_class_scores={"critical": 9.0}).slo_class_score("batch") == 3.0
    assert pri.tenant_score("alice") == 2.0 and pri.tenant_score("bob") == -1.0
    adm = AdmissionConfig(tenant_max_in_flight={"alice": 3}, default_tenant_max_in_flight=7)
    assert adm.max_in_flight("alice") == 3 and adm.max_in_flight("zed") == 7
    routing = RoutingConfig()
    assert routing.normalized_weights() == (3 / 7, 2 / 7, 2 / 7)


def test_default_sim_config():
    cfg = SimConfig()
    assert cfg.model == "meta-llama/llama-3.1-8b-instruct" and cfg.hardware == "H100"
    assert cfg.seed == 42 and cfg.horizon_us == 2**63 - 1
    assert cfg.policy.routing.scorers == (
        ScorerWeight("prefix-affinity", 3.0),
        ScorerWeight("queue-depth", 2.0),
        ScorerWeight("kv-utilization", 2.0),
    )
    assert dict(cfg.policy.priority.slo_class_scores) == {
        "critical": 4.0,
        "standard": 3.0,
        "": 3.0,
        "batch": -1.0,
        "sheddable": -2.0,
        "background": -3.0,
    }


def test_config_error_single_message():
    err = ConfigError("workload: none given")
    assert str(err) == "workload: none given" and err.path == ""


@pytest.mark.parametrize("make, path", [
    (lambda v: PriorityConfig(tenant_scores=(("b", v),)),
     r"policy\.priority\.tenant_scores\['b'\]"),
    (lambda v: PriorityConfig(age_weight=v), r"policy\.priority\.age_weight"),
    (lambda v: AdmissionConfig(token_bucket_refill_rate=v),
     r"policy\.admission\.token_bucket_refill_rate"),
    (lambda v: ScorerWeight("queue-depth", v), r"policy\.routing\.scorers\['queue-depth'\]\.weight"),
])
@pytest.mark.parametrize("value", [1.1125369292536007e-308, 5e-324, 9.9e-31, 1.01e30])
def test_policy_knobs_outside_the_engines_float_range_are_refused(make, path, value):
    # XLA:CPU flushes subnormal floats to zero, so a subnormal tenant score (1e-308) makes the
    # JAX engine order a queue differently from the reference; knobs are 0 or of a magnitude
    # in [1e-30, 1e30], where no product with the engine's quantities is subnormal.
    with pytest.raises(ConfigError, match=rf"^{path}: must be 0 or between 1e-30 and 1e\+30"):
        make(value)
    for fine in (0.0, 1e-30, 1e30):
        make(fine)
