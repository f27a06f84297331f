"""Results of commits already tried, so that a second search over a range is instant.

One JSON file per key under ``$XDG_CACHE_HOME/pytest-rollout-golden/commits/`` (else
``~/.cache/...``). The key holds everything a result depends on: the commit, the goldens'
content, the pytest arguments, the folders, the Python executable, the update and
any-failure flags and the extra import folders, and the run's :func:`context`: the
environment variables that change a run (``PYTEST_ADDOPTS``, ``CI``, ``ROLLOUT_GOLDEN_LANE``,
...), the plugin's version and source, and the packages installed for that Python. A damaged
entry is ignored with a note, never fatal; a timed-out run is not stored (a longer timeout
may finish it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...store.disk import atomic_write
from ..version import VERSION
from .environments import installed
from .git import Commit
from .runs import CommitRun, RunSpec

FORMAT = "pytest-rollout-golden-commit-run"


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/pytest-rollout-golden/commits`` (``~/.cache`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-rollout-golden" / "commits"


# What a run's pytest reads from the environment: its options, CI (strict mode), the plugin's
# settings (the lane), and the numerics' threads, seeds and devices.
_PREFIXES = ("PYTEST_", "ROLLOUT_GOLDEN_", "TORCH_", "CUBLAS_", "CUDA_", "NVTE_", "NCCL_")
_NAMES = {"CI", "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
_CALLER = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_")  # name whoever started the command


def context(spec: RunSpec) -> dict[str, Any]:
    """What a run depends on besides its commit, goldens and :class:`RunSpec`, the same for
    every commit of one command: the environment variables a run reads, the plugin's version
    and a digest of its source, and a digest of the packages installed for ``spec.python``."""
    environment = {
        name: value
        for name, value in sorted(os.environ.items())
        if (name in _NAMES or name.startswith(_PREFIXES)) and not name.startswith(_CALLER)
    }
    return {
        "environment": environment,
        "plugin": {"version": VERSION, "source": _source_digest()},
        "packages": _packages_digest(spec.python),
    }


def _source_digest() -> str:
    """sha256 of this plugin's Python source (an editable install changes without a version)."""
    package = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _packages_digest(python: str) -> str:
    """sha256 of the ``name==version`` of every package installed for ``python``, with their
    count; what went wrong instead, when it cannot say (no result is then reused)."""
    try:
        names = installed(python).packages
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__}, {os.urandom(8).hex()})"
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return f"{digest} ({len(names)} packages)"


def key_parts(spec: RunSpec, goldens_digest: str, run_context: dict[str, Any]) -> dict[str, Any]:
    """What the cache key of running ``spec`` on goldens of ``goldens_digest`` in
    ``run_context`` (:func:`context`) holds at every commit (``bisect --json``'s
    ``cache_key``)."""
    return {
        "goldens": goldens_digest,
        "pytest_args": list(spec.pytest_args),
        "cwd": spec.cwd_rel,
        "golden_root": spec.golden_rel,
        "python": spec.python,
        "update": spec.update,
        "any_failure": spec.any_failure,
        "pythonpath": list(spec.pythonpath),
        **run_context,
    }


def key(parts: dict[str, Any], commit: Commit) -> str:
    """The cache key of ``commit``'s run with :func:`key_parts` ``parts``."""
    document = {**parts, "commit": commit.sha}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


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
