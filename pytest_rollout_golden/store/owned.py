"""Temporary folders a live process owns: a marker file it holds a ``flock`` on for life.

Names and process ids cannot tell whether a temporary folder's owner still runs: another PID
namespace (a container sharing the temporary directory and uid) has the same ids, and anyone
may name a folder alike. So the owner creates a marker file in its folder, takes a lock on it
and writes the marker's text, and holds the lock until it removes the folder. The kernel
releases the lock when the process dies, and a lock held from any namespace is seen on the
shared file: a folder is stale only when it holds exactly the expected marker text and its
lock is free. The lock is taken before the text is written, so a marker that reads complete
is never unlocked while its process lives.

Without ``fcntl`` (Windows) nothing is locked and no folder is ever taken for stale.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


def claim(folder: Path, marker: str, text: str) -> int | None:
    """Mark ``folder`` (new, empty of ``marker``) as this process's; returns the descriptor
    whose lock says it lives: close it only once the folder is gone (``None`` without
    ``fcntl``). The descriptor is not inherited by child processes."""
    fd = os.open(folder / marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, text.encode())
    if fcntl is None:
        os.close(fd)
        return None
    return fd


def remove_if_abandoned(folder: Path, marker: str, text: str) -> bool:
    """Delete ``folder`` if it is this user's folder (no link), holds ``marker`` (a regular
    file, no link) reading exactly ``text``, and no process holds the marker's lock; whether
    it did. Links inside are removed, never followed."""
    if fcntl is None:
        return False
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        fd = os.open(folder / marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.read(fd, 4096) != text.encode():
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while its owner lives
        shutil.rmtree(folder, ignore_errors=True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
