"""OpenAI-ES (Salimans et al., 2017): antithetic Gaussian perturbations, centered-rank fitness
shaping, and an optax optimizer stepping the mean along the estimated gradient.

For population size P (even), half the noise vectors are drawn and mirrored:
``x = mean ± sigma·eps``. Fitness is replaced by centered ranks in [−0.5, 0.5] (ties share
their average rank), the gradient estimate of E[f] is ``g = Σ s_i·eps_i / (P·sigma)``, and the
optimizer (default Adam) is applied to ``−g`` (optax minimises), so the mean ascends fitness.
``sigma`` decays geometrically by ``sigma_decay`` per generation down to ``sigma_min``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import optax

from search.strategies.base import PyTreeCodec, key_words, rng_for, sanitize_fitness

__all__ = ["OpenES", "OpenESState", "centered_ranks"]


class OpenESState(NamedTuple):
    """mean: float64[d]; sigma: float64[]; opt_state: the optax state pytree;
    generation: int64[]; key: uint32[k]."""

    mean: np.ndarray
    sigma: np.ndarray
    opt_state: Any
    generation: np.ndarray
    key: np.ndarray


def centered_ranks(fitness: np.ndarray) -> np.ndarray:
    """Ranks of ``fitness`` scaled to [−0.5, 0.5] (lowest → −0.5); ties get their mean rank."""
    f = np.asarray(fitness, np.float64)
    n = f.size
    if n == 1:
        return np.zeros(1)
    order = np.argsort(f, kind="stable")
    ranks = np.empty(n, np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    for value in np.unique(f):
        tie = f == value
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks / (n - 1) - 0.5


class OpenES:
    """OpenAI-ES over a solution pytree.

    Args:
      template: solution pytree; its values are the initial mean.
      population_size: P, even and >= 2 (antithetic pairs).
      sigma: perturbation scale (0.1 suits the unit cube).
      optimizer: an optax GradientTransformation (default ``optax.adam(learning_rate)``).
      learning_rate: used when ``optimizer`` is None.
      sigma_decay, sigma_min: ``sigma ← max(sigma_min, sigma·sigma_decay)`` each generation.
    """

    multi_objective = False

    def __init__(self, template: Any, population_size: int, sigma: float = 0.1,
                 optimizer: optax.GradientTransformation | None = None,
                 learning_rate: float = 0.05, sigma_decay: float = 1.0,
                 sigma_min: float = 0.0) -> None:
        if population_size < 2 or population_size % 2:
            raise ValueError(f"OpenAI-ES needs an even population_size >= 2 (antithetic "
                             f"pairs), got {population_size}")
        if not sigma > 0:
            raise ValueError(f"OpenAI-ES needs sigma > 0, got {sigma}")
        self.codec = PyTreeCodec(template)
        self.population_size = int(population_size)
        self.sigma0 = float(sigma)
        self.optimizer = optimizer if optimizer is not None else optax.adam(learning_rate)
        self.sigma_decay = float(sigma_decay)
        self.sigma_min = float(sigma_min)

    def init(self, key: Any) -> OpenESState:
        mean = self.codec.center.copy()
        opt_state = self.optimizer.init(mean)
        return OpenESState(mean=mean, sigma=np.asarray(self.sigma0), opt_state=opt_state,
                           generation=np.asarray(0, np.int64), key=key_words(key))

    def ask(self, state: OpenESState) -> tuple[Any, OpenESState]:
        """``[mean + sigma·eps; mean − sigma·eps]`` with P/2 noise vectors eps ~ N(0, I)."""
        rng = rng_for(state.key, int(state.generation), 0)
        eps = rng.standard_normal((self.population_size // 2, self.codec.dim))
        noise = np.concatenate([eps, -eps], axis=0)
        return self.codec.unravel(state.mean + float(state.sigma) * noise), state

    def tell(self, state: OpenESState, population: Any, fitness: Any) -> OpenESState:
        """One optimizer step along the centered-rank gradient estimate."""
        f = sanitize_fitness(fitness, self.population_size)
        sigma = float(state.sigma)
        noise = (self.codec.ravel(population) - state.mean) / sigma
        shaped = centered_ranks(f)
        grad = shaped @ noise / (self.population_size * sigma)
        updates, opt_state = self.optimizer.update(-grad, state.opt_state, state.mean)
        mean = np.asarray(optax.apply_updates(state.mean, updates), np.float64)
        sigma_new = max(self.sigma_min, sigma * self.sigma_decay)
        return OpenESState(mean=mean, sigma=np.asarray(sigma_new), opt_state=opt_state,
                           generation=np.asarray(int(state.generation) + 1, np.int64),
                           key=state.key)

    def mean(self, state: OpenESState) -> Any:
        """The current mean as a solution pytree."""
        return self.codec.unravel(state.mean[None, :])
