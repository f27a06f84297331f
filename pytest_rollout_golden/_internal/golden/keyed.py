"""Samples keyed by what identifies them: a rollout whose samples complete in any order.

An asynchronous engine or an agent loop hands samples back in the order they finished. The
rollout is stored as ``{"format", "keys", "samples", "completed"}``: the samples sorted by
their keys, and the completion order as positions in that list. Replay (and the recording
run) returns them in key order, so the training step sees one batch whatever order the engine
finished in, or in the recorded completion order on request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

FORMAT = "keyed-samples"
ORDERS = ("key", "recorded")
REMEDY = (
    "record it again with its keys: run `pytest --update-golden --golden-regenerate` "
    "locally and commit the golden/ directory"
)

Key = str | int | tuple[Any, ...]


def _sortable(key: Any, where: Callable[[], str]) -> tuple[Any, ...]:
    """A total order over keys of ints and strings (and tuples of them): ints before
    strings, tuples after both, element by element."""
    if isinstance(key, bool) or not isinstance(key, (int, str, tuple)):
        raise TypeError(
            f"{where()}: a key is a str, an int or a tuple of them (prompt uid, sample "
            f"index, turn, policy version), got {type(key).__name__} {key!r}"
        )
    if isinstance(key, int):
        return (0, key)
    if isinstance(key, str):
        return (1, key)
    return (2, tuple(_sortable(k, where) for k in key))


def collect(samples: Iterable[Any], key: Callable[[Any], Any], where: str) -> dict[str, Any]:
    """The stored form of ``samples`` (in completion order), each identified by
    ``key(sample)``; ValueError naming both samples when two keys are equal."""
    samples = list(samples)
    keys = [key(s) for s in samples]
    keys = [tuple(k) if isinstance(k, list) else k for k in keys]
    order = {}
    for i, k in enumerate(keys):
        sortable = _sortable(k, lambda i=i: f"{where}: sample {i}")
        if sortable in order:
            raise ValueError(
                f"{where}: samples {order[sortable]} and {i} have the same key {k!r}; give "
                "key= what tells them apart (add the sample index, the turn or the policy "
                "version)"
            )
        order[sortable] = i
    in_key_order = [order[s] for s in sorted(order)]
    rank = {completed: position for position, completed in enumerate(in_key_order)}
    return {
        "format": FORMAT,
        "keys": [keys[i] for i in in_key_order],
        "samples": [samples[i] for i in in_key_order],
        "completed": [rank[i] for i in range(len(samples))],
    }


def ordered(stored: Any, order: str, where: str, remedy: str) -> list[Any]:
    """The samples of a stored keyed rollout in ``order`` (:data:`ORDERS`); ValueError
    naming ``where`` with ``remedy`` when ``stored`` is not one."""
    if not _is_keyed(stored):
        raise ValueError(
            f"{where} was recorded by golden.rollout(), not golden.rollout_samples(): it holds "
            f"no keyed samples; {remedy}"
        )
    samples: Sequence[Any] = stored["samples"]
    if order == "key":
        return list(samples)
    return [samples[i] for i in stored["completed"]]


def by_key(value: Any, *, completion: bool = False) -> Any:
    """``value`` as reports compare and show it: a stored keyed rollout becomes
    ``{"format", "samples": {label: sample}}``, each sample under the :func:`label` of its key,
    so a change names the key of its sample. The completion order is left out (two
    recordings of the same samples that completed in another order are one rollout), or
    with ``completion`` kept as ``"completed"``: the labels in the order the samples
    completed. Any other value (and a keyed rollout whose keys do not label its samples one
    each) as it is."""
    if not _is_keyed(value):
        return value
    labels = [label(k) for k in value["keys"]]
    if len(set(labels)) != len(labels):
        return value
    out = {"format": FORMAT, "samples": dict(zip(labels, value["samples"], strict=True))}
    if completion:
        out["completed"] = [labels[i] for i in value["completed"]]
    return out


def label(key: Any) -> str:
    """How a report names the sample of ``key``: its repr (a list key as the tuple it spells)."""
    return repr(tuple(key) if isinstance(key, list) else key)


def _is_keyed(stored: Any) -> bool:
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        return False
    keys, samples, completed = (stored.get(k) for k in ("keys", "samples", "completed"))
    if not all(isinstance(x, list) for x in (keys, samples, completed)):
        return False
    return len(keys) == len(samples) and sorted(completed) == list(range(len(samples)))


def check_order(order: Any) -> str:
    """``order`` if it is one of :data:`ORDERS`, else ValueError."""
    if order not in ORDERS:
        raise ValueError(f"order= is 'key' or 'recorded', got {order!r}")
    return order
