"""Initial program for OpenEvolve: a policy bundle for configs/search/prefix-affinity.yaml.

``policy()`` returns the BLIS policy-bundle sections that replace the experiment's (any of
admission, priority, routing, scheduler; those left out keep the experiment's). It starts as
the scenario's configured policy: weighted routing by load only (prefix-affinity weight 0).
Routing: policy round-robin, least-loaded, always-busiest or weighted (scorers
prefix-affinity, precise-prefix-cache, load-balance, queue-depth, kv-utilization, load-aware,
active-requests, running-requests, no-hit-lru, vllm-dp with non-negative weights, not all 0);
scheduler: fcfs, priority-fcfs or sjf; priority: constant, slo-based, slo-class,
tenant-priority or deadline-aware; admission: always-admit, token-bucket, rate-limit,
tenant-quota. The evaluator (search/adapters/openevolve_evaluator.py) runs it in a sandbox that allows
only a few pure-Python imports (math, collections, ...).
"""

from __future__ import annotations

from typing import Any


# EVOLVE-BLOCK-START
def policy() -> dict[str, Any]:
    """The policy-bundle sections, as YAML-like data."""
    return {
        "admission": {"policy": "always-admit"},
        "priority": {"policy": "constant"},
        "routing": {
            "policy": "weighted",
            "scorers": [
                {"name": "prefix-affinity", "weight": 0.0},
                {"name": "load-balance", "weight": 1.0},
            ],
            "tie_break": "lowest-index",
        },
        "scheduler": "fcfs",
    }
# EVOLVE-BLOCK-END
