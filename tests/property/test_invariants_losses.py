"""The loss checkers pass the reference and catch deliberately broken implementations."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import (
    check_linear_in_advantages,
    check_packing_invariance,
    check_padding_invariance,
    check_permutation_invariance,
    check_ppo_clip,
    check_ppo_reduces_to_reinforce,
    check_split_invariance,
    check_zero_advantage,
)
from pytest_rollout_golden.reference.masking import as_bool_mask, masked_mean
from pytest_rollout_golden.strategies import rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MODES = st.sampled_from(ref.AGG_MODES)
SCALE = 16.0  # fixed loss_scale_factor for seq-mean-token-sum-norm

passes = passes_settings(100)


def reference_loss(mode="token-mean", loss_type="ppo_clip", **options):
    """A framework-style loss: ``(batch, *, global_tokens, global_seqs, dp_size=1)``."""

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1, cu_seqlens=None):
        loss, _ = ref.policy_loss(
            batch["log_probs"],
            batch["old_log_probs"],
            batch["advantages"],
            batch["response_mask"],
            loss_type=loss_type,
            agg_mode=mode,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=SCALE if mode == "seq-mean-token-sum-norm" else None,
            cu_seqlens=cu_seqlens,
            **options,
        )
        return loss * dp_size  # the DP all-reduce averages; scale the rank's piece back up

    return loss_fn


def ppo_token_losses(batch):
    losses, _, _ = ref.ppo_clip_token_losses(
        batch["log_probs"], batch["old_log_probs"], batch["advantages"]
    )
    return losses


# --------------------------------------------------------------------------- reference passes


@passes
@given(
    rollout_batches(dtype=DTYPES),
    MODES,
    st.sampled_from(["ppo_clip", "reinforce"]),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_reference_split_and_dp_invariant(batch, mode, loss_type, n_splits, dp_size):
    loss_fn = reference_loss(mode, loss_type)
    check_split_invariance(loss_fn, batch, n_splits=n_splits, dp_size=dp_size)


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from(["ppo_clip", "reinforce"]))
def test_reference_layout_invariant(batch, mode, loss_type):
    loss_fn = reference_loss(mode, loss_type)
    check_permutation_invariance(loss_fn, batch)
    check_padding_invariance(loss_fn, batch)
    check_packing_invariance(loss_fn, loss_fn, batch)


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from([(0.2, None), (0.2, 0.28)]))
def test_reference_ppo_properties(batch, mode, clips):
    low, high = clips
    ppo = reference_loss(mode, clip_ratio_low=low, clip_ratio_high=high)
    check_ppo_clip(
        ppo,
        batch,
        clip_ratio_low=low,
        clip_ratio_high=high,
        agg_mode=mode,
        loss_scale_factor=SCALE if mode == "seq-mean-token-sum-norm" else None,
    )
    check_ppo_reduces_to_reinforce(ppo, reference_loss(mode, "reinforce"), batch)
    check_zero_advantage(ppo, batch)
    check_linear_in_advantages(ppo, batch)


@passes
@given(rollout_batches(dtype=DTYPES), MODES)
def test_reference_reinforce_is_linear(batch, mode):
    check_linear_in_advantages(reference_loss(mode, "reinforce"), batch, additive=True)


@passes
@given(rollout_batches(dtype=DTYPES), st.sampled_from(["reinforce", "ppo_clip"]), MODES)
def test_reference_bypass_mode_properties(batch, loss_type, mode):
    def loss_fn(b, *, global_tokens, global_seqs):
        loss, _ = ref.bypass_policy_loss(
            b["log_probs"],
            b["rollout_log_probs"],
            b["advantages"],
            b["response_mask"],
            loss_type=loss_type,
            is_level="token",
            is_threshold=2.0,
            agg_mode=mode,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=SCALE,
        )
        return loss

    check_split_invariance(loss_fn, batch, n_splits=2)
    check_padding_invariance(loss_fn, batch)
    check_zero_advantage(loss_fn, batch)


def test_dp_variant_requires_dp_size_keyword():
    def loss_fn(batch, *, global_tokens, global_seqs):
        return torch.zeros(())

    batch = {"response_mask": torch.ones(2, 2), "log_probs": torch.zeros(2, 2)}
    with pytest.raises(TypeError, match="dp_size"):
        check_split_invariance(loss_fn, batch, dp_size=2)


# --------------------------------------------------------------------------- micro-batch / DP bugs


def test_finds_sample_fraction_weighting():
    """Each micro-batch's own token-mean weighted by its share of the samples."""

    @hunt
    @given(rollout_batches(min_batch=2), st.integers(2, 3))
    def run(batch, n_splits):
        size = batch["response_mask"].shape[0]

        def loss_fn(micro, *, global_tokens, global_seqs):
            local = masked_mean(ppo_token_losses(micro), micro["response_mask"])
            return local * micro["response_mask"].shape[0] / size

        check_split_invariance(loss_fn, batch, n_splits=n_splits)

    with finds("split_invariance"):
        run()


def test_finds_averaged_micro_batch_token_means():
    """Each micro-batch's own token-mean, divided by the number of micro-batches."""

    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        n_splits = 2

        def loss_fn(micro, *, global_tokens, global_seqs):
            is_full = micro["response_mask"].shape[0] == batch["response_mask"].shape[0]
            local = masked_mean(ppo_token_losses(micro), micro["response_mask"])
            return local if is_full else local / n_splits

        check_split_invariance(loss_fn, batch, n_splits=n_splits)

    with finds("split_invariance"):
        run()


def test_split_bug_hides_when_micro_batches_hold_equal_token_counts():
    # The classic bug is exact when every row has the same length: only uneven token
    # counts expose it, which is why the checker tries several partitions of ragged rows.
    batch = {
        "log_probs": torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=torch.float64),
        "old_log_probs": torch.tensor([[-1.25, -1.5], [-0.75, -1.0]], dtype=torch.float64),
        "advantages": torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64),
        "response_mask": torch.ones(2, 2, dtype=torch.bool),
    }

    def loss_fn(micro, *, global_tokens, global_seqs):
        local = masked_mean(ppo_token_losses(micro), micro["response_mask"])
        return local * micro["response_mask"].shape[0] / 2

    check_split_invariance(loss_fn, batch, n_splits=2)
    ragged = dict(batch, response_mask=torch.tensor([[True, True], [True, False]]))
    with finds("split_invariance"):
        check_split_invariance(loss_fn, ragged, n_splits=2)


def test_finds_double_dp_normalizer():
    """``/ (global_tokens · dp_size)`` without the compensating ``· dp_size``."""

    def loss_fn(micro, *, global_tokens, global_seqs, dp_size=1):
        total = ref.masked_sum(ppo_token_losses(micro), micro["response_mask"])
        return total / (global_tokens * dp_size)

    @hunt
    @given(rollout_batches(min_batch=2), st.integers(2, 4))
    def run(batch, dp_size):
        check_split_invariance(loss_fn, batch, n_splits=1, dp_size=dp_size)

    with finds("split_invariance") as caught:
        run()
    assert "dp_size²" in str(caught.value)


def test_finds_local_normalizer_in_dp_shards():
    """Each rank normalizes by its own token count instead of the global one."""

    def loss_fn(micro, *, global_tokens, global_seqs, dp_size=1):
        return ref.aggregate_loss(ppo_token_losses(micro), micro["response_mask"]) * dp_size

    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        check_split_invariance(loss_fn, batch, n_splits=1, dp_size=2)

    with finds("split_invariance"):
        run()


def test_finds_seq_mean_over_local_sequences():
    def loss_fn(micro, *, global_tokens, global_seqs):
        return ref.aggregate_loss(
            ppo_token_losses(micro), micro["response_mask"], "seq-mean-token-mean"
        )

    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        check_split_invariance(loss_fn, batch, n_splits=2)

    with finds("split_invariance"):
        run()


# --------------------------------------------------------------------------- layout bugs


def test_finds_packed_loss_treating_the_pack_as_one_sequence():
    padded = reference_loss("seq-mean-token-mean")

    def packed(batch, *, cu_seqlens, global_tokens, global_seqs):
        token_mean = masked_mean(ppo_token_losses(batch), batch["response_mask"])
        return token_mean / global_seqs  # ignores cu_seqlens

    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        check_packing_invariance(padded, packed, batch)

    with finds("packing_invariance"):
        run()


def test_finds_nan_from_garbage_padding():
    """Masking by multiplication after an unclamped exp: inf · 0 = nan on extreme garbage
    (``garbage="extreme"``: positive "log-probs" of thousands in the padding)."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        ratio = (batch["log_probs"] - batch["old_log_probs"]).exp()
        per_token = -batch["advantages"] * ratio * batch["response_mask"]
        return per_token.sum() / global_tokens

    @hunt
    @given(rollout_batches(garbage="extreme"))
    def run(batch):
        check_padding_invariance(loss_fn, batch)

    with pytest.raises(AssertionError, match=r"\[padding_invariance\.finite\]") as caught:
        run()
    assert "likely cause: exp of unmasked padding" in str(caught.value)


def test_finds_loss_normalized_by_padded_length():
    def loss_fn(batch, *, global_tokens, global_seqs):
        per_token = ref.masked_fill_zero(ppo_token_losses(batch), batch["response_mask"])
        return per_token.sum() / (global_seqs * batch["response_mask"].shape[-1])

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_padding_invariance(loss_fn, batch)

    with finds("padding_invariance"):
        run()


def test_finds_row_order_dependence():
    def loss_fn(batch, *, global_tokens, global_seqs):
        per_token = ref.masked_fill_zero(ppo_token_losses(batch), batch["response_mask"])
        first_length = as_bool_mask(batch["response_mask"])[0].sum().clamp(min=1)
        return per_token.sum() / (first_length * global_seqs)

    @hunt
    @given(rollout_batches(min_batch=2))
    def run(batch):
        check_permutation_invariance(loss_fn, batch)

    with finds("permutation_invariance"):
        run()


# --------------------------------------------------------------------------- PPO / advantage bugs


def test_finds_missing_dual_clip():
    def loss_fn(batch, *, global_tokens, global_seqs):
        ratio = (batch["log_probs"] - batch["old_log_probs"]).clamp(-20, 20).exp()
        advantages = batch["advantages"]
        per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
        return ref.aggregate_loss(per_token, batch["response_mask"], global_tokens=global_tokens)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_clip(loss_fn, batch)

    with finds("ppo_clip.dual_clip"):
        run()


def test_finds_symmetric_clip_when_asymmetric_is_configured():
    plain = reference_loss("token-mean")  # clip_ratio_high defaults to 0.2

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_clip(plain, batch, clip_ratio_low=0.2, clip_ratio_high=0.28)

    with pytest.raises(AssertionError, match=r"\[ppo_clip\.(upper_clip|unclipped_gradient)\]"):
        run()


def test_finds_ppo_value_mismatch_with_reference():
    def loss_fn(batch, *, global_tokens, global_seqs):  # token-mean where seq-mean is configured
        return reference_loss("token-mean")(
            batch, global_tokens=global_tokens, global_seqs=global_seqs
        )

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_clip(loss_fn, batch, agg_mode="seq-mean-token-sum")

    with finds("ppo_clip.reference_agreement"):
        run()


def test_finds_ppo_written_in_log_prob_form():
    """``-A·stopgrad(r)·log π`` has PPO's gradient at ratio 1 but not its value."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        ratio = (batch["log_probs"] - batch["old_log_probs"]).exp().detach()
        per_token = -batch["advantages"] * ratio * batch["log_probs"]
        return ref.aggregate_loss(per_token, batch["response_mask"], global_tokens=global_tokens)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_reduces_to_reinforce(loss_fn, reference_loss("token-mean", "reinforce"), batch)

    with finds("ppo_reduces_to_reinforce"):
        run()


def test_finds_reinforce_with_wrong_sign():
    def reinforce(batch, *, global_tokens, global_seqs):
        per_token = batch["advantages"] * batch["log_probs"]
        return ref.aggregate_loss(per_token, batch["response_mask"], global_tokens=global_tokens)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_ppo_reduces_to_reinforce(reference_loss(), reinforce, batch)

    with finds("ppo_reduces_to_reinforce.gradient"):
        run()


def test_finds_loss_with_an_advantage_free_term():
    def loss_fn(batch, *, global_tokens, global_seqs):
        entropy_like = ref.aggregate_loss(batch["log_probs"], batch["response_mask"])
        return reference_loss()(batch, global_tokens=global_tokens, global_seqs=global_seqs) + (
            0.01 * entropy_like
        )

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_zero_advantage(loss_fn, batch)

    with pytest.raises(AssertionError, match=r"\[zero_advantage"):
        run()


def test_finds_advantage_whitening_inside_the_loss():
    def loss_fn(batch, *, global_tokens, global_seqs):
        mask = batch["response_mask"]
        advantages = batch["advantages"]
        scale = masked_mean(advantages.abs(), mask).clamp(min=1e-6)
        whitened = dict(batch, advantages=advantages / scale)
        return reference_loss()(whitened, global_tokens=global_tokens, global_seqs=global_seqs)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_linear_in_advantages(loss_fn, batch)

    with finds("linear_in_advantages.homogeneity"):
        run()


def test_finds_ppo_is_not_additive():
    # PPO-clip is positively homogeneous only; the additive check tells it apart from REINFORCE.
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_linear_in_advantages(reference_loss(), batch, additive=True)

    with pytest.raises(AssertionError, match=r"\[linear_in_advantages\.additivity"):
        run()


def test_split_message_names_the_pieces():
    batch = {
        "log_probs": torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 3.0, 3.0]], dtype=torch.float64),
        "old_log_probs": torch.tensor([[-1.0, -1.0, 4.0], [-1.0, 5.0, 5.0]], dtype=torch.float64),
        "advantages": torch.tensor([[1.0, 1.0, 50.0], [2.0, 50.0, 50.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
    }

    def loss_fn(micro, *, global_tokens, global_seqs):
        return masked_mean(ppo_token_losses(micro), micro["response_mask"]) / 2

    with finds("split_invariance") as caught:
        check_split_invariance(loss_fn, batch, n_splits=2)
    message = str(caught.value)
    assert "rows [0] (2 valid tokens)" in message
    assert "rows [1] (1 valid tokens)" in message
