"""check_advantages passes the reference and catches deliberately broken estimators."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import reward_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]

passes = passes_settings(80)


def reference(estimator, epsilon=1e-6):
    def fn(rewards, mask, uid):
        return ref.outcome_advantages(rewards, mask, uid, estimator=estimator, epsilon=epsilon)

    return fn


def scores_of(rewards):
    return rewards.sum(dim=-1)  # rewards are zero on padding


def broadcast(per_row, mask):
    return per_row.unsqueeze(-1) * mask


def float32_group_mean_grpo(rewards, mask, uid):
    """Group statistics in float32 whatever the input (verl's vectorized GRPO does this)."""
    scores = scores_of(rewards)
    mean, std, _ = ref.group_mean_std(scores.float(), uid)
    return broadcast((scores - mean) / (std + 1e-6), mask)


def loop_rloo(rewards, mask, uid):
    """Leave-one-out baseline; a singleton keeps its score."""
    scores = scores_of(rewards)
    out = scores.clone()
    for i in range(len(scores)):
        group = uid == uid[i]
        n = int(group.sum())
        if n > 1:
            out[i] = (n * scores[i] - scores[group].sum()) / (n - 1)
    return broadcast(out, mask)


def vectorized_rloo_zero_singletons(rewards, mask, uid):
    """Same formula, but a singleton gets 0 (verl's vectorized RLOO does this)."""
    scores = scores_of(rewards)
    _, inverse, counts = torch.unique(uid, return_inverse=True, return_counts=True)
    n = counts[inverse].to(scores.dtype)
    totals = torch.zeros(len(counts), dtype=scores.dtype).index_add(0, inverse, scores)[inverse]
    return broadcast((n * scores - totals) / (n - 1).clamp(min=1) * (n > 1), mask)


def guarded_grpo(rewards, mask, uid):
    """GRPO whose std carries a 1e-8 guard instead of 1e-6, and float32 counts: correct."""
    scores = scores_of(rewards)
    mean, std, _ = ref.group_mean_std(scores, uid)
    return broadcast((scores - mean) / (std + 1e-8), mask)


# --------------------------------------------------------------------------- correct code passes


@passes
@given(reward_batches(dtype=DTYPES), st.sampled_from(ref.ESTIMATORS))
def test_reference_passes(batch, estimator):
    invariants.check_advantages(reference(estimator), batch, estimator=estimator)


@passes
@given(reward_batches(dtype=DTYPES))
def test_correct_variants_pass(batch):
    invariants.check_advantages(loop_rloo, batch, estimator="rloo", variant=reference("rloo"))
    invariants.check_advantages(guarded_grpo, batch, estimator="grpo")


def test_unknown_estimator_is_an_error():
    with pytest.raises(ValueError, match="estimator must be one of"):
        invariants.check_advantages(reference("grpo"), {}, estimator="ppo")


# --------------------------------------------------------------------------- broken code is caught


def test_finds_float32_group_mean_with_the_minimal_example():
    batch = {
        "token_level_rewards": torch.tensor([[0.1], [0.1], [0.1]], dtype=torch.float64),
        "response_mask": torch.ones(3, 1, dtype=torch.bool),
        "uid": torch.tensor([0, 0, 0]),
    }
    with finds("advantages.precision") as caught:
        invariants.check_advantages(float32_group_mean_grpo, batch, estimator="grpo")
    assert "fn=-0.00149" in str(caught.value)


def test_finds_float32_group_mean():
    @hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(float32_group_mean_grpo, batch, estimator="grpo")

    with finds("advantages.precision"):
        run()


def test_float32_group_mean_is_right_for_float32_input():
    @passes
    @given(reward_batches(dtype=torch.float32))
    def run(batch):
        invariants.check_advantages(float32_group_mean_grpo, batch, estimator="grpo")

    run()


def test_finds_rloo_singleton_set_to_zero():
    @hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(vectorized_rloo_zero_singletons, batch, estimator="rloo")

    with finds("advantages.singleton"):
        run()


def test_finds_singleton_inconsistency_between_variants():
    # Checked against each other only (as if the user's convention were "singleton -> 0"
    # for one of them): the variant check still sees the disagreement.
    @hunt
    @given(reward_batches())
    def run(batch):
        def zero_singletons(rewards, mask, uid):
            return vectorized_rloo_zero_singletons(rewards, mask, uid)

        invariants.check_advantages(loop_rloo, batch, estimator="rloo", variant=zero_singletons)

    with finds("advantages.variant_agreement") as caught:
        run()
    assert "on singleton groups" in str(caught.value)


def test_finds_population_std():
    def fn(rewards, mask, uid):
        scores = scores_of(rewards)
        mean, std, size = ref.group_mean_std(scores, uid)
        n = size.to(scores.dtype)
        biased = torch.where(size > 1, std * ((n - 1) / n).sqrt(), std)
        return broadcast((scores - mean) / (biased + 1e-6), mask)

    @hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="grpo")

    with finds("advantages.reference_agreement"):
        run()


def test_finds_token_weighted_group_mean():
    def fn(rewards, mask, uid):
        scores = scores_of(rewards)
        tokens = as_bool_mask(mask).sum(dim=-1).to(scores.dtype)
        out = scores.clone()
        for i in range(len(scores)):
            group = uid == uid[i]
            if int(group.sum()) > 1:
                weights = tokens[group]
                out[i] = scores[i] - (scores[group] * weights).sum() / weights.sum()
        return broadcast(out, mask)

    @hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="drgrpo")

    with finds("advantages.group_mean_zero"):
        run()


def test_finds_advantages_on_padding():
    def fn(rewards, mask, uid):
        return ref.grpo_advantages(rewards, mask, uid).sum(dim=-1, keepdim=True).expand_as(rewards)

    @hunt
    @given(reward_batches())
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="grpo")

    with pytest.raises(AssertionError, match=r"\[advantages\.(zero_on_padding|reference)"):
        run()


def test_finds_reward_to_go_instead_of_broadcast():
    def fn(rewards, mask, uid):
        centered = ref.drgrpo_advantages(rewards, mask, uid)
        return centered + rewards.flip(-1).cumsum(-1).flip(-1) * as_bool_mask(mask)

    @hunt
    @given(reward_batches(rewards="dense"))
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="drgrpo")

    with finds("advantages.broadcast"):
        run()


def test_finds_groups_by_position_instead_of_label():
    def fn(rewards, mask, uid):
        # Groups taken as runs of equal consecutive labels: wrong once a group is interleaved.
        runs = torch.cat([torch.zeros(1, dtype=torch.long), (uid[1:] != uid[:-1]).long()]).cumsum(0)
        return ref.rloo_advantages(rewards, mask, runs)

    @hunt
    @given(reward_batches(min_batch=3))
    def run(batch):
        invariants.check_advantages(fn, batch, estimator="rloo")

    with pytest.raises(
        AssertionError, match=r"\[advantages\.(singleton|group_mean_zero|reference)"
    ):
        run()
