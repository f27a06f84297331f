"""check_quantization: correct quantizers written as frameworks write them pass on
hypothesis-drawn weights, and each broken one is caught by the invariant its bug breaks."""

from __future__ import annotations

import functools

import pytest
import quant_impls as impl
import torch
from hunting import finds, hunt, passes as passes_settings
from hypothesis import given, strategies as st

from pytest_rollout_golden import quant
from pytest_rollout_golden.invariants import check_quantization
from pytest_rollout_golden.strategies import quantization_weights

passes = passes_settings(60)
ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
REFERENCE_FORMATS = [*quant.FORMATS, "mxfp8_e4m3@rceil", "mxfp8_e5m2@rceil"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors of up to 64k elements: on a shared CPU torch's thread pool costs more than it
    gives (20x slower here); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(fmt: str):
    return functools.partial(quant.quantize, fmt=fmt)


def round_trip(quantize, dequantize):
    return lambda x: dequantize(*quantize(x))


# --------------------------------------------------------------------------- no false alarms


@pytest.mark.parametrize("fmt", REFERENCE_FORMATS)
@passes
@given(data=st.data())
def test_the_reference_passes_its_own_checker(fmt, data):
    x = data.draw(quantization_weights(fmt, dtype=ALL_DTYPES))
    check_quantization(reference(fmt), x, fmt, dequantize=quant.dequantize)
    check_quantization(lambda t: quant.dequantize(quant.quantize(t, fmt)), x, fmt)


INDEPENDENT = {
    "fp8_e4m3_tensor": (impl.fp8_tensorwise_te("e4m3"), impl.fp8_dequantize),
    "fp8_e5m2_tensor": (impl.fp8_tensorwise_te("e5m2"), impl.fp8_dequantize),
    "fp8_e4m3_block128": (
        impl.fp8_block_deepseek((128, 128)),
        functools.partial(impl.fp8_dequantize, block=(128, 128)),
    ),
    "fp8_e4m3_block1x128": (
        impl.fp8_block_deepseek((1, 128)),
        functools.partial(impl.fp8_dequantize, block=(1, 128)),
    ),
    "mxfp8_e4m3": (impl.mxfp8_torchao("e4m3"), impl.mx_dequantize),
    "mxfp8_e5m2": (impl.mxfp8_torchao("e5m2"), impl.mx_dequantize),
    "mxfp8_e4m3@rceil": (impl.mxfp8_torchao("e4m3", "rceil"), impl.mx_dequantize),
    "mxfp8_e5m2@rceil": (impl.mxfp8_torchao("e5m2", "rceil"), impl.mx_dequantize),
    "nvfp4": (impl.nvfp4_te(), impl.nvfp4_dequantize),
}


@pytest.mark.parametrize("fmt", sorted(INDEPENDENT))
@passes
@given(data=st.data())
def test_float32_implementations_with_torch_casts_pass(fmt, data):
    """Written independently of the reference: float32 arithmetic, torch's float8 casts,
    torchao's bit tricks, threshold-table E2M1, float64 inputs rounded to float32 inside."""
    x = data.draw(quantization_weights(fmt, dtype=ALL_DTYPES))
    quantize, dequantize = INDEPENDENT[fmt]
    floor = {"amax_floor": impl.TE_AMAX_FLOOR[fmt]} if fmt in impl.TE_AMAX_FLOOR else {}
    check_quantization(quantize, x, fmt, dequantize=dequantize, **floor)
    check_quantization(round_trip(quantize, dequantize), x, fmt, **floor)


def test_a_float64_input_rounded_to_float32_may_move_a_power_of_two_scale():
    """amax = 1792·(1 + 2^-40) in float64: the exact round-up rule gives 2^3, a float32
    implementation sees 1792 = 448·2^2 and gives 2^2. The input is not float32-exact, so the
    decision lies within DECISION_RTOL of the boundary and both are accepted; the same
    scale from a float32 input is judged exactly."""
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, 0], x[0, 1] = 1792.0 * (1 + 2.0**-40), 3.0
    quantize = impl.mxfp8_torchao("e4m3", "rceil")
    assert int(quantize(x)[1]) - 127 == 2
    assert quant.quantize(x, "mxfp8_e4m3@rceil").scales.item() == 8.0
    check_quantization(quantize, x, "mxfp8_e4m3@rceil", dequantize=impl.mx_dequantize)


def test_encode_scales_are_read_with_reciprocal_scales():
    x = torch.randn(4, 64)

    def te_encode(t):
        q, scale_inv = impl.fp8_tensorwise_te("e4m3")(t)
        return q, 1.0 / scale_inv

    def dequantize(q, scale):
        return q.float() / scale

    with finds("quantization.scale"):
        check_quantization(te_encode, x, "fp8_e4m3_tensor", dequantize=dequantize)
    check_quantization(
        te_encode, x, "fp8_e4m3_tensor", dequantize=dequantize, reciprocal_scales=True
    )


# --------------------------------------------------------------------------- bugs caught


def hunt_for(invariant: str, fmt: str, quantize, dequantize=None, **strategy):
    @hunt
    @given(quantization_weights(fmt, **strategy))
    def run(x):
        check_quantization(quantize, x, fmt, dequantize=dequantize)

    with finds(invariant) as caught:
        run()
    return str(caught.value)


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_finds_blocks_of_16_instead_of_32(element):
    message = hunt_for(
        "quantization.shape",
        f"mxfp8_{element}",
        impl.mx_blocks_of(16, element),
        impl.dequantize_as(f"mxfp8_{element}"),
    )
    assert "16-element blocks: wrong block size?" in message


def test_finds_transposed_blocking():
    message = hunt_for(
        "quantization.scale",
        "mxfp8_e4m3",
        impl.mx_transposed("e4m3"),
        impl.dequantize_as("mxfp8_e4m3"),
    )
    assert "transposed blocking" in message


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e4m3@rceil", "mxfp8_e5m2"])
def test_finds_e8m0_rounded_down(fmt):
    element = fmt[6:10]
    bug = impl.reference_with(fmt, scales=impl.e8m0_rounded_down(element))
    message = hunt_for("quantization.scale", fmt, bug, impl.dequantize_as(fmt))
    assert "e8m0 rounded down" in message


def test_finds_nvidia_round_up_where_the_ocp_rule_is_declared():
    quantize = impl.mxfp8_torchao("e4m3", "rceil")
    message = hunt_for("quantization.scale", "mxfp8_e4m3", quantize, impl.mx_dequantize)
    assert "declare fmt='mxfp8_e4m3@rceil'" in message


@pytest.mark.parametrize("fmt", ["fp8_e4m3_tensor", "mxfp8_e4m3", "fp8_e4m3_block1x128"])
def test_finds_round_toward_zero(fmt):
    bug = impl.reference_with(fmt, round=impl.round_toward_zero("e4m3"))
    message = hunt_for("quantization.codes", fmt, bug, impl.dequantize_as(fmt))
    assert "truncation" in message


def test_finds_round_toward_zero_in_a_round_trip():
    bug = impl.reference_with("mxfp8_e4m3", round=impl.round_toward_zero("e4m3"))

    def rt(x):
        codes, scales = bug(x)
        return codes * scales.repeat_interleave(32, dim=-1)

    hunt_for("quantization.reference_agreement", "mxfp8_e4m3", rt)


def test_finds_missing_saturation():
    """E5M2 has inf: torch's cast without a clamp overflows to inf where the OCP scale leaves
    ``x / X`` in [57344, 65536). E4M3 through a non-saturating cast gives NaN."""
    quantize = impl.mxfp8_torchao("e5m2", saturate=False)
    hunt_for("quantization.no_overflow", "mxfp8_e5m2", quantize, impl.mx_dequantize)
    nonsat = impl.reference_with(
        "mxfp8_e4m3", round=lambda v: quant.round_element(v, "e4m3", saturate=False)
    )
    hunt_for("quantization.no_overflow", "mxfp8_e4m3", nonsat, impl.dequantize_as("mxfp8_e4m3"))


def test_finds_nvfp4_dequantized_without_the_tensor_scale():
    message = hunt_for(
        "quantization.dequantize",
        "nvfp4",
        impl.nvfp4_te(),
        impl.nvfp4_dequantize_without_tensor_scale,
    )
    assert "without the per-tensor scale" in message
    rt = round_trip(impl.nvfp4_te(), impl.nvfp4_dequantize_without_tensor_scale)
    hunt_for("quantization.reference_agreement", "nvfp4", rt)


def test_finds_nvfp4_block_scales_computed_without_the_tensor_scale():
    hunt_for(
        "quantization.scale",
        "nvfp4",
        impl.nvfp4_block_scales_without_tensor_scale,
        impl.dequantize_as("nvfp4"),
    )


def test_finds_a_scale_shared_across_blocks_in_a_round_trip():
    """A per-row scale where MX takes one per 32 elements: only the round trip is given, so
    block independence (or the bound) must see it."""

    def per_row(x):
        q = quant.quantize(x, "fp8_e4m3_block1x128")
        return quant.dequantize(q)

    hunt_for("quantization", "mxfp8_e4m3", per_row)


# --------------------------------------------------------------------------- messages


def test_a_failure_names_the_block_and_both_scales():
    x = torch.zeros(2, 64)
    x[1, 32], x[1, 33] = 300.0, 1.0  # floor(log2 300) - 8 = 0: scale 1; rounded down: 2^-1
    bug = impl.reference_with("mxfp8_e4m3", scales=impl.e8m0_rounded_down("e4m3"))
    with finds("quantization.scale") as caught:
        check_quantization(bug, x, "mxfp8_e4m3", dequantize=impl.dequantize_as("mxfp8_e4m3"))
    assert "block (1, 1): scale=0.5, reference=1 (block amax 300)" in str(caught.value)


def test_non_finite_input_is_an_error():
    with pytest.raises(ValueError, match="must be finite"):
        check_quantization(reference("nvfp4"), torch.full((1, 16), torch.inf), "nvfp4")


def test_finds_nan_codes_of_an_all_zero_tile():
    """``448 / amax`` without a zero guard: an all-zero 128x128 tile (a zero-initialized or
    pruned block) quantizes to NaN codes with a zero decode scale, so the engine's weight is
    NaN there."""
    message = hunt_for(
        "quantization.no_overflow",
        "fp8_e4m3_block128",
        impl.fp8_block_unguarded,
        functools.partial(impl.fp8_dequantize, block=(128, 128)),
    )
    assert "got nan" in message


def test_e8m0_scales_are_read_as_float8_e8m0fnu_and_as_biased_uint8():
    x = torch.randn(3, 96)
    quantize = impl.mxfp8_torchao("e4m3")

    def as_e8m0fnu(t):
        codes, biased = quantize(t)
        return codes, biased.view(torch.float8_e8m0fnu)

    def dequantize(codes, scales):
        return impl.mx_dequantize(codes, scales.view(torch.uint8))

    check_quantization(as_e8m0fnu, x, "mxfp8_e4m3", dequantize=dequantize)
    check_quantization(quantize, x, "mxfp8_e4m3", dequantize=impl.mx_dequantize)
