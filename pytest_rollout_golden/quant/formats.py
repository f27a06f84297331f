"""Float64 reference quantize-dequantize for FP8, MXFP8 and NVFP4, from the published definitions.

Element formats (OCP 8-bit Floating Point spec v1.0; OCP Microscaling (MX) spec v1.0, §5):

========  =====  ====  ======  ============  ==============  =====================
element   mbits  bias  emin    max normal    min subnormal   overflow
========  =====  ====  ======  ============  ==============  =====================
``e4m3``  3      7     -6      448           2^-9            no inf (E4M3FN): NaN
``e5m2``  2      15    -14     57344         2^-16           ±inf (IEEE-like)
``e2m1``  1      1     0       6             0.5             no inf, no NaN
========  =====  ====  ======  ============  ==============  =====================

Scale formats: ``fp32`` (a real, positive scale), ``e8m0`` (MX: a power of two ``2^k`` with
``-127 ≤ k ≤ 127``, no zero, no sign, encoding 0xFF is NaN), ``e4m3`` (NVFP4 block scales: an
unsigned E4M3 value, with a per-tensor fp32 scale on top).

Every quantizer here rounds to nearest, ties to even, on the element grid (the grid spacing
is ``2^(max(e, emin) - mbits)`` for a value in binade ``e``: subnormals share the spacing of
the smallest binade), and saturates: a scaled value beyond the element's max normal becomes
±max normal, never inf or NaN (the OCP MX spec §6.3 clamps; FP8 training recipes cast with
saturation). A block containing a non-finite value gets a NaN scale and NaN codes.

Block layout: ``Format.block`` applies to the trailing dims of the tensor (``(32,)``: runs of
32 along the last dim, one per row; ``(128, 128)``: tiles of the last two dims); leading dims
are independent. A trailing dim that is not a multiple of the block ends in a partial block
whose scale comes from the elements it has. ``block=None`` is one scale for the whole tensor.

The reference keeps scales as exact reals in float64 (``amax / 448`` is not rounded to
float32); implementations store fp32 scales, and
:func:`~pytest_rollout_golden.invariants.check_quantization` allows that rounding explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

ScaleFormat = Literal["fp32", "e8m0", "e4m3"]
ScaleRounding = Literal["exact", "floor", "rceil"]


@dataclass(frozen=True)
class Element:
    """A small floating-point element format: ``mbits`` mantissa bits, smallest normal
    exponent ``emin``, largest finite value ``max`` and what an overflow becomes without
    saturation (``"nan"`` for E4M3FN, ``"inf"`` for E5M2, ``"none"`` for E2M1, which has
    neither)."""

    name: str
    mbits: int
    emin: int
    max: float
    overflow: Literal["nan", "inf", "none"]

    @property
    def emax(self) -> int:
        """Exponent of the largest normal binade (``floor(log2(max))``): 8, 15, 2."""
        return math.frexp(self.max)[1] - 1

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.mbits)


ELEMENTS: Mapping[str, Element] = MappingProxyType(
    {
        "e4m3": Element("e4m3", mbits=3, emin=-6, max=448.0, overflow="nan"),
        "e5m2": Element("e5m2", mbits=2, emin=-14, max=57344.0, overflow="inf"),
        "e2m1": Element("e2m1", mbits=1, emin=0, max=6.0, overflow="none"),
    }
)
"""The element formats by name."""

F64_SLACK = 2.0**-50
"""Relative allowance for the float64 rounding of the reference's own arithmetic."""
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
NVFP4_TENSOR_RANGE = 448.0 * 6.0
"""NVFP4's per-tensor scale maps the tensor's amax to E4M3 max × E2M1 max = 2688, so the
largest block scale is exactly 448."""


@dataclass(frozen=True)
class Format:
    """A quantization format: element format, block shape over the trailing dims
    (``None``: one scale for the tensor), scale format and how the scale is rounded.

    ``scale_rounding``: ``"exact"`` for fp32 scales (``amax / max_elem``) and NVFP4 (block
    scales round to nearest E4M3); for E8M0 scales ``"floor"`` is the OCP MX spec v1.0 §6.3
    rule ``X = 2^(floor(log2(amax)) - emax_elem)`` (torchao's default
    ``ScaleCalculationMode.FLOOR``), under which a block's largest element may scale to
    ``[max_elem, 2^(emax_elem+1))`` and saturate, and ``"rceil"`` is NVIDIA's recipe (cuBLAS
    1D block quantization, Transformer Engine's MXFP8, torchao ``RCEIL``):
    ``X = 2^ceil(log2(amax / max_elem))``, rounded up so nothing saturates.
    """

    name: str
    element: str
    block: tuple[int, ...] | None
    scale: ScaleFormat
    scale_rounding: ScaleRounding = "exact"

    @property
    def elem(self) -> Element:
        return ELEMENTS[self.element]

    def with_scale_rounding(self, rounding: ScaleRounding) -> Format:
        """The same format with another E8M0 scale rounding (``"floor"`` or ``"rceil"``)."""
        if self.scale != "e8m0" or rounding not in ("floor", "rceil"):
            raise ValueError(
                f"{self.name}: scale rounding {rounding!r} applies to e8m0 (MX) scales only, "
                "as 'floor' (OCP spec) or 'rceil' (NVIDIA)"
            )
        return replace(self, name=f"{self.name.split('@')[0]}@{rounding}", scale_rounding=rounding)


FORMATS: Mapping[str, Format] = MappingProxyType(
    {
        "fp8_e4m3_tensor": Format("fp8_e4m3_tensor", "e4m3", None, "fp32"),
        "fp8_e5m2_tensor": Format("fp8_e5m2_tensor", "e5m2", None, "fp32"),
        "fp8_e4m3_block128": Format("fp8_e4m3_block128", "e4m3", (128, 128), "fp32"),
        "fp8_e4m3_block1x128": Format("fp8_e4m3_block1x128", "e4m3", (1, 128), "fp32"),
        "mxfp8_e4m3": Format("mxfp8_e4m3", "e4m3", (32,), "e8m0", "floor"),
        "mxfp8_e5m2": Format("mxfp8_e5m2", "e5m2", (32,), "e8m0", "floor"),
        "nvfp4": Format("nvfp4", "e2m1", (16,), "e4m3"),
    }
)
"""The formats by name: FP8 tensorwise (amax scaling), DeepSeek-V3 blockwise (128×128 weight
tiles, 1×128 activation runs), MXFP8 (32-element blocks, E8M0 scales, OCP rounding) and NVFP4
(E2M1 in 16-element blocks, E4M3 block scales, fp32 tensor scale)."""


def resolve(fmt: str | Format) -> Format:
    """The :class:`Format` for a name in :data:`FORMATS` (``"mxfp8_e4m3@rceil"`` selects the
    NVIDIA scale rounding), or the format itself."""
    if isinstance(fmt, Format):
        return fmt
    base, _, rounding = fmt.partition("@")
    if base not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    return FORMATS[base].with_scale_rounding(rounding) if rounding else FORMATS[base]  # type: ignore[arg-type]


@dataclass(frozen=True)
class Quantized:
    """A quantized tensor: ``codes`` (float64, the element values, same shape as the input),
    ``scales`` (float64, one per block: shape ``lead + ceil(trailing / block)``, 0-d for
    tensorwise), ``tensor_scale`` (NVFP4's per-tensor decode scale, else ``None``).
    ``dequantize`` gives ``codes × scale × tensor_scale``."""

    format: Format
    codes: Tensor
    scales: Tensor
    tensor_scale: Tensor | None
    shape: tuple[int, ...]


# --------------------------------------------------------------------------- element grid


def _binade(a: Tensor, elem: Element) -> Tensor:
    """``max(floor(log2 a), emin)`` for ``a ≥ 0`` (exact: read from the float64 exponent)."""
    _, e = torch.frexp(a)
    return torch.clamp(e.to(torch.int64) - 1, min=elem.emin)


def grid_step(a: Tensor, element: str | Element) -> Tensor:
    """Spacing of the element grid at magnitude ``a`` (float64): ``2^(max(e, emin) - mbits)``."""
    elem = ELEMENTS[element] if isinstance(element, str) else element
    a = a.to(torch.float64).abs()
    return torch.ldexp(torch.ones_like(a), _binade(a, elem) - elem.mbits)


def round_element(v: Tensor, element: str | Element, *, saturate: bool = True) -> Tensor:
    """Round ``v`` to the element grid in float64: nearest, ties to even (``torch.round``
    of ``|v| / step`` is exact and rounds half to even), subnormals included.

    With ``saturate`` (the default, what every format here uses) magnitudes beyond the max
    normal become ±max; without it a value that rounds above max becomes NaN (E4M3FN) or
    ±inf (E5M2), as OCP's non-saturating conversion (e.g. E5M2: 61440 is the tie between
    57344 and 2^16 and goes to inf). NaN stays NaN."""
    elem = ELEMENTS[element] if isinstance(element, str) else element
    v = v.to(torch.float64)
    a = v.abs()
    step = grid_step(a, elem)
    q = torch.where(torch.isfinite(a), torch.round(a / step) * step, a)
    if saturate:
        q = torch.clamp(q, max=elem.max)
    else:
        over = {"nan": math.nan, "inf": math.inf, "none": elem.max}[elem.overflow]
        q = torch.where(q > elem.max, torch.full_like(q, over), q)
    return torch.copysign(q, v)


# --------------------------------------------------------------------------- blocks


def _grid(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    k = len(block)
    lead, dims = shape[:-k], shape[-k:]
    return (*lead, *(-(-d // b) for d, b in zip(dims, block, strict=True)))


def check_shape(shape: tuple[int, ...], fmt: Format) -> None:
    """Raise ``ValueError`` when a tensor of ``shape`` cannot be blocked by ``fmt``."""
    if fmt.block is not None and len(shape) < len(fmt.block):
        raise ValueError(
            f"{fmt.name}: blocks {fmt.block} need a tensor with at least {len(fmt.block)} "
            f"dims, got shape {shape}; reshape it (e.g. x.reshape(1, -1)) first"
        )


def blocks(x: Tensor, block: tuple[int, ...] | None) -> Tensor:
    """``x`` as ``[*grid, block elements]``: each block's elements in the last dim (zero
    padded at the trailing edges, which leaves every block's amax unchanged)."""
    if block is None:
        return x.reshape(-1)
    k = len(block)
    lead, dims = x.shape[:-k], x.shape[-k:]
    grid = _grid(tuple(x.shape), block)[len(lead) :]
    pad: list[int] = []
    for d, g, b in reversed(list(zip(dims, grid, block, strict=True))):
        pad += [0, g * b - d]
    padded = F.pad(x, pad)
    split = [n for g, b in zip(grid, block, strict=True) for n in (g, b)]
    tiled = padded.reshape(*lead, *split)
    n = len(lead)
    order = [*range(n), *(n + 2 * i for i in range(k)), *(n + 2 * i + 1 for i in range(k))]
    return tiled.permute(order).reshape(*lead, *grid, math.prod(block))


def expand(scales: Tensor, block: tuple[int, ...] | None, shape: tuple[int, ...]) -> Tensor:
    """Per-block values broadcast back to every element of a tensor of ``shape``."""
    if block is None:
        return scales.expand(shape)
    k = len(block)
    out = scales
    for i, b in enumerate(block):
        dim = len(shape) - k + i
        out = out.repeat_interleave(b, dim=dim).narrow(dim, 0, shape[dim])
    return out


def block_amax(x: Tensor, block: tuple[int, ...] | None) -> Tensor:
    """Largest magnitude per block (NaN for a block holding a NaN or an inf: a block whose
    scale cannot be defined)."""
    b = blocks(x.to(torch.float64), block)
    amax = b.abs().amax(dim=-1)
    return torch.where(torch.isfinite(b).all(dim=-1), amax, torch.full_like(amax, math.nan))


# --------------------------------------------------------------------------- scales


def _e8m0_scale(amax: Tensor, elem: Element, rounding: ScaleRounding) -> Tensor:
    """MX shared scale. ``floor``: ``2^(floor(log2 amax) - emax_elem)`` (OCP §6.3);
    ``rceil``: the least power of two ``X`` with ``amax / X ≤ max_elem`` (NVIDIA). The
    exponent is clamped to E8M0's ``[-127, 127]`` below (an all-zero block gets 2^-127, as in
    torchao), and a block whose exponent exceeds 127 or holds a non-finite value gets NaN
    (E8M0 0xFF)."""
    safe = torch.where(torch.isfinite(amax) & (amax > 0), amax, torch.ones_like(amax))
    if rounding == "floor":
        exp = torch.frexp(safe)[1].to(torch.int64) - 1 - elem.emax
    elif rounding == "rceil":
        exp = torch.frexp(safe / elem.max)[1].to(torch.int64) - 1
        # exact comparisons: the float64 quotient may round across a power of two
        exp = torch.where(safe > elem.max * torch.ldexp(torch.ones_like(safe), exp), exp + 1, exp)
        below = elem.max * torch.ldexp(torch.ones_like(safe), exp - 1)
        exp = torch.where(safe <= below, exp - 1, exp)
    else:
        raise ValueError(f"e8m0 scale rounding must be 'floor' or 'rceil', got {rounding!r}")
    exp = torch.where(amax > 0, exp, torch.full_like(exp, E8M0_MIN_EXP))
    scale = torch.ldexp(torch.ones_like(amax), torch.clamp(exp, min=E8M0_MIN_EXP))
    bad = ~torch.isfinite(amax) | (exp > E8M0_MAX_EXP)
    return torch.where(bad, torch.full_like(scale, math.nan), scale)


def _fp32_scale(amax: Tensor, elem: Element) -> Tensor:
    """``amax / max_elem``, so the block's largest element maps to the element's max; an
    all-zero block gets 1 (any positive scale dequantizes its zero codes to zero)."""
    return torch.where(amax > 0, amax / elem.max, torch.ones_like(amax))


def nvfp4_tensor_scale(amax: Tensor) -> Tensor:
    """NVFP4's per-tensor decode scale ``g = amax_tensor / (448·6)`` (NVIDIA, "Introducing
    NVFP4"; Transformer Engine's recipe), so the block holding the tensor's amax gets the
    block scale 448 exactly; 1 for an all-zero tensor, NaN for a non-finite one."""
    g = torch.where(amax > 0, amax / NVFP4_TENSOR_RANGE, torch.ones_like(amax))
    return torch.where(torch.isfinite(amax), g, torch.full_like(g, math.nan))


def scales_from_amax(amax: Tensor, fmt: Format, tensor_scale: Tensor | None = None) -> Tensor:
    """The format's block scales for block amaxes ``amax`` (float64). NVFP4 needs the tensor
    decode scale ``g``: block scales are ``e4m3(amax_block / 6 / g)``, rounded to nearest
    E4M3 (at most 448 by construction); one that rounds to 0 (a block whose amax is at most
    ``2^-10 / 448`` of the tensor's) zeroes its block."""
    if fmt.scale == "e8m0":
        return _e8m0_scale(amax, fmt.elem, fmt.scale_rounding)
    if fmt.scale == "fp32":
        return _fp32_scale(amax, fmt.elem)
    if tensor_scale is None:
        raise ValueError(f"{fmt.name}: block scales need the tensor scale")
    return round_element(amax / (fmt.elem.max * tensor_scale), "e4m3")


def codes_at(x: Tensor, fmt: Format, per_element_scale: Tensor) -> Tensor:
    """``x / scale`` rounded to the element grid (nearest, ties to even, saturating); 0 where
    the scale is 0 and NaN where it is NaN."""
    x64 = x.detach().to(torch.float64)
    s = per_element_scale.to(torch.float64)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    v = torch.where(s > 0, x64 / safe, torch.zeros_like(x64))
    codes = round_element(v, fmt.elem)
    return torch.where(torch.isnan(s), torch.full_like(codes, math.nan), codes)


def quantize(x: Tensor, fmt: str | Format) -> Quantized:
    """Quantize ``x`` in float64 by the format's published definition (see the module
    docstring): per block a scale from the block's amax, then every element rounded to
    nearest (ties to even) on the element grid at that scale, saturating at the max."""
    fmt = resolve(fmt)
    shape = tuple(x.shape)
    check_shape(shape, fmt)
    x64 = x.detach().to(torch.float64)
    tensor_scale = nvfp4_tensor_scale(block_amax(x64, None)) if fmt.scale == "e4m3" else None
    scales = scales_from_amax(block_amax(x64, fmt.block), fmt, tensor_scale)
    per_element = expand(scales, fmt.block, shape)
    if tensor_scale is not None:
        per_element = per_element * tensor_scale
    return Quantized(fmt, codes_at(x64, fmt, per_element), scales, tensor_scale, shape)


def effective_scale(q: Quantized) -> Tensor:
    """Each element's dequantization factor: its block's scale times the tensor scale."""
    per_element = expand(q.scales, q.format.block, q.shape)
    return per_element if q.tensor_scale is None else per_element * q.tensor_scale


def dequantize(q: Quantized) -> Tensor:
    """``codes × block scale (× tensor scale)`` in float64."""
    return q.codes * effective_scale(q)


def bound_at_scale(x: Tensor, scale: Tensor, element: str | Element) -> Tensor:
    """Largest ``|dequant - x|`` for rounding ``x / scale`` to nearest on the element grid
    with saturation: ``scale · max(step(|v|) / 2, |v| - max)`` with ``v = x / scale``. The
    first term is half a grid step (round to nearest; at most ``2^-(mbits+1)·|x|`` for a
    value in the normal range), the second the saturation error. A zero scale (an NVFP4
    block scale that underflowed) loses the whole value: the bound is ``|x|``.

    Plus the float64 rounding of the reference itself: a scale like ``amax / 448`` is not a
    float64 number, so ``x / scale`` and ``code · scale`` round (``2^-53`` relative each);
    ``F64_SLACK = 2^-50`` relative to ``|x|`` and to the bound covers both, many orders of
    magnitude below any grid step."""
    elem = ELEMENTS[element] if isinstance(element, str) else element
    x = x.to(torch.float64)
    scale = scale.to(torch.float64)
    v = torch.where(scale > 0, x.abs() / torch.where(scale > 0, scale, 1.0), 0.0)
    half_step = grid_step(v, elem) / 2
    bound = scale * torch.maximum(half_step, v - elem.max)
    bound = bound * (1 + F64_SLACK) + F64_SLACK * x.abs()
    return torch.where(scale > 0, bound, x.abs())


def error_bound(x: Tensor, fmt: str | Format) -> Tensor:
    """Per-element bound on ``|dequantize(quantize(x)) - x|`` from the format: half a grid
    step of the element format at the block's scale (round to nearest), or the saturation
    error where ``|x| / scale`` exceeds the element max (possible under the OCP ``floor``
    MX scale and where an NVFP4 block scale rounded down). Tight: a tie attains it. Relative
    to ``|x|`` it is at most ``2^-(mbits+1)`` (1/16 for E4M3, 1/8 for E5M2, 1/4 for E2M1) for
    unsaturated values in the element's normal range; below it (subnormals) the bound is
    absolute, half the smallest subnormal times the scale."""
    q = quantize(x, fmt)
    return bound_at_scale(x, effective_scale(q), q.format.elem)
