"""A golden directory as a whole: its manifest, the transaction that replaces it, the
recovery of an interrupted one, and its removal.

A golden directory is replaced as a whole (see :class:`Transaction`): an interrupted
update leaves the previous golden intact and loadable.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import REMEDY_UPDATE, GoldenError, GoldenFormatError
from ..location import MANIFEST, backup_dir, leftover_kind, staging_dir
from .batchfile import save_batch
from .files import FORMAT, READ_ONLY_ERRNOS, SCHEMA, atomic_write, format_error, unwritable_error
from .jsonfile import encode_json, is_json_int, json_digest, read_json


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
    for filename, info in manifest["files"].items():
        problem = _manifest_entry_problem(filename, info) or _not_a_file(directory / filename)
        if problem:
            raise format_error(path, f"has a malformed entry for {filename!r}: {problem}")
    return manifest


def _manifest_entry_problem(filename: str, info: Any) -> str | None:
    """What is wrong with one entry of a manifest's file table, or ``None``."""
    if filename in ("", ".", "..", MANIFEST) or any(c in filename for c in "/\\\0"):
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
    """Finish or roll back an interrupted commit of ``directory`` (call under :func:`locked`)."""
    parent = directory.parent
    if not parent.is_dir():
        return
    backups, staged = [], []
    for p in parent.iterdir():
        kind = leftover_kind(directory.name, p.name)
        if kind == "old":
            backups.append(p)
        elif kind == "new":
            staged.append(p)
    backups.sort(key=lambda p: p.stat().st_mtime)
    if backups and not directory.exists():
        os.rename(backups.pop(), directory)
    for leftover in backups:
        if _return_unlisted(leftover, directory, listed_files(leftover) or {MANIFEST}):
            _discard(leftover)
    for leftover in staged:
        owned = listed_files(leftover)  # None: its manifest was never written, nothing moved in
        if owned is None or _return_unlisted(leftover, directory, owned):
            shutil.rmtree(leftover, ignore_errors=True)


def _return_unlisted(source: Path, home: Path, owned: set[str]) -> bool:
    """Move what ``source`` holds beyond ``owned`` back into ``home`` before ``source`` goes.

    A commit moves entries its golden does not own (a golden nested in this one, a user's
    file) into the staged version; a crash or a failed swap must not delete them with it.
    Returns False (keep ``source``) if something could not be put back.
    """
    returned = True
    for entry in source.iterdir():
        if entry.name in owned:
            continue
        if not home.is_dir() or (home / entry.name).exists():
            returned = False
            continue
        os.rename(entry, home / entry.name)
    return returned


class Transaction:
    """Stage a new version of a golden directory, then swap it in as a whole.

    Files written through the transaction land in a hidden staging directory;
    :meth:`commit` hard-links the kept files of the old version, writes the
    manifest last, and renames the staging directory into place. Until that
    rename the old golden is untouched; a crash between the two renames is
    undone by :func:`recover`.
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

    def write_batch(self, filename: str, batch: Any, **info: Any) -> None:
        digest = save_batch(self.staging / filename, batch)
        self.files[filename] = {**info, "digest": digest}

    def write_json(self, filename: str, obj: Any, **info: Any) -> None:
        data = encode_json(obj)
        atomic_write(self.staging / filename, [data])
        self.files[filename] = {**info, "digest": json_digest(data)}

    def keep(self, filename: str, info: Mapping[str, Any]) -> None:
        """Carry a file of the current version over unchanged."""
        target = self.staging / filename
        try:
            os.link(self.directory / filename, target)
        except OSError:
            shutil.copy2(self.directory / filename, target)
        self.files[filename] = dict(info)

    def commit(self, manifest: dict[str, Any]) -> None:
        """Swap the staged version in; what the old version does not list stays in place.

        Entries of the old directory that its manifest does not list (a golden nested
        inside this one, a file a user put there) are moved into the new version, so the
        swap replaces only this golden's own files.
        """
        manifest = {"format": FORMAT, "schema": SCHEMA, **manifest, "files": self.files}
        atomic_write(self.staging / MANIFEST, [encode_json(manifest)])
        _fsync_dir(self.staging)
        backup = backup_dir(self.directory)
        had_old = self.directory.exists()
        try:
            if had_old:
                for entry in _unlisted(self.directory, extra=set(self.files)):
                    os.rename(entry, self.staging / entry.name)
                os.rename(self.directory, backup)
            os.rename(self.staging, self.directory)
        except OSError as exc:  # abort() puts back what was moved; recover() the rest
            if exc.errno in READ_ONLY_ERRNOS:
                raise unwritable_error(self.directory, exc) from None
            raise
        _fsync_dir(self.directory.parent)
        if had_old:
            for entry in _unlisted(backup, extra=set(self.files)):  # arrived during the swap
                os.rename(entry, self.directory / entry.name)
            _discard(backup)

    def abort(self) -> None:
        if self.staging.is_dir() and not _return_unlisted(
            self.staging, self.directory, {*self.files, MANIFEST}
        ):
            return  # something not ours could not be put back: leave it for recover()
        shutil.rmtree(self.staging, ignore_errors=True)
        if self._created is not None:
            for folder in [self.staging.parent, *self.staging.parent.parents]:
                try:
                    folder.rmdir()  # only empty folders this transaction created
                except OSError:
                    break
                if folder == self._created:
                    break


def _discard(version: Path) -> None:
    """Delete a replaced version of a golden, its manifest last.

    A crash part-way then leaves a version whose manifest still names what is left, so
    :func:`recover` deletes the rest instead of taking it for a user's files to put back.
    """
    owned = listed_files(version) or set()
    try:
        entries = sorted(version.iterdir(), key=lambda e: (e.name in owned, e.name == MANIFEST))
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        version.rmdir()
    except OSError:
        pass  # what is left is finished by the next recover()


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
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _unlisted(directory: Path, *, extra: set[str]) -> list[Path]:
    """Entries of ``directory`` that neither its golden nor the new version (``extra``) lists."""
    owned = listed_files(directory)
    if owned is None:  # no readable manifest of ours: only what the new version replaces
        owned = {MANIFEST}
    owned |= extra
    return [e for e in directory.iterdir() if e.name not in owned]


def remove_golden(directory: Path, root: Path) -> list[str]:
    """Delete the golden in ``directory``: the files its manifest lists, then the manifest,
    then the directory if nothing else is in it. Returns the names of what was left.

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
    for name in [*sorted(owned - {MANIFEST}), MANIFEST]:
        path = directory / name
        if path.is_file() or path.is_symlink():  # a link itself, never what it points to
            path.unlink(missing_ok=True)
    left = sorted(e.name for e in directory.iterdir())
    if not left:
        directory.rmdir()
    return left


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
