"""Policy codes: the labels are BLIS's policy names, and every consumer maps names the same way."""

import pytest

from blisjax.config.codes import (
    AdmissionPolicy,
    PreemptionPolicy,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPolicy,
    Scorer,
    TieBreak,
)


def test_labels_are_blis_policy_names():
    # Names as BLIS's CLI and policy bundles spell them (docs/semantics.md §5.3–§5.9), and
    # blisjax's policy programs last (docs/policy-programs.md).
    assert RoutingPolicy.labels() == ("round-robin", "least-loaded", "always-busiest", "weighted",
                                      "program")
    assert AdmissionPolicy.labels()[-1] == PriorityPolicy.labels()[-1] == "program"
    assert Scorer.labels() == ("prefix-affinity", "queue-depth", "kv-utilization", "load-balance",
                               "precise-prefix-cache", "load-aware", "active-requests",
                               "running-requests", "no-hit-lru", "vllm-dp")
    assert TieBreak.labels() == ("blis-random", "lowest-index")
    assert SchedulerPolicy.labels() == ("fcfs", "priority-fcfs", "sjf")
    assert AdmissionPolicy.labels()[:3] == ("always-admit", "token-bucket", "reject-all")
    assert PriorityPolicy.labels()[:2] == ("constant", "slo-based")
    assert PreemptionPolicy.labels() == ("fcfs", "priority")


def test_of_maps_a_label_to_its_code_and_names_the_choices_otherwise():
    assert AdmissionPolicy.of("tenant-quota") == AdmissionPolicy.TENANT_QUOTA == 4
    assert SchedulerPolicy.of("priority-fcfs").label == "priority-fcfs"
    with pytest.raises(ValueError, match="'lifo' is not one of fcfs, priority"):
        PreemptionPolicy.of("lifo")
