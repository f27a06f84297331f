"""Reference GRPO / Dr.GRPO / RLOO advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_rollout_golden import reference as ref

EPS = 1e-6

# Scores (sum of rewards over valid tokens): group 7 -> [1, 0, 2], group 3 -> [3] (singleton),
# group 5 -> [4, 4]. Rewards at padding positions are garbage and must be ignored.
REWARDS = torch.tensor(
    [
        [0.0, 1.0, 50.0],
        [0.0, 0.0, -9.0],
        [2.0, 33.0, 33.0],
        [1.0, 2.0, 0.0],
        [4.0, 0.0, 0.0],
        [1.5, 2.5, 70.0],
    ],
    dtype=torch.float64,
)
MASK = torch.tensor(
    [
        [1, 1, 0],
        [1, 1, 0],
        [1, 0, 0],
        [1, 1, 1],
        [1, 1, 1],
        [1, 1, 0],
    ]
)
UID = torch.tensor([7, 7, 7, 3, 5, 5])


def per_row(advantages):
    """The constant value on each row's valid tokens, checking padding is exactly zero."""
    valid = MASK.bool()
    assert (advantages[~valid] == 0).all()
    values = []
    for row in range(advantages.shape[0]):
        row_values = advantages[row][valid[row]].unique()
        assert row_values.numel() == 1
        values.append(row_values.item())
    return values


def test_scores_ignore_padding():
    assert ref.sequence_scores(REWARDS, MASK).tolist() == [1.0, 0.0, 2.0, 3.0, 4.0, 4.0]


def test_grpo():
    # Group 7: mean 1, unbiased std sqrt(((0)² + 1² + 1²) / 2) = 1. Singleton: mean 0, std 1.
    # Group 5: std 0 -> (4 - 4) / (0 + ε) = 0.
    expected = [0.0, -1 / (1 + EPS), 1 / (1 + EPS), 3 / (1 + EPS), 0.0, 0.0]
    got = per_row(ref.grpo_advantages(REWARDS, MASK, UID))
    assert got == pytest.approx(expected, rel=1e-14, abs=1e-15)


def test_grpo_unbiased_std():
    rewards = torch.tensor([[1.0], [2.0], [6.0]], dtype=torch.float64)
    mask = torch.ones(3, 1)
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    got = ref.grpo_advantages(rewards, mask, torch.zeros(3, dtype=torch.long))
    assert got[:, 0].tolist() == pytest.approx([(s - 3) / (std + EPS) for s in (1, 2, 6)])


def test_drgrpo_drops_the_std():
    expected = [0.0, -1.0, 1.0, 3.0, 0.0, 0.0]
    assert per_row(ref.drgrpo_advantages(REWARDS, MASK, UID)) == pytest.approx(expected)
    no_std = ref.grpo_advantages(REWARDS, MASK, UID, norm_by_std=False)
    assert per_row(no_std) == pytest.approx(expected)


def test_rloo():
    # Group 7: s - mean(others): 1 - 1, 0 - 1.5, 2 - 0.5. The singleton keeps its score.
    expected = [0.0, -1.5, 1.5, 3.0, 0.0, 0.0]
    assert per_row(ref.rloo_advantages(REWARDS, MASK, UID)) == pytest.approx(expected)


def test_group_stats():
    mean, std, size = ref.group_mean_std(torch.tensor([1.0, 0.0, 2.0, 3.0]), UID[:4])
    assert mean.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert std.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert size.tolist() == [3, 3, 3, 1]
