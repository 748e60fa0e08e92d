"""Shipped blackbox coefficients: BLIS 4e179804's whole defaults.yaml table and its selection rule.

Expected values never come from the lookup code: they are written literally from BLIS's own run
(``blis-golden-next`` README, "Blackbox coefficients"), read straight from the generated YAML
with ``yaml.safe_load``, or computed by hand from the blackbox formulas (docs/semantics.md B.1).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blisjax.config import (
    ConfigError,
    EngineConfig,
    LatencyConfig,
    SimConfig,
    load_config,
    lookup_blackbox_coefficients,
    resolve_config,
    select_blackbox_coefficients,
    shipped_blackbox_coefficients,
)
from tests.paths import GOLDEN_CASES, golden_case

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "blisjax" / "data" / "coefficients" / "blackbox.yaml"
GENERATOR = REPO / "tools" / "gen_blackbox_coefficients.py"
# BLIS 4e179804's own defaults.yaml, as BLIS ships it (the generator's input).
BLIS_DEFAULTS = REPO / "tests" / "data" / "blis-data" / "defaults-4e179804.yaml"

LLAMA = "meta-llama/llama-3.1-8b-instruct"
# What BLIS 4e179804 uses for llama-3.1-8b-instruct / H100 / TP 1 without coefficient flags (its
# vLLM v0.11.0 entry), checked by BLIS itself: a run without --alpha-coeffs/--beta-coeffs gave
# byte-identical output to one passing these (blis-golden-next README, "Blackbox coefficients").
BLIS_LLAMA_H100_TP1_ALPHA = (10326.268121600151, 0.0, 0.0)
BLIS_LLAMA_H100_TP1_BETA = (6472.007648778123, 19.79721387814611, 304.4021040302657)
V0_8_4 = "vllm/vllm-openai:v0.8.4"


def _raw_table() -> dict:
    return yaml.safe_load(TABLE.read_text())


def _raw_entries(model: str, gpu: str, tp: int, version: str) -> list[dict]:
    return [m for m in _raw_table()["models"] if (m["id"], m["GPU"], m["tensor_parallelism"],
                                                  m["vllm_version"]) == (model, gpu, tp, version)]


# ----------------------------------------------------------------------------- the table


def test_table_is_blis_whole_table_with_provenance():
    raw = _raw_table()
    assert raw["source"] == "BLIS 4e179804 defaults.yaml"
    assert raw["blis_commit"] == "4e179804d895c1499bf4457db658642a2b53964a"
    # BLIS 4e179804's defaults.yaml: 111 fitted entries, 30 models with defaults.
    assert len(raw["models"]) == 111 and len(raw["defaults"]) == 30
    entries = shipped_blackbox_coefficients()
    assert len(entries) == 111
    assert [(e.model_id, e.gpu, e.tensor_parallelism, e.vllm_version) for e in entries] == [
        (m["id"], m["GPU"], m["tensor_parallelism"], m["vllm_version"]) for m in raw["models"]]
    for e, m in zip(entries, raw["models"], strict=True):
        assert e.alpha == tuple(m["alpha_coeffs"]) and e.beta == tuple(m["beta_coeffs"])
        assert e.source == "BLIS 4e179804 defaults.yaml"
    assert raw["defaults"][LLAMA]["vllm_version"] == "vllm/vllm-openai:v0.11.0"


def test_generated_table_is_what_the_generator_writes_from_blis_file(tmp_path):
    out = tmp_path / "blackbox.yaml"
    subprocess.run([sys.executable, str(GENERATOR), str(BLIS_DEFAULTS), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == TABLE.read_bytes()


# ----------------------------------------------------------------------------- selection rule


def test_llama_h100_tp1_is_blis_v0_11_0_entry():
    expected = (BLIS_LLAMA_H100_TP1_ALPHA, BLIS_LLAMA_H100_TP1_BETA)
    assert lookup_blackbox_coefficients(LLAMA, "H100", 1) == expected
    assert lookup_blackbox_coefficients(LLAMA, "H100", 1, "vllm/vllm-openai:v0.11.0") == expected
    chosen = select_blackbox_coefficients(LLAMA, "H100", 1)
    assert chosen.vllm_version == "vllm/vllm-openai:v0.11.0"
    r = resolve_config(SimConfig())
    assert (r.alpha, r.beta) == expected


@pytest.mark.parametrize("model, gpu, tp, version", [
    ("qwen/qwen2.5-7b-instruct", "H100", 1, None),              # default version v0.11.0
    ("codellama/codellama-34b-instruct-hf", "H100", 1, None),   # default version v0.8.4
    ("ibm-granite/granite-3.1-8b-instruct", "H100", 2, None),   # TP other than the default 4
    ("openai/gpt-oss-20b", "H100", 1, None),                    # default version v0.10.1.1
    (LLAMA, "A100-80", 2, V0_8_4),                              # a version given explicitly
    (LLAMA, "H100", 4, V0_8_4),
])
def test_lookup_returns_the_matching_entry(model, gpu, tp, version):
    wanted = version or _raw_table()["defaults"][model]["vllm_version"]
    matches = _raw_entries(model, gpu, tp, wanted)
    assert len(matches) == 1, "the case must name exactly one entry"
    expected = (tuple(matches[0]["alpha_coeffs"]), tuple(matches[0]["beta_coeffs"]))
    assert lookup_blackbox_coefficients(model, gpu, tp, version) == expected


def test_first_entry_wins_among_duplicates():
    # BLIS's GetCoefficients returns the first entry in file order; the table has keys listed
    # twice with different numbers (e.g. redhatai/phi-4-fp8-dynamic / H100 / TP 1 / v0.8.4).
    duplicates = _raw_entries("redhatai/phi-4-fp8-dynamic", "H100", 1, V0_8_4)
    assert len(duplicates) == 2 and duplicates[0]["alpha_coeffs"] != duplicates[1]["alpha_coeffs"]
    first = (tuple(duplicates[0]["alpha_coeffs"]), tuple(duplicates[0]["beta_coeffs"]))
    assert lookup_blackbox_coefficients("redhatai/phi-4-fp8-dynamic", "H100", 1, V0_8_4) == first


def test_model_id_is_lowercased_but_gpu_is_exact():
    expected = (BLIS_LLAMA_H100_TP1_ALPHA, BLIS_LLAMA_H100_TP1_BETA)
    assert lookup_blackbox_coefficients("Meta-Llama/Llama-3.1-8B-Instruct", "H100", 1) == expected
    assert lookup_blackbox_coefficients(LLAMA, "h100", 1) is None
    # no bare-name matching: BLIS compares the whole id
    assert lookup_blackbox_coefficients("llama-3.1-8b-instruct", "H100", 1) is None


def test_model_without_default_needs_a_version():
    # BLIS looks for vLLM version "" when neither --vllm-version nor defaults.yaml gives one.
    model = "mistralai/mixtral-8x7b-instruct-v0.1"
    assert model not in _raw_table()["defaults"]
    matches = _raw_entries(model, "H100", 4, V0_8_4)
    assert len(matches) == 1
    assert lookup_blackbox_coefficients(model, "H100", 4) is None
    assert lookup_blackbox_coefficients(model, "H100", 4, V0_8_4) == (
        tuple(matches[0]["alpha_coeffs"]), tuple(matches[0]["beta_coeffs"]))


def test_no_match_error_names_what_was_wanted_and_what_exists():
    with pytest.raises(LookupError) as err:
        select_blackbox_coefficients(LLAMA, "A100-80", 1)
    text = str(err.value)
    assert f"model '{LLAMA}', GPU 'A100-80', TP 1" in text
    assert "'vllm/vllm-openai:v0.11.0' (the model's default)" in text
    assert "A100-80 TP 1 'vllm/vllm-openai:v0.8.4'" in text
    assert "H100 TP 1 'vllm/vllm-openai:v0.11.0'" in text
    with pytest.raises(LookupError, match="did you mean meta-llama/llama-3.1-8b-instruct"):
        select_blackbox_coefficients("llama-3.1-8b-instruct", "H100", 1)
    with pytest.raises(LookupError, match="has no entry for this model$"):
        select_blackbox_coefficients("nobody/nothing", "H100", 1)


def test_resolve_reports_a_missing_entry_on_the_coefficient_field():
    cfg = SimConfig(hardware="A100-80")
    with pytest.raises(ConfigError) as err:
        resolve_config(cfg)
    assert err.value.path == "latency.alpha_coeffs"
    for needed in ("A100-80", "TP 1", "--vllm-version", "--alpha-coeffs/--beta-coeffs"):
        assert needed in str(err.value)


def test_vllm_version_picks_another_entry():
    cfg = SimConfig(engine=EngineConfig(tensor_parallel_size=2),
                    latency=LatencyConfig(vllm_version=V0_8_4))
    (match,) = _raw_entries(LLAMA, "H100", 2, V0_8_4)
    r = resolve_config(cfg)
    assert (r.alpha, r.beta) == (tuple(match["alpha_coeffs"]), tuple(match["beta_coeffs"]))
    # given coefficients win over the table, as BLIS's --alpha-coeffs/--beta-coeffs do
    pinned = LatencyConfig(alpha_coeffs=(1.0, 2.0, 3.0), beta_coeffs=(4.0, 5.0, 6.0),
                           vllm_version=V0_8_4)
    r = resolve_config(SimConfig(latency=pinned))
    assert (r.alpha, r.beta) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))


@pytest.mark.parametrize("kwargs", [
    {"vllm_version": ""},
    {"vllm_version": 0.11},
    {"model": "roofline", "vllm_version": V0_8_4},
])
def test_bad_vllm_version_is_refused(kwargs):
    with pytest.raises(ConfigError) as err:
        LatencyConfig(**kwargs)
    assert err.value.path == "latency.vllm_version"


# ----------------------------------------------------------------------------- command line


def _run_one_request(tmp_path: Path, *extra: str) -> dict:
    """`blisjax run` on BLIS's defaults with one 100-token request that outputs 2 tokens."""
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "blisjax.cli", "run", "--config", "examples/blis-defaults.yaml",
         "--workload", "distribution", "--rate", "1", "--num-requests", "1",
         "--prompt-tokens", "100", "--prompt-tokens-stdev", "0", "--prompt-tokens-min", "100",
         "--prompt-tokens-max", "100", "--output-tokens", "2", "--output-tokens-stdev", "0",
         "--output-tokens-min", "2", "--output-tokens-max", "2",
         "--results-path", str(results), *extra],
        cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(results.read_text())
    return row


def test_run_without_coefficients_uses_blis_choice(tmp_path):
    row = _run_one_request(tmp_path)
    a0, a1, a2 = BLIS_LLAMA_H100_TP1_ALPHA
    b0, b1, b2 = BLIS_LLAMA_H100_TP1_BETA
    # docs/semantics.md B.1 on an idle instance: queueing delay, one 100-token prefill step
    # (+ one output-token time), then one decode step (+ one output-token time).
    queueing = math.trunc(a0 + a1 * 100.0)
    prefill = math.trunc(b0 + b1 * 100.0)
    decode = math.trunc(b0 + b1 * 0.0 + b2 * 1.0)
    otp = math.trunc(a2)
    assert (queueing, prefill, decode, otp) == (10326, 8451, 6776, 0)
    assert row["scheduling_delay_us"] == queueing
    assert row["ttft_us"] == queueing + prefill + otp
    assert row["e2e_us"] == queueing + prefill + otp + decode + otp
    # --vllm-version with the default version changes nothing
    assert _run_one_request(tmp_path, "--vllm-version", "vllm/vllm-openai:v0.11.0") == row


def test_vllm_version_flag_replaces_coefficients_pinned_in_the_file(tmp_path):
    # the shipped default experiment pins the golden-dataset set; --vllm-version asks for the
    # table's entry instead (same latency as the one-request runs above: it is BLIS's choice)
    pinned = _cli("run", "--results-path", str(tmp_path / "pinned.json"))
    table = _cli("run", "--vllm-version", "vllm/vllm-openai:v0.11.0",
                 "--results-path", str(tmp_path / "table.json"))
    assert pinned.returncode == table.returncode == 0, pinned.stderr + table.stderr
    delays = {json.loads((tmp_path / f"{n}.json").read_text())[0]["scheduling_delay_us"]
              for n in ("pinned", "table")}
    # request 0 reaches an idle cluster: its delay is the queueing delay α0 + α1·L_in alone,
    # 10326 with the v0.11.0 entry (α1 = 0) and something else with the golden-dataset set
    assert 10326 in delays and len(delays) == 2


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blisjax.cli", *args], cwd=REPO,
                          capture_output=True, text=True, check=False)


def test_run_with_a_version_the_table_lacks_fails_clearly():
    proc = _cli("run", "--vllm-version", V0_8_4)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "latency.alpha_coeffs" in proc.stderr and f"'{V0_8_4}'" in proc.stderr
    assert "H100 TP 1 'vllm/vllm-openai:v0.11.0'" in proc.stderr


# ----------------------------------------------------------------------------- golden dataset


def _golden_dataset_sets() -> list[dict]:
    return yaml.safe_load((REPO / "tests" / "data" / "golden_dataset_coefficients.yaml").read_text())


def _coeff_flag(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def test_golden_dataset_sets_are_the_golden_cases_flags():
    sets = _golden_dataset_sets()
    assert sorted(c for s in sets for c in s["golden_cases"]) == list(GOLDEN_CASES)
    for s in sets:
        for case in s["golden_cases"]:
            flags = json.loads(golden_case(case).read_text())["flags"]
            assert (flags["model"], flags["hardware"], int(flags["tp"])) == (
                s["id"], s["GPU"], s["tensor_parallelism"])
            assert _coeff_flag(flags["alpha-coeffs"]) == tuple(s["alpha_coeffs"])
            assert _coeff_flag(flags["beta-coeffs"]) == tuple(s["beta_coeffs"])


@pytest.mark.parametrize("index", [1, 2, 3])
def test_table_holds_the_other_golden_dataset_sets_as_v0_8_4_entries(index):
    s = _golden_dataset_sets()[index]
    assert lookup_blackbox_coefficients(s["id"], s["GPU"], s["tensor_parallelism"], V0_8_4) == (
        tuple(s["alpha_coeffs"]), tuple(s["beta_coeffs"]))


def test_llama_golden_dataset_set_is_not_blis_choice():
    s = _golden_dataset_sets()[0]
    golden = (tuple(s["alpha_coeffs"]), tuple(s["beta_coeffs"]))
    assert lookup_blackbox_coefficients(s["id"], s["GPU"], s["tensor_parallelism"]) != golden
    assert golden not in {(e.alpha, e.beta) for e in shipped_blackbox_coefficients()}
    # ... and it is what the shipped default experiment pins
    default = resolve_config(load_config(REPO / "configs" / "default.yaml"))
    assert (default.alpha, default.beta) == golden
