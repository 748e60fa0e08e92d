"""Prefill/decode disaggregation in the reference engine, on timelines computed by hand
(docs/semantics.md §5.10, Decision 15), and its configuration's validation.

The blackbox model of ``conftest`` (step = 1000 + 10·prefill tokens + 100·decode tokens µs,
α = 0, so no queueing delay, output-token processing or post-decode overhead), 16-token blocks
and llama-3.1-8b's 131,072 KV bytes per token. A 160-token prompt is 10 blocks =
20,971,520 bytes; at 20 GB/s (20,000 bytes/µs) plus 0.1 ms its transfer takes
ceil(100 + 1048.576) = 1149 µs.
"""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.config import ConfigError, resolve_config
from blisjax.config.flags import apply_blis_flag_values
from blisjax.config.pd import PDConfig
from blisjax.config.sim import ClusterConfig, SimConfig
from blisjax.metrics import aggregate_metrics, per_request_rows
from blisjax.metrics.records import COMPLETED, DROPPED, TIMED_OUT
from blisjax.reference import ClusterSimulator
from blisjax.reference.pd import Role, disaggregates, transfer_duration_us
from tests.reference.conftest import make_resolved, make_workload

TRANSFER_US = 1149
PD = dict(prefill_instances=1, decode_instances=1, decider="always",
          transfer_bandwidth_gbps=20.0, transfer_base_latency_ms=0.1)


def _run(rows, *, quirks=False, pd=None, **engine):
    base = make_resolved(instances=2, quirks=quirks, **engine)
    cfg = base.config
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, pd=PDConfig(**(pd or PD))))
    w = make_workload(rows)
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    return result, aggregate_metrics(result, w), per_request_rows(result, w)


def test_transfer_duration_formula():
    # BLIS's worked value: 1139 tokens = 72 blocks of llama-3.1-8b at 25 GB/s + 0.05 ms
    assert transfer_duration_us(1139, 16, 131072.0, 25.0, 0.05, 1) == 6090
    assert transfer_duration_us(160, 16, 131072.0, 20.0, 0.1, 1) == TRANSFER_US
    # contention: the bandwidth is shared by the transfers in flight, this one included
    assert transfer_duration_us(160, 16, 131072.0, 20.0, 0.1, 2) == 100 + 2098  # 2097.152
    assert transfer_duration_us(1, 16, 1.0, 25.0, 0.0, 1) == 1  # at least 1 µs


def test_deciders():
    assert not disaggregates("never", 0, 500, 0, 16)
    assert disaggregates("always", 0, 0, 0, 16)
    # prefix-threshold: uncached tokens on the decode instance strictly above the threshold
    assert disaggregates("prefix-threshold", 200, 500, 18, 16)  # 500 - 288 = 212
    assert not disaggregates("prefix-threshold", 212, 500, 18, 16)
    assert not disaggregates("prefix-threshold", 0, 0, 0, 16)  # no prompt


def test_roles_follow_the_index_ranges():
    pd = PDConfig(prefill_instances=2, decode_instances=1, shared_instances=1)
    assert pd.roles(5) == [Role.PREFILL, Role.PREFILL, Role.DECODE, Role.SHARED,
                                     Role.NONE]
    assert PDConfig().roles(2) == [Role.SHARED, Role.SHARED]


@pytest.mark.parametrize("quirks", [False, True])
def test_one_request_timeline(quirks):
    """Prefill on instance 0 in one step [0, 2600); the transfer starts at its end (2600), or
    with the quirk at its start (0); the decode sub-request runs max(1, 3 - 1) = 2 decode steps
    of 1100 µs from the transfer's end. TTFT = decode scheduling delay + first ITL."""
    result, m, rows = _run([dict(arrival=0, input=160, output=3)], quirks=quirks)
    start = 0 if quirks else 2600
    end = start + TRANSFER_US
    assert result.status[0] == COMPLETED and result.instance[0] == 1
    assert result.pd.prefill_instance[0] == 0
    assert (result.pd.transfer_start_us[0], result.pd.transfer_end_us[0]) == (start, end)
    assert result.ttft_us[0] == end + 1100
    assert result.e2e_us[0] == end + 2 * 1100
    assert result.scheduling_delay_us[0] == 0  # the prefill's
    assert (result.itl_sum_us[0], result.itl_count[0]) == (2200, 2)
    assert result.output_tokens_done[0] == 3
    # instance 0 completed the prefill sub-request, instance 1 the decode one
    assert result.completed.tolist() == [1, 1] and result.pd.prefill_completed == 1
    assert m["completed_requests"] == 1 and m["injected_requests"] == 1
    assert m["total_input_tokens"] == 160 and m["total_output_tokens"] == 3
    assert m["pd_disaggregated_requests"] == 1
    # BLIS leaves out transfers that started at time 0
    assert m["pd_transfer_duration_us"]["mean"] == (0.0 if quirks else TRANSFER_US)
    assert rows[0]["ttft_us"] == end + 1100


@pytest.mark.parametrize("quirks", [False, True])
def test_chunked_prefill_transfer_starts_with_the_last_chunk(quirks):
    """64-token chunks: steps [0, 1640), [1640, 3280), [3280, 4600) (32 tokens); the transfer
    starts at 4600, or with the quirk at the last chunk's start 3280 (only that step is
    hidden)."""
    result, _, _ = _run([dict(arrival=0, input=160, output=3)], quirks=quirks, max_tokens=64)
    start = 3280 if quirks else 4600
    assert result.pd.transfer_start_us[0] == start
    assert result.ttft_us[0] == start + TRANSFER_US + 1100


@pytest.mark.parametrize("quirks", [False, True])
def test_failed_decode_reservation_drops_the_request(quirks):
    """14 KV blocks per instance. Request 0 prefills in [0, 2600) and its decode sub-request
    holds 11 blocks from its first decode step on; request 1 waits for the prefill instance's
    blocks, prefills in [2600, 5200), and its reservation (10 blocks) at 5200 — with the quirk
    at 2600 — finds 3 free: dropped. By default it is a dropped request; with the quirk it is
    BLIS's completed-looking row (TTFT = its prefill's, E2E = transfer start − arrival) that
    ``completed_requests`` does not count, and BLIS's always-zero drop count."""
    result, m, rows = _run([dict(arrival=0, input=160, output=50),
                            dict(arrival=0, input=160, output=3)], quirks=quirks, kv_blocks=14)
    start = 2600 if quirks else 5200
    assert result.pd.transfer_start_us[1] == start and result.pd.transfer_end_us[1] == -1
    assert result.pd.dropped_at_decode_kv == 1
    assert m["completed_requests"] == 1 and m["dropped_unservable"] == 1
    assert result.status[0] == COMPLETED
    if quirks:
        assert result.status[1] == COMPLETED
        assert (result.ttft_us[1], result.e2e_us[1]) == (5200, start)
        assert m["pd_dropped_at_decode_kv"] == 0
    else:
        assert result.status[1] == DROPPED and result.ttft_us[1] == -1
        assert m["pd_dropped_at_decode_kv"] == 1
        assert rows[1]["status"] == "dropped"
    assert m["pd_disaggregated_requests"] == 1


def test_never_routes_whole_requests_to_the_decode_pool_only():
    """With pools and the never decider every request is served whole by the decode pool
    (instance 1 of prefill 0, decode 1 and an unpooled 2); the others get nothing."""
    base = make_resolved(instances=3)
    cfg = dataclasses.replace(base.config, cluster=dataclasses.replace(
        base.config.cluster, pd=PDConfig(prefill_instances=1, decode_instances=1)))
    w = make_workload([dict(arrival=k * 10, input=32, output=2) for k in range(4)])
    result = ClusterSimulator(resolve_config(cfg), w, check_invariants=True).run()
    assert result.instance.tolist() == [1, 1, 1, 1]
    assert result.completed.tolist() == [0, 4, 0]
    assert result.pd.prefill_instance.tolist() == [-1] * 4


# ---- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(("pd", "message"), [
    (dict(prefill_instances=1), "both > 0 or both 0"),
    (dict(decider="always", shared_instances=2), "needs prefill instances"),
    (dict(prefill_instances=2, decode_instances=2), "must not exceed cluster.num_instances"),
    (dict(transfer_contention=True), "needs P/D pools"),
    (dict(prefill_instances=1, decode_instances=1, transfer_bandwidth_gbps=0), "> 0"),
    (dict(prefill_instances=1, decode_instances=1, decider="sometimes"), "decider"),
    (dict(prefill_instances=1, decode_instances=1, prefill_scorers=[("queue-depth", 0)]),
     "must not all be 0"),
    (dict(wrong=1), "cluster.pd.wrong: unknown key"),
])
def test_invalid_pools_are_refused(pd, message):
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(num_instances=3, pd=pd)


def test_blis_flags():
    cfg = SimConfig(cluster=ClusterConfig(num_instances=4))
    got = apply_blis_flag_values(cfg, {
        "prefill-instances": "2", "decode-instances": "2", "pd-decider": "prefix-threshold",
        "pd-prefix-threshold": "200", "pd-transfer-contention": True,
        "decode-routing-scorers": "kv-utilization:2,queue-depth:1"}).cluster.pd
    assert (got.prefill_instances, got.decode_instances, got.prefix_threshold_tokens) == (2, 2,
                                                                                           200)
    assert got.transfer_contention and [s.name for s in got.decode_scorers] == [
        "kv-utilization", "queue-depth"]
    with pytest.raises(ConfigError, match="--pd-prefix-threshold: is only used with"):
        apply_blis_flag_values(cfg, {"prefill-instances": 1, "decode-instances": 1,
                                     "pd-prefix-threshold": 5})
    with pytest.raises(ConfigError, match="--decode-tp: cluster.pd.decode.tensor_parallel_size: "
                                          "per-pool settings need a prefill pool"):
        apply_blis_flag_values(cfg, {"decode-tp": "2"})


@pytest.mark.parametrize("flag", [["--pd-transfer-bandwidth", "5"], ["--pd-decider", "never"],
                                  ["--pd-transfer-contention"]])
def test_pd_flags_without_pools_are_refused(flag, capsys):
    from blisjax.cli import main

    assert main(["run", "--quiet", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"blisjax: error: {flag[0]}: ") and "P/D pools" in err


def test_pools_round_trip_through_yaml():
    import yaml

    from blisjax.config import ScorerWeight
    from blisjax.config.yaml_io import config_from_dict, dump_config

    cfg = SimConfig(cluster=ClusterConfig(num_instances=4, pd=PDConfig(
        prefill_instances=2, decode_instances=2, decider="prefix-threshold",
        prefix_threshold_tokens=200, transfer_contention=True,
        decode_scorers=(ScorerWeight("queue-depth", 1.0),))))
    text = dump_config(cfg)
    assert "decode_scorers:\n    - name: queue-depth" in text
    assert config_from_dict(yaml.safe_load(text)) == cfg


@pytest.mark.parametrize("quirks", [False, True])
def test_decode_timeout_times_the_request_out(quirks):
    """Deadline 6000 µs, 10 output tokens: the decode sub-request (9 steps of 1100 µs from
    the transfer's end, 3749 or 1149) times out at 6000 while decoding. By default the request
    times out (keeping its prefill's TTFT, 2600); BLIS ends the request at its decode
    sub-request's timeout: a completed-looking row with TTFT = decode scheduling delay + first
    ITL and E2E = 6000 − 0, outside ``completed_requests``."""
    result, m, _ = _run([dict(arrival=0, input=160, output=10, deadline=6000)], quirks=quirks)
    assert m["completed_requests"] == 0 and m["timed_out_requests"] == 1
    if quirks:
        assert result.status[0] == COMPLETED
        assert (result.ttft_us[0], result.e2e_us[0]) == (TRANSFER_US + 1100, 6000)
    else:
        assert result.status[0] == TIMED_OUT
        assert (result.ttft_us[0], result.e2e_us[0]) == (2600, -1)
