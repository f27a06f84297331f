"""The temporary checkouts of other commits, under a run folder that is always cleaned up.

Each invocation owns one run folder, ``<tmp>/rollout-golden-commits-<uid>/run-<pid>-<rand>/``:
a private ``git clone --shared --no-checkout`` of the user's repository, and one
``git worktree add --detach`` of that clone per commit. The user's ``.git`` and working
tree are only read. The run folder is removed when the run ends (also on Ctrl-C and
SIGTERM); a folder left by a killed run is removed by the next run's :func:`reap`, which
recognises a dead owner by its pid and process start time (a reused pid is not taken for
the owner).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from .git import Commit, git

OWNER = "owner.json"
CHILDREN = "children"  # a file per running pytest: its pid as name, its start time inside
_RUN = re.compile(r"run-\d+-[0-9a-f]+")


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


def start_time(pid: int) -> str | None:
    """What tells process ``pid`` apart from a later one with the same pid (boot and start
    time); ``None`` when no process ``pid`` runs."""
    proc = Path(f"/proc/{pid}/stat")
    if proc.parent.parent.is_dir() and Path("/proc/self/stat").exists():
        try:
            fields = proc.read_text().rsplit(")", 1)[1].split()
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return None
        if fields[0] in ("Z", "X"):  # ended, not yet waited for
            return None
        return f"{boot}:{fields[19]}"  # field 22 of stat: start time in clock ticks
    done = subprocess.run(
        ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


def reap(root_folder: Path) -> list[Path]:
    """Remove the run folders under ``root_folder`` whose owner process is gone; returns them.

    Only folders directly under the root, named ``run-PID-HEX``, that are no link and hold a
    readable ``owner.json`` naming a process that no longer runs; nothing else is touched.
    """
    removed = []
    for entry in sorted(root_folder.iterdir()):
        try:
            if not _RUN.fullmatch(entry.name) or not stat.S_ISDIR(entry.lstat().st_mode):
                continue
            owner = _owner(entry)
            if owner is None or _alive(owner):
                continue
            _stop_orphans(entry)
        except FileNotFoundError:  # another run reaped it meanwhile
            continue
        _remove(entry)
        removed.append(entry)
    return removed


def _alive(owner: dict[str, Any]) -> bool:
    """Whether the process that wrote ``owner`` still runs."""
    now = start_time(owner["pid"])
    return now is not None and owner["start"] in (None, now)


def _stop_orphans(folder: Path) -> None:
    """Kill the pytest runs a killed owner left running (recorded in ``children/``, each
    with its start time, so that no later process with the same pid is hit)."""
    children = folder / CHILDREN
    if children.is_symlink() or not children.is_dir():
        return
    for entry in children.iterdir():
        if entry.name.isdigit() and not entry.is_symlink():
            pid = int(entry.name)
            if start_time(pid) == entry.read_text():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def _owner(folder: Path) -> dict[str, Any] | None:
    """The run folder's ``owner.json`` (``None``: missing, a link or unreadable)."""
    path = folder / OWNER
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(owner, dict) and isinstance(owner.get("pid"), int) and "start" in owner
    return owner if ok else None


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

    A context manager: entering reaps dead runs' folders and makes this one; leaving kills
    the pytest runs still going in it and removes it, however the run ends.
    """

    def __init__(self, repo: Path, *, base: Path | None = None):
        self.repo = repo
        self.base = base
        self.folder = Path()
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[bytes]] = set()
        self._sigterm: Any = None
        self._closed = False

    def __enter__(self) -> Trees:
        top = root(self.base)
        reap(top)
        self.folder = top / f"run-{os.getpid()}-{secrets.token_hex(6)}"
        self.folder.mkdir(mode=0o700)
        self._catch_sigterm()
        try:
            owner = {"pid": os.getpid(), "start": start_time(os.getpid()), "repo": str(self.repo)}
            (self.folder / OWNER).write_text(json.dumps(owner))
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
        """Start ``command`` in a process group of its own, known to the run: leaving the run
        kills it."""
        with self._lock:  # once the run is left, nothing more starts in it
            if self._closed:
                raise GoldenError(f"{self.folder}: the run has ended; nothing more runs in it")
            child = subprocess.Popen(command, start_new_session=True, **kwargs)
            self._children.add(child)
        record = self.folder / CHILDREN / str(child.pid)
        record.parent.mkdir(exist_ok=True)
        record.write_text(start_time(child.pid) or "")
        return child

    def forget(self, child: subprocess.Popen[bytes]) -> None:
        """``child`` has ended (or was stopped)."""
        with self._lock:
            self._children.discard(child)
        (self.folder / CHILDREN / str(child.pid)).unlink(missing_ok=True)

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
