"""ROLL's rollout dumps: ``[train|val/]step_{step}.pkl`` pickles (``val`` is rollout ``val``),
and the RLVR pipeline's ``rollout_dump_dir``.

``dump_rollout_to_specific_path`` (``roll/pipeline/rlvr/utils.py``, through
``write_to_json_process``) writes ``rollout_dump_data.step_{global_step}.jsonl``: ONE JSON
line holding the step's columns (``id``, ``prompt``, ``responses``, ``scores``,
``sampling_params``, ``global_step``, ...), each a list with one entry per sample. It becomes
rollout ``NAME``: that dict of columns, read with ``json`` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .entry import Entry, Skipped, one_record

PATTERNS = ("[train|val/]step_{step}.pkl  a DataProto pickle (needs --trust-pickle); "
            "val -> rollout val",
            "rollout_dump_data.step_{step}.jsonl  RLVR rollout_dump_dir: one JSON line of "
            "columns -> rollout NAME")  # fmt: skip
_STEP = re.compile(r"step_(\d+)")
_DUMP = re.compile(r"rollout_dump_data\.step_(\d+)")


def matches(files: list[Path]) -> bool:
    return any(_step(p) is not None for p in files)


def _step(path: Path) -> int | None:
    """The step of a ROLL dump file's name, or None if it is not one."""
    pattern = {".pkl": _STEP, ".jsonl": _DUMP}.get(path.suffix)
    match = pattern.fullmatch(path.stem) if pattern else None
    return int(match.group(1)) if match else None


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        step = _step(path)
        if step is None:
            yield Skipped(path, "not a ROLL dump (step_{step}.pkl or "
                          "rollout_dump_data.step_{step}.jsonl)")  # fmt: skip
        elif path.suffix == ".jsonl":
            yield Entry(path, "rollout", name, step, reader="jsonl", prepare=_columns)
        else:
            yield Entry(path, "rollout", "val" if path.parent.name == "val" else name, step)


def _columns(entry: Entry, payload: Any) -> tuple[Any, dict[str, Any]]:
    return one_record(entry, payload, "ROLL's write_to_json_process"), {}
