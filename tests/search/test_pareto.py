"""Non-dominated sorting, crowding distance, NSGA-II order and Pareto fronts on hand-computed
cases (all objectives maximised)."""

from __future__ import annotations

import math

import numpy as np

from search.pareto import (
    crowding_distance,
    dominates,
    non_dominated_sort,
    nsga2_order,
    pareto_front,
    scalarize,
)

# P3 = P6 (a duplicate); P3 is dominated by P0 and P1; P4 by P1 and P2; P5 by everything.
POINTS = [(1, 5), (2, 4), (4, 1), (1, 4), (2, 1), (0, 0), (1, 4)]


def test_dominates():
    assert dominates((2, 4), (1, 4))
    assert not dominates((1, 4), (1, 4))  # equal: no
    assert not dominates((1, 5), (2, 4))  # trade-off: no
    assert dominates((0, 0, 1), (0, 0, 0))


def test_non_dominated_sort_hand_ranks():
    assert non_dominated_sort(POINTS).tolist() == [0, 0, 0, 1, 1, 2, 1]
    assert non_dominated_sort([(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 0)]).tolist() == \
        [0, 0, 0, 1]
    # a chain: each dominates the next
    assert non_dominated_sort([(3, 3), (2, 2), (1, 1)]).tolist() == [0, 1, 2]
    # NaN counts as -inf
    assert non_dominated_sort([(1, float("nan")), (1, 0)]).tolist() == [1, 0]


def test_crowding_distance_hand_values():
    # front of three: ends inf; middle (4-1)/3 + (5-1)/4 = 2
    d = crowding_distance([(1, 5), (2, 4), (4, 1)])
    assert math.isinf(d[0]) and math.isinf(d[2]) and d[1] == 2.0
    # four points: Q1 = 4/10 + 6/10 = 1.0, Q2 = 9/10 + 8/10 = 1.7
    d = crowding_distance([(0, 10), (1, 8), (4, 4), (10, 0)])
    assert math.isinf(d[0]) and math.isinf(d[3])
    assert np.allclose(d[1:3], [1.0, 1.7])
    assert np.all(np.isinf(crowding_distance([(1, 2), (2, 1)])))
    # a constant objective contributes nothing
    d = crowding_distance([(0, 7), (1, 7), (3, 7)])
    assert d[1] == 1.0  # (3 - 0) / 3 from the first objective only


def test_nsga2_order_and_scalarize():
    # front 0: P0, P2 (inf) before P1 (2); front 1: all inf -> index order; then P5
    assert nsga2_order(POINTS).tolist() == [0, 2, 1, 3, 4, 6, 5]
    s = scalarize(POINTS)
    assert list(np.argsort(-s, kind="stable")) == [0, 2, 1, 3, 4, 6, 5]
    assert s[0] == 1.0 and s[1] == 2.0 / 3.0 and s[5] == -1.0


def test_pareto_front_indices():
    assert pareto_front(POINTS).tolist() == [0, 1, 2]
    assert pareto_front(np.zeros((0, 2))).tolist() == []
    assert pareto_front([(1.0,), (3.0,), (2.0,)]).tolist() == [1]  # one objective: the max
