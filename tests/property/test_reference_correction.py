"""Reference IS / RS numerics against hand-computed float64 values (Python ``math``)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from pytest_rollout_golden import reference as ref

E = math.exp
F64 = torch.float64
P = "rollout_corr/"


def t(rows):
    return torch.tensor(rows, dtype=F64)


# Two rows: row 0 has log ratios 0.5 and -1.0, row 1 has 3.0; the rest is garbage padding.
OLD = t([[-1.0, -2.0, 50.0], [-0.5, 30.0, 30.0]])
ROLLOUT = t([[-1.5, -1.0, -40.0], [-3.5, 0.0, -7.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
LOG_RATIOS = [0.5, -1.0, 3.0]


def test_token_is_weights_truncate():
    weights, metrics = ref.compute_is_weights(OLD, ROLLOUT, MASK, level="token", threshold=2.0)
    expected = t([[E(0.5), E(-1.0), 0.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, expected, rtol=1e-14, atol=0)
    valid = [E(0.5), E(-1.0), 2.0]
    mean = sum(valid) / 3
    assert metrics[P + "rollout_is_mean"] == pytest.approx(mean, rel=1e-14)
    assert metrics[P + "rollout_is_std"] == pytest.approx(statistics.pstdev(valid), rel=1e-12)
    assert metrics[P + "rollout_is_min"] == pytest.approx(E(-1.0))
    assert metrics[P + "rollout_is_max"] == 2.0
    ess = 1 / statistics.fmean([(w / mean) ** 2 for w in valid])
    assert metrics[P + "rollout_is_eff_sample_size"] == pytest.approx(ess, rel=1e-12)
    # Raw ratios above 2 (log 3.0) and below 1/2 (log -1.0): one token each out of three.
    assert metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert metrics[P + "rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    row_means = [(E(0.5) + E(-1.0)) / 2, 2.0]
    assert metrics[P + "rollout_is_seq_mean"] == pytest.approx(statistics.fmean(row_means))
    assert metrics[P + "rollout_is_seq_std"] == pytest.approx(statistics.stdev(row_means))
    assert metrics[P + "rollout_is_seq_max_deviation"] == pytest.approx(1.0)
    # Raw per-row mean weights: row 1 is e^3 > 2.
    assert metrics[P + "rollout_is_seq_fraction_high"] == pytest.approx(0.5)
    assert metrics[P + "rollout_is_seq_fraction_low"] == 0.0
    assert P + "rollout_is_batch_norm_factor" not in metrics
    assert P + "rollout_is_oob_ratio" not in metrics


def test_sequence_is_weights_ignore_padding():
    weights, _ = ref.compute_is_weights(OLD, ROLLOUT, MASK, level="sequence", threshold=2.0)
    # Row 0: exp(0.5 - 1.0) on both valid tokens; row 1: exp(3) truncated to 2.
    expected = t([[E(-0.5), E(-0.5), 0.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, expected, rtol=1e-14, atol=0)


def test_icepop_zeroes_outside_bounds():
    weights, metrics = ref.compute_is_weights(
        OLD, ROLLOUT, MASK, level="token", threshold="0.5_2.0"
    )
    expected = t([[E(0.5), 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, expected, rtol=1e-14, atol=0)
    assert metrics[P + "rollout_is_oob_ratio"] == pytest.approx(2 / 3)


def test_safety_clamp_at_twenty():
    old = t([[0.0, -1.0]])
    rollout = t([[-25.0, 0.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    token, _ = ref.compute_is_weights(old, rollout, mask, level="token", threshold=None)
    assert token[0, 0].item() == pytest.approx(E(20.0), rel=1e-14)
    sequence, _ = ref.compute_is_weights(old, rollout, mask, level="sequence", threshold=None)
    # Σ log ratio = 24 -> clamped to 20.
    assert sequence[0].tolist() == pytest.approx([E(20.0)] * 2, rel=1e-14)


def test_token_batch_normalization():
    weights, metrics = ref.compute_is_weights(
        OLD, ROLLOUT, MASK, level="token", threshold=2.0, batch_normalize=True
    )
    mean = (E(0.5) + E(-1.0) + 2.0) / 3
    assert metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(mean, rel=1e-14)
    assert weights[0, 0].item() == pytest.approx(E(0.5) / mean, rel=1e-14)
    assert weights[1, 0].item() == pytest.approx(2.0 / mean, rel=1e-14)
    # The metrics still describe the weights before normalization.
    assert metrics[P + "rollout_is_mean"] == pytest.approx(mean, rel=1e-14)


def test_sequence_batch_normalization_averages_sequences_not_tokens():
    old = torch.cat([OLD, t([[9.0, 9.0, 9.0]])])  # a fully padded third row
    rollout = torch.cat([ROLLOUT, t([[-9.0, 1.0, 2.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    weights, metrics = ref.compute_is_weights(
        old, rollout, mask, level="sequence", threshold=2.0, batch_normalize=True
    )
    seq_mean = (E(-0.5) + 2.0) / 2  # over the two sequences with valid tokens
    token_mean = (2 * E(-0.5) + 2.0) / 3  # what a token-level mean would give instead
    assert seq_mean != pytest.approx(token_mean)
    assert metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(seq_mean, rel=1e-14)
    assert weights[0, 0].item() == pytest.approx(E(-0.5) / seq_mean, rel=1e-14)
    assert weights[2].tolist() == [0.0, 0.0, 0.0]


def test_normalization_skipped_for_tiny_mean():
    old = t([[-25.0]])
    rollout = t([[0.0]])
    mask = torch.ones(1, 1)
    weights, metrics = ref.compute_is_weights(
        old, rollout, mask, level="token", threshold=2.0, batch_normalize=True
    )
    assert E(-20.0) < 1e-8
    assert weights.item() == pytest.approx(E(-20.0), rel=1e-14)
    assert metrics[P + "rollout_is_batch_norm_factor"] == 1.0


def test_offpolicy_metrics():
    metrics = ref.offpolicy_metrics(OLD, ROLLOUT, MASK)
    lr = LOG_RATIOS
    assert metrics[P + "kl"] == pytest.approx(-sum(lr) / 3, rel=1e-14)
    k3 = [E(x) - x - 1 for x in lr]
    assert metrics[P + "k3_kl"] == pytest.approx(sum(k3) / 3, rel=1e-14)
    mean_old = [-1.5, -0.5]
    mean_rollout = [-1.25, -3.5]
    assert metrics[P + "training_ppl"] == pytest.approx(statistics.fmean(E(-m) for m in mean_old))
    assert metrics[P + "rollout_ppl"] == pytest.approx(
        statistics.fmean(E(-m) for m in mean_rollout)
    )
    diffs = [r - o for r, o in zip(mean_rollout, mean_old, strict=True)]
    assert metrics[P + "log_ppl_diff"] == pytest.approx(statistics.fmean(diffs))
    assert metrics[P + "log_ppl_abs_diff"] == pytest.approx(statistics.fmean(map(abs, diffs)))
    assert metrics[P + "chi2_token"] == pytest.approx(sum(E(2 * x) for x in lr) / 3 - 1)
    assert metrics[P + "chi2_seq"] == pytest.approx((E(2 * -0.5) + E(2 * 3.0)) / 2 - 1)


def test_rollout_correction_combines_everything():
    weights, keep, metrics = ref.rollout_correction(
        OLD, ROLLOUT, MASK, is_level="token", rs="token_k2", rs_threshold=1.0
    )
    assert weights is not None
    assert keep.tolist() == [[1, 1, 0], [0, 0, 0]]  # ½·3² > 1 drops row 1's token
    assert {P + "kl", P + "rollout_is_mean", P + "rollout_rs_masked_fraction"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())


# --------------------------------------------------------------------------- rejection sampling


def ratios_batch(ratios_per_row):
    """Rows of given ratios (rollout log-prob -1, old = -1 + log ρ), right-padded with garbage."""
    width = max(len(row) for row in ratios_per_row) + 1
    old = torch.full((len(ratios_per_row), width), 123.0, dtype=F64)
    rollout = torch.full_like(old, -321.0)
    mask = torch.zeros(old.shape, dtype=torch.bool)
    for b, row in enumerate(ratios_per_row):
        for i, ratio in enumerate(row):
            old[b, i] = -1.0 + math.log(ratio)
            rollout[b, i] = -1.0
            mask[b, i] = True
    return old, rollout, mask


def keep_of(criterion, threshold, ratios_per_row):
    old, rollout, mask = ratios_batch(ratios_per_row)
    keep, _ = ref.compute_rs_mask(old, rollout, mask, criterion=criterion, threshold=threshold)
    return [
        [bool(k) for k, m in zip(kr, mr, strict=True) if m]
        for kr, mr in zip(keep, mask, strict=True)
    ]


def test_token_k1_keeps_lower_le_ratio_le_upper():
    # verl's code would keep 1/1.6 = 0.625 <= ρ <= 1/0.6 = 1.667: 0.61 dropped, 1.65 kept.
    assert keep_of("token_k1", "0.6_1.6", [[0.61, 1.65, 1.0, 0.5, 1.7]]) == [
        [True, False, True, False, False]
    ]


def test_token_k1_bare_threshold_is_upper_with_reciprocal_lower():
    assert keep_of("token_k1", 2.0, [[0.49, 0.51, 1.99, 2.01]]) == [[False, True, True, False]]


def test_token_k2_and_k3():
    # k2 = ½(log ρ)²: log ρ = 0.5 -> 0.125 (kept at 0.13), log ρ = -0.75 -> 0.28125.
    assert keep_of("token_k2", 0.13, [[E(0.5), E(-0.75)]]) == [[True, False]]
    # k3 = ρ - 1 - log ρ: log ρ = 1 -> e - 2 = 0.718; log ρ = -1 -> 1/e = 0.368.
    assert keep_of("token_k3", 0.7, [[E(1.0), E(-1.0)]]) == [[False, True]]


def test_sequence_k1_criteria():
    rows = [[E(0.5), E(0.25)], [E(0.5), E(-0.25)]]
    # Sequence ratio: e^0.75 = 2.117 (dropped by "0.5_2.0"), e^0.25 = 1.28 (kept).
    assert keep_of("seq_sum_k1", "0.5_2.0", rows) == [[False, False], [True, True]]
    # Geometric mean ratio: e^0.375 = 1.455 (dropped by "0.5_1.4"), e^0.125 = 1.133 (kept).
    assert keep_of("seq_mean_k1", "0.5_1.4", rows) == [[False, False], [True, True]]


def test_sequence_k2_k3_criteria():
    rows = [[E(0.5), E(0.25)], [E(0.5), 1.0]]
    # Σ k2: 0.125 + 0.03125 = 0.15625 vs 0.125 + 0.
    assert keep_of("seq_sum_k2", 0.15, rows) == [[False, False], [True, True]]
    # mean k2: 0.078125 vs 0.0625.
    assert keep_of("seq_mean_k2", 0.07, rows) == [[False, False], [True, True]]
    # max k3: e^0.5 - 1.5 = 0.1487 in both rows.
    assert keep_of("seq_max_k3", 0.148, rows) == [[False, False], [False, False]]
    assert keep_of("seq_max_k3", 0.149, rows) == [[True, True], [True, True]]
    # mean k3: row 0 (0.1487 + (e^0.25 - 1.25)) / 2 = 0.0902, row 1 0.0744.
    assert keep_of("seq_mean_k3", 0.08, rows) == [[False, False], [True, True]]
    assert keep_of("seq_sum_k3", 0.16, rows) == [[False, False], [True, True]]
    assert keep_of("seq_max_k2", 0.126, rows) == [[True, True], [True, True]]


def test_comma_combined_criteria_all_must_pass():
    rows = [[1.0, E(0.5)], [E(0.2), 1.0], [1.0, E(0.6)]]
    # token_k2 <= 0.1 drops log ρ = 0.5 (0.125) and 0.6 (0.18); seq_max_k3 <= 0.2 drops row 2
    # (e^0.6 - 1.6 = 0.222), including its on-policy token.
    expected = [[True, False], [True, True], [False, False]]
    assert keep_of("token_k2,seq_max_k3", "0.1,0.2", rows) == expected
    # One threshold shared by both criteria: seq_max_k2 <= 0.1 now drops rows 0 and 2 whole.
    expected = [[False, False], [True, True], [False, False]]
    assert keep_of("token_k2, seq_max_k2", "0.1", rows) == expected


def test_rs_metrics():
    old, rollout, mask = ratios_batch([[1.0, E(0.5), E(-1.0)], [E(0.5)], []])
    keep, metrics = ref.compute_rs_mask(old, rollout, mask, criterion="token_k2", threshold=0.2)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [[True, True, False, False], [True, False, False, False], [False] * 4]
    assert metrics[P + "rollout_rs_masked_fraction"] == pytest.approx(1 / 4)
    assert metrics[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert metrics[P + "rollout_rs_token_k2_mean"] == pytest.approx((0 + 0.125 + 0.5 + 0.125) / 4)
    assert metrics[P + "rollout_rs_token_k2_max"] == pytest.approx(0.5)
    assert metrics[P + "rollout_rs_token_k2_masked_fraction"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_rs_mask_keeps_mask_dtype_and_ignores_garbage(mask_dtype):
    old, rollout, mask = ratios_batch([[1.0, 3.0], [1.5]])
    keep, _ = ref.compute_rs_mask(
        old, rollout, mask.to(mask_dtype), criterion="token_k1", threshold=2.0
    )
    assert keep.dtype == mask_dtype
    assert keep.tolist() == [[1, 0, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    ("criterion", "threshold", "message"),
    [
        ("token_k4", 2.0, r"part 1 \('token_k4'\)"),
        ("token_k1,", 2.0, r"part 2 \(''\)"),
        ("token_k1,token_k2", "1.5,2,3", "3 parts"),
        ("token_k1", "-1_2", r"\(lower bound\).*'-1'"),
        ("token_k1", "0_inf", "one finite side"),  # "0_2" and "0.5_inf" are one-sided bounds
        ("token_k1", "2_1", "lower bound 2.0 is greater than upper bound 1.0"),
        ("token_k1", "0.5", "must be >= 1"),
        ("token_k2", "0.1_0.5", "one upper bound"),
        ("token_k1,seq_max_k2", "1.5,abc", r"part 2 \('abc'\) for 'seq_max_k2'"),
        ("seq_mean_k3", "-1", "> 0"),
        ("seq_sum_k2", "nan", "finite"),
    ],
)
def test_rs_threshold_grammar_errors(criterion, threshold, message):
    with pytest.raises(ValueError, match=message):
        ref.parse_rs_criteria(criterion, threshold)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("", "empty"), ("x", "not a number"), ("2_0.5", "greater than"), ("0", "> 0")],
)
def test_is_threshold_grammar_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        ref.parse_is_threshold(spec)


def test_is_threshold_grammar():
    assert ref.parse_is_threshold(2) == ref.ISThreshold(upper=2.0)
    assert ref.parse_is_threshold(" 0.5_3 ") == ref.ISThreshold(upper=3.0, lower=0.5)
    assert ref.parse_is_threshold(None).upper is None
    with pytest.raises(TypeError):
        ref.parse_is_threshold(True)
