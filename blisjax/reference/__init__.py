"""The reference engine: plain, event-driven Python — the semantic oracle."""

from blisjax.reference.cluster import ClusterSimulator, simulate

__all__ = ["ClusterSimulator", "simulate"]
