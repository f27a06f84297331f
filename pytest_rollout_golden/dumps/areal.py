"""AReaL's rollout dumps (``areal/infra/workflow_executor.py``, ``_dump_trajectory``).

With ``dump_to_file``, each accepted or rejected trajectory appends one JSON line per
sample (task_id, sample_idx, seqlen, prompt_len, head/tail version, reward, prompt and
completion text) to ``{log_path}/rollout/{version}/{task_id}.jsonl``, evaluation ones
under ``eval-rollout/``; the version is the newest policy version the trajectory used.
Each version becomes one rollout at step ``version``: the list of its records, by task id
then line (rollout ``NAME``, ``eval`` for evaluation). Read with ``json`` only.
Older AReaL-style ``step_{step}.pt`` / ``step_{step}_dp_{rank}.pt`` files (``torch.save``)
become rollout ``NAME`` / ``NAME_dp{rank}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .entry import Entry, Skipped

PATTERNS = (
    "rollout/{version}/{task_id}.jsonl  one rollout per version (step), records by task id",
    "eval-rollout/{version}/{task_id}.jsonl  -> rollout eval",
    "step_{step}.pt, step_{step}_dp_{rank}.pt  torch.save -> rollout NAME, NAME_dp{rank}",
)
EVAL_DIR = "eval-rollout"
_PT = re.compile(r"step_(\d+)(?:_dp_(\d+))?")


def matches(files: list[Path]) -> bool:
    return any(_jsonl(p) for p in files) or any(
        p.suffix == ".pt" and _PT.fullmatch(p.stem) for p in files
    )


def _jsonl(path: Path) -> bool:
    return path.suffix == ".jsonl" and path.stem.isdecimal() and path.parent.name.isdecimal()


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    versions: dict[tuple[str, int], list[Path]] = {}
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        pt = _PT.fullmatch(path.stem)
        if _jsonl(path):
            rollout = "eval" if path.parent.parent.name == EVAL_DIR else name
            versions.setdefault((rollout, int(path.parent.name)), []).append(path)
        elif path.suffix == ".pt" and pt:
            step, rank = pt.groups()
            yield Entry(path, "rollout", name if rank is None else f"{name}_dp{rank}", int(step))
        else:
            yield Skipped(path, "not an AReaL dump ({version}/{task_id}.jsonl or step_{step}.pt)")
    for (rollout, version), files in sorted(versions.items()):
        files.sort(key=lambda p: int(p.stem))
        yield Entry(files[0], "rollout", rollout, version, files=tuple(files), reader="jsonl",
                    prepare=_records)  # fmt: skip


def _records(entry: Entry, payload: Any) -> tuple[Any, dict[str, Any]]:
    return payload, {"task_ids": [int(p.stem) for p in entry.sources]}
