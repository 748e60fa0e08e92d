"""The weighted router's scores in the JAX engine equal the reference's to the bit: the
weights are divided by their sum on the host (a division left to XLA with a divisor shared
by the lanes became a multiplication by its reciprocal: 3/5 gave 0.6000000000000001)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from blisjax.config import RoutingConfig, ScorerWeight
from blisjax.config.codes import Scorer
from blisjax.engine import params_from_config, stack_params
from blisjax.engine.policies import lane_spec, prefix_fraction, weighted_scores
from tests.reference.conftest import make_resolved

MAX = len(Scorer)


def test_weights_divide_as_python_does_and_scores_keep_apart():
    rt = RoutingConfig(policy="weighted", scorers=(ScorerWeight("prefix-affinity", 3.0),
                                                   ScorerWeight("queue-depth", 2.0)))
    params = stack_params([params_from_config(make_resolved(routing=rt).config, ("",))] * 64)
    assert list(np.asarray(params.routing.scorer_weight[0, :2])) == [3.0 / 5.0, 2.0 / 5.0]
    # instance 0: 2/3 of its prefix cached, the longest queue; instance 1: no prefix, empty.
    # 2/3·0.6 = 0.39999999999999997 falls just below 1·0.4, where 2/3·(3·(1/5)) would tie it
    scores = np.zeros((64, MAX, 2))
    scores[:, Scorer.PREFIX_AFFINITY] = [2 / 3, 0.0]
    scores[:, Scorer.QUEUE_DEPTH] = [0.0, 1.0]
    run = jax.jit(jax.vmap(lambda sc, p: weighted_scores(sc, lane_spec(p), 2)))
    got = np.asarray(run(jnp.asarray(scores), params))
    want = [2 / 3 * 0.6 + 0.0 * 0.4, 0.0 * 0.6 + 1.0 * 0.4]
    assert want[0] < want[1]
    assert (got == np.asarray(want)).all(), (got[0], want)


def test_prefix_affinity_fractions_divide_as_python_does():
    """matched / full blocks for every instance of every lane, the divisor one scalar per lane
    (what XLA turns into a product by the reciprocal: 5 · (1/12) is one bit below 5/12)."""
    full = np.arange(1, 41)
    matched = np.minimum(np.arange(16)[None, :], full[:, None])  # [lanes, instances]
    run = jax.jit(jax.vmap(prefix_fraction))
    got = np.asarray(run(jnp.asarray(matched, jnp.int32), jnp.asarray(full, jnp.int32)))
    want = np.array([[float(m) / float(f) for m in row] for row, f in zip(matched, full,
                                                                          strict=True)])
    assert (got == want).all()
    assert 5 * (1 / 12) != 5 / 12  # what the test guards against
    assert (np.asarray(run(jnp.zeros((1, 3), jnp.int32), jnp.zeros(1, jnp.int32))) == 0).all()
