"""``endpoint_picker.yaml``: the best routing as an llm-d EndpointPickerConfig.

Expected files and weights are written by hand from the EndpointPickerConfig schema (the
``apix/config/v1alpha1`` Go types of gateway-api-inference-extension and llm-d-router) and the
rule documented in ``search/llmd.py`` (weights as searched; integers ``round_half_even(1000 ·
w / Σw)`` for the x-k8s.io apiVersion). The end-to-end checks reuse the search run of
test_cli_search.py (same tiny experiment and lanes: no extra JAX compile shape).
"""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest
import yaml

from blisjax.cli import main
from blisjax.config import ConfigError, ScorerWeight, SimConfig, load_config
from blisjax.config.codes import Scorer
from search.io import write_policy_exports
from search.llmd import (
    API_VERSIONS,
    DEFAULT_API_VERSION,
    LEGACY_API_VERSION,
    SCORER_PLUGINS,
    endpoint_picker_config,
)
from tests.search.conftest import TINY_CONFIG
from tests.search.test_cli_search import SEARCH, search_run  # noqa: F401 (module fixture)

#: The weighted-routing scorers of BLIS HEAD (issue 32) and their llm-d plugin types, as named in
#: the llm-d / gateway-api-inference-extension sources; None where llm-d has no such scorer.
EXPECTED_PLUGINS = {
    "prefix-affinity": "prefix-cache-scorer",
    "queue-depth": "queue-scorer",
    "kv-utilization": "kv-cache-utilization-scorer",
    "load-balance": None,
    "precise-prefix-cache": "precise-prefix-cache-scorer",
    "load-aware": "load-aware-scorer",
    "active-requests": "active-request-scorer",
    "running-requests": "running-requests-size-scorer",
    "no-hit-lru": "no-hit-lru-scorer",
    "vllm-dp": None,
}


def _with_routing(policy: str, scorers: tuple[tuple[str, float], ...]) -> SimConfig:
    base = load_config(TINY_CONFIG)
    routing = dataclasses.replace(base.policy.routing, policy=policy,
                                  scorers=tuple(ScorerWeight(n, w) for n, w in scorers))
    return dataclasses.replace(base, policy=dataclasses.replace(base.policy, routing=routing))


#: BLIS's blackbox-era default profile plus load-balance: 8 units of weight in all.
FOUR_SCORERS = (("queue-depth", 2.0), ("kv-utilization", 2.0), ("prefix-affinity", 3.0),
                ("load-balance", 1.0))

EXPECTED_CURRENT = """\
# a header line
# llm-d EndpointPickerConfig of this policy's weighted routing (3 of 4 scorers).
# Left out, so llm-d routes differently from the searched policy:
#   load-balance (weight 1.0): no llm-d equivalent; it scores 1/(1 + waiting + running + in-flight
#   requests)
# Weights as searched; blisjax divides them by their sum, llm-d does not, which leaves the ranking
# of endpoints the same.
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: queue-scorer  # blisjax queue-depth
- type: kv-cache-utilization-scorer  # blisjax kv-utilization
# prefix-cache-scorer: set its block size to the engine's KV block size
- type: prefix-cache-scorer  # blisjax prefix-affinity
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2.0
  - pluginRef: kv-cache-utilization-scorer
    weight: 2.0
  - pluginRef: prefix-cache-scorer
    weight: 3.0
  - pluginRef: max-score-picker
"""


def test_golden_file_for_the_current_api_version():
    export = endpoint_picker_config(_with_routing("weighted", FOUR_SCORERS),
                                    header=["a header line"])
    assert export.reason == ""
    assert export.text == EXPECTED_CURRENT


def test_golden_weights_for_the_legacy_api_version():
    """1000 · w / 8: queue-depth 250, kv-utilization 250, prefix-affinity 375 (load-balance's
    125 is left out with the scorer)."""
    text = endpoint_picker_config(_with_routing("weighted", FOUR_SCORERS),
                                  LEGACY_API_VERSION).text
    assert text is not None
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    weights = {p["pluginRef"]: p.get("weight") for p in doc["schedulingProfiles"][0]["plugins"]}
    assert weights == {"queue-scorer": 250, "kv-cache-utilization-scorer": 250,
                       "prefix-cache-scorer": 375, "max-score-picker": None}
    assert all(isinstance(w, int) for w in weights.values() if w is not None)
    assert ("Exact weights: queue-depth=2.0, kv-utilization=2.0, prefix-affinity=3.0, "
            "load-balance=1.0.") in " ".join(line.lstrip("# ") for line in text.splitlines())


def test_integer_weights_round_half_to_even():
    """Weights 1 and 15 (sum 16): 1000/16 = 62.5 → 62 and 15000/16 = 937.5 → 938; weights
    1, 1, 1: 333.3… → 333 each."""
    def weights(scorers):
        doc = yaml.safe_load(endpoint_picker_config(_with_routing("weighted", scorers),
                                                    LEGACY_API_VERSION).text)
        return [p.get("weight") for p in doc["schedulingProfiles"][0]["plugins"]]

    assert weights((("queue-depth", 1.0), ("kv-utilization", 15.0))) == [62, 938, None]
    assert weights((("queue-depth", 1.0), ("kv-utilization", 1.0),
                    ("prefix-affinity", 1.0))) == [333, 333, 333, None]


def test_every_scorer_label_has_an_llm_d_entry():
    for label in Scorer.labels():
        assert label in SCORER_PLUGINS, f"scorer {label!r} has no llm-d mapping entry"
    for label, plugin in EXPECTED_PLUGINS.items():
        assert SCORER_PLUGINS[label].plugin_type == plugin, label
        if plugin is None:
            assert SCORER_PLUGINS[label].note, f"{label}: a missing plugin needs its reason"
    assert dict(SCORER_PLUGINS["load-aware"].parameters) == {"threshold": 128}


def test_schema_shape_and_references():
    """Every profile entry references a declared plugin (names default to types), one profile
    handler, one picker, and weights only on scorers."""
    for version in API_VERSIONS:
        doc = yaml.safe_load(endpoint_picker_config(_with_routing("weighted", FOUR_SCORERS),
                                                    version).text)
        assert set(doc) == {"apiVersion", "kind", "plugins", "schedulingProfiles"}
        assert doc["kind"] == "EndpointPickerConfig"
        declared = [p.get("name", p["type"]) for p in doc["plugins"]]
        assert len(declared) == len(set(declared))
        assert declared.count("single-profile-handler") == 1
        (profile,) = doc["schedulingProfiles"]
        assert profile["name"] == "default"
        for entry in profile["plugins"]:
            assert entry["pluginRef"] in declared
            assert ("weight" in entry) == entry["pluginRef"].endswith("-scorer")


def test_api_version_parameter():
    cfg = _with_routing("weighted", FOUR_SCORERS)
    assert DEFAULT_API_VERSION == "llm-d.ai/v1alpha1"
    for version in API_VERSIONS:
        assert yaml.safe_load(endpoint_picker_config(cfg, version).text)["apiVersion"] == version
    with pytest.raises(ConfigError, match=r"--llmd-api-version: must be one of llm-d.ai/v1alpha1"
                                          r", inference.networking.x-k8s.io/v1alpha1, got 'v2'"):
        endpoint_picker_config(cfg, "v2")


def test_zero_and_repeated_scorers():
    cfg = _with_routing("weighted", (("queue-depth", 1.5), ("prefix-affinity", 0.0),
                                     ("queue-depth", 0.25)))
    text = endpoint_picker_config(cfg).text
    doc = yaml.safe_load(text)
    assert [p["type"] for p in doc["plugins"]] == ["single-profile-handler", "queue-scorer",
                                                   "max-score-picker"]
    assert doc["schedulingProfiles"][0]["plugins"][0] == {"pluginRef": "queue-scorer",
                                                          "weight": 1.75}
    assert "# Left out with weight 0 (they add nothing): prefix-affinity" in text
    assert "routes differently" not in text


def test_tiny_weights_stay_floats_for_every_yaml_reader():
    doc = yaml.safe_load(endpoint_picker_config(
        _with_routing("weighted", (("queue-depth", 1e-05), ("kv-utilization", 1.0)))).text)
    assert doc["schedulingProfiles"][0]["plugins"][0]["weight"] == 1e-05


@pytest.mark.parametrize("policy", ["round-robin", "least-loaded", "always-busiest"])
def test_policies_without_weights_get_no_file(policy, tmp_path):
    stale = tmp_path / "endpoint_picker.yaml"
    stale.write_text("from an earlier best policy\n")
    cfg = _with_routing(policy, FOUR_SCORERS)
    export = endpoint_picker_config(cfg)
    assert export.text is None and policy in export.reason
    write_policy_exports(tmp_path, cfg, ["h"])
    assert (tmp_path / "best_policy.yaml").is_file() and not stale.exists()


def test_only_unmapped_scorers_get_no_file():
    export = endpoint_picker_config(_with_routing("weighted", (("load-balance", 1.0),)))
    assert export.text is None
    assert "load-balance (weight 1.0): no llm-d equivalent" in export.reason


# ---- written by `blisjax search` ---------------------------------------------------------------


def test_search_writes_the_endpoint_picker(search_run):  # noqa: F811 (fixture)
    summary = json.loads((search_run / "summary.json").read_text())
    assert summary["files"]["endpoint_picker"] == "endpoint_picker.yaml"
    text = (search_run / "endpoint_picker.yaml").read_text()
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == DEFAULT_API_VERSION
    knobs = summary["best"]["knobs"]
    # The tiny space searches prefix-affinity and load-balance, both > 0.
    profile = doc["schedulingProfiles"][0]["plugins"]
    assert profile[0] == {"pluginRef": "prefix-cache-scorer",
                          "weight": knobs["routing.scorers.prefix-affinity"]}
    lb = knobs["routing.scorers.load-balance"]
    assert f"#   load-balance (weight {lb!r}): no llm-d equivalent" in text


def test_search_honours_llmd_api_version(tmp_path):
    out = tmp_path / "legacy"
    argv = [*SEARCH, "--out", str(out), "--llmd-api-version", LEGACY_API_VERSION]
    argv[argv.index("--generations") + 1] = "1"
    assert main(argv) == 0
    knobs = json.loads((out / "summary.json").read_text())["best"]["knobs"]
    pa = Fraction(knobs["routing.scorers.prefix-affinity"])
    lb = Fraction(knobs["routing.scorers.load-balance"])
    doc = yaml.safe_load((out / "endpoint_picker.yaml").read_text())
    assert doc["apiVersion"] == LEGACY_API_VERSION
    assert doc["schedulingProfiles"][0]["plugins"][0]["weight"] == round(1000 * pa / (pa + lb))


def test_cli_refuses_an_unknown_api_version(tmp_path, capsys):
    out = tmp_path / "bad"
    code = main([*SEARCH, "--out", str(out), "--llmd-api-version", "v1"])
    err = capsys.readouterr().err
    assert code == 2 and "--llmd-api-version" in err and "llm-d.ai/v1alpha1" in err
    assert not out.exists()


def test_same_search_writes_the_same_bytes(search_run, tmp_path):  # noqa: F811 (fixture)
    again = tmp_path / "again"
    assert main([*SEARCH, "--out", str(again), "--constraint", "slo_attainment >= 0.5"]) == 0
    assert (again / "endpoint_picker.yaml").read_bytes() == \
        (search_run / "endpoint_picker.yaml").read_bytes()


def test_search_scores_the_approximation_llmd_would_run(search_run):  # noqa: F811 (fixture)
    """The tiny space's best policy weighs load-balance, which llm-d cannot compute: the summary
    carries the exported policy's own score, that of the weighted routing *without*
    load-balance, here recomputed by the reference engine on a configuration that lists
    prefix-affinity alone."""
    from blisjax.metrics import aggregate_metrics
    from blisjax.reference import simulate
    from search.evaluate import apply_knobs, make_workload

    summary = json.loads((search_run / "summary.json").read_text())
    llmd = summary["endpoint_picker"]
    assert llmd["exact"] is False
    assert [line.split(" ")[0] for line in llmd["left_out"]] == ["load-balance"]
    assert summary["objectives"] == ["fitness"] and summary["workload_seeds"] == [7]
    best = apply_knobs(load_config(TINY_CONFIG), summary["best"]["knobs"])
    pa = summary["best"]["knobs"]["routing.scorers.prefix-affinity"]
    routing = dataclasses.replace(best.policy.routing,
                                  scorers=(ScorerWeight("prefix-affinity", pa),))
    alone = dataclasses.replace(best, policy=dataclasses.replace(best.policy, routing=routing))
    from blisjax.config import resolve_config

    workload = make_workload(alone, 7)
    metrics = aggregate_metrics(simulate(resolve_config(alone), workload), workload,
                                alone.metrics, scheduler=alone.policy.scheduler.policy)
    assert llmd["objectives"]["fitness"] == metrics["fitness"]
    assert llmd["searched_objectives"]["fitness"] == summary["best"]["objectives"]["fitness"]
    assert llmd["objectives"]["fitness"] != llmd["searched_objectives"]["fitness"]


def test_export_refuses_an_approximation_unless_asked(tmp_path, capsys):
    """The default experiment with a load-balance term (README's searched prefix-affinity
    policy has one): refused with exit 2 naming the scorer; written, with a warning, under
    --allow-approximation."""
    out = tmp_path / "epp.yaml"
    argv = ["export-llmd", "--out", str(out), "--quiet", "--routing-scorers",
            "prefix-affinity:0.056,load-balance:0.030"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "load-balance (weight 0.03)" in err and "--allow-approximation" in err
    assert not out.exists()
    assert main([*argv, "--allow-approximation"]) == 0
    err = capsys.readouterr().err
    assert "approximation" in err and "load-balance" in err
    doc = yaml.safe_load(out.read_text())
    assert [p["pluginRef"] for p in doc["schedulingProfiles"][0]["plugins"]] == [
        "prefix-cache-scorer", "max-score-picker"]


def test_approximation_knobs():
    """Left-out scorers at weight 0, a repeated scorer summed, integer weights as written."""
    cfg = _with_routing("weighted", (("queue-depth", 1.5), ("load-balance", 2.0),
                                     ("queue-depth", 0.5), ("kv-utilization", 0.0)))
    export = endpoint_picker_config(cfg)
    assert export.knobs == {"routing.scorers.queue-depth": 2.0,
                            "routing.scorers.load-balance": 0.0,
                            "routing.scorers.kv-utilization": 0.0}
    assert not export.exact and export.left_out[0].startswith("load-balance (weight 2.0)")
    legacy = endpoint_picker_config(cfg, LEGACY_API_VERSION)  # 1000·w/4: 375, 500, 125, 0
    assert legacy.knobs == {"routing.scorers.queue-depth": 500.0,
                            "routing.scorers.load-balance": 0.0,
                            "routing.scorers.kv-utilization": 0.0}
    assert endpoint_picker_config(_with_routing("weighted", FOUR_SCORERS[:3])).exact


def test_policy_bundle_names_the_knobs_it_cannot_carry(tmp_path):
    """A BLIS policy bundle holds admission, priority, routing and scheduler only: a searched
    cluster size (or CPU tier, P/D split, autoscaler knob) is named in its header, so nobody
    mistakes the bundle alone for the searched policy."""
    from search.io import bundle_left_out, policy_bundle_yaml

    knobs = {"cluster.num_instances": 4, "routing.scorers.queue-depth": 2.0,
             "engine.kv_cpu_blocks": 128, "scheduler.policy": "sjf"}
    assert bundle_left_out(knobs) == ["cluster.num_instances=4", "engine.kv_cpu_blocks=128"]
    text = policy_bundle_yaml(load_config(TINY_CONFIG), ["h"], bundle_left_out(knobs))
    assert "# cluster.num_instances=4 is not part of a policy bundle" in text
    assert "# engine.kv_cpu_blocks=128 is not part of a policy bundle" in text
    assert yaml.safe_load(text)["routing"]["policy"] == "weighted"
