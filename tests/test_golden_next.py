"""BLIS replays with routing ties and BLIS HEAD inputs reproduce BLIS request by request.

Cases from ``tests/data/blis-golden-next`` (real BLIS runs; README there): least-loaded and
weighted routing over mostly idle instances, where BLIS breaks ties with its "router" random
stream (BLIS 4e179804, trace_version 2), and BLIS HEAD's default weighted profile with the
precise-prefix-cache scorer over a trace_version 3 file (BLIS f90a1e3a,
``--cache-signal-delay 0``). `blisjax replay` with BLIS's exact command line must give every
request the instance BLIS routed it to (BLIS's debug routing lines), and BLIS's TTFT, E2E and
token counts, in both engines; aggregate metrics equal up to float round-off.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest

from blisjax.cli import main
from tests.blis_replay import assert_matches_blis, replay
from tests.paths import (
    GOLDEN_NEXT_CASES,
    GOLDEN_NEXT_DIR,
    GOLDEN_NEXT_PD,
    GOLDEN_NEXT_SESSIONS,
    GOLDEN_NEXT_TIERED,
    GOLDEN_NEXT_TIERED_CASES,
    GOLDEN_NEXT_TIERED_PREEMPT,
)

_ROUTED = re.compile(r"req request_(\d+) → instance instance_(\d+) ")

# The JAX replays are in the slow tier (each case compiles its own program, ~35 s on 2 cores).
# The default tier covers them in two steps: the reference replays below match BLIS, and the
# JAX engine matches the reference on populations using every scorer and both tie rules
# (tests/engine/test_parity.py, test_population_lanes_match_independent_reference_runs).


def _case(name: str) -> dict:
    return json.loads((GOLDEN_NEXT_DIR / f"{name}.json").read_text())


def _replay(case: dict, tmp_path: Path, capsys, engine: str) -> tuple[dict, dict[int, dict]]:
    return replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys, ("--engine", engine))


def _check(case: dict, metrics: dict, rows: dict[int, dict]) -> None:
    routed = {int(m.group(1)): int(m.group(2))
              for m in map(_ROUTED.search, case["routing"]["lines"]) if m}
    assert len(routed) == len(case["results"])
    assert {k: rows[k]["instance"] for k in routed} == routed
    assert_matches_blis(case, metrics, rows)


@pytest.mark.parametrize("name", GOLDEN_NEXT_CASES)
def test_reference_engine_reproduces_blis(name, tmp_path, capsys):
    case = _case(name)
    _check(case, *_replay(case, tmp_path, capsys, "reference"))


@pytest.mark.slow
@pytest.mark.parametrize("name", GOLDEN_NEXT_CASES)
def test_jax_engine_reproduces_blis(name, tmp_path, capsys):
    case = _case(name)
    _check(case, *_replay(case, tmp_path, capsys, "jax"))


@pytest.mark.parametrize("name", GOLDEN_NEXT_CASES)
def test_lowest_index_ties_do_not_reproduce_blis(name, tmp_path, capsys):
    """The cases really depend on BLIS's random tie-breaks: with the lowest index instead,
    requests go elsewhere."""
    case = _case(name)
    case["command"] += " --routing-tie-break lowest-index"
    _, rows = _replay(case, tmp_path, capsys, "reference")
    moved = sum(rows[w["request_id"]]["ttft_us"] != w["ttft_us"] for w in case["results"])
    assert moved > len(case["results"]) // 5


def _check_tiered(case: dict, metrics: dict, rows: dict[int, dict]) -> None:
    """Every request's TTFT and E2E, BLIS's metrics, and its printed hit and thrashing rates."""
    assert_matches_blis(case, metrics, rows)
    lines = dict(line.split(": ") for line in case["stdout_other_sections"].splitlines()
                 if ": " in line)
    assert f"{metrics['cache_hit_rate']:.4f}" == lines["Cache Hit Rate"]
    assert f"{metrics['kv_thrashing_rate']:.4f}" == lines["KV Thrashing Rate"]
    assert sum(r["kv_reloads"] for r in rows.values()) == metrics["kv_reloads"] > 0


@pytest.mark.parametrize("name", GOLDEN_NEXT_TIERED_CASES)
def test_tiered_kv_replay_reproduces_blis_with_its_quirks(name, tmp_path, capsys):
    """BLIS HEAD with a CPU tier, with ``--blis-quirks``: every request's TTFT and E2E, the
    hit rate (with the CPU-miss term) and the thrashing rate are BLIS's. ``kv_tiered_reload``:
    1 instance, 384 GPU blocks, 1,200 CPU blocks, reloads of 25 + ceil(16/8) µs per block, no
    preemption. ``kv_tiered_preempt``: 448 GPU blocks, 2,500 CPU blocks, 63 preemptions whose
    readmissions reload over their own cached prefixes, hold blocks after failed admissions,
    and write blocks at positions that are not multiples of the block size."""
    case = _case(name)
    metrics, rows = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys,
                           ("--blis-quirks",))
    _check_tiered(case, metrics, rows)


def test_tiered_kv_preempt_counts_blis_tier_traffic(tmp_path, capsys):
    """The tier's counters of the preemption case are BLIS's own, read from an instrumented
    build of BLIS f90a1e3a (shared notes, semantics-sessions-tier.md §1.12-1.13): 22,536
    reloaded blocks, 8,982 mirror stores, 6,482 CPU evictions, 429 CPU misses, 63
    preemptions."""
    case = _case(GOLDEN_NEXT_TIERED_PREEMPT)
    metrics, _ = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys, ("--blis-quirks",))
    assert (metrics["kv_reloads"], metrics["kv_mirror_stores"], metrics["kv_cpu_evictions"],
            metrics["preemption_count"]) == (22_536, 8_982, 6_482, 63)
    # BLIS's CPU hit rate would be reloads / (reloads + CPU misses), with 429 CPU misses
    assert metrics["kv_cpu_hit_rate"] == 22_536 / (22_536 + 429)


def test_tiered_kv_default_saves_the_prefill_of_reloaded_blocks(tmp_path, capsys):
    """Without the quirk, blocks an admission reloads count as cached in its step (Decision
    12): the same trace's mean TTFT is lower than BLIS's."""
    case = _case(GOLDEN_NEXT_TIERED)
    metrics, _ = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys)
    assert metrics["ttft_mean_ms"] < case["metrics"]["ttft_mean_ms"]
    assert metrics["completed_requests"] == case["metrics"]["completed_requests"]


@pytest.mark.slow
@pytest.mark.parametrize("name", GOLDEN_NEXT_TIERED_CASES)
def test_tiered_kv_replay_reproduces_blis_in_the_jax_engine(name, tmp_path, capsys):
    """The same replays with ``--blis-quirks`` in the JAX engine: BLIS's every request, hit
    rate and thrashing rate (the population test ``tests/engine/test_parity_tier.py`` covers
    the tier in the default tier)."""
    case = _case(name)
    metrics, rows = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys,
                           ("--blis-quirks", "--engine", "jax"))
    _check_tiered(case, metrics, rows)


# ---- prefill/decode disaggregation -----------------------------------------------------------

_DECODE_POD = re.compile(r"req request_(\d+): decode pod pre-selected → instance_(\d+)")
_PREFILL_POD = re.compile(r"prefill req request_(\d+)_prefill → instance instance_(\d+)")
_TRANSFER = re.compile(r"KV transfer started for request_(\d+): \d+ blocks, duration=(\d+) ")


def _pd_lines(case: dict) -> dict[str, str]:
    text = case["stdout_other_sections"]
    block = text[text.index("=== PD Metrics ==="):]
    return dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)


def _stats_line(stats: dict) -> str:
    return (f"mean={stats['mean']:.1f} p50={stats['p50']:.1f} p95={stats['p95']:.1f} "
            f"p99={stats['p99']:.1f}")


@pytest.mark.parametrize("engine", ["reference", pytest.param("jax", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", GOLDEN_NEXT_PD)
def test_pd_replay_reproduces_blis_with_its_quirks(name, engine, tmp_path, capsys):
    """BLIS HEAD with prefill/decode pools (one prefill and two decode instances under
    round-robin; prefix-threshold over least-loaded pools; transfer contention with per-pool
    scorers): with ``--blis-quirks`` every request's TTFT and E2E, its decode and prefill
    instances (BLIS's debug routing lines), the aggregate metrics and BLIS's "PD Metrics"
    block are BLIS's, in either engine (the JAX replays compile a program each: slow tier;
    the default tier has the JAX engine match the reference on drawn pools,
    tests/engine/test_parity_pd.py)."""
    case = _case(name)
    metrics, rows = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys,
                           ("--blis-quirks", "--engine", engine))
    assert_matches_blis(case, metrics, rows)
    lines = case["routing"]["lines"]
    decode = {int(m.group(1)): int(m.group(2)) for m in map(_DECODE_POD.search, lines) if m}
    prefill = {int(m.group(1)): int(m.group(2)) for m in map(_PREFILL_POD.search, lines) if m}
    assert decode and {k: rows[k]["instance"] for k in decode} == decode
    assert prefill and {k: rows[k]["prefill_instance"] for k in prefill} == prefill
    assert all(rows[k]["prefill_instance"] is None for k in rows if k not in prefill)
    durations = {int(m.group(1)): int(m.group(2)) for m in map(_TRANSFER.search, lines) if m}
    assert durations.keys() == prefill.keys()
    assert {k: rows[k]["transfer_end_us"] - rows[k]["transfer_start_us"]
            for k in durations} == durations
    want = _pd_lines(case)
    assert metrics["pd_disaggregated_requests"] == int(want["Disaggregated Requests"])
    assert metrics["pd_dropped_at_decode_kv"] == int(want["Dropped at Decode KV"])
    assert f"{metrics['pd_prefill_throughput']:.4f} sub-req/s" == want["Prefill Throughput"]
    assert f"{metrics['pd_decode_throughput']:.4f} sub-req/s" == want["Decode Throughput"]
    assert f"{metrics['pd_load_imbalance']:.4f}" == want["Load Imbalance Ratio"]
    assert _stats_line(metrics["pd_parent_ttft_us"]) == want["Parent TTFT (us)"]
    assert _stats_line(metrics["pd_transfer_duration_us"]) == want["KV Transfer Duration (us)"]
    if "Peak Concurrent Transfers" in want:
        assert metrics["pd_peak_concurrent_transfers"] == int(want["Peak Concurrent Transfers"])
        assert (f"{metrics['pd_mean_transfer_queue_depth']:.4f}"
                == want["Mean Transfer Queue Depth"])


def test_pd_default_counts_round_robin_per_pool_and_the_prefill_step(tmp_path, capsys):
    """Without the quirks (Decision 12) the same 1 prefill + 2 decode replay keeps one
    round-robin counter per pool, so the decode instances alternate (BLIS's shared counter
    sends every decode to instance_1), and a transfer starts when its prefill ends, so every
    request's TTFT includes its prefill step: the mean TTFT exceeds BLIS's."""
    case = _case("pd_1p2d_always_rr")
    metrics, rows = replay(case["command"], GOLDEN_NEXT_DIR, tmp_path, capsys,
                           ("--engine", "reference"))
    decode = [rows[k]["instance"] for k in sorted(rows)]
    assert decode[:4] == [1, 2, 1, 2] and decode.count(2) == len(decode) // 2
    assert metrics["ttft_mean_ms"] > case["metrics"]["ttft_mean_ms"]
    assert metrics["completed_requests"] == case["metrics"]["completed_requests"]


# ---- autoscaler and instance lifecycle ------------------------------------------------------

GOLDEN_NEXT_AUTOSCALE = "autoscale_surge_rr"


def _autoscale_replay_command(case: dict) -> str:
    """BLIS's ``blis run`` line as the replay of the trace that run exported (BLIS's replay
    refuses autoscalers; ours accepts them, Decision 16)."""
    argv = case["command"].split()
    out = ["blis", "replay", "--trace-header", f"{case['trace']}.yaml",
           "--trace-data", f"{case['trace']}.csv"]
    skip = {"--workload-spec", "--metrics-path", "--trace-output"}
    i = 2
    while i < len(argv):
        if argv[i] in skip:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return " ".join([*out, "--results-path", "results.json"])


def _blis_slot(case: dict) -> dict[str, int]:
    """BLIS's instance names → slots: the initial instances, then autoscaled ones in order."""
    names = [block["instance_id"] for block in case["per_instance_metrics"]]
    return {name: k for k, name in enumerate(names)}


@pytest.mark.parametrize("engine", ["reference", pytest.param("jax", marks=pytest.mark.slow)])
def test_autoscale_run_reproduces_blis_with_its_quirks(engine, tmp_path, capsys):
    """BLIS HEAD's saturation autoscaler on a surge (2 warm instances on a 6-GPU pool; tick
    1.5 s, windows 1.5 s / 4.5 s, scrape delay 0.25 s, loading 2 s): with ``--blis-quirks``
    every request's TTFT, E2E and instance, the aggregate metrics, the per-instance completed
    and preemption counts, and the actuations BLIS logged (one instance placed at 10.75 s,
    loaded 2 s later; it and instance_0 drained together at 24.25 s) are BLIS's. The JAX
    replay compiles a roofline program of its own (slow tier; the default tier has the JAX
    engine match the reference on drawn autoscalers, tests/engine/test_parity_lifecycle.py)."""
    case = _case(GOLDEN_NEXT_AUTOSCALE)
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a
            for a in shlex.split(_autoscale_replay_command(case))[1:]]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "results.json")
    argv += ["--timeline-path", str(tmp_path / "timeline.csv")]
    assert main([*argv, "--blis-quirks", "--engine", engine]) == 0
    metrics = json.loads(capsys.readouterr().out)
    rows = {r["request_id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    slot = _blis_slot(case)
    assert len(rows) == len(case["results_us"])
    for want in case["results_us"]:
        got = rows[want["request_id"]]
        assert (got["status"], got["ttft_us"], got["e2e_us"], got["instance"]) == (
            "completed", want["ttft_us"], want["e2e_us"], slot[want["handled_by"]])
    for key, want in case["metrics"].items():
        if key != "instance_id":
            assert metrics[key] == pytest.approx(want, rel=1e-12, abs=1e-12), key
    assert metrics["cache_hit_rate"] == pytest.approx(case["metrics_path_file"]["cache_hit_rate"],
                                                      rel=1e-12)
    assert metrics["hol_blocking_instances"] == 1  # BLIS's "HOL Blocking Events: 1"
    for block in case["per_instance_metrics"]:
        k = slot[block["instance_id"]]
        assert metrics["instances"][str(k)]["completed_requests"] == block["completed_requests"]
        assert metrics["instances"][str(k)]["preemption_count"] == block["preemption_count"]
    auto = metrics["autoscaling"]
    assert (auto["scale_ups"], auto["instances_added"]) == (1, 1)
    assert (auto["scale_downs"], auto["instances_drained"]) == (1, 2)
    with (tmp_path / "timeline.csv").open() as f:
        changes = [(int(r["time_us"]), int(r["instance"]), r["state"])
                   for r in csv.DictReader(f)]
    assert (10_750_000, 2, "loading") in changes and (12_750_000, 2, "active") in changes
    assert (24_250_000, 2, "draining") in changes and (24_250_000, 0, "draining") in changes


def test_autoscale_default_drains_the_earliest_placed(tmp_path, capsys):
    """Without the quirks the same scale-down drains the two instances placed first, the
    initial ones (BLIS drains the smallest ID string: the autoscaled instance and instance_0),
    so the autoscaled instance serves the tail."""
    case = _case(GOLDEN_NEXT_AUTOSCALE)
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a
            for a in shlex.split(_autoscale_replay_command(case))[1:]]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "results.json")
    argv += ["--timeline-path", str(tmp_path / "timeline.csv")]
    assert main(argv) == 0
    capsys.readouterr()
    with (tmp_path / "timeline.csv").open() as f:
        drained = {int(r["instance"]) for r in csv.DictReader(f) if r["state"] == "draining"}
    assert drained == {0, 1}
    rows = json.loads((tmp_path / "results.json").read_text())
    last = max(rows, key=lambda r: r["arrival_us"])
    assert last["instance"] == 2


# ---- decision traces -------------------------------------------------------------------------

GOLDEN_NEXT_TRACE = "trace_rr_cf2"


def test_decision_trace_summary_is_blis(tmp_path, capsys):
    """BLIS's own command line with ``--trace-level decisions --counterfactual-k 2
    --summarize-trace`` (3 instances, round-robin, whose regret is the load it passes by):
    the "Trace Summary" block is BLIS's, character for character (mean regret 1.083333, max
    10), the metrics' ``trace_summary`` holds the same numbers, and every request keeps
    BLIS's instance, TTFT and E2E."""
    case = _case(GOLDEN_NEXT_TRACE)
    metrics, rows = _replay(case, tmp_path, capsys, "reference")
    _check(case, metrics, rows)
    assert main([*_trace_argv(case, tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err
    want = (GOLDEN_NEXT_DIR / f"{GOLDEN_NEXT_TRACE}.trace.summary.txt").read_text()
    assert err[err.index("=== Trace Summary ==="):].strip() == want.strip()
    summary = metrics["trace_summary"]
    assert summary == {
        "total_decisions": 600, "admitted": 600, "rejected": 0, "unique_targets": 3,
        "target_distribution": {"instance_0": 200, "instance_1": 200, "instance_2": 200},
        "mean_regret": summary["mean_regret"], "max_regret": 10.0}
    assert f"{summary['mean_regret']:.6f}" == "1.083333"


def _trace_argv(case: dict, tmp_path: Path) -> list[str]:
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a
            for a in shlex.split(case["command"])[1:]]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "results.json")
    return argv


def _check_sessions(case: dict, metrics: dict, rows: dict[int, dict], stderr: str) -> None:
    """BLIS's cluster metrics over all 432 requests, its 108 round-0 rows, each instance's
    completions and its session block (``sessions_closed_loop``: 108 four-round chats,
    ``--session-mode closed-loop``, prompts accumulating)."""
    first = {k: r for k, r in rows.items() if r["round_index"] == 0}
    assert len(rows) == 432 and len(first) == 108
    assert_matches_blis(case, metrics, first)
    assert [metrics["instances"][str(i)]["completed_requests"] for i in (0, 1)] == [
        inst["completed_requests"] for inst in case["per_instance_metrics"]]
    assert "Cache Hit Rate: 0.4738" in stderr
    blis_block = case["stdout"].split("=== Session Metrics ===\n")[1].strip("\n")
    assert stderr.split("=== Session Metrics ===\n")[1].splitlines()[:4] == \
        blis_block.splitlines()
    # the first follow-up: request_0 completes at 336,902 us; think = 1,136,902 - 2,349
    assert rows[3]["arrival_us"] == 336_902 + 1_136_902 - 2_349
    assert rows[3]["input_tokens"] == 140 + 107 + 377


def _replay_sessions(case: dict, tmp_path: Path, capsys, engine: str):
    argv = shlex.split(case["command"])[1:]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "results.json")
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a for a in argv]
    assert main([*argv, "--engine", engine]) == 0
    out, err = capsys.readouterr()
    rows = {r["request_id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    return json.loads(out), rows, err


def test_closed_loop_sessions_reproduce_blis(tmp_path, capsys):
    case = _case(GOLDEN_NEXT_SESSIONS)
    _check_sessions(case, *_replay_sessions(case, tmp_path, capsys, "reference"))


@pytest.mark.slow
def test_closed_loop_sessions_reproduce_blis_in_the_jax_engine(tmp_path, capsys):
    case = _case(GOLDEN_NEXT_SESSIONS)
    _check_sessions(case, *_replay_sessions(case, tmp_path, capsys, "jax"))


@pytest.mark.slow
def test_closed_loop_sessions_route_by_prefix_affinity_alike_in_both_engines(tmp_path, capsys):
    """``sessions_closed_loop`` routed by BLIS's default scorers (prefix-affinity:3,
    queue-depth:2, kv-utilization:2): the router's index holds each conversation's blocks, so
    follow-ups find the instance that served the conversation. Both engines print the same
    metrics and write the same per-request rows."""
    case = _case(GOLDEN_NEXT_SESSIONS)
    case["command"] = case["command"].replace(
        "--routing-scorers precise-prefix-cache:2,queue-depth:1",
        "--routing-scorers prefix-affinity:3,queue-depth:2,kv-utilization:2")
    assert "prefix-affinity:3" in case["command"]
    out = {}
    for engine in ("reference", "jax"):
        (tmp_path / engine).mkdir()
        metrics, rows, _ = _replay_sessions(case, tmp_path / engine, capsys, engine)
        out[engine] = (metrics, rows)
    assert out["jax"] == out["reference"]
    assert out["reference"][0]["completed_requests"] == 432


@pytest.mark.slow
def test_closed_loop_sessions_with_pd_pools_alike_in_both_engines(tmp_path, capsys):
    """``sessions_closed_loop`` on one prefill and two decode instances, every round
    disaggregated: all 432 rounds run (each follow-up created when its predecessor's decode
    sub-request completes), and both engines print the same metrics and write the same
    per-request rows."""
    case = _case(GOLDEN_NEXT_SESSIONS)
    case["command"] = case["command"].replace(
        "--num-instances 2 --routing-policy weighted --routing-scorers "
        "precise-prefix-cache:2,queue-depth:1",
        "--num-instances 3 --prefill-instances 1 --decode-instances 2 --pd-decider always "
        "--routing-policy weighted --routing-scorers prefix-affinity:3,queue-depth:1")
    assert "--pd-decider always" in case["command"]
    out = {}
    for engine in ("reference", "jax"):
        (tmp_path / engine).mkdir()
        out[engine] = _replay_sessions(case, tmp_path / engine, capsys, engine)[:2]
    assert out["jax"] == out["reference"]
    metrics = out["reference"][0]
    assert metrics["completed_requests"] == 432 == metrics["pd_disaggregated_requests"]


def test_closed_loop_sessions_without_accumulate_send_only_the_message(tmp_path, capsys):
    """Without the header's ``session_context_growth: accumulate`` a follow-up's prompt is its
    own message: 265,468 input tokens in all (the CSV's column sum) instead of 571,700."""
    case = _case(GOLDEN_NEXT_SESSIONS)
    header = tmp_path / "sessions_chat.yaml"
    header.write_text((GOLDEN_NEXT_DIR / "sessions_chat.yaml").read_text().replace(
        "session_context_growth: accumulate\n", ""))
    case["command"] = case["command"].replace("--trace-header sessions_chat.yaml",
                                              f"--trace-header {header}")
    metrics, rows, _ = _replay_sessions(case, tmp_path, capsys, "reference")
    with open(GOLDEN_NEXT_DIR / "sessions_chat.csv", newline="") as f:
        column = sum(int(r["input_tokens"]) for r in csv.DictReader(f))
    assert metrics["total_input_tokens"] == column == 265_468
    assert metrics["completed_requests"] == 432
