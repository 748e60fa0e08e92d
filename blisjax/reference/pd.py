"""Prefill/decode disaggregation in the reference engine: pools, deciders, KV transfers and the
parent request's metrics (docs/semantics.md §5.10, Decision 15; BLIS HEAD's P/D).

A disaggregated request (the *parent*) runs as two sub-requests with the parent's index: a
prefill sub-request on a prefill-pool instance (the prompt, no output tokens), then, after its
KV cache is transferred, a decode sub-request on the decode instance chosen when the parent was
routed (the output tokens). ``ClusterSimulator`` drives the events; this module holds what they
compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blisjax.config.codes import PDRole
from blisjax.metrics.records import NOT_RECORDED

Role = PDRole  # what an instance serves (a bit mask, as BLIS's roles)


def pool(roles: list[Role], wanted: Role) -> list[int]:
    """Instances whose role includes ``wanted``, in index order."""
    return [i for i, role in enumerate(roles) if role & wanted]


def disaggregates(decider: str, threshold_tokens: int, input_tokens: int,
                  cached_blocks_on_decode: int, block_size: int) -> bool:
    """The decider: ``never``, ``always``, or ``prefix-threshold`` — the prompt tokens not
    cached on the pre-selected decode instance (its consecutive cached prompt blocks) exceed
    the threshold (strictly); a request without prompt tokens is never disaggregated."""
    if decider == "never":
        return False
    if decider == "always":
        return True
    if input_tokens == 0:
        return False
    return input_tokens - cached_blocks_on_decode * block_size > threshold_tokens


def transfer_duration_us(input_tokens: int, block_size: int, kv_bytes_per_token: float,
                         bandwidth_gbps: float, base_latency_ms: float, active: int) -> int:
    """One KV transfer's duration, µs: ``ceil(base_ms·1000 + bytes / bw)``, at least 1, where
    bytes = ceil(L_in / bs) · (bs · KV bytes per token) and bw = GB/s · 1000 bytes per µs,
    divided by ``active`` (the transfers in flight, this one included) under contention
    (``active`` = 1 otherwise). Float64 in BLIS's order of operations."""
    blocks = -(-input_tokens // block_size)
    size = float(blocks) * (float(block_size) * kv_bytes_per_token)
    bandwidth = bandwidth_gbps * 1000.0
    if active > 1:
        bandwidth = bandwidth / float(active)
    return max(int(math.ceil(base_latency_ms * 1000.0 + size / bandwidth)), 1)


@dataclass
class Parent:
    """A disaggregated request's P/D state (times in µs; ``NOT_RECORDED`` until known)."""

    decode_instance: int
    prefill_instance: int = -1
    prefill_sub: object = None  # SimRequest
    decode_sub: object = None  # SimRequest, from the transfer's start
    transfer_start_us: int = NOT_RECORDED
    transfer_end_us: int = NOT_RECORDED
    dropped_at_decode_kv: bool = False  # the decode instance's KV reservation failed
