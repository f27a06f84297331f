"""Two-sided truncation, geometric-mean sequence weights and one-sided k1 rejection: the
reference passes the checkers, deliberately broken implementations are caught."""

from __future__ import annotations

import pytest
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import reference as ref
from pytest_rollout_golden.invariants import check_is_weights, check_rs_mask
from pytest_rollout_golden.reference.masking import as_bool_mask
from pytest_rollout_golden.strategies import (
    is_thresholds,
    rollout_batches,
    rs_configs,
    rs_thresholds,
)

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
TWO_SIDED = is_thresholds(truncation=False, icepop=False, two_sided=True)

passes = passes_settings(80)


def reference_is(level, threshold, normalize=False):
    def fn(old, rollout, mask):
        return ref.compute_is_weights(
            old, rollout, mask, level=level, threshold=threshold, batch_normalize=normalize
        )

    return fn


@passes
@given(
    rollout_batches(dtype=DTYPES),
    st.sampled_from(ref.IS_LEVELS),
    is_thresholds(two_sided=True),
    st.booleans(),
)
def test_reference_passes_every_level_and_threshold(batch, level, threshold, normalize):
    check_is_weights(
        reference_is(level, threshold, normalize),
        batch,
        level=level,
        threshold=threshold,
        batch_normalize=normalize,
    )


@passes
@given(rollout_batches(dtype=DTYPES), st.sampled_from(["token_k1", "seq_sum_k1", "seq_mean_k1"]))
def test_reference_passes_one_sided_k1(batch, criterion):
    threshold = "0_1.5" if criterion != "seq_sum_k1" else "0.25_inf"

    def fn(old, rollout, mask, *, criterion, threshold):
        return ref.compute_rs_mask(old, rollout, mask, criterion=criterion, threshold=threshold)

    check_rs_mask(fn, batch, criterion=criterion, threshold=threshold)


@passes
@given(rollout_batches(dtype=DTYPES), rs_configs(max_parts=3, one_sided=True))
def test_reference_passes_one_sided_configs_with_keywords(batch, config):
    def fn(old, rollout, mask, *, criterion, threshold):
        return ref.compute_rs_mask(old, rollout, mask, criterion=criterion, threshold=threshold)

    check_rs_mask(fn, batch, criterion=config[0], threshold=config[1])


def test_one_sided_grammar():
    (upper_only,) = ref.parse_rs_criteria("token_k1", "0_2.0")
    assert (upper_only.lower, upper_only.upper) == (0.0, 2.0)
    (lower_only,) = ref.parse_rs_criteria("token_k1", "0.5_inf")
    assert lower_only.bounds()[0] == float("-inf")
    with pytest.raises(ValueError, match="one finite side"):
        ref.parse_rs_criteria("token_k1", "0_inf")
    with pytest.raises(ValueError, match="one upper bound"):
        ref.parse_rs_criteria("token_k2", "0_2.0")
    assert ref.parse_is_threshold((0.5, 2.0)).two_sided
    with pytest.raises(TypeError, match="pair of numbers"):
        ref.parse_is_threshold((0.5, 2.0, 3.0))


# --------------------------------------------------------------------------- broken


def test_finds_two_sided_truncation_without_its_lower_clamp():
    def fn(old, rollout, mask):
        return ref.raw_is_weights(old, rollout, mask, level="token").clamp(max=2.0)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=(0.5, 2.0))

    with finds("is_weights.truncation") as caught:
        run()
    assert "outside the truncation bounds [0.5, 2.0]" in str(caught.value)


def test_finds_lower_clamp_applied_to_padding():
    def fn(old, rollout, mask):
        return ref.raw_is_weights(old, rollout, mask, level="token").clamp(0.5, 2.0)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=(0.5, 2.0))

    with finds("is_weights.zero_on_padding"):
        run()


def test_finds_icepop_instead_of_two_sided_truncation():
    def fn(old, rollout, mask):
        return ref.compute_is_weights(old, rollout, mask, level="token", threshold="0.5_2.0")[0]

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="token", threshold=(0.5, 2.0))

    with pytest.raises(AssertionError, match=r"\[is_weights\.(truncation|reference_agreement)\]"):
        run()


def test_finds_arithmetic_instead_of_geometric_mean():
    def fn(old, rollout, mask):
        token = ref.raw_is_weights(old, rollout, mask, level="token")
        per_row = ref.masked_mean(token, mask, dim=-1).unsqueeze(-1)
        return ref.masked_fill_zero(per_row.expand_as(token), mask)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="geometric", threshold=None)

    with finds("is_weights.reference_agreement"):
        run()


def test_finds_geometric_mean_over_the_padded_length():
    def fn(old, rollout, mask):
        valid = as_bool_mask(mask)
        mean = torch.where(valid, old - rollout, torch.zeros_like(old)).mean(dim=-1, keepdim=True)
        return ref.masked_fill_zero(mean.clamp(-20, 20).exp().expand_as(old), mask)

    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(fn, batch, level="geometric", threshold=None)

    with finds("is_weights.reference_agreement"):
        run()


def test_finds_sequence_sum_instead_of_geometric_mean():
    @hunt
    @given(rollout_batches())
    def run(batch):
        check_is_weights(reference_is("sequence", 2.0), batch, level="geometric", threshold=2.0)

    with finds("is_weights.reference_agreement"):
        run()


def test_finds_one_sided_bound_read_as_a_bare_bound():
    # "0_2.0" should keep every ratio up to 2; read as "2.0" it also drops ratios below 0.5.
    def fn(old, rollout, mask, *, criterion, threshold):
        (item,) = ref.parse_rs_criteria(criterion, threshold)
        bare = repr(item.upper) if item.lower == 0 else threshold
        return ref.compute_rs_mask(old, rollout, mask, criterion=criterion, threshold=bare)[0]

    @hunt
    @given(rollout_batches(), rs_thresholds("token_k1", one_sided=True))
    def run(batch, threshold):
        check_rs_mask(fn, batch, criterion="token_k1", threshold=threshold)

    with finds("rs_mask.reference_agreement"):
        run()
