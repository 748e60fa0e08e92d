"""Workloads: generation from a BLIS workload spec, BLIS TraceV2 read/write, and a
configuration's ``workload:`` section as either (``workload_from_section``).

Both paths produce one ``Workload`` (plain numpy arrays, one row per request) that every engine
consumes. Randomness comes from ``PartitionedRNG`` named streams (seed + name path only).
"""

from blisjax.workload.adversarial import LongPromptFlood, SynchronizedBurst, TenantSurge
from blisjax.workload.clients import (
    ActiveWindow,
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    LifecycleSpec,
    MultiTurnSpec,
)
from blisjax.workload.generate import generate_workload
from blisjax.workload.rng import PartitionedRNG
from blisjax.workload.section import section_traces, workload_from_section
from blisjax.workload.spec import WorkloadSpec, distribution_spec, parse_workload_spec
from blisjax.workload.trace import read_trace, write_trace
from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, SLO_CLASSES, Workload

__all__ = [
    "FOLLOW_UP_ARRIVAL_US",
    "SLO_CLASSES",
    "ActiveWindow",
    "ArrivalSpec",
    "ClientSpec",
    "DistSpec",
    "LifecycleSpec",
    "LongPromptFlood",
    "MultiTurnSpec",
    "PartitionedRNG",
    "SynchronizedBurst",
    "TenantSurge",
    "Workload",
    "WorkloadSpec",
    "distribution_spec",
    "generate_workload",
    "parse_workload_spec",
    "read_trace",
    "section_traces",
    "workload_from_section",
    "write_trace",
]
