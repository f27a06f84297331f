"""The metric checkers pass the reference and catch deliberately broken metrics."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.strategies import is_thresholds, rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
LEVELS = st.sampled_from(["token", "sequence"])

passes = passes_settings(60)


def reference_metrics(level, threshold):
    def fn(old, rollout, mask):
        return ref.rollout_correction(old, rollout, mask, is_level=level, is_threshold=threshold)

    return fn


def guarded_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def one_pass_metrics(level, threshold, *, guard):
    """IS metrics computed the way frameworks do: guarded means, one-pass variance."""

    def fn(old, rollout, mask):
        weights, metrics = ref.compute_is_weights(
            old, rollout, mask, level=level, threshold=threshold
        )
        m = mask.to(torch.float64)
        w = weights.double()
        count = m.sum() + 1e-8 if guard else m.sum().clamp(min=1)
        mean = (w * m).sum() / count
        variance = (w.square() * m).sum() / count - mean.square()
        metrics["rollout_corr/rollout_is_mean"] = float(mean)
        metrics["rollout_corr/rollout_is_std"] = float(variance.clamp(min=0).sqrt())
        return weights, metrics

    return fn


@passes
@given(rollout_batches(dtype=DTYPES), LEVELS, is_thresholds())
def test_reference_metrics_pass(batch, level, threshold):
    invariants.check_rollout_corr_metrics(
        reference_metrics(level, threshold), batch, level=level, threshold=threshold
    )


@passes
@given(rollout_batches(dtype=DTYPES))
def test_reference_ppo_metrics_pass(batch):
    def fn(b):
        return ref.policy_loss(
            b["log_probs"],
            b["old_log_probs"],
            b["advantages"],
            b["response_mask"],
            clip_ratio_high=0.28,
        )

    invariants.check_ppo_metrics(fn, batch, clip_ratio_high=0.28)


@passes
@given(rollout_batches(), LEVELS, is_thresholds())
def test_unguarded_one_pass_std_passes(batch, level, threshold):
    fn = one_pass_metrics(level, threshold, guard=False)
    invariants.check_rollout_corr_metrics(fn, batch, level=level, threshold=threshold)


def test_finds_std_biased_by_guards():
    # One token, weight 1: the true std is 0; E[w²] - E[w]² with +1e-8 counts is ~1e-4.
    batch = {
        "old_log_probs": torch.tensor([[-0.5, 3.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-0.5, -7.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1.0, 0.0]], dtype=torch.float64),
    }
    fn = one_pass_metrics("token", 2.0, guard=True)
    with finds("metrics.reference_agreement") as caught:
        invariants.check_rollout_corr_metrics(fn, batch, level="token", threshold=2.0)
    assert "rollout_is_std: fn=0.0001" in str(caught.value)


def test_finds_ess_that_divides_by_zero():
    def fn(old, rollout, mask):
        weights, metrics = ref.compute_is_weights(
            old, rollout, mask, level="token", threshold="0.5_2.0"
        )
        valid = mask != 0
        w = weights[valid]
        normalized = w / w.mean()
        metrics["rollout_corr/rollout_is_eff_sample_size"] = 1.0 / normalized.square().mean().item()
        return metrics

    @hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_rollout_corr_metrics(fn, batch, level="token", threshold="0.5_2.0")

    # 0/0 gives nan in torch; 1/0.0 in Python raises: either way the degenerate batch is named.
    with pytest.raises(
        AssertionError, match=r"\[metrics\.(finite|degenerate_batch|exception)\]"
    ) as caught:
        run()
    assert "ZeroDivisionError" in str(caught.value) or "nan" in str(caught.value)


def test_exception_is_reported_with_the_batch():
    def fn(old, rollout, mask):
        if int((mask != 0).sum()) == 0:
            raise ZeroDivisionError("float division by zero")
        return reference_metrics("token", 2.0)(old, rollout, mask)

    batch = {
        "old_log_probs": torch.tensor([[-0.5, -1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-0.25, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    with finds("metrics.degenerate_batch") as caught:
        invariants.check_rollout_corr_metrics(fn, batch, level="token", threshold=2.0)
    message = str(caught.value)
    assert "ZeroDivisionError: float division by zero" in message
    assert "no token is valid" in message
    assert "(1, 2) batch with 0 valid tokens" in message


def test_finds_clipfrac_counting_padding():
    def fn(b):
        _, metrics = ref.policy_loss(
            b["log_probs"], b["old_log_probs"], b["advantages"], torch.ones_like(b["response_mask"])
        )
        return metrics

    @hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_ppo_metrics(fn, batch)

    with finds("ppo_metrics.reference_agreement"):
        run()


def test_finds_ppo_kl_with_the_wrong_sign():
    def fn(b):
        _, metrics = ref.policy_loss(
            b["log_probs"], b["old_log_probs"], b["advantages"], b["response_mask"]
        )
        metrics["actor/ppo_kl"] = -metrics["actor/ppo_kl"]
        return metrics

    @hunt
    @given(rollout_batches())
    def run(batch):
        invariants.check_ppo_metrics(fn, batch)

    with finds("ppo_metrics.reference_agreement"):
        run()
