"""``--golden-prune``: which unused goldens may be deleted, and deleting them.

Only a whole run may prune: a golden no collected test used is unused only if every
test that could use it was collected and run. ``--golden-prune`` deletes the goldens of
test files that are gone; ``--golden-prune-tests`` also those of files that still exist
(a removed test, or a case collected only on other machines). Works without pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import GoldenError
from .location import SHARED
from .presentation import display, unused_kept_note
from .session import SessionState


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
    root: Path, goldens: Sequence[tuple[Path, Path | None]], *, tests: bool, refused: str = ""
) -> Pruned:
    """Delete unused ``(golden, its test file or None)``; those of existing files if ``tests``.

    ``refused``: why this session may not prune (:func:`not_full_run`); then nothing is
    deleted. Emptied test-file folders are removed too.
    """
    from . import store

    out = Pruned()
    if refused:
        out.notes.append(f"--golden-prune skipped: {refused}; nothing was deleted")
        return out
    kept = 0
    for directory, owner in goldens:
        if not tests and not gone(root, directory, owner):
            kept += 1
            continue
        try:
            left = store.remove_golden(directory, root)
        except GoldenError as exc:
            out.notes.append(f"--golden-prune kept {exc}")
            continue
        if left:
            out.notes.append(
                f"--golden-prune kept {directory}: it holds files its golden does not "
                f"list ({', '.join(left[:5])})"
            )
            continue
        out.deleted.append(directory)
        parent = directory.parent  # the test file's folder, if now empty
        while parent != root and root in parent.parents:
            if any(parent.iterdir()):
                break
            parent.rmdir()
            parent = parent.parent
    if kept:
        out.notes.append(
            f"--golden-prune kept {kept} unused golden(s) of test files that still exist "
            "(a removed test, or a case collected only on other machines, e.g. cuda); "
            "--golden-prune-tests deletes them on a whole run"
        )
    return out


@dataclass
class Unused:
    """The unused goldens a session found, and what ``--golden-prune`` did with them."""

    goldens: list[Path] = field(default_factory=list)
    kept: int = 0  # unused goldens of test files that still exist, or shared
    pruned: Pruned = field(default_factory=Pruned)
    deleting: bool = False  # --golden-prune or --golden-prune-tests was given

    def notes(self) -> list[str]:
        """The summary's lines: why some were kept, and what pruning did."""
        kept = [unused_kept_note(self.kept)] if self.kept and not self.deleting else []
        return kept + self.pruned.notes


def unused_and_pruned(
    state: SessionState,
    root: Path,
    rootdir: Path,
    *,
    prune_gone: bool,
    prune_tests: bool,
    stopped: bool,
    failed: bool,
) -> Unused:
    """Find the unused goldens of a session and prune them if asked (``prune_gone``:
    ``--golden-prune``, ``prune_tests``: ``--golden-prune-tests``), unless the session
    ``stopped`` early, ``failed``, or did not run every test (:func:`not_full_run`)."""
    out = Unused(deleting=prune_gone or prune_tests)
    goldens: list[tuple[Path, Path | None]] = []
    if state.expected_dirs or out.deleting:
        goldens = state.unused_goldens(root, rootdir)
        out.goldens = [d for d, _ in goldens]
        out.kept = sum(1 for d, owner in goldens if not gone(root, d, owner))
    if out.deleting:
        refused = not_full_run(state, rootdir, stopped=stopped, failed=failed)
        out.pruned = prune(root, goldens, tests=prune_tests, refused=refused)
    return out
