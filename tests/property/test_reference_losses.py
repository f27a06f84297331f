"""Reference losses, aggregation and KL estimators against hand-computed float64 values."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_rollout_golden import parallel, reference as ref

F64 = torch.float64


def t(rows, **kwargs):
    return torch.tensor(rows, dtype=F64, **kwargs)


# Per-token losses with garbage (99) in padding; row 2 has no valid token.
LOSS = t([[1.0, 3.0, 99.0], [2.0, 2.0, 2.0], [5.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (4 + 6) / 5),
        ("token-sum", 10.0),
        ("seq-mean-token-sum", (4 + 6) / 2),  # two sequences with valid tokens
        ("seq-mean-token-mean", (2 + 2) / 2),
        ("seq-mean-token-sum-norm", (4 + 6) / 2 / 3),  # default normalizer: padded length 3
    ],
)
def test_aggregate_local_counts(mode, expected):
    assert ref.aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 20),
        ("token-sum", 10.0),
        ("seq-mean-token-sum", 10 / 8),
        ("seq-mean-token-mean", 4 / 8),
        ("seq-mean-token-sum-norm", 10 / 8 / 4),
    ],
)
def test_aggregate_global_counts(mode, expected):
    loss = ref.aggregate_loss(
        LOSS, MASK, mode, global_tokens=20, global_seqs=8, loss_scale_factor=4.0
    )
    assert loss.item() == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("mode", ref.AGG_MODES)
def test_micro_batches_with_global_counts_sum_to_full_batch(mode):
    full = ref.aggregate_loss(LOSS, MASK, mode, loss_scale_factor=3.0)
    pieces = sum(
        ref.aggregate_loss(
            LOSS[rows], MASK[rows], mode, global_tokens=5, global_seqs=2, loss_scale_factor=3.0
        )
        for rows in ([0], [1, 2])
    )
    assert pieces.item() == pytest.approx(full.item(), rel=1e-15)


@pytest.mark.parametrize("mode", ref.AGG_MODES)
def test_packed_layout_matches_padded(mode):
    packed, cu_seqlens = parallel.pack({"response_mask": MASK, "loss": LOSS})
    assert cu_seqlens.tolist() == [0, 2, 5, 5]
    assert packed["loss"].tolist() == [[1.0, 3.0, 2.0, 2.0, 2.0]]
    padded = ref.aggregate_loss(LOSS, MASK, mode, loss_scale_factor=3.0)
    flat = ref.aggregate_loss(
        packed["loss"], packed["response_mask"], mode, loss_scale_factor=3.0, cu_seqlens=cu_seqlens
    )
    assert flat.item() == pytest.approx(padded.item(), rel=1e-15)


def test_packed_norm_mode_needs_a_scale_factor():
    packed, cu_seqlens = parallel.pack({"response_mask": MASK, "loss": LOSS})
    with pytest.raises(ValueError, match="loss_scale_factor"):
        ref.aggregate_loss(
            packed["loss"],
            packed["response_mask"],
            "seq-mean-token-sum-norm",
            cu_seqlens=cu_seqlens,
        )


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        ref.aggregate_loss(LOSS, MASK, "mean")


# --------------------------------------------------------------------------- PPO


# (advantage, ratio) -> (per-token loss, d loss / d log π) with ε = 0.2, clip_ratio_c = 3.
PPO_CASES = [
    (1.0, 1.1, -1.1, -1.1),  # inside the trust region
    (1.0, 1.5, -1.2, 0.0),  # clipped above
    (1.0, 0.5, -0.5, -0.5),  # A > 0 is never clipped below
    (-1.0, 0.5, 0.8, 0.0),  # clipped below
    (-1.0, 1.5, 1.5, 1.5),  # A < 0 is not clipped above
    (-1.0, 4.0, 3.0, 0.0),  # dual clip: capped at -A·c
    (-2.0, 2.0, 4.0, 4.0),  # below the dual-clip cap (-A·c = 6)
    (0.0, 2.0, 0.0, 0.0),
]


def test_ppo_clip_token_losses_and_gradients():
    advantages = t([[a for a, _, _, _ in PPO_CASES]])
    old = t([[-1.0] * len(PPO_CASES)])
    log_prob = (old + t([[math.log(r) for _, r, _, _ in PPO_CASES]])).requires_grad_()
    losses, clipped, dual = ref.ppo_clip_token_losses(log_prob, old, advantages)
    assert losses[0].tolist() == pytest.approx([c[2] for c in PPO_CASES], rel=1e-12)
    (grad,) = torch.autograd.grad(losses.sum(), log_prob)
    assert grad[0].tolist() == pytest.approx([c[3] for c in PPO_CASES], rel=1e-12, abs=1e-15)
    assert clipped[0].tolist() == [False, True, False, True, False, False, False, False]
    assert dual[0].tolist() == [False, False, False, False, False, True, False, False]


def test_ppo_asymmetric_clip():
    old = t([[-1.0, -1.0]])
    log_prob = old + t([[math.log(1.25), math.log(0.75)]])
    advantages = t([[1.0, -1.0]])
    losses, _, _ = ref.ppo_clip_token_losses(
        log_prob, old, advantages, clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    # 1.25 < 1 + 0.28 is not clipped; 0.75 < 1 - 0.2 is clipped to 0.8.
    assert losses[0].tolist() == pytest.approx([-1.25, 0.8], rel=1e-12)


def test_ppo_rejects_small_dual_clip_ratio():
    zeros = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ref.ppo_clip_token_losses(zeros, zeros, zeros, clip_ratio_c=1.0)


def test_policy_loss_metrics_and_is_weights():
    old = t([[-1.0, -1.0, 7.0]])
    log_prob = old + t([[math.log(1.5), math.log(4.0), 3.0]])
    advantages = t([[1.0, -1.0, 42.0]])
    mask = torch.tensor([[True, True, False]])
    weights = t([[0.5, 2.0, 0.0]])
    loss, metrics = ref.policy_loss(log_prob, old, advantages, mask, is_weights=weights)
    # Token losses -1.2 (clipped) and 3.0 (dual clip), weighted 0.5 and 2.
    assert loss.item() == pytest.approx((-1.2 * 0.5 + 3.0 * 2.0) / 2, rel=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.5)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(4.0)) / 2)


def test_reinforce_loss_uses_detached_weights():
    log_prob = t([[-1.0, -2.0, 5.0]], requires_grad=True)
    advantages = t([[2.0, -1.0, 9.0]])
    weights = t([[0.5, 1.5, 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, _ = ref.policy_loss(
        log_prob, log_prob.detach(), advantages, mask, loss_type="reinforce", is_weights=weights
    )
    # -A·log π·w: -(2·-1·0.5) - (-1·-2·1.5) = 1 - 3, token-mean over 2.
    assert loss.item() == pytest.approx((1.0 - 3.0) / 2, rel=1e-15)
    loss.backward()
    assert log_prob.grad.tolist() == [[-0.5, 0.75, 0.0]]
    assert weights.grad is None


def test_bypass_reinforce_applies_truncated_is_weights():
    rollout = t([[-1.0, -2.0, 3.0]])
    log_prob = t([[-1.0 + math.log(3.0), -2.0 + math.log(0.5), -9.0]])
    advantages = t([[1.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = ref.bypass_policy_loss(
        log_prob,
        rollout,
        advantages,
        mask,
        loss_type="reinforce",
        is_level="token",
        is_threshold=2.0,
    )
    # Weights π/π_rollout = 3 (truncated to 2) and 0.5.
    lp = log_prob[0].tolist()
    expected = (-1.0 * lp[0] * 2.0 - 2.0 * lp[1] * 0.5) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-14)
    assert metrics["rollout_corr/rollout_is_max"] == 2.0


def test_bypass_ppo_is_ppo_against_rollout_without_weights():
    rollout = t([[-1.0, -2.0, 3.0]])
    log_prob = t([[-1.0 + math.log(3.0), -2.0 + math.log(0.5), -9.0]])
    advantages = t([[1.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, _ = ref.bypass_policy_loss(
        log_prob, rollout, advantages, mask, loss_type="ppo_clip", is_level="token"
    )
    # Ratio 3 with A = 1 is clipped at 1.2; ratio 0.5 with A = -2 is clipped at 0.8.
    assert loss.item() == pytest.approx((-1.2 + 2 * 0.8) / 2, rel=1e-14)


def test_bypass_rejection_sampling_drops_tokens_from_the_loss():
    rollout = t([[-1.0, -1.0]])
    log_prob = t([[-1.0 + 0.5, -1.0 + 0.1]])
    advantages = t([[1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = ref.bypass_policy_loss(
        log_prob, rollout, advantages, mask, loss_type="reinforce", rs="token_k2", rs_threshold=0.1
    )
    # ½·0.5² = 0.125 > 0.1 drops the first token; the second is kept, weight 1 (no IS).
    assert loss.item() == pytest.approx(-log_prob[0, 1].item(), rel=1e-15)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.5


# --------------------------------------------------------------------------- KL


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        ("k1", 0.5),
        ("kl", 0.5),
        ("abs", 0.5),
        ("k2", 0.125),
        ("mse", 0.125),
        ("k3", math.exp(-0.5) + 0.5 - 1),
        ("low_var_kl", math.exp(-0.5) + 0.5 - 1),
    ],
)
def test_kl_estimators(estimator, expected):
    value = ref.kl_penalty(t([-1.0]), t([-1.5]), estimator)
    assert value.item() == pytest.approx(expected, rel=1e-14)


def test_abs_estimator_is_symmetric():
    assert ref.kl_penalty(t([-1.5]), t([-1.0]), "abs").item() == 0.5
    assert ref.kl_penalty(t([-1.5]), t([-1.0]), "k1").item() == -0.5


def test_low_var_kl_clamps():
    # d = ref - logp clamped to ±20, then the estimate clamped to ±10.
    assert ref.kl_penalty(t([0.0]), t([-30.0]), "k3").item() == 10.0
    assert ref.kl_penalty(t([-30.0]), t([0.0]), "k3").item() == 10.0
    d = -5.0
    assert ref.kl_penalty(t([0.0]), t([d]), "k3").item() == pytest.approx(math.exp(d) - d - 1)


@pytest.mark.parametrize("estimator", ["k1", "abs", "k3", "low_var_kl"])
def test_straight_through_estimators(estimator):
    log_prob = t([-1.0, -3.0], requires_grad=True)
    reference = t([-1.5, -0.5])
    value = ref.kl_penalty(log_prob, reference, estimator + "+")
    expected = ref.kl_penalty(log_prob.detach(), reference, estimator)
    assert value.tolist() == expected.tolist()
    value.sum().backward()
    # Gradient of k2 = ½(logp - ref)²: logp - ref.
    assert log_prob.grad.tolist() == pytest.approx([0.5, -2.5])


def test_unknown_kl_estimator():
    with pytest.raises(ValueError, match="low_var_kl"):
        ref.kl_penalty(t([0.0]), t([0.0]), "k4")
