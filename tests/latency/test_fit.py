"""`blisjax fit-latency`: ridge, CV selection of λ and γ, readers, end-to-end recovery."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from blisjax.cli import main
from blisjax.config import load_config, resolve_config
from blisjax.latency.fit import (
    Design,
    FitOptions,
    cv_rmse,
    fit_latency,
    physics_config_from_sim,
    ridge,
    step_time_from_features,
)
from blisjax.latency.fit_export import export_latency_tables
from blisjax.latency.fit_tables import FitDataError, read_journey_table, read_step_table
from blisjax.latency.physics import load_physics_coefficients
from blisjax.workload import generate_workload, parse_workload_spec

SAMPLE = Path(__file__).resolve().parents[2] / "configs" / "latency"
CONFIG = SAMPLE / "sample-config.yaml"
STEPS = SAMPLE / "sample-steps.csv"
JOURNEYS = SAMPLE / "sample-journeys.csv"
TRACE_START_NS = 1768435200 * 10**9  # 2026-01-15T00:00:00Z, as the sample was exported


def _sim(cfg):
    resolved = resolve_config(cfg)
    return resolved, generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)


@pytest.fixture(scope="module")
def sample_fit():
    cfg = load_config(CONFIG)
    pc, model, hw, tp = physics_config_from_sim(cfg)
    steps, journeys = read_step_table(STEPS), read_journey_table(JOURNEYS)
    res = fit_latency(steps, journeys, pc, model=model, hardware=hw, tp=tp,
                      options=FitOptions(outlier_factor=0.0))
    return cfg, res


# ---------------------------------------------------------------------------- ridge and CV


def test_ridge_recovers_exact_linear_coefficients():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.uniform(0, 1e-3, 300), rng.uniform(0, 2, 300),
                         rng.uniform(0, 50, 300), np.ones(300)])
    w = np.array([2.5e6, -40.0, 3.25, 800.0])
    got = ridge(X, X @ w, 0.0, bias=3)
    np.testing.assert_allclose(got, w, rtol=1e-8)
    weighted = ridge(X, X @ w, 0.0, weights=rng.uniform(0.5, 1.0, 300), bias=3)
    np.testing.assert_allclose(weighted, w, rtol=1e-8)


def test_constant_and_zero_columns_get_zero_coefficients():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.uniform(0, 1, 50), np.full(50, 0.25), np.zeros(50), np.ones(50)])
    got = ridge(X, X @ np.array([3.0, 200.0, 7.0, 10.0]), 0.0, bias=3)
    np.testing.assert_allclose(got, [3.0, 0.0, 0.0, 60.0], rtol=1e-9)  # 0.25·200 → bias


def _design(X, y):
    n = len(y)
    return Design(X=X, y=y, weight=np.ones(n), stratum=["a", "b"] * (n // 2),
                  order=np.arange(n, dtype=float))


def test_cv_picks_large_lambda_for_noise_and_small_for_exact_data():
    rng = np.random.default_rng(3)
    lambdas = (0.001, 0.1, 10.0, 1000.0)
    X = rng.normal(size=(80, 14))
    # Pure noise: the true coefficients are 0, so the strongest shrinkage predicts best.
    noise = _design(X, rng.normal(size=80))
    rmse = cv_rmse(noise, np.arange(80), lambdas, 5, bias=None)
    assert int(np.argmin(rmse)) == len(lambdas) - 1
    # Exact linear data: any shrinkage only hurts.
    exact = _design(X, X @ rng.normal(size=14))
    rmse = cv_rmse(exact, np.arange(80), lambdas, 5, bias=None)
    assert int(np.argmin(rmse)) == 0


# ---------------------------------------------------------------------------- end to end


def test_shipped_sample_is_a_blisjax_export(tmp_path):
    resolved, workload = _sim(load_config(CONFIG))
    s, j = tmp_path / "s.csv", tmp_path / "j.csv"
    export_latency_tables(resolved, workload, str(s), str(j), start_ns=TRACE_START_NS)
    assert s.read_bytes() == STEPS.read_bytes()
    assert j.read_bytes() == JOURNEYS.read_bytes()


def test_recovers_generating_coefficients(sample_fit):
    cfg, res = sample_fit
    rep = res.report
    true_a, true_b = cfg.latency.alpha_coeffs, cfg.latency.beta_coeffs
    assert rep["selection"]["gamma"] == cfg.latency.preemption_ema_gamma == 0.3
    # Targets are truncated integers: a perfect model is off by < 1 µs before truncation, so
    # its truncated prediction is within 1 µs of every target.
    for model in ("alpha", "beta"):
        hold = rep["physics"]["hold_out"][model]["all"]
        assert hold["n"] > 30 and hold["max_abs_error_us"] <= 1.0
        assert hold["mape_pct"] < 0.01
    # Well-excited, non-collinear features: within 1.5 %. (decode_attention_compute and
    # kv_cache_read_cost are nearly collinear — context tokens vs ceil(context/16) blocks — and
    # batch_utilization is weakly excited; only their combined effect is determined.)
    for i in (0, 1, 2, 6, 10, 11, 14):
        assert res.coefficients.beta[i] == pytest.approx(true_b[i], rel=0.015), i
    for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 10):
        assert res.coefficients.alpha[i] == pytest.approx(true_a[i], rel=0.015), i
    # gqa_efficiency is constant (0.25) for one deployment: credited to the bias.
    assert res.coefficients.beta[9] == 0.0
    assert res.coefficients.beta[15] == pytest.approx(true_b[15] + 0.25 * true_b[9], rel=0.01)
    assert "gqa_efficiency" in rep["physics"]["not_identifiable"]["beta"]
    assert rep["acceptance"]["pass"] is True


def test_recovered_coefficients_reproduce_every_step_time(sample_fit):
    _, res = sample_fit
    cfg = load_config(CONFIG)
    pc, *_ = physics_config_from_sim(cfg)
    from blisjax.latency.fit import beta_design

    steps = read_step_table(STEPS)
    d = beta_design(pc, steps, res.coefficients.gamma)
    pred = np.array([step_time_from_features(res.coefficients.beta, x) for x in d.X])
    err = np.abs(pred - (d.y - 0.5))
    assert err.max() <= 1.0 and np.mean(err == 0) > 0.5


def test_gamma_selection_recovers_generating_gamma(tmp_path):
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, latency=dataclasses.replace(cfg.latency,
                                                               preemption_ema_gamma=0.7))
    resolved, workload = _sim(cfg)
    s, j = tmp_path / "s.jsonl", tmp_path / "j.jsonl"  # also exercises the JSON-lines path
    export_latency_tables(resolved, workload, str(s), str(j))
    pc, model, hw, tp = physics_config_from_sim(cfg)
    res = fit_latency(read_step_table(s), read_journey_table(j), pc, model=model, hardware=hw,
                      tp=tp, options=FitOptions(gammas=(0.1, 0.3, 0.5, 0.7, 0.9),
                                                lambdas=(0.001, 0.1), outlier_factor=0.0))
    assert res.report["selection"]["gamma"] == 0.7
    assert res.coefficients.gamma == 0.7
    assert res.report["inputs"]["training_date"] is None  # no wall-clock timestamps


# ---------------------------------------------------------------------------- readers


def _write_variant(tmp_path, src, edit, name="t.csv"):
    lines = src.read_text().splitlines()
    lines = edit(lines)
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _replace_cell(lines, row, col_name, value):
    header = lines[0].split(",")
    cells = lines[row - 1].split(",")
    cells[header.index(col_name)] = value
    lines[row - 1] = ",".join(cells)
    return lines


@pytest.mark.parametrize("edit, message", [
    (lambda ls: [",".join(c for c in ls[0].split(",") if c != "batch.num_preempted")]
     + [",".join(x for i, x in enumerate(r.split(",")) if i != ls[0].split(",").index(
         "batch.num_preempted")) for r in ls[1:]],
     "row 1: missing step-summary column(s) batch.num_preempted"),
    (lambda ls: [",".join(c for c in ls[0].split(",") if c != "request.phase")] + ls[1:3],
     "missing rich-mode snapshot column(s) request.phase"),
    (lambda ls: _replace_cell(ls, 3, "queue.running_depth", "x"),
     "row 3, column 'queue.running_depth': must be an integer, got 'x'"),
    (lambda ls: _replace_cell(ls, 2, "batch.prefill_tokens", "5"),
     "row 2, column 'batch.prefill_tokens': 5 disagrees with the request snapshot"),
    (lambda ls: _replace_cell(ls, 2, "request.phase", "DECODE"),
     "row 2, column 'request.phase'[0]: DECODE contradicts"),
    (lambda ls: _replace_cell(ls, 2, "request.num_computed_tokens", "0;1"),
     "row 2, column 'request.num_computed_tokens': has 2 entries"),
    (lambda ls: ls[:1] + [r for r in ls[1:] if r.startswith("0,")][:5:2],
     "row 3, column 'step.id': non-contiguous step id 3 for instance '0' after 1"),
    (lambda ls: ls[:1] + [r for r in ls[1:] if r.startswith("0,")][:1] * 2,
     "row 3, column 'step.id': duplicate step id 1"),
])
def test_step_reader_errors_name_file_row_column(tmp_path, edit, message):
    p = _write_variant(tmp_path, STEPS, edit)
    with pytest.raises(FitDataError) as err:
        read_step_table(p)
    assert str(p) in str(err.value) and message in str(err.value)


def test_journey_reader_errors(tmp_path):
    p = _write_variant(tmp_path, JOURNEYS, lambda ls: _replace_cell(ls, 2, "ts.QUEUED", "5"))
    with pytest.raises(FitDataError, match=r"row 2, column 'ts.QUEUED': 5 precedes ts.ARRIVED"):
        read_journey_table(p)
    p = tmp_path / "j.jsonl"
    p.write_text('{"request.id": 1}\n')
    with pytest.raises(FitDataError, match=r"row 1: missing journey column\(s\) ts.ARRIVED"):
        read_journey_table(p)
    p.write_text('{"request.id": 1\n')
    with pytest.raises(FitDataError, match=r"j.jsonl: row 1: invalid JSON"):
        read_journey_table(p)


def test_wrong_deployment_config_is_named(tmp_path):
    cfg = load_config(CONFIG)
    other = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, total_kv_blocks=999))
    pc, model, hw, tp = physics_config_from_sim(other)
    with pytest.raises(FitDataError, match="kv.blocks_total_gpu': 200 blocks, but the "
                                           "deployment config has 999"):
        fit_latency(read_step_table(STEPS), read_journey_table(JOURNEYS), pc, model=model,
                    hardware=hw, tp=tp)


# ---------------------------------------------------------------------------- CLI


def test_cli_round_trip_on_shipped_sample(tmp_path, capsys):
    out = tmp_path / "coeffs.yaml"
    rc = main(["fit-latency", "--steps", str(STEPS), "--journeys", str(JOURNEYS),
               "--config", str(CONFIG), "--out", str(out), "--lambdas", "0.001,0.1",
               "--gammas", "0.1", "0.3"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["selection"]["gamma"] == 0.3
    assert report["acceptance"]["pass"] is True
    assert set(report["physics"]["hold_out"]["beta"]) >= {"all", "prefill-heavy",
                                                          "decode-heavy", "mixed"}
    coeffs = load_physics_coefficients(out)
    meta = dict(coeffs.metadata)
    assert coeffs.status == "trained" and coeffs.gamma == 0.3
    assert meta["training_date"] == "2026-01-15"  # from the data's timestamps
    assert meta["lambda_beta"] == report["selection"]["lambda_beta"]
    assert meta["hold_out_rmse_beta"] <= 1.0
    assert "sample-steps.csv" in coeffs.source and "sample-journeys.csv" in coeffs.source


@pytest.mark.parametrize("args, flag", [
    (["--lambdas", "-1"], "--lambdas"),
    (["--lambdas", "abc"], "--lambdas"),
    (["--gammas", "0"], "--gammas"),
    (["--holdout", "1.5"], "--holdout"),
    (["--folds", "0"], "--folds"),
    (["--out-steps", "x.csv"], "--out-steps"),
])
def test_cli_bad_arguments_exit_2(tmp_path, capsys, args, flag):
    out = tmp_path / "c.yaml"
    rc = main(["fit-latency", "--steps", str(STEPS), "--journeys", str(JOURNEYS),
               "--config", str(CONFIG), "--out", str(out), *args])
    assert rc == 2
    assert flag in capsys.readouterr().err
    assert not out.exists()


def test_cli_missing_inputs_exit_2(capsys):
    assert main(["fit-latency", "--steps", str(STEPS)]) == 2
    assert "--journeys" in capsys.readouterr().err
    assert main(["fit-latency", "--export-from-config", str(CONFIG)]) == 2
    assert "--out-steps" in capsys.readouterr().err
    assert main(["fit-latency", "--steps", "/nonexistent.csv", "--journeys", str(JOURNEYS),
                 "--config", str(CONFIG)]) == 2
    assert "/nonexistent.csv" in capsys.readouterr().err
