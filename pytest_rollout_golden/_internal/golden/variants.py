"""Same-math variants of the user's own code: params that all gate against one golden.

A micro-batch size, dynamic batch size, remove-padding, packing, a refactored function or
a kernel switch changes the order of floating-point reductions but not the math. Declared
with :func:`same_math`, the reference value records the golden and every other value
replays it, never recording (as the layouts of ``parallel.variants()`` do)::

    @pytest.mark.parametrize("micro_batch", same_math([8, 4, 2], ids=lambda v: f"mb{v}"))
    def test_actor(golden, micro_batch): ...

A variant is held to the built-in tolerances (which pass the reordering noise of float32
training code), without the metrics the profile averages per micro-batch; ``pytest
--golden-calibrate N`` measures the spread across the declared variants and writes it as
the golden's calibrated variant lane.

Torch-free: read at collection time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest


def same_math(
    values: Sequence[Any] | Mapping[str, Any],
    *,
    reference: Any = None,
    ids: Sequence[str] | Callable[[Any], str] | None = None,
    tolerances: Mapping[str, Any] | None = None,
) -> list[Any]:
    """``pytest.param`` per value, reference first: it records the golden, the others replay it.

    ``values``: a sequence (ids from ``ids``, else ``str(value)``) or a mapping of id ->
    value. ``reference``: the value (of a sequence) or id (of a mapping) that records;
    default the first. ``tolerances``: a lane the variants use in place of the built-in
    defaults (marker and call tolerances still come first).
    """
    if isinstance(values, Mapping):
        if ids is not None:
            raise TypeError("same_math(): a mapping's keys are the ids; leave out ids=")
        pairs = [(str(key), value) for key, value in values.items()]
        ref_index = 0 if reference is None else _index([k for k, _ in pairs], str(reference))
    else:
        values = list(values)
        names = _ids(values, ids)
        pairs = list(zip(names, values, strict=True))
        ref_index = 0 if reference is None else _index(values, reference)
    if not pairs:
        raise ValueError("same_math() needs at least one value")
    names = [name for name, _ in pairs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated or not all(names):
        raise ValueError(f"same_math(): ids must be unique and non-empty, got {names}")
    ref_id = names[ref_index]
    for name in names:
        if name != ref_id and (name in ref_id or ref_id in name):
            raise ValueError(
                f"same_math(): id {name!r} and the reference's {ref_id!r} contain one another; "
                "a variant finds its reference's golden by replacing its id in the test id"
            )
    ordered = [pairs[ref_index], *(p for i, p in enumerate(pairs) if i != ref_index)]
    out = []
    for name, value in ordered:
        options: dict[str, Any] = {"variant": name, "reference": ref_id}
        if name != ref_id and tolerances is not None:
            options["layout_tolerances"] = dict(tolerances)
        out.append(pytest.param(value, id=name, marks=pytest.mark.golden(**options)))
    return out


def _ids(values: list[Any], ids: Sequence[str] | Callable[[Any], str] | None) -> list[str]:
    if ids is None:
        return [str(v) for v in values]
    if callable(ids):
        return [str(ids(v)) for v in values]
    ids = [str(i) for i in ids]
    if len(ids) != len(values):
        raise ValueError(f"same_math(): {len(ids)} ids for {len(values)} values")
    return ids


def _index(values: list[Any], wanted: Any) -> int:
    for i, value in enumerate(values):
        if value == wanted:
            return i
    raise ValueError(f"same_math(): the reference {wanted!r} is not among the values")
