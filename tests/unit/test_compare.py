"""Unit tests of compare.py: verdicts, differences and torch.testing-style mismatch details."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pytest_rollout_golden._internal.golden.messages import difference_detail
from pytest_rollout_golden._internal.results import Comparison
from pytest_rollout_golden._internal.tolerance.compare import compare_values
from pytest_rollout_golden._internal.tolerance.spec import EXACT, Tolerance

TOL = Tolerance(rtol=1e-3, atol=1e-6)
NAN_OK = Tolerance(rtol=1e-3, atol=1e-6, equal_nan=True)
INF, NAN = math.inf, math.nan


def ok(expected, actual, tol=TOL, *, check_dtype=False) -> bool:
    return compare_values(expected, actual, tol, check_dtype=check_dtype).ok


def test_within_and_beyond_tolerance():
    assert ok(1.0, 1.0 + 9e-4)  # atol + rtol * |expected| = 1.001e-3
    assert not ok(1.0, 1.0 + 1.1e-3)
    assert ok(0.0, 1e-6) and not ok(0.0, 2e-6)  # only atol near zero
    assert ok(-2.0, -2.0019) and not ok(-2.0, -2.0021)  # |expected| scales rtol


def test_differences_of_a_scalar():
    diff = compare_values(4.0, 5.0, TOL, check_dtype=False)
    assert (diff.ok, diff.abs_diff, diff.rel_diff, difference_detail(diff)) == (
        False,
        1.0,
        0.25,
        "",
    )


@pytest.mark.parametrize(
    ("expected", "actual", "tol", "passes"),
    [
        (NAN, NAN, TOL, False),
        (NAN, NAN, NAN_OK, True),
        (NAN, 1.0, NAN_OK, False),
        (1.0, NAN, NAN_OK, False),
        (INF, INF, TOL, True),
        (-INF, -INF, TOL, True),
        (INF, -INF, TOL, False),
        (INF, 1e308, TOL, False),
        (1e308, INF, TOL, False),
        (INF, NAN, NAN_OK, False),
        (INF, -INF, Tolerance(rtol=1e6, atol=1e300), False),
    ],
)
def test_nan_and_infinity(expected, actual, tol, passes):
    assert ok(expected, actual, tol) is passes
    as_tensor = lambda x: torch.tensor([1.0, x], dtype=torch.float64)  # noqa: E731
    assert ok(as_tensor(expected), as_tensor(actual), tol) is passes


def test_nan_lines_in_the_detail():
    diff = compare_values(torch.tensor([NAN, NAN, 1.0]), torch.tensor([NAN, 2.0, 1.0]), TOL,
                          check_dtype=True)  # fmt: skip
    assert not diff.ok
    assert "Mismatched elements: 2 / 3 (66.7%)" in difference_detail(diff)
    assert "NaN against a number at 1 element(s), first at index (1,)" in difference_detail(diff)
    assert "NaN against NaN at 1 element(s) (equal_nan is off)" in difference_detail(diff)


def test_tensor_detail_names_count_and_indices():
    expected = torch.zeros(3, 4)
    actual = expected.clone()
    actual[1, 2] = 0.5  # greatest absolute difference
    actual[2, 3] = 1e-3  # beyond tolerance too, smaller
    expected[0, 1], actual[0, 1] = 1e-4, 2e-4  # within atol? no: 1e-4 > 1e-6 + 1e-7
    diff = compare_values(expected, actual, TOL, check_dtype=True)
    lines = difference_detail(diff).splitlines()
    assert lines[0] == "Mismatched elements: 3 / 12 (25.0%)"
    assert lines[1].startswith("Greatest absolute difference: 0.5 at index (1, 2)")
    assert lines[1].endswith("(up to 1e-06 allowed)")
    assert lines[2].startswith("Greatest relative difference: inf at index (1, 2)")
    assert diff.abs_diff == 0.5


def test_relative_difference_index_differs_from_absolute():
    expected = torch.tensor([100.0, 1.0])
    actual = torch.tensor([101.0, 1.5])
    detail = difference_detail(compare_values(expected, actual, TOL, check_dtype=True))
    assert "Greatest absolute difference: 1 at index (0,)" in detail
    assert "Greatest relative difference: 0.5 at index (1,)" in detail


def test_shape_and_dtype_mismatches():
    diff = compare_values(torch.zeros(2, 3), torch.zeros(3, 2), TOL, check_dtype=False)
    assert not diff.ok and "shape (3, 2) differs from the recorded (2, 3)" in difference_detail(
        diff
    )
    diff = compare_values(
        torch.zeros(2), torch.zeros(2, dtype=torch.float64), TOL, check_dtype=True
    )
    assert (
        not diff.ok
        and "dtype torch.float64 differs from the recorded torch.float32" in difference_detail(diff)
    )
    assert ok(torch.zeros(2), torch.zeros(2, dtype=torch.float64), check_dtype=False)


def test_exact_lane_is_bitwise():
    one_ulp = math.nextafter(0.1, 1.0)
    assert ok(0.1, one_ulp) and not ok(0.1, one_ulp, EXACT)
    assert ok(0.0, -0.0) and not ok(0.0, -0.0, EXACT)
    assert not ok(torch.tensor([0.0]), torch.tensor([-0.0]), EXACT)
    assert ok(NAN, NAN, EXACT)
    payload = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)
    canonical = torch.tensor([0x7FC0], dtype=torch.int16).view(torch.bfloat16)
    # a NaN matches only its own bits: metrics.json and batches keep a payload and sign
    assert ok(payload, payload.clone(), EXACT) and not ok(payload, canonical, EXACT)
    assert ok(payload, canonical) is False and ok(payload, canonical, Tolerance(equal_nan=True))
    assert not ok(payload, torch.zeros_like(payload), EXACT)
    diff = compare_values(torch.zeros(4), torch.tensor([0, 0, -0.0, 0]), EXACT, check_dtype=True)
    assert "Mismatched elements: 1 / 4" in difference_detail(diff)
    assert "bit-exact" in difference_detail(diff)


def test_integers_and_bools_compare_exactly_by_default():
    assert not ok(torch.tensor([1, 2]), torch.tensor([1, 3]), Tolerance())
    assert ok(torch.tensor([True, False]), torch.tensor([True, False]), Tolerance())
    assert not ok(torch.tensor([True]), torch.tensor([False]), Tolerance())
    assert ok(2**53, 2**53, Tolerance()) and not ok(2**52, 2**52 + 1, Tolerance())


def test_large_integers_compare_exactly():
    assert not ok(2**62, 2**62 + 1, Tolerance())


def test_mixed_inputs_numpy_python_and_low_precision():
    assert ok(np.float32(0.5), 0.5)
    assert ok(np.array([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64))
    bf16 = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert ok(bf16, bf16.clone(), EXACT)
    assert not ok(bf16, bf16 + torch.tensor([0.0, 0.0078125]).to(torch.bfloat16) * 2, TOL)
    assert ok(torch.zeros(0, 3), torch.zeros(0, 3))


def test_comparison_json_is_strict_json():
    c = Comparison("x", 2, "fail", expected=NAN, actual=INF, abs_diff=NAN, rel_diff=-INF,
                   tolerance=TOL, tolerance_source="cli")  # fmt: skip
    data = c.to_json()
    assert (data["expected"], data["actual"], data["abs_diff"], data["rel_diff"]) == (
        "nan",
        "inf",
        "nan",
        "-inf",
    )
    assert data["tolerance"] == {
        "rtol": 1e-3,
        "atol": 1e-6,
        "equal_nan": False,
        "exact": False,
        "ignore": False,
        "scale": 0.0,
    }
    json.dumps(data, allow_nan=False)
    assert c.failed and Comparison("x", 0, "missing").failed
    assert not Comparison("x", 0, "pass").failed and not Comparison("x", 0, "new").failed


def test_means_and_counts_leave_non_finite_differences_out():
    expected = torch.tensor([1.0, 2.0, float("nan"), 0.0])
    actual = torch.tensor([1.0, 2.5, 1.0, 1e-3])
    d = compare_values(expected, actual, TOL, check_dtype=True)
    assert (d.ok, d.mismatched, d.numel) == (False, 3, 4)
    assert d.abs_mean == pytest.approx((0.5 + 1e-3) / 3)  # the NaN element is left out
    assert d.rel_mean == pytest.approx(0.25 / 2)  # so is the relative difference against 0
    same = compare_values(expected, expected.clone(), Tolerance(equal_nan=True), check_dtype=True)
    assert (same.ok, same.mismatched, same.abs_mean) == (True, 0, 0.0)


def _drifted(dtype, seed):
    """Two chunks and a bit of values, a few of them drifted, one NaN pair, -0.0 for 0.0."""
    g = torch.Generator().manual_seed(seed)
    expected = torch.randn((1 << 18) + 500, generator=g, dtype=torch.float64)
    actual = expected.clone()
    for i in torch.randint(0, expected.numel(), (5,), generator=g):
        actual[i] = actual[i] * (1 + 1e-3) + 1e-6
    expected[7], actual[7] = NAN, NAN
    expected[9], actual[9] = 0.0, -0.0
    actual[(1 << 18) + 3] = INF
    return expected.to(dtype), actual.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize(
    "tol",
    [TOL, NAN_OK, EXACT, Tolerance(rtol=1e-3, scale="recorded"), Tolerance(atol=1.0)],
    ids=["plain", "equal_nan", "exact", "recorded", "atol"],
)
def test_only_differing_elements_analysed_give_the_numbers_of_analysing_all(
    monkeypatch, dtype, tol
):
    """The scan that passes over equal chunks and gathers the differing elements reports
    what analysing every element reports, bit for bit, and says it in the same words."""
    from pytest_rollout_golden._internal.tolerance import compare

    expected, actual = _drifted(dtype, seed=3)
    fast = compare.compare_values(expected, actual, tol, check_dtype=True)
    monkeypatch.setattr(compare, "_SMALL", 1 << 30)  # no scan: every element analysed
    full = compare.compare_values(expected, actual, tol, check_dtype=True)
    assert repr(fast) == repr(full)
    assert difference_detail(fast) == difference_detail(full)
    same = compare.compare_values(expected, expected.clone(), tol, check_dtype=True)
    assert repr(same) == repr(compare.compare_values(expected, expected, tol, check_dtype=True))


def test_float8_under_a_recorded_scale_is_measured():
    expected = torch.tensor([1.0, 2.0, 4.0]).to(torch.float8_e4m3fn)
    actual = torch.tensor([1.0, 2.5, 4.0]).to(torch.float8_e4m3fn)
    diff = compare_values(
        expected, actual, Tolerance(rtol=1e-3, scale="recorded"), check_dtype=True
    )
    assert (diff.ok, diff.scale, diff.abs_diff) == (False, 4.0, 0.5)
    assert "(up to 0.004 allowed)" in difference_detail(diff)
