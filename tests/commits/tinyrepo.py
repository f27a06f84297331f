"""A tiny git project whose test gates a pure-python metric with the ``golden`` fixture.

``TinyRepo(path)`` makes the repository with ``calc.py`` (the code under test),
``test_calc.py`` (``pg_loss`` at 3 steps through ``golden.check``) and a ``pytest.ini``;
``record()`` runs pytest once to record ``golden/`` and commits it. ``commit()`` changes
files and commits; ``bug()`` commits a relative error of 1e-3 in ``calc.py``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

CALC = """
import os
import time

SCALE = {scale!r}


def loss(step):
    time.sleep(float(os.environ.get("TINY_SLEEP", "0")))
    return (0.5 + 0.125 * step) * SCALE
"""

TEST = """
import calc


def test_loss(golden):
    for step in range(3):
        golden.check({"pg_loss": calc.loss(step)}, step=step)
"""

INI = "[pytest]\ngolden_dir = golden\n"


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",  # the same hashes on every run
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


class TinyRepo:
    """The project's repository at ``path``; ``shas``: its commits, oldest first."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        git(path, "init", "-q", "-b", "main")
        self.shas: list[str] = []
        self.commit(
            "calc and its golden test",
            {"calc.py": CALC.format(scale=1.0), "test_calc.py": TEST, "pytest.ini": INI},
        )

    def commit(self, message: str, files: dict[str, str], remove: tuple[str, ...] = ()) -> str:
        """Write ``files`` (relative path -> text), delete ``remove`` and commit; returns the
        hash."""
        for rel in remove:
            (self.path / rel).unlink()
        for rel, text in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", message)
        self.shas.append(git(self.path, "rev-parse", "HEAD"))
        return self.shas[-1]

    def record(self) -> str:
        """Record the goldens with pytest and commit them."""
        done = pytest_in(self.path)
        assert done.returncode == 0, done.stdout + done.stderr
        git(self.path, "add", "golden")
        git(self.path, "commit", "-q", "-m", "record goldens")
        self.shas.append(git(self.path, "rev-parse", "HEAD"))
        return self.shas[-1]

    def bug(self, message: str = "scale the loss by 1.001") -> str:
        """Commit a relative error of 1e-3 in the loss."""
        return self.commit(message, {"calc.py": CALC.format(scale=1.001)})


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in ``folder`` as a developer runs it: without the ``CI`` of this suite's
    machine, which would make the plugin refuse to record."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env={k: v for k, v in os.environ.items() if k != "CI"},
        capture_output=True,
        text=True,
        check=False,
    )


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder`` (``.git`` included) -> a hash of its content,
    mode and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            what = f"{info.st_mode}:{info.st_mtime_ns}:{info.st_size}"
            if path.is_symlink():
                what += ":" + os.readlink(path)
            elif path.is_file():
                what += ":" + hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path.relative_to(folder))] = what
    return out
