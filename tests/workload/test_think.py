"""Think-time distributions of closed-loop replay (BLIS's ``--think-time-dist``;
``blisjax.workload.think``): parsing as BLIS's ``ParseThinkTimeDist``, draws by hand, and the
session sources they come from (shared notes, semantics-sessions-tier.md §2.3–§2.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blisjax.gorand import GoRand
from blisjax.workload.think import ThinkTimeDist, parse_think_time_dist
from blisjax.workload.trace import read_trace
from tests.paths import GOLDEN_NEXT_DIR

HEADER, DATA = GOLDEN_NEXT_DIR / "sessions_chat.yaml", GOLDEN_NEXT_DIR / "sessions_chat.csv"


@pytest.mark.parametrize("spec, value_us", [
    ("constant:value=500ms", 500_000), ("constant:value=2s", 2_000_000),
    ("constant:value=250us", 250), ("constant:value=1.5", 1_500),  # bare: ms
    ("constant:value=0.0004ms", 0),  # truncated to whole µs
])
def test_constant_times_and_their_units(spec, value_us):
    dist = parse_think_time_dist(spec)
    assert dist == ThinkTimeDist("constant", value_us=value_us) and not dist.draws
    assert dist.sample(GoRand(1)) == value_us


def test_lognormal_draws_are_exp_of_mu_in_seconds_shifted_to_microseconds():
    """sigma 1e-12: exp(ln 2 + ln 1e6 + ~0) rounds to 2,000,000 µs whatever Z is; the bounds
    clamp the draw (3 s .. 30 s), and a huge mu lands on max."""
    two = parse_think_time_dist(f"lognormal:mu={math.log(2.0)!r},sigma=1e-12")
    assert two.draws and two.sample(GoRand(7)) == 2_000_000
    low = parse_think_time_dist(f"lognormal:mu={math.log(2.0)!r},sigma=1e-12,min=3s,max=30s")
    assert low.sample(GoRand(7)) == 3_000_000
    high = parse_think_time_dist("lognormal:mu=40,sigma=0.5,min=3s,max=30s")
    assert high.sample(GoRand(7)) == 30_000_000
    # exp overflows: the minimum (or 1 µs)
    assert parse_think_time_dist("lognormal:mu=800,sigma=1,min=2ms").sample(GoRand(3)) == 2_000
    assert parse_think_time_dist("lognormal:mu=800,sigma=1").sample(GoRand(3)) == 1


def test_one_lognormal_draw_takes_one_normal_of_the_source():
    dist = parse_think_time_dist("lognormal:mu=2.0,sigma=0.6")
    a, b = GoRand(11), GoRand(11)
    got = dist.sample(a)
    z = b.norm_float64()
    want = math.exp((2.0 + math.log(1e6)) + 0.6 * z)
    assert abs(got - want) <= 0.5 + 1e-6 * want
    assert a.int63() == b.int63()  # both sources advanced by the same draw


@pytest.mark.parametrize("spec, message", [
    ("500ms", "expected type:key=value"),
    ("gamma:k=2", "unknown type 'gamma'"),
    ("lognormal:sigma=0.5", "needs parameter 'mu'"),
    ("lognormal:mu=1,sigma=0", "sigma must be > 0"),
    ("lognormal:mu=1,sigma=0.5,min=30s,max=3s", "min .* must be <= max"),
    ("constant:value=5ms,value=6ms", "duplicate parameter 'value'"),
    ("constant:value=-5ms", "non-negative finite time"),
    ("constant:val=5ms", "unknown parameter 'val'"),
    ("lognormal:mu=nan,sigma=1", "mu must be finite"),
])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_think_time_dist(spec)


def _by_hand(seed: int, dist: ThinkTimeDist):
    """BLIS's replay as the notes state it: the master source (seed) draws one seed per session
    in session order (no prefix groups in this trace); a session's source draws round 0's
    input then output tokens, then per later round its think time, then the round's input and
    output tokens; one token = one Intn(128000)."""
    w = read_trace(HEADER, DATA, session_mode="closed-loop")
    master, out = GoRand(seed), {}
    for s in range(len(w.session_names)):
        rows = np.flatnonzero(w.session == s)  # round 0 first, then rounds 1.. in order
        rows = rows[np.argsort(w.round_index[rows], kind="stable")]
        source = GoRand(master.int63())
        # round 0's prompt is its own input tokens; a follow-up's message is its row's
        for k, row in enumerate(rows):
            if k:
                out[int(row)] = dist.sample(source)
            for _ in range(int(w.input_tokens[row]) + int(w.output_tokens[row])):
                source.intn(128_000)
    return w, out


def test_think_times_come_from_each_sessions_source():
    dist = parse_think_time_dist("lognormal:mu=0.5,sigma=0.8,min=100ms,max=20s")
    w, want = _by_hand(42, dist)
    got = read_trace(HEADER, DATA, session_mode="closed-loop", think_time_dist=dist, seed=42)
    follow = np.flatnonzero(got.follow_up)
    assert {int(r): int(got.think_time_us[r]) for r in follow} == want
    assert len(set(want.values())) > 100  # drawn, not constant
    other = read_trace(HEADER, DATA, session_mode="closed-loop", think_time_dist=dist, seed=43)
    assert not np.array_equal(other.think_time_us, got.think_time_us)
    with pytest.raises(ValueError, match="think_time_dist: needs session_mode"):
        read_trace(HEADER, DATA, think_time_dist=dist)


def test_cli_constant_distribution_equals_think_time_ms(tmp_path, capsys):
    from blisjax.cli import main

    base = ["replay", "--quiet", "--engine", "reference", "--trace-header", str(HEADER),
            "--trace-data", str(DATA), "--session-mode", "closed-loop",
            "--total-kv-blocks", "4000", "--max-model-len", "4096"]
    assert main([*base, "--think-time-ms", "300", "--metrics-path",
                 str(tmp_path / "a.json")]) == 0
    assert main([*base, "--think-time-dist", "constant:value=300ms", "--metrics-path",
                 str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    capsys.readouterr()
    assert main([*base, "--think-time-dist", "constant:value=300ms", "--think-time-ms",
                 "300"]) == 2
    assert "--think-time-dist: needs --session-mode closed-loop and no --think-time-ms" \
        in capsys.readouterr().err
