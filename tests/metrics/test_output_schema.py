"""The shipped JSON Schemas describe what the CLI writes: every key of real output is declared,
typed and, where the schema says so, required."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from blisjax.cli import main
from blisjax.config import AdmissionConfig
from blisjax.metrics import aggregate_metrics, per_request_rows
from tests.reference.conftest import make_workload, run


def _schema(name: str) -> dict:
    text = (resources.files("blisjax") / "data" / "schema" / f"{name}.schema.json").read_text()
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _validate(instance, name: str) -> None:
    jsonschema.validate(instance, _schema(name), cls=jsonschema.Draft202012Validator)


def test_default_experiment_output_matches_the_schemas(tmp_path, capsys):
    # The default experiment configures SLO targets and fitness weights, so the optional
    # slo_attainment and fitness blocks are present.
    metrics_path, results_path = tmp_path / "m.json", tmp_path / "r.json"
    assert main(["run", "--metrics-path", str(metrics_path),
                 "--results-path", str(results_path)]) == 0
    metrics = json.loads(metrics_path.read_text())
    assert "slo_attainment" in metrics and "fitness" in metrics
    _validate(metrics, "metrics")
    _validate(json.loads(results_path.read_text()), "results")
    assert json.loads(capsys.readouterr().out) == metrics


def test_every_request_status_matches_the_results_schema():
    # A token bucket of 10,150 tokens that never refills: request 1 (20,000 tokens) is rejected;
    # request 2 (10,000 tokens, more than 100 blocks of 16 hold) is admitted and dropped as
    # unservable; request 3 times out; request 4 is unfinished at the horizon.
    rows = [dict(arrival=0, input=100, output=4), dict(arrival=1, input=20_000),
            dict(arrival=2_000_000, input=10_000), dict(arrival=2_000_001, input=16, output=50,
                                                      deadline=2_000_002),
            dict(arrival=2_500_000, input=16, output=1_000)]
    adm = AdmissionConfig(policy="token-bucket", token_bucket_capacity=10_150.0,
                          token_bucket_refill_rate=0.0)
    res, _ = run(rows, admission=adm, kv_blocks=100, horizon_us=2_600_000)
    workload = make_workload(rows)
    records = per_request_rows(res, workload)
    assert [r["status"] for r in records] == [
        "completed", "rejected", "dropped", "timed-out", "unfinished"]
    _validate(records, "results")
    _validate(aggregate_metrics(res, workload), "metrics")


@pytest.mark.parametrize("mutate", [
    lambda m: m.pop("ttft_p99_ms"),
    lambda m: m.update(unknown_key=1),
    lambda m: m.update(completed_requests=-1),
    lambda m: m["per_tenant"]["t"].pop("itl_mean_ms"),
])
def test_the_metrics_schema_rejects_malformed_output(mutate):
    res, _ = run([dict(arrival=0, input=32, output=3, tenant="t")], tenants=("t",))
    metrics = aggregate_metrics(res, make_workload([dict(arrival=0, input=32, output=3,
                                                         tenant="t")], tenants=("t",)))
    _validate(metrics, "metrics")
    mutate(metrics)
    with pytest.raises(jsonschema.ValidationError):
        _validate(metrics, "metrics")


def _golden_replay(name: str, tmp_path) -> tuple[dict, list]:
    """BLIS's command line of golden case ``name`` (tests/data/blis-golden-next) run through
    blisjax: (its metrics, its per-request rows)."""
    from tests.paths import GOLDEN_NEXT_DIR

    case = json.loads((GOLDEN_NEXT_DIR / f"{name}.json").read_text())
    metrics_path, results_path = tmp_path / "m.json", tmp_path / "r.json"
    argv = case["command"].split()[1:]
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a for a in argv]
    argv[argv.index("--results-path") + 1] = str(results_path)
    assert main([*argv, "--metrics-path", str(metrics_path), "--quiet"]) == 0
    return json.loads(metrics_path.read_text()), json.loads(results_path.read_text())


def test_pd_output_matches_the_schemas(tmp_path, capsys):
    """BLIS's P/D replay with transfer contention: the ``pd_*`` metrics (contention's
    included) and the rows' prefill instance and transfer times are declared."""
    metrics, rows = _golden_replay("pd_contention_pool_scorers", tmp_path)
    assert "pd_peak_concurrent_transfers" in metrics
    _validate(metrics, "metrics")
    assert all(r["prefill_instance"] is not None for r in rows)
    _validate(rows, "results")
    capsys.readouterr()


def test_session_output_matches_the_schemas(tmp_path, capsys):
    """BLIS's closed-loop session replay: the ``sessions`` block and the rows' session keys
    (a later round's arrival is the run's) are declared."""
    metrics, rows = _golden_replay("sessions_closed_loop", tmp_path)
    assert metrics["sessions"]["sessions"] == 108
    _validate(metrics, "metrics")
    assert sum(r["round_index"] > 0 for r in rows) == 324
    _validate(rows, "results")
    # a row of a follow-up never created: arrival null
    rows[-1]["arrival_us"] = None
    _validate(rows, "results")
    capsys.readouterr()


def test_gateway_output_matches_the_schemas(tmp_path, capsys):
    """BLIS's flow-control flags on the default experiment: the ``gateway`` block is present
    and declared (a concurrency of 1 per instance holds requests; a depth of 3 rejects)."""
    metrics_path = tmp_path / "m.json"
    assert main(["run", "--engine", "reference", "--metrics-path", str(metrics_path),
                 "--flow-control", "--saturation-detector", "concurrency",
                 "--max-concurrency", "1", "--max-gateway-queue-depth", "3", "--quiet"]) == 0
    metrics = json.loads(metrics_path.read_text())
    gw = metrics["gateway"]
    assert gw["rejected"] > 0 and gw["mean_wait_ms"] > 0, gw
    _validate(metrics, "metrics")
    capsys.readouterr()
