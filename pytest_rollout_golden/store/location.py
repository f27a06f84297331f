"""Every name a golden has on disk: its directory, the files inside it, and the hidden
entries beside it.

A test's golden lives in ``<golden root>/<test file without .py>/<test name>/``.

A golden shared across test files (``@pytest.mark.golden(shared="name")``) lives in
``<golden root>/@shared/<name>/``: ``@`` never survives :func:`safe_name`, so that folder can
neither be a test file's folder nor lie inside one, and a shared golden neither nests in nor
contains another test's golden.

Names are made filesystem-safe; a name that had to change, or whose case could
collide with another's on macOS or Windows, gets a hash of the original
appended, so two names never collapse into one directory and no name can climb
out of the golden root.

Inside a golden directory: :data:`MANIFEST` (written last, it makes the directory a
golden), :data:`METRICS`, :data:`TOLERANCES`, and one safetensors file per rollout
(:func:`rollout_filename`) and per ``check_tensors`` call (:func:`tensors_filename`).
Beside golden ``NAME``, only while it is being written: ``.NAME.new-PID`` (the staged
version) and ``.NAME.lock``. A file being written is ``.FILE.tmp-PID`` until it is renamed
into place. No file of a golden is a hidden name.

Outside the golden root: the temporary folder in which a torchrun rank above 0 replays
copies of goldens, ``rollout-golden-rankRANK-HOST-PID-XXXXXXXX`` (:func:`rank_snapshot_prefix`),
which holds :data:`RANK_SNAPSHOT_MARKER` beside the copies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

MANIFEST = "manifest.json"
METRICS = "metrics.json"
TOLERANCES = "tolerances.json"  # calibrated tolerances, owned by the golden (calibration.py)
ENVELOPE = "envelope.json"  # calibrated per-step bands of a long run (envelope.py)
PLOTS_MANIFEST = ".rollout-golden-plots.json"  # in a --golden-plot DIR: the pictures it wrote

_DIR_UNSAFE = re.compile(r"[^A-Za-z0-9_.=\[\]-]")
_FILE_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_MAX = 100


def _short_hash(text: str, size: int = 4) -> str:
    return hashlib.blake2s(text.encode(), digest_size=size).hexdigest()


def safe_name(name: str, *, strict: bool = False) -> str:
    """``name`` as one path component; ``strict`` allows only ``[A-Za-z0-9_]``.

    Two names that differ only in case must not meet on a case-insensitive
    filesystem: a rollout or tensor name (``strict``) or a parametrized id
    (``test_x[A]``) with an upper-case letter gets the hash too. Identifiers
    (file, class, function names, ``key=``) keep their case as they are.
    """
    safe = (_FILE_UNSAFE if strict else _DIR_UNSAFE).sub("_", name)
    if safe.startswith("."):
        safe = "_" + safe[1:]
    cased = name if strict else name.partition("[")[2]
    if len(safe) > _MAX:  # thousands of long ids may share the kept prefix: 64 bits
        safe = f"{safe[:_MAX]}~{_short_hash(name, 8)}"
    elif safe != name or not safe or cased != cased.lower():
        safe = f"{safe}~{_short_hash(name)}"
    return safe


def golden_dir(
    root: Path, rootdir: Path, test_path: Path, test_name: str, *, key: str | None = None
) -> Path:
    """The golden directory of test ``test_name`` (``Class::test[id]``) in ``test_path``.

    ``key`` replaces the test name so that several tests of one file share a golden.
    """
    try:
        rel = Path(os.path.relpath(test_path.with_suffix(""), rootdir))
    except ValueError:  # another drive on Windows
        rel = Path("_external", *test_path.with_suffix("").parts[1:])
    if rel.parts and rel.parts[0] == "..":
        rel = Path("_external", *Path(test_path.with_suffix("")).resolve().parts[1:])
    parts = [safe_name(p) for p in rel.parts]
    names = [key] if key is not None else test_name.split("::")
    return root.joinpath(*parts, *(safe_name(n) for n in names))


def link_out_of_root(root: Path, directory: Path) -> Path | None:
    """The first symbolic link between ``root`` and ``directory`` that leads out of ``root``.

    Links that stay inside the (resolved) golden root are allowed; the root itself may be
    a link.
    """
    real_root = os.path.realpath(root)
    try:
        parts = directory.relative_to(root).parts
    except ValueError:
        return None
    for i in range(1, len(parts) + 1):
        path = root.joinpath(*parts[:i])
        if path.is_symlink():
            real = os.path.realpath(path)
            if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
                return path
    return None


SHARED = "@shared"
LANES = "@lanes"  # a golden's lanes other than its base lane (see _internal/golden/lanes.py)
LANE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def in_golden(directory: Path, filename: str) -> str:
    """File ``filename`` of the values in ``directory`` as messages name it: relative to the
    golden, so a lane's own file (``@lanes/<lane>/tolerances.json``) is told from the base
    lane's (``tolerances.json``)."""
    lanes = directory.parent.name == LANES
    return f"{LANES}/{directory.name}/{filename}" if lanes else filename


def shared_golden_dir(root: Path, name: str) -> Path:
    """The directory of the golden shared under ``name`` by tests of any file."""
    return root / SHARED / safe_name(name)


def find_goldens(root: Path, *, follow_symlinks: bool = False) -> list[Path]:
    """Every golden directory at or below ``root``, sorted.

    Hidden entries (staging directories, lock files) are never goldens, nor are a golden's
    lanes (``@lanes/``): they belong to the golden above them.
    ``follow_symlinks`` also descends into symlinked directories, as replay does
    (each real directory once, so a symlink loop ends).
    """
    if (root / MANIFEST).is_file():
        return [root]
    if not root.is_dir():
        return []
    found, seen = [], set()
    for folder, dirs, files in os.walk(root, followlinks=follow_symlinks):
        if follow_symlinks:
            real = os.path.realpath(folder)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != LANES]
        if MANIFEST in files and folder != str(root):
            found.append(Path(folder))
    return sorted(found, key=lambda p: p.relative_to(root).parts)


Entries = tuple[dict[str, list[Path]], dict[str, Path]]


def test_file_entries(folder: Path) -> Entries:
    """The files in ``folder`` by their name without its suffix, made safe, and its
    directories by their name made safe: the names a golden path gives them."""
    files: dict[str, list[Path]] = {}
    folders: dict[str, Path] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return files, folders
    for entry in entries:
        if entry.is_file():
            files.setdefault(safe_name(entry.stem), []).append(entry)
        elif entry.is_dir():
            folders.setdefault(safe_name(entry.name), entry)
    return files, folders


def owning_test_files(
    root: Path,
    rootdir: Path,
    directory: Path,
    *,
    entries: Callable[[Path], Entries] = test_file_entries,
) -> list[Path]:
    """The test files a golden directory may belong to (inverse of :func:`golden_dir`).

    A file of any kind counts (a ``.py`` module, a ``.md`` doctest file, a custom
    collector's file): every file whose name without its suffix, made safe, names a level
    of ``directory``, at the deepest level that has one. Several files at that level
    (``guide.py`` and ``guide.md``) may each own it. ``[]``: no such file exists.
    A ``shared=`` golden belongs to the file of the test that recorded it.
    ``entries``: lists a folder (:func:`test_file_entries`); pass a cached one when
    judging many goldens.
    """
    rel = directory.relative_to(root)
    if rel.parts and rel.parts[0] == SHARED:
        recorder = _recorder_file(rootdir, directory)
        return [] if recorder is None else [recorder]
    parts, current = rel.parts[:-1], rootdir
    if parts and parts[0] == "_external":
        current, parts = Path(rootdir.anchor), parts[1:]
    levels: list[tuple[Path, str]] = []
    for part in parts:
        levels.append((current, part))
        found = entries(current)[1].get(part)
        if found is None:
            break
        current = found
    for folder, part in reversed(levels):
        files = entries(folder)[0].get(part)
        if files:
            return files
    return []


def _recorder_file(rootdir: Path, directory: Path) -> Path | None:
    """A shared golden belongs to the file of the test that recorded it (``manifest.json``)."""
    try:
        test = json.loads((directory / MANIFEST).read_text())["test"]
        candidate = rootdir / str(test).split("::", 1)[0]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return candidate if candidate.is_file() else None


_RECORDED_FILE = re.compile(r"(rollout|tensors)-.+-step[0-9]{6}.*\.safetensors")


def files_without_manifest(directory: Path) -> list[str]:
    """The golden files (metrics, tolerances, rollouts, tensors) in ``directory`` when it
    has no manifest: a golden whose manifest was deleted. Empty if it has one."""
    if (directory / MANIFEST).exists() or not directory.is_dir():
        return []
    return sorted(
        entry.name
        for entry in directory.iterdir()
        if entry.is_file()
        and (entry.name in (METRICS, TOLERANCES) or _RECORDED_FILE.fullmatch(entry.name))
    )


def find_manifestless(root: Path) -> list[Path]:
    """Every directory at or below ``root`` holding golden files without a manifest."""
    if not root.is_dir():
        return []
    found = []
    for folder, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != LANES]
        if files_without_manifest(Path(folder)):
            found.append(Path(folder))
    return sorted(found)


def rollout_filename(name: str, step: int) -> str:
    """The file of rollout batch ``name`` at ``step`` inside a golden directory."""
    return f"rollout-{safe_name(name, strict=True)}-step{step:06d}.safetensors"


def tensors_filename(name: str, step: int, rank: int | None, micro: int | None) -> str:
    """The file of ``check_tensors(name, ...)`` at ``step`` (rank, micro-batch)."""
    filename = f"tensors-{safe_name(name, strict=True)}-step{step:06d}"
    filename += "" if rank is None else f"-rank{int(rank)}"
    filename += "" if micro is None else f"-micro{int(micro)}"
    return filename + ".safetensors"


def precision_filename(name: str) -> str:
    """The file of ``check_precision(name=...)``'s manifest inside a golden directory."""
    return f"precision-{safe_name(name, strict=True)}.json"


def temp_file(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``.NAME.tmp-PID``."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def staging_dir(directory: Path) -> Path:
    """Where this process stages a new version of a golden: ``.NAME.new-PID`` beside it."""
    return directory.parent / f".{directory.name}.new-{os.getpid()}"


def staged_golden(entry: str) -> str | None:
    """The name of the golden whose staging directory ``entry`` is, else ``None``.

    The match is exact: ``.layout.new-ref.new-7`` stages golden ``layout.new-ref``, never
    golden ``layout``, so recovering one golden never touches another's staged version.
    """
    match = _STAGING.fullmatch(entry)
    return match.group(1) if match else None


_STAGING = re.compile(r"\.(.+)\.new-[0-9]+")


def lock_path(directory: Path) -> Path:
    """The lock file of a golden: ``.NAME.lock`` beside it, at its real (resolved) path."""
    real = directory.resolve()
    return real.parent / f".{real.name}.lock"


RANK_SNAPSHOT = "rollout-golden-rank"


def rank_snapshot_prefix(rank: int, pid: int | None = None) -> str:
    """The start of the name of the temporary folder of torchrun rank ``rank``'s golden copies:
    ``rollout-golden-rankRANK-HOST-PID-``, HOST a hash of this host's name, PID the owning
    process (this one by default)."""
    owner = os.getpid() if pid is None else int(pid)
    return f"{RANK_SNAPSHOT}{int(rank)}-{_short_hash(socket.gethostname())}-{owner}-"


def is_rank_snapshot_name(name: str) -> bool:
    """Whether ``name`` is named as a rank snapshot folder made on this host (only a name:
    whether the plugin made it is :data:`RANK_SNAPSHOT_MARKER`'s to say)."""
    match = _RANK_SNAPSHOT.fullmatch(name)
    return match is not None and match.group(1) == _short_hash(socket.gethostname())


_RANK_SNAPSHOT = re.compile(re.escape(RANK_SNAPSHOT) + r"[0-9]+-([0-9a-f]{8})-[0-9]+-[a-z0-9_]+")

RANK_SNAPSHOT_MARKER = ".rollout-golden-rank-snapshot"
"""The file inside a rank snapshot folder that says the plugin made it; its owner holds a
lock on it while it lives."""
RANK_SNAPSHOT_MARKER_TEXT = "made by pytest-rollout-golden for a torchrun rank above 0\n"
