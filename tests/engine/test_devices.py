"""Populations sharded over several local devices (here: two CPU devices forced by XLA_FLAGS).

JAX fixes the device count when it starts, so the check runs in a fresh interpreter. Three
lanes on two devices also exercise padding to a multiple of the device count; four lanes are
read back from each device's own share (``results.HostLanes``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.paths import REPO

SCRIPT = textwrap.dedent("""
    import jax
    from blisjax.engine import params_from_config, simulate_population, stack_params
    from blisjax.engine.parity import first_divergence
    from blisjax.reference import simulate as reference
    from blisjax.config import resolve_config
    from tests.engine.test_parity import EDGE_ROWS, _random_policy_configs
    from tests.reference.conftest import make_resolved, make_workload

    assert jax.local_device_count() == 2, jax.local_devices()
    base = make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=4, max_tokens=64)
    w = make_workload(EDGE_ROWS, ("a", "b"), ("g",))
    configs = _random_policy_configs(base.config, w.tenant_names, 4, seed=11)
    for count in (3, 4):  # padded to 4 lanes, then 4 lanes read from each device's share
        params = stack_params([params_from_config(c, w.tenant_names) for c in configs[:count]])
        lanes = simulate_population(base, w, params)
        assert len(lanes) == count
        for k, cfg in enumerate(configs[:count]):
            d = first_divergence(reference(resolve_config(cfg), w), lanes[k])
            assert d is None, (count, k, d)
    print("OK two devices")
""")


def test_population_sharded_over_two_devices_matches_reference():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK two devices" in out.stdout
