"""Roofline latency model: every worked number of docs/roofline.md §5 and §6, exact.

The expected values below are copied from docs/roofline.md (verified there against BLIS compiled from
Go); none is produced by the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from blisjax.cli import main
from blisjax.config import (
    ConfigError,
    EngineConfig,
    LatencyConfig,
    SimConfig,
    load_hardware,
    load_model_config,
    resolve_config,
)
from blisjax.latency import (
    BlackboxLatency,
    RooflineLatency,
    StepBatch,
    make_latency_model,
)
from blisjax.latency.roofline import (
    expected_distinct_experts,
    go_pow,
    memory_access_bytes,
    roofline_step_seconds,
    roofline_step_time_us,
    split_roofline_requests,
    transformer_flops,
    weight_bytes,
)
from blisjax.metrics.records import COMPLETED
from blisjax.reference import ClusterSimulator
from tests.reference.conftest import make_workload

LLAMA_8B = "meta-llama/llama-3.1-8b-instruct"


def roofline(model: str = LLAMA_8B, gpu: str = "H100", tp: int = 1, **alpha) -> RooflineLatency:
    return RooflineLatency(load_model_config(model), load_hardware(gpu), tp, **alpha)


def seconds(m: RooflineLatency, prefill, decode) -> tuple[float, float]:
    return roofline_step_seconds(m.arch, m.rates, prefill, decode)


def step(m: RooflineLatency, prefill, decode) -> int:
    return roofline_step_time_us(m.arch, m.rates, prefill, decode)


def batch(*requests: tuple[int, int, int, int]) -> StepBatch:
    """requests: (new_tokens, progress_index, input_tokens, output_tokens)."""
    cols = list(zip(*requests, strict=True)) if requests else [(), (), (), ()]
    return StepBatch(*(list(c) for c in cols))


def prefill_req(s: int, t: int) -> tuple[int, int, int, int]:
    return (t, s, s + t + 100, 50)


def decode_req(pi: int) -> tuple[int, int, int, int]:
    return (1, pi, pi - 10, 50)


# --------------------------------------------------------------------- §5: Llama-3.1-8B, H100


def test_llama_8b_constants_and_rates():
    m = roofline()
    a, r = m.arch, m.rates
    assert (a.head_dim, a.kv_dim, a.n_moe, a.n_dense) == (128.0, 1024.0, 0, 32)
    assert r.peak_flops == 9.895e14 and r.bandwidth == 3.35e12
    assert r.prefill_flops == 445275000000000.0
    assert r.decode_flops == 296850000000000.0
    assert weight_bytes(a, 1) == weight_bytes(a, 4096) == 10200547328.0


@pytest.mark.parametrize("s", [0, 1, 7, 1000, 4095, 131071])
@pytest.mark.parametrize("t", [1, 2, 3, 512, 2048])
def test_llama_8b_closed_forms(s, t):
    m = roofline()
    c = s + (t - 1) / 2 if t > 1 else s
    assert transformer_flops(m.arch, s, t) == t * (10200809472 + 529408 * c)
    w, total = memory_access_bytes(m.arch, s, t, True)
    assert w == 10200547328
    assert total - w == 393216 * t + 131072 * s
    w0, total0 = memory_access_bytes(m.arch, s, t, False)
    assert (w0, total0 - w0) == (10200547328, 262144 * t)


def test_example_1_pure_prefill():
    m = roofline()
    assert transformer_flops(m.arch, 0, 512) == 5292069486592
    assert 5291265490944 + 803995648 == 5292069486592  # gemm + sram as docs/roofline.md splits it
    w, total = memory_access_bytes(m.arch, 0, 512, True)
    assert total - w == 201326592
    comp, mem = seconds(m, [(0, 512)], [])
    assert comp == 0.011884946351337937
    assert mem == 0.003105036991044776
    assert max(comp, mem) * 1e6 == 11884.946351337936
    assert step(m, [(0, 512)], []) == 11884
    assert m.step_time_us(batch(prefill_req(0, 512))) == 11884


def test_example_2_pure_decode():
    m = roofline()
    assert transformer_flops(m.arch, 1000, 1) == 10730217472
    assert (transformer_flops(m.arch, 1000, 1) / 1.0) / 296850000000000.0 == 3.614693438436921e-05
    w, total = memory_access_bytes(m.arch, 1000, 1, True)
    assert total - w == 131465216
    assert 32 * 131465216 == 4206886912
    comp, mem = seconds(m, [], [1000] * 32)
    assert comp == 0.0011567019002998145
    assert mem == 0.00430072663880597
    assert max(comp, mem) * 1e6 == 4300.726638805971
    assert m.step_time_us(batch(*[decode_req(1000)] * 32)) == 4300


EXAMPLE_3_ROWS = [  # (s, t, FLOPs, comp term or None, dyn bytes)
    (0, 256, 2628687101952, 0.005903513788000673, 100663296),
    (1024, 512, 5569631748096, 0.012508296554030655, 335544320),
    (1500, 1, 10994921472, 3.7038644002021226e-05, 197001216),
    (700, 1, 10571395072, 3.5611908613778e-05, 92143616),
    (3000, 1, 11789033472, 3.971377285497726e-05, 393609216),
    (64, 1, 10234691584, 10234691584 / 2.9685e14, 8781824),
]


@pytest.mark.parametrize("s, t, flops, comp_term, dyn", EXAMPLE_3_ROWS)
def test_example_3_rows(s, t, flops, comp_term, dyn):
    m = roofline()
    assert transformer_flops(m.arch, s, t) == flops
    rate = m.rates.prefill_flops if t > 1 else m.rates.decode_flops
    assert (transformer_flops(m.arch, s, t) / 1.0) / rate == comp_term
    w, total = memory_access_bytes(m.arch, s, t, True)
    assert total - w == dyn


def test_example_3_mixed_batch():
    m = roofline()
    b = batch(
        decode_req(1500),
        prefill_req(0, 256),
        decode_req(700),
        prefill_req(1024, 512),
        decode_req(3000),
        decode_req(64),
    )
    prefill, decode = split_roofline_requests(b)
    assert prefill == [(0, 256), (1024, 512)] and decode == [1500, 700, 3000, 64]
    comp, mem = seconds(m, prefill, decode)
    assert comp == 0.01855865232148223
    assert sum(row[4] for row in EXAMPLE_3_ROWS) == 1127743488
    assert 256 + 512 + 4 == 772
    assert mem == 0.0033815793480597013
    assert max(comp, mem) * 1e6 == 18558.65232148223
    assert m.step_time_us(b) == 18558


def test_empty_and_dropped_only_batches_take_one_microsecond():
    m = roofline()
    assert m.step_time_us(batch()) == 1
    assert seconds(m, [], []) == (0.0, 0.0)
    # PI >= L_in with no output tokens: neither prefill nor decode, contributes nothing.
    assert m.step_time_us(batch((1, 100, 100, 0), (1, 120, 100, 0))) == 1


# --------------------------------------------------------------------- §6: Go-verified table

TABLE_6 = [
    ("mixtral-8x7b-v0.1", "H100", 2, 10263, 10002, 9433),
    ("qwen3-30b-a3b", "H100", 1, 11846, 10818, 11860),
    ("llama-4-scout-17b-16e-instruct-fp8-dynamic", "H100", 4, 2956, 3096, 2975),
    ("deepseek-v2-lite", "A100-80", 1, 12228, 13276, 10500),
    ("glm-5.2-fp8", "H100", 8, 19244, 14693, 19369),
    ("llama-3.1-8b-instruct", "A100-80", 1, 44636, 7065, 22555),
    ("llama-3.1-70b-instruct", "H100", 4, 28745, 8198, 14496),
]


@pytest.mark.parametrize("model, gpu, tp, a, b, c", TABLE_6)
def test_go_verified_table(model, gpu, tp, a, b, c):
    m = roofline(model, gpu, tp)
    assert step(m, [(0, 512)], []) == a
    assert step(m, [], [1000] * 32) == b
    assert step(m, [(0, 256)], [1500, 700]) == c
    # Through the StepBatch interface, in a different batch order (sums run prefill first).
    assert m.step_time_us(batch(*[decode_req(1000)] * 32)) == b
    assert m.step_time_us(batch(decode_req(1500), prefill_req(0, 256), decode_req(700))) == c


# --------------------------------------------------------------------- classification


def test_classification_uses_start_of_step_progress():
    m = roofline()
    # A newly admitted request whose first 256 prompt tokens hit the cache: PI is still 0, so
    # s = 0 and t = the 256 cache-miss tokens; the cached context is not counted.
    hit = batch((256, 0, 512, 10))
    assert split_roofline_requests(hit) == ([(0, 256)], [])
    assert m.step_time_us(hit) == step(m, [(0, 256)], [])
    # A later chunk: s = PI (cached + computed so far).
    assert split_roofline_requests(batch((100, 412, 512, 10))) == ([(412, 100)], [])
    # Decode always uses t = 1 whatever new_tokens says, and s = PI.
    assert split_roofline_requests(batch((5, 600, 512, 10))) == ([], [600])
    assert m.step_time_us(batch((5, 600, 512, 10))) == m.step_time_us(batch((1, 600, 512, 10)))
    # PI == L_in is decode.
    assert split_roofline_requests(batch((1, 512, 512, 10))) == ([], [512])


def test_summation_order_within_each_class_is_batch_order():
    prefill, decode = split_roofline_requests(
        batch(decode_req(9), prefill_req(3, 4), decode_req(7), prefill_req(1, 2))
    )
    assert prefill == [(3, 4), (1, 2)] and decode == [9, 7]


# --------------------------------------------------------------------- MoE


def test_go_pow_special_cases():
    assert go_pow(0.75, 0) == 1.0 and go_pow(1.0, 9) == 1.0
    assert go_pow(0.75, 1) == 0.75 and go_pow(0.0, 5) == 0.0
    assert go_pow(0.5, 10) == 2.0**-10  # powers of two are exact
    assert go_pow(0.75, 2) == 0.75 * 0.75 and go_pow(0.75, 3) == 0.75 * (0.75 * 0.75)


def _square_and_multiply(x: float, n: int) -> float:
    # Go's frexp-mantissa squaring equals plain float squaring while nothing is subnormal
    # (scaling by powers of two is exact); the multiply order is low bit first.
    acc, base = 1.0, x
    while n:
        if n & 1:
            acc = acc * base
        base = base * base
        n >>= 1
    return acc


@pytest.mark.parametrize("p", [120 / 128, 56 / 60, 248 / 256, 6 / 8, 58 / 64])
def test_go_pow_is_go_not_libm(p):
    exps = range(1, 2000)
    assert all(go_pow(p, n) == _square_and_multiply(p, n) for n in exps if p**n > 1e-300)
    # docs/roofline.md §2.4: Go's result differs from libm's pow in the last bits for these bases
    # (the rounding of repeated squaring grows with the exponent, at most ~n ulps).
    differs = [n for n in exps if go_pow(p, n) != p**n]
    assert differs
    assert all(abs(go_pow(p, n) - p**n) <= n * math.ulp(p**n) for n in differs)


def test_go_pow_underflow_gives_all_experts():
    assert go_pow(15 / 16, 10**6) == 0.0
    assert go_pow(7 / 8, 2**40) == 0.0  # exponent loop stops early, ldexp flushes to 0
    assert expected_distinct_experts(128.0, 8.0, 10**6) == 128.0
    assert expected_distinct_experts(8.0, 2.0, 2**40) == 8.0


def test_expected_distinct_experts():
    assert expected_distinct_experts(8.0, 2.0, 1) == 2.0  # N·(1 − p) with p = 0.75
    assert expected_distinct_experts(128.0, 8.0, 1) == 8.0
    assert expected_distinct_experts(8.0, 8.0, 3) == 8.0  # k = N: p = 0, every expert
    assert expected_distinct_experts(8.0, 2.0, 2) == 8.0 * (1.0 - 0.5625)
    values = [expected_distinct_experts(8.0, 2.0, b) for b in range(1, 200)]
    assert values == sorted(values) and values[-1] == 8.0


def test_mixtral_weights_grow_with_step_tokens():
    a = roofline("mixtral-8x7b-v0.1", tp=2).arch
    assert (a.n_moe, a.n_dense, a.num_experts, a.top_k) == (32, 0, 8.0, 2.0)
    attn = (4096 * (4096 + 2 * 1024) + 4096 * 4096) * 32
    expert = 2 * 4096 * 14336 * 32  # one expert's 2-matrix MLP in every layer (fMoE = dFF)
    assert weight_bytes(a, 1) == (attn + 2 * expert) * 2  # nEff = k for one token
    assert weight_bytes(a, 10**5) == (attn + 8 * expert) * 2  # all 8 experts
    assert weight_bytes(a, 1) < weight_bytes(a, 4) < weight_bytes(a, 32) < weight_bytes(a, 10**5)


def test_moe_flops_count_top_k_experts_not_all():
    mixtral, h100 = load_model_config("mixtral-8x7b-v0.1"), load_hardware("H100")
    base = RooflineLatency(mixtral, h100, 2).arch
    more_experts = RooflineLatency(dataclasses.replace(mixtral, num_local_experts=16), h100).arch
    top_1 = RooflineLatency(dataclasses.replace(mixtral, num_experts_per_tok=1), h100).arch
    assert transformer_flops(more_experts, 0, 512) == transformer_flops(base, 0, 512)
    one_expert = 2 * 512 * (2 * 4096 * 14336) * 32  # 2t·(2d·fMoE)·nMoE, exact integers
    assert transformer_flops(base, 0, 512) - transformer_flops(top_1, 0, 512) == one_expert


def test_mixtral_weights_read_once_per_step_with_step_total_tokens():
    m = roofline("mixtral-8x7b-v0.1", tp=2)
    a, r = m.arch, m.rates
    comp, mem = seconds(m, [(0, 100)], [300, 400])
    dyn = 0.0
    for s, t in [(0, 100), (300, 1), (400, 1)]:
        w, total = memory_access_bytes(a, s, t, True)
        dyn = dyn + ((total - w) / 2.0)
    assert mem == ((weight_bytes(a, 102) / 2.0) + dyn) / r.bandwidth


def test_moe_layer_splits():
    scout = roofline("llama-4-scout-17b-16e-instruct-fp8-dynamic", tp=4).arch
    assert (scout.n_moe, scout.n_dense) == (24, 24)  # 48 layers, interleave step 1
    assert scout.dense_mlp_width == 2.0 * 5120 * 16384  # intermediate_size_mlp
    assert scout.moe_mlp_width == 2.0 * 5120 * 8192
    deepseek = roofline("deepseek-v2-lite", "A100-80").arch
    assert (deepseek.n_moe, deepseek.n_dense) == (27, 0)  # first_k_dense_replace ignored
    qwen = roofline("qwen3-30b-a3b").arch
    assert qwen.head_dim == 64.0  # d/H, not config head_dim 128
    assert qwen.moe_mlp_width == 2.0 * 2048 * 768


def test_dense_intermediate_dim_applies_to_dense_models():
    model = dataclasses.replace(load_model_config(LLAMA_8B), dense_intermediate_dim=8192)
    a = RooflineLatency(model, load_hardware("H100")).arch
    assert a.dense_mlp_width == 2.0 * 4096 * 8192


# --------------------------------------------------------------------- FP8 and rates


def test_fp8_rate_selection():
    h100, a100, l40s = load_hardware("H100"), load_hardware("A100-80"), load_hardware("L40S")
    scout = load_model_config("llama-4-scout-17b-16e-instruct-fp8-dynamic")  # wbpp 1.0
    assert RooflineLatency(scout, h100, 4).rates.peak_flops == 1979.0 * 1e12
    assert RooflineLatency(scout, l40s, 4).rates.peak_flops == 1466.0 * 1e12
    assert RooflineLatency(scout, a100, 4).rates.peak_flops == 312 * 1e12  # no FP8 on A100
    glm = load_model_config("glm-5.2-fp8")  # dtype bf16 (bpp 2), quant fp8 (wbpp 1)
    assert RooflineLatency(glm, h100, 8).rates.peak_flops == 1979.0 * 1e12
    llama = load_model_config(LLAMA_8B)
    assert RooflineLatency(llama, h100).rates.peak_flops == 989.5 * 1e12
    int8 = dataclasses.replace(llama, bytes_per_param=1.0)  # int8 dtype, no quant config
    assert RooflineLatency(int8, h100).rates.peak_flops == 1979.0 * 1e12
    w4 = dataclasses.replace(llama, weight_bytes_per_param=0.5)  # sub-byte: FP16 rate
    assert RooflineLatency(w4, h100).rates.peak_flops == 989.5 * 1e12
    assert RooflineLatency(w4, h100).arch.weight_bytes_per_param == 0.5


def test_fp8_weights_halve_weight_bytes_not_kv():
    llama = load_model_config(LLAMA_8B)
    fp8 = dataclasses.replace(llama, weight_bytes_per_param=1.0)
    a16 = RooflineLatency(llama, load_hardware("H100")).arch
    a8 = RooflineLatency(fp8, load_hardware("H100")).arch
    assert weight_bytes(a8, 1) * 2 == weight_bytes(a16, 1)
    assert a8.kv_bytes_per_token == a16.kv_bytes_per_token == 131072.0


# --------------------------------------------------------------------- tensor parallelism


def test_tp_divides_per_request_and_weights():
    m1, m2 = roofline(tp=1), roofline(tp=2)
    assert m2.rates.tp == 2.0
    for prefill, decode in ([(0, 512)], []), ([], [1000] * 32), ([(0, 256), (1024, 512)], [7, 9]):
        c1, w1 = seconds(m1, prefill, decode)
        c2, w2 = seconds(m2, prefill, decode)
        assert (c2, w2) == (c1 / 2, w1 / 2)  # halving is exact in binary64
    assert step(m2, [(0, 512)], []) == 5942  # trunc(11884.946351337936 / 2)


# --------------------------------------------------------------------- overheads, validation


def test_overheads_default_to_zero():
    m = roofline()
    assert m.alpha == (0.0, 0.0, 0.0)
    assert m.queueing_delay_us(4000) == 0
    assert m.output_token_processing_us == 0
    assert m.post_decode_overhead_us == 0


def test_overheads_with_alpha():
    m = roofline(alpha=(15563.2, 777.35, 45.91))
    assert m.queueing_delay_us(100) == int(15563.2 + 777.35 * 100.0) == 93298
    assert m.output_token_processing_us == 45
    assert m.post_decode_overhead_us == 0


def test_invalid_inputs_are_rejected():
    llama, h100 = load_model_config(LLAMA_8B), load_hardware("H100")
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        RooflineLatency(llama, h100, 0)
    with pytest.raises(ConfigError, match="alpha_coeffs"):
        RooflineLatency(llama, h100, 1, alpha=(1.0, 2.0))
    with pytest.raises(ConfigError, match="bytes_per_param"):
        RooflineLatency(dataclasses.replace(llama, bytes_per_param=0.0), h100)
    mixtral = load_model_config("mixtral-8x7b-v0.1")
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        RooflineLatency(dataclasses.replace(mixtral, num_experts_per_tok=0), h100)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        RooflineLatency(dataclasses.replace(mixtral, num_experts_per_tok=9), h100)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        RooflineLatency(dataclasses.replace(llama, num_experts_per_tok=2), h100)
    # Accepted by the roofline (as BLIS): d not divisible by H, TP not dividing the KV heads.
    RooflineLatency(dataclasses.replace(llama, hidden_dim=4100), h100, 3)


# --------------------------------------------------------------------- factory and engines


def test_factory_builds_roofline_and_keeps_blackbox():
    r = resolve_config(
        SimConfig(
            model="mixtral-8x7b-v0.1",
            engine=EngineConfig(tensor_parallel_size=2),
            latency=LatencyConfig(model="roofline"),
        )
    )
    m = make_latency_model(r)
    assert isinstance(m, RooflineLatency)
    assert m.tp == 2 and m.alpha == (0.0, 0.0, 0.0) and m.hardware.name == "H100"
    assert m.step_time_us(batch(prefill_req(0, 512))) == 10263
    r = resolve_config(
        SimConfig(latency=LatencyConfig(model="roofline", alpha_coeffs=(1.0, 2.0, 3.0)))
    )
    assert make_latency_model(r).alpha == (1.0, 2.0, 3.0)
    assert isinstance(make_latency_model(resolve_config(SimConfig())), BlackboxLatency)


def test_single_request_timeline_in_reference_engine():
    # One request, 512 prompt tokens, 3 output tokens, α = 0: the prefill step is Example 1
    # (11884 µs); then two decode steps at s = 512 and 513, computed from the §5 closed forms.
    resolved = resolve_config(SimConfig(latency=LatencyConfig(model="roofline")))
    sim = ClusterSimulator(
        resolved, make_workload([dict(arrival=0, input=512, output=3)]), check_invariants=True
    )
    res = sim.run()

    def decode_step(s):
        comp = (10200809472 + 529408 * s) / 296850000000000.0
        mem = (10200547328.0 + float(393216 + 131072 * s)) / 3.35e12
        return int(max(comp, mem) * 1e6)

    assert res.status[0] == COMPLETED
    assert res.ttft_us[0] == 11884
    assert list(res.itl_entries_us) == [decode_step(512), decode_step(513)]
    assert res.e2e_us[0] == 11884 + decode_step(512) + decode_step(513)


def _run_cli(capsys, *args: str) -> str:
    assert main(["run", "--latency-model", "roofline", *args]) == 0
    return capsys.readouterr().out


def test_cli_roofline_run_is_deterministic(capsys):
    args = ("--workload", "distribution", "--rate", "5", "--num-requests", "50")
    first = _run_cli(capsys, *args)
    second = _run_cli(capsys, *args)
    assert first == second
    metrics = json.loads(first)
    assert metrics["completed_requests"] == 50 and metrics["injected_requests"] == 50
    assert metrics["ttft_mean_ms"] > 0 and metrics["itl_mean_ms"] > 0


@pytest.mark.parametrize("tp", [2, 4])
def test_cli_roofline_moe_model(capsys, tp):
    args = (
        "--model",
        "mistralai/Mixtral-8x7B-v0.1",
        "--hardware",
        "H100",
        "--tp",
        str(tp),
        "--workload",
        "distribution",
        "--rate",
        "5",
        "--num-requests",
        "30",
    )
    first = _run_cli(capsys, *args)
    assert first == _run_cli(capsys, *args)
    metrics = json.loads(first)
    assert metrics["completed_requests"] == 30
    assert metrics["ttft_mean_ms"] > 0 and metrics["itl_mean_ms"] > 0
