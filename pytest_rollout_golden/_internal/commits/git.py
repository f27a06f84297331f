"""The ``git`` commands the commit tools run: resolving refs and listing a range of commits.

Every command here only reads the user's repository; what writes (clones, worktrees) runs
in a private clone (:mod:`.trees`).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from ...errors import GoldenError

# variables that point git at another repository, index or object store than the one named
_REDIRECTS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
)


@dataclasses.dataclass(frozen=True)
class Commit:
    """One commit: its full hash and the first line of its message."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


def environment() -> dict[str, str]:
    """The environment git runs in: this process's, without what would redirect git."""
    return {k: v for k, v in os.environ.items() if k not in _REDIRECTS}


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``git -C repo ARGS`` with hooks off, its output captured."""
    command = ["git", "-c", "core.hooksPath=/dev/null", "-C", str(repo), *args]
    try:
        return subprocess.run(
            command, capture_output=True, text=True, env=environment(), check=False
        )
    except FileNotFoundError:
        raise GoldenError("git: not found; install git, or put it on PATH") from None


def git(repo: Path, *args: str, what: str = "") -> str:
    """Run ``git -C repo ARGS`` (hooks off) and return its output; :class:`GoldenError`
    naming ``what`` (else the command) and git's own message when it fails."""
    done = _run(repo, *args)
    if done.returncode != 0:
        message = done.stderr.strip().splitlines()
        raise GoldenError(f"{what or 'git ' + ' '.join(args)}: {message[-1] if message else ''}")
    return done.stdout


def toplevel(path: Path) -> Path:
    """The top folder of the git working tree holding ``path``."""
    try:
        out = git(path, "rev-parse", "--show-toplevel", what=str(path))
    except GoldenError as exc:
        raise GoldenError(f"{exc}; run rollout-golden inside a git checkout") from None
    return Path(out.strip()).resolve()


def resolve(repo: Path, ref: str) -> Commit:
    """The commit ``ref`` names in ``repo`` (a branch, tag, hash, ``HEAD~3``, ...)."""
    if not ref or ref.startswith("-"):
        raise GoldenError(f"{ref!r}: not a git ref; give a branch, tag or commit hash")
    try:
        out = git(repo, "log", "-1", "--format=%H%x00%s", f"{ref}^{{commit}}", "--", what=ref)
    except GoldenError:
        raise GoldenError(
            f"{ref}: no such commit in {repo}; give a branch, tag or commit hash "
            "(git log --oneline lists them)"
        ) from None
    sha, subject = out.rstrip("\n").split("\0", 1)
    return Commit(sha, subject)


def between(repo: Path, good: str | Commit, bad: str | Commit) -> list[Commit]:
    """The commits reachable from ``bad`` and not from ``good`` that descend from ``good``,
    oldest first; ``bad`` is the last. :class:`GoldenError` when ``good`` is not an ancestor
    of ``bad``."""
    good_c = good if isinstance(good, Commit) else resolve(repo, good)
    bad_c = bad if isinstance(bad, Commit) else resolve(repo, bad)
    if good_c.sha == bad_c.sha:
        raise GoldenError(f"good and bad are the same commit ({good_c.short}); nothing to search")
    if _run(repo, "merge-base", "--is-ancestor", good_c.sha, bad_c.sha).returncode != 0:
        raise GoldenError(
            f"{good_c.short} ({good_c.subject}) is not an ancestor of {bad_c.short} "
            f"({bad_c.subject}); give --good an older commit of the same history"
        )
    out = git(
        repo,
        "log",
        "--reverse",
        "--ancestry-path",
        "--format=%H%x00%s",
        f"{good_c.sha}..{bad_c.sha}",
        "--",
    )
    return [Commit(*line.split("\0", 1)) for line in out.splitlines() if line]


def head(repo: Path) -> str | None:
    """The commit checked out in ``repo`` (``None``: not a git checkout, or no git)."""
    try:
        return git(repo, "rev-parse", "--verify", "-q", "HEAD").strip() or None
    except GoldenError:
        return None
