"""Physics-normalized latency model, as specified in docs/latency-models.md §P.

queueing delay = ``max(0, trunc(α·F_queue))`` with 11 alpha features, step time =
``max(1, trunc(β·F_step))`` with 16 beta features; every feature is a physics-normalized,
ε-guarded (ε = 1e-6) float64 quantity clamped to [0, 100].

* :mod:`.config` — :class:`VLLMKnobs`, :class:`PhysicsHardwareExtras`, :class:`PhysicsConfig`
  (derived constants).
* :mod:`.inputs` — :class:`PhysicsQueueInputs`, :class:`PhysicsStepInputs` (simulator state),
  :func:`update_preemption_ema`.
* :mod:`.features` — the feature functions, the deterministic ``log1p_int``/``pow_int``, and
  the left-to-right dot products.
* :mod:`.coefficients` — YAML coefficient files with provenance.
* :mod:`.model` — :class:`PhysicsLatency`.
"""

from blisjax.latency.physics.coefficients import (
    SPEC_VERSION,
    PhysicsCoefficients,
    load_physics_coefficients,
    parse_physics_coefficients,
    shipped_physics_coefficients,
)
from blisjax.latency.physics.config import (
    DEFAULT_HARDWARE_EXTRAS,
    PhysicsConfig,
    PhysicsHardwareExtras,
    VLLMKnobs,
    default_hardware_extras,
    mlp_projection_count,
)
from blisjax.latency.physics.features import (
    ALPHA_FEATURE_NAMES,
    BETA_FEATURE_NAMES,
    FEATURE_MAX,
    NUM_ALPHA_FEATURES,
    NUM_BETA_FEATURES,
    alpha_features,
    beta_features,
    clamp_feature,
    congestion_gate,
    dot_left_to_right,
    effective_weight_bytes,
    log1p_int,
    moe_activation,
    pow_int,
    queueing_delay_from_features,
    step_time_from_features,
)
from blisjax.latency.physics.inputs import (
    DEFAULT_PREEMPTION_EMA_GAMMA,
    EPSILON,
    PhysicsQueueInputs,
    PhysicsStepInputs,
    update_preemption_ema,
)
from blisjax.latency.physics.model import PhysicsLatency

__all__ = [
    "ALPHA_FEATURE_NAMES",
    "BETA_FEATURE_NAMES",
    "DEFAULT_HARDWARE_EXTRAS",
    "DEFAULT_PREEMPTION_EMA_GAMMA",
    "EPSILON",
    "FEATURE_MAX",
    "NUM_ALPHA_FEATURES",
    "NUM_BETA_FEATURES",
    "SPEC_VERSION",
    "PhysicsCoefficients",
    "PhysicsConfig",
    "PhysicsHardwareExtras",
    "PhysicsLatency",
    "PhysicsQueueInputs",
    "PhysicsStepInputs",
    "VLLMKnobs",
    "alpha_features",
    "beta_features",
    "clamp_feature",
    "congestion_gate",
    "default_hardware_extras",
    "dot_left_to_right",
    "effective_weight_bytes",
    "load_physics_coefficients",
    "log1p_int",
    "mlp_projection_count",
    "moe_activation",
    "parse_physics_coefficients",
    "pow_int",
    "queueing_delay_from_features",
    "shipped_physics_coefficients",
    "step_time_from_features",
    "update_preemption_ema",
]
