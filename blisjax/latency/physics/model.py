"""``PhysicsLatency``: the physics-normalized latency model as the engines call it."""

from __future__ import annotations

from dataclasses import dataclass

from blisjax.config._checks import ConfigError
from blisjax.config.hardware import HardwareConfig
from blisjax.config.model import ModelConfig
from blisjax.latency.base import StepBatch
from blisjax.latency.physics.coefficients import PhysicsCoefficients
from blisjax.latency.physics.config import PhysicsConfig, PhysicsHardwareExtras, VLLMKnobs
from blisjax.latency.physics.features import (
    alpha_features,
    beta_features,
    queueing_delay_from_features,
    step_time_from_features,
)
from blisjax.latency.physics.inputs import (
    PhysicsQueueInputs,
    PhysicsStepInputs,
    update_preemption_ema,
)


@dataclass(frozen=True)
class PhysicsLatency:
    """Queueing delay ``max(0, trunc(α·F_queue))`` and step time ``max(1, trunc(β·F_step))``.

    Stateless: the engine owns the preemption EMA (:meth:`update_preemption_ema`) and passes
    it in the inputs. The model has no metric-only terms (docs/latency-models.md §P.1), so
    ``output_token_processing_us`` and ``post_decode_overhead_us`` are 0.
    """

    config: PhysicsConfig
    coefficients: PhysicsCoefficients

    @classmethod
    def build(
        cls,
        model: ModelConfig,
        hardware: HardwareConfig,
        tp: int,
        knobs: VLLMKnobs,
        coefficients: PhysicsCoefficients,
        extras: PhysicsHardwareExtras | None = None,
    ) -> PhysicsLatency:
        """Derive the :class:`PhysicsConfig` and attach a validated coefficient set."""
        if not isinstance(coefficients, PhysicsCoefficients):
            raise ConfigError(
                "latency.coefficients",
                f"must be PhysicsCoefficients, got {type(coefficients).__name__}",
            )
        return cls(PhysicsConfig.build(model, hardware, tp, knobs, extras), coefficients)

    @property
    def gamma(self) -> float:
        """Preemption-EMA decay the coefficients were trained with."""
        return self.coefficients.gamma

    def alpha_features(self, inputs: PhysicsQueueInputs) -> tuple[float, ...]:
        """The 11 clamped alpha features."""
        return alpha_features(self.config, inputs)

    def beta_features(self, inputs: PhysicsStepInputs) -> tuple[float, ...]:
        """The 16 clamped beta features."""
        return beta_features(self.config, inputs)

    def queueing_delay_us(self, inputs: PhysicsQueueInputs) -> int:
        """Delay between arrival at the instance and enqueue, µs, >= 0."""
        return queueing_delay_from_features(
            self.coefficients.alpha, alpha_features(self.config, inputs)
        )

    def step_time_us(self, inputs: PhysicsStepInputs) -> int:
        """Duration of one step, µs, >= 1."""
        return step_time_from_features(self.coefficients.beta, beta_features(self.config, inputs))

    def step_inputs(
        self,
        batch: StepBatch,
        preemption_ema: float,
        *,
        prefix_cached_tokens=None,
        kv_blocks=None,
        transfer_blocks: int = 0,
        cpu_resident_read_blocks: int = 0,
    ) -> PhysicsStepInputs:
        """:meth:`PhysicsStepInputs.from_batch` with this model's block size."""
        return PhysicsStepInputs.from_batch(
            batch,
            block_size_tokens=self.config.block_size_tokens,
            preemption_ema=preemption_ema,
            prefix_cached_tokens=prefix_cached_tokens,
            kv_blocks=kv_blocks,
            transfer_blocks=transfer_blocks,
            cpu_resident_read_blocks=cpu_resident_read_blocks,
        )

    def update_preemption_ema(
        self, previous: float, num_preempted: int, running_depth: int
    ) -> float:
        """One EMA step with this model's γ (see :func:`update_preemption_ema`)."""
        return update_preemption_ema(previous, num_preempted, running_depth, self.gamma)

    @property
    def output_token_processing_us(self) -> int:
        return 0

    @property
    def post_decode_overhead_us(self) -> int:
        return 0
