"""Bit-for-bit comparison of two computations of the same values, and the first module where
two forward passes part.

A "true on-policy" setup (vLLM ``VLLM_BATCH_INVARIANT=1``, SGLang
``--enable-deterministic-inference``, NeMo-RL ``zero_train_gen_mismatch``) promises that the
trainer's log probs equal the engine's bit for bit. Closeness is not the property: a
difference of one unit in the last place (ULP) breaks it as surely as a large one, so
:func:`compare` counts differing bits, never a tolerance, and says how many ULPs apart the
first and the furthest pair lie.

``ULP distance``: the number of representable values of the dtype between two floats, counted
on the integer line that orders a float's bits by value (``-0.0`` and ``0.0`` are 0 ULP apart
and still differ in their bits; a NaN has no distance).

:func:`first_divergence` runs two forward passes under forward hooks and names the first
module, in execution order, whose output differs in its bits: the procedure SGLang's and
RL-Kernel's batch-invariance guides follow by hand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from .reference.masking import as_bool_mask

__all__ = ["BitwiseDifference", "ModuleDivergence", "compare", "first_divergence", "ulp_distance"]

_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}
_DIGITS = {torch.float64: 17, torch.float32: 9, torch.bfloat16: 4, torch.float16: 5}


@dataclasses.dataclass(frozen=True)
class BitwiseDifference:
    """How two tensors of one dtype differ in their bits over the compared positions.

    ``first``: the index of the first differing element (row-major), with both values,
    their bits (hex) and ``ulps`` between them (``None`` where one is NaN); ``max_ulps``:
    the furthest differing pair (``inf`` where a NaN differs).
    """

    compared: int
    differing: int
    dtype: str
    first: tuple[int, ...] | None = None
    values: tuple[float, float] | None = None
    bits: tuple[str, str] | None = None
    ulps: int | None = None
    max_ulps: float | None = None

    @property
    def equal(self) -> bool:
        return self.differing == 0

    def describe(
        self, names: tuple[str, str] = ("trainer", "engine"), axes: tuple[str, ...] = ()
    ) -> str:
        """One line: how many differ, the first (its index named by ``axes``, e.g.
        ``("sample", "token")``) and its values, bits and ULP distance."""
        if self.equal:
            return f"all {self.compared} compared values equal in their bits ({self.dtype})"
        assert self.first is not None and self.values is not None and self.bits is not None
        if len(axes) >= len(self.first):
            at = ", ".join(f"{axis} {i}" for axis, i in zip(axes, self.first, strict=False))
        else:
            at = f"index {', '.join(map(str, self.first))}"
        apart = "NaN, no ULP distance" if self.ulps is None else f"{self.ulps} ULP apart"
        furthest = "" if self.max_ulps is None else f"; the furthest {_ulps(self.max_ulps)} apart"
        (a, b), (bits_a, bits_b) = self.values, self.bits
        return (
            f"{self.differing} of {self.compared} values differ in their bits ({self.dtype}); "
            f"first at ({at}): {names[0]} {a!r} ({bits_a}), {names[1]} {b!r} ({bits_b}), "
            f"{apart}{furthest}"
        )


def _ulps(value: float) -> str:
    return "NaN" if math.isinf(value) else f"{int(value)} ULP"


def _check_pair(a: Tensor, b: Tensor) -> None:
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError(f"compare takes two tensors, got {type(a).__name__}, {type(b).__name__}")
    if a.dtype != b.dtype:
        raise TypeError(
            f"a bitwise comparison needs one dtype, got {a.dtype} and {b.dtype}: compare the "
            "values in the dtype both sides produce (casting one side changes its bits)"
        )
    if a.dtype not in _BITS:
        raise TypeError(f"a bitwise comparison takes floating tensors, got {a.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} and {tuple(b.shape)}")


def _ordered(x: Tensor) -> Tensor:
    """``x``'s bits as int64 ordered by value: adjacent floats are adjacent integers."""
    bits = x.contiguous().view(_BITS[x.dtype]).to(torch.int64)
    sign = -(2 ** (x.element_size() * 8 - 1))
    return torch.where(bits < 0, sign - bits, bits)


def ulp_distance(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise ULP distance of two tensors of one floating dtype, as float64 (exact up to
    2**53 ULP; ``inf`` where either is NaN)."""
    _check_pair(a, b)
    x, y = _ordered(a), _ordered(b)
    same_sign = (x >= 0) == (y >= 0)  # int64 subtraction cannot overflow; across 0 it can
    within = torch.where(same_sign, x - y, 0).abs().double()
    distance = torch.where(same_sign, within, x.double().abs() + y.double().abs())
    return torch.where(a.isnan() | b.isnan(), math.inf, distance)


def _hex(x: Tensor) -> str:
    bits = int(x.view(_BITS[x.dtype]).item()) % (2 ** (x.element_size() * 8))
    return f"0x{bits:0{x.element_size() * 2}x}"


def compare(a: Tensor, b: Tensor, mask: Any = None) -> BitwiseDifference:
    """How ``a`` and ``b`` (one floating dtype, one shape) differ in their bits at the
    positions ``mask`` selects (bool or 0/1 over the leading dimensions, e.g. ``[B, T]``
    over ``[B, T, K]`` top-k log probs; ``None``: everywhere)."""
    _check_pair(a, b)
    a, b = a.detach(), b.detach()
    differs = a.view(_BITS[a.dtype]) != b.view(_BITS[b.dtype])
    selected = torch.ones_like(differs)
    if mask is not None:
        keep = as_bool_mask(torch.as_tensor(mask).detach()).to(differs.device)
        if tuple(keep.shape) != tuple(a.shape[: keep.dim()]):
            raise ValueError(
                f"the mask's shape {tuple(keep.shape)} does not line up with the leading "
                f"dimensions of the values {tuple(a.shape)}"
            )
        selected = keep.reshape(*keep.shape, *([1] * (a.dim() - keep.dim()))).expand_as(a)
        differs = differs & selected
    compared, differing = int(selected.sum()), int(differs.sum())
    name = str(a.dtype).removeprefix("torch.")
    if not differing:
        return BitwiseDifference(compared, 0, name)
    where = tuple(int(i) for i in differs.nonzero()[0])
    x, y = a[where], b[where]
    distance = ulp_distance(a[differs], b[differs])
    first = None if (x.isnan() | y.isnan()).item() else abs(_int(x) - _int(y))
    digits = _DIGITS[a.dtype]
    return BitwiseDifference(
        compared,
        differing,
        name,
        first=where,
        values=(_round(x, digits), _round(y, digits)),
        bits=(_hex(x), _hex(y)),
        ulps=first,
        max_ulps=float(distance.max()),
    )


def _int(x: Tensor) -> int:
    """The exact ordered integer of one element (Python ints: no overflow for float64)."""
    bits = int(x.view(_BITS[x.dtype]).item())
    return bits if bits >= 0 else -(2 ** (x.element_size() * 8 - 1)) - bits


def _round(x: Tensor, digits: int) -> float:
    return float(f"{float(x):.{digits}g}")


@dataclasses.dataclass(frozen=True)
class ModuleDivergence:
    """The first module whose output differs between two forward passes: its qualified
    name (``""``: the model itself), which of its calls (0: the first), the output (index
    into its flattened tensors) and how it differs."""

    module: str
    call: int
    output: int
    difference: BitwiseDifference | None
    detail: str = ""

    def describe(self) -> str:
        """One line: the module, its call and output, and how the two passes differ there."""
        name = self.module or "(the model itself)"
        how = self.detail
        if self.difference is not None:
            how = self.difference.describe(("first pass", "second pass"))
        return (
            f"first module whose output differs: {name} (call {self.call}, output "
            f"{self.output}): {how}"
        )


Recorded = list[tuple[str, int, list[Tensor]]]  # (module, call, flattened output tensors)


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif hasattr(value, "to_tuple"):  # transformers' ModelOutput
        yield from _tensors(value.to_tuple())


def _record(model: torch.nn.Module, run: Callable[[], Any]) -> Recorded:
    """Every module's floating outputs, in the order the forward pass finished them."""
    found: Recorded = []
    calls: dict[str, int] = {}

    def hook(name: str) -> Callable[..., None]:
        def keep(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            outputs = [t.detach().clone() for t in _tensors(output) if t.is_floating_point()]
            found.append((name, calls.get(name, 0), outputs))
            calls[name] = calls.get(name, 0) + 1

        return keep

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return found


def first_divergence(
    model: torch.nn.Module,
    first: Callable[[], Any],
    second: Callable[[], Any],
    *,
    other: torch.nn.Module | None = None,
) -> ModuleDivergence | None:
    """Run ``first()`` and ``second()`` (two forward passes on the same inputs: e.g. the
    trainer's and the engine's path, or batch invariance on and off) under forward hooks on
    every module of ``model`` (of ``other`` for ``second``, if the two sides are separate
    copies with the same module names) and return the first module, in the order the
    passes finished them, whose output differs in its bits; ``None`` if none does.

    A module is matched by its name and call count; one the second pass never called, or
    whose output has another shape or dtype, is reported as the divergence.
    """
    seen = {(n, c): outputs for n, c, outputs in _record(other or model, second)}
    for name, call, outputs in _record(model, first):
        theirs = seen.get((name, call))
        if theirs is None:
            return ModuleDivergence(name, call, 0, None, "the second pass never called it")
        if len(theirs) != len(outputs):
            detail = f"{len(outputs)} floating outputs, the second pass {len(theirs)}"
            return ModuleDivergence(name, call, 0, None, detail)
        for index, (mine, other_output) in enumerate(zip(outputs, theirs, strict=True)):
            if mine.shape != other_output.shape or mine.dtype != other_output.dtype:
                detail = (
                    f"output {tuple(mine.shape)} {mine.dtype}, the second pass "
                    f"{tuple(other_output.shape)} {other_output.dtype}"
                )
                return ModuleDivergence(name, call, index, None, detail)
            difference = compare(mine, other_output)
            if not difference.equal:
                return ModuleDivergence(name, call, index, difference)
    return None
