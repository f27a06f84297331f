"""SAPO, VESPO and LUSPO checkers: the reference passes, deliberately broken implementations
are caught."""

from __future__ import annotations

import math

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st
from token_losses import SCALE, aggregated

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_luspo, check_sapo, check_vespo
from pytest_rollout_golden.strategies import rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MODES = st.sampled_from(ref.AGG_MODES)
# Temperatures far apart, so that swapping them changes the gradient well beyond rounding.
TAUS = {"tau_pos": 1.0, "tau_neg": 3.0}
KS = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}

passes = passes_settings(80)


def soft_loss(mode, loss_type, **params):
    def loss_fn(batch, *, global_tokens, global_seqs):
        inputs = (batch[k] for k in ("log_probs", "old_log_probs", "advantages", "response_mask"))
        return ref.soft_policy_loss(
            *inputs,
            loss_type=loss_type,
            agg_mode=mode,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            loss_scale_factor=SCALE,
            **params,
        )

    return loss_fn


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from([{}, TAUS]))
def test_reference_sapo_passes(batch, mode, taus):
    check_sapo(
        soft_loss(mode, "sapo", **taus), batch, agg_mode=mode, loss_scale_factor=SCALE, **taus
    )


@passes
@given(rollout_batches(dtype=DTYPES), MODES, st.sampled_from([{}, KS]))
def test_reference_vespo_passes(batch, mode, ks):
    check_vespo(soft_loss(mode, "vespo", **ks), batch, agg_mode=mode, loss_scale_factor=SCALE, **ks)


def luspo(token_level=False, mode="seq-mean-token-sum"):
    options = {"ratio_level": "token" if token_level else "sequence", "clip_ratio_c": None}

    def loss_fn(batch, *, global_tokens, global_seqs):
        inputs = (batch[k] for k in ("log_probs", "old_log_probs", "advantages", "response_mask"))
        return ref.policy_loss(
            *inputs, agg_mode=mode, global_tokens=global_tokens, global_seqs=global_seqs, **options
        )[0]

    return loss_fn


@passes
@given(rollout_batches(dtype=DTYPES, advantages="sequence"))
def test_reference_luspo_passes(batch):
    check_luspo(luspo(), batch)


def test_sapo_on_policy_is_ppo():
    # At r = 1 the gate is 2/τ with slope 1 for every τ: SAPO's gradient is PPO's, -A.
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.5, -0.5]], dtype=torch.float64)
    losses = ref.sapo_token_losses(lp, lp.detach(), adv, tau_pos=1.0, tau_neg=3.0)
    (grad,) = torch.autograd.grad(losses.sum(), lp)
    assert losses.tolist() == [[-3.0, 0.5 * 2 / 3]]
    assert torch.allclose(grad, -adv, rtol=1e-15, atol=0)


def test_vespo_weight_is_one_on_policy_and_summed_over_the_row():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    adv = torch.ones_like(lp)
    assert ref.vespo_weights(lp, lp, adv, mask).tolist() == [[1.0] * 3]
    # Row log ratio 0.1 + 0.1 (the padding's 5.0 ignored): φ = exp(3 + 2·0.2 - 3·e^0.2).
    old = lp - torch.tensor([[0.1, 0.1, 5.0]], dtype=torch.float64)
    expected = math.exp(3 + 2 * 0.2 - 3 * math.exp(0.2))
    weights = ref.vespo_weights(lp, old, adv, mask)
    assert torch.allclose(weights, torch.full_like(weights, expected), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- SAPO bugs


def sapo_with(tau_pos=1.0, tau_neg=3.0, scale=True, gate=torch.sigmoid, where=lambda a: a > 0):
    def token_losses(batch):
        lp, old, adv = batch["log_probs"], batch["old_log_probs"], batch["advantages"]
        tau = torch.where(where(adv), tau_pos, tau_neg).to(lp.dtype)
        ratio = (lp - old).clamp(-20, 20).exp()
        value = gate(tau * (ratio - 1))
        return -(value * 4 / tau if scale else value) * adv

    return token_losses


def hard_clip_gate(x):
    return x.clamp(-0.2, 0.28) / 4 + 0.5


SAPO_BUGS = {
    "temperatures swapped": (sapo_with(tau_pos=3.0, tau_neg=1.0), "sapo.soft_gate"),
    "no 4/τ scale": (sapo_with(scale=False), "sapo"),
    "hard clip": (sapo_with(gate=hard_clip_gate), "sapo.gradient_sign"),
    "sign error": (lambda b: -sapo_with()(b), "sapo.gradient_sign"),
}


@pytest.mark.parametrize("bug", sorted(SAPO_BUGS))
def test_finds_broken_sapo(bug):
    token_losses, invariant = SAPO_BUGS[bug]

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_sapo(aggregated(token_losses, "token-mean"), batch, agg_mode="token-mean", **TAUS)

    with finds(invariant):
        run()


def test_finds_sapo_gate_without_ratio():
    # The gate of log r instead of r: right at r = 1, a different slope elsewhere.
    def token_losses(batch):
        lp, old, adv = batch["log_probs"], batch["old_log_probs"], batch["advantages"]
        tau = torch.where(adv > 0, 1.0, 3.0).to(lp.dtype)
        return -(4 / tau) * torch.sigmoid(tau * (lp - old)) * adv

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_sapo(aggregated(token_losses, "token-mean"), batch, **TAUS)

    with finds("sapo.soft_gate"):
        run()


def test_finds_sapo_wrong_reduction():
    @hunt
    @given(rollout_batches())
    def run(batch):
        loss_fn = soft_loss("seq-mean-token-mean", "sapo", **TAUS)
        check_sapo(loss_fn, batch, agg_mode="token-mean", **TAUS)

    with finds("sapo.reference_agreement"):
        run()


# --------------------------------------------------------------------------- VESPO bugs


def vespo_with(detach=True, per_token=False, mean=False, swap=False):
    k_pos, lam_pos, k_neg, lam_neg = (3.0, 2.0, 2.0, 3.0) if swap else (2.0, 3.0, 3.0, 2.0)

    def token_losses(batch):
        lp, old, adv, mask = (
            batch[k] for k in ("log_probs", "old_log_probs", "advantages", "response_mask")
        )
        if per_token:
            log_w = (lp - old).clamp(-18.42, 20)
        else:
            log_ratio = ref.masked_fill_zero((lp - old).clamp(-20, 20), mask)
            log_w = log_ratio.sum(-1, keepdim=True)
            if mean:
                log_w = log_w / ref.masked_count(mask, dim=-1).clamp(min=1).unsqueeze(-1)
            log_w = log_w.clamp(-18.42, 20)
        k = torch.where(adv >= 0, k_pos, k_neg).to(lp.dtype)
        lam = torch.where(adv >= 0, lam_pos, lam_neg).to(lp.dtype)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())
        return -(phi.detach() if detach else phi) * adv * lp

    return token_losses


VESPO_BUGS = {
    "weight not detached": (vespo_with(detach=False), "vespo"),
    "per-token ratio": (vespo_with(per_token=True), "vespo.stop_gradient"),
    "mean log ratio": (vespo_with(mean=True), "vespo.reference_agreement"),
    "(k, λ) swapped": (vespo_with(swap=True), "vespo.reference_agreement"),
    "sign error": (lambda b: -vespo_with()(b), "vespo.gradient_sign"),
}


@pytest.mark.parametrize("bug", sorted(VESPO_BUGS))
def test_finds_broken_vespo(bug):
    token_losses, invariant = VESPO_BUGS[bug]

    @hunt
    @given(rollout_batches(advantages="sequence"))
    def run(batch):
        check_vespo(aggregated(token_losses, "token-mean"), batch, agg_mode="token-mean")

    with finds(invariant):
        run()


def test_finds_vespo_without_stop_gradient_and_no_agg_mode():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_vespo(aggregated(vespo_with(detach=False), "seq-mean-token-mean"), batch)

    with pytest.raises(AssertionError, match=r"\[vespo\.(stop_gradient|gradient_sign)\]"):
        run()


def test_finds_vespo_wrong_reduction():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_vespo(soft_loss("seq-mean-token-mean", "vespo"), batch, agg_mode="token-mean")

    with finds("vespo.reference_agreement"):
        run()


# --------------------------------------------------------------------------- LUSPO bugs


def test_finds_gspo_passed_off_as_luspo():
    # GSPO's seq-mean-token-mean: the sequence's loss not scaled by its length.
    @hunt
    @given(rollout_batches(advantages="sequence"))
    def run(batch):
        check_luspo(luspo(mode="seq-mean-token-mean"), batch, agg_mode=None)

    with finds("luspo.length_unbiased"):
        run()


def test_finds_luspo_with_token_ratios():
    @hunt
    @given(rollout_batches(advantages="sequence"))
    def run(batch):
        check_luspo(luspo(token_level=True), batch)

    with pytest.raises(AssertionError, match=r"\[(ppo_clip|luspo)\."):
        run()
