"""slime's debug dumps (``slime/observability/{rollout,train}_data_utils.py``).

``save_debug_rollout_data`` saves ``{"rollout_id", "samples"}`` to its path template
formatted with ``rollout_id``, ``eval_{rollout_id}`` for evaluation rollouts
(``--dump-details DIR``: ``DIR/rollout_data/{rollout_id}.pt``): rollout ``NAME``, and
``eval`` for evaluation. ``save_debug_train_data`` saves ``{"rollout_id", "rank",
"rollout_data"}`` (newer slime: ``{"format_version", "rollout_id", "rank", "samples",
"dp_shards", ...}``) per rank: rollout ``train_rank{rank}``. The step is ``rollout_id``
(an integer >= 0; any other value is an error), else the last number of the file's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import GoldenError
from ..store.jsonfile import is_json_int
from .entry import Entry, Skipped

PATTERNS = (
    "{rollout_id}.pt  save_debug_rollout_data {rollout_id, samples} -> rollout NAME",
    "eval_{rollout_id}.pt  its evaluation rollouts -> rollout eval",
    "{rollout_id}_{rank}.pt  save_debug_train_data {rollout_id, rank, rollout_data} "
    "-> rollout train_rank{rank}",
    "(any template: the step is the file's rollout_id, else the last number of its name)",
)
_EVAL = re.compile(r"eval_(\d+)")
_TRAIN_KEYS = ("rollout_data", "dp_shards", "format_version")


def matches(files: list[Path]) -> bool:
    return any(p.suffix == ".pt" for p in files)


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        if path.suffix == ".pt":  # the step until the payload's rollout_id says otherwise
            yield Entry(path, "rollout", name, _named_step(path), prepare=_place)
        else:
            yield Skipped(path, "not a slime dump (a torch.save .pt file)")


def _place(entry: Entry, payload: Any) -> tuple[Any, dict[str, Any]]:
    """Set the entry's step (rollout_id) and rollout name (NAME, eval, train_rank{r})."""
    entry.step = _step(entry, payload)
    if isinstance(payload, dict) and any(k in payload for k in _TRAIN_KEYS):
        rank = _count(entry, payload, "rank", "a rank", "import it as rollout train")
        entry.name = "train" if rank is None else f"train_rank{rank}"
    elif any(int(m.group(1)) == entry.step for m in _EVAL.finditer(entry.path.stem)):
        entry.name = "eval"
    return payload, {}


def _named_step(path: Path) -> int | None:
    """The last number of the file's name, if any."""
    numbers = re.findall(r"\d+", path.stem)
    return int(numbers[-1]) if numbers else None


def _step(entry: Entry, payload: Any) -> int:
    step = _count(entry, payload, "rollout_id", "a step", "take the step from the file name")
    if step is None:
        step = _named_step(entry.path)
    if step is None:
        raise GoldenError(
            f"{entry.path}: no rollout_id in it and no number in its name to use as step; "
            "rename it with its step in the name (rollout_7.pt)"
        )
    return step


def _count(entry: Entry, payload: Any, key: str, what: str, without: str) -> int | None:
    """``payload[key]`` if the payload has it: an integer >= 0, as the golden's manifest needs
    (``without``: what import does if the key is removed, for the remedy)."""
    if not isinstance(payload, dict) or payload.get(key) is None:
        return None
    value = payload[key]
    if not is_json_int(value) or value < 0:
        raise GoldenError(
            f"{entry.path}: its {key} is {value!r}, not {what} (an integer >= 0); set it "
            f"right in the dump (torch.load, fix it, torch.save), or remove the key to {without}"
        )
    return value
