"""CMA-ES (Hansen's standard formulation, "The CMA Evolution Strategy: A Tutorial", 2016).

Positive recombination weights over the best ``mu = floor(lambda/2)`` candidates, cumulative
step-size adaptation (CSA), rank-one plus rank-mu covariance update, the h_sigma stall of the
rank-one path, and the tutorial's default learning rates. Implemented in numpy float64; the
eigendecomposition is recomputed every generation (search spaces are small).

Maximises fitness (it sorts candidates by descending fitness; NaN counts as −inf).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from search.strategies.base import PyTreeCodec, key_words, rng_for, sanitize_fitness

__all__ = ["CMAES", "CMAState"]


class CMAState(NamedTuple):
    """CMA-ES state (d = number of coordinates).

    mean: float64[d] distribution mean; sigma: float64[] step size; cov: float64[d, d] C;
    basis: float64[d, d] eigenvectors B of C; scales: float64[d] sqrt(eigenvalues) D;
    path_sigma, path_c: float64[d] evolution paths; generation: int64[]; key: uint32[k].
    """

    mean: np.ndarray
    sigma: np.ndarray
    cov: np.ndarray
    basis: np.ndarray
    scales: np.ndarray
    path_sigma: np.ndarray
    path_c: np.ndarray
    generation: np.ndarray
    key: np.ndarray


class CMAES:
    """CMA-ES over a solution pytree.

    Args:
      template: solution pytree; its values are the initial mean.
      population_size: lambda >= 2.
      sigma: initial step size (in the template's units; 0.3 suits the unit cube).
    """

    multi_objective = False

    def __init__(self, template: Any, population_size: int, sigma: float = 0.3) -> None:
        if population_size < 2:
            raise ValueError(f"CMA-ES needs population_size >= 2, got {population_size}")
        if not sigma > 0:
            raise ValueError(f"CMA-ES needs sigma > 0, got {sigma}")
        self.codec = PyTreeCodec(template)
        self.population_size = int(population_size)
        self.sigma0 = float(sigma)
        n, lam = self.codec.dim, self.population_size
        self.mu = lam // 2
        w = math.log((lam + 1) / 2) - np.log(np.arange(1, self.mu + 1))
        self.weights = w / w.sum()
        self.mu_eff = 1.0 / float(np.sum(self.weights ** 2))
        me = self.mu_eff
        self.c_sigma = (me + 2) / (n + me + 5)
        self.d_sigma = 1 + 2 * max(0.0, math.sqrt((me - 1) / (n + 1)) - 1) + self.c_sigma
        self.c_c = (4 + me / n) / (n + 4 + 2 * me / n)
        self.c_1 = 2 / ((n + 1.3) ** 2 + me)
        self.c_mu = min(1 - self.c_1, 2 * (me - 2 + 1 / me) / ((n + 2) ** 2 + me))
        self.chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))

    def init(self, key: Any) -> CMAState:
        """Initial state: mean = template, C = I, zero paths."""
        n = self.codec.dim
        return CMAState(mean=self.codec.center.copy(), sigma=np.asarray(self.sigma0),
                        cov=np.eye(n), basis=np.eye(n), scales=np.ones(n),
                        path_sigma=np.zeros(n), path_c=np.zeros(n),
                        generation=np.asarray(0, np.int64), key=key_words(key))

    def ask(self, state: CMAState) -> tuple[Any, CMAState]:
        """lambda samples ``mean + sigma·B·D·z``, z ~ N(0, I)."""
        rng = rng_for(state.key, int(state.generation), 0)
        z = rng.standard_normal((self.population_size, self.codec.dim))
        y = (z * state.scales) @ state.basis.T
        return self.codec.unravel(state.mean + float(state.sigma) * y), state

    def tell(self, state: CMAState, population: Any, fitness: Any) -> CMAState:
        """Update mean, paths, step size and covariance from the evaluated population."""
        f = sanitize_fitness(fitness, self.population_size)
        x = self.codec.ravel(population)
        n, sigma = self.codec.dim, float(state.sigma)
        order = np.argsort(-f, kind="stable")[: self.mu]
        y = (x[order] - state.mean) / sigma
        y_w = self.weights @ y
        mean = state.mean + sigma * y_w
        inv_sqrt_c = (state.basis / state.scales) @ state.basis.T
        ps = (1 - self.c_sigma) * state.path_sigma \
            + math.sqrt(self.c_sigma * (2 - self.c_sigma) * self.mu_eff) * (inv_sqrt_c @ y_w)
        g = int(state.generation) + 1
        norm_ps = float(np.linalg.norm(ps))
        h_sigma = norm_ps / math.sqrt(1 - (1 - self.c_sigma) ** (2 * g)) \
            < (1.4 + 2 / (n + 1)) * self.chi_n
        pc = (1 - self.c_c) * state.path_c \
            + (math.sqrt(self.c_c * (2 - self.c_c) * self.mu_eff) * y_w if h_sigma else 0.0)
        delta = (1 - h_sigma) * self.c_c * (2 - self.c_c)
        rank_mu = (y.T * self.weights) @ y
        cov = (1 + self.c_1 * delta - self.c_1 - self.c_mu) * state.cov \
            + self.c_1 * np.outer(pc, pc) + self.c_mu * rank_mu
        cov = (cov + cov.T) / 2
        sigma_new = sigma * math.exp((self.c_sigma / self.d_sigma) * (norm_ps / self.chi_n - 1))
        eigval, basis = np.linalg.eigh(cov)
        scales = np.sqrt(np.maximum(eigval, 1e-300))
        return CMAState(mean=mean, sigma=np.asarray(sigma_new), cov=cov, basis=basis,
                        scales=scales, path_sigma=ps, path_c=np.asarray(pc, np.float64),
                        generation=np.asarray(g, np.int64), key=state.key)

    def mean(self, state: CMAState) -> Any:
        """The distribution mean as a solution pytree."""
        return self.codec.unravel(state.mean[None, :])
