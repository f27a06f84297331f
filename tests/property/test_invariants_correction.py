"""The IS / RS checkers pass the reference and catch deliberately broken implementations."""

from __future__ import annotations

import math

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import find, given, settings, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_is_weights, check_rs_mask
from pytest_rollout_golden.reference.masking import as_bool_mask, masked_sum
from pytest_rollout_golden.strategies import (
    is_thresholds,
    rollout_batches,
    rs_configs,
    rs_thresholds,
)

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
LEVELS = st.sampled_from(["token", "sequence"])

passes = passes_settings(150)


def reference_is(level, threshold, batch_normalize):
    def fn(old, rollout, mask):
        return ref.compute_is_weights(
            old, rollout, mask, level=level, threshold=threshold, batch_normalize=batch_normalize
        )

    return fn


def reference_rs(old, rollout, mask, *, criterion, threshold):
    return ref.compute_rs_mask(old, rollout, mask, criterion=criterion, threshold=threshold)


# --------------------------------------------------------------------------- reference passes


@passes
@given(rollout_batches(dtype=DTYPES), LEVELS, is_thresholds(), st.booleans())
def test_reference_is_weights_pass(batch, level, threshold, normalize):
    fn = reference_is(level, threshold, normalize)
    check_is_weights(fn, batch, level=level, threshold=threshold, batch_normalize=normalize)


@passes
@given(rollout_batches(dtype=DTYPES), rs_configs(max_parts=3))
def test_reference_rs_mask_passes_with_keywords(batch, config):
    criterion, threshold = config
    check_rs_mask(reference_rs, batch, criterion=criterion, threshold=threshold)


@passes
@given(rollout_batches(dtype=DTYPES), rs_configs())
def test_reference_rs_mask_passes_as_plain_function(batch, config):
    criterion, threshold = config

    def fn(old, rollout, mask):
        return reference_rs(old, rollout, mask, criterion=criterion, threshold=threshold)

    check_rs_mask(fn, batch, criterion=criterion, threshold=threshold)


def test_no_truncation_threshold_passes():
    batch = {
        "old_log_probs": torch.tensor([[-1.0, -0.5, 9.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-4.0, -0.25, -3.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 1, 0]]),
    }
    fn = reference_is("token", None, False)
    check_is_weights(fn, batch, level="token", threshold=None)


# --------------------------------------------------------------------------- IS bugs


def seq_is_summing_padding(old, rollout, mask):
    """Bug: sums the log ratio over all T positions, padding garbage included."""
    total = (old - rollout).sum(dim=-1, keepdim=True).clamp(-20, 20)
    weights = total.exp().expand_as(old).clamp(max=2.0)
    return weights * as_bool_mask(mask)


def test_finds_sequence_is_summing_padding():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(seq_is_summing_padding, batch, level="sequence", threshold=2.0)

    # Garbage either moves the weights (padding_independence) or saturates them the same way
    # for both garbage fillings (reference_agreement).
    with pytest.raises(
        AssertionError, match=r"\[is_weights\.(padding_independence|reference_agreement)\]"
    ):
        run()


def test_sequence_is_summing_padding_is_invisible_with_zero_padding():
    # Why the strategies put garbage in padding: with zeros there the bug computes the
    # right numbers and no checker can see it.
    @passes
    @given(rollout_batches(garbage=False))
    def run(batch):
        check_is_weights(seq_is_summing_padding, batch, level="sequence", threshold=2.0)

    run()


def seq_is_normalized_by_token_mean(old, rollout, mask):
    """Bug: sequence-level weights normalized by the token-level mean."""
    weights, _ = ref.compute_is_weights(old, rollout, mask, level="sequence", threshold=2.0)
    return weights / ref.masked_mean(weights, mask)


def test_finds_sequence_is_normalized_by_token_mean():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(
            seq_is_normalized_by_token_mean,
            batch,
            level="sequence",
            threshold=2.0,
            batch_normalize=True,
        )

    with finds("is_weights.normalized_mean"):
        run()


def test_finds_normalization_before_truncation():
    def fn(old, rollout, mask):
        weights = ref.raw_is_weights(old, rollout, mask, level="token")
        weights, _ = ref.normalize_is_weights(weights, mask, level="token")
        return weights.clamp(max=2.0)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=2.0, batch_normalize=True)

    with pytest.raises(AssertionError, match=r"\[is_weights\.(normalized_mean|truncation)\]"):
        run()


def test_finds_missing_truncation():
    def fn(old, rollout, mask):
        return ref.raw_is_weights(old, rollout, mask, level="token")

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=2.0)

    with finds("is_weights.truncation"):
        run()


def test_finds_icepop_that_clamps_instead_of_zeroing():
    def fn(old, rollout, mask):
        raw = ref.raw_is_weights(old, rollout, mask, level="token")
        return ref.masked_fill_zero(raw.clamp(0.5, 2.0), mask)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold="0.5_2.0")

    # Clamped weights stay inside the bounds; only the comparison with IcePop's zeros sees it.
    with finds("is_weights.reference_agreement"):
        run()


def test_finds_icepop_weights_outside_bounds():
    def fn(old, rollout, mask):  # the IcePop threshold is never applied
        return ref.raw_is_weights(old, rollout, mask, level="token")

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold="0.5_2.0")

    with finds("is_weights.icepop_bounds"):
        run()


def test_exact_weights_without_the_safety_clamp_pass():
    # exp(25) instead of exp(20): the exact weight, as most frameworks compute it (issue 18).
    def fn(old, rollout, mask):
        return ref.masked_fill_zero((old - rollout).exp(), mask).clamp(max=1e12)

    @passes
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=1e12)

    run()


def test_finds_exp_of_unmasked_padding():
    # Without the clamp, exponentiating garbage before masking overflows: inf · 0 is nan. Only
    # on the opt-in garbage: padding log-probs of a model are ≤ 0, and their exp is finite.
    def fn(old, rollout, mask):
        return (old - rollout).exp() * mask

    @hunt
    @given(rollout_batches(garbage="extreme"))
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=None)

    with finds("is_weights.finite") as caught:
        run()
    assert "likely cause: exp of unmasked padding" in str(caught.value)


def test_finds_weights_left_on_padding():
    def fn(old, rollout, mask):
        return (old - rollout).clamp(-20, 20).exp().clamp(max=2.0)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=2.0)

    with finds("is_weights.zero_on_padding"):
        run()


# --------------------------------------------------------------------------- RS bugs


def reciprocal_k1(old, rollout, mask, *, criterion, threshold):
    """verl's code: compares -log ρ with [log lower, log upper]: keeps 1/upper ≤ ρ ≤ 1/lower."""
    (item,) = ref.parse_rs_criteria(criterion, threshold)
    k1 = -(old - rollout).clamp(-20, 20)
    keep = (k1 >= math.log(item.lower)) & (k1 <= math.log(item.upper))
    return keep & as_bool_mask(mask)


def test_finds_reciprocal_k1_bounds():
    @hunt
    @given(rollout_batches(), rs_thresholds("token_k1"))
    def run(batch, threshold):
        check_rs_mask(reciprocal_k1, batch, criterion="token_k1", threshold=threshold)

    with finds("rs_mask.reference_agreement") as caught:
        run()
    assert "reciprocal" in str(caught.value)


def test_reciprocal_k1_bounds_hide_behind_symmetric_thresholds():
    # "0.5_2.0" is its own reciprocal: the buggy and the correct criterion coincide, which
    # is why the strategies draw asymmetric k1 bounds.
    @passes
    @given(rollout_batches())
    def run(batch):
        check_rs_mask(reciprocal_k1, batch, criterion="token_k1", threshold="0.5_2.0")

    run()


def test_reciprocal_k1_bug_shrinks_to_a_small_example():
    def broken(batch):
        try:
            check_rs_mask(reciprocal_k1, batch, criterion="token_k1", threshold="0.6_1.6")
        except AssertionError:
            return True
        return False

    example = find(
        rollout_batches(),
        broken,
        settings=settings(derandomize=True, database=None, max_examples=300, deadline=None),
    )
    valid = as_bool_mask(example["response_mask"])
    assert example["response_mask"].shape[0] == 1
    assert int(valid.sum()) == 1
    ratio = math.exp(float((example["old_log_probs"] - example["rollout_log_probs"])[valid]))
    # The minimal witness lies between a bound and its reciprocal.
    assert 0.6 <= ratio < 1 / 1.6 or 1.6 < ratio <= 1 / 0.6


def test_finds_sequence_criterion_applied_per_token():
    def fn(old, rollout, mask, *, criterion, threshold):
        (item,) = ref.parse_rs_criteria(criterion, threshold)
        k2 = 0.5 * (old - rollout).clamp(-20, 20).square()
        return (k2 <= item.upper) & as_bool_mask(mask)

    @hunt
    @given(rollout_batches(), rs_thresholds("seq_max_k2"))
    def run(batch, threshold):
        check_rs_mask(fn, batch, criterion="seq_max_k2", threshold=threshold)

    with finds("rs_mask.whole_sequences"):
        run()


def test_finds_mask_keeping_padding():
    def fn(old, rollout, mask, *, criterion, threshold):
        keep, _ = reference_rs(old, rollout, mask, criterion=criterion, threshold=threshold)
        return keep | ~as_bool_mask(mask)

    @hunt
    @given(rollout_batches(), rs_configs())
    def run(batch, config):
        check_rs_mask(fn, batch, criterion=config[0], threshold=config[1])

    with finds("rs_mask.subset_of_response_mask"):
        run()


def test_finds_sequence_sum_over_padding():
    def fn(old, rollout, mask, *, criterion, threshold):
        (item,) = ref.parse_rs_criteria(criterion, threshold)
        stat = (0.5 * (old - rollout).clamp(-20, 20).square()).sum(dim=-1, keepdim=True)
        return (stat <= item.upper).expand_as(old) & as_bool_mask(mask)

    @hunt
    @given(rollout_batches(), rs_thresholds("seq_sum_k2"))
    def run(batch, threshold):
        check_rs_mask(fn, batch, criterion="seq_sum_k2", threshold=threshold)

    # Either the garbage flips a decision, or it decides every row the same wrong way.
    with pytest.raises(
        AssertionError, match=r"\[rs_mask\.(padding_independence|reference_agreement)\]"
    ):
        run()


def test_finds_union_instead_of_intersection():
    def fn(old, rollout, mask, *, criterion, threshold):
        keep = torch.zeros_like(as_bool_mask(mask))
        for item in ref.parse_rs_criteria(criterion, threshold):
            part, _ = reference_rs(old, rollout, mask, criterion=item.name, threshold=item.spec())
            keep |= part != 0
        return keep

    @hunt
    @given(rollout_batches(), rs_configs(max_parts=2).filter(lambda c: "," in c[0]))
    def run(batch, config):
        check_rs_mask(fn, batch, criterion=config[0], threshold=config[1])

    with finds("rs_mask.reference_agreement"):
        run()


def test_finds_inconsistent_combination_through_the_keywords():
    # Combined criteria computed right, single criteria computed wrong (k3 sign flipped):
    # only the intersection invariant compares the function with itself.
    def fn(old, rollout, mask, *, criterion, threshold):
        if "," in criterion:
            return reference_rs(old, rollout, mask, criterion=criterion, threshold=threshold)
        return reference_rs(rollout, old, mask, criterion=criterion, threshold=threshold)

    @hunt
    @given(rollout_batches(), rs_thresholds("token_k3,seq_mean_k3"))
    def run(batch, threshold):
        check_rs_mask(fn, batch, criterion="token_k3,seq_mean_k3", threshold=threshold)

    with finds("rs_mask.intersection"):
        run()


def test_finds_non_monotone_mask():
    # Keeps tokens whose divergence is *above* the bound: the halfway move drops them.
    def fn(old, rollout, mask, *, criterion, threshold):
        (item,) = ref.parse_rs_criteria(criterion, threshold)
        k3 = torch.expm1(old - rollout) - (old - rollout)
        return ((k3 > item.upper) | (k3 == 0)) & as_bool_mask(mask)

    @hunt
    @given(rollout_batches(), rs_thresholds("token_k3"))
    def run(batch, threshold):
        check_rs_mask(fn, batch, criterion="token_k3", threshold=threshold)

    with pytest.raises(AssertionError, match=r"\[rs_mask\.(reference_agreement|monotone)\]"):
        run()


def test_monotone_check_without_reference_disagreement():
    # A criterion the reference does not know about cannot be compared with it, but the
    # self-consistency checks still apply: widening the bound must not drop tokens.
    def fn(old, rollout, mask, *, criterion, threshold):
        (item,) = ref.parse_rs_criteria(criterion, threshold)
        k2 = 0.5 * (old - rollout).square()
        if item.upper > 100:  # widened beyond 100: a broken code path
            return torch.zeros_like(as_bool_mask(mask))
        return (k2 <= item.upper) & as_bool_mask(mask)

    batch = {
        "old_log_probs": torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0, -1.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    with finds("rs_mask.monotone"):
        check_rs_mask(fn, batch, criterion="token_k2", threshold="64.0")


def test_message_shows_positions_and_values():
    batch = {
        "old_log_probs": torch.tensor([[-1.0, -0.5, 7.0]], dtype=torch.float64),
        "rollout_log_probs": torch.tensor([[-1.0, -1.0, -3.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[1, 1, 0]]),
    }

    def keeps_everything(old, rollout, mask):
        return mask.clone()

    with finds("rs_mask.reference_agreement") as caught:
        check_rs_mask(keeps_everything, batch, criterion="token_k2", threshold=0.1)
    message = str(caught.value)
    assert "(b=0, t=1): fn keeps, reference drops" in message
    assert "token_k2=0.125" in message
    assert "(b=0, t=0)" not in message


def test_bad_threshold_strings_raise_clear_errors():
    batch_mask = torch.ones(1, 2, dtype=torch.bool)
    zeros = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"part 2 \('x'\)"):
        ref.compute_rs_mask(
            zeros, zeros, batch_mask, criterion="token_k1,token_k2", threshold="2,x"
        )
    with pytest.raises(ValueError, match="seq_max_k1"):
        ref.compute_rs_mask(zeros, zeros, batch_mask, criterion="token_k1,seq_max_k1", threshold=2)


def test_masked_sum_helper_ignores_non_finite_padding():
    values = torch.tensor([[1.0, float("inf")], [2.0, float("nan")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    assert masked_sum(values, mask).item() == 3.0
