"""``compare_values`` against ``torch.testing.assert_close``: the same verdict for every pair
of tensors away from the tolerance's boundary, NaN, infinities, integers, bool, 16-bit floats
and masks included; and the default table against torch's own."""

from __future__ import annotations

import math

import pytest
import torch
import torch.testing._comparison as torch_comparison
from hypothesis import assume, event, given, settings, strategies as st

from pytest_rollout_golden._internal.golden.messages import difference_detail
from pytest_rollout_golden._internal.tolerance.compare import compare_values
from pytest_rollout_golden._internal.tolerance.spec import DTYPE_DEFAULTS, Tolerance

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = [*FLOATS, torch.int32, torch.int64, torch.bool]
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0]


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(expected, actual, mask): a tensor, a perturbed copy, maybe a bool mask."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 12))
    values = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    if dtype in FLOATS:
        values = st.one_of(values, st.sampled_from(SPECIAL))
    expected = [draw(values) for _ in range(n)]
    actual = list(expected)
    for i in draw(st.lists(st.integers(0, n - 1), max_size=n)):
        how = draw(st.sampled_from(["relative", "absolute", "special"]))
        if how == "relative":
            actual[i] = expected[i] * (1 + draw(st.sampled_from([1e-8, 1e-6, 1e-4, 1e-2, 0.5])))
        elif how == "absolute":
            actual[i] = expected[i] + draw(st.sampled_from([1e-9, 1e-6, 1e-3, 1.0, 7.0]))
        elif dtype in FLOATS:
            actual[i] = draw(st.sampled_from(SPECIAL))
    if dtype is torch.bool:
        e, a = torch.tensor(expected) > 0, torch.tensor(actual) > 0
    else:
        e = torch.tensor(expected, dtype=torch.float64).to(dtype)
        a = torch.tensor(actual, dtype=torch.float64).to(dtype)
    mask = draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n).map(torch.tensor))
    return e, a, mask


def near_boundary(e: torch.Tensor, a: torch.Tensor, rtol: float, atol: float) -> bool:
    """Whether an element's difference sits within rounding of what the tolerance allows:
    torch computes the test in the tensors' own dtype, this project in float64, so such an
    element may honestly go either way."""
    e64, a64 = e.double(), a.double()
    finite = e64.isfinite() & a64.isfinite()
    allowed = atol + rtol * e64.abs()
    margin = ((a64 - e64).abs() - allowed).abs()
    if bool((finite & (margin <= 1e-2 * allowed + 1e-12)).any()):
        return True
    if not e.is_floating_point() or e.dtype == torch.float64:
        return False
    # The tolerance itself rounds in the tensors' dtype: atol=1e-6 is 1.0133e-6 in float16,
    # whose subnormals are 6e-8 apart, so an element between the two goes either way.
    native = (a - e).abs() <= atol + rtol * e.abs()
    return bool((finite & (native != ((a64 - e64).abs() <= allowed))).any())


@settings(max_examples=400, deadline=None)
@given(
    pair=pairs(),
    tolerance=st.sampled_from([(0.0, 0.0), (1e-5, 1e-8), (1e-3, 1e-6), (0.1, 0.5), (0.0, 1.0)]),
    equal_nan=st.booleans(),
)
def test_same_verdict_as_torch_testing(pair, tolerance, equal_nan):
    e, a, mask = pair
    rtol, atol = tolerance
    if mask is not None:
        reference_e, reference_a = e[mask], a[mask]
        assume(bool(mask.any()))  # nothing selected fails here by design (see test below)
    else:
        reference_e, reference_a = e, a
    assume(not near_boundary(reference_e, reference_a, rtol, atol))
    try:
        torch.testing.assert_close(
            reference_a, reference_e, rtol=rtol, atol=atol, equal_nan=equal_nan
        )
        torch_ok = True
    except AssertionError:
        torch_ok = False
    ours = compare_values(
        e, a, Tolerance(rtol=rtol, atol=atol, equal_nan=equal_nan), check_dtype=True, mask=mask
    )
    event(f"torch {'pass' if torch_ok else 'fail'}, {e.dtype}")
    assert ours.ok == torch_ok, (e, a, mask, difference_detail(ours))


def test_a_mask_selecting_nothing_fails_where_torch_compares_nothing():
    e = torch.ones(4)
    nothing = torch.zeros(4, dtype=torch.bool)
    torch.testing.assert_close(e[nothing] * 100, e[nothing])  # torch: an empty pass
    assert not compare_values(e, e * 100, Tolerance(), check_dtype=True, mask=nothing).ok


@pytest.mark.parametrize("dtype", sorted(DTYPE_DEFAULTS))
def test_default_table_is_torch_testing_where_torch_has_one(dtype: str):
    """float8 has no torch.testing default: those rows are this project's own (one step of
    the format's mantissa, as float16's and bfloat16's rows are)."""
    torch_defaults = {
        str(k).removeprefix("torch."): v for k, v in torch_comparison._DTYPE_PRECISIONS.items()
    }
    ours = DTYPE_DEFAULTS[dtype]
    if dtype.startswith("float8"):
        assert dtype not in torch_defaults
        mantissa_bits = {"float8_e4m3fn": 3, "float8_e5m2": 2}[dtype]
        assert ours.rtol == 2.0**-mantissa_bits
    else:
        assert (ours.rtol, ours.atol) == torch_defaults[dtype]
