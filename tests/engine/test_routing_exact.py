"""The weighted router's scores in the JAX engine equal the reference's to the bit, with
weights shared by every lane (a traced divisor XLA would turn into a reciprocal)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.config.codes import RoutingPolicy, Scorer
from blisjax.engine.policies import RouteSpec, weighted_scores
from blisjax.reference.policies import normalized_weights

MAX = len(Scorer)


def _spec(weights):
    order = np.full(MAX, -1, np.int32)
    order[:2] = [Scorer.PREFIX_AFFINITY, Scorer.QUEUE_DEPTH]
    w = np.zeros(MAX)
    w[:2] = weights
    return RouteSpec(jnp.asarray(RoutingPolicy.WEIGHTED, jnp.int32), jnp.asarray(order),
                     jnp.asarray(w), jnp.asarray(True), None)


def test_weights_shared_by_lanes_divide_as_python_does():
    # 3/5 = 0.6 but 3·(1/5) = 0.6000000000000001: with the reciprocal, 2/3·0.6 (instance 0)
    # would tie 1·0.4 (instance 1) instead of falling just below it
    lanes = 64
    scores = np.zeros((lanes, MAX, 2))
    scores[:, Scorer.PREFIX_AFFINITY] = [2 / 3, 0.0]
    scores[:, Scorer.QUEUE_DEPTH] = [0.0, 1.0]
    run = jax.jit(jax.vmap(lambda sc, spec: weighted_scores(sc, spec, 2), in_axes=(0, None)))
    got = np.asarray(run(jnp.asarray(scores), _spec((3.0, 2.0))))
    w = normalized_weights([3.0, 2.0])
    want = [2 / 3 * w[0] + 0.0 * w[1], 0.0 * w[0] + 1.0 * w[1]]
    assert want[0] < want[1]
    assert (got == np.asarray(want)).all(), (got[0], want)
