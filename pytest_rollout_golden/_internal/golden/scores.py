"""Per-sample scores of a reward model or verifier as metrics: ``<name>/<sample id>``.

One metric per sample makes a failure name the samples whose score moved, and lets a
tolerance (``rm/*``) or a same-math variant (the scoring batch size) apply to all of them.
A tensor's scores keep its dtype (each a 0-d tensor); a list's are Python numbers.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence
from typing import Any


def _values(scores: Any) -> list[Any]:
    """The scores one by one: 0-d tensors of a tensor, numpy scalars of an array, else the
    sequence's items."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if (torch is not None and isinstance(scores, torch.Tensor)) or (
        np is not None and isinstance(scores, np.ndarray)
    ):
        if len(scores.shape) != 1:
            raise ValueError(
                f"check_scores() takes one score per sample (1-D), got shape {tuple(scores.shape)}"
            )
        detached = scores.detach() if hasattr(scores, "detach") else scores
        return [detached[i] for i in range(len(detached))]
    if isinstance(scores, (str, bytes)) or not isinstance(scores, Sequence):
        raise TypeError(
            "check_scores() takes a 1-D tensor, array or list of scores, "
            f"got {type(scores).__name__}"
        )
    for i, value in enumerate(scores):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"check_scores(): score {i} ({value!r}) is not a number")
    return list(scores)


def per_sample(scores: Any, ids: Sequence[Any] | None, name: str) -> dict[str, Any]:
    """``{f"{name}/{id}": score}``; ``ids`` default to the sample indices. ValueError when
    the counts differ or two ids are equal."""
    values = _values(scores)
    ids = list(range(len(values))) if ids is None else list(ids)
    if len(ids) != len(values):
        raise ValueError(f"check_scores(): {len(values)} scores but {len(ids)} ids")
    seen: dict[str, int] = {}
    for i, sample in enumerate(ids):
        if str(sample) in seen:
            raise ValueError(
                f"check_scores(): ids {seen[str(sample)]} and {i} are both {str(sample)!r}; "
                "give each sample its own id (prompt uid and sample index)"
            )
        seen[str(sample)] = i
    return {f"{name}/{sample}": value for sample, value in zip(ids, values, strict=True)}
