"""Private copies of goldens for the torchrun ranks above 0.

Every rank of a torchrun job runs the same tests; rank 0 owns golden/. The others replay
copies and never record, so that no rank waits on a golden's lock while rank 0 waits for
it in a collective. A rank copies only the goldens its tests use, each once, into a
temporary folder named after its process (:func:`.location.rank_snapshot_prefix`); start-up
removes the folders a killed rank left behind, and nothing else.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from ...store import location


class RankSnapshot:
    """The copies of goldens under ``root`` that torchrun rank ``rank`` (> 0) replays."""

    def __init__(self, root: Path, rank: int):
        remove_stale()
        self.root = root
        self.path = Path(tempfile.mkdtemp(prefix=location.rank_snapshot_prefix(rank)))
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
    this user's processes on this host made and that outlived them; returns them."""
    if os.name != "posix":  # no cheap, harmless test of whether a process lives
        return []
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        owner = location.rank_snapshot_owner(entry.name)
        if owner is None or owner == os.getpid() or _alive(owner):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
