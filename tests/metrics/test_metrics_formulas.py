"""The small formula functions, checked against hand values and brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blisjax.metrics.formulas import (
    jain_fairness,
    latency_score,
    priority_inversion_count,
    request_tpot_us,
    throughput_per_s,
    throughput_score,
)


def test_request_tpot():
    tpot = request_tpot_us(
        itl_sum_us=[400, 400, 70, 0, 90],
        itl_count=[4, 3, 1, 0, 3],
        output_tokens=[5, 5, 2, 0, 10],
        length_capped=[False, True, False, False, True],
    )
    # 400/(5-1); capped: 400/max(3-1,1); 70/max(1,1); N_out=0 → 0; capped 90/(3-1)
    np.testing.assert_array_equal(tpot, [100.0, 200.0, 70.0, 0.0, 45.0])


def test_jain_edge_cases():
    assert jain_fairness([]) == 0.0
    assert jain_fairness([0, 0]) == 1.0
    assert jain_fairness([5]) == 1.0
    assert jain_fairness([1, 0, 0]) == pytest.approx(1 / 3, rel=1e-15)
    assert jain_fairness([1, 2, 3]) == pytest.approx(6 / 7, rel=1e-15)


def test_normalisations():
    assert latency_score(50_000) == 1 / 51
    assert latency_score(0) == 1.0
    assert throughput_score(100.0, 100.0) == 0.5
    assert throughput_per_s(5, 0, 5) == 0.0  # no elapsed time
    assert throughput_per_s(5, 1_000_000, 0) == 0.0  # nothing completed
    assert throughput_per_s(300, 31_667_365, 300) == 300 / 31.667365


def _brute_inversions(arrival, e2e, group):
    count = 0
    for g in set(group):
        idx = sorted((i for i in range(len(group)) if group[i] == g), key=lambda i: (arrival[i], i))
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                if e2e[idx[a]] > 2 * e2e[idx[b]]:
                    count += 1
    return count


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20), st.integers(0, 1000), st.integers(0, 2)
        ),  # (arrival, e2e, group)
        max_size=40,
    )
)
@settings(max_examples=200, deadline=None)
def test_priority_inversions_match_brute_force(rows):
    arrival = [r[0] for r in rows]
    e2e = [r[1] for r in rows]
    group = [r[2] for r in rows]
    assert priority_inversion_count(arrival, e2e, group) == _brute_inversions(arrival, e2e, group)


@pytest.mark.parametrize(("progress", "l_in", "n_out", "finished"), [
    # docs/semantics.md §2.7: complete when PI >= L_in + max(N_out, 1) - 1
    (10, 10, 0, True), (9, 10, 0, False),  # N_out = 0: after the prompt's last token
    (10, 10, 1, True), (9, 10, 1, False),  # N_out = 1: in the prefill-finishing step
    (14, 10, 5, True), (13, 10, 5, False),  # N_out = 5: after 4 decode steps
])
def test_output_finished(progress, l_in, n_out, finished):
    from blisjax.metrics.records import output_finished

    assert bool(output_finished(progress, l_in, n_out)) is finished
    assert output_finished(np.array([progress]), np.array([l_in]), np.array([n_out]))[0] == finished


@pytest.mark.parametrize(("progress", "cap", "capped"), [
    (119, 120, True), (118, 120, False), (10_000, 0, False)])  # cap 0: no limit
def test_at_length_cap(progress, cap, capped):
    from blisjax.metrics.records import at_length_cap

    assert bool(at_length_cap(progress, cap)) is capped
