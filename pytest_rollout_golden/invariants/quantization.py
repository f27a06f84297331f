"""A user's quantizer (FP8 tensorwise/blockwise, MXFP8, NVFP4) against the float64 reference
of :mod:`pytest_rollout_golden.quant`: scales, codes, round-trip error and the format's
structural properties."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..quant.formats import (
    E8M0_MAX_EXP,
    E8M0_MIN_EXP,
    Format,
    Quantized,
    block_amax,
    bound_at_scale,
    check_shape,
    codes_at,
    expand,
    nvfp4_tensor_scale,
    resolve,
    round_element,
    scales_from_amax,
)
from .comparison import F32_EPS, f64, fail, fmt as show, positions

DECISION_RTOL = 8 * F32_EPS
"""How close to a rounding boundary a decision may lie and go either way. An implementation
computes in float32: the scale ``amax / max`` or ``max / amax`` and its reciprocal round
(``2^-24`` relative each), ``x · (1/s)`` rounds again, and a float64 input is first rounded to
float32. Eight units of ``2^-24`` (``4.8e-7``) cover these with margin; the bugs this checker
exists for are off by a factor of 2 (a scale) or a whole grid step (``2^-4`` relative for E4M3)."""

F32_TINY = 2.0**-149
"""float32's smallest subnormal: below ``2^-126`` a float32 scale or product rounds by up
to this much, not relatively."""

UserQuantize = Callable[[Tensor], Any]
UserDequantize = Callable[..., Tensor]


@dataclass(frozen=True)
class _Output:
    """One call of the user's functions, in float64: codes and scales (``None`` for a
    round-trip function) and the dequantized tensor."""

    codes: Tensor | None
    scales: Tensor | None
    tensor_scale: Tensor | None
    dequant: Tensor
    out_eps: float
    out_tiny: float


@dataclass(frozen=True)
class _Setup:
    quantize: UserQuantize
    dequantize: UserDequantize | None
    fmt: Format
    reciprocal_scales: bool
    amax_floor: float


def _grid_of(shape: tuple[int, ...], fmt: Format) -> tuple[int, ...]:
    if fmt.block is None:
        return ()
    return tuple(block_amax(torch.zeros(shape, dtype=torch.float64), fmt.block).shape)


def _as_scales(value: Any, fmt: Format, grid: tuple[int, ...], what: str) -> Tensor:
    """The user's scales as float64 in block-grid order: E8M0 as ``float8_e8m0fnu`` or as
    biased uint8 exponents (255 = NaN), anything else as its float value."""
    t = torch.as_tensor(value).detach()
    if t.dtype == torch.uint8 and fmt.scale == "e8m0":
        exp = t.to(torch.int64) - 127
        s = torch.ldexp(torch.ones(t.shape, dtype=torch.float64), exp)
        t = torch.where(t == 255, torch.full_like(s, math.nan), s)
    t = t.to(torch.float64)
    if t.numel() != math.prod(grid):
        fail(
            "quantization.shape",
            f"{what}: {t.numel()} values (shape {tuple(t.shape)}), the format has "
            f"{math.prod(grid)} blocks (block grid {grid}: {_block_words(fmt)})",
            _grid_hints(t.numel(), fmt, grid),
        )
    return t.reshape(grid)


def _block_words(fmt: Format) -> str:
    if fmt.block is None:
        return "one scale for the tensor"
    if len(fmt.block) == 1:
        return f"{fmt.block[0]}-element blocks along the last dim"
    return " x ".join(map(str, fmt.block)) + " tiles of the last two dims"


def _grid_hints(count: int, fmt: Format, grid: tuple[int, ...]) -> list[str]:
    if not grid:
        return []
    hints = []
    for factor in (0.5, 2.0):
        if count == round(math.prod(grid) / factor):
            size = int(fmt.block[-1] * factor) if fmt.block else 0
            hints.append(f"that is the count for {size}-element blocks: wrong block size?")
    return hints


def _call(setup: _Setup, x: Tensor) -> _Output:
    fmt = setup.fmt
    shape = tuple(x.shape)
    if setup.dequantize is None:
        out = torch.as_tensor(setup.quantize(x))
        _check_shape("round trip output", out, shape)
        return _Output(None, None, None, f64(out), *_roundoff(out.dtype))
    raw = setup.quantize(x)
    parts = (raw.codes, raw.scales, raw.tensor_scale) if isinstance(raw, Quantized) else tuple(raw)
    need = 3 if fmt.scale == "e4m3" else 2
    if len(parts) < need or (need == 2 and len(parts) == 3 and parts[2] is not None):
        fail(
            "quantization.shape",
            f"quantize must return (codes, scales{', tensor_scale' if need == 3 else ''}) for "
            f"{fmt.name}, got {len(parts)} items",
        )
    codes = torch.as_tensor(parts[0])
    _check_shape("codes", codes, shape)
    grid = _grid_of(shape, fmt)
    scales = _as_scales(parts[1], fmt, grid, "scales")
    tensor_scale = _as_scales(parts[2], fmt, (), "tensor_scale") if need == 3 else None
    if setup.reciprocal_scales:
        scales = 1 / scales
        tensor_scale = None if tensor_scale is None else 1 / tensor_scale
    args = raw if isinstance(raw, Quantized) else parts
    deq = torch.as_tensor(
        setup.dequantize(args) if isinstance(raw, Quantized) else setup.dequantize(*args)
    )
    _check_shape("dequantized output", deq, shape)
    return _Output(f64(codes), scales, tensor_scale, f64(deq), *_roundoff(deq.dtype))


def _roundoff(dtype: torch.dtype) -> tuple[float, float]:
    """Relative rounding of a value stored in ``dtype`` and its smallest subnormal (the
    absolute rounding below its normal range)."""
    info = torch.finfo(dtype)
    return info.eps, info.smallest_normal * info.eps


def _check_shape(what: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        fail("quantization.shape", f"{what} has shape {tuple(t.shape)}, the input {shape}")


# --------------------------------------------------------------------------- the run


def _floored(amax: Tensor, floor: float) -> Tensor:
    return torch.where(amax > 0, torch.clamp(amax, min=floor), amax)


def _exact_in_float32(x64: Tensor) -> bool:
    finite = x64[torch.isfinite(x64)]
    return bool((finite.to(torch.float32).to(torch.float64) == finite).all())


class _Run:
    """The user's output on ``x`` and the reference's accepted range of scales."""

    def __init__(self, setup: _Setup, x: Tensor):
        self.setup, self.fmt, self.x = setup, setup.fmt, x
        self.x64 = f64(x)
        self.shape = tuple(x.shape)
        if not bool(torch.isfinite(self.x64).all()):
            raise ValueError("check_quantization: the input must be finite")
        check_shape(self.shape, self.fmt)
        self.out = _call(setup, x)
        input_rtol = 0.0 if _exact_in_float32(self.x64) else DECISION_RTOL
        # a power-of-two scale divides exactly; any other scale rounds in float32
        exact_scale = self.fmt.scale == "e8m0"
        self.codes_rtol = input_rtol if exact_scale else DECISION_RTOL
        floor = exact_scale and self.fmt.scale_rounding == "floor"
        self.scale_rtol = input_rtol if floor else DECISION_RTOL
        if self.fmt.scale == "e4m3":
            self.scale_rtol = 2 * DECISION_RTOL  # the tensor scale's rounding too
        self.amax = block_amax(self.x64, self.fmt.block)
        nvfp4 = self.fmt.scale == "e4m3"  # its floor applies to the tensor amax
        self.scale_amax = self.amax if nvfp4 else _floored(self.amax, setup.amax_floor)
        tensor_amax = _floored(block_amax(self.x64, None), setup.amax_floor)
        self.ref_tensor_scale = (
            nvfp4_tensor_scale(tensor_amax) if self.fmt.scale == "e4m3" else None
        )

    def tensor_scale(self) -> Tensor | None:
        """The user's tensor scale where it has one, else the reference's."""
        if self.out.tensor_scale is not None:
            return self.out.tensor_scale
        return self.ref_tensor_scale

    def scale_range(self) -> tuple[Tensor, Tensor, Tensor]:
        """Reference block scales for the amax rounded down, exactly and up by the decision
        allowance: every scale in ``[low, high]`` is a correct rounding."""
        g, d, amax = self.tensor_scale(), self.scale_rtol, self.scale_amax
        low, mid, high = (scales_from_amax(amax * f, self.fmt, g) for f in (1 - d, 1, 1 + d))
        if self.fmt.scale == "fp32":  # a float32 scale below 2^-126 rounds absolutely
            low, high = low - 2 * F32_TINY, high + 2 * F32_TINY
        return low, mid, high

    def per_element(self, scales: Tensor, tensor_scale: Tensor | None) -> Tensor:
        s = expand(scales, self.fmt.block, self.shape)
        return s if tensor_scale is None else s * tensor_scale

    def user_scale(self) -> Tensor:
        assert self.out.scales is not None
        return self.per_element(self.out.scales, self.out.tensor_scale)

    def allowance(self) -> Tensor:
        """Largest accepted ``|dequant - x|`` per element: the format's bound at the user's
        scale (or at every accepted reference scale for a round trip), the decision allowance
        times ``|x|`` and the rounding of the output to its dtype (plus one float32 multiply)."""
        if self.out.scales is not None:
            bound = bound_at_scale(self.x64, self.user_scale(), self.fmt.elem)
        else:
            g = self.ref_tensor_scale
            bound = torch.stack(
                [bound_at_scale(self.x64, self.per_element(s, g), self.fmt.elem)
                 for s in self.scale_range()]
            ).amax(dim=0)  # fmt: skip
        slack = 2 * max(self.codes_rtol, self.scale_rtol) * self.x64.abs()
        rounding = (self.out.out_eps + 2 * F32_EPS) * self.out.dequant.abs()
        return bound + slack + rounding + self.out.out_tiny + 2 * F32_TINY

    def rerun(self, x: Tensor) -> _Output:
        return _call(self.setup, x)


def _where(index: tuple[int, ...], fmt: Format) -> str:
    """``block (r, b)`` for a block-grid index; ``tensor`` for tensorwise."""
    return "tensor" if fmt.block is None else "block (" + ", ".join(map(str, index)) + ")"


# --------------------------------------------------------------------------- invariants


def _at(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, index)) + ")"


def _no_overflow(run: _Run) -> None:
    out, elem = run.out, run.fmt.elem
    values = out.codes if out.codes is not None else out.dequant
    bad = ~torch.isfinite(values)
    if out.codes is not None:
        bad |= values.abs() > elem.max
    if bool(bad.any()):
        what = "codes" if out.codes is not None else "outputs"
        fail(
            "quantization.no_overflow",
            f"{int(bad.sum())} {what} beyond ±{show(elem.max)} ({elem.name} max) or not finite, "
            "for finite inputs: saturate (clamp x / scale to ±max) before the cast",
            [f"{_at(i)}: x={show(float(run.x64[i]))}, got {show(float(values[i]))}"
             for i in positions(bad)],
        )  # fmt: skip


def _element_grid(run: _Run) -> None:
    codes = run.out.codes
    if codes is None:
        return
    off = round_element(codes, run.fmt.elem) != codes
    if bool(off.any()):
        fail(
            "quantization.element_grid",
            f"{int(off.sum())} codes are not {run.fmt.elem.name} values",
            [f"{_at(i)}: code {show(float(codes[i]), 17)}" for i in positions(off)],
        )


def _valid_scales(s: Tensor, fmt: Format) -> Tensor:
    finite = torch.isfinite(s)
    if fmt.scale == "e8m0":
        mantissa, _ = torch.frexp(torch.where(finite, s, torch.ones_like(s)))
        low, high = math.ldexp(1.0, E8M0_MIN_EXP), math.ldexp(1.0, E8M0_MAX_EXP)
        return finite & (mantissa == 0.5) & (s >= low) & (s <= high)
    if fmt.scale == "e4m3":
        return finite & (s >= 0) & (round_element(s, "e4m3") == s)
    return finite & (s >= 0)


_SCALE_RULES = {
    "e8m0": "a power of two in [2^-127, 2^127] (E8M0)",
    "e4m3": "an E4M3 value in [0, 448]",
    "fp32": "finite and non-negative",
}


def _scale_format(run: _Run) -> None:
    s = run.out.scales
    if s is None:
        return
    bad = ~_valid_scales(s, run.fmt)
    if bool(bad.any()):
        zero = bad & (run.amax == 0)
        hint = (
            " (all-zero blocks got NaN: 0/0 in the scale; guard the amax)"
            if bool((zero & s.isnan()).any())
            else ""
        )
        fail(
            "quantization.scale_format",
            f"{int(bad.sum())} block scales are not {_SCALE_RULES[run.fmt.scale]}{hint}",
            [f"{_where(i, run.fmt)}: scale {show(float(s[i]), 17)}, block amax "
             f"{show(float(run.amax[i]))}" for i in positions(bad)],
        )  # fmt: skip
    g = run.out.tensor_scale
    if g is not None and not (math.isfinite(float(g)) and float(g) > 0):
        fail("quantization.scale_format", f"the tensor scale {float(g)} is not finite positive")


def _tensor_scale_agreement(run: _Run) -> None:
    g, ref = run.out.tensor_scale, run.ref_tensor_scale
    if g is None or ref is None:
        return
    if abs(float(g) - float(ref)) > DECISION_RTOL * float(ref) + 2 * F32_TINY:
        ratio = float(g) / float(ref)
        hint = (
            " (the encode scale 1/g? pass reciprocal_scales=True)"
            if abs(float(g) * float(ref) - 1) < 1e-3
            else ""
        )
        fail(
            "quantization.scale",
            f"tensor scale {show(float(g), 9)}, reference amax / 2688 = {show(float(ref), 9)} "
            f"(ratio {show(ratio)}){hint}",
        )


def _scale_hints(run: _Run, s: Tensor, judged: Tensor) -> list[str]:
    """Name a known wrong rule when every judged scale follows it."""
    fmt, amax = run.fmt, run.amax

    def follows(other: Tensor) -> bool:
        return bool(((other == s) | ~judged).all())

    hints = []
    if fmt.scale == "e8m0":
        exp_down = torch.frexp(torch.where(amax > 0, amax / fmt.elem.max, 1.0))[1] - 1
        if follows(torch.ldexp(torch.ones_like(amax), exp_down)):
            hints.append(
                "the scales are 2^floor(log2(amax / max_elem)): e8m0 rounded down, which "
                "saturates the block's largest elements; OCP's rule is 2^(floor(log2 amax) - "
                "emax_elem), NVIDIA's rounds amax / max_elem up"
            )
        for rounding in ("floor", "rceil"):
            if rounding != fmt.scale_rounding and follows(
                scales_from_amax(amax, fmt.with_scale_rounding(rounding))
            ):
                name = fmt.name.split("@")[0] + ("@rceil" if rounding == "rceil" else "")
                hints.append(f"the scales follow the {rounding!r} rule: declare fmt={name!r}")
    if fmt.block is not None and len(fmt.block) == 1 and run.x64.dim() >= 2:
        column_major = run.x64.transpose(-1, -2).reshape(*run.shape[:-2], 1, -1)
        transposed = scales_from_amax(block_amax(column_major, fmt.block), fmt, run.tensor_scale())
        same = transposed.numel() == s.numel() and torch.equal(transposed.reshape(s.shape), s)
        if same and not follows(run.scale_range()[1]):
            hints.append(
                "the scales are those of blocks taken down the columns (dim -2, column-major "
                "order): transposed blocking"
            )
    return hints


def _scale_agreement(run: _Run) -> None:
    s = run.out.scales
    if s is None:
        return
    _tensor_scale_agreement(run)
    low, mid, high = run.scale_range()
    judged = run.amax > 0  # any valid scale represents an all-zero block
    bad = judged & ((s < low) | (s > high))
    if bool(bad.any()):
        rule = {"e8m0": f"E8M0 {run.fmt.scale_rounding!r} rule", "e4m3": "NVFP4 block scale"}
        fail(
            "quantization.scale",
            f"{int(bad.sum())} of {int(judged.sum())} block scales differ from the "
            f"{rule.get(run.fmt.scale, 'amax / max_elem scale')}",
            [*_scale_hints(run, s, judged)]
            + [f"{_where(i, run.fmt)}: scale={show(float(s[i]), 9)}, reference="
               f"{show(float(mid[i]), 9)} (block amax {show(float(run.amax[i]), 9)})"
               for i in positions(bad)],
        )  # fmt: skip


def _code_hint(codes: Tensor, low: Tensor, high: Tensor, bad: Tensor) -> str:
    c, lo, hi = codes[bad].abs(), low[bad].abs(), high[bad].abs()
    if bool((c < torch.minimum(lo, hi)).all()):
        return ": every one is below the nearest value, rounded toward zero (truncation?)"
    if bool((c > torch.maximum(lo, hi)).all()):
        return ": every one is above the nearest value, rounded away from zero?"
    return ""


def _codes_agreement(run: _Run) -> None:
    codes = run.out.codes
    if codes is None:
        return
    s, x, d = run.user_scale(), run.x64, run.codes_rtol
    low = codes_at(x * (1 - d), run.fmt, s)
    high = codes_at(x * (1 + d), run.fmt, s)
    bad = (codes < torch.minimum(low, high)) | (codes > torch.maximum(low, high))
    if bool(bad.any()):
        v = torch.where(s > 0, x / torch.where(s > 0, s, 1.0), 0.0)
        ref = codes_at(x, run.fmt, s)
        hint = _code_hint(codes, low, high, bad)
        fail(
            "quantization.codes",
            f"{int(bad.sum())} codes are not x / scale rounded to nearest (ties to even) on the "
            f"{run.fmt.elem.name} grid{hint}",
            [f"{_at(i)}: x={show(float(x[i]), 9)}, x/scale={show(float(v[i]), 9)}, "
             f"code={show(float(codes[i]))}, reference={show(float(ref[i]))}"
             for i in positions(bad)],
        )  # fmt: skip


def _dequantize(run: _Run) -> None:
    out = run.out
    if out.codes is None:
        return
    expected = out.codes * run.user_scale()
    tol = (out.out_eps + 2 * F32_EPS) * expected.abs() + out.out_tiny + 2 * F32_TINY
    bad = (out.dequant - expected).abs() > tol
    if bool(bad.any()):
        hint = ""
        if out.tensor_scale is not None:
            block_only = out.codes * expand(out.scales, run.fmt.block, run.shape)  # type: ignore[arg-type]
            if bool(((out.dequant - block_only).abs() <= tol + 1e-300).all()):
                hint = ": codes × block scale without the per-tensor scale"
        fail(
            "quantization.dequantize",
            f"{int(bad.sum())} dequantized values are not code × scale{hint}",
            [f"{_at(i)}: code={show(float(out.codes[i]))}, scale="
             f"{show(float(run.user_scale()[i]), 9)}, dequantized={show(float(out.dequant[i]), 9)}"
             for i in positions(bad)],
        )  # fmt: skip


def _reference_agreement(run: _Run) -> None:
    err = (run.out.dequant - run.x64).abs()
    allowed = run.allowance()
    bad = ~(err <= allowed)
    if bool(bad.any()):
        fail(
            "quantization.reference_agreement",
            f"{int(bad.sum())} round-trip errors exceed the {run.fmt.name} bound (half a grid "
            "step at the block's scale, or the saturation error)",
            [f"{_at(i)}: x={show(float(run.x64[i]), 9)}, dequantized="
             f"{show(float(run.out.dequant[i]), 9)}, error {show(float(err[i]))} > bound "
             f"{show(float(allowed[i]))}" for i in positions(bad)],
        )  # fmt: skip


def _differences(a: _Output, b: _Output, keep: Tensor, keep_blocks: Tensor | None) -> list[str]:
    """Where two outputs differ: codes (or dequantized values) at ``keep`` elements, scales
    at ``keep_blocks``."""
    lines = []
    if a.codes is not None and b.codes is not None:
        moved = keep & (a.codes != b.codes)
        lines += [f"code {_at(i)}: {show(float(a.codes[i]))} -> {show(float(b.codes[i]))}"
                  for i in positions(moved)]  # fmt: skip
    else:
        moved = keep & (a.dequant != b.dequant)
        lines += [f"{_at(i)}: {show(float(a.dequant[i]), 9)} -> {show(float(b.dequant[i]), 9)}"
                  for i in positions(moved)]  # fmt: skip
    if a.scales is not None and b.scales is not None and keep_blocks is not None:
        moved_s = keep_blocks & (a.scales != b.scales)
        lines += [f"scale of block {_at(i)}: {show(float(a.scales[i]), 9)} -> "
                  f"{show(float(b.scales[i]), 9)}" for i in positions(moved_s)]  # fmt: skip
    return lines


def _sign_symmetry(run: _Run) -> None:
    mirrored = run.rerun(-run.x)
    negated = _Output(
        None if run.out.codes is None else -run.out.codes,
        run.out.scales,
        run.out.tensor_scale,
        -run.out.dequant,
        run.out.out_eps,
        run.out.out_tiny,
    )
    everywhere = torch.ones(run.shape, dtype=torch.bool)
    all_blocks = (
        None if run.out.scales is None else torch.ones_like(run.out.scales, dtype=torch.bool)
    )
    lines = _differences(negated, mirrored, everywhere, all_blocks)
    if lines:
        fail(
            "quantization.sign_symmetry",
            "quantizing -x is not the negation of quantizing x (round to nearest even and the "
            "amax are symmetric): expected (x -> -x) vs got",
            lines,
        )


def _probe_block(run: _Run) -> tuple[int, ...] | None:
    """A block to change: the last non-zero one that does not hold the tensor's amax (which
    sets NVFP4's tensor scale and, in any format, is best left alone)."""
    amax_t = float(run.x64.abs().max())
    candidates = (run.amax > 0) & (run.amax < amax_t)
    found = positions(candidates)
    return found[-1] if found else None


def _block_independence(run: _Run) -> None:
    if run.fmt.block is None:
        return
    index = _probe_block(run)
    if index is None:
        return
    one = torch.zeros_like(run.amax, dtype=torch.bool)
    one[index] = True
    inside = expand(one, run.fmt.block, run.shape)
    changed = torch.where(inside, run.x * 0.3, run.x)  # 0.3: not a power of two
    other = run.rerun(changed)
    lines = _differences(run.out, other, ~inside, ~one)
    if lines:
        fail(
            "quantization.block_independence",
            f"changing block {_at(index)} ({_block_words(run.fmt)}; its values × 0.3) changed "
            "codes or scales outside it: the scale is not taken per block of this format",
            lines,
        )


def _idempotence(run: _Run) -> None:
    if run.fmt.scale == "e4m3":
        return  # NVFP4 re-derives block scales from the dequantized amax: not a projection
    again_in = run.out.dequant.to(run.x.dtype)
    again = run.rerun(again_in)
    base = f64(again_in)
    info = torch.finfo(run.x.dtype)
    eps = max(run.out.out_eps, info.eps)
    # feeding the output back in the input's dtype rounds it: relatively, or by one
    # subnormal step of that dtype (float32 below 1.2e-38)
    tol = (2 * eps + DECISION_RTOL) * base.abs() + info.smallest_normal * info.eps
    bad = ~((again.dequant - base).abs() <= tol)
    if bool(bad.any()):
        fail(
            "quantization.idempotence",
            f"{int(bad.sum())} values moved when the dequantized tensor was quantized again "
            "(a dequantized tensor lies on the format's grid: a second round trip keeps it)",
            [f"{_at(i)}: {show(float(base[i]), 9)} -> {show(float(again.dequant[i]), 9)}"
             for i in positions(bad)],
        )  # fmt: skip


_INVARIANTS = (
    _no_overflow,
    _element_grid,
    _scale_format,
    _scale_agreement,
    _codes_agreement,
    _dequantize,
    _reference_agreement,
    _sign_symmetry,
    _block_independence,
    _idempotence,
)


def check_quantization(
    quantize: UserQuantize,
    x: Tensor,
    fmt: str | Format,
    *,
    dequantize: UserDequantize | None = None,
    reciprocal_scales: bool = False,
    amax_floor: float = 0.0,
) -> None:
    """Check a quantizer against the float64 reference of format ``fmt`` on the tensor ``x``.

    Two ways to call it:

    * ``dequantize`` given: ``quantize(x)`` returns ``(codes, scales)`` (NVFP4:
      ``(codes, block_scales, tensor_scale)``) and ``dequantize(*those)`` the tensor.
      ``codes`` has the shape of ``x`` and holds the element values (a float8 tensor or any
      float tensor of them); ``scales`` holds one decode scale per block in block-grid order
      (``x.shape[:-k] + ceil(x.shape[-k:] / block)``; any shape with that many values), as
      floats, ``float8_e8m0fnu`` or biased uint8 E8M0 exponents. ``reciprocal_scales=True``
      if your scales are encode scales (``x · scale`` before the cast, as Transformer
      Engine's ``scale`` rather than its ``scale_inv``).
      ``amax_floor``: your code clamps the amax from below before taking a scale (torch's
      and verl's ``amax.clamp(min=1e-12)``; Transformer Engine caps ``448 / amax`` at
      ``FLT_MAX``, which is ``amax_floor=448 / FLT_MAX``); the reference does the same for
      non-zero blocks (NVFP4: for the tensor amax), and the floor shows in your test.
    * no ``dequantize``: ``quantize`` is a round trip, ``x`` to the dequantized tensor.

    Invariants (the first broken one fails, named in brackets):

    * ``quantization.shape``: codes and output shaped like ``x``, one scale per block;
    * ``quantization.no_overflow``: codes within ±max of the element format and finite
      (saturation, not inf or NaN);
    * ``quantization.element_grid``: codes are element-format values;
    * ``quantization.scale_format``: scales are E8M0 powers of two / E4M3 values / finite;
    * ``quantization.scale``: each block's scale is the reference's for its amax (the MX rule
      ``fmt`` declares, ``amax / max_elem``, NVFP4's ``e4m3(amax_b / 6 / g)`` with
      ``g = amax / 2688``); all-zero blocks may have any valid scale;
    * ``quantization.codes``: ``x / scale`` rounded to nearest, ties to even, saturating;
    * ``quantization.dequantize``: the output is ``code × scale``;
    * ``quantization.reference_agreement``: ``|dequant - x|`` within the format's bound
      (:func:`pytest_rollout_golden.quant.error_bound`);
    * ``quantization.sign_symmetry``: ``-x`` gives the negated codes and the same scales;
    * ``quantization.block_independence``: changing one block changes no other block's codes
      or scale;
    * ``quantization.idempotence``: a dequantized tensor survives a second round trip (not
      for NVFP4, whose block scales come from the dequantized amax).

    Tolerance: a decision (which power of two, which E4M3 block scale, which side of a tie)
    whose deciding quantity lies within ``DECISION_RTOL = 8·2^-24`` relative of a boundary is
    accepted either way, because an implementation computes in float32; fp32 scales agree
    to that relative tolerance. A power-of-two scale from a float32-exact input leaves no such
    freedom. Round-trip errors get the same allowance times ``|x|`` plus the rounding of the
    output to its dtype. Raises ``ValueError`` for a non-finite ``x`` or a shape the format
    cannot block.
    """
    setup = _Setup(quantize, dequantize, resolve(fmt), reciprocal_scales, amax_floor)
    run = _Run(setup, x)
    for invariant in _INVARIANTS:
        invariant(run)
