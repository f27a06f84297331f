"""The one comparison routine: a recorded value against a replayed one, under a tolerance.

Scalars and tensors take the same path (scalars are 0-d tensors). The outcome is numbers,
a :class:`Difference`; :func:`..golden.messages.difference_detail` writes its text, which
follows torch.testing's: mismatched elements k / n (p%), greatest absolute and relative
difference and their index.

Equal inputs cost one pass that compares them (by value, NaN never equal to NaN; by bytes
in the exact lane). Only the elements that differ pay for the element-wise analysis, and
only where they are: a drift in a few elements costs a few divisions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .spec import Tolerance
from .stack import Resolver

# Why a value was not compared element by element: shapes differ, dtypes differ (where
# they must match), or a mask selects none of a non-empty tensor's positions.
Problem = Literal["shape", "dtype", "nothing selected"]


@dataclasses.dataclass
class Difference:
    """Outcome of :func:`compare_values`: numbers only.

    ``abs_diff``/``rel_diff`` are the greatest differences (at ``abs_index``/``rel_index``),
    ``abs_mean``/``rel_mean`` their means over the elements where they are finite (NaN
    against a number, and a relative difference against 0, are left out), ``mismatched``
    the count beyond tolerance among ``numel`` compared. The differences are NaN when
    ``problem`` says why nothing was compared element-wise, or the value was not
    ``compared`` (its tolerance ignores it). ``excess`` is the greatest difference over
    the difference allowed there among the mismatched elements (0 when none is; inf where
    nothing was allowed or a NaN appeared); ``scale`` the magnitude ``rtol`` was measured
    against (0: each value's own), ``allowed_there`` the difference allowed at
    ``abs_index`` under a scale.

    ``shapes`` and ``dtypes`` are the recorded one's and the replayed one's; ``positions``
    counts the elements (compared or not), ``masked`` says a mask chose the compared ones.
    ``nan_vs_value`` counts NaN against a number (the first at ``first_nan``),
    ``nan_vs_nan`` NaN against NaN where the tolerance does not equate them.
    """

    ok: bool
    abs_diff: float = math.nan
    rel_diff: float = math.nan
    mismatched: int = 0
    numel: int = 0
    abs_mean: float = 0.0
    rel_mean: float = 0.0
    compared: bool = True
    excess: float = 0.0
    scale: float = 0.0
    tolerance: Tolerance | None = None
    problem: Problem | None = None
    shapes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    dtypes: tuple[str, str] = ("", "")
    positions: int = 0
    masked: bool = False
    nan_vs_value: int = 0
    first_nan: tuple[int, ...] = ()
    nan_vs_nan: int = 0
    abs_index: tuple[int, ...] = ()
    rel_index: tuple[int, ...] = ()
    allowed_there: float = math.nan


_UNMEASURED = {"abs_mean": math.nan, "rel_mean": math.nan}


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
        return Difference(True, compared=False, tolerance=tol)
    e, a = _as_tensor(expected), _as_tensor(actual)
    if a.device != e.device:
        a = a.to(e.device)
    facts: dict[str, Any] = {
        "tolerance": tol,
        "shapes": (tuple(e.shape), tuple(a.shape)),
        "dtypes": (str(e.dtype), str(a.dtype)),
        "positions": e.numel(),
        "masked": mask is not None,
    }
    n = e.numel()
    if e.shape != a.shape or (check_dtype and e.dtype != a.dtype):
        problem: Problem = "shape" if e.shape != a.shape else "dtype"
        mismatched = max(n, a.numel())
        return Difference(
            False, mismatched=mismatched, numel=n, problem=problem, **_UNMEASURED, **facts
        )
    if mask is not None:
        keep = torch.broadcast_to(mask.to(e.device), e.shape)
        e, a = e.masked_fill(~keep, 0), a.masked_fill(~keep, 0)
        n = int(keep.count_nonzero())
        if n == 0 and e.numel():  # a gate that compares nothing must not read as a pass
            return Difference(
                False,
                numel=0,
                excess=math.inf,
                problem="nothing selected",
                **_UNMEASURED,
                **facts,
            )
    if e.numel() == 0:
        return Difference(True, 0.0, 0.0, **facts)
    if e.numel() <= _SMALL and _equal(e, a, bits=tol.exact):  # most metrics: nothing to set up
        return Difference(True, 0.0, 0.0, numel=n, **facts)
    stats = _elementwise(e, a, tol, magnitude)
    if stats.value_equal:
        return Difference(True, 0.0, 0.0, numel=n, **facts)
    return _outcome(stats, e, n, tol, facts)


def _outcome(stats: _Stats, e: Any, n: int, tol: Tolerance, facts: dict[str, Any]) -> Difference:
    """The :class:`Difference` of an element-wise analysis of ``n`` compared elements."""
    import torch

    scale = stats.scale or 0.0
    allowed_there = math.nan
    if stats.bad and scale and not tol.exact and e.dim():  # where a detail states it
        value = e.reshape(-1)[stats.abs_idx]
        if value.dtype == torch.bool or _float8(value):  # abs(), clamp_min() lack them
            value = value.float()
        allowed_there = tol.atol + tol.rtol * abs(float(value.abs().clamp_min(scale)))
    return Difference(
        stats.bad == 0,
        stats.abs_max,
        stats.rel_max,
        mismatched=stats.bad,
        numel=n,
        abs_mean=stats.abs_sum / stats.abs_count if stats.abs_count else math.nan,
        rel_mean=stats.rel_sum / stats.rel_count if stats.rel_count else math.nan,
        excess=stats.excess,
        scale=scale,
        nan_vs_value=stats.nan_vs_value,
        first_nan=_index(stats.first_nan, e.shape) if stats.nan_vs_value else (),
        nan_vs_nan=stats.nan_vs_nan,
        abs_index=_index(stats.abs_idx, e.shape),
        rel_index=_index(stats.rel_idx, e.shape),
        allowed_there=allowed_there,
        **facts,
    )


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


def _equal(e: Any, a: Any, *, bits: bool) -> bool:
    """Whether ``e`` and ``a`` have one dtype and are equal: in bits (``bits``), else in
    value (NaN never equals NaN)."""
    import torch

    if e.dtype != a.dtype:
        return False
    return torch.equal(_bits(e), _bits(a)) if bits else torch.equal(e, a)


def _float8(t: Any) -> bool:
    return t.is_floating_point() and t.element_size() == 1


def _bits(t: Any) -> Any:
    import torch

    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.element_size() else t


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
    if _float8(t):  # aminmax() and isfinite() lack it
        t = t.float()
    if t.numel() == 0:
        return 0.0
    low, high = (float(x) for x in torch.aminmax(t))
    if math.isfinite(low) and math.isfinite(high):  # one pass, no temporary
        return abs(max(-low, high))
    t = t.abs()
    return float(torch.where(t.isfinite(), t, torch.zeros_like(t)).max())


# Elements analysed at a time: the temporaries of one chunk stay in cache, and a
# drift confined to a few elements costs only the chunks that hold it. The means sum
# each chunk's differences in one reduction, so the chunk's length is part of the result.
_CHUNK = 1 << 18
# Above this share of differing elements a chunk is analysed whole, not gathered.
_SPARSE = 8
# Up to this many elements a tensor is first compared whole, as torch.equal does.
_SMALL = 1 << 12
# Dtypes numpy compares in value (without a bfloat16 or float8).
_NUMPY_FLOATS = frozenset({"float16", "float32", "float64", "complex64", "complex128"})


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
    scale: float | None = None  # set once a chunk is analysed
    value_equal: bool = False  # same dtype and nothing unequal (no scale was applied)

    def add(self, start: int, chunk: _Chunk) -> None:
        self.excess = max(self.excess, chunk.excess)
        self.abs_sum += chunk.abs_sum
        self.abs_count += chunk.abs_count
        self.rel_sum += chunk.rel_sum
        self.rel_count += chunk.rel_count
        self.bad += chunk.bad
        if chunk.nan_vs_value and self.first_nan < 0:
            self.first_nan = start + chunk.first_nan
        self.nan_vs_value += chunk.nan_vs_value
        self.nan_vs_nan += chunk.nan_vs_nan
        if _above(chunk.abs_max, self.abs_max):
            self.abs_max, self.abs_idx = chunk.abs_max, start + chunk.abs_idx
        if _above(chunk.rel_max, self.rel_max):
            self.rel_max, self.rel_idx = chunk.rel_max, start + chunk.rel_idx


@dataclasses.dataclass
class _Chunk:
    """What the analysis of one chunk adds to :class:`_Stats` (indices within the chunk)."""

    bad: int
    abs_max: float
    abs_idx: int
    rel_max: float
    rel_idx: int
    abs_sum: float
    abs_count: int
    rel_sum: float
    rel_count: int
    excess: float = 0.0
    differs: bool = True  # some element differs: in value, or in the exact lane in bits
    nan_vs_value: int = 0
    first_nan: int = -1
    nan_vs_nan: int = 0


def _above(value: float, current: float) -> bool:
    return value > current or (math.isnan(current) and not math.isnan(value))


def _elementwise(e: Any, a: Any, tol: Tolerance, magnitude: float | None) -> _Stats:
    """The element-wise analysis of every chunk that may hold a difference.

    A chunk passed over holds only equal values (no NaN; in the exact lane, equal bits):
    its differences are zeros, all counted as finite.
    """
    same_dtype = e.dtype == a.dtype
    flat_e, flat_a = _flat(e), _flat(a)
    numel = flat_e.numel()
    if same_dtype and numel > _SMALL:
        chunks = _chunks_to_analyse(flat_e, flat_a, bits=tol.exact)
    else:  # every element of every chunk
        chunks = ((start, None) for start in range(0, numel, _CHUNK))
    stats, analysed, differs = _Stats(), 0, False
    lane = _Lane(tol, bitwise=tol.exact and same_dtype)
    zeros: dict[Any, Any] = {}
    for start, positions in chunks:
        if stats.scale is None:
            stats.scale = lane.scale = _scale(tol, e, magnitude)
        ce, ca = flat_e[start : start + _CHUNK], flat_a[start : start + _CHUNK]
        chunk = _chunk_analysis(ce, ca, _Positions(positions, ce.numel(), zeros), lane)
        stats.add(start, chunk)
        analysed += ce.numel()
        differs = differs or chunk.differs
    stats.abs_count += numel - analysed
    stats.rel_count += numel - analysed
    stats.value_equal = same_dtype and not differs
    return stats


def _flat(t: Any) -> Any:
    """``t`` as one contiguous row of its values as stored (conjugation, negation resolved)."""
    return t.resolve_conj().resolve_neg().reshape(-1).contiguous()


def _chunks_to_analyse(e: Any, a: Any, *, bits: bool) -> Iterator[tuple[int, Any]]:
    """``(start, positions)`` of each chunk of the same-dtype rows ``e`` and ``a`` that holds
    an element that differs: in bits (``bits``: the exact lane), else in value (NaN never
    equals NaN); ``positions``: where in the chunk, ``None`` to analyse all of it."""
    if e.device.type == "cpu" and not bits and dtype_name(e) in _NUMPY_FLOATS:
        chunks = _numpy_chunks_to_analyse(e.numpy(), a.numpy())
    else:
        chunks = _torch_chunks_to_analyse(e, a, bits=bits)
    if e.is_complex():
        # abs() of a complex number may differ in the last bit with its place in a
        # vector: an element analysed elsewhere than in its chunk could measure another
        return ((start, None) for start, _ in chunks)
    return chunks


def _torch_chunks_to_analyse(e: Any, a: Any, *, bits: bool) -> Iterator[tuple[int, Any]]:
    """:func:`_chunks_to_analyse` of torch rows."""
    same = _equality(e, a, bits=bits)
    for start in range(0, e.numel(), _CHUNK):
        stop = min(start + _CHUNK, e.numel())
        if same(start, stop):
            continue
        ce, ca = e[start:stop], a[start:stop]
        differ = ~_bit_equal_elements(ce, ca) if bits else ce != ca
        count = int(differ.count_nonzero())
        if count:  # none: equal values in other bits (-0.0 and 0.0)
            yield start, None if _dense(count, ce.numel()) else differ.nonzero().squeeze(1)


def _numpy_chunks_to_analyse(e: Any, a: Any) -> Iterator[tuple[int, Any]]:
    """:func:`_chunks_to_analyse` of numpy rows, in value: one pass compares and spots NaN,
    several times faster than ``torch.equal``."""
    import numpy
    import torch

    buffer = numpy.empty(min(_CHUNK, len(e)), dtype=bool)
    for start in range(0, len(e), _CHUNK):
        stop = min(start + _CHUNK, len(e))
        equal = numpy.equal(e[start:stop], a[start:stop], out=buffer[: stop - start])
        count = equal.size - int(numpy.count_nonzero(equal))
        if count and _dense(count, equal.size):
            yield start, None
        elif count:
            differ = numpy.logical_not(equal, out=equal)
            yield start, torch.from_numpy(differ.nonzero()[0])


def _dense(count: int, length: int) -> bool:
    """Whether a chunk of ``length`` with ``count`` differing elements is analysed whole
    rather than gathered."""
    return count * _SPARSE > length


def _equality(e: Any, a: Any, *, bits: bool) -> Callable[[int, int], bool]:
    """``(start, stop) -> whether elements start:stop of the same-dtype rows are equal``:
    in bits (``bits``), else in value, where NaN never equals NaN (as ``torch.equal``
    says; bytes compare several times faster on the CPU)."""
    memcmp = _memcmp() if e.device.type == "cpu" else None
    if memcmp is None:
        return lambda start, stop: _equal(e[start:stop], a[start:stop], bits=bits)
    size, at_e, at_a = e.element_size(), e.data_ptr(), a.data_ptr()

    def same_bytes(start: int, stop: int) -> bool:
        return memcmp(at_e + start * size, at_a + start * size, (stop - start) * size) == 0

    if bits or not (e.is_floating_point() or e.is_complex()):
        return same_bytes
    return lambda start, stop: same_bytes(start, stop) and not _has_nan(e[start:stop])


@functools.cache
def _memcmp() -> Any:
    """The C library's ``memcmp`` (``None`` where it cannot be loaded): it compares bytes
    several times faster than ``torch.equal``, which compares element by element."""
    import ctypes

    try:
        library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        memcmp = library.memcmp
    except (OSError, AttributeError):
        return None
    memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    memcmp.restype = ctypes.c_int
    return memcmp


def _has_nan(t: Any) -> bool:
    """Whether ``t`` holds a NaN: a sum without one is finite, except on overflow or an
    infinity, where the elements are looked at."""
    import torch

    if t.is_complex():
        t = torch.view_as_real(t)
    total = float(t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32))
    return not math.isfinite(total) and bool(t.isnan().any())


@dataclasses.dataclass
class _Lane:
    """The tolerance a chunk is analysed under: ``bitwise`` (the exact lane, same dtypes:
    bits decide) and the ``scale`` ``rtol`` is measured against."""

    tol: Tolerance
    bitwise: bool
    scale: float = 0.0

    @property
    def bounded(self) -> bool:
        """Whether the difference allowed is a number (never NaN) at every finite value."""
        tol = self.tol
        return all(math.isfinite(x) for x in (tol.rtol, tol.atol, self.scale))

    def allowed(self, e_abs: Any) -> Any:
        """``atol + rtol * max(|expected|, scale)`` (0 where ``exact`` allows nothing)."""
        if self.tol.exact:
            return 0.0
        magnitude = e_abs.clamp_min(self.scale) if self.scale else e_abs
        return self.tol.atol + self.tol.rtol * magnitude


@dataclasses.dataclass
class _Positions:
    """Where the analysed elements lie in their chunk of ``length`` (``positions``:
    ``None`` for all of it); ``zeros`` lends a chunk of zeros per dtype to sum in."""

    positions: Any
    length: int
    zeros: dict[Any, Any]

    def take(self, chunk: Any) -> Any:
        return chunk if self.positions is None else chunk[self.positions]

    def of(self, index: int) -> int:
        """The index in the chunk of analysed element ``index``."""
        return index if self.positions is None else int(self.positions[index])

    def finite_sum(self, values: Any) -> tuple[float, int]:
        """:func:`_finite_sum` of the chunk's values: ``values`` at their positions, zeros
        elsewhere. Reduced whole, a chunk sums in one order whatever was analysed."""
        import torch

        if self.positions is None:
            return _finite_sum(values)
        if values.dtype not in self.zeros:
            self.zeros[values.dtype] = torch.zeros(_CHUNK, dtype=values.dtype, device=values.device)
        chunk = self.zeros[values.dtype][: self.length]
        chunk.index_put_((self.positions,), values)
        try:
            return _finite_sum(chunk)
        finally:
            chunk.index_fill_(0, self.positions, 0)


def _chunk_analysis(ce: Any, ca: Any, where: _Positions, lane: _Lane) -> _Chunk:
    """Mismatches, NaN counts, greatest differences and their sums in one chunk.

    Only the elements at ``where`` may differ: the others hold equal values, no NaN (in
    the exact lane, equal bits).
    """
    e, a = where.take(ce), where.take(ca)
    same_bits = _bit_equal_elements(e, a) if lane.bitwise else None
    integral = not (
        e.is_floating_point() or e.is_complex() or a.is_floating_point() or a.is_complex()
    )
    # Integers differ exactly in int64; as float64 they would be equal past 2**53.
    exact_diff = (a.long() - e.long()).abs_().double() if integral else None
    dtype = _work_dtype(e, a)
    e, a = e.to(dtype), a.to(dtype)
    diff = exact_diff if exact_diff is not None else (a - e)
    diff = diff.abs() if diff.is_complex() else diff.abs_()
    if same_bits is None and lane.bounded:
        total = float(diff.sum())
        if math.isfinite(total):  # no NaN, no infinity: none of their special cases applies
            return _finite_chunk(e, diff, total, where, lane)
    return _any_chunk(e, a, diff, same_bits, integral, where, lane)


def _finite_chunk(e: Any, diff: Any, total: float, where: _Positions, lane: _Lane) -> _Chunk:
    """:func:`_chunk_analysis` where every difference is finite (``total``: their sum).

    Equal values differ by +0.0 here, which every tolerance allows: the difference alone
    decides.
    """
    import torch

    e_abs = e.abs()
    allowed = lane.allowed(e_abs)
    ok = diff <= allowed
    n_bad = diff.numel() - int(torch.count_nonzero(ok))
    rel = diff.div(e_abs).nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)  # 0 / 0
    abs_sums = (total, diff.numel()) if where.positions is None else where.finite_sum(diff)
    found = _extremes(diff, rel, where, nan=False, abs_sums=abs_sums)
    return _Chunk(
        bad=n_bad,
        **found,
        excess=_excess(diff, allowed, ~ok, lane.tol.exact) if n_bad else 0.0,
        differs=found["abs_max"] > 0,
    )


def _extremes(
    diff: Any, rel: Any, where: _Positions, *, nan: bool, abs_sums: tuple[float, int]
) -> dict[str, Any]:
    """The greatest absolute and relative differences of a chunk, where they are, and the
    sums and counts of their finite values: the :class:`_Chunk` fields both analyses share."""
    abs_max, abs_idx = _greatest(diff, nan=nan)
    rel_max, rel_idx = _greatest(rel, nan=nan)
    rel_sum, rel_count = where.finite_sum(rel)
    return {
        "abs_max": abs_max,
        "abs_idx": where.of(abs_idx),
        "rel_max": rel_max,
        "rel_idx": where.of(rel_idx),
        "abs_sum": abs_sums[0],
        "abs_count": abs_sums[1],
        "rel_sum": rel_sum,
        "rel_count": rel_count,
    }


def _any_chunk(
    e: Any, a: Any, diff: Any, same_bits: Any, integral: bool, where: _Positions, lane: _Lane
) -> _Chunk:
    """:func:`_chunk_analysis` of any values (NaN, infinities, the exact lane)."""
    import torch

    e_nan, a_nan = e.isnan(), a.isnan()
    both_nan = e_nan & a_nan
    equal = (diff == 0) if integral else a == e
    e_abs = e.abs()
    allowed: Any = 0.0
    if same_bits is not None:  # the exact lane: -0.0 is not 0.0, a NaN only its own bits
        ok = same_bits
    else:
        allowed = lane.allowed(e_abs)
        # An infinity matches only itself: inf - x <= rtol * inf would let +inf pass as
        # -inf or as any finite value (torch.testing compares non-finite values by equality).
        ok = equal | ((diff <= allowed) & e.isfinite() & a.isfinite())
        if lane.tol.equal_nan or lane.tol.exact:
            ok |= both_nan
    diff.masked_fill_(both_nan | equal, 0)
    rel = diff / e_abs
    rel.masked_fill_(diff == 0, 0)
    rel.masked_fill_(diff.isinf(), math.inf)  # inf vs finite: inf/inf would be NaN, shown as 0
    bad = ~ok
    n_bad = int(torch.count_nonzero(bad))
    nan_mismatch = e_nan ^ a_nan
    n_nan = int(torch.count_nonzero(nan_mismatch))
    nan = n_nan > 0 or e.is_complex()  # complex: inf - inf in one part is NaN
    return _Chunk(
        bad=n_bad,
        **_extremes(diff, rel, where, nan=nan, abs_sums=where.finite_sum(diff)),
        excess=_excess(diff, allowed, bad, lane.tol.exact) if n_bad else 0.0,
        differs=not bool((same_bits if same_bits is not None else equal).all()),
        nan_vs_value=n_nan,
        first_nan=where.of(int(torch.nonzero(nan_mismatch)[0, 0])) if n_nan else -1,
        nan_vs_nan=int(torch.count_nonzero(both_nan & bad)),
    )


def _excess(diff: Any, allowed: Any, bad: Any, exact: bool) -> float:
    """The greatest ``diff / allowed`` among the mismatched elements ``bad`` (some are);
    inf for a mismatch no ratio measures (NaN against a number, an infinity, a difference
    where nothing was allowed)."""
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


def _greatest(values: Any, *, nan: bool) -> tuple[float, int]:
    """The greatest of ``values`` other than NaN (``nan``: some may be) and its first index;
    NaN when all are NaN (NaN mismatches are reported on their own line)."""
    flat = values.reshape(-1)
    if flat.numel() == 0:
        return 0.0, 0
    ranked = flat.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf) if nan else flat
    value, index = ranked.max(dim=0)
    return (float(value) if value > -math.inf else math.nan), int(index)


def _index(flat: int, shape: Any) -> tuple[int, ...]:
    out = []
    for size in reversed(tuple(shape)):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


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
