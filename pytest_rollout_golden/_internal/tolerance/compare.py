"""The one comparison routine: a recorded value against a replayed one, under a tolerance.

Scalars and tensors take the same path (scalars are 0-d tensors). Bit-equal
inputs return after a single pass; only a real mismatch pays for the
element-wise analysis, whose message follows torch.testing's: mismatched
elements k / n (p%), greatest absolute and relative difference and their index.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..report.presentation import ALLOW_NAN
from .stack import Resolver, Tolerance


@dataclasses.dataclass
class Difference:
    """Outcome of :func:`compare_values`.

    ``abs_diff``/``rel_diff`` are the greatest differences, ``abs_mean``/``rel_mean``
    their means over the elements where they are finite (NaN against a number, and a
    relative difference against 0, are left out), ``mismatched`` the count beyond
    tolerance. The differences are NaN when shapes or dtypes differ or the value was
    not compared. ``excess`` is the greatest difference over the difference allowed
    there among the mismatched elements (0 when none is; inf where nothing was allowed or
    a NaN appeared);
    ``scale`` the magnitude ``rtol`` was measured against (0: each value's own).
    """

    ok: bool
    abs_diff: float
    rel_diff: float
    detail: str = ""
    mismatched: int = 0
    numel: int = 0
    abs_mean: float = 0.0
    rel_mean: float = 0.0
    compared: bool = True
    excess: float = 0.0
    scale: float = 0.0


def _as_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (bool, int, float)):
        return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
    return torch.as_tensor(value)


def _work_dtype(a: Any, b: Any) -> Any:
    import torch

    if a.is_complex() or b.is_complex():
        return torch.complex128
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64
    return torch.float32


def _bit_equal_elements(e: Any, a: Any) -> Any:
    import torch

    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if e.is_complex():
        e, a = torch.view_as_real(e), torch.view_as_real(a)
        return _bit_equal_elements(e, a).all(dim=-1)
    if e.dtype == torch.bool:
        return e == a
    view = ints[e.element_size()]
    return e.contiguous().view(view) == a.contiguous().view(view)


def _bits(t: Any) -> Any:
    import torch

    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.element_size() else t


def compare_values(
    expected: Any,
    actual: Any,
    tol: Tolerance,
    *,
    check_dtype: bool,
    mask: Any = None,
    magnitude: float | None = None,
) -> Difference:
    """Compare ``actual`` with ``expected`` (tensors, arrays or numbers) under ``tol``.

    ``mask`` (a bool tensor broadcastable to both) selects the positions compared;
    the others (padding) count as equal whatever they hold. A mask that selects none of
    a non-empty tensor's positions fails: nothing compared is no pass. ``magnitude``: what
    ``scale="recorded"`` stands for (a metric's largest recorded magnitude over its
    steps); without it, the largest finite magnitude among the compared expected values.
    """
    import torch

    if tol.ignore:
        return Difference(True, math.nan, math.nan, "not compared", compared=False)
    e, a = _as_tensor(expected), _as_tensor(actual)
    if a.device != e.device:
        a = a.to(e.device)
    n = e.numel()
    if e.shape != a.shape:
        return Difference(
            False,
            math.nan,
            math.nan,
            f"shape {tuple(a.shape)} differs from the recorded {tuple(e.shape)}",
            mismatched=max(n, a.numel()),
            numel=n,
            abs_mean=math.nan,
            rel_mean=math.nan,
        )
    if check_dtype and e.dtype != a.dtype:
        return Difference(
            False,
            math.nan,
            math.nan,
            f"dtype {a.dtype} differs from the recorded {e.dtype}",
            mismatched=n,
            numel=n,
            abs_mean=math.nan,
            rel_mean=math.nan,
        )
    masked = ""
    if mask is not None:
        keep = torch.broadcast_to(mask.to(e.device), e.shape)
        e, a = e.masked_fill(~keep, 0), a.masked_fill(~keep, 0)
        n = int(keep.count_nonzero())
        masked = f"mask applied: {n} of {e.numel()} positions compared, padding ignored"
        if n == 0 and e.numel():  # a gate that compares nothing must not read as a pass
            return Difference(
                False,
                math.nan,
                math.nan,
                f"the mask selects none of the {e.numel()} positions: nothing was compared "
                "(a regression in the masking code?); leave the tensor out of check_tensors "
                "where nothing is meant to be compared",
                numel=0,
                abs_mean=math.nan,
                rel_mean=math.nan,
                excess=math.inf,
            )
    if tol.exact and e.dtype == a.dtype and torch.equal(_bits(e), _bits(a)):
        return Difference(True, 0.0, 0.0, numel=n)
    if not tol.exact and e.dtype == a.dtype and torch.equal(e, a):
        return Difference(True, 0.0, 0.0, numel=n)
    if n == 0:
        return Difference(True, 0.0, 0.0)

    scale = _scale(tol, e, magnitude)
    stats = _Stats()
    flat_e, flat_a = e.reshape(-1), a.reshape(-1)
    bitwise = tol.exact and e.dtype == a.dtype
    for start in range(0, flat_e.numel(), _CHUNK):
        ce, ca = flat_e[start : start + _CHUNK], flat_a[start : start + _CHUNK]
        if e.dtype == a.dtype and (
            torch.equal(_bits(ce), _bits(ca)) if bitwise else torch.equal(ce, ca)
        ):
            stats.abs_count += ce.numel()  # all-zero differences
            stats.rel_count += ce.numel()
            continue  # equal chunks (NaN never equals itself here) cannot hold a mismatch
        stats.add(start, *_chunk_analysis(ce, ca, tol, bitwise, scale))
    means = {
        "mismatched": stats.bad,
        "numel": n,
        "abs_mean": stats.abs_sum / stats.abs_count if stats.abs_count else math.nan,
        "rel_mean": stats.rel_sum / stats.rel_count if stats.rel_count else math.nan,
        "excess": stats.excess,
        "scale": scale,
    }
    if stats.bad == 0:
        return Difference(True, stats.abs_max, stats.rel_max, **means)
    if e.dim() == 0:
        return Difference(False, stats.abs_max, stats.rel_max, "", **means)
    lines = [masked] if masked else []
    lines.append(f"Mismatched elements: {stats.bad} / {n} ({100.0 * stats.bad / n:.1f}%)")
    if stats.nan_vs_value:
        lines.append(
            f"NaN against a number at {stats.nan_vs_value} element(s), "
            f"first at index {_index(stats.first_nan, e.shape)}"
        )
    if stats.nan_vs_nan:
        lines.append(
            f"NaN against NaN at {stats.nan_vs_nan} element(s) (equal_nan is off): {ALLOW_NAN}"
        )
    allowed_abs = "0 (bit-exact)" if tol.exact else f"{tol.atol:.3g}"
    allowed_rel = "0 (bit-exact)" if tol.exact else f"{tol.rtol:.3g}"
    if scale and not tol.exact:  # what atol + rtol * max(|expected|, scale) allows there
        there = abs(float(flat_e[stats.abs_idx].abs().clamp_min(scale)))
        allowed_abs = f"{tol.atol + tol.rtol * there:.3g}"
        allowed_rel = f"{tol.rtol:.3g} of max(|expected|, {scale:.3g})"
    lines.append(
        f"Greatest absolute difference: {stats.abs_max:.6g} at index "
        f"{_index(stats.abs_idx, e.shape)} (up to {allowed_abs} allowed)"
    )
    lines.append(
        f"Greatest relative difference: {stats.rel_max:.6g} at index "
        f"{_index(stats.rel_idx, e.shape)} (up to {allowed_rel} allowed)"
    )
    return Difference(False, stats.abs_max, stats.rel_max, "\n".join(lines), **means)


def _scale(tol: Tolerance, e: Any, magnitude: float | None) -> float:
    """The number ``tol.scale`` stands for with these expected values."""
    if tol.scale != "recorded":
        return float(tol.scale)
    if magnitude is not None:
        return magnitude
    return finite_magnitude(e)


def finite_magnitude(value: Any) -> float:
    """The largest finite ``|x|`` of a tensor (0 when there is none)."""
    import torch

    t = _as_tensor(value)
    if t.is_complex():
        t = t.abs()
    if not t.is_floating_point():
        t = t.double()
    if t.numel() == 0:
        return 0.0
    t = t.abs()
    return float(torch.where(t.isfinite(), t, torch.zeros_like(t)).max())


# Elements analysed at a time: the temporaries of one chunk stay in cache, and a
# drift confined to a few elements costs only the chunks that hold it.
_CHUNK = 1 << 18


@dataclasses.dataclass
class _Stats:
    """Running totals of the element-wise analysis over chunks."""

    bad: int = 0
    nan_vs_value: int = 0
    first_nan: int = -1
    nan_vs_nan: int = 0
    abs_max: float = 0.0
    abs_idx: int = 0
    rel_max: float = 0.0
    rel_idx: int = 0
    abs_sum: float = 0.0
    abs_count: int = 0  # elements whose absolute difference is finite
    rel_sum: float = 0.0
    rel_count: int = 0  # elements whose relative difference is finite
    excess: float = 0.0

    def add(
        self,
        start: int,
        bad: int,
        nan_vs_value: int,
        first_nan: int,
        nan_vs_nan: int,
        greatest_abs: tuple[float, int],
        greatest_rel: tuple[float, int],
        sums: tuple[float, int, float, int],
        excess: float,
    ) -> None:
        abs_sum, abs_count, rel_sum, rel_count = sums
        self.excess = max(self.excess, excess)
        self.abs_sum += abs_sum
        self.abs_count += abs_count
        self.rel_sum += rel_sum
        self.rel_count += rel_count
        self.bad += bad
        if nan_vs_value and self.first_nan < 0:
            self.first_nan = start + first_nan
        self.nan_vs_value += nan_vs_value
        self.nan_vs_nan += nan_vs_nan
        if _above(greatest_abs[0], self.abs_max):
            self.abs_max, self.abs_idx = greatest_abs[0], start + greatest_abs[1]
        if _above(greatest_rel[0], self.rel_max):
            self.rel_max, self.rel_idx = greatest_rel[0], start + greatest_rel[1]


def _above(value: float, current: float) -> bool:
    return value > current or (math.isnan(current) and not math.isnan(value))


def _chunk_analysis(e: Any, a: Any, tol: Tolerance, bitwise: bool, scale: float) -> tuple:
    """Mismatch count, NaN counts, greatest absolute and relative difference of one chunk."""
    import torch

    same_bits = _bit_equal_elements(e, a) if bitwise else None
    integral = not (
        e.is_floating_point() or e.is_complex() or a.is_floating_point() or a.is_complex()
    )
    # Integers differ exactly in int64; as float64 they would be equal past 2**53.
    exact_diff = (a.long() - e.long()).abs().double() if integral else None
    dtype = _work_dtype(e, a)
    e, a = e.to(dtype), a.to(dtype)
    diff = exact_diff if exact_diff is not None else (a - e).abs()
    e_nan, a_nan = e.isnan(), a.isnan()
    both_nan = e_nan & a_nan
    equal = (diff == 0) if integral else a == e
    allowed: Any = 0.0
    if same_bits is not None:  # the exact lane also catches -0.0 vs 0.0...
        # ...but a NaN matches any NaN: metrics.json cannot keep a NaN's sign and
        # payload, and metrics and tensors follow one rule
        ok = same_bits | both_nan
    else:
        magnitude = e.abs().clamp_min(scale) if scale else e.abs()
        allowed = 0.0 if tol.exact else tol.atol + tol.rtol * magnitude
        # An infinity matches only itself: inf - x <= rtol * inf would let +inf pass as
        # -inf or as any finite value (torch.testing compares non-finite values by equality).
        ok = equal | ((diff <= allowed) & e.isfinite() & a.isfinite())
        if tol.equal_nan or tol.exact:
            ok |= both_nan
    diff = torch.where(both_nan | equal, torch.zeros_like(diff), diff)
    rel = diff / e.abs()
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    rel = torch.where(diff.isinf(), diff, rel)  # inf vs finite: inf/inf would be NaN, shown as 0
    bad = ~ok
    n_bad = int(torch.count_nonzero(bad))
    sums = (*_finite_sum(diff), *_finite_sum(rel))
    excess = _excess(diff, allowed, bad, tol.exact) if n_bad else 0.0
    nan_mismatch = e_nan ^ a_nan
    n_nan = int(torch.count_nonzero(nan_mismatch))
    first_nan = int(torch.nonzero(nan_mismatch)[0, 0]) if n_nan else -1
    return (
        n_bad,
        n_nan,
        first_nan,
        int(torch.count_nonzero(both_nan & bad)),
        _greatest(diff),
        _greatest(rel),
        sums,
        excess,
    )


def _excess(diff: Any, allowed: Any, bad: Any, exact: bool) -> float:
    """The greatest ``diff / allowed`` among the mismatched elements ``bad`` (some are);
    inf for a mismatch no ratio measures (NaN against a number, an infinity, a difference
    where nothing was allowed). Only mismatches are measured: a drift in a few elements
    costs a few divisions."""
    import torch

    if exact:
        return math.inf
    where = bad.reshape(-1).nonzero().squeeze(1)
    limit = allowed.reshape(-1)[where] if isinstance(allowed, torch.Tensor) else allowed
    ratio = diff.reshape(-1)[where] / limit
    measured = ratio.isfinite() & (ratio > 1)
    return float(torch.where(measured, ratio, torch.full_like(ratio, math.inf)).max())


def _finite_sum(values: Any) -> tuple[float, int]:
    """Sum and count of the finite elements (one pass when all are finite, the usual case)."""
    total = float(values.sum())
    if math.isfinite(total):
        return total, values.numel()
    finite = values.isfinite()
    return float(values[finite].sum()), int(finite.sum())


def dtype_name(value: Any) -> str:
    """``"float32"`` for a float32 tensor or array; ``"float64"`` for a Python number."""
    dtype = getattr(value, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float64"


def compare_named(
    name: str,
    expected: Any,
    actual: Any,
    resolver: Resolver,
    *,
    check_dtype: bool,
    mask: Any = None,
    magnitude: float | None = None,
) -> tuple[Difference, Tolerance, str]:
    """Resolve the tolerance of ``name`` for these values, then :func:`compare_values`."""
    tol, source = resolver.resolve(name, (dtype_name(expected), dtype_name(actual)))
    diff = compare_values(
        expected, actual, tol, check_dtype=check_dtype, mask=mask, magnitude=magnitude
    )
    return diff, tol, source


def _greatest(values: Any) -> tuple[float, int]:
    flat = values.reshape(-1)
    if flat.numel() == 0:
        return 0.0, 0
    ranked = flat.nan_to_num(
        nan=-math.inf, posinf=math.inf, neginf=-math.inf
    )  # NaN mismatches are reported on their own line
    value, index = ranked.max(dim=0)
    return (float(value) if value > -math.inf else math.nan), int(index)


def _index(flat: int, shape: Any) -> tuple[int, ...]:
    out = []
    for size in reversed(tuple(shape)):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))
