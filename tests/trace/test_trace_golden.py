"""Decision traces of BLIS's own runs (tests/data/blis-golden-next), replayed with BLIS's
command lines: the P/D records name BLIS's decode and prefill pods and KV-transfer durations
(its debug lines), and the autoscaler's records show the actuations BLIS logged."""

from __future__ import annotations

import json
import shlex

from blisjax.cli import main
from blisjax.trace import of_kind, read_jsonl
from tests.paths import GOLDEN_NEXT_DIR
from tests.test_golden_next import (
    _DECODE_POD,
    _PREFILL_POD,
    _TRANSFER,
    GOLDEN_NEXT_AUTOSCALE,
    _autoscale_replay_command,
    _case,
)


def _traced_replay(command: str, tmp_path, capsys, *extra: str) -> tuple[dict, list[dict]]:
    argv = [str(GOLDEN_NEXT_DIR / a) if a.endswith((".yaml", ".csv")) else a
            for a in shlex.split(command)[1:]]
    argv[argv.index("--results-path") + 1] = str(tmp_path / "results.json")
    out = tmp_path / "trace"
    assert main([*argv, *extra, "--trace-level", "decisions", "--counterfactual-k", "2",
                 "--trace-out", str(out), "--quiet"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    return metrics, read_jsonl(out / "trace.jsonl")


def test_pd_trace_names_blis_pods_and_transfers(tmp_path, capsys):
    """Prefix-threshold P/D (2 prefill + 2 decode, least-loaded pools): one disaggregation
    record per request, a routing record (decode pool) only for the 139 requests served
    whole and a prefill-routing record for the 311 disaggregated ones (BLIS's records); their
    instances and the transfer durations are the ones BLIS logged."""
    case = _case("pd_2p2d_prefix_threshold_ll")
    metrics, lines = _traced_replay(case["command"], tmp_path, capsys, "--blis-quirks")
    blis = case["routing"]["lines"]
    decode = {int(m.group(1)): int(m.group(2)) for m in map(_DECODE_POD.search, blis) if m}
    prefill = {int(m.group(1)): int(m.group(2)) for m in map(_PREFILL_POD.search, blis) if m}
    durations = {int(m.group(1)): int(m.group(2)) for m in map(_TRANSFER.search, blis) if m}
    split = of_kind(lines, "disaggregation")
    assert {d["request_id"]: d["decode_instance"] for d in split} == decode
    assert {d["request_id"] for d in split if d["disaggregate"]} == prefill.keys()
    assert len(prefill) == 311 and len(decode) == 450
    assert {r["request_id"]: r["chosen_instance"] for r in of_kind(lines, "prefill_routing")} \
        == prefill
    whole = of_kind(lines, "routing")
    assert {r["request_id"] for r in whole} == decode.keys() - prefill.keys()
    assert all(r["chosen_instance"] == decode[r["request_id"]] for r in whole)
    assert all({v["instance"] for v in r["snapshots"]} == {2, 3} for r in whole)  # decode pool
    transfers = of_kind(lines, "kv_transfer")
    assert {t["request_id"]: t["transfer_duration_us"] for t in transfers} == durations
    assert metrics["trace_summary"]["target_distribution"] == {
        f"instance_{k}": sum(1 for r in whole if r["chosen_instance"] == k) for k in (2, 3)}
    assert metrics["trace_summary"]["mean_regret"] == 0.0  # least-loaded: regret 0


def test_autoscaler_trace_shows_blis_actuations(tmp_path, capsys):
    """BLIS's saturation autoscaler on a surge: the trace records the placement at 10.75 s
    (slot 2, loading 2 s), the drain of slot 2 and instance_0 at 24.25 s (BLIS's log), and a
    decision at every tick (1.5 s apart, the first at 0)."""
    case = _case(GOLDEN_NEXT_AUTOSCALE)
    _, lines = _traced_replay(_autoscale_replay_command(case), tmp_path, capsys,
                              "--blis-quirks")
    acts = [(a["time_us"], a["placed"], a["drained"]) for a in of_kind(lines, "scale_actuation")]
    assert acts == [(10_750_000, [2], []), (24_250_000, [], [2, 0])]
    states = [(s["time_us"], s["instance"], s["state"]) for s in of_kind(lines, "instance_state")]
    assert (10_750_000, 2, "loading") in states and (12_750_000, 2, "active") in states
    ticks = [d["time_us"] for d in of_kind(lines, "scale_decision")]
    assert ticks[:3] == [0, 1_500_000, 3_000_000]
    assert all(b - a == 1_500_000 for a, b in zip(ticks[:-1], ticks[1:], strict=True))
    assert sum(d["actuate"] for d in of_kind(lines, "scale_decision")) == 2
