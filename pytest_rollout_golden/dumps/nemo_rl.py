"""NeMo-RL's logged training data (``nemo_rl/utils/logger.py``, ``log_batched_dict_as_jsonl``).

GRPO, PPO and distillation log each step's batch to ``{log_dir}/train_data_step{N}.jsonl``
and validation to ``val_data_step{N}.jsonl``: one JSON line per sample, each value the
sample's one-entry slice of the batch (``"rewards": [0.5]``, ``"token_ids": [[...]]``,
``"content": [[messages]]``) plus its index ``idx``. Step ``N`` becomes rollout ``NAME``
(``val`` for validation): the list of its records, read with ``json`` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from .entry import Entry, Skipped

PATTERNS = (
    "train_data_step{step}.jsonl  one JSON line per sample -> rollout NAME",
    "val_data_step{step}.jsonl  -> rollout val",
)
_NAME = re.compile(r"(train|val)_data_step(\d+)")


def matches(files: list[Path]) -> bool:
    return any(p.suffix == ".jsonl" and _NAME.fullmatch(p.stem) for p in files)


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        match = _NAME.fullmatch(path.stem)
        if path.suffix == ".jsonl" and match:
            split, step = match.groups()
            rollout = "val" if split == "val" else name
            yield Entry(path, "rollout", rollout, int(step), reader="jsonl")
        else:
            yield Skipped(path, "not a NeMo-RL dump (train_data_step{step}.jsonl or "
                          "val_data_step{step}.jsonl)")  # fmt: skip
