"""The temporary checkouts of other commits, under a run folder that is always cleaned up.

Each invocation owns one run folder, ``<tmp>/rollout-golden-commits-<uid>/run-<pid>-<rand>/``:
a private ``git clone --shared --no-checkout`` of the user's repository, and one
``git worktree add --detach`` of that clone per commit. The user's ``.git`` and working
tree are only read. The run folder is removed when the run ends (also on Ctrl-C and
SIGTERM). Its marker file :data:`MARKER` is locked for the run's life (:mod:`...store.owned`):
a folder left by a killed run is removed by the next run's :func:`reap` once the lock is
free, never judged by its name or a pid (another PID namespace sharing the temporary
directory has the same ids).

Each pytest run starts under a guardian (:data:`_GUARDIAN`), in a session of its own: the
guardian kills the session's process group when the run's lifeline pipe reaches end of file,
which the kernel makes happen when this process ends, however it ends (SIGKILL included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from ...store import owned
from .git import Commit, git

MARKER = ".rollout-golden-run"
"""The file in a run folder that says the plugin made it; the run holds a lock on it."""
MARKER_TEXT = "made by pytest-rollout-golden compare or bisect; live while it is locked\n"
_RUN = re.compile(r"run-\d+-[0-9a-f]+")

# The process each pytest run starts under (stdlib only, run with -I), the leader of a session
# of its own: it starts the command given after the lifeline's descriptor in its process group
# and passes on its exit status; end of file on the lifeline kills the group, itself included.
# A separate process, since a hung test may hold the GIL that a watching thread would need.
_GUARDIAN = """
import os, signal, subprocess, sys, threading
lifeline = int(sys.argv[1])
def watch():
    try:
        while os.read(lifeline, 1):
            pass
    finally:
        os.killpg(0, signal.SIGKILL)
threading.Thread(target=watch, daemon=True).start()
status = subprocess.Popen(sys.argv[2:]).wait()
if status < 0:
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
sys.exit(status)
"""


def root(base: Path | None = None) -> Path:
    """The folder holding every run folder of this user (created mode 0700); GoldenError when
    it is a symlink, not a folder, or someone else's."""
    path = Path(base or tempfile.gettempdir()) / f"rollout-golden-commits-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise GoldenError(f"{path}: not a folder (a link or a file); remove it, it is ours to make")
    if info.st_uid != os.getuid():
        raise GoldenError(
            f"{path}: owned by uid {info.st_uid}, not you; set TMPDIR to a folder of your own"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def reap(root_folder: Path) -> list[Path]:
    """Remove the run folders under ``root_folder`` whose run is gone; returns them.

    Only folders directly under the root, named ``run-PID-HEX``, that are no link and hold
    the plugin's :data:`MARKER`, unlocked; nothing else is touched.
    """
    removed = []
    for entry in sorted(root_folder.iterdir()):
        if _RUN.fullmatch(entry.name) and owned.remove_if_abandoned(entry, MARKER, MARKER_TEXT):
            removed.append(entry)
    return removed


def _remove(folder: Path) -> None:
    """Delete a run folder (links inside are removed, never followed)."""
    shutil.rmtree(folder, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Tree:
    """The checkout of one commit in a run folder."""

    path: Path
    commit: Commit
    trees: Trees = dataclasses.field(repr=False, compare=False)


class Trees:
    """One run folder: a private clone of ``repo`` and a checkout per commit tried.

    A context manager: entering reaps dead runs' folders and makes this one, marked live;
    leaving kills the pytest runs still going in it and removes it, however the run ends.
    """

    def __init__(self, repo: Path, *, base: Path | None = None):
        self.repo = repo
        self.base = base
        self.folder = Path()
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[bytes]] = set()
        self._sigterm: Any = None
        self._closed = False
        self._marker: int | None = None
        self._lifeline: tuple[int, int] | None = None  # (read, write); read is the children's

    def __enter__(self) -> Trees:
        top = root(self.base)
        reap(top)
        self.folder = top / f"run-{os.getpid()}-{secrets.token_hex(6)}"
        self.folder.mkdir(mode=0o700)
        self._catch_sigterm()
        try:
            self._marker = owned.claim(self.folder, MARKER, MARKER_TEXT)
            self._lifeline = os.pipe()  # neither end is inherited unless passed
            git(
                self.folder,
                "clone",
                "--quiet",
                "--shared",
                "--no-checkout",
                str(self.repo),
                "clone",
                what=f"cloning {self.repo}",
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        masked = _block_signals()
        try:
            with self._lock:
                self._closed = True
                children = list(self._children)
            for child in children:
                stop(child)
            _remove(self.folder)
            for fd in (self._marker, *(self._lifeline or ())):
                if fd is not None:
                    os.close(fd)
            self._marker = self._lifeline = None
        finally:
            _unblock_signals(masked)
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None

    def add(self, commit: Commit) -> Tree:
        """Check ``commit`` out in a new folder of the run (safe from several threads)."""
        path = self.folder / f"tree-{commit.short}-{secrets.token_hex(3)}"
        with self._lock:
            git(
                self.folder / "clone",
                "worktree",
                "add",
                "--quiet",
                "--detach",
                str(path),
                commit.sha,
                what=f"checking out {commit.short} ({commit.subject})",
            )
        return Tree(path, commit, self)

    def remove(self, tree: Tree) -> None:
        """Delete a checkout whose run is done."""
        _remove(tree.path)
        with self._lock:
            git(self.folder / "clone", "worktree", "prune")

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``command`` under its guardian, in a session of its own, known to the run:
        leaving the run kills it (its process group), and so does this process's end."""
        with self._lock:  # once the run is left, nothing more starts in it
            if self._closed or self._lifeline is None:
                raise GoldenError(f"{self.folder}: the run has ended; nothing more runs in it")
            lifeline = self._lifeline[0]
            guarded = [sys.executable, "-I", "-c", _GUARDIAN, str(lifeline), *command]
            child = subprocess.Popen(
                guarded, start_new_session=True, pass_fds=(lifeline,), **kwargs
            )
            self._children.add(child)
        return child

    def forget(self, child: subprocess.Popen[bytes]) -> None:
        """``child`` has ended (or was stopped)."""
        with self._lock:
            self._children.discard(child)

    def _catch_sigterm(self) -> None:
        """SIGTERM unwinds like Ctrl-C (so the run folder is removed), where nobody else
        handles it."""
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)


def stop(child: subprocess.Popen[bytes]) -> None:
    """Kill ``child``'s process group and wait for it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        child.wait(timeout=30)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _block_signals() -> bool:
    """Hold Ctrl-C and SIGTERM back while the run folder is removed (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or sys.platform == "win32":
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    return True


def _unblock_signals(masked: bool) -> None:
    if masked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
