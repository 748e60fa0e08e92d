"""Exports: the BLIS policy bundle loads back with the same knob values, the full config loads,
CSV numbers round-trip, checkpoints keep non-finite numbers, writes are atomic."""

from __future__ import annotations

import csv
import math
import os

import numpy as np
import pytest

from blisjax.config import load_blis_policy_config, load_config
from search.evaluate import apply_knobs
from search.io import (
    load_checkpoint,
    policy_bundle_yaml,
    save_checkpoint,
    write_csv_atomic,
    write_policy_exports,
    write_text_atomic,
)
from search.space import get_knob
from tests.search.conftest import TINY_CONFIG

KNOBS = {"routing.scorers.prefix-affinity": 3.7123456789012345,
         "routing.scorers.load-balance": 0.0123,
         "routing.scorers.kv-utilization": 2.0,
         "scheduler.policy": "sjf",
         "admission.policy": "token-bucket",
         "admission.token_bucket_capacity": 12345.678,
         "admission.token_bucket_refill_rate": 999.5,
         "priority.policy": "slo-based",
         "priority.age_weight": -0.25}


def test_policy_bundle_loads_back_with_the_same_knob_values(tmp_path):
    base = load_config(TINY_CONFIG)
    best = apply_knobs(base, KNOBS)
    bundle, full = write_policy_exports(tmp_path, best, ["a header"])
    assert bundle.read_text().startswith("# a header\n")
    # on top of the base config's policy and on top of the default policy
    for on_top_of in (base.policy, None):
        policy = load_blis_policy_config(bundle, on_top_of)
        cfg = base.__class__(**{**base.__dict__, "policy": policy})
        for name, value in KNOBS.items():
            assert get_knob(cfg, name) == value, name
        assert policy == best.policy
    reloaded = load_config(full)
    assert reloaded == best and reloaded.workload == base.workload


def test_policy_bundle_is_accepted_by_blisjax_run_flags(tmp_path):
    from blisjax.cli import build_parser
    from blisjax.config import apply_blis_flags as apply

    base = load_config(TINY_CONFIG)
    best = apply_knobs(base, KNOBS)
    path = tmp_path / "best_policy.yaml"
    write_text_atomic(path, policy_bundle_yaml(best))
    args = build_parser().parse_args(["run", "--config", str(TINY_CONFIG), "--policy-config",
                                      str(path)])
    cfg = apply(load_config(TINY_CONFIG), args)
    assert cfg.policy == best.policy


def test_preemption_policy_is_noted_in_the_bundle():
    cfg = apply_knobs(load_config(TINY_CONFIG), {"engine.preemption_policy": "priority"})
    assert "engine.preemption_policy: priority is not part of a policy bundle" in \
        policy_bundle_yaml(cfg)


def test_csv_numbers_round_trip_exactly(tmp_path):
    values = [0.1 + 0.2, 1e-300, 123456789.123456789, -math.inf, math.nan, 7, True, "sjf"]
    write_csv_atomic(tmp_path / "t.csv", [f"c{i}" for i in range(len(values))], [values])
    row = list(csv.reader((tmp_path / "t.csv").read_text().splitlines()))[1]
    assert float(row[0]) == 0.1 + 0.2 and float(row[1]) == 1e-300
    assert float(row[2]) == 123456789.123456789
    assert row[3] == "-inf" and row[4] == "nan" and row[5] == "7" and row[6] == "1"
    assert row[7] == "sjf"


def test_checkpoint_keeps_arrays_and_non_finite_meta(tmp_path):
    leaves = [np.arange(6, dtype=np.float64).reshape(2, 3), np.asarray(5, np.int64),
              np.array([1, 2], np.uint32), np.asarray(True)]
    meta = {"generation": 3, "records": [[0, 1, {"k": "x"}, -math.inf, [math.nan]]]}
    save_checkpoint(tmp_path / "c.npz", leaves, meta)
    back, m = load_checkpoint(tmp_path / "c.npz")
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in
               zip(leaves, back, strict=True))
    assert m["generation"] == 3 and m["records"][0][3] == -math.inf
    assert math.isnan(m["records"][0][4][0])


def test_atomic_write_leaves_old_file_and_no_temp_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    write_text_atomic(target, "old")

    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
