"""A real git history to bisect and compare: a tiny project whose golden test replays fast.

``build_history(path, commits=32, bug_at=K)`` makes a repository at ``path``:

- commit 0 holds ``calc.py`` (pure-Python training metrics over 3 steps, no torch),
  ``test_calc.py`` (checks them with the plugin's ``golden`` fixture), ``pytest.ini`` and the
  goldens recorded at that commit;
- every later commit appends a line to ``notes.txt``, except commit ``bug_at``, which
  multiplies ``pg_loss`` from step 1 on by ``1 + 1e-3`` (a bug the default gate fails on);
- ``broken_at``: that commit also breaks ``test_calc.py`` (a syntax error, so nothing
  collects) and the next one repairs it;
- ``dirty``: the checkout is left with an uncommitted change of ``calc.py`` (a bug of its
  own) and an untracked golden, which a bisect must never use.

Commits are made with fixed names and dates, and the goldens recorded on one thread, so two
histories built alike have the same shas (on machines with the same torch and platform).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

BUG = 1e-3

CALC = '''"""Training metrics of a toy run: pure Python, so a replay takes well under a second."""

import math

SCALE = 1.0


def metrics(step):
    pg_loss = 0.5 / (step + 1) + 0.01 * math.sin(step)
    if step >= 1:
        pg_loss *= SCALE
    return {"pg_loss": pg_loss, "grad_norm": 1.0 + 0.1 * step}
'''

TEST = """from calc import metrics


def test_training(golden):
    for step in range(3):
        golden.check(metrics(step), step=step)
"""

INI = "[pytest]\ngolden_dir = golden\n"
GITIGNORE = "__pycache__/\n*.pyc\n"
ENV = {
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


@dataclasses.dataclass(frozen=True)
class History:
    """The built repository: ``shas[i]`` is commit ``i`` (``shas[0]`` the good end holding the
    goldens, ``shas[-1]`` the head), ``subjects[i]`` its subject."""

    repo: Path
    shas: tuple[str, ...]
    subjects: tuple[str, ...]
    bug_at: int | None
    broken_at: int | None

    @property
    def good(self) -> str:
        return self.shas[0]

    @property
    def bad(self) -> str:
        return self.shas[-1]


def git(repo: Path, *args: str, when: int = 0) -> str:
    """Run ``git args`` in ``repo`` with a fixed identity and date; its stdout, stripped."""
    date = f"{1_700_000_000 + when * 60} +0000"
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def run_pytest(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest args`` in ``cwd``, in a fresh interpreter (``env``: more variables),
    as a developer runs it: without the ``CI`` of this suite's machine, which would make the
    plugin refuse to record."""
    here = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**here, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def _commit(repo: Path, index: int, subject: str) -> str:
    git(repo, "add", "-A", ".", when=index)
    git(repo, "commit", "-q", "--no-verify", "-m", subject, when=index)
    return git(repo, "rev-parse", "HEAD")


def _first_commit(repo: Path) -> str:
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    (repo / "pytest.ini").write_text(INI)
    (repo / ".gitignore").write_text(GITIGNORE)
    # one thread: the manifest's fingerprint, hence every sha, is the same on any CPU machine
    recorded = run_pytest(repo, "-p", "no:hypothesispytest", OMP_NUM_THREADS="1")
    if recorded.returncode or not (repo / "golden").is_dir():
        raise RuntimeError(f"recording the goldens failed:\n{recorded.stdout}{recorded.stderr}")
    return _commit(repo, 0, "Toy run with its goldens")


def _change(repo: Path, index: int, bug_at: int | None, broken_at: int | None) -> str:
    """Make commit ``index``'s change in the working tree; its subject."""
    subject = f"Note {index}"
    with open(repo / "notes.txt", "a") as notes:
        notes.write(f"note {index}\n")
    if index == bug_at:
        calc = repo / "calc.py"
        calc.write_text(calc.read_text().replace("SCALE = 1.0", f"SCALE = 1.0 + {BUG}"))
        subject = "Scale the loss after the first step"
    if index == broken_at:
        (repo / "test_calc.py").write_text(TEST + "\ndef broken(:\n")
        subject = "Half-written test helper"
    elif broken_at is not None and index == broken_at + 1:
        (repo / "test_calc.py").write_text(TEST)
        subject = "Repair the test module"
    return subject


def build_history(
    repo: Path,
    *,
    commits: int = 32,
    bug_at: int | None = None,
    broken_at: int | None = None,
    dirty: bool = False,
) -> History:
    """A repository of ``commits`` commits at ``repo`` (created); see the module docstring."""
    if bug_at is not None and not 1 <= bug_at < commits:
        raise ValueError(f"bug_at must be a commit after the first, below {commits}")
    if broken_at is not None and not 1 <= broken_at < commits - 1:
        raise ValueError(f"broken_at must leave a commit after it to repair it, below {commits}")
    repo.mkdir(parents=True, exist_ok=True)
    shas, subjects = [_first_commit(repo)], ["Toy run with its goldens"]
    for index in range(1, commits):
        subjects.append(_change(repo, index, bug_at, broken_at))
        shas.append(_commit(repo, index, subjects[-1]))
    if dirty:
        calc = repo / "calc.py"
        calc.write_text(calc.read_text().replace("SCALE = ", "SCALE = 2 * "))
        (repo / "golden" / "untracked").mkdir()
        (repo / "golden" / "untracked" / "note.txt").write_text("not committed\n")
    return History(repo, tuple(shas), tuple(subjects), bug_at, broken_at)


def tree_digest(path: Path) -> dict[str, str]:
    """Every file and link under ``path`` (``.git`` included): relative path -> content hash
    (links by target), with each directory's mode, to prove a tree was not touched."""
    import hashlib

    seen: dict[str, str] = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(dirs + files):
            full = Path(root, name)
            rel = str(full.relative_to(path))
            if full.is_symlink():
                seen[rel] = "link:" + os.readlink(full)
            elif full.is_dir():
                seen[rel] = f"dir:{full.stat().st_mode:o}:{full.stat().st_mtime_ns}"
            else:
                stat = full.stat()
                digest = hashlib.sha256(full.read_bytes()).hexdigest()
                seen[rel] = f"{digest}:{stat.st_mode:o}:{stat.st_mtime_ns}"
    return seen
