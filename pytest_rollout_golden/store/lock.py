"""The inter-process lock of a golden directory (xdist workers, shared keys, torchrun)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..errors import GoldenError
from .disk import READ_ONLY_ERRNOS, unwritable_error
from .location import lock_path

LOCK_TIMEOUT_ENV = "ROLLOUT_GOLDEN_LOCK_TIMEOUT"
LOCK_TIMEOUT = 900.0  # seconds; a lock is held for a whole test, which may train for minutes
NOTICE_AFTER = 10.0  # seconds of waiting before saying who holds the lock (at most timeout / 2)


@contextmanager
def locked(directory: Path, *, timeout: float | None = None) -> Iterator[None]:
    """Exclusive inter-process lock on a golden directory (xdist workers, shared keys).

    The lock file lives beside the golden, at its resolved path, so every process
    that reaches the golden excludes the others whatever its ``$TMPDIR``, through a
    symlink, a bind mount or a shared filesystem. A symlink planted as the lock file
    is refused, not followed. Waiting longer than ``timeout`` seconds (default
    ``$ROLLOUT_GOLDEN_LOCK_TIMEOUT`` or 900) raises a :class:`GoldenError` naming
    the lock file and the process holding it; a wait of ``NOTICE_AFTER`` seconds (or
    half the timeout) says on stderr, past pytest's capture, who holds it. Where the
    lock file cannot be created (a read-only checkout) this process cannot write the
    golden either, and reads it without a lock.
    """
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - Windows: single-process use only
        yield
        return
    if timeout is None:
        timeout = _lock_timeout()
    path = lock_path(directory)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    fd = _acquire(directory, path, timeout)
    if fd is None:  # a read-only checkout: nothing can be written, so read unlocked
        yield
        return
    with suppress(OSError):  # a read-only lock file (another user's) still locks
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {_hostname()}\n".encode(), 0)
    try:
        yield
    finally:
        _release(fd, path, created)


def _acquire(directory: Path, path: Path, timeout: float) -> int | None:
    """A descriptor of the live lock file ``path``, locked; ``None`` where it cannot be
    created (a read-only checkout). A holder that releases unlinks the file, so after
    waiting the descriptor may be of a file no longer there: then the new one is locked."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock(path)
        except FileNotFoundError:
            if time.monotonic() < deadline:
                continue  # a releasing holder removed the empty folder it had created
            raise
        except OSError as exc:
            if exc.errno not in READ_ONLY_ERRNOS:
                raise unwritable_error(directory, exc) from None
            fd = None
        if fd is None:
            return None
        _wait_for_lock(fd, directory, path, timeout, deadline)
        if _is_live(path, fd):
            return fd
        os.close(fd)  # the holder unlinked it while we waited; lock the new file instead


def _wait_for_lock(fd: int, directory: Path, path: Path, timeout: float, deadline: float) -> None:
    """Wait until ``fd`` is locked; say who holds it after ``NOTICE_AFTER`` seconds (or half
    the timeout); at ``deadline`` close ``fd`` and raise a GoldenError naming the holder."""
    import fcntl
    import time

    wait = 0.005
    notice: float | None = time.monotonic() + min(NOTICE_AFTER, timeout / 2)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if notice is not None and time.monotonic() >= notice:
                notice = None
                _say(
                    f"waiting for the lock of the golden {directory}, held by "
                    f"{_lock_holder(fd)}; gives up after {timeout:g} s "
                    f"({LOCK_TIMEOUT_ENV} sets it)"
                )
            if time.monotonic() >= deadline:
                holder = _lock_holder(fd)
                os.close(fd)
                raise GoldenError(
                    f"{path}: timed out after {timeout:g} s waiting for the lock of the "
                    f"golden {directory}, held by {holder}. If no run of pytest is using "
                    f"this golden, end that process; set {LOCK_TIMEOUT_ENV} to wait longer."
                ) from None
            time.sleep(wait)
            wait = min(wait * 2, 0.2)


def _is_live(path: Path, fd: int) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one its holder unlinked)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _release(fd: int, path: Path, created: list[Path]) -> None:
    """Unlock and remove the lock file, then the empty folders the lock created."""
    import fcntl

    with suppress(OSError):
        path.unlink()  # before unlocking, so no lock file is left behind
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    for folder in created:  # only empty folders this lock created (nothing was recorded)
        try:
            folder.rmdir()
        except OSError:
            break


def _say(line: str) -> None:
    """A line on the terminal now, even while pytest captures the test's output."""
    import sys

    stream = sys.__stderr__ or sys.stderr
    with suppress(OSError, ValueError):
        stream.write(line + "\n")
        stream.flush()


def _lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if raw is None:
        return LOCK_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise GoldenError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


def _open_lock(path: Path) -> int | None:
    """A descriptor of the lock file, or ``None`` where it cannot be created (read-only)."""
    flags = os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            return os.open(path, os.O_RDWR | flags, 0o644)
        except OSError as exc:
            if exc.errno not in READ_ONLY_ERRNOS:
                raise
            return os.open(path, os.O_RDONLY | flags)  # another user's lock file locks too
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS and not path.is_symlink():
            return None
        what = "is a symbolic link, which is never followed" if path.is_symlink() else str(exc)
        raise GoldenError(
            f"{path}: cannot use this lock file of a golden: {what}. "
            "It holds nothing of the golden; remove it and run again."
        ) from None


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "an unknown process"


def _hostname() -> str:
    import socket

    return socket.gethostname()
