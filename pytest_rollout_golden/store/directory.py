"""A golden directory as a whole: its manifest, the transaction that replaces it, the
recovery of an interrupted one, and its removal.

A golden is replaced by :class:`Transaction`: its files are staged beside it, the staged
manifest is the commit point, and the commit then moves only the files the golden owns
into place. An update interrupted before the commit point leaves the previous golden
untouched; one interrupted after it is finished by :func:`recover`, which every writer and
reader that locks the golden runs first. A commit never touches anything else in the
directory, so a golden nested in another one (``.../test_attention/test_forward``) and
its staging directory and lock file are never moved by the outer golden's commit.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import REMEDY_UPDATE, GoldenError, GoldenFormatError
from .batchfile import save_batch
from .disk import FORMAT, READ_ONLY_ERRNOS, SCHEMA, atomic_write, format_error, unwritable_error
from .jsonfile import encode_json, is_json_int, json_digest, read_json
from .location import LANE_NAME, LANES, MANIFEST, staged_golden, staging_dir


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a golden directory, validated; ``None`` if there is no golden."""
    path = directory / MANIFEST
    try:
        manifest = read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise format_error(path, "is not a pytest-rollout-golden manifest")
    if manifest.get("schema") != SCHEMA:
        raise GoldenFormatError(
            f"{path}: schema version {manifest.get('schema')!r} is not supported by this "
            f"pytest-rollout-golden (schema {SCHEMA}); upgrade the plugin, or {REMEDY_UPDATE}."
        )
    if not isinstance(manifest.get("files"), dict):
        raise format_error(path, "has no file table")
    if not isinstance(manifest.get("fingerprint", {}), (dict, type(None))):
        raise format_error(path, "has a malformed fingerprint (not an object)")
    if not _stand_ins_valid(manifest.get("stand_ins", {})):
        raise format_error(
            path, "has malformed stand_ins (not {step: {rollout name: step standing in}})"
        )
    problem = _lane_problem(manifest)
    if problem:
        raise format_error(path, problem)
    for filename, info in manifest["files"].items():
        problem = _manifest_entry_problem(filename, info) or _not_a_file(directory / filename)
        if problem:
            raise format_error(path, f"has a malformed entry for {filename!r}: {problem}")
    return manifest


def _lane_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's lane fields: ``lane``, the lane its values belong to,
    and ``inputs``, ``{rollout file: digest}`` a lane's values were computed on."""
    lane, inputs = manifest.get("lane"), manifest.get("inputs", {})
    if lane is not None and not (isinstance(lane, str) and LANE_NAME.fullmatch(lane)):
        return f"has a malformed lane {lane!r} (not a lane name)"
    if not isinstance(inputs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()
    ):
        return "has malformed inputs (not {rollout file: digest})"
    return None


def _stand_ins_valid(stand_ins: Any) -> bool:
    """Whether a manifest's ``stand_ins`` is ``{step: {rollout name: step}}`` (the steps
    whose values were recorded while another step's rollout stood in, see inputs.py)."""
    return isinstance(stand_ins, dict) and all(
        isinstance(step, str)
        and step.isdigit()
        and isinstance(names, dict)
        and all(isinstance(n, str) and is_json_int(s) and s >= 0 for n, s in names.items())
        for step, names in stand_ins.items()
    )


def _manifest_entry_problem(filename: str, info: Any) -> str | None:
    """What is wrong with one entry of a manifest's file table, or ``None``."""
    if (
        not filename
        or filename.startswith(".")
        or filename == MANIFEST
        or any(c in filename for c in "/\\\0")
    ):
        return "not a plain file name inside the golden directory"
    if not isinstance(info, dict):
        return "not an object"
    if not isinstance(info.get("digest"), str) or not info["digest"]:
        return "no digest"
    for field in ("kind", "name"):
        if not isinstance(info.get(field, ""), str):
            return f"{field} is not a string"
    if info.get("kind") in ("rollout", "tensors") and not isinstance(info.get("name"), str):
        return "no name"
    for field in ("step", "rank", "micro"):
        value = info.get(field)
        if value is None and (field != "step" or info.get("kind") not in ("rollout", "tensors")):
            continue
        if not is_json_int(value) or (field == "step" and value < 0):
            return f"{field} is not an integer" + (" >= 0" if field == "step" else "")
    return None


def _not_a_file(path: Path) -> str | None:
    """Why a listed entry that exists is not a file of the golden (a directory, a link)."""
    if path.is_symlink():
        return "not a file of this golden (a symbolic link)"
    if path.exists() and not path.is_file():
        return "not a file of this golden (a directory or another kind of entry)"
    return None


def recover(directory: Path) -> None:
    """Finish an interrupted commit of ``directory``, or drop one that never reached its
    commit point; call under :func:`locked`.

    A staged version whose manifest was written is committed: its files are moved in. One
    without it never reached the commit point, so the golden is still the previous version.
    """
    parent = directory.parent
    if not parent.is_dir():
        return
    staged = [p for p in parent.iterdir() if staged_golden(p.name) == directory.name]
    for leftover in sorted(staged, key=lambda p: p.stat().st_mtime):
        if listed_files(leftover) is not None:
            _move_in(leftover, directory)
        shutil.rmtree(leftover, ignore_errors=True)


def interrupted_commits(directory: Path) -> list[Path]:
    """The staged versions beside ``directory`` whose commit was interrupted past its commit
    point (their manifest written), which the next :func:`recover` finishes."""
    if not directory.parent.is_dir():
        return []
    return sorted(
        p
        for p in directory.parent.iterdir()
        if staged_golden(p.name) == directory.name and (p / MANIFEST).is_file()
    )


def _move_in(staged: Path, directory: Path) -> None:
    """Move the files of a staged version (its manifest written) into ``directory``.

    Its files first (each rename replaces one file whole), then the files of the version
    it replaces that it does not list are deleted, then its manifest replaces the old
    one. Only names the old or the new manifest lists are touched. Repeating it after an
    interruption at any point finishes the same version.
    """
    new = listed_files(staged)
    assert new is not None
    for name in sorted(new - {MANIFEST}):
        if (staged / name).is_file():  # absent: kept from the old version, already in place
            _replace_into(staged / name, directory)
    for name in sorted((listed_files(directory) or set()) - new):
        (directory / name).unlink(missing_ok=True)
    _replace_into(staged / MANIFEST, directory)
    fsync_dir(directory)


def _replace_into(source: Path, directory: Path, tries: int = 10) -> None:
    """Rename ``source`` to the same name in ``directory``, made if missing.

    The directory of a golden not recorded yet may be created, found empty and removed
    by a nested golden's lock (see :func:`locked`) while this commit moves its first file
    in: it is made again.
    """
    for attempt in range(tries):
        directory.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(source, directory / source.name)
            return
        except FileNotFoundError:
            if attempt == tries - 1 or not source.exists() or directory.is_dir():
                raise


class Transaction:
    """Stage a new version of a golden, then commit it by moving only its own files in.

    Files written through the transaction land in a hidden staging directory beside the
    golden (``.NAME.new-PID``); files kept from the current version stay where they are.
    :meth:`commit` writes the staged manifest (the commit point), then moves the staged
    files into the golden directory, deletes the old files the new version drops, and
    moves the manifest in last.

    Why this is safe with nested goldens and without their locks: a commit renames,
    replaces or deletes only (a) names listed by this golden's old or new manifest, which
    are plain, non-hidden file names directly inside its directory (never a directory, a
    link or a hidden entry; see :func:`read_manifest` and :func:`listed_files`), and (b)
    its own staging directory, which lies beside the golden and is named after it. A
    nested golden is a directory inside this one; its files, its staging directory
    ``.INNER.new-PID`` and its lock ``.INNER.lock`` are a directory or hidden names inside
    this directory, so no step of this commit ever touches them, whatever runs meanwhile.
    Two commits of the same golden are excluded by its lock (:func:`locked`).

    Until the staged manifest is written the golden is untouched and :meth:`abort` drops
    the staging. Once it is written the commit is decided: a crash or an error after it
    leaves the staging for :func:`recover` to finish (never for :meth:`abort` to drop), so
    whoever locks the golden next sees the new version whole.
    """

    def __init__(self, directory: Path):
        # A golden directory that is a link (inside the golden root, see
        # location.link_out_of_root) is replaced where it points; the link stays.
        self.directory = Path(os.path.realpath(directory))
        self.staging = staging_dir(directory)
        shutil.rmtree(self.staging, ignore_errors=True)
        missing = [p for p in self.directory.parents if not p.exists()]
        self._created = missing[-1] if missing else None  # removed again by abort() if empty
        try:
            self.staging.mkdir(parents=True)
        except OSError as exc:
            raise unwritable_error(Path(directory), exc) from None
        self.files: dict[str, dict[str, Any]] = {}
        self._staged: set[str] = set()  # the files written into the staging directory
        self.decided = False  # the staged manifest is written: only recover() may finish it

    def write_batch(self, filename: str, batch: Any, **info: Any) -> None:
        digest = save_batch(self.staging / filename, batch)
        self.files[filename] = {**info, "digest": digest}
        self._staged.add(filename)

    def write_json(self, filename: str, obj: Any, **info: Any) -> None:
        data = encode_json(obj)
        atomic_write(self.staging / filename, [data])
        self.files[filename] = {**info, "digest": json_digest(data)}
        self._staged.add(filename)

    def keep(self, filename: str, info: Mapping[str, Any]) -> None:
        """Carry a file of the current version over unchanged (it stays where it is)."""
        os.stat(self.directory / filename)  # FileNotFoundError: it cannot be kept
        self.files[filename] = dict(info)

    def commit(self, manifest: dict[str, Any]) -> None:
        """Write the staged manifest (the commit point), then move this golden's files in;
        nothing in the directory that the old or the new version does not list is touched."""
        files = dict(sorted(self.files.items()))  # name order: a no-op update changes no byte
        manifest = {"format": FORMAT, "schema": SCHEMA, **manifest, "files": files}
        atomic_write(self.staging / MANIFEST, [encode_json(manifest)])
        fsync_dir(self.staging)
        self.decided = True
        try:
            _move_in(self.staging, self.directory)
        except OSError as exc:
            if exc.errno in READ_ONLY_ERRNOS:
                if all((self.staging / name).exists() for name in self._staged):
                    self.decided = False  # nothing moved in: abort() drops the whole update
                raise unwritable_error(self.directory, exc) from None
            raise GoldenError(
                f"{self.directory}: the new version was committed but moving its files into "
                f"place failed ({exc}); it waits in {self.staging.name} beside it, and the next "
                "run that opens this golden finishes the update"
            ) from exc
        fsync_dir(self.directory.parent)
        shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self) -> None:
        """Drop the staged version, unless it was committed (then :func:`recover` finishes
        an interrupted commit)."""
        if self.decided:
            return
        shutil.rmtree(self.staging, ignore_errors=True)
        if self._created is not None:
            for folder in [self.staging.parent, *self.staging.parent.parents]:
                try:
                    folder.rmdir()  # only empty folders this transaction created
                except OSError:
                    break
                if folder == self._created:
                    break


def listed_files(directory: Path) -> set[str] | None:
    """Names of the files the golden in ``directory`` owns (its manifest's table and the
    manifest itself); ``None`` if its manifest is missing or is not one of ours. A listed
    name that is a directory or a link is never owned: nothing deletes it as the golden's."""
    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not (
        isinstance(manifest, dict)
        and manifest.get("format") == FORMAT
        and type(manifest.get("schema")) is int
        and isinstance(manifest.get("files"), dict)
    ):
        return None
    names = {
        n
        for n in manifest["files"]
        if isinstance(n, str) and _plain_name(n) and _not_a_file(directory / n) is None
    }
    return names | {MANIFEST}


def _plain_name(name: str) -> bool:
    """A non-hidden name directly inside the directory (hidden names beside and inside a
    golden are staging directories, lock files and temporary files)."""
    return bool(name) and not name.startswith(".") and "/" not in name and "\\" not in name


def remove_golden(directory: Path, root: Path) -> list[str]:
    """Delete the golden in ``directory``: its lanes (each as a golden, :func:`_remove_lanes`),
    then the files its manifest lists, then the manifest, then the directory if nothing else
    is in it. Returns the names of what was left (a lane's as ``@lanes/LANE/NAME``).

    Refuses (raises GoldenError) a directory that is not a golden of ours, is reached
    through a symbolic link, or lies outside the golden ``root``.
    """
    real_root = Path(os.path.realpath(root))
    try:
        rel = directory.relative_to(root)
    except ValueError:
        raise GoldenError(f"{directory}: not inside the golden root {root}; not deleted") from None
    if not rel.parts or any(
        (root / Path(*rel.parts[:i])).is_symlink() for i in range(1, len(rel.parts) + 1)
    ):
        raise GoldenError(f"{directory}: reached through a symbolic link; not deleted")
    real = Path(os.path.realpath(directory))
    if real == real_root or real_root not in real.parents:
        raise GoldenError(f"{directory}: outside the golden root {root}; not deleted")
    owned = listed_files(directory)
    if owned is None:
        raise GoldenError(
            f"{directory}: {MANIFEST} is not a pytest-rollout-golden manifest; not deleted"
        )
    lanes_left = _remove_lanes(directory, root)  # first: an interrupted removal leaves a golden
    for name in [*sorted(owned - {MANIFEST}), MANIFEST]:
        path = directory / name
        if path.is_file() or path.is_symlink():  # a link itself, never what it points to
            path.unlink(missing_ok=True)
    left = sorted(e.name for e in directory.iterdir() if e.name != LANES or not lanes_left)
    if not left and not lanes_left:
        directory.rmdir()
    return sorted(left + lanes_left)


def _remove_lanes(directory: Path, root: Path) -> list[str]:
    """Delete the lanes of the golden in ``directory`` (``@lanes/LANE/``), each through
    :func:`remove_golden`, then ``@lanes/`` if emptied; returns what was left, by its path
    inside the golden. A link (``@lanes/`` itself or an entry in it) is never followed, and
    an entry that is no lane of ours is left where it is."""
    folder = directory / LANES
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return [LANES]
    if not folder.exists():
        return []
    left = []
    for entry in sorted(folder.iterdir()):
        name = f"{LANES}/{entry.name}"
        if entry.is_symlink() or not entry.is_dir() or not LANE_NAME.fullmatch(entry.name):
            left.append(name)
            continue
        try:
            left += [f"{name}/{rest}" for rest in remove_golden(entry, root)]
        except GoldenError:  # not a lane of ours: its files stay, named
            left.append(name)
    if not left:
        folder.rmdir()
    return left


def fsync_dir(directory: Path) -> None:
    """fsync ``directory`` itself, so a rename into it survives a power loss."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
