"""The batch strategy honours its contract; the parallel helpers split and pack correctly."""

from __future__ import annotations

import pytest
import torch
from hunting import passes
from hypothesis import given, settings, strategies as st

from pytest_rollout_golden import parallel
from pytest_rollout_golden.reference.correction import parse_is_threshold, parse_rs_criteria
from pytest_rollout_golden.strategies import (
    GRID,
    PAD_LOG_PROB_DEPTH,
    is_thresholds,
    register_profiles,
    rollout_batches,
    rs_configs,
)

KEYS = {"old_log_probs", "rollout_log_probs", "log_probs", "response_mask", "advantages", "uid"}
LOG_PROB_FIELDS = ("old_log_probs", "rollout_log_probs", "log_probs")
TOKEN_FLOATS = (*LOG_PROB_FIELDS, "advantages")

quick = passes(60)


@quick
@given(
    rollout_batches(
        min_batch=2, max_batch=4, min_len=3, max_len=5, dtype=[torch.float32, torch.bfloat16]
    )
)
def test_batch_contract(batch):
    assert set(batch) == KEYS
    mask = batch["response_mask"]
    size, width = mask.shape
    assert 2 <= size <= 4 and 3 <= width <= 5
    valid = mask != 0
    assert bool(valid.any())
    assert parallel.padding_side(mask) in ("left", "right", "none")
    for key in TOKEN_FLOATS:
        values = batch[key]
        assert values.shape == (size, width)
        assert values.dtype in (torch.float32, torch.bfloat16)
        assert values.dtype == batch["old_log_probs"].dtype
        assert bool(torch.isfinite(values).all())
        assert not values.requires_grad
    # The advantages' padding holds garbage, not zeros; the log-probs' holds log-probs.
    assert bool((batch["advantages"][~valid] != 0).all())
    for key in LOG_PROB_FIELDS:
        assert bool((batch[key][valid] <= 0).all())
        padding = batch[key][~valid]
        assert bool(((padding <= 0) & (padding >= -PAD_LOG_PROB_DEPTH)).all())
    assert batch["uid"].dtype == torch.int64 and batch["uid"].shape == (size,)
    assert mask.dtype in (torch.bool, torch.int64, batch["old_log_probs"].dtype)


@quick
@given(rollout_batches(extreme_ratios=False, off_policy=1.0, policy_drift=0.5, garbage=False))
def test_spread_options_and_zero_padding(batch):
    valid = batch["response_mask"] != 0
    ratio = (batch["old_log_probs"] - batch["rollout_log_probs"])[valid]
    drift = (batch["log_probs"] - batch["old_log_probs"])[valid]
    assert bool((ratio.abs() <= 1.0).all()) and bool((drift.abs() <= 0.5).all())
    # Values sit on the 1/GRID nat grid.
    assert bool((ratio * GRID == (ratio * GRID).round()).all())
    for key in TOKEN_FLOATS:
        assert bool((batch[key][~valid] == 0).all())


def test_batches_reach_far_off_policy_and_empty_rows():
    seen = {"extreme": False, "empty_row": False, "left": False, "right": False, "seq_adv": False}

    @settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @given(rollout_batches())
    def run(batch):
        valid = batch["response_mask"] != 0
        ratio = (batch["old_log_probs"] - batch["rollout_log_probs"])[valid]
        seen["extreme"] |= bool((ratio.abs() > 20).any())
        seen["empty_row"] |= bool((~valid.any(dim=-1)).any())
        side = parallel.padding_side(batch["response_mask"])
        if side in ("left", "right"):
            seen[side] = True
        rows = [batch["advantages"][b][valid[b]] for b in range(valid.shape[0])]
        seen["seq_adv"] |= any(r.numel() > 1 and bool((r == r[0]).all()) for r in rows)

    run()
    assert all(seen.values()), seen


def test_log_prob_padding_is_zeros_or_pad_token_log_probs_and_extreme_is_opt_in():
    seen = {"zeros": False, "log_probs": False, "fields_differ": False, "positive": False}

    @quick
    @given(rollout_batches(min_len=2))
    def realistic(batch):
        padding = ~(batch["response_mask"] != 0)
        if not bool(padding.any()):
            return
        fills = [batch[key][padding] for key in LOG_PROB_FIELDS]
        seen["zeros"] |= any(not bool(fill.any()) for fill in fills)
        seen["log_probs"] |= any(bool((fill < 0).all()) for fill in fills)
        seen["fields_differ"] |= not torch.equal(fills[0], fills[2])

    @quick
    @given(rollout_batches(garbage="extreme"))
    def extreme(batch):
        padding = ~(batch["response_mask"] != 0)
        for key in TOKEN_FLOATS:
            assert bool((batch[key][padding] != 0).all())
        seen["positive"] |= bool((batch["log_probs"][padding] > 0).any())  # no model's

    realistic()
    extreme()
    assert all(seen.values()), seen


@quick
@given(is_thresholds(), rs_configs(max_parts=3))
def test_threshold_strategies_parse(is_threshold, rs_config):
    parse_is_threshold(is_threshold)
    criterion, threshold = rs_config
    assert len(parse_rs_criteria(criterion, threshold)) == len(threshold.split(","))
    for part in threshold.split(","):
        if "_" in part:
            lower, upper = map(float, part.split("_"))
            assert lower < 1 < upper and lower * upper != 1.0  # asymmetric k1 bounds


def test_rollout_batches_rejects_bad_options():
    with pytest.raises(ValueError, match="min_batch"):
        rollout_batches(min_batch=3, max_batch=2)
    with pytest.raises(ValueError, match="padding"):
        rollout_batches(padding="middle")


def test_profiles_are_registered_and_idempotent():
    register_profiles()
    register_profiles()
    ci = settings.get_profile("rollout-golden-ci")
    assert ci.derandomize and ci.deadline is None and ci.print_blob
    assert ci.max_examples == 50
    dev = settings.get_profile("rollout-golden-dev")
    assert dev.deadline is None and dev.max_examples == 25


# --------------------------------------------------------------------------- parallel helpers

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])


def test_splits_cover_every_row_once():
    for pieces in parallel.micro_batch_splits(MASK, 3).values():
        assert sorted(row for piece in pieces for row in piece) == list(range(5))
        assert all(pieces)
    assert parallel.split_by_count(5, 2) == [[0, 1, 2], [3, 4]]
    assert parallel.split_interleaved(5, 2) == [[0, 2, 4], [1, 3]]
    assert parallel.split_by_count(2, 5) == [[0], [1]]


def test_token_budget_split():
    # Token counts 3, 1, 0, 4, 2 with a budget of 4.
    assert parallel.split_by_token_budget(MASK, 4) == [[0, 1, 2], [3], [4]]
    assert parallel.split_by_token_budget(MASK, 2) == [[0], [1, 2], [3], [4]]


def test_dp_shards_keep_one_list_per_rank():
    assert parallel.dp_shards(5, 2) == [[0, 1, 2], [3, 4]]
    assert parallel.dp_shards(1, 3) == [[0], [], []]


def test_select_rows_indexes_batch_tensors_only():
    batch = {"response_mask": MASK, "uid": torch.arange(5), "note": "x", "scalar": torch.tensor(1)}
    sub = parallel.select_rows(batch, [4, 0])
    assert sub["response_mask"].tolist() == [MASK[4].tolist(), MASK[0].tolist()]
    assert sub["uid"].tolist() == [4, 0]
    assert sub["note"] == "x" and sub["scalar"].item() == 1


def test_pack_unpack_round_trip():
    values = torch.arange(20.0).reshape(5, 4)
    packed, cu_seqlens = parallel.pack({"response_mask": MASK, "x": values, "uid": torch.arange(5)})
    assert cu_seqlens.tolist() == [0, 3, 4, 4, 8, 10]
    assert packed["x"].shape == (1, 10)
    assert packed["response_mask"].tolist() == [[1] * 10]
    assert packed["uid"].tolist() == [0, 1, 2, 3, 4]
    restored = parallel.unpack(packed["x"], cu_seqlens, MASK, fill=-1.0)
    assert torch.equal(restored, torch.where(MASK.bool(), values, torch.tensor(-1.0)))
    with pytest.raises(ValueError, match="cu_seqlens"):
        parallel.unpack(packed["x"], cu_seqlens, MASK[:, :2])


def test_unpack_is_differentiable():
    packed = torch.arange(10.0).reshape(1, 10).requires_grad_()
    _, cu_seqlens = parallel.pack({"response_mask": MASK})
    (parallel.unpack(packed, cu_seqlens, MASK) * 2).sum().backward()
    assert packed.grad.tolist() == [[2.0] * 10]


def test_padding_side_and_pad_columns():
    assert parallel.padding_side(MASK) == "right"
    assert parallel.padding_side(MASK.flip(-1)) == "left"
    assert parallel.padding_side(torch.ones(2, 2)) == "none"
    assert parallel.padding_side(torch.tensor([[1, 0], [0, 1]])) == "mixed"
    batch = {"response_mask": MASK.flip(-1), "x": torch.zeros(5, 4), "uid": torch.arange(5)}
    wider = parallel.pad_columns(batch, 2, side="left", fill=9.0)
    assert wider["response_mask"].shape == (5, 6)
    assert parallel.padding_side(wider["response_mask"]) == "left"
    assert wider["x"][:, :2].eq(9.0).all() and wider["uid"].shape == (5,)


@quick
@given(rollout_batches(), st.integers(1, 4))
def test_splits_on_generated_batches(batch, n_splits):
    mask = batch["response_mask"]
    for pieces in parallel.micro_batch_splits(mask, n_splits).values():
        assert sorted(r for p in pieces for r in p) == list(range(mask.shape[0]))
    packed, cu_seqlens = parallel.pack(batch)
    assert int(cu_seqlens[-1]) == int((mask != 0).sum())
    restored = parallel.unpack(packed["log_probs"], cu_seqlens, mask)
    assert torch.equal(restored[mask != 0], batch["log_probs"][mask != 0])
