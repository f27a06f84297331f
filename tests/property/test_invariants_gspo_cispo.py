"""Sequence-level ratios (GSPO) in check_ppo_clip and the CISPO checker: the reference
passes, deliberately broken implementations are caught."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st
from token_losses import SCALE, aggregated

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_cispo, check_ppo_clip, check_split_invariance
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MODES = st.sampled_from(ref.AGG_MODES)

passes = passes_settings(80)


def loss(mode, loss_type="ppo_clip", token_losses=None, **options):
    """A framework-style loss; ``token_losses(batch)`` replaces the per-token losses."""

    def loss_fn(batch, *, global_tokens, global_seqs):
        if token_losses is None:
            return ref.policy_loss(
                batch["log_probs"],
                batch["old_log_probs"],
                batch["advantages"],
                batch["response_mask"],
                loss_type=loss_type,
                agg_mode=mode,
                global_tokens=global_tokens,
                global_seqs=global_seqs,
                loss_scale_factor=SCALE,
                **options,
            )[0]
        return aggregated(token_losses, mode)(
            batch, global_tokens=global_tokens, global_seqs=global_seqs
        )

    return loss_fn


GSPO = {"ratio_level": "sequence", "clip_ratio_c": None, "clip_ratio_high": 0.28}


@passes
@given(rollout_batches(dtype=DTYPES), MODES)
def test_reference_gspo_passes(batch, mode):
    check_ppo_clip(loss(mode, **GSPO), batch, agg_mode=mode, loss_scale_factor=SCALE, **GSPO)
    check_split_invariance(loss(mode, **GSPO), batch)


def test_sequence_log_ratio_is_not_rounded_at_the_scale_of_log_prob():
    # In bf16, (-0.625 + -33.5) rounds to -34 (8 significant bits): adding the sequence log
    # ratio to logp before subtracting sg(logp) gave -0.5 instead of -0.625 (a 13% gradient
    # error in test_reference_gspo_passes); logp - sg(logp) is exactly 0, so add it last.
    lp = torch.tensor([[0.0, -1.1875, -1.6875, -24.75, -33.5]], dtype=torch.bfloat16)
    old = torch.tensor([[0.0, 0.0, 0.0, -25.0, -33.0]], dtype=torch.bfloat16)
    mask = torch.ones_like(lp, dtype=torch.bool)
    log_ratio = ref.policy_log_ratio(lp, old, mask, ratio_level="sequence")
    assert log_ratio.tolist() == [[-0.625] * 5]


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from([(0.2, None), (0.5, 0.28)]))
def test_reference_cispo_passes(batch, mode, clips):
    low, high = clips
    loss_fn = loss(mode, "cispo", clip_ratio_low=low, clip_ratio_high=high)
    check_cispo(
        loss_fn,
        batch,
        clip_ratio_low=low,
        clip_ratio_high=high,
        agg_mode=mode,
        loss_scale_factor=SCALE,
    )
    check_split_invariance(loss_fn, batch)


# --------------------------------------------------------------------------- GSPO bugs


def gspo_with(seq_log_ratio):
    def token_losses(batch):
        lp, mask, adv = batch["log_probs"], batch["response_mask"], batch["advantages"]
        seq = seq_log_ratio(lp.detach(), batch["old_log_probs"], mask)
        ratio = (seq.unsqueeze(-1) + lp - lp.detach()).clamp(max=10).exp()
        return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))

    return token_losses


def arithmetic_mean(lp, old, mask):
    ratio = torch.where(as_bool_mask(mask), (lp - old).exp(), torch.zeros_like(lp))
    return (ref.masked_mean(ratio, mask, dim=-1)).clamp(min=1e-30).log()


def padded_length_mean(lp, old, mask):
    return torch.where(as_bool_mask(mask), lp - old, torch.zeros_like(lp)).mean(dim=-1)


@pytest.mark.parametrize("bug", [arithmetic_mean, padded_length_mean, ref.masked_sum])
def test_finds_wrong_sequence_ratio(bug):
    if bug is ref.masked_sum:

        def bug(lp, old, mask):
            return ref.masked_sum(lp - old, mask, dim=-1)

    @hunt
    @given(rollout_batches())
    def run(batch):
        loss_fn = loss("seq-mean-token-mean", token_losses=gspo_with(bug))
        check_ppo_clip(loss_fn, batch, agg_mode="seq-mean-token-mean", **GSPO)

    with pytest.raises(
        AssertionError, match=r"\[ppo_clip\.(upper_clip|lower_clip|unclipped_gr|ref)"
    ):
        run()


def test_finds_token_level_clipping_under_a_sequence_ratio():
    @hunt
    @given(rollout_batches())
    def run(batch):
        token_level = {**GSPO, "ratio_level": "token"}
        check_ppo_clip(loss("token-mean", **token_level), batch, **GSPO)

    with pytest.raises(AssertionError, match=r"\[ppo_clip\.(upper_clip|lower_clip|unclipped_gr)"):
        run()


# --------------------------------------------------------------------------- CISPO bugs


def cispo_with(detach=True, clip=True):
    def token_losses(batch):
        lp, old, adv = batch["log_probs"], batch["old_log_probs"], batch["advantages"]
        ratio = (lp - old).clamp(-20, 20).exp()
        weight = ratio.clamp(0.8, 1.2) if clip else ratio
        return -(weight.detach() if detach else weight) * adv * lp

    return token_losses


def test_finds_ppo_clip_passed_off_as_cispo():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_cispo(loss("token-mean", clip_ratio_c=None), batch)

    with finds("cispo.clipped_tokens_learn"):
        run()


def test_finds_weight_without_stop_gradient():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_cispo(loss("token-mean", token_losses=cispo_with(detach=False)), batch)

    with pytest.raises(AssertionError, match=r"\[cispo\.(stop_gradient|gradient_sign)\]"):
        run()


def test_finds_unclipped_weight():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_cispo(loss("seq-mean-token-mean", token_losses=cispo_with(clip=False)), batch)

    with finds("cispo.stop_gradient"):
        run()


def test_finds_cispo_against_the_reference_value():
    # Right gradient, wrong value: the sign of log π flipped in the detached part only.
    def token_losses(batch):
        good = cispo_with()(batch)
        return good + (2 * good).detach() * 0 - 2 * good.detach()

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_cispo(loss("token-mean", token_losses=token_losses), batch, agg_mode="token-mean")

    with finds("cispo.reference_agreement"):
        run()
