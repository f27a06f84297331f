"""Wording every text of the package shares: numbers, counts, lists, locations, steps,
paths, tables and "did you mean" hints.

Torch-free and the bottom of ``_internal``: it imports nothing above the store, so the
tolerance code, goldens, reports, the plugin and the CLI all word things the same way.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..store import floatbits


class Located(Protocol):
    """Where a value was checked: a comparison (:class:`..results.Comparison`) is one."""

    step: Any
    rank: int | None
    micro: int | None


def number(value: Any, digits: int | None = None) -> str:
    """A value in a table cell: floats in full (``repr``) or to ``digits`` significant digits.

    ``None`` is ``-``; an array's summary ``{"dtype", "shape"}`` reads ``float32[2, 3]``
    (a 0-d array's, with its ``value``: that value); non-finite floats read ``nan``,
    ``inf``, ``-inf``, a NaN of other bits than ``float("nan")`` ``nan:0x...`` (its float64
    bits). Expected and actual values are
    shown in full: rounded, a 1-ulp drift would show two equal numbers.
    """
    if value is None:
        return "-"
    if isinstance(value, dict) and "value" in value:
        return number(value["value"], digits)
    if isinstance(value, dict):
        return f"{value.get('dtype')}{value.get('shape')}"
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy or torch scalar
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) and floatbits.python_bits(value):  # the bits tell NaNs apart
            return f"nan:{floatbits.python_bits(value)}"
        return repr(value) if digits is None or not math.isfinite(value) else f"{value:.{digits}g}"
    return str(value)


def plural(count: int, word: str, words: str | None = None) -> str:
    """``"1 golden"``, ``"2 goldens"``: a count and its noun (``words``: an irregular plural)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def listed(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` of ``items``, comma-separated, and how many more there are."""
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")


def location(step: Any, rank: int | None = None, micro: int | None = None) -> str:
    """``"step 3, rank 0, micro 1"``: where a value was checked (rank and micro if given)."""
    parts = [f"step {step}"]
    parts += [f"{k} {v}" for k, v in (("rank", rank), ("micro", micro)) if v is not None]
    return ", ".join(parts)


def where(c: Located) -> str:
    """The :func:`location` of a comparison."""
    return location(c.step, c.rank, c.micro)


def step_ranges(values: Iterable[int]) -> str:
    """``"0-2, 5"``: sorted steps with runs of consecutive ones joined."""
    values = sorted(values)
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ", ".join(out)


def steps(values: Iterable[int]) -> str:
    """``"step 3"`` or ``"steps 0-2, 5"``."""
    values = set(values)
    return f"step{'s' if len(values) > 1 else ''} {step_ranges(values)}"


def display(path: str | os.PathLike[str], relative_to: str | os.PathLike[str] | None = None) -> str:
    """``path`` relative to ``relative_to`` (default: the working directory), as printed."""
    try:
        return os.path.relpath(path, relative_to)
    except ValueError:  # another drive (Windows)
        return str(path)


def table(rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    """Rows as left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in rows
    ]


def nothing_selected(positions: int, leave_out: str) -> str:
    """Why a comparison whose mask selects none of ``positions`` fails: nothing compared
    is no pass (``leave_out``: what to leave out where nothing is meant to be compared)."""
    return (
        f"the mask selects none of the {positions} positions: nothing was compared "
        f"(a regression in the masking code?); leave {leave_out} where nothing is meant "
        "to be compared"
    )


def close_match(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'grad_norm'?)"`` when one of ``candidates`` looks like ``name``."""
    import difflib  # only on a mistake

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_nan(value: object) -> bool:
    """A scalar NaN of any type (Python, NumPy); a tensor's summary or text is not one."""
    return isinstance(value, numbers.Real) and math.isnan(value)
