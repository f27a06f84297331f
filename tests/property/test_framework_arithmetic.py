"""The checkers on functions with the arithmetic of AReaL, slime, ROLL, NeMo-RL and TRL (GAE,
rejection sampling, IS weights, whitening): correct ones pass, known defects are caught by name."""

from __future__ import annotations

import functools

import frameworks as fw
import guarded
import pytest
import torch
from hunting import finds, hunt, passes
from hypothesis import given, strategies as st

from pytest_rollout_golden import invariants, reference as ref
from pytest_rollout_golden.strategies import (
    is_thresholds,
    rollout_batches,
    rs_configs,
    value_batches,
)

DTYPES = [torch.float64, torch.float32, torch.bfloat16]

# --------------------------------------------------------------------------- RS, exact statistics


def test_exact_sequence_sum_is_accepted():
    # Log ratios 25 and -24 sum to 1 (ratio e = 2.72 > 2: dropped); clamped to ±20 first they
    # sum to 0 (kept). ROLL aggregates the exact values.
    batch = {
        "old_log_probs": torch.tensor([[-0.5, -25.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-25.5, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    assert not bool(
        fw.roll_rs_mask(*batch.values(), criterion="seq_sum_k1", threshold="0.5_2.0").any()
    )
    invariants.check_rs_mask(fw.roll_rs_mask, batch, criterion="seq_sum_k1", threshold="0.5_2.0")


def test_mixed_conventions_in_one_rs_batch_are_caught():
    batch = {
        "old_log_probs": torch.tensor([[-0.5, -25.0], [-0.5, -25.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-25.5, -1.0], [-25.5, -1.0]], dtype=torch.float64),
        "response_mask": torch.ones(2, 2, dtype=torch.bool),
    }

    def mixed(old, rollout, mask):
        exact = fw.roll_rs_mask(old, rollout, mask, criterion="seq_sum_k1", threshold="0.5_2.0")
        clamped, _ = ref.compute_rs_mask(
            old, rollout, mask, criterion="seq_sum_k1", threshold="0.5_2.0"
        )
        return torch.cat([exact[:1], clamped[1:]])

    with finds("rs_mask.reference_agreement") as caught:
        invariants.check_rs_mask(mixed, batch, criterion="seq_sum_k1", threshold="0.5_2.0")
    assert "exact" in str(caught.value)


@passes(200)
@given(rollout_batches(dtype=DTYPES), rs_configs(max_parts=2, one_sided=True))
def test_roll_rs_mask_passes(batch, config):
    invariants.check_rs_mask(fw.roll_rs_mask, batch, criterion=config[0], threshold=config[1])


# --------------------------------------------------------------------------- IS, exp underflow


def test_exact_weight_that_underflows_is_accepted():
    # exp(-750) is 0 in float64; clamping the exponent at -700 would give 9.9e-305.
    batch = {
        "old_log_probs": torch.tensor([[-751.0, -1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }

    def exact(old, rollout, mask):
        return (old - rollout).exp() * mask

    assert float(exact(*batch.values())[0, 0]) == 0.0
    invariants.check_is_weights(exact, batch, level="token", threshold=None)


@passes(200)
@given(
    rollout_batches(),
    st.sampled_from(ref.IS_LEVELS),
    st.one_of(st.none(), is_thresholds()),
    st.booleans(),
)
def test_exact_is_weights_with_huge_log_ratios_pass(batch, level, threshold, normalize):
    fn = guarded.is_weights(level, threshold, normalize, delta=1e-8, clamp=False)
    invariants.check_is_weights(
        fn, fw.scaled_down(batch, 30.0), level=level, threshold=threshold, batch_normalize=normalize
    )


# --------------------------------------------------------------------------- GAE and whitening


def test_nemo_guarded_whitening_of_equal_advantages_passes():
    # Every advantage 0.5 (one token per row, r - V = 0.5): the reference whitens to 0; the
    # +1e-8 guard of a float mask's count leaves 0.5·1e-8/10 that sqrt(1e-8) turns into 5e-6.
    batch = {
        "token_level_rewards": torch.full((10, 1), 0.5, dtype=torch.float64),
        "values": torch.zeros(10, 1, dtype=torch.float64),
        "response_mask": torch.ones(10, 1, dtype=torch.float64),
    }
    fn = fw.whitened(fw.areal_gae, fw.nemo_whiten)
    assert float(fn(*batch.values())[0].abs().max()) > 4e-6
    invariants.check_gae(fn, batch, gamma=1.0, lam=0.95, whiten=True)


def test_nemo_whitening_of_one_valid_token_is_named():
    batch = {
        "token_level_rewards": torch.tensor([[0.0, 0.0]], dtype=torch.float32),
        "values": torch.tensor([[0.0, 3.0]], dtype=torch.float32),
        "response_mask": torch.tensor([[True, False]]),
    }
    fn = fw.whitened(fw.areal_gae, fw.nemo_whiten)
    assert bool(fn(*batch.values())[0].isnan().any())
    with finds("gae.whiten_single_token") as caught:
        invariants.check_gae(fn, batch, gamma=1.0, lam=0.95, whiten=True)
    assert "NaN from whitening a single valid token" in str(caught.value)
    assert "n - 1 = 0" in str(caught.value)


def test_roll_gae_bootstraps_the_padding_value():
    # The row: reward 1, V = [0, 5] with 5 in the padding column, gamma 1, lambda 0.95.
    batch = {
        "token_level_rewards": torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        "values": torch.tensor([[0.0, 5.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, False]]),
    }
    advantages, _ = fw.roll_gae_defect(*batch.values())
    assert float(advantages[0, 0]) == pytest.approx(1.25)
    assert float(ref.gae_advantages(*batch.values(), gamma=1.0, lam=0.95)[0][0, 0]) == 1.0
    with finds("gae.reference_agreement") as caught:
        invariants.check_gae(fw.roll_gae_defect, batch, gamma=1.0, lam=0.95)
    assert "fn=1.25, reference=1" in str(caught.value)
    assert "unmasked" in str(caught.value)


def test_roll_gae_defect_is_found():
    @hunt
    @given(value_batches(holes=False, padding="right"))
    def run(batch):
        invariants.check_gae(fw.roll_gae_defect, batch, gamma=1.0, lam=0.95)

    with finds("gae.reference_agreement"):
        run()


def test_roll_gae_is_found_on_a_batch_of_masked_values():
    # ROLL stores the masked values in its batch, so the batch's padding holds zeros there;
    # its GAE still reads the critic's output at the padding column.
    batch = {
        "token_level_rewards": torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        "values": torch.tensor([[0.0, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, False]]),
    }
    with finds("gae.unmasked_values") as caught:
        invariants.check_gae(fw.roll_gae_defect, batch, gamma=1.0, lam=0.95)
    assert "(b=0, t=0)" in str(caught.value)
    assert "critic" in str(caught.value)


def test_roll_gae_defect_is_found_without_garbage_in_the_batch():
    @hunt
    @given(value_batches(holes=False, padding="right", garbage=False))
    def run(batch):
        invariants.check_gae(fw.roll_gae_defect, batch, gamma=1.0, lam=0.95)

    with finds("gae.unmasked_values"):
        run()


GAE_ON_ZEROS = {
    "roll-masked-values": (fw.roll_gae, {"holes": False}, {}),
    "areal": (fw.areal_gae, {}, {}),
    "slime-steps": (fw.slime_gae, {"hole_values": True}, {"masked_tokens": "step"}),
}


@pytest.mark.parametrize("name", sorted(GAE_ON_ZEROS))
def test_gae_that_masks_its_values_passes_on_zero_padding(name):
    # gae.unmasked_values gives the padding values only where the batch holds zeros there.
    fn, draw, check = GAE_ON_ZEROS[name]

    @passes(100)
    @given(value_batches(garbage=False, dtype=DTYPES, **draw), st.sampled_from([0.9, 1.0]))
    def run(batch, gamma):
        gae = functools.partial(fn, gamma=gamma, lam=0.95)
        invariants.check_gae(gae, batch, gamma=gamma, lam=0.95, **check)

    run()


def test_slime_gae_steps_through_masked_tokens():
    # One row [valid, masked, valid]: slime steps through the middle token with its value.
    batch = {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
        "values": torch.tensor([[0.5, 2.0, 0.25]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, False, True]]),
    }
    invariants.check_gae(fw.slime_gae, batch, gamma=1.0, lam=0.95, masked_tokens="step")
    with finds("gae.reference_agreement") as caught:
        invariants.check_gae(fw.slime_gae, batch, gamma=1.0, lam=0.95)
    assert "masked tokens inside responses are skipped" in str(caught.value)
    with finds("gae.reference_agreement"):
        invariants.check_gae(fw.areal_gae, batch, gamma=1.0, lam=0.95, masked_tokens="step")


def test_missing_fields_name_the_strategy():
    batch = {"response_mask": torch.ones(1, 2, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"check_gae needs batch fields \['token_level_rewards'"):
        invariants.check_gae(fw.areal_gae, batch, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match=r"value_batches\(\)"):
        invariants.check_gae(fw.areal_gae, batch, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match=r"check_rs_mask needs .*rollout_batches\(\)"):
        invariants.check_rs_mask(fw.roll_rs_mask, batch, criterion="token_k1", threshold=2.0)
    with pytest.raises(ValueError, match=r"check_is_weights needs .*'old_log_probs'"):
        invariants.check_is_weights(lambda *a: a[2], batch, level="token", threshold=None)
    with pytest.raises(ValueError, match=r"check_advantages needs .*'uid'.*reward_batches"):
        invariants.check_advantages(
            lambda r, m, u: r, {**batch, "token_level_rewards": torch.zeros(1, 2)}, estimator="grpo"
        )


# --------------------------------------------------------------------------- composites


@passes(100)
@given(rollout_batches(dtype=DTYPES), st.integers(9, 48), st.integers(2, 15), st.integers(9, 32))
def test_nemo_seq_mask_tis_passes(batch, truncation, lower, upper):
    fn = fw.nemo_seq_mask_tis(truncation / 8, lower / 16, upper / 8)
    invariants.check_is_weights(
        fn,
        batch,
        level="token",
        threshold=truncation / 8,
        rs_filter=("seq_mean_k1", f"{lower / 16!r}_{upper / 8!r}"),
    )


@passes(100)
@given(rollout_batches(dtype=DTYPES), st.integers(2, 15), st.integers(9, 32))
def test_areal_agg_sum_passes(batch, lower, upper):
    fn = fw.areal_agg_sum(lower / 16, upper / 8)
    invariants.check_is_weights(
        fn,
        batch,
        level="geometric",
        threshold=None,
        rs_filter=("seq_sum_k1", f"{lower / 16!r}_{upper / 8!r}"),
    )


def test_composites_with_the_wrong_filter_are_caught():
    @hunt
    @given(rollout_batches())
    def nemo(batch):
        fn = fw.nemo_seq_mask_tis(2.0, 0.5, 1.5, aggregate="sum")
        invariants.check_is_weights(
            fn, batch, level="token", threshold=2.0, rs_filter=("seq_mean_k1", "0.5_1.5")
        )

    @hunt
    @given(rollout_batches())
    def areal(batch):
        fn = fw.areal_agg_sum(0.5, 1.5, aggregate="mean")
        invariants.check_is_weights(
            fn, batch, level="geometric", threshold=None, rs_filter=("seq_sum_k1", "0.5_1.5")
        )

    for run in (nemo, areal):
        with finds("is_weights.reference_agreement"):
            run()


@passes(100)
@given(
    rollout_batches(dtype=DTYPES),
    st.sampled_from(ref.IS_LEVELS),
    is_thresholds(truncation=False, one_sided=True),
    st.booleans(),
)
def test_one_sided_icepop_passes(batch, level, threshold, normalize):
    fn = guarded.is_weights(level, threshold, normalize, delta=1e-8)
    invariants.check_is_weights(
        fn, batch, level=level, threshold=threshold, batch_normalize=normalize
    )


def test_one_sided_icepop_keeps_everything_below_the_upper_bound():
    batch = {
        "old_log_probs": torch.tensor([[-9.0, -1.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    weights, _ = ref.compute_is_weights(*batch.values(), threshold="0_2.0")
    assert float(weights[0, 0]) == pytest.approx(torch.exp(torch.tensor(-8.0)).item())
    assert float(weights[0, 1]) == 0.0  # ratio e > 2
    two_sided = guarded.is_weights("token", "0.5_2.0", False, delta=0.0)
    with finds("is_weights.reference_agreement"):
        invariants.check_is_weights(two_sided, batch, level="token", threshold="0_2.0")


def test_reinforce_baseline_whitening_of_one_valid_token_is_named():
    batch = {
        "token_level_rewards": torch.tensor([[0.5, 0.0]]),
        "response_mask": torch.tensor([[True, False]]),
        "uid": torch.tensor([0]),
    }

    def fn(rewards, mask, uid):
        scores = (rewards * mask).sum(dim=-1, keepdim=True)  # a singleton keeps its score
        return fw.nemo_whiten(scores.expand_as(rewards), mask)

    with finds("advantages.whiten_single_token"):
        invariants.check_advantages(fn, batch, estimator="reinforce_baseline")
