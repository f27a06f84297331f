"""Where the goldens of a run at another commit come from: one source for every commit.

A :class:`GoldenSource` is a folder (copied as it is, uncommitted and untracked files
included) or the golden folder as committed at a git commit. :func:`install` puts a copy
of it in place of a checkout's golden folder, so that every commit is judged on the same
recorded inputs and no run writes into the source; :func:`digest` names its content, for
the cache of results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

from ...errors import GoldenError
from .git import Commit, git, resolve


@dataclasses.dataclass(frozen=True)
class GoldenSource:
    """A golden folder (``folder``), or the golden folder ``golden_rel`` of the repository
    ``repo`` as committed at ``commit``. Make one with :meth:`directory` or :meth:`committed`."""

    folder: Path | None = None
    repo: Path | None = None
    commit: Commit | None = None
    golden_rel: str = ""

    @classmethod
    def directory(cls, path: Path) -> GoldenSource:
        """The folder ``path`` as it is on disk."""
        if not path.is_dir():
            raise GoldenError(
                f"{path}: no such golden folder; give --goldens an existing folder or a git "
                "ref, or --golden-root the project's golden folder"
            )
        return cls(folder=path.resolve())

    @classmethod
    def committed(cls, repo: Path, ref: str, golden_rel: str) -> GoldenSource:
        """Folder ``golden_rel`` (relative to the top of ``repo``) as committed at ``ref``."""
        commit = resolve(repo, ref)
        try:
            git(repo, "rev-parse", "--verify", "--quiet", f"{commit.sha}:{golden_rel}")
        except GoldenError:
            raise GoldenError(
                f"{golden_rel}: not committed at {ref} ({commit.short} {commit.subject}); "
                "give --goldens a ref that holds the goldens, or a folder"
            ) from None
        return cls(repo=repo, commit=commit, golden_rel=golden_rel)

    def describe(self) -> str:
        """Where the goldens come from, for the output."""
        if self.commit is not None:
            return f"{self.golden_rel} at {self.commit.short} ({self.commit.subject})"
        return str(self.folder)


def source_of(value: str, repo: Path, golden_rel: str) -> GoldenSource:
    """``--goldens VALUE``: an existing folder, else a git ref of ``repo``."""
    if Path(value).is_dir():
        return GoldenSource.directory(Path(value))
    try:
        return GoldenSource.committed(repo, value, golden_rel)
    except GoldenError as exc:
        raise GoldenError(f"--goldens {value}: not a folder, and {exc}") from None


def install(source: GoldenSource, tree: Path, golden_rel: str) -> Path:
    """Replace checkout ``tree``'s golden folder (``golden_rel`` under it) with a copy of
    ``source``; returns the folder."""
    target = _inside(tree, golden_rel)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    if source.folder is not None:
        shutil.copytree(source.folder, target)
        return target
    assert source.commit is not None and source.repo is not None
    # the tree is a checkout of a clone sharing the user's objects: the commit is there
    git(
        tree,
        "checkout",
        "--quiet",
        source.commit.sha,
        "--",
        source.golden_rel,
        what=f"goldens from {source.describe()}",
    )
    if source.golden_rel != golden_rel:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tree / source.golden_rel, target)
    return target


def _inside(tree: Path, golden_rel: str) -> Path:
    """``tree / golden_rel``, or GoldenError where it would lie outside ``tree``: an absolute
    path, ``..``, or a folder on the way that is a symlink (the commit may hold one)."""
    target, rel = tree / golden_rel, Path(golden_rel)
    real_tree = Path(os.path.realpath(tree))  # the temporary folder's own links are fine
    if (
        rel.is_absolute()
        or ".." in rel.parts
        or Path(os.path.realpath(target.parent)) != real_tree / rel.parent
    ):
        raise GoldenError(
            f"--golden-root {golden_rel}: the golden folder would lie outside the temporary "
            f"checkout {tree} (an absolute path, '..', or a symlink on the way); nothing was "
            "replaced. Give the golden folder's path inside the project, with no symlink on the way"
        )
    return target


def digest(source: GoldenSource) -> str:
    """A name of the source's content: the git tree hash of a committed folder, else sha256
    over every file's relative path and bytes."""
    if source.commit is not None:
        assert source.repo is not None
        spec = f"{source.commit.sha}:{source.golden_rel}"
        return "git:" + git(source.repo, "rev-parse", spec).strip()
    assert source.folder is not None
    hasher = hashlib.sha256()
    files = [  # links followed, as the copy follows them
        Path(folder) / name
        for folder, _, names in os.walk(source.folder, followlinks=True)
        for name in names
    ]
    for path in sorted(p for p in files if p.is_file()):
        rel = path.relative_to(source.folder).as_posix().encode()
        hasher.update(len(rel).to_bytes(8, "big") + rel)
        data = path.read_bytes()
        hasher.update(len(data).to_bytes(8, "big") + data)
    return "sha256:" + hasher.hexdigest()
