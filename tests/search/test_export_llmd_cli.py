"""`blisjax export-llmd`: any configuration's routing as an llm-d EndpointPickerConfig."""

from __future__ import annotations

import yaml

from blisjax.cli import main


def test_default_experiment_routing_exported(tmp_path, capsys):
    """The default experiment routes with prefix-affinity 3, queue-depth 2, kv-utilization 2:
    three scorer plugins with those weights in one profile with the max-score picker."""
    out = tmp_path / "epp.yaml"
    assert main(["export-llmd", "--out", str(out), "--quiet"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["apiVersion"] == "llm-d.ai/v1alpha1"
    assert doc["kind"] == "EndpointPickerConfig"
    types = {p.get("name", p["type"]): p["type"] for p in doc["plugins"]}  # name defaults to type
    weights = {types[ref["pluginRef"]]: ref.get("weight")
               for ref in doc["schedulingProfiles"][0]["plugins"]}
    assert weights == {"prefix-cache-scorer": 3.0, "queue-scorer": 2.0,
                       "kv-cache-utilization-scorer": 2.0, "max-score-picker": None}


def test_flags_apply_and_a_policy_without_weights_is_refused(tmp_path, capsys):
    out = tmp_path / "epp.yaml"
    argv = ["export-llmd", "--out", str(out), "--quiet", "--routing-scorers",
            "load-aware:1,no-hit-lru:1", "--llmd-api-version",
            "inference.networking.x-k8s.io/v1alpha1"]
    assert main(argv) == 0
    doc = yaml.safe_load(out.read_text())
    types = {p["type"] for p in doc["plugins"]}
    assert {"load-aware-scorer", "no-hit-lru-scorer"} <= types
    assert main(["export-llmd", "--out", str(tmp_path / "rr.yaml"), "--routing-policy",
                 "round-robin"]) == 2
    assert "policy.routing" in capsys.readouterr().err
    assert not (tmp_path / "rr.yaml").exists()
