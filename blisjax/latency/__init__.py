"""Latency models: queueing delay and step time as pure functions of batch quantities."""

from blisjax.latency.base import LatencyModel, StepBatch, float_to_ticks
from blisjax.latency.blackbox import BlackboxLatency
from blisjax.latency.factory import make_latency_model

__all__ = ["LatencyModel", "StepBatch", "float_to_ticks", "BlackboxLatency", "make_latency_model"]
