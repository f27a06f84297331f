"""Inputs laid out as frameworks lay them out (issue 18, item 2): garbage in some fields only,
rows without valid tokens, non-tensor batch entries, contiguous groups, the number of
micro-batches told to the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.strategies import reward_batches, rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]

passes = passes_settings(60)


def exp_before_mask_loss(batch, *, global_tokens, global_seqs):
    """PPO written the common way: exp over every position, then multiply by the mask."""
    mask = batch["response_mask"].to(batch["log_probs"].dtype)
    ratio = (batch["log_probs"] - batch["old_log_probs"]).exp()
    adv = batch["advantages"]
    losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    return (losses * mask).sum() / global_tokens


@passes
@given(rollout_batches(dtype=DTYPES, garbage={"advantages"}, extreme_ratios=False))
def test_garbage_in_advantages_only_suits_code_that_exponentiates_before_masking(batch):
    invariants.check_padding_invariance(exp_before_mask_loss, batch)
    invariants.check_split_invariance(exp_before_mask_loss, batch)
    assert not bool(batch["log_probs"][~ref.as_bool_mask(batch["response_mask"])].any())


@passes
@given(rollout_batches(dtype=DTYPES, extreme_ratios=False))
def test_default_padding_suits_code_that_exponentiates_before_masking(batch):
    # Log-probs of a model (≤ 0, finite) in the log-probs' padding, garbage in the advantages'.
    invariants.check_padding_invariance(exp_before_mask_loss, batch)
    invariants.check_split_invariance(exp_before_mask_loss, batch)


def test_extreme_garbage_everywhere_still_flags_it():
    @hunt
    @given(rollout_batches(extreme_ratios=False, garbage="extreme"))
    def run(batch):
        invariants.check_padding_invariance(exp_before_mask_loss, batch)

    with finds("padding_invariance.finite"):
        run()


def test_unknown_garbage_field_is_an_error():
    with pytest.raises(ValueError, match="unknown fields"):
        rollout_batches(garbage={"logprobs"})


# --------------------------------------------------------------------------- advantages


@passes
@given(
    reward_batches(dtype=DTYPES, allow_empty_rows=True, garbage=True),
    st.sampled_from(ref.ESTIMATORS),
)
def test_rows_without_valid_tokens_and_garbage_rewards(batch, estimator):
    def fn(rewards, mask, uid):
        return ref.outcome_advantages(rewards, mask, uid, estimator=estimator)

    invariants.check_advantages(fn, batch, estimator=estimator)


@passes
@given(reward_batches(dtype=DTYPES, allow_empty_rows=True))
def test_string_labels_and_plain_entries(batch):
    batch = dict(batch)
    batch["uid"] = np.array([f"prompt-{int(u)}" for u in batch["uid"]], dtype=object)
    batch["num_generations"] = 4
    batch["tag"] = "step-3"
    seen = []

    def fn(rewards, mask, uid):
        seen.append(type(uid))
        index = invariants.advantages.group_index(uid)
        return ref.grpo_advantages(rewards, mask, index)

    invariants.check_advantages(fn, batch, estimator="grpo")
    assert set(seen) == {np.ndarray}


def view_grpo(n):
    """TRL's layout: groups are contiguous blocks, ``rewards.view(-1, n)``."""

    def fn(rewards, mask, uid):
        scores = rewards.sum(dim=-1).view(-1, n)
        mean = scores.mean(dim=1, keepdim=True)
        std = scores.std(dim=1, keepdim=True)
        return ((scores - mean) / (std + 1e-6)).reshape(-1, 1) * ref.as_bool_mask(mask)

    return fn


@passes
@given(st.integers(2, 4).flatmap(lambda n: st.tuples(st.just(n), reward_batches(group_size=n))))
def test_contiguous_groups(case):
    n, batch = case
    invariants.check_advantages(view_grpo(n), dict(batch), estimator="grpo", group_size=n)


def test_finds_a_partial_last_block_merged_into_one_group():
    # slime's normalization: a batch whose size is not a multiple of n becomes one group.
    def fn(rewards, mask, uid):
        scores = rewards.sum(dim=-1)
        n = 2 if scores.numel() % 2 == 0 else scores.numel()
        grouped = scores.view(-1, n)
        centered = grouped - grouped.mean(dim=1, keepdim=True)
        return centered.reshape(-1, 1) * ref.as_bool_mask(mask)

    @hunt
    @given(reward_batches(min_batch=3, max_batch=7))
    def run(batch):
        batch = {k: v for k, v in batch.items() if k != "uid"}
        invariants.check_advantages(fn, batch, estimator="grpo_no_std", group_size=2)

    with pytest.raises(AssertionError, match=r"\[advantages\.(singleton|group_mean|reference)"):
        run()


# --------------------------------------------------------------------------- micro-batches


def per_micro_batch_mean(batch, *, global_tokens, global_seqs, n_micro_batches=1):
    """A design that normalizes per micro-batch on purpose (TRL's grpo/bnpo)."""
    losses, _, _ = ref.ppo_clip_token_losses(
        batch["log_probs"], batch["old_log_probs"], batch["advantages"]
    )
    return ref.aggregate_loss(losses, batch["response_mask"], "token-mean") / n_micro_batches


def test_the_loss_is_told_the_number_of_micro_batches():
    uniform = {
        "old_log_probs": torch.full((4, 3), -1.0, dtype=torch.float64),
        "rollout_log_probs": torch.full((4, 3), -1.0, dtype=torch.float64),
        "log_probs": torch.tensor([[-1.0, -0.5, -2.0]] * 4, dtype=torch.float64),
        "advantages": torch.tensor([[1.0], [-1.0], [0.5], [2.0]]).expand(4, 3).double(),
        "response_mask": torch.ones(4, 3, dtype=torch.bool),
    }
    # Equal token counts in every piece: the per-micro-batch mean keeps its promise.
    invariants.check_split_invariance(per_micro_batch_mean, uniform, n_splits=2)
    ragged = dict(uniform, response_mask=torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]]))
    with finds("split_invariance"):
        invariants.check_split_invariance(per_micro_batch_mean, ragged, n_splits=2)


@passes
@given(rollout_batches(group_size=3, max_batch=9))
def test_rollout_batches_in_contiguous_groups(batch):
    size = batch["uid"].shape[0]
    assert size % 3 == 0
    assert batch["uid"].tolist() == [row // 3 for row in range(size)]


def test_group_size_without_a_multiple_in_bounds_is_an_error():
    with pytest.raises(ValueError, match="no multiple of group_size=4"):
        rollout_batches(group_size=4, min_batch=5, max_batch=7)
