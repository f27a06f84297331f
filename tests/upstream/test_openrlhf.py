"""OpenRLHF 0.11.2 (``openrlhf/models/loss.py``) against the loss checkers."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from lane import (
    COMBOS,
    DTYPES,
    conforms,
    discrepancy,
    discrepancy_hunt,
    drawn,
    known_discrepancy,
    mask_dtype,
)

from pytest_rollout_golden import invariants
from pytest_rollout_golden.strategies import critic_batches, rollout_batches, value_batches

# OpenRLHF's two reductions, in the reference's names.
MODES = {True: "token-mean", False: "seq-mean-token-mean"}


def openrlhf_ppo_loss(loss_module, token_level_loss, dual_clip=3.0):
    policy = loss_module.PolicyLoss(
        clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=dual_clip, token_level_loss=token_level_loss
    )

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        loss, *_ = policy(
            batch["log_probs"],
            batch["old_log_probs"],
            batch["advantages"],
            action_mask=batch["response_mask"],
            dp_size=dp_size,
            batch_num_tokens=global_tokens,
            global_batch_size=global_seqs,
        )
        return loss

    return loss_fn


@COMBOS
def test_ppo_loss_conforms(openrlhf_loss, dtype, mask):
    float_dtype = DTYPES[dtype]

    @conforms
    @given(
        rollout_batches(dtype=float_dtype, mask_dtype=mask_dtype(mask, float_dtype), min_batch=2),
        st.booleans(),
        st.integers(1, 3),
    )
    def run(batch, token_level_loss, dp_size):
        loss_fn = openrlhf_ppo_loss(openrlhf_loss, token_level_loss)
        invariants.check_ppo_clip(
            loss_fn,
            batch,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=3.0,
            agg_mode=MODES[token_level_loss],
        )
        invariants.check_split_invariance(loss_fn, batch, n_splits=2, dp_size=dp_size)
        invariants.check_padding_invariance(loss_fn, batch)
        invariants.check_permutation_invariance(loss_fn, batch)
        invariants.check_zero_advantage(loss_fn, batch)
        invariants.check_linear_in_advantages(loss_fn, batch)

    run()


@discrepancy(
    "PolicyLoss defaults to dual_clip=None: for A < 0 the loss -A·ratio grows without bound "
    "as the ratio passes clip_ratio_c, so those tokens keep a gradient. A configuration "
    "default rather than a bug (dual-clip PPO needs dual_clip=3.0), shown so that the "
    "missing-dual-clip bug of the catalogue is caught on real code."
)
def test_default_policy_loss_has_no_dual_clip(openrlhf_loss):
    loss_fn = openrlhf_ppo_loss(openrlhf_loss, True, dual_clip=None)

    @discrepancy_hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_ppo_clip(loss_fn, batch, clip_ratio_low=0.2, clip_ratio_high=0.28)

    with known_discrepancy("ppo_clip.dual_clip"):
        run()


def openrlhf_corrected_loss(loss_module, level, mode):
    policy = loss_module.PolicyLoss(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        dual_clip=3.0,
        is_correction_level=level,
        is_correction_mode=mode,
        is_correction_threshold=(0.5, 5.0),
    )

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        loss, *_ = policy(
            batch["log_probs"],
            batch["old_log_probs"],
            batch["advantages"],
            action_mask=batch["response_mask"],
            rollout_log_probs=batch["rollout_log_probs"],
            dp_size=dp_size,
            batch_num_tokens=global_tokens,
            global_batch_size=global_seqs,
        )
        return loss

    return loss_fn


@COMBOS
def test_is_corrected_loss_conforms(openrlhf_loss, dtype, mask):
    # The unclamped exp of the train/rollout log ratio also meets the garbage in padding;
    # a NaN there would show in every checker below.
    float_dtype = DTYPES[dtype]

    @conforms
    @given(
        rollout_batches(dtype=float_dtype, mask_dtype=mask_dtype(mask, float_dtype), min_batch=2),
        st.sampled_from([("token", "mask"), ("token", "clip")]),
    )
    def run(batch, correction):
        loss_fn = openrlhf_corrected_loss(openrlhf_loss, *correction)
        invariants.check_split_invariance(loss_fn, batch, n_splits=2)
        invariants.check_padding_invariance(loss_fn, batch)
        invariants.check_permutation_invariance(loss_fn, batch)
        invariants.check_zero_advantage(loss_fn, batch)

    run()


@discrepancy(
    "is_correction_level='seq' with mode 'mask' multiplies the loss by exp(old - rollout) at "
    "every position of a kept sequence, padding included and without the ±20 clamp: garbage "
    "padding (rollout_batches(garbage='extreme'), positive log-probs no model produces) "
    "overflows to inf, and inf · 0 is NaN in the masked sum; the log-probs a model leaves in "
    "padding (≤ 0) keep it finite. The math weights valid tokens only (verl clamps the log "
    "ratio at ±20 and masks the weights)."
)
def test_sequence_mask_correction_exponentiates_padding(openrlhf_loss):
    loss_fn = openrlhf_corrected_loss(openrlhf_loss, "seq", "mask")

    @discrepancy_hunt
    @given(rollout_batches(garbage="extreme"))
    def run(batch):
        invariants.check_padding_invariance(loss_fn, batch)

    with known_discrepancy("padding_invariance.finite"):
        run()


def openrlhf_ppo_metrics(loss_module):
    policy = loss_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0)

    def fn(batch):
        _, clip_ratio, ppo_kl, _, _ = policy(
            batch["log_probs"],
            batch["old_log_probs"],
            batch["advantages"],
            action_mask=batch["response_mask"],
            batch_num_tokens=max(int((batch["response_mask"] != 0).sum()), 1),
        )
        return {"actor/pg_clipfrac": clip_ratio, "actor/ppo_kl": ppo_kl}

    return fn


@COMBOS
def test_ppo_metrics_conform(openrlhf_loss, dtype, mask):
    float_dtype = DTYPES[dtype]

    @conforms
    @given(rollout_batches(dtype=float_dtype, mask_dtype=mask_dtype(mask, float_dtype)))
    def run(batch):
        invariants.check_ppo_metrics(
            openrlhf_ppo_metrics(openrlhf_loss),
            batch,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            degenerate=False,
        )

    run()


@discrepancy(
    "masked_mean divides by mask.sum() without a guard: on a micro-batch with no valid token "
    "(every token rejected) ppo_kl and the clip fraction are 0/0 = NaN. A mean over nothing "
    "has no value; the reference (and verl's +1e-8) log 0."
)
def test_ppo_metrics_nan_without_valid_tokens(openrlhf_loss):
    @discrepancy_hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_ppo_metrics(
            openrlhf_ppo_metrics(openrlhf_loss), batch, clip_ratio_low=0.2, clip_ratio_high=0.28
        )

    with known_discrepancy("ppo_metrics.finite"):
        run()


# --------------------------------------------------------------------------- critic and GAE


def openrlhf_value_loss(loss_module, token_level_loss, clip_eps=0.5):
    value = loss_module.ValueLoss(clip_eps=clip_eps, token_level_loss=token_level_loss)

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1):
        return value(
            batch["vpreds"],
            batch["values"],
            batch["returns"],
            action_mask=batch["response_mask"],
            dp_size=dp_size,
            batch_num_tokens=global_tokens,
            global_batch_size=global_seqs,
        )

    return loss_fn


@COMBOS
def test_value_loss_conforms(openrlhf_loss, dtype, mask):
    float_dtype = DTYPES[dtype]

    @conforms
    @given(
        critic_batches(dtype=float_dtype, mask_dtype=mask_dtype(mask, float_dtype), min_batch=2),
        st.booleans(),
        st.sampled_from([None, 0.5]),
        st.integers(1, 3),
    )
    def run(batch, token_level_loss, clip_eps, dp_size):
        invariants.check_value_loss(
            openrlhf_value_loss(openrlhf_loss, token_level_loss, clip_eps),
            batch,
            cliprange_value=clip_eps,
            agg_mode=MODES[token_level_loss],
            dp_size=dp_size,
        )

    run()


def openrlhf_gae_fn(get_advantages_and_returns, gamma, lam):
    def fn(token_level_rewards, values, response_mask):
        return get_advantages_and_returns(values, token_level_rewards, response_mask, gamma, lam)

    return fn


@COMBOS
@pytest.mark.parametrize("garbage", [True, False], ids=["garbage", "zeros"])
def test_gae_conforms_on_right_padding(openrlhf_gae, dtype, mask, garbage):
    # OpenRLHF's experiences are right-padded and hold no masked tokens inside a response;
    # its advantages are whitened later, over all experiences, so they are judged raw here.
    batches = drawn(
        value_batches,
        dtype,
        mask,
        padding="right",
        holes=False,
        garbage=garbage,
    )

    @conforms
    @given(batches, st.sampled_from([(1.0, 0.95), (0.99, 0.9)]))
    def run(batch, params):
        gamma, lam = params
        fn = openrlhf_gae_fn(openrlhf_gae, gamma, lam)
        invariants.check_gae(fn, batch, gamma=gamma, lam=lam)

    run()
