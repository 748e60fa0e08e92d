"""Build the latency model a resolved configuration asks for."""

from __future__ import annotations

import dataclasses

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
    if name == "physics":
        return _physics(resolved)
    raise ValueError(f"latency.model: {name!r} is unknown (blackbox, roofline, physics)")


def _physics(resolved):
    """Physics-normalized model: coefficients from a file, inline (11 α + 16 β), or the shipped
    illustrative placeholder; γ from the coefficients unless the config overrides it."""
    from blisjax.latency.physics import (
        PhysicsCoefficients,
        PhysicsLatency,
        VLLMKnobs,
        load_physics_coefficients,
        shipped_physics_coefficients,
    )

    cfg = resolved.config
    lat = cfg.latency
    if resolved.model_config is None:
        raise ValueError("model: the physics latency model needs the model's config.json")
    if lat.coefficients_file:
        coeffs = load_physics_coefficients(lat.coefficients_file)
    elif resolved.alpha or resolved.beta:
        coeffs = PhysicsCoefficients(
            alpha=tuple(resolved.alpha), beta=tuple(resolved.beta), model=cfg.model,
            hardware=cfg.hardware, tp=cfg.engine.tensor_parallel_size, status="illustrative",
            source="inline latency.alpha_coeffs/beta_coeffs")
    else:
        coeffs = shipped_physics_coefficients()["illustrative-placeholder.yaml"]
    if lat.preemption_ema_gamma is not None:
        coeffs = dataclasses.replace(coeffs, gamma=lat.preemption_ema_gamma)
    # a CPU tier feeds α feature 10 (its capacity); β features 13 and 14 stay 0: the tier
    # charges its reloads' transfer time to the step itself (docs/latency-models.md §P.2)
    cpu_blocks = cfg.engine.kv_cpu_blocks
    knobs = VLLMKnobs.from_engine(cfg.engine, resolved.total_kv_blocks,
                                  cpu_offloading=cpu_blocks > 0, total_kv_blocks_cpu=cpu_blocks)
    return PhysicsLatency.build(resolved.model_config, resolved.hardware_config,
                                cfg.engine.tensor_parallel_size, knobs, coeffs)
