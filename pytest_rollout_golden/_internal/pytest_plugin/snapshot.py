"""Private copies of goldens for the torchrun ranks above 0.

Every rank of a torchrun job runs the same tests; rank 0 owns golden/. The others replay
copies and never record, so that no rank waits on a golden's lock while rank 0 waits for
it in a collective. A rank copies only the goldens its tests use, each once, into a
temporary folder named after its process (:func:`.location.rank_snapshot_prefix`).

Start-up removes the folders a killed rank left behind, and nothing else: each folder holds
a marker file (:data:`.location.RANK_SNAPSHOT_MARKER`) on which its process holds a lock for
life (:mod:`...store.owned`), since names and process ids cannot tell (another PID
namespace has the same ids).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ...store import location, owned


class RankSnapshot:
    """The copies of goldens under ``root`` that torchrun rank ``rank`` (> 0) replays."""

    def __init__(self, root: Path, rank: int):
        remove_stale()
        self.root = root
        self.path = Path(tempfile.mkdtemp(prefix=location.rank_snapshot_prefix(rank)))
        self._lock = owned.claim(
            self.path, location.RANK_SNAPSHOT_MARKER, location.RANK_SNAPSHOT_MARKER_TEXT
        )
        self._copied: set[Path] = set()

    def copy_of(self, directory: Path) -> Path:
        """Where this rank replays golden ``directory`` (inside the golden root): a copy of
        it as it was when first asked for, absent if it was."""
        copy = self.path / directory.relative_to(self.root)
        if directory not in self._copied:
            self._copied.add(directory)
            _copy_files(directory, copy)
        return copy

    def remove(self) -> None:
        """Delete every copy."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _copy_files(directory: Path, copy: Path) -> None:
    """The visible files of one golden (never a golden nested in it, nor one being written)."""
    try:
        entries = [e for e in os.scandir(directory) if not e.name.startswith(".")]
    except OSError:  # not recorded (yet): replay says so
        return
    copy.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry.is_dir():
            continue
        broken_link = entry.is_symlink() and not entry.is_file()  # content not fetched (annex)
        shutil.copy2(entry.path, copy / entry.name, follow_symlinks=not broken_link)


def remove_stale(folder: Path | None = None) -> list[Path]:
    """Remove the rank snapshot folders in ``folder`` (default: the temporary directory) that
    this user's rank processes made and that outlived them; returns them."""
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    try:
        names = [e.name for e in os.scandir(folder) if location.is_rank_snapshot_name(e.name)]
    except OSError:
        return []
    marker, text = location.RANK_SNAPSHOT_MARKER, location.RANK_SNAPSHOT_MARKER_TEXT
    return [
        folder / name for name in names if owned.remove_if_abandoned(folder / name, marker, text)
    ]
