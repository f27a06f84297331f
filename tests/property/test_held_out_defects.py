"""The defects found in held-out frameworks (issue 18), restated as small functions with the
same arithmetic, are reported by the checkers the conformance table names."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt
from hypothesis import given

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import reward_batches, rollout_batches, rs_thresholds


def ppo_losses(batch):
    return ref.ppo_clip_token_losses(
        batch["log_probs"], batch["old_log_probs"], batch["advantages"]
    )[0]


def roll_token_mean(batch, *, global_tokens, global_seqs):
    """ROLL's agg_loss('token-mean'): the mean over every position, loss_mask never applied."""
    return ppo_losses(batch).mean()


def roll_seq_mean_token_sum_norm(batch, *, global_tokens, global_seqs):
    """ROLL's seq-mean-token-sum-norm: the token sums divided by the normalizer only."""
    kept = ref.masked_fill_zero(ppo_losses(batch), batch["response_mask"])
    return kept.sum() / batch["response_mask"].shape[-1]


def test_roll_token_mean_without_loss_mask():
    @hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_padding_invariance(roll_token_mean, batch)

    with pytest.raises(AssertionError, match=r"\[padding_invariance"):
        run()


def test_roll_token_mean_without_loss_mask_on_zero_padding():
    # Padding advantages of zero (garbage=False) hide an unmasked mean from a loss of zero
    # advantages; check_zero_advantage writes its own garbage there.
    @hunt
    @given(rollout_batches(garbage=False))
    def run(batch):
        invariants.check_zero_advantage(roll_token_mean, batch)

    with finds("zero_advantage"):
        run()


def test_roll_seq_mean_token_sum_norm_without_the_sequence_count():
    ones = {
        "log_probs": torch.zeros(4, 2, dtype=torch.float64),
        "old_log_probs": torch.zeros(4, 2, dtype=torch.float64),
        "rollout_log_probs": torch.zeros(4, 2, dtype=torch.float64),
        "advantages": -torch.ones(4, 2, dtype=torch.float64),
        "response_mask": torch.ones(4, 2, dtype=torch.bool),
    }
    assert float(roll_seq_mean_token_sum_norm(ones, global_tokens=8, global_seqs=4)) == 4.0
    with finds("ppo_clip.reference_agreement") as caught:
        invariants.check_ppo_clip(
            roll_seq_mean_token_sum_norm, ones, agg_mode="seq-mean-token-sum-norm"
        )
    assert "fn=4, reference=1" in str(caught.value)


def areal_k3_mask(old, rollout, mask, *, criterion, threshold):
    """AReaL's kl_k3 rejection statistic: 1/r - 1 + log r instead of r - log r - 1."""
    (item,) = ref.parse_rs_criteria(criterion, threshold)
    log_r = (old - rollout).clamp(-20, 20)
    stat = torch.exp(-log_r) - 1 + log_r
    return (stat <= item.upper) & as_bool_mask(mask)


def test_areal_k3_rejection_statistic():
    @hunt
    @given(rollout_batches(), rs_thresholds("token_k3"))
    def run(batch, threshold):
        invariants.check_rs_mask(areal_k3_mask, batch, criterion="token_k3", threshold=threshold)

    with finds("rs_mask.reference_agreement"):
        run()


def slime_normalization(rewards, mask, uid, n=4):
    """slime: a batch whose size is not a multiple of n is normalized as one group."""
    scores = rewards.sum(dim=-1)
    size = n if scores.numel() % n == 0 else scores.numel()
    grouped = scores.view(-1, size)
    centered = (grouped - grouped.mean(dim=1, keepdim=True)) / (
        grouped.std(dim=1, keepdim=True) + 1e-6
    )
    return centered.reshape(-1, 1) * as_bool_mask(mask)


def test_slime_partial_group():
    @hunt
    @given(reward_batches(min_batch=5, max_batch=7))
    def run(batch):
        invariants.check_advantages(slime_normalization, batch, estimator="grpo", group_size=4)

    with pytest.raises(
        AssertionError, match=r"\[advantages\.(singleton|group_mean_zero|reference)"
    ):
        run()
