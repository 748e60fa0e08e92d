"""`blisjax gepa-evaluate` and `blisjax openevolve-evaluate` on the prefix-affinity scenario.

Expected scores come from plain reference-engine runs of the same policies (SLO attainment of
workload seed 1), not from the adapters.
"""

from __future__ import annotations

import dataclasses
import json

from blisjax.cli import main
from blisjax.config import load_blis_policy_config, load_config, resolve_config
from blisjax.metrics import aggregate_metrics
from blisjax.reference import simulate
from search.evaluate import make_workload
from tests.paths import REPO

SCENARIO = REPO / "configs" / "search" / "prefix-affinity.yaml"
AFFINITY = """routing:
  policy: weighted
  scorers:
  - {name: prefix-affinity, weight: 3.0}
  - {name: load-balance, weight: 1.0}
"""


def _attainment(policy_yaml: str, tmp_path) -> float:
    path = tmp_path / "want.yaml"
    path.write_text(policy_yaml)
    cfg = load_config(SCENARIO)
    cfg = dataclasses.replace(cfg, policy=load_blis_policy_config(path, cfg.policy))
    workload = make_workload(cfg, 1)
    result = simulate(resolve_config(cfg), workload)
    return aggregate_metrics(result, workload, cfg.metrics)["slo_attainment"]["overall"]


def test_gepa_evaluate_prints_scores_and_feedback(tmp_path, capsys):
    bundle = tmp_path / "policy.yaml"
    bundle.write_text(AFFINITY)
    code = main(["gepa-evaluate", "--policy-config", str(bundle), "--config", str(SCENARIO),
                 "--seeds", "1", "--objective", "slo_attainment", "--engine", "reference"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["cases"] == ["prefix-affinity@seed1"]
    assert report["scores"] == [_attainment(AFFINITY, tmp_path)]
    assert report["engines"] == ["reference"] and report["errors"] == [None]
    assert report["feedback"].startswith("# Reflection") and report["feedback"] in err
    bundle.write_text("routing:\n  policy: nearest\n")
    assert main(["gepa-evaluate", "--policy-config", str(bundle), "--config", str(SCENARIO),
                 "--seeds", "1", "--engine", "reference", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scores"] == [0.0] and "candidate.routing" in report["errors"][0]


def test_openevolve_evaluate_scores_a_code_policy(tmp_path, capsys):
    program = tmp_path / "policy.py"
    program.write_text(
        "def route_scores(request, instances):\n"
        "    return [-float(i.queue_depth + i.batch_size + i.in_flight) for i in instances]\n")
    code = main(["openevolve-evaluate", str(program), "--config", str(SCENARIO),
                 "--seeds", "1", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    # least-load scores with the first index winning ties: least-loaded routing, lowest index
    want = _attainment("routing:\n  policy: least-loaded\n  tie_break: lowest-index\n", tmp_path)
    assert report["error"] is None
    assert report["metrics"]["combined_score"] == want
    program.write_text("import os\n\ndef route_scores(request, instances):\n    return [0.0]\n")
    assert main(["openevolve-evaluate", str(program), "--config", str(SCENARIO), "--seeds", "1",
                 "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metrics"]["combined_score"] == 0.0
    assert report["error"].startswith("forbidden_import")


def test_adapter_command_errors(tmp_path, capsys):
    code = main(["openevolve-evaluate", str(tmp_path / "none.py"), "--config", str(SCENARIO)])
    assert code == 2 and "PROGRAM: " in capsys.readouterr().err
    program = tmp_path / "p.py"
    program.write_text("def route_scores(r, xs):\n    return [0.0] * len(xs)\n")
    code = main(["openevolve-evaluate", str(program), "--config", str(SCENARIO),
                 "--time-limit", "0"])
    assert code == 2 and "--time-limit: must be > 0 seconds" in capsys.readouterr().err
    code = main(["gepa-evaluate", "--policy-config", str(tmp_path / "none.yaml")])
    assert code == 2 and "--policy-config: " in capsys.readouterr().err
    code = main(["gepa-evaluate", "--policy-config", str(program), "--config", str(SCENARIO),
                 "--seeds", "1,1"])
    assert code == 2 and "--seeds: must not repeat a seed" in capsys.readouterr().err
