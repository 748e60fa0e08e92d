"""Latency models: queueing delay and step time as pure functions of batch quantities."""

from blisjax.latency.base import LatencyModel, StepBatch, float_to_ticks
from blisjax.latency.blackbox import BlackboxLatency
from blisjax.latency.factory import make_latency_model
from blisjax.latency.roofline import RooflineLatency

__all__ = [
    "LatencyModel",
    "StepBatch",
    "float_to_ticks",
    "BlackboxLatency",
    "RooflineLatency",
    "make_latency_model",
]
