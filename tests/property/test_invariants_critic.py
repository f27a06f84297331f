"""The value-loss reference against a float64 formula written per token, and
``check_value_loss`` on correct and deliberately broken critic losses."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_value_loss
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import critic_batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MODES = st.sampled_from(ref.AGG_MODES)
CLIPS = st.sampled_from([None, 0.2, 0.5])
SCALE = 16.0  # fixed loss_scale_factor for seq-mean-token-sum-norm

passes = passes_settings(60)


def value_loss(mode="token-mean", clip=0.5, normalize="global"):
    """A verl-style critic loss. ``normalize``: ``"global"`` divides by the step's counts (verl
    after #6957), ``"local"`` by the micro-batch's own (verl #6957), ``"local_mean"`` by the
    micro-batch's own and then by the number of micro-batches (verl 0.7.1's dp_critic)."""

    def loss_fn(batch, *, global_tokens, global_seqs, dp_size=1, n_micro_batches=1):
        counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
        if normalize != "global":
            counts = {}
        loss, _ = ref.value_loss(
            batch["vpreds"],
            batch["values"],
            batch["returns"],
            batch["response_mask"],
            cliprange_value=clip,
            agg_mode=mode,
            loss_scale_factor=SCALE if mode == "seq-mean-token-sum-norm" else None,
            **counts,
        )
        if normalize == "local_mean":
            loss = loss / n_micro_batches
        return loss * dp_size

    return loss_fn


def check(fn, batch, *, mode="token-mean", clip=0.5, **options):
    scale = SCALE if mode == "seq-mean-token-sum-norm" else None
    check_value_loss(
        fn, batch, cliprange_value=clip, agg_mode=mode, loss_scale_factor=scale, **options
    )


# --------------------------------------------------------------------------- reference


def test_reference_matches_a_per_token_formula():
    vpreds = torch.tensor([[1.0, 0.0, 2.0, 9.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.5, 1.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    # token 0: v - V = 0.5 > c = 0.2, v_clip = 0.7: max(1, 0.49) -> 1, not clipped
    # token 1: v - V = -0.5, v_clip = 0.3: max(1, 0.49) -> 1
    # token 2: v - V = 1, v_clip = 1.2: max(1, 0.04) -> 1
    losses, clipped = ref.value_token_losses(vpreds, values, returns, cliprange_value=0.2)
    assert losses[0, :3].tolist() == [0.5, 0.5, 0.5]
    assert not bool(clipped.any())
    # v = 1, V = 0, R = 1.5, c = 0.2: v_clip = 0.2, (0.2 - 1.5)² = 1.69 > 0.25: clipped
    one = torch.tensor([[1.0]], dtype=torch.float64)
    losses, clipped = ref.value_token_losses(one, one * 0, one * 1.5, cliprange_value=0.2)
    assert float(losses) == pytest.approx(0.5 * 1.69)
    assert bool(clipped.all())
    loss, metrics = ref.value_loss(vpreds, values, returns, mask, cliprange_value=0.2)
    assert float(loss) == 0.5
    assert metrics == {"critic/vf_clipfrac": 0.0}


def test_a_prediction_within_the_clip_range_is_never_counted_clipped():
    """Inside ``values ± c`` the clipped prediction is the prediction: the two terms tie, even
    where ``values + (vpreds - values)`` rounds off ``vpreds`` (here by one ulp, away from the
    return), as verl's ``clip_by_value`` never does."""
    vpreds, values, returns = (
        torch.tensor([[x]], dtype=torch.float64) for x in (-0.465, -0.148, 0.378)
    )
    assert float(values + (vpreds - values)) != -0.465
    losses, clipped = ref.value_token_losses(vpreds, values, returns, cliprange_value=0.5)
    assert not bool(clipped.any())
    assert float(losses) == pytest.approx(0.5 * 0.843**2, rel=1e-15)


@passes
@given(critic_batches(), CLIPS)
def test_reference_token_losses_match_a_loop(batch, clip):
    losses, clipped = ref.value_token_losses(
        batch["vpreds"], batch["values"], batch["returns"], cliprange_value=clip
    )
    for (b, t), loss in zip(
        [(b, t) for b in range(losses.shape[0]) for t in range(losses.shape[1])],
        losses.flatten().tolist(),
        strict=True,
    ):
        v, old, ret = (float(batch[k][b, t]) for k in ("vpreds", "values", "returns"))
        bound = v if clip is None else min(max(v, old - clip), old + clip)
        assert loss == pytest.approx(0.5 * max((v - ret) ** 2, (bound - ret) ** 2), abs=1e-12)
        assert bool(clipped[b, t]) == ((bound - ret) ** 2 > (v - ret) ** 2)


@passes
@given(critic_batches(), MODES)
def test_reference_aggregates_as_the_policy_loss_does(batch, mode):
    mask = batch["response_mask"]
    losses, _ = ref.value_token_losses(batch["vpreds"], batch["values"], batch["returns"])
    loss, metrics = ref.value_loss(*batch.values(), agg_mode=mode)
    assert float(loss) == pytest.approx(float(ref.aggregate_loss(losses, mask, mode)), rel=1e-12)
    assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0
    assert as_bool_mask(mask).any()


# --------------------------------------------------------------------------- correct losses


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_loss_passes(dtype):
    @passes
    @given(critic_batches(dtype=dtype), MODES, CLIPS, st.integers(2, 3), st.integers(1, 2))
    def run(batch, mode, clip, n_splits, dp_size):
        check(value_loss(mode, clip), batch, mode=mode, clip=clip, n_splits=n_splits,
              dp_size=dp_size)  # fmt: skip

    run()


def test_mean_of_local_means_passes_when_micro_batches_hold_equal_token_counts():
    # Every row has 2 valid tokens: two micro-batches of one row each hold equal counts.
    batch = {
        "vpreds": torch.tensor([[0.5, 1.0, 0.0], [0.25, -1.0, 0.0]], dtype=torch.float64),
        "values": torch.tensor([[0.0, 1.0, 0.0], [0.0, -0.5, 0.0]], dtype=torch.float64),
        "returns": torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True, False], [True, True, False]]),
    }
    check(value_loss(normalize="local_mean"), batch)


# --------------------------------------------------------------------------- broken losses


def hunt_value(fn, mode="token-mean", clip=0.5, **options):
    @hunt
    @given(critic_batches(min_batch=2, **options))
    def run(batch):
        check(fn, batch, mode=mode, clip=clip)

    return run


def test_finds_per_micro_batch_normalization():
    # verl #6957: each micro-batch divided by its own token count, the pieces summed.
    with finds("value_loss.micro_batch_invariance") as caught:
        hunt_value(value_loss(normalize="local"))()
    assert "normalized by its own token/sequence counts" in str(caught.value)
    assert "verl #6957" in str(caught.value)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_per_micro_batch_normalization_scales_the_gradient(mode):
    # Two rows of equal length, one micro-batch each: the summed loss is exactly twice.
    batch = {
        "vpreds": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64),
        "values": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64),
        "returns": torch.tensor([[0.0, 0.0], [0.0, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True], [True, True]]),
    }
    with finds("value_loss.micro_batch_invariance") as caught:
        check(value_loss(mode, normalize="local"), batch, mode=mode)
    assert "ratio 2" in str(caught.value)


def test_finds_the_mean_of_local_means_on_ragged_micro_batches():
    with finds("value_loss.micro_batch_invariance") as caught:
        hunt_value(value_loss(normalize="local_mean"))()
    assert "1/n_micro_batches" in str(caught.value)


def test_finds_min_instead_of_max():
    def fn(batch, **counts):
        vpreds, values, returns = batch["vpreds"], batch["values"], batch["returns"]
        bound = values + (vpreds - values).clamp(-0.5, 0.5)
        losses = 0.5 * torch.minimum((vpreds - returns) ** 2, (bound - returns) ** 2)
        return ref.aggregate_loss(
            losses, batch["response_mask"], global_tokens=counts["global_tokens"]
        )

    with pytest.raises(AssertionError, match=r"\[value_loss\.(gradient_sign|reference_agreement)"):
        hunt_value(fn)()


def test_finds_a_missing_clip():
    with finds("value_loss.clipped_gradient"):
        hunt_value(value_loss(clip=None), clip=0.2)()


def test_finds_a_missing_half():
    def fn(batch, **counts):
        return 2 * value_loss()(batch, **counts)

    with finds("value_loss.reference_agreement"):
        hunt_value(fn, garbage=False)()


def test_finds_the_clip_centred_on_the_returns():
    def fn(batch, *, global_tokens, global_seqs):
        vpreds, returns = batch["vpreds"], batch["returns"]
        bound = returns + (vpreds - returns).clamp(-0.5, 0.5)
        losses = 0.5 * torch.maximum((vpreds - returns) ** 2, (bound - returns) ** 2)
        return ref.aggregate_loss(losses, batch["response_mask"], global_tokens=global_tokens)

    with pytest.raises(AssertionError, match=r"\[value_loss\.(clipped_gradient|reference_agree)"):
        hunt_value(fn)()


def test_finds_an_unmasked_mean():
    def fn(batch, *, global_tokens, global_seqs):
        losses, _ = ref.value_token_losses(batch["vpreds"], batch["values"], batch["returns"])
        return losses.sum() / global_tokens

    with pytest.raises(AssertionError, match=r"\[value_loss\.(padding_gradient|reference_agree)"):
        hunt_value(fn)()


def test_missing_fields_are_named():
    with pytest.raises(ValueError, match=r"check_value_loss needs batch fields \['vpreds'"):
        check_value_loss(value_loss(), {"response_mask": torch.ones(1, 1, dtype=torch.bool)})
