"""What a layout makes of each file of a dump folder: an entry of the golden, or a skip."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import GoldenError

#: ``prepare(entry, payload) -> (payload, metadata)``: a layout's last word on a loaded
#: file; it may set the entry's step, name and rank from the payload.
Prepare = Callable[["Entry", Any], "tuple[Any, dict[str, Any]]"]


@dataclasses.dataclass
class Entry:
    """One file of the golden and the dump file(s) it is made of."""

    path: Path  # the dump file (the first, if several make one golden file)
    kind: str  # "rollout" | "tensors"
    name: str
    step: int | None  # None: taken from the payload by ``prepare``
    rank: int | None = None
    micro: int | None = None
    files: tuple[Path, ...] = ()  # every dump file read into it, in order; () means (path,)
    reader: str = "torch"  # "torch" (torch.load, weights_only first) | "jsonl" (json only)
    prepare: Prepare | None = None

    @property
    def sources(self) -> tuple[Path, ...]:
        return self.files or (self.path,)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A file of the dump folder that is not imported, and why."""

    path: Path
    why: str


@dataclasses.dataclass
class Imported:
    """What an import wrote (entry, golden file name) and the files it left out."""

    done: list[tuple[Entry, str]]
    skipped: list[Skipped]


def one_record(entry: Entry, payload: Any, writer: str) -> Any:
    """The one JSON record of a JSON-lines ``entry`` whose ``writer`` writes one line per file
    (a ``torch.save`` entry's payload is that record already)."""
    if entry.reader != "jsonl":
        return payload
    if len(payload) != 1:
        raise GoldenError(
            f"{entry.path}: {writer} writes one JSON record per file, found {len(payload)}; "
            "dump that step again, or move the file out of the dump folder"
        )
    return payload[0]
