"""The reference engine: plain, event-driven Python — the semantic oracle."""

from blisjax.reference.cluster import ClusterSimulator, simulate
from blisjax.reference.code_policy import CodePolicy, CodePolicyError, InstanceInfo, RequestInfo

__all__ = ["ClusterSimulator", "CodePolicy", "CodePolicyError", "InstanceInfo", "RequestInfo",
           "simulate"]
