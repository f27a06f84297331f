"""``--golden-prune``: which unused goldens may be deleted, and deleting them.

Only a whole run may prune: a golden no collected test used is unused only if every
test that could use it was collected and run. ``--golden-prune`` deletes the goldens of
test files that are gone; ``--golden-prune-tests`` also those of files that still exist
(a removed test, or a case collected only on other machines).

Ownership: a golden directory is named by its test file's path relative to the rootdir,
without its suffix; a file of any kind may own it (a module, a ``.md`` doctest file, a
custom collector's file). Only a golden root inside the rootdir is this project's alone.
Under a root outside it (``golden_dir = ../golden``, which another project may share),
goldens whose test file is not under this rootdir, and ``shared=`` goldens, are never
judged. A ``shared=`` golden belongs to every file that declares it: it is unused only on a
run that collected every test file of the project (the rootdir among its test paths), the
file that recorded it included. Works without pytest.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import GoldenError
from ...store.location import SHARED, find_goldens, owning_test_files, test_file_entries
from ..wording import display
from .session import SessionState
from .summary import unused_kept_note

_LISTED = 5  # directories named in one note


def gone(root: Path, directory: Path, owner: Path | None) -> bool:
    """Whether no test can use this golden any more: its (unshared) test file is gone."""
    return owner is None and directory.relative_to(root).parts[0] != SHARED


def not_full_run(state: SessionState, rootdir: Path, *, stopped: bool, failed: bool) -> str:
    """Why this session may not prune (``""``: it may): some tests did not run, the
    session ``stopped`` early, or tests ``failed``."""
    partial = state.partial_collection()
    if partial:
        where = display(partial[0], rootdir)
        more = f" and {len(partial) - 1} more" if len(partial) > 1 else ""
        return (
            "some tests were deselected, filtered out (--lf, a conftest) or named "
            f"individually ({where}{more})"
        )
    if stopped:
        return "the session stopped early"
    if failed:
        return "tests failed"
    return ""


@dataclass
class Pruned:
    """What pruning deleted, and the notes for the terminal summary."""

    deleted: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def prune(
    root: Path,
    rootdir: Path,
    goldens: Sequence[tuple[Path, Path | None]],
    *,
    tests: bool,
    refused: str = "",
) -> Pruned:
    """Delete unused ``(golden, its test file or None)``; those of existing files if ``tests``.

    ``refused``: why this session may not prune (:func:`not_full_run`); then nothing is
    deleted. Emptied test-file folders are removed too. A deleted golden whose directory
    still holds entries it does not list (a user's file, a golden nested in it that is
    kept) is named with them.
    """
    from ... import store

    out = Pruned()
    if refused:
        out.notes.append(f"--golden-prune skipped: {refused}; nothing was deleted")
        return out
    kept, left = 0, {}
    for directory, owner in goldens:
        if not tests and not gone(root, directory, owner):
            kept += 1
            continue
        try:
            left[directory] = store.remove_golden(directory, root)
        except GoldenError as exc:
            out.notes.append(f"--golden-prune kept {exc}")
            continue
        out.deleted.append(directory)
        parent = directory.parent  # the test file's folder, if now empty
        while parent != root and root in parent.parents and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    for directory, names in left.items():
        stayed = [name for name in names if os.path.lexists(directory / name)]
        if stayed:  # a nested golden deleted after its outer one is gone by now
            out.notes.append(
                f"--golden-prune deleted {display(directory, rootdir)} but kept its directory: "
                f"it holds entries that golden does not list ({', '.join(stayed[:_LISTED])})"
            )
    if kept:
        out.notes.append(
            f"--golden-prune kept {kept} unused golden(s) of test files that still exist "
            "(a removed test, or a case collected only on other machines, e.g. cuda); "
            "--golden-prune-tests deletes them on a whole run"
        )
    return out


def outside_rootdir(root: Path, rootdir: Path) -> bool:
    """Whether the golden root lies outside the rootdir, where another project may share it."""
    real, real_rootdir = Path(os.path.realpath(root)), Path(os.path.realpath(rootdir))
    return real_rootdir not in real.parents


# pytest's default ``norecursedirs``: folders that hold no test of the project
_NEVER_TESTS = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")


def may_hold_tests(path: Path) -> bool:
    """Whether ``path``, which collection ignored, may hold tests of the project: not a
    ``__pycache__``, a virtualenv, or a folder pytest's default ``norecursedirs`` leaves out."""
    if path.name == "__pycache__" or (path / "pyvenv.cfg").is_file():
        return False
    return not any(fnmatch.fnmatchcase(path.name, pattern) for pattern in _NEVER_TESTS)


def partial_project(
    args: Sequence[Path],
    rootdir: Path,
    *,
    testpaths: str,
    ignored: Sequence[str],
    skipped: Sequence[str],
    collect_ignored: Sequence[str] = (),
) -> str:
    """Why this run may have left out test files of the project (``""``: it collected all).

    Only a run whose test paths include the rootdir (or a folder above it) collects the
    whole project: the ini's ``testpaths`` are a part of it like any other test paths.
    ``args``: the paths the run collected; ``testpaths``: how the ini's ``testpaths``
    chose them (``"testpaths = tests (pytest.ini)"``), ``""`` if they did not;
    ``ignored``: ``--ignore``/``--ignore-glob`` values; ``skipped``: files skipped at
    collection (e.g. ``pytest.importorskip``), whose tests were never seen;
    ``collect_ignored``: paths collection ignored (``collect_ignore``, ``norecursedirs``,
    a ``pytest_ignore_collect`` hook) that may hold tests.
    """
    if skipped:
        more = f" and {len(skipped) - 1} more were" if len(skipped) > 1 else " was"
        return f"{display(sorted(skipped)[0], rootdir)}{more} skipped at collection"
    if ignored:
        return f"--ignore {ignored[0]} left files out"
    if collect_ignored:
        more = f" and {len(collect_ignored) - 1} more" if len(collect_ignored) > 1 else ""
        return f"collection ignored {display(sorted(collect_ignored)[0], rootdir)}{more}"
    real = Path(os.path.realpath(rootdir))
    paths = {Path(os.path.realpath(a)) for a in args}
    if any(p == real or p in real.parents for p in paths):
        return ""
    if testpaths:
        return f"it collected only {testpaths}"
    named = ", ".join(sorted(display(p, real) for p in paths)[:_LISTED]) or "no path"
    return f"it collected only {named}"


@dataclass
class Judged:
    """The goldens of a root that no test of this session used, by what may happen to them."""

    unused: list[tuple[Path, Path | None]] = field(default_factory=list)  # (golden, test file)
    foreign: list[Path] = field(default_factory=list)  # maybe another project's: never judged
    # shared goldens a test file the run left out may declare, by why it may have left one out
    shared_left: dict[str, list[Path]] = field(default_factory=dict)


def _shared_left_out(state: SessionState, rootdir: Path, recorder: list[Path], partial: str) -> str:
    """Why a test file this run did not collect may declare a ``shared=`` golden recorded
    by ``recorder`` (``""``: none can)."""
    if partial:
        return partial
    if state.partial_collection():
        return "some tests were left out"
    if recorder and str(recorder[0]) not in state.produced:
        return f"it did not collect {display(recorder[0], rootdir)}, which recorded them"
    return ""


def judge(state: SessionState, root: Path, rootdir: Path, *, partial: str) -> Judged:
    """Sort the goldens under ``root`` no test of ``state`` used (see the module docstring).

    A golden is unused if every file that may own it (:func:`owning_test_files`, files of
    any kind) is gone or was collected and run whole; a ``shared=`` golden only if the run
    collected the whole project (``partial``: why not), its recording file included.
    Only directories whose manifest is a pytest-rollout-golden manifest count.
    """
    import functools

    from ... import store

    out = Judged()
    used = state.used_dirs()
    outside = outside_rootdir(root, rootdir)
    whole = state.whole_files()
    entries = functools.lru_cache(maxsize=None)(test_file_entries)  # goldens share folders
    for directory in find_goldens(root):
        if str(directory) in used or directory == root:
            continue
        if store.listed_files(directory) is None:  # not a golden of ours: never touched
            continue
        owners = owning_test_files(root, rootdir, directory, entries=entries)
        if directory.relative_to(root).parts[0] == SHARED:
            why = _shared_left_out(state, rootdir, owners, partial)
            if outside:
                out.foreign.append(directory)
            elif why:
                out.shared_left.setdefault(why, []).append(directory)
            else:
                out.unused.append((directory, None))
        elif not owners and outside:
            out.foreign.append(directory)
        elif all(str(owner) in whole for owner in owners):
            out.unused.append((directory, owners[0] if owners else None))
    return out


@dataclass
class Unused:
    """The unused goldens a session found, and what ``--golden-prune`` did with them."""

    goldens: list[Path] = field(default_factory=list)
    kept: int = 0  # unused goldens of test files that still exist, or shared
    pruned: Pruned = field(default_factory=Pruned)
    deleting: bool = False  # --golden-prune or --golden-prune-tests was given
    ownership: list[str] = field(default_factory=list)  # goldens left alone, or shared deleted

    def notes(self) -> list[str]:
        """The summary's lines: why some were kept, and what pruning did."""
        kept = [unused_kept_note(self.kept)] if self.kept and not self.deleting else []
        return kept + self.pruned.notes + self.ownership


def _names(root: Path, directories: Sequence[Path]) -> str:
    names = [d.relative_to(root).as_posix() for d in directories[:_LISTED]]
    return ", ".join(names) + (
        f", and {len(directories) - _LISTED} more" if directories[_LISTED:] else ""
    )


def ownership_notes(
    root: Path, rootdir: Path, judged: Judged, deleted: Sequence[Path], *, flag: str, partial: str
) -> list[str]:
    """What ``flag`` left alone because this project may not own it, and the shared goldens
    it deleted."""
    notes = []
    if judged.foreign:
        notes.append(
            f"{flag} left alone {len(judged.foreign)} golden(s) under {display(root, rootdir)} "
            f"whose test file is not under rootdir {rootdir} ({_names(root, judged.foreign)}): "
            "golden_dir lies outside the rootdir, so another project may share it and own "
            "them (shared= goldens too); delete them by hand once unused, or keep golden_dir "
            "inside the rootdir"
        )
    shared_left = judged.shared_left if flag == "--golden-prune-tests" else {}
    for why, left in shared_left.items():
        notes.append(
            f"{flag} left alone {len(left)} shared golden(s) ({_names(root, left)}): this run "
            f"did not collect the whole project ({why}), and a test file it left out may "
            "declare them; prune them on a run that collects every test file (the rootdir as "
            "test path, nothing ignored or skipped at collection)"
        )
    shared = [d for d in deleted if d.relative_to(root).parts[0] == SHARED]
    if shared:
        notes.append(
            f"{flag} deleted {len(shared)} shared golden(s) no test of this whole-project run "
            f"declares: {_names(root, shared)}"
        )
    return notes


def unused_and_pruned(
    state: SessionState,
    root: Path,
    rootdir: Path,
    *,
    prune_gone: bool,
    prune_tests: bool,
    stopped: bool,
    failed: bool,
    partial: str,
) -> Unused:
    """Find the unused goldens of a session and prune them if asked (``prune_gone``:
    ``--golden-prune``, ``prune_tests``: ``--golden-prune-tests``), unless the session
    ``stopped`` early, ``failed``, or did not run every test (:func:`not_full_run`).
    ``partial``: why the run may not have collected every test file of the project
    (:func:`partial_project`; ``""``: it did)."""
    out = Unused(deleting=prune_gone or prune_tests)
    if not (state.used_dirs() or out.deleting):
        return out
    judged = judge(state, root, rootdir, partial=partial)
    out.goldens = [d for d, _ in judged.unused]
    out.kept = sum(1 for d, owner in judged.unused if not gone(root, d, owner))
    if out.deleting:
        refused = not_full_run(state, rootdir, stopped=stopped, failed=failed)
        out.pruned = prune(root, rootdir, judged.unused, tests=prune_tests, refused=refused)
        if not refused:
            flag = "--golden-prune-tests" if prune_tests else "--golden-prune"
            out.ownership = ownership_notes(
                root, rootdir, judged, out.pruned.deleted, flag=flag, partial=partial
            )
    return out
