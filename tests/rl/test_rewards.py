"""Proposer rewards (Absolute Zero, R-Zero) and majority-vote pseudo-labels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.verifiers.vote import majority_agreement


def test_proposer_rewards_known_values():
    outcomes = np.array([[0, 0, 0, 0],   # never solved: unlearnable
                         [1, 1, 1, 1],   # always solved: nothing to learn
                         [1, 0, 1, 0],   # r = 1/2
                         [1, 0, 0, 0]])  # r = 1/4
    r, azr, unc, var = proposer_rewards(outcomes)
    np.testing.assert_allclose(r, [0, 1, 0.5, 0.25])
    np.testing.assert_allclose(azr, [0, 0, 0.5, 0.75])
    np.testing.assert_allclose(unc, [0, 0, 1, 0.5])
    np.testing.assert_allclose(var, [0, 0, 0.25, 0.1875])
    np.testing.assert_array_equal(proposer_rewards(outcomes).absolute_zero, azr)  # named fields too


@given(arrays(np.int8, st.tuples(st.integers(1, 6), st.integers(1, 9)),
              elements=st.integers(0, 1)))
def test_proposer_rewards_ranges(outcomes):
    r, azr, unc, var = proposer_rewards(outcomes)
    assert r.shape == azr.shape == unc.shape == var.shape == (outcomes.shape[0],)
    assert np.all((0 <= azr) & (azr < 1)) and np.all((0 <= unc) & (unc <= 1))
    assert np.all(var <= 0.25 + 1e-12)
    np.testing.assert_allclose(unc, 1 - np.abs(2 * r - 1))
    np.testing.assert_array_equal(azr == 0, (r == 0) | (r == 1))


def test_majority_agreement_ties_to_the_smallest_id():
    answers = np.array([[3, 1, 3, 2],
                        [5, 4, 4, 5],    # tie 4 vs 5 -> 4
                        [7, 8, 9, -1],   # all distinct -> -1 (smallest)
                        [2, 2, 2, 2]])
    labels, agreement = majority_agreement(answers)
    np.testing.assert_array_equal(labels, [3, 4, -1, 2])
    np.testing.assert_allclose(agreement, [0.5, 0.5, 0.25, 1.0])


@given(arrays(np.int64, st.tuples(st.integers(1, 5), st.integers(1, 8)),
              elements=st.integers(-3, 3)))
def test_majority_agreement_matches_a_counter(answers):
    labels, agreement = majority_agreement(answers)
    for row, label, p in zip(answers, labels, agreement):
        ids, counts = np.unique(row, return_counts=True)  # ids sorted ascending
        assert label == ids[np.argmax(counts)]
        assert p == pytest.approx(counts.max() / len(row))


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="0 or 1"):
        proposer_rewards([[0, 2]])
    with pytest.raises(ValueError, match="2-D"):
        proposer_rewards([0, 1])
    with pytest.raises(ValueError, match="integers"):
        majority_agreement([[0.5, 1.0]])
    with pytest.raises(ValueError, match="n >= 1"):
        majority_agreement(np.zeros((3, 0), dtype=int))
