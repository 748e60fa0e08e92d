"""`blisjax search` / `blisjax sweep`: argument validation (exit 2, named argument, nothing
written), grid parsing, and end-to-end runs on the tiny experiment.

Every simulation here uses tests/search/data/tiny.yaml with its own seed and 4 lanes, so the
JAX engine is compiled once for the whole file (~30 s); each run then costs well under a second.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from blisjax.cli import main
from blisjax.config import load_blis_policy_config, load_config, resolve_config
from blisjax.engine.population import set_knob
from blisjax.metrics import aggregate_metrics
from blisjax.reference import simulate
from blisjax.workload import generate_workload, parse_workload_spec
from search.cli import parse_grid_axis
from search.space import get_knob
from tests.search.conftest import TINY_CONFIG, TINY_LANES, TINY_SPACE

SEARCH = ["search", str(TINY_CONFIG), "--space", str(TINY_SPACE), "--strategy", "cma",
          "--population", str(TINY_LANES), "--generations", "2", "--quiet", "--engine", "jax"]


def _cli(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- grid parsing -----------------------------------------------------------------------------


def test_grid_axis_forms():
    assert parse_grid_axis("routing.scorers.queue-depth=0:2:5") == \
        ("routing.scorers.queue-depth", (0.0, 0.5, 1.0, 1.5, 2.0))
    assert parse_grid_axis("admission.default_tenant_max_in_flight=1:5:3") == \
        ("admission.default_tenant_max_in_flight", (1, 3, 5))
    name, values = parse_grid_axis("admission.token_bucket_capacity=log:100:10000:3")
    assert values[0] == 100.0 and values[2] == 10000.0 and values[1] == pytest.approx(1000.0)
    assert parse_grid_axis("scheduler.policy=fcfs,sjf") == ("scheduler.policy", ("fcfs", "sjf"))
    assert parse_grid_axis("a.b=1, 2.5 ,x") == ("a.b", (1, 2.5, "x"))
    assert parse_grid_axis("a.b=3:3:1") == ("a.b", (3,))


@pytest.mark.parametrize("spec, match", [
    ("routing.scorers.queue-depth", "must be knob=lo:hi:n"),
    ("=1,2", "needs a knob name"),
    ("a.b=1:2", "a range is lo:hi:n"),
    ("a.b=1:x:3", "hi must be a number"),
    ("a.b=2:1:3", "hi must be > lo"),
    ("a.b=1:2:0", r"n must be an integer in \[1, "),
    ("a.b=1:2:2.5", "n must be an integer"),
    ("a.b=log:0:10:3", "log spacing needs lo > 0"),
    ("a.b=1,,2", "empty list item"),
    ("a.b=1,1", "repeated values"),
    ("a.b=1,inf", "must be finite"),
])
def test_grid_axis_errors(spec, match):
    from blisjax.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        parse_grid_axis(spec)


# ---- validation: exit 2, one message naming the argument, nothing written ----------------------


def _no_fitness_config(tmp_path: Path) -> Path:
    data = yaml.safe_load(TINY_CONFIG.read_text())
    del data["metrics"]["fitness_weights"]
    path = tmp_path / "nofit.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _no_workload_config(tmp_path: Path) -> Path:
    data = yaml.safe_load(TINY_CONFIG.read_text())
    del data["workload"]
    path = tmp_path / "nowl.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD_SEARCH = [
    (["--population", "1"], r"--population: must be an integer in \[2, 4096\], got '1'"),
    (["--population", "four"], "--population: must be an integer"),
    (["--strategy", "openes", "--population", "3"], "--population: must be even for openes"),
    (["--generations", "0"], r"--generations: must be an integer in \[1, 100000\]"),
    (["--seed", "-1"], "--seed: must be an integer in"),
    (["--space", "missing.yaml"], "--space: no such file: .*missing.yaml"),
    (["--objective", "ttft_mean"], "--objective: unknown metric 'ttft_mean'.*ttft_mean_ms"),
    (["--objective", "ttft_mean_ms +"], "--objective: cannot parse"),
    (["--objective=__import__('os')"], "--objective: .*only the functions"),
    (["--constraint", "slo_attainment"], "--constraint: 'slo_attainment' must be one "
                                         "comparison"),
    (["--constraint", "slo_atainment >= 0.9"], "--constraint: unknown metric 'slo_atainment'"),
    (["--seeds", "1,,2"], "--seeds: must be a comma-separated list"),
    (["--seeds", "3,3"], "--seeds: must not repeat a seed"),
    (["--seeds", "x"], "--seeds: must be an integer"),
    (["--holdout-seeds", "7"], r"--holdout-seeds: must not repeat a training seed .*\[7\]"),
    (["--robust", "median"], "--robust: must be one of mean, worst, cvar"),
    (["--robust", "cvar", "--cvar-alpha", "0"], r"--cvar-alpha: must be a number in \(0, 1\]"),
    (["--cvar-alpha", "0.5"], "--cvar-alpha: only used with --robust cvar"),
    (["--constraint-mode", "penalty", "--penalty", "-3"], r"--penalty: must be a number in \[0, "),
    (["--penalty", "10"], "--penalty: only used with --constraint-mode penalty"),
    (["--constraint-mode", "ignore"], "--constraint-mode: must be one of filter, penalty"),
    (["--sigma", "0"], r"--sigma: must be a number in \(0, 10\]"),
    (["--strategy", "openes", "--learning-rate", "nan"], "--learning-rate: must be a number"),
    (["--learning-rate", "0.1"], "--learning-rate: only used with --strategy openes"),
    (["--strategy", "random", "--sigma", "0.2"], "--sigma: only used with --strategy cma"),
    (["--resume"], "--resume: no checkpoint in"),
]


@pytest.mark.parametrize("extra, match", BAD_SEARCH)
def test_search_validation_errors(tmp_path, capsys, extra, match):
    out = tmp_path / "out"
    argv = SEARCH + ["--out", out]
    # later flags override earlier ones with argparse, except the appended ones
    code, stdout, err = _cli(argv + extra, capsys)
    assert code == 2, err
    assert stdout == ""
    import re

    assert re.search(match, err), err
    assert err.startswith("blisjax: error: ") and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_search_validation_of_config_and_out(tmp_path, capsys):
    code, _, err = _cli(["search", tmp_path / "none.yaml", *SEARCH[2:]], capsys)
    assert code == 2 and "CONFIG: no such file" in err
    code, _, err = _cli(["search", _no_fitness_config(tmp_path), *SEARCH[2:]], capsys)
    assert code == 2 and "--objective: not given, and the configuration has no " \
                         "metrics.fitness_weights" in err
    code, _, err = _cli(["search", _no_workload_config(tmp_path), *SEARCH[2:]], capsys)
    assert code == 2 and "workload: the configuration has no workload section" in err
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = _cli(SEARCH + ["--out", afile], capsys)
    assert code == 2 and "--out: " in err and "is not a directory" in err
    bad_space = tmp_path / "space.yaml"
    bad_space.write_text("knobs:\n  routing.scorers.nope: {low: 0, high: 1}\n")
    code, _, err = _cli(SEARCH + ["--space", bad_space, "--out", tmp_path / "o"], capsys)
    assert code == 2 and "space.knobs.routing.scorers.nope" in err
    assert not (tmp_path / "o").exists()


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(SEARCH[:4] + ["--strategy", "bogus", "--population", "4", "--generations", "1"])
    assert info.value.code == 2
    assert "--strategy: invalid choice: 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["search", str(TINY_CONFIG), "--space", str(TINY_SPACE)])
    assert info.value.code == 2


@pytest.mark.parametrize("grid, match", [
    (["routing.scorers.queue-depth=1:2"], "--grid: .*a range is lo:hi:n"),
    (["scheduler.policy=fcfs", "scheduler.policy=sjf"], "--grid: knob 'scheduler.policy' is "
                                                         "given twice"),
    (["scheduler.policy=fcfs,lifo"], "space.knobs.scheduler.policy: value 'lifo' is rejected"),
    (["engine.block_size_tokens=16,32"], "not a per-lane policy knob"),
])
def test_sweep_validation_errors(tmp_path, capsys, grid, match):
    import re

    out = tmp_path / "out"
    code, _, err = _cli(["sweep", TINY_CONFIG, "--grid", *grid, "--out", out], capsys)
    assert code == 2 and re.search(match, err), err
    assert not out.exists()
    code, _, err = _cli(["sweep", TINY_CONFIG, "--grid", "scheduler.policy=fcfs,sjf",
                         "--batch", "0", "--out", out], capsys)
    assert code == 2 and "--batch: must be an integer in [1, 4096]" in err


# ---- end-to-end simulations (one compile shape) ------------------------------------------------


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    """An uninterrupted 2-generation search on the tiny experiment."""
    out = tmp_path_factory.mktemp("search") / "run"
    code = main(SEARCH + ["--out", str(out), "--constraint", "slo_attainment >= 0.5"])
    assert code == 0
    return out


def test_search_writes_every_result_file(search_run):
    names = {p.name for p in search_run.iterdir()}
    assert {"history.csv", "checkpoint.npz", "summary.json", "best_policy.yaml",
            "best_config.yaml", "convergence.png"} <= names
    assert not any(n.endswith(".tmp") for n in names)
    rows = list(csv.DictReader((search_run / "history.csv").read_text().splitlines()))
    assert len(rows) == 2 * TINY_LANES
    summary = json.loads((search_run / "summary.json").read_text())
    assert summary["evaluations"] == 2 * TINY_LANES
    best = summary["best"]
    fits = [float(r["fitness"]) for r in rows if r["feasible"] == "1"]
    assert best["fitness"] == max(fits)
    assert (search_run / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exported_policy_reproduces_the_best_run(search_run, capsys):
    """Load the bundle back (same knob values), then run it with the *reference* engine via
    `blisjax run --policy-config`: its metrics equal the search's JAX-lane metrics."""
    summary = json.loads((search_run / "summary.json").read_text())
    best = summary["best"]
    base = load_config(TINY_CONFIG)
    policy = load_blis_policy_config(search_run / "best_policy.yaml", base.policy)
    cfg = base.__class__(**{**base.__dict__, "policy": policy})
    for name, value in best["knobs"].items():
        assert get_knob(cfg, name) == value
    code = main(["run", "--config", str(TINY_CONFIG), "--policy-config",
                 str(search_run / "best_policy.yaml")])
    out = capsys.readouterr().out
    assert code == 0
    metrics = json.loads(out)
    jax_metrics = best["metrics_per_seed"][0]
    for key in ("completed_requests", "ttft_mean_ms", "e2e_p99_ms", "fitness"):
        assert metrics[key] == jax_metrics[key], key
    assert metrics["fitness"] == best["objectives"]["fitness"]


def test_explain_reruns_candidates_with_a_trace(search_run, tmp_path, capsys):
    """`blisjax explain` re-runs the best candidate in the reference engine with a trace: its
    metrics are the search's JAX lane's; another candidate (a history row) runs with that
    row's knobs, as a plain reference run of the tiny experiment with them gives."""
    summary = json.loads((search_run / "summary.json").read_text())
    out = tmp_path / "best"
    code = main(["explain", str(search_run), "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert code == 0
    assert text == (out / "summary.txt").read_text() and "## Outcome" in text
    assert {p.name for p in out.iterdir()} == {"trace.jsonl", "timeline.json", "summary.txt",
                                               "metrics.json", "instances.png"}
    metrics = json.loads((out / "metrics.json").read_text())
    jax_metrics = summary["best"]["metrics_per_seed"][0]
    for key in ("completed_requests", "ttft_mean_ms", "e2e_p99_ms", "fitness"):
        assert metrics[key] == jax_metrics[key], key
    assert metrics["trace_summary"]["total_decisions"] == 30
    rows = list(csv.DictReader((search_run / "history.csv").read_text().splitlines()))
    best = (summary["best"]["generation"], summary["best"]["candidate"])
    n = next(i for i, r in enumerate(rows)
             if r["note"] != "invalid" and (int(r["generation"]), int(r["candidate"])) != best)
    out_n = tmp_path / "n"
    assert main(["explain", str(search_run), "--candidate", str(n), "--out", str(out_n),
                 "--quiet"]) == 0
    capsys.readouterr()
    knobs = {k: rows[n][k] for k in ("routing.scorers.prefix-affinity",
                                     "routing.scorers.load-balance", "scheduler.policy")}
    cfg = load_config(TINY_CONFIG)
    for name in ("routing.scorers.prefix-affinity", "routing.scorers.load-balance"):
        cfg = set_knob(cfg, name, float(knobs[name]))
    cfg = set_knob(cfg, "scheduler.policy", knobs["scheduler.policy"])
    workload = generate_workload(parse_workload_spec(cfg.workload), seed=cfg.seed)
    want = aggregate_metrics(simulate(resolve_config(cfg), workload), workload, cfg.metrics,
                             scheduler=cfg.policy.scheduler.policy)
    got = json.loads((out_n / "metrics.json").read_text())
    assert got["fitness"] == want["fitness"] == float(rows[n]["objective[fitness]"])
    code = main(["explain", str(search_run), "--candidate", str(len(rows))])
    assert code == 2
    assert f"--candidate: must be in [0, {len(rows) - 1}]" in capsys.readouterr().err


def test_search_is_reproducible_and_resumable(search_run, tmp_path, capsys):
    again = tmp_path / "again"
    assert main(SEARCH + ["--out", str(again), "--constraint", "slo_attainment >= 0.5"]) == 0
    assert (again / "history.csv").read_bytes() == (search_run / "history.csv").read_bytes()
    assert (again / "summary.json").read_bytes() == (search_run / "summary.json").read_bytes()
    # a one-generation run, then resumed to two: the same files as the uninterrupted run
    part = tmp_path / "part"
    one = [a if a != "2" else "1" for a in SEARCH]
    assert main(one + ["--out", str(part), "--constraint", "slo_attainment >= 0.5"]) == 0
    assert main(SEARCH + ["--out", str(part), "--constraint", "slo_attainment >= 0.5",
                          "--resume"]) == 0
    assert (part / "history.csv").read_bytes() == (search_run / "history.csv").read_bytes()
    assert (part / "best_policy.yaml").read_bytes() == \
        (search_run / "best_policy.yaml").read_bytes()
    assert (part / "summary.json").read_bytes() == (search_run / "summary.json").read_bytes()
    capsys.readouterr()
    # resuming with different settings is refused before anything is written
    code, _, err = _cli(SEARCH + ["--out", part, "--resume"], capsys)
    assert code == 2 and "--resume: the run in" in err and "constraints" in err
    code, _, err = _cli(SEARCH + ["--out", part, "--constraint", "slo_attainment >= 0.5"],
                        capsys)
    assert code == 2 and "already holds a run; use --resume" in err
    code, _, err = _cli(one + ["--out", part, "--constraint", "slo_attainment >= 0.5",
                               "--resume"], capsys)
    assert code == 2 and "--generations: the run in" in err and "give at least 2" in err


def test_sweep_covers_the_grid_and_matches_the_baseline(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, stdout, _ = _cli(["sweep", TINY_CONFIG, "--grid", "routing.scorers.prefix-affinity=0,3",
                            "scheduler.policy=fcfs,sjf", "--objective=-ttft_mean_ms", "--quiet",
                            "--out", out], capsys)
    assert code == 0
    summary = json.loads(stdout)
    rows = list(csv.DictReader((out / "history.csv").read_text().splitlines()))
    combos = {(r["routing.scorers.prefix-affinity"], r["scheduler.policy"]) for r in rows}
    assert combos == {("0", "fcfs"), ("0", "sjf"), ("3", "fcfs"), ("3", "sjf")}
    # the grid point equal to the configuration's own policy scores exactly the baseline
    base_row = next(r for r in rows if r["routing.scorers.prefix-affinity"] == "0"
                    and r["scheduler.policy"] == "fcfs")
    assert float(base_row["objective[-ttft_mean_ms]"]) == \
        summary["baseline"]["objectives"]["-ttft_mean_ms"]
    assert (out / "sweep.png").exists()
    assert summary["best"]["fitness"] == max(float(r["fitness"]) for r in rows)


def test_multi_objective_search_writes_a_pareto_front(tmp_path, capsys):
    out = tmp_path / "mo"
    argv = [a if a != "cma" else "ga" for a in SEARCH]
    code, stdout, _ = _cli(argv + ["--objective=-ttft_mean_ms", "--objective", "cache_hit_rate",
                                   "--out", out], capsys)
    assert code == 0
    summary = json.loads(stdout)
    front = summary["pareto_front"]
    assert front and (out / "pareto.png").exists()
    rows = list(csv.DictReader((out / "pareto.csv").read_text().splitlines()))
    assert len(rows) == len(front)
    pts = [(f["objectives"]["-ttft_mean_ms"], f["objectives"]["cache_hit_rate"]) for f in front]
    for a in pts:  # mutually non-dominated
        assert not any(b[0] >= a[0] and b[1] >= a[1] and b != a for b in pts)


def test_holdout_comparison_on_a_seed(tmp_path):
    """The held-out comparison reruns the baseline and the best on the given seeds (here the
    training seed, so the baseline must equal the search's own baseline)."""
    from search.api import execute, holdout_comparison, prepare
    from search.evaluate import SimulationProblem

    plan = prepare("search", TINY_CONFIG, space=TINY_SPACE, strategy="random",
                   population=TINY_LANES, generations=1, objectives=["-e2e_mean_ms"])
    problem = SimulationProblem(plan.resolved, plan.seeds, plan.scoring, plan.population)
    summary = execute(plan, progress=False, problem=problem)
    from search.runner import Record

    best = summary["best"]
    rec = Record(0, 0, best["knobs"], best["fitness"], (best["fitness"],), (), (), (), True,
                 True, "")
    held = holdout_comparison(problem, rec, [7])
    assert set(held["per_seed"]["7"]["best_values"]) == {"e2e_mean_ms"}
    assert held["per_seed"]["7"]["best_values"]["e2e_mean_ms"] == \
        -best["objectives"]["-e2e_mean_ms"]
    assert held["per_seed"]["7"]["baseline"]["-e2e_mean_ms"] == \
        summary["baseline"]["objectives"]["-e2e_mean_ms"]
    assert held["per_seed"]["7"]["best"]["-e2e_mean_ms"] == best["objectives"]["-e2e_mean_ms"]


def test_held_out_seeds_run_on_the_search_program():
    """A problem built with its held-out seeds (``extra_seeds``) hands them the same engine
    program, whose capacities cover their workloads; other seeds get a program of their own."""
    from blisjax.engine.static import build_static_shared
    from search.api import prepare
    from search.evaluate import SimulationProblem, make_workload

    plan = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=TINY_LANES,
                   generations=1, seeds="1", holdout_seeds="101,102")
    problem = SimulationProblem(plan.resolved, plan.seeds, plan.scoring, plan.population,
                                extra_seeds=plan.holdout_seeds)
    assert problem.with_seeds([101, 102]).static is problem.static
    assert problem.with_seeds([102]).static is problem.static
    assert problem.with_seeds([103]).static is not problem.static
    alone = SimulationProblem(plan.resolved, plan.seeds, plan.scoring, plan.population)
    assert alone.with_seeds([101]).static is not alone.static
    # the one program is the one built over the training and held-out workloads together
    workloads = [make_workload(plan.config, s) for s in (1, 101, 102)]
    assert problem.static == build_static_shared(plan.resolved, workloads)


def test_warning_when_scorer_weights_cannot_matter(tmp_path):
    from search.api import prepare

    data = yaml.safe_load(TINY_CONFIG.read_text())
    data["policy"]["routing"]["policy"] = "round-robin"
    path = tmp_path / "rr.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = prepare("search", path, space=TINY_SPACE, population=4, generations=1)
    assert plan.warnings and "have no effect" in plan.warnings[0]
    assert not prepare("search", TINY_CONFIG, space=TINY_SPACE, population=4,
                       generations=1).warnings


def test_reference_engine_writes_the_same_files(search_run, tmp_path, capsys):
    """The same search with every candidate run by the reference engine: the same summary,
    history and exports, byte for byte (the engines agree request by request). Without
    --quiet, --engine auto says which engine it chose and why; on this 30-request experiment
    the reference runs are estimated far below a compile."""
    again = tmp_path / "reference"
    argv = [*SEARCH, "--out", str(again), "--constraint", "slo_attainment >= 0.5"]
    argv[argv.index("--engine") + 1] = "reference"
    assert main(argv) == 0
    for name in ("summary.json", "history.csv", "best_policy.yaml", "endpoint_picker.yaml"):
        assert (again / name).read_bytes() == (search_run / name).read_bytes(), name
    capsys.readouterr()
    auto = [a for a in argv if a not in ("--quiet",)]
    auto[auto.index("--engine") + 1] = "auto"
    auto[auto.index("--out") + 1] = str(tmp_path / "auto")
    auto[auto.index("--generations") + 1] = "1"
    assert main(auto) == 0
    err = capsys.readouterr().err
    assert "search: reference engine (--engine auto: " in err


def test_sweep_over_cluster_sizes(tmp_path, capsys):
    """--num-instances sweeps the cluster's size (cluster.num_instances): the results differ
    by size, cost grows with it here (the tiny workload finishes at about the same time on
    either size), and a size above the configuration's is refused naming the knob."""
    out = tmp_path / "sizes"
    code, stdout, err = _cli(["sweep", TINY_CONFIG, "--num-instances", "1,2", "--engine",
                              "reference", "--objective=-cost", "--quiet", "--out", out], capsys)
    assert code == 0, err
    rows = list(csv.DictReader((out / "history.csv").read_text().splitlines()))
    assert [r["cluster.num_instances"] for r in rows] == ["1", "2"]
    costs = [float(r["objective[-cost]"]) for r in rows]
    assert costs[0] > costs[1]  # -cost: one instance costs less
    assert json.loads(stdout)["best"]["knobs"] == {"cluster.num_instances": 1}
    code, _, err = _cli(["sweep", TINY_CONFIG, "--num-instances", "1,3", "--quiet", "--out",
                         tmp_path / "bad"], capsys)
    assert code == 2 and "cluster.num_instances" in err and "[1, 2]" in err, err


def test_recorded_traces_as_the_workloads(tmp_path, capsys):
    """--traces replaces the generated workload with recorded TraceV2 traces, --seeds picks
    them by index: each seed's metrics are those of its own trace (20 and 25 requests here),
    and a seed past the list is refused naming workload.traces."""
    from blisjax.config import load_config
    from blisjax.workload import write_trace
    from search.evaluate import make_workload

    base = load_config(TINY_CONFIG)
    pairs = []
    for k, n in enumerate((20, 25)):
        h, d = tmp_path / f"h{k}.yaml", tmp_path / f"d{k}.csv"
        write_trace(make_workload(base, 11 + k).head(n), h, d)
        pairs.append(f"{h}:{d}")
    out = tmp_path / "traced"
    code, stdout, err = _cli(["sweep", TINY_CONFIG, "--traces", ",".join(pairs), "--seeds",
                              "0,1", "--grid", "scheduler.policy=fcfs,sjf", "--engine",
                              "reference", "--quiet", "--out", out], capsys)
    assert code == 0, err
    per_seed = json.loads(stdout)["best"]["metrics_per_seed"]
    assert [m["completed_requests"] for m in per_seed] == [20, 25]
    code, _, err = _cli(["sweep", TINY_CONFIG, "--traces", pairs[0], "--seeds", "1", "--grid",
                         "scheduler.policy=fcfs,sjf", "--quiet", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "workload.traces: seed 1 selects the trace" in err, err


def test_engine_auto_weighs_reference_runs_against_compiles(monkeypatch):
    """auto: reference runs (simulations planned × seconds each) against 45 s of compile (the
    held-out seeds run on the search's program) plus JAX lanes 1 + lanes / 8 times faster, at
    most 10× per core; with a CPU tier in the space or the configuration, as fast as the
    reference."""
    import search.api as api
    from search.api import prepare

    monkeypatch.setattr(api, "reference_seconds", lambda plan: 1.0)
    monkeypatch.setattr(api, "usable_cores", lambda: 2)
    small = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=4, generations=2)
    # (4 x 2 candidates + baseline + llm-d check) x 1 seed = 10 s against 45 s + 6 s: reference
    assert api.planned_simulations(small) == 10
    assert api.choose_engine(small)[0] == "reference"
    big = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=8, generations=6,
                  holdout_seeds="101")
    # (48 + 2) x 1 + 2 x 1 held-out = 52 s against 45 s + 52 / (1 + 8/8) s: reference
    assert api.planned_simulations(big) == 52
    assert api.choose_engine(big)[0] == "reference"
    bigger = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=18, generations=6)
    # (108 + 2) = 110 s against 45 s + 110 / 3.25 = 78.8 s: JAX
    assert api.planned_simulations(bigger) == 110
    assert api.choose_engine(bigger)[0] == "jax"
    assert "18 lanes ~3.2x" in api.choose_engine(bigger)[1]
    # the speedup stops at 10x per core: 2 cores, 256 lanes -> 20x, not 1 + 256/8
    wide = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=256, generations=1)
    assert api.jax_speedup(wide) == 20.0
    tiered = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=18, generations=6)
    tiered.config = dataclasses.replace(tiered.config, engine=dataclasses.replace(
        tiered.config.engine, kv_cpu_blocks=64))
    # 110 s against 45 s + 110 s: reference
    assert api.jax_speedup(tiered) == 1.0
    assert api.choose_engine(tiered)[0] == "reference"
    swept = prepare("sweep", TINY_CONFIG, grid=[("engine.kv_cpu_blocks", (0, 64))])
    assert api.jax_speedup(swept) == 1.0  # a tier knob in the space
    forced = prepare("search", TINY_CONFIG, space=TINY_SPACE, population=4, generations=2,
                     engine="jax")
    assert api.choose_engine(forced) == ("jax", "--engine jax")
