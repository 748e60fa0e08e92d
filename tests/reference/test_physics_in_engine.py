"""The physics-normalized latency model inside the reference engine.

With only the bias coefficients non-zero the timeline is hand-computable: α·F = α_base_bias
(F_base_bias = 1 always) and β·F = β_bias (F_bias = 1), so every queueing delay is α_base_bias
and every step β_bias µs.
"""

from __future__ import annotations

import json

from blisjax.cli import main
from blisjax.config import EngineConfig, LatencyConfig, SimConfig, resolve_config
from blisjax.latency.physics import ALPHA_FEATURE_NAMES, BETA_FEATURE_NAMES
from blisjax.reference import simulate
from tests.reference.conftest import make_workload


def _coeffs(alpha_bias=0.0, beta_bias=0.0, beta_prefill=0.0):
    alpha = [0.0] * len(ALPHA_FEATURE_NAMES)
    alpha[ALPHA_FEATURE_NAMES.index("base_bias")] = alpha_bias
    beta = [0.0] * len(BETA_FEATURE_NAMES)
    beta[BETA_FEATURE_NAMES.index("bias")] = beta_bias
    beta[BETA_FEATURE_NAMES.index("prefill_linear_compute")] = beta_prefill
    return tuple(alpha), tuple(beta)


def test_bias_only_physics_timeline_by_hand():
    alpha, beta = _coeffs(alpha_bias=700.0, beta_bias=2000.0)
    cfg = SimConfig(engine=EngineConfig(total_kv_blocks=500),
                    latency=LatencyConfig(model="physics", alpha_coeffs=alpha, beta_coeffs=beta))
    w = make_workload([dict(arrival=0, input=100, output=3)])
    res = simulate(resolve_config(cfg), w)
    # enqueue at 700; steps of 2000 µs: prefill [700, 2700), decodes end at 4700 and 6700
    assert res.scheduling_delay_us[0] == 700
    assert res.ttft_us[0] == 2700
    assert res.e2e_us[0] == 2700 + 2000 + 2000


def test_physics_features_change_step_times_and_run_from_cli(capsys):
    alpha, beta = _coeffs(alpha_bias=500.0, beta_bias=1500.0, beta_prefill=4000.0)
    cfg = SimConfig(engine=EngineConfig(total_kv_blocks=2000),
                    latency=LatencyConfig(model="physics", alpha_coeffs=alpha, beta_coeffs=beta))
    w = make_workload([dict(arrival=0, input=512, output=2), dict(arrival=0, input=8, output=2)])
    res = simulate(resolve_config(cfg), w)
    # the prefill feature is positive in the first step, so that step exceeds the bias alone
    assert res.ttft_us[0] > 500 + 1500
    args = ["run", "--latency-model", "physics", "--workload", "distribution", "--rate", "5",
            "--num-requests", "20", "--alpha-coeffs", ",".join(map(str, alpha)),
            "--beta-coeffs", ",".join(map(str, beta))]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert json.loads(first)["completed_requests"] == 20
    assert main(args) == 0 and capsys.readouterr().out == first  # deterministic
