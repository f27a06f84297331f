"""Epsilon guards are correct code: every checker accepts them in every dtype and mask type,
still catches the bugs of the catalogue, and says by how much two values differ."""

from __future__ import annotations

import math

import guarded
import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.strategies import is_thresholds, rollout_batches, rs_configs

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
DELTAS = st.sampled_from([1e-8, 1e-6])
MODES = st.sampled_from(ref.AGG_MODES)

passes = passes_settings(60)


@passes
@given(
    rollout_batches(dtype=DTYPES),
    st.sampled_from(["token", "sequence"]),
    st.one_of(st.none(), is_thresholds()),
    st.booleans(),
    DELTAS,
)
def test_guarded_is_weights_pass(batch, level, threshold, normalize, delta):
    fn = guarded.is_weights(level, threshold, normalize, delta=delta)
    invariants.check_is_weights(
        fn, batch, level=level, threshold=threshold, batch_normalize=normalize
    )


@passes
@given(rollout_batches(dtype=DTYPES), rs_configs(max_parts=2), DELTAS)
def test_guarded_rs_mask_passes(batch, config, delta):
    criterion, threshold = config
    fn = guarded.rs_mask(delta=delta)
    invariants.check_rs_mask(fn, batch, criterion=criterion, threshold=threshold)


@passes
@given(rollout_batches(dtype=DTYPES, min_batch=2), MODES, DELTAS, st.integers(1, 3))
def test_guarded_losses_pass(batch, mode, delta, dp_size):
    loss_fn = guarded.ppo_loss(mode, delta=delta, clip_ratio_high=0.28)
    invariants.check_ppo_clip(
        loss_fn,
        batch,
        clip_ratio_high=0.28,
        agg_mode=mode,
        loss_scale_factor=16.0 if mode == "seq-mean-token-sum-norm" else None,
    )
    invariants.check_split_invariance(loss_fn, batch, n_splits=2, dp_size=dp_size)
    invariants.check_padding_invariance(loss_fn, batch)
    invariants.check_permutation_invariance(loss_fn, batch)
    invariants.check_linear_in_advantages(loss_fn, batch)
    invariants.check_zero_advantage(loss_fn, batch)


def one_on_policy_token(mask_dtype):
    zero = torch.tensor([[-0.5]], dtype=torch.float64)
    return {
        "old_log_probs": zero,
        "rollout_log_probs": zero.clone(),
        "log_probs": zero.clone(),
        "advantages": torch.tensor([[1.0]], dtype=torch.float64),
        "response_mask": torch.ones(1, 1, dtype=mask_dtype),
    }


def test_minimal_false_alarm_of_the_issue_is_gone():
    # One on-policy token, float64 mask: the guarded normalized weight is 1/(1 + 1e-8).
    batch = one_on_policy_token(torch.float64)
    fn = guarded.is_weights("token", 2.0, True, delta=1e-8)
    assert (
        float(fn(*(batch[k] for k in ("old_log_probs", "rollout_log_probs", "response_mask"))))
        != 1.0
    )
    invariants.check_is_weights(fn, batch, level="token", threshold=2.0, batch_normalize=True)


def test_rtol_tightens_and_widens():
    batch = one_on_policy_token(torch.float64)
    fn = guarded.is_weights("token", 2.0, True, delta=1e-6)
    with finds("is_weights.reference_agreement") as caught:
        invariants.check_is_weights(
            fn, batch, level="token", threshold=2.0, batch_normalize=True, rtol=1e-9
        )
    # Enough digits to tell the two apart, and the relative difference.
    assert "fn=1.000001, reference=1 (difference 1e-06, relative 1e-06)" in str(caught.value)

    def off_by_a_permille(old, rollout, mask):
        return ref.compute_is_weights(old, rollout, mask, level="token", threshold=2.0)[0] * 1.001

    with finds("is_weights.reference_agreement"):
        invariants.check_is_weights(off_by_a_permille, batch, level="token", threshold=2.0)
    invariants.check_is_weights(off_by_a_permille, batch, level="token", threshold=2.0, rtol=1e-2)


def test_loss_message_shows_the_difference():
    batch = one_on_policy_token(torch.float64)
    batch["response_mask"] = torch.ones(1, 1, dtype=torch.bool)
    loss_fn = guarded.ppo_loss("token-mean", delta=1e-4)  # a guard 100 times too large
    with finds("ppo_clip.reference_agreement") as caught:
        invariants.check_ppo_clip(loss_fn, batch, agg_mode="token-mean")
    message = str(caught.value)
    assert "loss fn=-0.9999, reference=-1 (difference 0.0001, relative 0.0001)" in message


def test_bad_tolerances_are_rejected():
    batch = one_on_policy_token(torch.bool)
    fn = guarded.is_weights("token", 2.0, False, delta=0.0)
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        invariants.check_is_weights(fn, batch, level="token", threshold=2.0, rtol=-1.0)


# --------------------------------------------------------------------------- catalogue, all dtypes


def test_guard_sized_allowance_still_catches_sample_fraction_weighting_in_every_dtype():
    @hunt
    @given(rollout_batches(min_batch=2, dtype=DTYPES))
    def run(batch):
        size = batch["response_mask"].shape[0]
        token_mean = guarded.ppo_loss("token-mean", delta=1e-6)

        def loss_fn(micro, *, global_tokens, global_seqs):
            local = token_mean(
                micro,
                global_tokens=int(micro["response_mask"].bool().sum()),
                global_seqs=global_seqs,
            )
            return local * micro["response_mask"].shape[0] / size

        invariants.check_split_invariance(loss_fn, batch, n_splits=2)

    with finds("split_invariance"):
        run()


def test_guard_sized_allowance_still_catches_a_doubled_dp_normalizer():
    @hunt
    @given(rollout_batches(min_batch=2, dtype=DTYPES), st.integers(2, 4))
    def run(batch, dp_size):
        token_mean = guarded.ppo_loss("token-mean", delta=1e-6)

        def loss_fn(micro, *, global_tokens, global_seqs, dp_size):
            return token_mean(micro, global_tokens=global_tokens, global_seqs=global_seqs) / dp_size

        invariants.check_split_invariance(loss_fn, batch, n_splits=1, dp_size=dp_size)

    with finds("split_invariance") as caught:
        run()
    assert "dp_size²" in str(caught.value)


def test_hint_names_exp_of_unmasked_padding():
    def fn(old, rollout, mask):
        return ((old - rollout).exp() * mask).clamp(max=2.0)  # inf · 0 on garbage padding

    @hunt
    @given(rollout_batches(extreme_ratios=False, garbage="extreme"))
    def run(batch):
        invariants.check_is_weights(fn, batch, level="token", threshold=2.0)

    with finds("is_weights.finite") as caught:
        run()
    assert "exp of unmasked padding" in str(caught.value)
    assert "torch.where" in str(caught.value)


def test_clip_message_tells_the_ratio_from_the_clip_bound():
    log_ratio = math.log(1.2) + 1e-6  # just above 1 + ε_high: clipped
    batch = {
        "old_log_probs": torch.tensor([[-1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0]], dtype=torch.float64),
        "log_probs": torch.tensor([[-1.0 + log_ratio]], dtype=torch.float64),
        "advantages": torch.tensor([[1.0]], dtype=torch.float64),
        "response_mask": torch.ones(1, 1, dtype=torch.bool),
    }

    def unclipped(b, *, global_tokens, global_seqs):
        ratio = (b["log_probs"] - b["old_log_probs"]).exp()
        return (-b["advantages"] * ratio * b["response_mask"]).sum() / global_tokens

    with finds("ppo_clip.upper_clip") as caught:
        invariants.check_ppo_clip(unclipped, batch)
    assert "ratio=1.2000012" in str(caught.value)
