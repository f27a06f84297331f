"""Results of commits already tried, so that a second search over a range is instant.

One JSON file per key under ``$XDG_CACHE_HOME/pytest-rollout-golden/commits/`` (else
``~/.cache/...``). The key holds everything a result depends on: the commit, the goldens'
content, the pytest arguments, the folders, the plugin's version, the Python executable,
the update and any-failure flags and the extra import folders. A damaged entry is ignored
with a note, never fatal; a timed-out run is not stored (a longer timeout may finish it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ... import __version__
from ...store.files import atomic_write
from .git import Commit
from .runs import CommitRun, RunSpec

FORMAT = "pytest-rollout-golden-commit-run"


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/pytest-rollout-golden/commits`` (``~/.cache`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-rollout-golden" / "commits"


def key(spec: RunSpec, commit: Commit, goldens_digest: str) -> str:
    """The cache key of running ``spec`` at ``commit`` on goldens of ``goldens_digest``."""
    parts = {
        "commit": commit.sha,
        "goldens": goldens_digest,
        "pytest_args": list(spec.pytest_args),
        "cwd": spec.cwd_rel,
        "golden_root": spec.golden_rel,
        "plugin": __version__,
        "python": spec.python,
        "update": spec.update,
        "any_failure": spec.any_failure,
        "pythonpath": list(spec.pythonpath),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stderr(note: str) -> None:
    print(note, file=sys.stderr)


class Cache:
    """The results under ``directory`` (default :func:`default_dir`); ``note`` receives what
    is said of a damaged entry."""

    def __init__(self, directory: Path | None = None, *, note: Callable[[str], None] = _stderr):
        self.directory = directory or default_dir()
        self.note = note

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> CommitRun | None:
        """The stored result (``cached`` set), or ``None``: none, or a damaged one."""
        path = self.path(key)
        try:
            document = json.loads(path.read_bytes())
            if document.get("format") != FORMAT or document.get("key") != key:
                raise ValueError("not an entry of this cache, or of another key")
            run = CommitRun.from_json(document["run"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self.note(f"note: ignored a damaged cache entry {path} ({exc}); the commit is run")
            return None
        run.cached = True
        return run

    def put(self, key: str, run: CommitRun) -> None:
        """Store ``run`` (not a timed-out one); a cache that cannot be written is a note."""
        if run.timed_out:
            return
        document = {"format": FORMAT, "version": 1, "key": key, "run": run.to_json()}
        data = json.dumps(document, indent=1, allow_nan=False, default=str).encode()
        try:
            atomic_write(self.path(key), [data])
        except OSError as exc:
            self.note(f"note: could not store a result in {self.directory} ({exc})")
