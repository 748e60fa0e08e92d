"""Cluster event priorities of the reference engine (docs/semantics.md §5.2; P/D §5.10;
lifecycle and autoscaler docs/autoscaling.md): at equal times the lower priority runs first.
Instance events have theirs in ``reference.instance``."""

EV_PROVISIONED, EV_LOADED = -2, -1
EV_CLUSTER_ARRIVAL, EV_ADMISSION, EV_ROUTING = 0, 1, 2
EV_PREFILL_ROUTING, EV_TRANSFER_START, EV_TRANSFER_DONE = 4, 5, 6
EV_GATEWAY_TICK = 7  # BLIS's GatewayDispatchTickEvent (flow control)
EV_SCALING_TICK, EV_SCALE_ACTUATION = 8, 9
