"""Private copies of goldens for the torchrun ranks above 0.

Every rank of a torchrun job runs the same tests; rank 0 owns golden/. The others replay
copies and never record, so that no rank waits on a golden's lock while rank 0 waits for
it in a collective. A rank copies only the goldens its tests use, each once, into a
temporary folder named after its process (:func:`.location.rank_snapshot_prefix`).

Start-up removes the folders a killed rank left behind, and nothing else. Names and process
ids cannot tell (another PID namespace, a container sharing the temporary directory, has the
same ids, and anyone may name a folder alike), so each folder holds a marker file
(:data:`.location.RANK_SNAPSHOT_MARKER`) on which its process holds a ``flock`` for life: only
a folder whose marker says exactly what the plugin writes, and whose lock is free, is removed.
The kernel releases the lock when the process dies, and a lock held from any namespace is
seen on the shared file.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from ...store import location

try:
    import fcntl
except ImportError:  # Windows: no stale copy is ever removed
    fcntl = None  # type: ignore[assignment]

_MARKER_TEXT = location.RANK_SNAPSHOT_MARKER_TEXT.encode()


class RankSnapshot:
    """The copies of goldens under ``root`` that torchrun rank ``rank`` (> 0) replays."""

    def __init__(self, root: Path, rank: int):
        remove_stale()
        self.root = root
        self.path = Path(tempfile.mkdtemp(prefix=location.rank_snapshot_prefix(rank)))
        self._lock = _claim(self.path)
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


def _claim(folder: Path) -> int | None:
    """Mark ``folder`` as a live rank's copy; returns the descriptor whose lock says it lives
    (held until it is closed, or this process dies). The lock is taken before the text is
    written, so a marker that reads complete is never unlocked while its process lives."""
    fd = os.open(folder / location.RANK_SNAPSHOT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, _MARKER_TEXT)
    if fcntl is None:
        os.close(fd)
        return None
    return fd


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
    if fcntl is None:
        return []
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    try:
        names = [e.name for e in os.scandir(folder) if location.is_rank_snapshot_name(e.name)]
    except OSError:
        return []
    return [folder / name for name in names if _remove_if_abandoned(folder / name)]


def _remove_if_abandoned(copy: Path) -> bool:
    """Delete ``copy`` if it is this user's folder, holds the plugin's exact marker, and no
    process holds the marker's lock; whether it did."""
    assert fcntl is not None
    try:
        info = copy.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        marker = copy / location.RANK_SNAPSHOT_MARKER
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.read(fd, 4096) != _MARKER_TEXT:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while its rank lives
        shutil.rmtree(copy, ignore_errors=True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
