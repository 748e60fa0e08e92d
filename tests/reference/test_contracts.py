"""Contracts of docs/semantics.md §11 that no other test states on its own: instance isolation
(BC-4) and independence from the state of the Python process (BC-11).

The other contracts are checked where their subject lives; §11 names the test of each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from blisjax.config import AdmissionConfig, PriorityConfig, RoutingConfig, ScorerWeight
from tests.reference.conftest import run

REPO = Path(__file__).resolve().parents[2]

PER_REQUEST = ("status", "ttft_us", "e2e_us", "scheduling_delay_us", "itl_sum_us", "itl_count",
               "output_tokens_done", "preemptions", "length_capped")
PER_INSTANCE = ("cache_hits", "cache_misses", "preemption_count", "completed", "busy_time_us",
                "step_count", "peak_kv_blocks_used", "total_input_tokens", "queue_depth_time_us")

# Twelve requests with prefix sharing and a KV cache small enough (18 blocks of 16 tokens) for
# preemptions on both instances: every part of an instance's state is exercised.
ISOLATION_ROWS = [
    dict(arrival=t, input=inp, output=out, group=g, prefix=32 if g >= 0 else 0)
    for t, inp, out, g in [
        (0, 120, 9, 0), (0, 200, 4, -1), (150, 64, 12, 0), (400, 90, 3, 1), (420, 150, 7, 1),
        (900, 48, 20, -1), (1000, 130, 5, 0), (1300, 33, 11, 1), (2000, 210, 2, -1),
        (2100, 70, 15, 0), (2500, 100, 6, 1), (2600, 40, 9, -1),
    ]
]


def _rows_of(rows: list[dict], indices: list[int]) -> list[dict]:
    return [rows[i] for i in indices]


def test_bc4_each_instance_behaves_as_if_it_were_alone():
    # BC-4: instances share no mutable state. Round-robin routing reads no instance state, so
    # with two instances request i goes to instance i mod 2; each instance must then give its
    # requests exactly the results a one-instance cluster gives when it receives only them.
    common = dict(kv_blocks=18, block_size=16, max_running=6, max_tokens=256,
                  routing=RoutingConfig(policy="round-robin"))
    both, _ = run(ISOLATION_ROWS, instances=2, groups=("g0", "g1"), **common)
    assert list(both.instance) == [i % 2 for i in range(len(ISOLATION_ROWS))]
    # The scenario is not idle: both instances preempt and hit their prefix cache.
    assert (both.preemption_count > 0).all() and (both.cache_hits > 0).all()
    for k in (0, 1):
        mine = [i for i in range(len(ISOLATION_ROWS)) if i % 2 == k]
        alone, _ = run(_rows_of(ISOLATION_ROWS, mine), instances=1, groups=("g0", "g1"), **common)
        for name in PER_REQUEST:
            assert np.array_equal(getattr(both, name)[mine], getattr(alone, name)), (k, name)
        for name in PER_INSTANCE:
            assert getattr(both, name)[k] == getattr(alone, name)[0], (k, name)


# A scenario whose policies key state by tenant and prefix-group names (strings): if any result
# depended on the iteration order of a set or dict of strings, it would change with the
# process's hash seed.
_DIGEST_SCRIPT = """
import hashlib, sys
import numpy as np
from tests.reference.test_contracts import hash_sensitive_result
res = hash_sensitive_result()
h = hashlib.sha256()
def feed(value):
    if value is None or isinstance(value, (dict, int)):
        h.update(repr(value).encode())
    elif isinstance(value, tuple):  # e.g. the CPU tier's counters
        for part in value:
            feed(part)
    else:
        h.update(np.asarray(value).tobytes())
for name in sorted(vars(res)):
    h.update(name.encode())
    feed(getattr(res, name))
sys.stdout.write(h.hexdigest())
"""


def hash_sensitive_result():
    """Run of three instances with tenant quotas, SLO-class priority and prefix-affinity
    routing over string-named tenants and prefix groups."""
    tenants, groups = ("alpha", "beta", "gamma"), ("sys-a", "sys-b", "sys-c")
    rng = np.random.default_rng(5)
    rows = []
    t = 0
    for i in range(60):
        t += int(rng.integers(0, 400))
        g = int(rng.integers(-1, 3))
        rows.append(dict(arrival=t, input=int(rng.integers(60, 300)),
                         output=int(rng.integers(1, 20)), group=g, prefix=48 if g >= 0 else 0,
                         tenant=tenants[i % 3], slo=("critical", "standard", "batch")[i % 3]))
    res, _ = run(rows, instances=3, tenants=tenants, groups=groups, kv_blocks=80, max_running=4,
                 admission=AdmissionConfig(policy="tenant-quota", default_tenant_max_in_flight=4),
                 priority=PriorityConfig(policy="slo-class"),
                 routing=RoutingConfig(policy="weighted",
                                       scorers=(ScorerWeight("prefix-affinity", 3.0),
                                                ScorerWeight("queue-depth", 1.0))))
    return res


def _digest_in_subprocess(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True,
                          cwd=REPO, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bc11_results_do_not_depend_on_the_process_hash_seed():
    # BC-11: results depend only on configuration, seed and workload. Two processes with
    # different string-hash seeds (and at different wall-clock times) give the same bytes.
    first = _digest_in_subprocess("1")
    second = _digest_in_subprocess("4242")
    assert len(first) == 64 and first == second
