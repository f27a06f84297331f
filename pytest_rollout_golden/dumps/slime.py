"""slime's debug dumps (``slime/observability/{rollout,train}_data_utils.py``).

``save_debug_rollout_data`` saves ``{"rollout_id", "samples"}`` to its path template
formatted with ``rollout_id``, ``eval_{rollout_id}`` for evaluation rollouts
(``--dump-details DIR``: ``DIR/rollout_data/{rollout_id}.pt``): rollout ``NAME``, and
``eval`` for evaluation. ``save_debug_train_data`` saves ``{"rollout_id", "rank",
"rollout_data"}`` (newer slime: ``{"format_version", "rollout_id", "rank", "samples",
"dp_shards", ...}``) per rank: rollout ``train_rank{rank}``. The step is ``rollout_id``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import GoldenError
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
        if path.suffix == ".pt":
            yield Entry(path, "rollout", name, None, prepare=_place)
        else:
            yield Skipped(path, "not a slime dump (a torch.save .pt file)")


def _place(entry: Entry, payload: Any) -> tuple[Any, dict[str, Any]]:
    """Set the entry's step (rollout_id) and rollout name (NAME, eval, train_rank{r})."""
    entry.step = _step(entry.path, payload)
    if isinstance(payload, dict) and any(k in payload for k in _TRAIN_KEYS):
        rank = payload.get("rank")
        entry.name = f"train_rank{rank}" if isinstance(rank, int) else "train"
    elif any(int(m.group(1)) == entry.step for m in _EVAL.finditer(entry.path.stem)):
        entry.name = "eval"
    return payload, {}


def _step(path: Path, payload: Any) -> int:
    if isinstance(payload, dict) and isinstance(payload.get("rollout_id"), int):
        return payload["rollout_id"]
    numbers = re.findall(r"\d+", path.stem)
    if not numbers:
        raise GoldenError(
            f"{path}: no rollout_id in it and no number in its name to use as step; "
            "rename it with its step in the name (rollout_7.pt)"
        )
    return int(numbers[-1])
