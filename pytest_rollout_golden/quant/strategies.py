"""Hypothesis strategy for weight tensors that exercise a quantization format's edges."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from torch import Tensor

from .formats import Format, blocks, resolve

BLOCK_KINDS = ("normal", "zero", "tiny", "underflow", "outlier", "ties", "saturating")
"""What a block of a drawn weight holds (shrinking goes towards ``normal``): gaussian values;
all zeros; values ``2^-6..2^-30`` of the rest (NVFP4: subnormal or zero E4M3 block scales);
values around ``2^-118..2^-135`` (E8M0 scales at their ``2^-127`` floor, float32 subnormals);
one element ``2^4..2^16`` times the rest; midpoints of the element grid at an exact
power-of-two scale (ties); an amax of ``1.875 · 2^(emax+j)``, which the OCP MX scale saturates."""

_TIE_GRID = {
    "e4m3": [1.0 + k / 8 for k in range(8)],
    "e5m2": [1.0 + k / 4 for k in range(4)],
    "e2m1": [1.0, 1.5],
}


def _shape(draw: st.DrawFn, fmt: Format, max_blocks: int) -> tuple[int, ...]:
    if fmt.block is None:
        return (draw(st.integers(1, 3)), draw(st.integers(1, 64)))
    if fmt.block == (128, 128):
        return (128 * draw(st.integers(1, 2)), 128 * draw(st.integers(1, 2)))
    per_row = draw(st.integers(1, max_blocks))
    return (draw(st.integers(1, 3)), fmt.block[-1] * per_row)


def _ties(gen: torch.Generator, n: int, fmt: Format, power: int) -> Tensor:
    """Midpoints between neighbouring element values at scale ``2^power``, and the element
    max at that scale so the block's scale is exactly ``2^power``."""
    grid = _TIE_GRID[fmt.elem.name]
    top = fmt.elem.emax
    exps = torch.randint(fmt.elem.emin, top, (n,), generator=gen)
    mant = torch.tensor(grid, dtype=torch.float64)[torch.randint(len(grid), (n,), generator=gen)]
    half_step = 2.0 ** -(fmt.elem.mbits + 1)
    values = torch.ldexp(mant + half_step, exps)
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    values = values * signs
    values[0] = fmt.elem.max
    return torch.ldexp(values, torch.tensor(power))


def _block_values(
    draw: st.DrawFn, kind: str, base: Tensor, gen: torch.Generator, fmt: Format, power: int
) -> Tensor:
    n = base.numel()
    if kind == "zero":
        return torch.zeros_like(base)
    if kind == "tiny":
        return torch.ldexp(base, torch.tensor(-draw(st.integers(6, 30))))
    if kind == "underflow":
        return torch.ldexp(torch.randn(n, generator=gen, dtype=torch.float64),
                           torch.tensor(-draw(st.integers(118, 135))))  # fmt: skip
    if kind == "outlier":
        out = base.clone()
        out[draw(st.integers(0, n - 1))] *= 2.0 ** draw(st.integers(4, 16))
        return out
    if kind == "ties":
        return _ties(gen, n, fmt, power)
    if kind == "saturating":
        top = 1.875 * 2.0 ** (fmt.elem.emax + power)
        out = base.clamp(-top, top)
        out[int(out.abs().argmax())] = top
        return out
    return base


@st.composite
def quantization_weights(
    draw: st.DrawFn,
    fmt: str | Format,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] = (torch.float32, torch.bfloat16),
    max_blocks: int = 4,
    kinds: Sequence[str] = BLOCK_KINDS,
) -> Tensor:
    """A 2-D weight for format ``fmt`` (whole blocks: 1-3 rows of ``1..max_blocks`` blocks;
    128-multiples for 128x128 tiles) whose blocks each hold one of :data:`BLOCK_KINDS`.

    Values come from a drawn seed (gaussian) at a drawn magnitude ``2^-16..2^16``, so a
    failing example shrinks to a small shape, plain blocks and a readable seed."""
    fmt = resolve(fmt)
    dtypes = [dtype] if isinstance(dtype, torch.dtype) else list(dtype)
    chosen = draw(st.sampled_from(dtypes))
    shape = _shape(draw, fmt, max_blocks)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    power = draw(st.integers(-16, 16))
    x = torch.ldexp(torch.randn(shape, generator=gen, dtype=torch.float64), torch.tensor(power))
    block = fmt.block if fmt.block is not None else (min(32, shape[-1]),)
    index = blocks(torch.arange(1, x.numel() + 1).reshape(shape), block)
    flat_index = index.reshape(-1, index.shape[-1])
    count = flat_index.shape[0]
    chosen_kinds = draw(st.lists(st.sampled_from(list(kinds)), min_size=count, max_size=count))
    if fmt.block is None or fmt.scale == "e4m3":
        # a tensor-level scale needs a tensor amax in float32's normal range: a float32
        # implementation cannot hold the encode scale of a tensor below ~1e-36
        chosen_kinds[0] = draw(
            st.sampled_from([k for k in kinds if k not in ("zero", "underflow")] or ["normal"])
        )
    flat = x.reshape(-1)
    for members, kind in zip(flat_index, chosen_kinds, strict=True):
        where = members[members > 0] - 1  # zero marks padding
        flat[where] = _block_values(draw, kind, flat[where], gen, fmt, power)
    return flat.reshape(shape).to(chosen)
