"""Recording where the golden directory cannot be written: a clear error, never a raw OSError.

Sessions may run as root, where chmod cannot make a directory read-only, so the inner
project's conftest makes every write under its golden root fail as a read-only (or
otherwise unwritable) filesystem would.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.errors import GoldenError

TRAIN = """
import torch


def test_train(golden):
    batch = golden.rollout(lambda: {"x": torch.linspace(0, 1, 8)})
    golden.check({"pg_loss": float(batch["x"].sum())})
"""

READ_ONLY = """
import errno
import os
import pathlib

import pytest

ROOT = os.path.realpath(pathlib.Path(__file__).parent / "{root}")


def _under_root(path):
    try:
        return os.path.realpath(os.fspath(path)).startswith(ROOT)
    except TypeError:  # a descriptor
        return False


@pytest.fixture(autouse=True)
def unwritable_golden_root(monkeypatch):
    real = {{name: getattr(os, name) for name in ("mkdir", "open", "rename", "replace", "link")}}

    def refuse(name):
        def call(*args, **kwargs):
            writes = name != "open" or args[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            paths = [a for a in args[:2] if isinstance(a, (str, os.PathLike))]
            if writes and any(_under_root(a) for a in paths):
                raise OSError(errno.{errno_name}, os.strerror(errno.{errno_name}), str(args[0]))
            return real[name](*args, **kwargs)

        return call

    for name in real:
        monkeypatch.setattr(os, name, refuse(name))
"""


def make_unwritable(project, errno_name: str = "EROFS", root: str = "golden") -> None:
    """Every write under the project's ``root`` fails with ``errno_name`` from now on."""
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + READ_ONLY.format(root=root, errno_name=errno_name))


def assert_clear(out: str, directory: str) -> None:
    assert "OSError" not in out and "PermissionError" not in out, out
    assert "Traceback" not in out and "contextlib" not in out, out  # only the test's frames
    assert directory in out, out
    assert "not writable" in out, out
    assert "golden_dir" in out, out
    assert "without --update-golden" in out, out


@pytest.mark.parametrize("errno_name", ["EROFS", "EACCES"])
def test_update_on_a_read_only_checkout_names_the_directory_and_the_remedy(project, errno_name):
    project.write(TRAIN)
    project.run().assert_outcomes(passed=1)
    recorded = project.golden_files()
    make_unwritable(project, errno_name)
    project.run().assert_outcomes(passed=1)  # replay only reads
    result = project.run("--update-golden")
    result.assert_outcomes(failed=1)
    assert_clear(result.stdout.str(), str(project.path / "golden"))
    assert project.golden_files() == recorded


def test_recording_a_new_golden_under_a_read_only_root(project):
    project.write(TRAIN)
    make_unwritable(project)
    result = project.run()
    assert result.ret != 0
    assert_clear(result.stdout.str(), str(project.path / "golden"))


def test_a_golden_root_that_cannot_be_created(project):
    """golden_dir under a regular file: the root cannot be created."""
    (project.path / "not-a-dir").write_text("")
    project.pytester.makeini("[pytest]\ngolden_dir = not-a-dir/golden\n")
    project.write(TRAIN)
    result = project.run()
    assert result.ret != 0
    out = result.stdout.str()
    assert "NotADirectoryError" not in out and "contextlib" not in out, out
    assert "cannot be created" in out, out
    assert str(project.path / "not-a-dir" / "golden") in out, out
    assert "golden_dir" in out, out


def test_a_golden_directory_that_cannot_be_written_keeps_the_recorded_version(
    tmp_path, monkeypatch
):
    """The parent is writable (staging works) but the golden itself is not: moving the new
    files into it fails before any is replaced, so the update is dropped whole."""
    directory = tmp_path / "golden" / "test_x" / "test_y"

    def run(mode: Mode, value: float) -> None:
        with Golden(directory, mode=mode) as golden:
            golden.rollout(lambda: {"ids": torch.arange(4)})
            golden.check({"pg_loss": value})

    run(Mode.AUTO, 0.5)
    recorded = {p.name: p.read_bytes() for p in directory.iterdir()}
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).parent.resolve() == directory.resolve():
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(GoldenError) as exc:
        run(Mode.UPDATE, 0.75)
    message = str(exc.value)
    assert str(directory) in message and "not writable" in message, message
    assert "golden_dir" in message, message
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == recorded
    assert sorted(p.name for p in directory.parent.iterdir()) == ["test_y"]
