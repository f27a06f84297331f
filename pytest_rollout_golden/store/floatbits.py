"""The bits of a float that its text form loses: the payload and sign of a NaN.

JSON holds a NaN as the string ``"nan"``, which reads back as the one NaN each dtype makes by
default (``float("nan")``: ``0x7ff8000000000000``; float32 ``0x7fc00000``). A NaN with other
bits (a payload some frameworks use as a marker, or a negative NaN from ``-x``) is written
with its bits as well, as hex of the unsigned integer of the dtype's width, most significant
digit first (``"0x7fc00042"``); a default NaN, and every other value, is written as before.
"""

from __future__ import annotations

import math
import re
import struct
import sys
from typing import Any

_HEX = re.compile(r"0x[0-9a-f]+")
_WIDTHS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}  # bits
_DEFAULT_NAN = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000}
_DEFAULT_NAN["float64"] = 0x7FF8000000000000


def _text(bits: int, dtype: str) -> str | None:
    return None if bits == _DEFAULT_NAN[dtype] else f"0x{bits:0{_WIDTHS[dtype] // 4}x}"


def python_bits(value: float) -> str | None:
    """The bits of ``value`` where its text form loses them (a NaN that is not the default
    one), else ``None``."""
    if not math.isnan(value):
        return None
    return _text(struct.unpack("<Q", struct.pack("<d", value))[0], "float64")


def python_float(text: str) -> float:
    """The Python float of bits :func:`python_bits` wrote."""
    return struct.unpack("<d", struct.pack("<Q", int(text, 16)))[0]


def numpy_bits(value: Any) -> str | None:
    """The bits of numpy float scalar ``value`` where its text form loses them, else
    ``None`` (a dtype other than float16/32/64 never loses any)."""
    np = sys.modules["numpy"]
    name = value.dtype.name
    if name not in _WIDTHS or not np.isnan(value):
        return None
    unsigned = np.dtype(f"<u{value.dtype.itemsize}")
    return _text(int(np.asarray(value).astype(value.dtype.newbyteorder("<")).view(unsigned)), name)


def numpy_scalar(text: str, dtype: Any) -> Any:
    """The numpy scalar of ``dtype`` with the bits :func:`numpy_bits` wrote."""
    import numpy as np

    dtype = np.dtype(dtype)
    unsigned = np.array(int(text, 16), dtype=f"<u{dtype.itemsize}")
    return unsigned.view(dtype.newbyteorder("<")).astype(dtype)[()]


def tensor_bits(value: Any) -> str | None:
    """The bits of 0-d floating torch tensor ``value`` where its text form loses them, else
    ``None``."""
    torch = sys.modules["torch"]
    name = str(value.dtype).removeprefix("torch.")
    if name not in _WIDTHS or not bool(torch.isnan(value)):
        return None
    width = _WIDTHS[name]
    signed = int(value.reshape(()).view(getattr(torch, f"int{width}")).item())
    return _text(signed % (1 << width), name)


def tensor(text: str, dtype: str) -> Any:
    """The 0-d torch tensor of ``dtype`` (a name) with the bits :func:`tensor_bits` wrote."""
    import torch

    width = _WIDTHS[dtype]
    value = int(text, 16)
    signed = value - (1 << width) if value >= 1 << (width - 1) else value
    return torch.tensor(signed, dtype=getattr(torch, f"int{width}")).view(getattr(torch, dtype))


def problem(text: Any, dtype: str) -> str | None:
    """Why ``text`` is not bits :func:`python_bits` and its siblings write for ``dtype``, or
    ``None``: hex of the dtype's width, of a NaN other than the default one."""
    width = _WIDTHS.get(dtype)
    if width is None:
        return f"bits are kept for a float dtype only, not {dtype}"
    digits = width // 4
    if not isinstance(text, str) or not _HEX.fullmatch(text) or len(text) != digits + 2:
        return f"bits must be '0x' and {digits} hex digits (lower case), got {str(text)[:40]!r}"
    value, mantissa = int(text, 16), {16: 10, 32: 23, 64: 52}[width]
    if dtype == "bfloat16":
        mantissa = 7
    exponent = (value >> mantissa) & ((1 << (width - 1 - mantissa)) - 1)
    if exponent != (1 << (width - 1 - mantissa)) - 1 or not value & ((1 << mantissa) - 1):
        return f"bits {text} are not a NaN of {dtype}"
    if value == _DEFAULT_NAN[dtype]:
        return f"bits {text} are the default NaN, written as 'nan' alone"
    return None
