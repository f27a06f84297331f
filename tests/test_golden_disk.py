"""Goldens on disk under concurrency and foreign checkouts: recovery, locks, line endings, case.

Each test reproduces a way a golden was lost or wrongly written (issue 9, items 5-9).
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_rollout_golden import store


def _staged(directory: Path, pid: int) -> Path:
    staging = directory.parent / f".{directory.name}.new-{pid}"
    staging.mkdir(parents=True)
    (staging / "batch.safetensors").write_bytes(b"in progress")
    return staging


def test_recovery_of_one_golden_leaves_a_prefixed_goldens_staging_alone(tmp_path):
    """Recovering ``layout`` must not touch ``.layout.old-ref.new-PID`` (golden ``layout.old-ref``)."""
    layout = tmp_path / "test_x" / "layout"
    other = tmp_path / "test_x" / "layout.old-ref"
    in_progress = _staged(other, os.getpid() + 1)
    # ``layout`` does not exist: a prefix match took the staging directory for its backup
    store.recover(layout)
    assert in_progress.is_dir() and (in_progress / "batch.safetensors").is_file()
    assert not layout.exists()
    layout.mkdir()
    store.recover(layout)
    assert in_progress.is_dir(), "recovery of `layout` deleted the staging of `layout.old-ref`"


def test_recovery_still_finishes_and_cleans_its_own_leftovers(tmp_path):
    layout = tmp_path / "test_x" / "layout"
    backup = layout.parent / f".layout.old-{os.getpid() + 1}"
    backup.mkdir(parents=True)
    (backup / "manifest.json").write_text("{}")
    staging = _staged(layout, os.getpid() + 2)
    store.recover(layout)
    assert (layout / "manifest.json").is_file(), "the interrupted swap was not finished"
    assert not backup.exists() and not staging.exists()
