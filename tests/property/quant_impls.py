"""Quantizers as frameworks write them (float32, torch float8 casts, bit tricks) for the
quantization checker: correct ones written independently of the reference, and broken ones
with one known bug each."""

from __future__ import annotations

import torch
from torch import Tensor

from pytest_rollout_golden import quant
from pytest_rollout_golden.quant.formats import expand

F32 = torch.float32
TE_AMAX_FLOOR = {
    name: top / torch.finfo(torch.float32).max
    for name, top in (("fp8_e4m3_tensor", 448.0), ("fp8_e5m2_tensor", 57344.0), ("nvfp4", 2688.0))
}
"""The amax below which Transformer Engine's capped scale stops being ``max / amax``."""
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
MAX = {"e4m3": 448.0, "e5m2": 57344.0}
EMAX = {"e4m3": 8, "e5m2": 15}


# --------------------------------------------------------------------------- correct


def fp8_tensorwise_te(element: str):
    """Transformer Engine's current scaling shape: encode scale ``max / amax`` in float32
    capped at ``FLT_MAX`` (TE's guard against a tiny amax), saturating cast, decode scale
    ``1 / scale``."""

    def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
        x32 = x.to(F32)
        amax = x32.abs().amax()
        scale = torch.where(amax > 0, MAX[element] / amax, torch.ones_like(amax))
        scale = torch.clamp(scale, max=torch.finfo(F32).max)
        q = (x32 * scale).clamp(-MAX[element], MAX[element]).to(FP8[element])
        return q, 1.0 / scale

    return quantize


def fp8_block_deepseek(block: tuple[int, int]):
    """DeepSeek-V3's ``weight_quant``/``act_quant`` in float32 over whole tiles: ``s =
    amax / 448`` per tile, ``(x / s)`` cast to E4M3 (torch >= 2.13 saturates); an all-zero
    tile gets ``s = 1`` instead of DeepSeek's 0/0."""

    def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
        rows, cols = x.shape
        br, bc = block
        tiles = x.to(F32).reshape(rows // br, br, cols // bc, bc)
        amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        q = (tiles / s).to(torch.float8_e4m3fn).reshape(rows, cols)
        return q, s.reshape(rows // br, cols // bc)

    return quantize


def fp8_dequantize(q: Tensor, scales: Tensor, block: tuple[int, ...] | None = None) -> Tensor:
    s = scales.to(F32)
    if block is not None:
        s = expand(s, block, tuple(q.shape))
    return q.to(F32) * s


def _e8m0_exponent(amax: Tensor, element: str, rounding: str) -> Tensor:
    """torchao's bit extraction: the float32 exponent field of amax (``floor``), or the
    round-up of ``amax · (1/max)`` computed in float32 (NVIDIA's ``rceil``)."""
    if rounding == "floor":
        biased = (amax.view(torch.int32) >> 23) & 0xFF
        return torch.clamp(biased - 127 - EMAX[element], -127, 127)
    descale = amax * (1.0 / MAX[element])
    bits = descale.view(torch.int32)
    biased, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = torch.where(biased == 0, mantissa > 0x400000, mantissa != 0)
    return torch.clamp(biased + up.to(torch.int32) - 127, -127, 127)


def mxfp8_torchao(element: str, rounding: str = "floor", *, saturate: bool = True):
    """torchao's ``to_mx`` shape: float32, 32-element blocks, E8M0 exponent from the bits,
    scales returned as biased uint8, elements by torch's float8 cast (E5M2 clamped first)."""

    def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
        x32 = x.to(F32)
        b = x32.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
        exp = _e8m0_exponent(b.abs().amax(-1, keepdim=True), element, rounding)
        data = b * torch.ldexp(torch.ones_like(b[..., :1]), -exp)
        if saturate:
            data = data.clamp(-MAX[element], MAX[element])
        q = data.to(FP8[element]).reshape(x.shape)
        return q, (exp + 127).to(torch.uint8).squeeze(-1)

    return quantize


def mx_dequantize(q: Tensor, scales: Tensor) -> Tensor:
    s = torch.ldexp(torch.ones(scales.shape), scales.to(torch.int32) - 127)
    return q.to(F32) * s.repeat_interleave(32, dim=-1)


_E2M1_UP = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_by_thresholds(v: Tensor) -> Tensor:
    """FP4 E2M1 rounding by comparisons, as the packing kernels do: a tie goes to the value
    whose mantissa bit is 0 (0, 1, 2, 4 are even; 0.5, 1.5, 3, 6 odd)."""
    a = v.abs()
    even_below = torch.tensor([True, False, True, False, True, False, True])
    index = torch.zeros_like(a, dtype=torch.int64)
    for i, (t, even) in enumerate(zip(_E2M1_UP.tolist(), even_below.tolist(), strict=True)):
        index = torch.where((a > t) | ((a == t) & (not even)), i + 1, index)
    return torch.copysign(_E2M1_VALUES[index], v)


def nvfp4_te():
    """Transformer Engine's NVFP4 recipe in float32: ``s_enc = 2688 / amax`` (capped at
    ``FLT_MAX``), block decode
    scale ``e4m3(amax_b / 6 · s_enc)`` by torch's cast, elements ``x · (s_enc / sb)``."""

    def quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x32 = x.to(F32)
        amax = x32.abs().amax()
        s_enc = torch.where(amax > 0, 2688.0 / amax, torch.ones_like(amax))
        s_enc = torch.clamp(s_enc, max=torch.finfo(F32).max)  # TE's cap, as for FP8
        b = x32.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
        sb = (b.abs().amax(-1, keepdim=True) / 6.0 * s_enc).to(torch.float8_e4m3fn)
        enc = torch.where(sb.to(F32) > 0, s_enc / sb.to(F32), torch.zeros_like(b[..., :1]))
        codes = e2m1_by_thresholds(b * enc).reshape(x.shape)
        return codes, sb.squeeze(-1), 1.0 / s_enc

    return quantize


def nvfp4_dequantize(codes: Tensor, sb: Tensor, g: Tensor) -> Tensor:
    return codes * sb.to(F32).repeat_interleave(16, dim=-1) * g


# --------------------------------------------------------------------------- broken


def reference_with(fmt: str, **changes):
    """The reference quantizer with one step replaced (see the broken implementations)."""

    def quantize(x: Tensor):
        q = quant.quantize(x, fmt)
        codes, scales = q.codes, q.scales
        if "scales" in changes:
            scales = changes["scales"](x)
            per = expand(scales, q.format.block, q.shape)
            codes = changes.get("round", lambda v: quant.round_element(v, q.format.elem))(x / per)
        elif "round" in changes:
            per = quant.formats.effective_scale(q)
            codes = changes["round"](x.to(torch.float64) / per)
        return (codes, scales) if q.tensor_scale is None else (codes, scales, q.tensor_scale)

    return quantize


def round_toward_zero(element: str):
    elem = quant.ELEMENTS[element]

    def rounding(v: Tensor) -> Tensor:
        step = quant.formats.grid_step(v, elem)
        return torch.copysign(torch.clamp(torch.floor(v.abs() / step) * step, max=elem.max), v)

    return rounding


def e8m0_rounded_down(element: str):
    """``2^floor(log2(amax / max_elem))``: amax / max rounded *down* to a power of two."""

    def scales(x: Tensor) -> Tensor:
        amax = quant.formats.block_amax(x, (32,))
        exp = torch.frexp(torch.where(amax > 0, amax / MAX[element], 1.0))[1] - 1
        return torch.ldexp(torch.ones_like(amax), torch.clamp(exp, min=-127))

    return scales


def mx_blocks_of(size: int, element: str):
    """MXFP8 with ``size``-element blocks instead of 32."""
    fmt = quant.Format(f"mx{size}", element, (size,), "e8m0", "floor")

    def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
        q = quant.quantize(x, fmt)
        return q.codes, q.scales

    return quantize


def mx_transposed(element: str):
    """Blocks of 32 taken down the columns (the tensor read in column-major order) and the
    scales stored in the row-major block grid's shape."""

    def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
        rows, cols = x.shape
        q = quant.quantize(x.T.reshape(1, -1), f"mxfp8_{element}")
        codes = q.codes.reshape(cols, rows).T
        return codes, q.scales.reshape(rows, cols // 32)

    return quantize


def nvfp4_dequantize_without_tensor_scale(codes: Tensor, sb: Tensor, g: Tensor) -> Tensor:
    return codes * sb.to(F32).repeat_interleave(16, dim=-1)


def nvfp4_block_scales_without_tensor_scale(x: Tensor):
    """Block scales ``e4m3(amax_b / 6)`` as if there were no tensor scale (which is then 1)."""
    q = quant.quantize(x, "nvfp4")
    amax_b = quant.formats.block_amax(x, (16,))
    sb = quant.round_element(amax_b / 6.0, "e4m3")
    per = expand(sb, (16,), tuple(x.shape))
    codes = quant.formats.codes_at(x, q.format, per)
    return codes, sb, torch.tensor(1.0, dtype=torch.float64)


def dequantize_as(fmt: str):
    """``codes × block scale (× tensor scale)`` for ``(codes, scales[, tensor_scale])``."""
    block = quant.resolve(fmt).block

    def dequantize(codes: Tensor, scales: Tensor, tensor_scale: Tensor | None = None) -> Tensor:
        out = codes.to(torch.float64) * expand(scales.to(torch.float64), block, tuple(codes.shape))
        return out if tensor_scale is None else out * tensor_scale

    return dequantize


def fp8_block_unguarded(x: Tensor) -> tuple[Tensor, Tensor]:
    """The transformers/verl ``per_block_fp8_quant`` formula over 128x128 tiles: encode scale
    ``448 / amax``, ``clamp(x · scale)`` cast to E4M3, decode scale its reciprocal, with no
    guard for an all-zero tile (``0 · inf`` is NaN)."""
    rows, cols = x.shape
    tiles = x.to(F32).reshape(rows // 128, 128, cols // 128, 128)
    scale = 448.0 / tiles.abs().amax(dim=(1, 3), keepdim=True)
    q = torch.clamp(tiles * scale, -448.0, 448.0).to(torch.float8_e4m3fn).reshape(rows, cols)
    return q, scale.reshape(rows // 128, cols // 128).reciprocal()
