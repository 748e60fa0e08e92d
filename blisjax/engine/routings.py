"""The cluster's routings in order: the k-th routing's request and time (one definition for the
routing events, the next-event selection and the P/D prefill routings that follow them).

Counterpart: the order in which ``blisjax.reference.cluster.ClusterSimulator`` pops its
routing events. Routings follow admissions (arrival + admission latency + routing latency),
which follow arrivals: row order, or with closed-loop sessions the admission order
(``SessionState.order``, follow-ups merged in); with the gateway queue they follow the
dispatches (``GatewayState.order`` and ``route_us``).
"""

from __future__ import annotations

import jax.numpy as jnp

from blisjax.engine.static import setting
from blisjax.limits import INT64_MAX


def routed_row(s, st, k):
    """The request of the k-th routing (k <= N; N: none yet)."""
    k = jnp.minimum(k, st.shapes.num_requests)
    if st.features.gateway:
        return s.gw.order[k]
    return s.sess.order[k] if st.features.sessions else k


def routing_us(s, st, c, k):
    """Time of the k-th routing, once its request was admitted (dispatched with the gateway
    queue); meaningless before."""
    if st.features.gateway:
        return s.gw.route_us[jnp.minimum(k, st.shapes.num_requests)]
    arrival = s.sess.arrival_us if st.features.sessions else c.arrival_us
    return (arrival[routed_row(s, st, k)] + setting(st, c, "admission_latency_us")
            + setting(st, c, "routing_latency_us"))


def next_routing_us(s, st, c):
    """Time of the next routing (``cursors.route``), INT64_MAX while its request is not
    admitted (dispatched) yet."""
    k = s.cursors.route
    ready = k < (s.gw.dispatched if st.features.gateway else s.cursors.admit)
    return jnp.where(ready, routing_us(s, st, c, k), INT64_MAX)
