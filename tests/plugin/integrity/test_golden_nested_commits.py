"""Commits of nested goldens (``.../test_attention`` and ``.../test_attention/test_forward``)
at the same time, by two workers holding different locks (issue 16, item 11).

A commit must never move, rename or delete anything of a golden nested in its own: the
inner golden's files, its staging directory and its lock file all live inside the outer
golden's directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pytest_rollout_golden import store
from pytest_rollout_golden._internal.golden.golden_files import GoldenFiles
from pytest_rollout_golden.errors import GoldenFormatError
from pytest_rollout_golden.store.location import MANIFEST


def _open_and_stage(directory: Path, version: int) -> GoldenFiles:
    files = GoldenFiles(directory)
    files.open()
    files._transaction().write_json("data.json", {"version": version}, kind="data")
    return files


def _commit(files: GoldenFiles, version: int) -> None:
    files.commit({"test": "t", "version": version}, metrics={}, keep=lambda f: True)
    files.close()


def _version(directory: Path) -> int:
    """The golden's version, every file checked against its manifest."""
    manifest = store.read_manifest(directory)
    assert manifest is not None, f"{directory} is no golden any more"
    data = store.read_json(
        directory / "data.json", expect_digest=manifest["files"]["data.json"]["digest"]
    )
    assert data == {"version": manifest["version"]}
    return manifest["version"]


@pytest.mark.parametrize("whole", [False, True], ids=["staged-before", "opened-during"])
@pytest.mark.parametrize("at", range(6))
@pytest.mark.parametrize("interrupted", ["outer", "inner"])
def test_a_nested_golden_commits_in_the_middle_of_its_outer_goldens_commit(
    tmp_path, monkeypatch, interrupted, at, whole
):
    """The other golden commits (opened before, or opened, staged and committed whole) at
    the ``at``-th rename of this golden's commit: both end up holding what they committed."""
    outer = tmp_path / "golden" / "test_model" / "test_attention"
    inner = outer / "test_forward"
    for directory in (outer, inner):
        _commit(_open_and_stage(directory, 1), 1)
    (outer / "NOTES.txt").write_text("mine")

    first, other = (outer, inner) if interrupted == "outer" else (inner, outer)
    committing = _open_and_stage(first, 2)
    other_files = None if whole else _open_and_stage(other, 3)
    renames = {"count": 0, "fired": False}
    real = {"rename": os.rename, "replace": os.replace}

    def commit_other() -> None:
        renames["fired"] = True
        for name, function in real.items():
            monkeypatch.setattr(os, name, function)
        _commit(other_files or _open_and_stage(other, 3), 3)

    def hooked(name):
        def rename(src, dst, *args, **kwargs):
            real[name](src, dst, *args, **kwargs)
            renames["count"] += 1
            if renames["count"] == at + 1 and not renames["fired"]:
                commit_other()

        return rename

    for name in real:
        monkeypatch.setattr(os, name, hooked(name))
    try:
        _commit(committing, 2)
    finally:
        for name, function in real.items():
            monkeypatch.setattr(os, name, function)
    if not renames["fired"]:
        commit_other()

    assert _version(first) == 2
    assert _version(other) == 3
    assert (outer / "NOTES.txt").read_text() == "mine"
    hidden = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob(".*")]
    assert hidden == [], "staging, backup or lock left behind"


SLOW_RENAMES = """

import os as _os
import time as _time

if _os.environ.get("SLOW_RENAMES"):
    def _slowed(real):
        def slow(*args, **kwargs):
            _time.sleep(float(_os.environ["SLOW_RENAMES"]))
            return real(*args, **kwargs)
        return slow

    _os.rename, _os.replace = _slowed(_os.rename), _slowed(_os.replace)


def meet(name, other, timeout=60):
    '''Say ``name`` is ready, then wait until ``other`` is: both tests end together.'''
    (HERE / f"{name}.ready").touch()
    deadline = _time.monotonic() + timeout
    while not (HERE / f"{other}.ready").exists() and _time.monotonic() < deadline:
        _time.sleep(0.01)
"""

OUTER = """
from conftest import meet


def test_attention(golden, values):
    for step in range(3):
        golden.check({"loss": values.get("v", 1.0) + step, "outer": 1.0}, step=step)
    meet("outer", "inner")
"""

INNER = """
from conftest import meet


def test_forward(golden, values):
    for step in range(3):
        golden.check({"loss": 2 * values.get("v", 1.0) + step, "inner": 1.0}, step=step)
    meet("inner", "outer")
"""


def _metrics(directory: Path) -> dict:
    manifest = store.read_manifest(directory)
    assert manifest is not None
    digest = manifest["files"]["metrics.json"]["digest"]
    return store.read_json(directory / "metrics.json", expect_digest=digest)["steps"]


def test_two_xdist_workers_update_nested_goldens_with_slow_renames(project, monkeypatch):
    pytest.importorskip("xdist")
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + SLOW_RENAMES)
    project.write(OUTER, "test_model")
    (project.path / "test_model").mkdir()
    (project.path / "test_model" / "test_attention.py").write_text(INNER)
    project.run_subprocess().assert_outcomes(passed=2)
    outer = project.golden / "test_model" / "test_attention"
    inner = outer / "test_forward"
    assert _metrics(inner)["0"]["loss"] == 2.0 and _metrics(outer)["0"]["loss"] == 1.0

    for trial, value in enumerate((5.0,)):
        for ready in project.path.glob("*.ready"):
            ready.unlink()
        project.set_values(v=value)
        monkeypatch.setenv("SLOW_RENAMES", "0.05")
        start = time.monotonic()
        result = project.run_subprocess("-n", "2", "--update-golden")
        monkeypatch.delenv("SLOW_RENAMES")
        output = result.stdout.str() + result.stderr.str()
        assert "Error" not in output, f"trial {trial}:\n{output}"
        result.assert_outcomes(passed=2)
        assert project.counts(result)["updated"] == 2
        assert [_metrics(outer)[str(s)]["loss"] for s in range(3)] == [
            value + s for s in range(3)
        ], f"trial {trial}: the outer golden does not hold what was reported"
        assert [_metrics(inner)[str(s)]["loss"] for s in range(3)] == [
            2 * value + s for s in range(3)
        ], f"trial {trial}: the inner golden does not hold what was reported"
        assert not list(project.golden.rglob(".*")), "staging, backup or lock left behind"
        assert time.monotonic() - start < 120


def test_a_manifest_never_owns_a_hidden_name(tmp_path):
    """A lock file or a staging directory of a nested golden is never a golden's file."""
    outer = tmp_path / "golden" / "test_attention"
    _commit(_open_and_stage(outer, 1), 1)
    (outer / ".test_forward.lock").write_text("pid 1")
    manifest = json.loads((outer / "manifest.json").read_text())
    manifest["files"][".test_forward.lock"] = {"digest": "0" * 32}
    (outer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GoldenFormatError, match=r"'\.test_forward\.lock': not a plain file name"):
        store.read_manifest(outer)
    assert ".test_forward.lock" not in (store.listed_files(outer) or set())


def test_a_commit_makes_its_directory_again_if_a_nested_lock_removed_it(tmp_path, monkeypatch):
    """An outer golden recorded for the first time: the inner golden's lock, released,
    removes the empty folder it created while the outer commit moves its first file in."""
    outer = tmp_path / "golden" / "test_attention"
    files = _open_and_stage(outer, 1)
    real_replace = os.replace
    removed = []

    def racing(src, dst):
        if Path(dst).parent == outer and not removed:
            outer.rmdir()  # what the inner lock's release does to an empty folder it made
            removed.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", racing)
    _commit(files, 1)
    monkeypatch.setattr(os, "replace", real_replace)
    assert removed and _version(outer) == 1


def test_updated_is_reported_only_for_a_commit_that_finished(tmp_path, monkeypatch):
    """A commit whose files could not all be moved in is an error naming what happens
    next, never 'updated'; the next open finishes it."""
    from pytest_rollout_golden._internal.golden.golden import Golden
    from pytest_rollout_golden._internal.results import Mode, Status
    from pytest_rollout_golden.errors import GoldenError

    directory = tmp_path / "golden" / "test_attention"
    with Golden(directory, test_id="t") as golden:
        golden.check({"loss": 1.0})
    real_replace = os.replace

    def failing(src, dst):
        if Path(dst) == directory / "metrics.json":
            raise FileNotFoundError(2, "simulated slow filesystem", str(dst))
        return real_replace(src, dst)

    golden = Golden(directory, mode=Mode.UPDATE, test_id="t")
    golden.check({"loss": 2.0})
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(GoldenError, match="finishes the update"):
        golden.finish()
    monkeypatch.setattr(os, "replace", real_replace)
    assert golden.outcome.status is not Status.UPDATED
    with Golden(directory, mode=Mode.STRICT, test_id="t") as golden:
        golden.check({"loss": 2.0})
    assert golden.outcome.status is Status.REPLAYED


def test_a_no_op_update_after_a_regeneration_leaves_the_manifest_as_it_was(project):
    """The file table is written in name order, whatever order this run staged or kept the
    files in: an update that changed nothing changes no byte of manifest.json."""
    project.write(
        "import torch\n\n"
        "def test_it(golden):\n"
        "    for step in range(2):\n"
        "        batch = golden.rollout(lambda: {'x': torch.arange(4.0)}, step=step)\n"
        "        golden.check({'loss': float(batch['x'].sum())}, step=step)\n"
        "        golden.check_tensors('fwd', {'y': batch['x'] * 2}, step=step)\n"
    )
    project.run().assert_outcomes(passed=1)
    project.run("--golden-regenerate").assert_outcomes(passed=1)
    manifest = next(project.golden.rglob(MANIFEST))
    before = manifest.read_bytes()
    project.run("--update-golden").assert_outcomes(passed=1)
    assert manifest.read_bytes() == before
