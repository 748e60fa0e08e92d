"""BLIS-named flags: parsing, precedence over config and policy bundle, error naming."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from blisjax.config import (
    ConfigError,
    LatencyConfig,
    ScorerWeight,
    SimConfig,
    add_blis_flags,
    apply_blis_flag_values,
    apply_blis_flags,
    resolve_config,
)
from tests.paths import GOLDEN_CASES, GOLDEN_DIR


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_blis_flags(parser)
    return parser.parse_args(argv)


def test_all_flags_default_to_none():
    ns = _parse([])
    assert all(v is None for v in vars(ns).values())
    assert apply_blis_flags(SimConfig(), ns) == SimConfig()


def test_aliases_share_dest():
    assert _parse(["--max-num-seqs", "8"]).max_num_running_reqs == 8
    assert _parse(["--max-num-running-reqs", "9"]).max_num_running_reqs == 9
    assert _parse(["--max-num-batched-tokens", "64"]).max_num_scheduled_tokens == 64
    assert _parse(["--max-num-scheduled-tokens", "65"]).max_num_scheduled_tokens == 65


def test_flags_override_config():
    argv = [
        "--model",
        "qwen/qwen2.5-7b-instruct",
        "--hardware",
        "A100-80",
        "--tp",
        "4",
        "--max-num-seqs",
        "128",
        "--max-num-batched-tokens",
        "4096",
        "--total-kv-blocks",
        "9000",
        "--block-size-in-tokens",
        "32",
        "--long-prefill-token-threshold",
        "256",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.8",
        "--latency-model",
        "blackbox",
        "--alpha-coeffs",
        "1,2.5,0",
        "--beta-coeffs",
        "10,0.5,1e-3",
        "--num-instances",
        "3",
        "--admission-latency",
        "5",
        "--routing-latency",
        "6",
        "--snapshot-refresh-interval",
        "50000",
        "--routing-policy",
        "weighted",
        "--routing-scorers",
        "queue-depth:1, load-balance:2.5",
        "--admission-policy",
        "token-bucket",
        "--token-bucket-capacity",
        "100",
        "--token-bucket-refill-rate",
        "10.5",
        "--priority-policy",
        "slo-based",
        "--scheduler",
        "priority-fcfs",
        "--preemption-policy",
        "priority",
        "--seed",
        "7",
        "--horizon",
        "1000000",
    ]
    cfg = apply_blis_flags(SimConfig(), _parse(argv))
    e = cfg.engine
    assert (cfg.model, cfg.hardware, e.tensor_parallel_size) == (
        "qwen/qwen2.5-7b-instruct",
        "A100-80",
        4,
    )
    assert (e.max_num_running_reqs, e.max_num_scheduled_tokens, e.total_kv_blocks) == (
        128,
        4096,
        9000,
    )
    assert (e.block_size_tokens, e.long_prefill_token_threshold, e.max_model_len) == (32, 256, 8192)
    assert e.gpu_memory_utilization == 0.8 and e.preemption_policy == "priority"
    assert cfg.latency == LatencyConfig("blackbox", (1.0, 2.5, 0.0), (10.0, 0.5, 0.001))
    c = cfg.cluster
    assert (c.num_instances, c.admission_latency_us, c.routing_latency_us) == (3, 5, 6)
    assert c.snapshot_refresh_interval_us == 50000
    p = cfg.policy
    assert p.routing.policy == "weighted"
    assert p.routing.scorers == (
        ScorerWeight("queue-depth", 1.0),
        ScorerWeight("load-balance", 2.5),
    )
    assert (
        p.admission.policy,
        p.admission.token_bucket_capacity,
        p.admission.token_bucket_refill_rate,
    ) == ("token-bucket", 100.0, 10.5)
    assert p.priority.policy == "slo-based" and p.scheduler.policy == "priority-fcfs"
    assert (cfg.seed, cfg.horizon_us) == (7, 1_000_000)


def test_unspecified_fields_untouched():
    base = SimConfig(seed=5, engine=SimConfig().engine.__class__(max_num_running_reqs=3))
    cfg = apply_blis_flags(base, _parse(["--tp", "2"]))
    assert (
        cfg.seed == 5
        and cfg.engine.max_num_running_reqs == 3
        and cfg.engine.tensor_parallel_size == 2
    )


def test_policy_config_applied_before_flags(tmp_path):
    bundle = tmp_path / "p.yaml"
    bundle.write_text(
        "admission: {policy: token-bucket, token_bucket_capacity: 5}\n"
        "priority: {policy: slo-based}\nscheduler: sjf\n"
    )
    ns = _parse(
        ["--policy-config", str(bundle), "--scheduler", "fcfs", "--token-bucket-capacity", "9"]
    )
    cfg = apply_blis_flags(SimConfig(), ns)
    assert cfg.policy.admission.policy == "token-bucket"  # from the bundle
    assert cfg.policy.admission.token_bucket_capacity == 9.0  # flag wins
    assert cfg.policy.priority.policy == "slo-based"
    assert cfg.policy.scheduler.policy == "fcfs"  # flag wins


def test_inverted_slo_flag():
    cfg = apply_blis_flags(SimConfig(), _parse(["--priority-policy", "inverted-slo"]))
    assert cfg.policy.priority.policy == "slo-based" and cfg.policy.priority.age_weight == -1.0


def test_switching_latency_model_drops_inherited_coefficients():
    base = SimConfig(latency=LatencyConfig("blackbox", (1.0, 2.0, 3.0), (4.0, 5.0, 6.0)))
    cfg = apply_blis_flags(base, _parse(["--latency-model", "roofline"]))
    assert cfg.latency == LatencyConfig("roofline")
    same = apply_blis_flags(base, _parse(["--latency-model", "blackbox"]))
    assert same.latency == base.latency


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--routing-scorers", "foo:x"], "--routing-scorers"),
        (["--routing-scorers", "queue-depth"], "--routing-scorers"),
        (["--routing-scorers", "nope:1"], "--routing-scorers"),
        (["--routing-scorers", "queue-depth:-1"], "--routing-scorers"),
        (["--alpha-coeffs", "1,two,3"], "--alpha-coeffs"),
        (["--alpha-coeffs", "1,2"], "--alpha-coeffs"),
        (["--beta-coeffs", "1,nan,3"], "--beta-coeffs"),
        (["--tp", "0"], "--tp"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--routing-policy", "random"], "--routing-policy"),
        (["--scheduler", "lifo"], "--scheduler"),
        (["--latency-model", "trained-physics"], "--latency-model"),
        (["--horizon", "0"], "--horizon"),
        (["--max-model-len", "4097", "--total-kv-blocks", "256"], "--max-model-len"),
    ],
)
def test_malformed_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as err:
        apply_blis_flags(SimConfig(), _parse(argv))
    assert err.value.path == flag
    assert str(err.value).startswith(f"{flag}: ")


def test_argparse_rejects_non_numbers():
    with pytest.raises(SystemExit):
        _parse(["--tp", "two"])


def test_flag_values_mapping_accepts_text_and_names():
    cfg = apply_blis_flag_values(SimConfig(), {"--tp": "2", "num-instances": 3, "seed": None})
    assert (
        cfg.engine.tensor_parallel_size == 2 and cfg.cluster.num_instances == 3 and cfg.seed == 42
    )
    with pytest.raises(ConfigError, match=r"^--tp: expected an integer"):
        apply_blis_flag_values(SimConfig(), {"tp": "x"})
    with pytest.raises(ConfigError, match="unknown BLIS flag"):
        apply_blis_flag_values(SimConfig(), {"--results-path": "x"})


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_flags_resolve(case):
    flags = json.loads((GOLDEN_DIR / f"golden_case{case}.json").read_text())["flags"]
    cfg = apply_blis_flag_values(SimConfig(), flags)
    resolved = resolve_config(cfg)
    assert resolved.total_kv_blocks == flags["total-kv-blocks"]
    assert resolved.max_model_len == flags["max-model-len"] == 4096
    assert resolved.alpha == tuple(float(x) for x in flags["alpha-coeffs"].split(","))
    assert resolved.beta == tuple(float(x) for x in flags["beta-coeffs"].split(","))
    assert cfg.horizon_us == 2**63 - 1 and cfg.cluster.snapshot_refresh_interval_us == 0
    assert (resolved.model_config is None) == flags["model"].startswith("ibm-granite/")


def test_model_autoscaler_interval_flag():
    """BLIS's --model-autoscaler-interval-us (docs/autoscaling.md): overrides the bundle's
    interval (truncated to µs), turns BLIS's saturation autoscaler on when none is configured,
    and 0 turns it off; a negative value names the flag."""
    from blisjax.config import AutoscalerConfig, ConfigError, SimConfig

    cfg = apply_blis_flag_values(SimConfig(), {"--model-autoscaler-interval-us": "2500000.9"})
    assert (cfg.policy.autoscaler.policy, cfg.policy.autoscaler.interval_us) == (
        "blis-saturation", 2_500_000)
    threshold = dataclasses.replace(SimConfig(), policy=dataclasses.replace(
        SimConfig().policy, autoscaler=AutoscalerConfig(policy="threshold")))
    cfg = apply_blis_flag_values(threshold, {"model_autoscaler_interval_us": 7})
    assert (cfg.policy.autoscaler.policy, cfg.policy.autoscaler.interval_us) == ("threshold", 7)
    assert apply_blis_flag_values(cfg, {"--model-autoscaler-interval-us": "0"}
                                  ).policy.autoscaler.policy == "none"
    with pytest.raises(ConfigError, match="--model-autoscaler-interval-us"):
        apply_blis_flag_values(SimConfig(), {"--model-autoscaler-interval-us": "-1"})
