"""A loaded dump's values in the forms a golden stores: codec-ready rollouts, named tensors."""

from __future__ import annotations

import math
from typing import Any

from ..errors import GoldenError


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
    For the names ``import`` wrote of a NexRL dump (its bookkeeping left out), use
    :func:`~pytest_rollout_golden.dumps.checked_tensors`.
    Two leaves of one name (``{"a/b": 1, "a": {"b": 2}}``) raise :class:`~..errors.GoldenError`.
    """
    return split(value)[0]


def split(value: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, others)``: :func:`flatten`'s tensors, and every other leaf by its name.

    Raises :class:`~..errors.GoldenError` if two leaves get one name (a key holding ``/``
    beside a nested dict, ``1`` beside ``"1"``): one would hide the other.
    """
    import numpy as np
    import torch

    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    keys: dict[str, str] = {}  # each name's keys in the value, spelled ``['a'][0]``

    def leaf(out: dict[str, Any], name: str, where: str, item: Any) -> None:
        if name in keys:
            raise GoldenError(_collision(name, keys[name], where))
        keys[name] = where
        out[name] = item

    stack: list[tuple[str, str, Any]] = [(prefix, "", value)]
    while stack:
        name, where, item = stack.pop()
        if isinstance(item, torch.Tensor):
            leaf(tensors, name, where, item)
        elif isinstance(item, np.ndarray) and item.dtype != object:
            leaf(tensors, name, where, torch.from_numpy(item.copy()))
        elif isinstance(item, (bool, int, float)):
            leaf(tensors, name, where, torch.tensor(item, dtype=_dtype([item])))
        elif isinstance(item, dict):
            stack += [(_joined(name, k), f"{where}[{k!r}]", v) for k, v in item.items()]
        elif isinstance(item, (list, tuple)) and item:
            leaves = _numbers(item)
            if leaves is not None:
                try:
                    leaf(tensors, name, where, torch.tensor(item, dtype=_dtype(leaves)))
                    continue
                except (ValueError, TypeError, RuntimeError):  # ragged: walk it
                    pass
            stack += [(_joined(name, i), f"{where}[{i}]", v) for i, v in enumerate(item)]
        else:
            leaf(others, name, where, item)
    return dict(sorted(tensors.items())), dict(sorted(others.items()))


def _joined(name: str, key: Any) -> str:
    return f"{name}/{key}" if name else str(key)


def _collision(name: str, first: str, second: str) -> str:
    a, b = sorted((first or "the top level", second or "the top level"))
    return (
        f"the keys {a} and {b} both flatten to the name {name!r}, so one value would "
        "hide the other; rename one of the two keys (a key holding '/' is the usual cause) "
        "and save the dump again, or move the file out of the dump folder"
    )


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
