"""The weight-sync round trip: what the rollout engine received, dequantized and compared per
parameter with the trainer's master weights, within a bound the format implies; a parameter
beyond it is diagnosed (the first differing block, and the layout that would match).

What the engine received, per parameter name, is one of: a tensor (bf16, or already
dequantized), a :class:`~.formats.Quantized`, or a state-dict entry of float8 codes beside
its scale tensor (``<name>_scale``, ``<name>_scale_inv``, or ``<module>.weight_scale_inv``
for ``<module>.weight``), whose format is given (``formats=``) or read from the tensors
(:func:`.manifest.detect`). A refit's list of ``(name, tensor)`` pairs is taken as a dict.

The bound, per element, with ``sent`` the master weights cast to the dtype the trainer
sends (``sent_dtype``, bf16 by default, as verl and NeMo-RL export before quantizing)::

    allowed = 2 * error_bound(sent, fmt) + |sent - master|

``error_bound`` is the reference's own round-trip bound (half a grid step of the element
format at the block's scale, or the saturation error); the factor 2 admits an engine whose
scale is up to one binade larger than the reference's (E8M0 scales rounded up, NVIDIA's
``rceil``, against the OCP ``floor``: at most 2x; an fp32 scale stored rounded: less), which
at most doubles the grid step; ``|sent - master|`` is the cast, computed, not bounded. A
tensor received unquantized is allowed only the cast. Nothing else is tolerated: a wrong
layout moves values by their own size, far beyond half a grid step.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from . import formats as F
from .manifest import detect

__all__ = ["Mismatch", "RoundTrip", "check_round_trip", "round_trip"]

SCHEME_FORMATS = {
    "fp8-e4m3": "fp8_e4m3_tensor",
    "fp8-e5m2": "fp8_e5m2_tensor",
    "fp8-e4m3-block128": "fp8_e4m3_block128",
    "mxfp8": "mxfp8_e4m3",
}
"""The reference format (:data:`.formats.FORMATS`) of each scheme :func:`.manifest.detect`
reads from an engine's tensors."""

_SCALES = ("_scale_inv", "_scale", "_scale_from_checkpoint")


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One parameter beyond its bound: how far, where first, and the layout that would match
    (``None``: none of those tried)."""

    name: str
    format: str
    beyond: int
    count: int
    worst: float
    allowed: float
    relative: float
    first_block: str
    matches: str | None

    def describe(self) -> str:
        """One paragraph naming the parameter, the error and the first differing block."""
        text = (
            f"{self.name} ({self.format}): {self.beyond} of {self.count} elements beyond the "
            f"bound (greatest |error| {self.worst:.4g} where {self.allowed:.4g} is allowed; "
            f"relative error |received - master| / |master| = {self.relative:.4f}); "
            f"first differing block: {self.first_block}"
        )
        return text + (f"; {self.matches}" if self.matches else "; no layout tried matches")


@dataclasses.dataclass(frozen=True)
class RoundTrip:
    """The round trip of every parameter: those compared, those beyond their bound, those
    the engine did not receive and those it received that the trainer does not hold."""

    compared: dict[str, float]  # name -> relative error
    mismatches: list[Mismatch]
    missing: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not (self.mismatches or self.missing)

    def describe(self) -> str:
        """The failures, one per line, or a one-line pass."""
        if self.ok:
            worst = max(self.compared.values(), default=0.0)
            return (
                f"weight sync round trip: {len(self.compared)} parameters within their "
                f"bounds (greatest relative error {worst:.4f})"
            )
        lines = [
            f"weight sync round trip: {len(self.mismatches)} of {len(self.compared)} "
            "parameters beyond their bounds"
            + (f", {len(self.missing)} not received" if self.missing else "")
        ]
        lines += ["    " + m.describe() for m in self.mismatches]
        lines += [
            f"    {name}: the engine received no tensor of this name" for name in self.missing
        ]
        return "\n".join(lines)


def round_trip(
    master: Mapping[str, Tensor],
    received: Mapping[str, Any] | Iterable[tuple[str, Any]],
    *,
    formats: Mapping[str, str] | str | None = None,
    sent_dtype: torch.dtype | None = torch.bfloat16,
    splits: Mapping[str, Sequence[int]] | None = None,
    shards: int = 1,
) -> RoundTrip:
    """Dequantize what the engine ``received`` and compare it with the trainer's ``master``
    weights, parameter by parameter (see the module docstring for the bound).

    ``formats``: the reference format per parameter name, or one for every quantized
    parameter and every float32/float64 tensor (taken as dequantized; a bf16 tensor without
    a scale was sent unquantized); default: read from the received tensors. ``sent_dtype``:
    what the trainer cast the master weights to before sending (``None``: as they are).
    ``splits``: per fused parameter, the sizes of its parts along dim -2 (``qkv_proj``:
    ``(q, k, v)`` rows), tried in every order when it fails; any parameter with an even
    number of rows is tried with its halves swapped (gate/up). ``shards``: the
    tensor-parallel degree, whose shard orders are tried along both dims."""
    got = dict(received)
    held = _held(got, formats)
    out = RoundTrip({}, [], [], sorted(set(held) - set(master)))
    for name, weight in master.items():
        if name not in held:
            out.missing.append(name)
            continue
        value, fmt = held[name]
        found = _compare(name, weight, value, fmt, sent_dtype, (splits or {}).get(name), shards)
        out.compared[name] = found[0]
        if found[1] is not None:
            out.mismatches.append(found[1])
    return out


def check_round_trip(
    master: Mapping[str, Tensor], received: Mapping[str, Any] | Iterable[tuple[str, Any]], **kw: Any
) -> RoundTrip:
    """:func:`round_trip`, raising AssertionError with its description when it fails."""
    found = round_trip(master, received, **kw)
    if not found.ok:
        raise AssertionError(found.describe())
    return found


def _held(got: dict[str, Any], formats: Mapping[str, str] | str | None) -> dict[str, Any]:
    """``{name: (tensor or Quantized, format name or None)}`` of what the engine holds."""
    schemes = {
        n: e.scheme
        for n, e in detect({n: v for n, v in got.items() if isinstance(v, Tensor)}).items()
    }
    out: dict[str, Any] = {}
    for name, value in got.items():
        if name not in schemes and not isinstance(value, F.Quantized):
            continue  # a scale tensor, or a companion such as input_scale
        fmt = formats if isinstance(formats, str) else (formats or {}).get(name)
        if isinstance(value, F.Quantized):
            out[name] = (value, value.format.name)
            continue
        fmt = fmt or SCHEME_FORMATS.get(schemes[name])
        scale = _scale_of(name, got)
        if fmt is None or scale is None:
            named = isinstance(formats, Mapping) and name in formats
            wide = value.dtype in (torch.float32, torch.float64)  # dequantized, not sent as is
            out[name] = (value, fmt if named or (wide and fmt in F.FORMATS) else None)
            continue
        out[name] = (_as_quantized(value, scale, fmt), fmt)
    return out


def _scale_of(name: str, got: Mapping[str, Any]) -> Tensor | None:
    candidates = [name + s for s in _SCALES]
    if name.endswith(".weight"):
        candidates += [name + s[1:] for s in ("_weight_scale_inv", "_weight_scale")]
        candidates += [name.removesuffix("weight") + s[1:] for s in _SCALES]
    return next((got[c] for c in candidates if c in got), None)


def _as_quantized(codes: Tensor, scale: Tensor, fmt: str) -> F.Quantized:
    """The engine's codes and scales as the reference's :class:`~.formats.Quantized`: codes as
    their element values, an E8M0 scale stored as uint8 bytes decoded to ``2^(byte - 127)``."""
    form = F.resolve(fmt)
    if scale.dtype == torch.uint8:  # E8M0 bytes; 0xFF is NaN
        exponent = scale.to(torch.int64) - 127
        scales = torch.ldexp(torch.ones(scale.shape, dtype=torch.float64), exponent)
        scales = torch.where(scale == 255, torch.full_like(scales, float("nan")), scales)
    else:
        scales = scale.to(torch.float64)
    return F.Quantized(form, codes.to(torch.float64), scales, None, tuple(codes.shape))


def _compare(
    name: str,
    master: Tensor,
    value: Any,
    fmt: str | None,
    sent_dtype: torch.dtype | None,
    split: Sequence[int] | None,
    shards: int,
) -> tuple[float, Mismatch | None]:
    """``(relative error, the mismatch or None)`` of one parameter."""
    x = master.detach().to(torch.float64)
    sent = x if sent_dtype is None else master.detach().to(sent_dtype).to(torch.float64)
    allowed = (sent - x).abs()
    if fmt is not None:
        allowed = allowed + 2 * F.error_bound(sent, fmt)
    quantized = isinstance(value, F.Quantized)
    got = F.dequantize(value) if quantized else value.detach().to(torch.float64)
    label = fmt or str(value.dtype).removeprefix("torch.")
    if got.shape != x.shape:
        if got.ndim < 2 or got.transpose(-1, -2).shape != x.shape:
            raise ValueError(
                f"{name}: the engine holds shape {tuple(got.shape)}, the trainer {tuple(x.shape)}"
            )
        back = got.transpose(-1, -2)
        where = f"the whole tensor: shape {tuple(got.shape)} is the master's transposed"
        error = (back - x).abs()
        relative = _relative(back, x)
        return relative, Mismatch(
            name, label, x.numel(), x.numel(), float(error.max()),
            float(allowed.flatten()[error.argmax()]), relative, where,
            _suggest(got, x, allowed, split, shards),
        )  # fmt: skip
    error = (got - x).abs()
    beyond = ~(error <= allowed)
    relative = _relative(got, x)
    if not bool(beyond.any()):
        return relative, None
    block = F.resolve(fmt).block if fmt is not None else None
    return relative, Mismatch(
        name, label, int(beyond.sum()), x.numel(), float(error.max()),
        float(allowed.flatten()[error.argmax()]), relative, _first_block(beyond, block),
        _suggest(got, x, allowed, split, shards),
    )  # fmt: skip


def _relative(got: Tensor, x: Tensor) -> float:
    norm = float(torch.linalg.vector_norm(x))
    return float(torch.linalg.vector_norm(got - x)) / norm if norm > 0 else float(got.abs().max())


def _first_block(beyond: Tensor, block: tuple[int, ...] | None) -> str:
    """Where the first element beyond its bound lies: its expert (a leading dim), and its
    block's rows and columns in the format's block grid."""
    index = [int(i) for i in beyond.nonzero()[0]]
    parts = [f"expert {index[0]}"] if beyond.ndim == 3 else []
    if beyond.ndim == 1:
        return f"element {index[0]}"
    row, col = index[-2], index[-1]
    if block is None:
        return ", ".join([*parts, f"element ({row}, {col})"])
    sizes = {(32,): (1, 32), (16,): (1, 16), (128, 128): (128, 128), (1, 128): (1, 128)}
    rows, cols = sizes.get(block or (), (1, 1))
    r0, c0 = row // rows * rows, col // cols * cols
    r1, c1 = min(r0 + rows, beyond.shape[-2]) - 1, min(c0 + cols, beyond.shape[-1]) - 1
    parts.append(f"rows {r0}-{r1}, cols {c0}-{c1}")
    return ", ".join(parts)


def _suggest(
    got: Tensor, x: Tensor, allowed: Tensor, split: Sequence[int] | None, shards: int
) -> str | None:
    """The first layout under which ``got`` matches ``x``, in words. A layout matches when
    its error's norm is within the bound's norm: the engine quantized the tensor in its own
    layout (a transposed matrix's blocks run along the master's columns), so the per-element
    bound of the master's blocks need not hold elementwise, while a wrong layout's error is
    of the size of the weights themselves."""
    limit = float(torch.linalg.vector_norm(allowed))
    for words, layout in _candidates(got, x, split, shards):
        moved = layout(got)
        if moved.shape == x.shape and float(torch.linalg.vector_norm(moved - x)) <= limit:
            return f"matches {words}"
    if got.ndim == 3 and got.shape == x.shape:
        return _expert_order(got, x, allowed)
    return None


def _candidates(
    got: Tensor, x: Tensor, split: Sequence[int] | None, shards: int
) -> Iterable[tuple[str, Callable[[Tensor], Tensor]]]:
    if got.ndim >= 2:
        yield "transposed", lambda t: t.transpose(-1, -2)
    if got.shape != x.shape:
        return
    rows = x.shape[-2] if x.ndim >= 2 else x.shape[-1]
    parts = list(split) if split else ([rows // 2] * 2 if rows % 2 == 0 else None)
    if parts and sum(parts) == rows and got.ndim >= 2:
        for order in itertools.permutations(range(len(parts))):
            if list(order) != sorted(order):
                yield _fused_words(order, len(parts)), _reorder(parts, order, -2)
    if shards > 1:
        for dim in (-2, -1):
            size = x.shape[dim] // shards
            for order in itertools.permutations(range(shards)):
                if list(order) != sorted(order):
                    yield (
                        f"with its {shards} shards along dim {dim} in the order {list(order)}",
                        _reorder([size] * shards, order, dim),
                    )


def _fused_words(order: Sequence[int], n: int) -> str:
    if n == 2:
        return "with its two fused halves along dim -2 swapped (gate/up order: W13 vs W31)"
    return f"with its fused parts along dim -2 in the order {list(order)}"


def _reorder(sizes: Sequence[int], order: Sequence[int], dim: int) -> Callable[[Tensor], Tensor]:
    """The inverse of concatenating the parts of ``sizes`` in ``order`` along ``dim``: the
    received tensor holds part ``order[i]`` at position ``i``."""

    def undo(t: Tensor) -> Tensor:
        held = list(t.split([sizes[o] for o in order], dim=dim))
        parts = [held[list(order).index(i)] for i in range(len(sizes))]
        return torch.cat(parts, dim=dim)

    return undo


def _expert_order(got: Tensor, x: Tensor, allowed: Tensor) -> str | None:
    """Which experts (dim 0) the engine holds in whose place, if a permutation matches."""
    n = x.shape[0]
    place = []
    for j in range(n):
        fits = [
            i
            for i in range(n)
            if float(torch.linalg.vector_norm(got[j] - x[i]))
            <= float(torch.linalg.vector_norm(allowed[i]))
        ]
        if not fits:
            return None
        place.append(fits[0])
    if sorted(place) != list(range(n)):
        return None
    moved = [(j, i) for j, i in enumerate(place) if i != j]
    if len(moved) == 2:
        return f"matches if experts {moved[0][0]} and {moved[1][0]} are swapped"
    listed = ", ".join(f"{j} holds expert {i}" for j, i in moved)
    return f"matches with the experts reordered: position {listed}"
