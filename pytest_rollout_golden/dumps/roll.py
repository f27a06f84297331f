"""ROLL's rollout dumps: ``[train|val/]step_{step}.pkl`` pickles; ``val`` is rollout ``val``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from .entry import Entry, Skipped

PATTERNS = ("[train|val/]step_{step}.pkl  a DataProto pickle (needs --trust-pickle); "
            "val -> rollout val",)  # fmt: skip
_STEP = re.compile(r"step_(\d+)")


def matches(files: list[Path]) -> bool:
    return any(p.suffix == ".pkl" and _STEP.fullmatch(p.stem) for p in files)


def entries(source: Path, name: str) -> Iterator[Entry | Skipped]:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        match = _STEP.fullmatch(path.stem)
        if path.suffix == ".pkl" and match:
            split = "val" if path.parent.name == "val" else name
            yield Entry(path, "rollout", split, int(match.group(1)))
        else:
            yield Skipped(path, "not a ROLL dump (step_{step}.pkl)")
