"""Correct code the checkers used to flag (issue 18): exact IS weights beyond the ±20 clamp,
and float32 advantages whose rounding depends on the row order."""

from __future__ import annotations

import guarded
import torch
from hunting import passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.strategies import is_thresholds, rollout_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]

passes = passes_settings(100)


@passes
@given(
    rollout_batches(dtype=DTYPES),
    st.sampled_from(ref.IS_LEVELS),
    st.one_of(st.none(), is_thresholds()),
    st.booleans(),
    st.sampled_from([1e-8, 1e-6]),
)
def test_exact_is_weights_pass(batch, level, threshold, normalize, delta):
    fn = guarded.is_weights(level, threshold, normalize, delta=delta, clamp=False)
    invariants.check_is_weights(
        fn, batch, level=level, threshold=threshold, batch_normalize=normalize
    )


def test_exact_weight_at_log_weight_minus_25_is_accepted():
    # The example: exp(-25) = 1.38879e-11 where the reference clamps to exp(-20).
    batch = {
        "old_log_probs": torch.tensor([[-25.5, -1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-0.5, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }

    def exact(old, rollout, mask):
        return (old - rollout).exp().clamp(max=2.0) * mask

    assert abs(float(exact(*batch.values())[0, 0]) - 1.38879e-11) < 1e-15
    invariants.check_is_weights(exact, batch, level="token", threshold=2.0)


def test_clamped_and_exact_weights_mixed_in_one_batch_are_caught():
    # Either convention, but one for the whole batch: a token clamped at -20 next to a
    # sequence computed exactly is no implementation's output.
    batch = {
        "old_log_probs": torch.tensor([[-25.5], [-30.5]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-0.5], [-0.5]], dtype=torch.float64),
        "response_mask": torch.tensor([[True], [True]]),
    }

    def mixed(old, rollout, mask):
        log_w = old - rollout
        return torch.cat([log_w[:1].clamp(-20, 20).exp(), log_w[1:].exp()]) * mask

    try:
        invariants.check_is_weights(mixed, batch, level="token", threshold=None)
    except AssertionError as error:
        assert "[is_weights.reference_agreement]" in str(error)
        assert "or the exact exp(log w)" in str(error)
    else:
        raise AssertionError("a batch mixing both conventions passed")


def order_dependent_grpo(rewards, mask, uid):
    """GRPO off by a relative 8e-4 whose sign depends on the row's position: each value is
    within a 1e-3 tolerance of the reference, but reversed rows move by 1.6e-3."""
    advantages = ref.grpo_advantages(rewards, mask, uid)
    sign = 1.0 - 2.0 * (torch.arange(rewards.shape[0], dtype=rewards.dtype) % 2)
    return advantages * (1 + 8e-4 * sign).unsqueeze(-1)


def test_row_order_compares_with_the_reference_not_with_itself():
    batch = {
        "token_level_rewards": torch.tensor([[1.0], [0.0], [0.5], [0.2]], dtype=torch.float64),
        "response_mask": torch.ones(4, 1, dtype=torch.bool),
        "uid": torch.tensor([0, 0, 1, 1]),
    }
    invariants.check_advantages(order_dependent_grpo, batch, estimator="grpo", rtol=1e-3, atol=0.0)
    invariants.check_advantages(
        order_dependent_grpo,
        batch,
        estimator="grpo",
        rtol=1e-3,
        atol=0.0,
        variant=ref.grpo_advantages,
    )


@passes
@given(rollout_batches(dtype=DTYPES), st.sampled_from(["token", "sequence"]), is_thresholds())
def test_metrics_of_exact_weights_pass(batch, level, threshold):
    def fn(old, rollout, mask):
        _, metrics = ref.compute_is_weights(
            old, rollout, mask, level=level, threshold=threshold, clamp=False
        )
        metrics.update(ref.offpolicy_metrics(old, rollout, mask, clamp=False))
        return metrics

    invariants.check_rollout_corr_metrics(
        fn, batch, level=level, threshold=threshold, degenerate=False
    )


def test_metrics_of_exact_weights_at_log_weight_25():
    batch = {
        "old_log_probs": torch.tensor([[-0.5, -1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-25.5, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }

    def fn(old, rollout, mask):
        w = (old - rollout).exp()
        return {"rollout_is_max": float(w.max()), "rollout_is_mean": float(w.mean())}

    invariants.check_rollout_corr_metrics(
        fn, batch, level="token", threshold=None, degenerate=False
    )
