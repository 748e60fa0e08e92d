"""Build the latency model a resolved configuration asks for."""

from __future__ import annotations

from blisjax.latency.blackbox import BlackboxLatency
from blisjax.latency.roofline import RooflineLatency


def make_latency_model(resolved):
    """Latency model for a ``blisjax.config.ResolvedConfig``."""
    name = resolved.config.latency.model
    if name == "blackbox":
        alpha, beta = tuple(resolved.alpha), tuple(resolved.beta)
        if len(alpha) != 3 or len(beta) != 3:
            raise ValueError(
                f"latency.alpha_coeffs/beta_coeffs: blackbox needs 3 and 3 values, "
                f"got {len(alpha)} and {len(beta)}"
            )
        return BlackboxLatency(alpha=alpha, beta=beta)
    if name == "roofline":
        if resolved.model_config is None:  # resolve_config always loads the model for roofline
            raise ValueError("model: the roofline latency model needs the model's config.json")
        return RooflineLatency(
            model=resolved.model_config,
            hardware=resolved.hardware_config,
            tp=resolved.config.engine.tensor_parallel_size,
            alpha=tuple(resolved.alpha),
        )
    raise ValueError(
        f"latency.model: {name!r} is not available yet in this build "
        "(supported: blackbox, roofline)"
    )
