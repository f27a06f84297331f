"""A tiny git project whose test gates a pure-python metric with the ``golden`` fixture.

``TinyRepo(path)`` makes the repository with ``calc.py`` (the code under test),
``test_calc.py`` (``pg_loss`` at 3 steps through ``golden.check``) and a ``pytest.ini``;
``record()`` runs pytest once to record ``golden/`` and commits it. ``commit()`` changes
files and commits; ``bug()`` commits a relative error of 1e-3 in ``calc.py``. The loss sleeps
``TINY_SLEEP`` seconds, and first leaves a file named by its pid in the folder ``TINY_PIDS``.
"""

from __future__ import annotations

from pathlib import Path

from history import git, run_pytest

CALC = """
import os
import time

SCALE = {scale!r}


def loss(step):
    if os.environ.get("TINY_PIDS"):  # a folder: say which process computes, before sleeping
        open(os.path.join(os.environ["TINY_PIDS"], str(os.getpid())), "w").close()
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
        done = run_pytest(self.path)
        assert done.returncode == 0, done.stdout + done.stderr
        git(self.path, "add", "golden")
        git(self.path, "commit", "-q", "-m", "record goldens")
        self.shas.append(git(self.path, "rev-parse", "HEAD"))
        return self.shas[-1]

    def bug(self, message: str = "scale the loss by 1.001") -> str:
        """Commit a relative error of 1e-3 in the loss."""
        return self.commit(message, {"calc.py": CALC.format(scale=1.001)})
