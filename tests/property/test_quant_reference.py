"""The float64 quantization references against torch's own float8 casts and hand-worked
values from the published definitions (OCP OFP8 and MX v1.0, NVIDIA NVFP4)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pytest_rollout_golden.quant import (
    ELEMENTS,
    FORMATS,
    dequantize,
    error_bound,
    quantize,
    resolve,
    round_element,
)

F64 = torch.float64
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# torch 2.13's eager cast saturates E4M3FN (finite overflow and ±inf -> ±448) and sends E5M2
# overflow to ±inf by round-to-nearest-even (61440, the tie above 57344, goes to inf).
TORCH_SATURATES = {"e4m3": True, "e5m2": False}


def torch_cast(x: torch.Tensor, element: str) -> torch.Tensor:
    return x.to(TORCH_FP8[element]).to(F64)


def torch_grid(element: str) -> torch.Tensor:
    """Every finite value of the torch float8 dtype, sorted, non-negative."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH_FP8[element]).to(F64)
    finite = values[torch.isfinite(values) & (values >= 0)]
    return torch.unique(finite)


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_every_torch_float8_value_is_on_our_grid_and_vice_versa(element):
    grid = torch_grid(element)
    assert torch.equal(round_element(grid, element), grid)
    assert float(grid[-1]) == ELEMENTS[element].max
    assert float(grid[1]) == ELEMENTS[element].min_subnormal
    # our grid has no value torch lacks: rounding every midpoint between neighbours lands on
    # one of the two neighbours, never in between
    mid = (grid[1:] + grid[:-1]) / 2
    rounded = round_element(mid, element)
    assert bool(((rounded == grid[1:]) | (rounded == grid[:-1])).all())


def neighbourhood(element: str) -> torch.Tensor:
    """Grid values, ties between neighbours and the float32 values either side of each tie
    and of the overflow thresholds, both signs, in float32."""
    grid = torch_grid(element)
    top = ELEMENTS[element].max
    step = float(grid[-1] - grid[-2])
    extra = torch.tensor([top + step / 2, top + step, 2 * top, 1e30, math.inf], dtype=F64)
    points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, extra]).to(torch.float32)
    up = torch.nextafter(points, torch.full_like(points, math.inf))
    down = torch.nextafter(points, torch.zeros_like(points))
    everything = torch.cat([points, up, down])
    return torch.cat([everything, -everything])


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_round_element_equals_torch_cast_at_every_tie_and_boundary(element):
    """Ties go to even, one float32 ulp either side of a tie goes to the nearer neighbour,
    subnormals included; overflow follows torch's rule (E4M3FN saturates, E5M2 -> inf)."""
    x = neighbourhood(element)
    ours = round_element(x.to(F64), element, saturate=TORCH_SATURATES[element])
    theirs = torch_cast(x, element)
    differ = ours != theirs
    assert not bool(differ.any()), [
        (a, b) for a, b in zip(x[differ].tolist(), ours[differ].tolist(), strict=True)
    ]


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_round_element_equals_torch_cast_on_any_float32(element, data):
    top = 4 * ELEMENTS[element].max
    values = data.draw(
        st.lists(
            st.floats(-top, top, width=32, allow_subnormal=True)
            | st.floats(width=32, allow_nan=False, allow_infinity=True),
            min_size=1,
            max_size=64,
        )
    )
    x = torch.tensor(values, dtype=torch.float32)
    ours = round_element(x.to(F64), element, saturate=TORCH_SATURATES[element])
    assert torch.equal(ours, torch_cast(x, element))


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_torch_casts_float64_through_float32(element):
    """torch rounds a float64 to float32 first, then to float8 (double rounding): just above
    a tie, where float32 cannot tell the difference, torch goes to even and the correctly
    rounded float64 reference goes up. Agreement is therefore stated for float32 inputs."""
    tie = {"e4m3": 1.0625, "e5m2": 1.125}[element]  # between 1 and the next grid value
    x = torch.tensor([tie + 2.0**-40], dtype=F64)
    assert float(torch_cast(x, element)) == 1.0
    assert float(round_element(x, element)) == 2 * tie - 1.0
    assert torch.equal(torch_cast(x, element), round_element(x.float().to(F64), element))


def test_torch_nan_and_saturation_behaviour():
    x = torch.tensor([math.nan, math.inf, -math.inf, 1e6], dtype=torch.float32)
    assert torch_cast(x, "e4m3")[1:].tolist() == [448.0, -448.0, 448.0]
    assert math.isnan(float(torch_cast(x, "e4m3")[0]))
    assert torch_cast(x, "e5m2")[1:].tolist() == [math.inf, -math.inf, math.inf]
    assert round_element(x.to(F64), "e5m2")[1:].tolist() == [57344.0, -57344.0, 57344.0]
    assert math.isnan(float(round_element(x.to(F64), "e4m3")[0]))
    # OCP's non-saturating E4M3 has no inf: overflow is NaN (464 is a tie and goes to 448)
    nonsat = round_element(torch.tensor([464.0, 465.0], dtype=F64), "e4m3", saturate=False)
    assert float(nonsat[0]) == 448.0 and math.isnan(float(nonsat[1]))


def test_e2m1_grid_and_ties():
    """FP4 E2M1: {0, 0.5, 1, 1.5, 2, 3, 4, 6}; ties to the even mantissa."""
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, 0.26, -5.0], dtype=F64)
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 0.5, -4.0]
    assert round_element(x, "e2m1").tolist() == expected


# --------------------------------------------------------------------------- scales


def row(*values: float, width: int = 32) -> torch.Tensor:
    x = torch.zeros(1, width, dtype=F64)
    x[0, : len(values)] = torch.tensor(values, dtype=F64)
    return x


def test_mx_floor_scale_is_the_ocp_rule_and_saturates():
    """OCP §6.3: X = 2^(floor(log2 amax) - 8) for E4M3. amax 600 = 1.17·2^9: X = 2, 300 fits;
    amax 480 = 1.875·2^8: X = 1, 480 saturates to 448."""
    assert quantize(row(600.0), "mxfp8_e4m3").scales.tolist() == [[2.0]]
    q = quantize(row(480.0, 1.0), "mxfp8_e4m3")
    assert q.scales.tolist() == [[1.0]] and q.codes[0, :2].tolist() == [448.0, 1.0]
    assert float(error_bound(row(480.0), "mxfp8_e4m3")[0, 0]) == pytest.approx(32.0, rel=1e-14)


def test_mx_rceil_scale_rounds_amax_over_max_up():
    """NVIDIA: the least power of two X with amax / X ≤ 448: 480 -> 2, 448 -> 1, 449 -> 2."""
    for amax, scale in [(480.0, 2.0), (448.0, 1.0), (449.0, 2.0), (224.0, 0.5), (1.0, 2.0**-8)]:
        assert quantize(row(amax), "mxfp8_e4m3@rceil").scales.tolist() == [[scale]], amax
    assert quantize(row(480.0), "mxfp8_e4m3@rceil").codes[0, 0] == 240.0


def test_e8m0_range_zero_block_and_nan():
    tiny = quantize(row(2.0**-140), "mxfp8_e4m3")
    assert tiny.scales.tolist() == [[2.0**-127]]  # clamped to E8M0's smallest
    assert tiny.codes[0, 0] == 0.0  # 2^-13 at that scale is below E4M3's 2^-9 subnormal
    bound = float(error_bound(row(2.0**-140), "mxfp8_e4m3")[0, 0])
    assert bound == pytest.approx(2.0**-137, rel=1e-14)  # half of 2^-9 at scale 2^-127
    assert quantize(row(0.0), "mxfp8_e4m3").scales.tolist() == [[2.0**-127]]
    assert math.isnan(quantize(row(2.0**136), "mxfp8_e4m3").scales.item())  # 2^128: no E8M0
    assert quantize(row(2.0**135), "mxfp8_e4m3").scales.item() == 2.0**127
    nan_block = quantize(row(1.0, math.inf), "mxfp8_e4m3")
    assert math.isnan(nan_block.scales.item()) and bool(nan_block.codes.isnan().all())


def test_e8m0_scales_are_torch_e8m0_values():
    x = torch.randn(4, 256, dtype=F64) * torch.logspace(-30, 30, 256, dtype=F64)
    scales = quantize(x, "mxfp8_e5m2").scales
    via_torch = scales.to(torch.float32).to(torch.float8_e8m0fnu).to(F64)
    assert torch.equal(scales, via_torch)


def test_fp8_tensor_and_block_scales():
    x = torch.zeros(256, 200, dtype=F64)
    x[0, 0], x[130, 199] = 896.0, -7.0
    q = quantize(x, "fp8_e4m3_block128")
    assert q.scales.shape == (2, 2)  # 200 columns: one full and one partial block
    assert q.scales.tolist() == [[2.0, 1.0], [1.0, 7.0 / 448.0]]  # zero blocks: scale 1
    assert float(dequantize(q)[130, 199]) == -7.0
    assert quantize(x, "fp8_e4m3_tensor").scales.item() == 2.0
    assert quantize(x, "fp8_e5m2_tensor").scales.item() == 896.0 / 57344.0
    assert quantize(x, "fp8_e4m3_block1x128").scales.shape == (256, 2)


def test_nvfp4_two_level_scale():
    """g = amax / 2688; block scale e4m3(amax_b / 6 / g); the tensor's amax block gets 448.
    A block at 2^-12 of the tensor's amax gets 448·2^-12 = 0.109375, an E4M3 subnormal
    (56·2^-9); one at 2^-22 gets 448·2^-22 ≈ 1.1e-4, below half the smallest subnormal
    2^-9: its block scale is 0 and the block dequantizes to zero."""
    x = torch.zeros(1, 64, dtype=F64)
    x[0, 0], x[0, 16], x[0, 32], x[0, 48] = 6.0, 6.0 * 2.0**-12, 6.0 * 2.0**-22, 3.0
    q = quantize(x, "nvfp4")
    assert q.tensor_scale.item() == 6.0 / 2688.0
    assert q.scales[0, 0] == 448.0 and q.scales[0, 3] == 224.0
    assert q.scales[0, 1] == 0.109375 and q.scales[0, 2] == 0.0
    assert float(dequantize(q)[0, 32]) == 0.0
    bound = error_bound(x, "nvfp4")
    assert float(bound[0, 32]) == 6.0 * 2.0**-22  # the whole value is lost
    assert bool(((dequantize(q) - x).abs() <= bound).all())


def test_unknown_format_and_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="unknown format 'mxfp9'"):
        quantize(torch.zeros(32), "mxfp9")
    with pytest.raises(ValueError, match="e8m0"):
        resolve("nvfp4@rceil")
    with pytest.raises(ValueError, match=r"at least 2 dims.*reshape"):
        quantize(torch.zeros(128), "fp8_e4m3_block128")


# --------------------------------------------------------------------------- round trips


@st.composite
def matrices(draw: st.DrawFn) -> torch.Tensor:
    rows = draw(st.integers(1, 3))
    cols = draw(st.sampled_from([16, 32, 48, 64, 96]))
    exps = draw(st.lists(st.integers(-30, 30), min_size=rows * cols, max_size=rows * cols))
    mants = draw(st.lists(st.integers(-255, 255), min_size=rows * cols, max_size=rows * cols))
    x = torch.tensor(mants, dtype=F64) * torch.ldexp(
        torch.ones(rows * cols, dtype=F64), torch.tensor(exps)
    )
    return x.reshape(rows, cols)


@pytest.mark.parametrize("name", [*FORMATS, "mxfp8_e4m3@rceil", "mxfp8_e5m2@rceil"])
@settings(max_examples=40, deadline=None)
@given(x=matrices())
def test_round_trip_within_bound_and_idempotent(name, x):
    fmt = resolve(name)
    if fmt.block == (128, 128):
        x = x.repeat(3, 3)[:200, :150]
    q = quantize(x, fmt)
    back = dequantize(q)
    assert bool(((back - x).abs() <= error_bound(x, fmt)).all())
    assert bool((q.codes.abs() <= fmt.elem.max).all())
    assert torch.equal(quantize(-x, fmt).codes, -q.codes)
    if fmt.scale != "e4m3":  # NVFP4 re-derives block scales from the dequantized amax
        assert torch.equal(dequantize(quantize(back, fmt)), back)
