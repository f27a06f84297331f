"""A loaded dump's values in the forms a golden stores: codec-ready rollouts, named tensors."""

from __future__ import annotations

import math
from typing import Any


def plain(value: Any) -> Any:
    """``value`` with dataclass objects turned into dicts, recursively, for the codec.

    DataProto-like batches (verl's is a dataclass) keep their class; see
    :func:`..codec.dataclasses_to_dicts`.
    """
    from ..store.codec import dataclasses_to_dicts

    return dataclasses_to_dicts(value)


def flatten(value: Any) -> dict[str, Any]:
    """The numbers and tensors in ``value`` as tensors named by their path (``metrics/kl``).

    Dicts and lists of mixed entries are walked (a list's entries named ``0``, ``1``, ...);
    a tensor stays itself; a Python number, and a list (of lists) of numbers, becomes a
    tensor: ``float64`` if any number is a float (so the bits stay), else ``int64``, else
    ``bool``. Strings, ``None`` and empty lists are not numbers: :func:`split` returns them.
    Pass a dump's value through this to check it against the golden ``import`` wrote.
    """
    return split(value)[0]


def split(value: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, others)``: :func:`flatten`'s tensors, and every other leaf by its name."""
    import numpy as np
    import torch

    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        name, item = stack.pop()
        if isinstance(item, torch.Tensor):
            tensors[name] = item
        elif isinstance(item, np.ndarray) and item.dtype != object:
            tensors[name] = torch.from_numpy(item.copy())
        elif isinstance(item, (bool, int, float)):
            tensors[name] = torch.tensor(item, dtype=_dtype([item]))
        elif isinstance(item, dict):
            stack += [(f"{name}/{k}" if name else str(k), v) for k, v in item.items()]
        elif isinstance(item, (list, tuple)) and item:
            leaves = _numbers(item)
            if leaves is not None:
                try:
                    tensors[name] = torch.tensor(item, dtype=_dtype(leaves))
                    continue
                except (ValueError, TypeError, RuntimeError):  # ragged: walk it
                    pass
            stack += [(f"{name}/{i}" if name else str(i), v) for i, v in enumerate(item)]
        else:
            others[name] = item
    return dict(sorted(tensors.items())), dict(sorted(others.items()))


def _numbers(items: Any) -> list[Any] | None:
    """The numbers in a list (of lists) of numbers, or ``None`` if anything else is there."""
    out, stack = [], [items]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            if not item:
                return None
            stack += list(item)
        elif isinstance(item, (bool, int, float)):
            out.append(item)
        else:
            return None
    return out


def _dtype(numbers: list[Any]) -> Any:
    import torch

    if any(isinstance(n, float) for n in numbers):
        return torch.float64
    if all(isinstance(n, bool) for n in numbers):
        return torch.bool
    return torch.int64


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON (non-finite floats and foreign objects spelled as text)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return repr(value)
