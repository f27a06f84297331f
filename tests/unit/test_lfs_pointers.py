"""A golden file that is a Git LFS pointer (a clone without `git lfs pull`) is recognised
wherever a golden is read, with the remedy that fetches it — never `--update-golden`, which
would record over the real golden."""

from __future__ import annotations

import pytest

from pytest_rollout_golden.cli import main

POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 12345\n"
)
GATE = """
import torch


def test_train(golden):
    batch = golden.rollout(lambda: {"ids": torch.arange(6)})
    golden.check({"pg_loss": float(batch["ids"].sum()) / 10})
"""


@pytest.fixture
def recorded(project):
    project.write(GATE)
    project.run().assert_outcomes(passed=1)
    return project


@pytest.mark.parametrize("filename", ["rollout-rollout-step000000.safetensors", "metrics.json"])
def test_a_pointer_in_place_of_a_golden_file_says_git_lfs_pull(recorded, filename):
    path = recorded.golden_dir("test_train") / filename
    path.write_text(POINTER)
    for args in ((), ("--update-golden",)):
        result = recorded.run(*args)
        result.assert_outcomes(failed=1)
        out = result.stdout.str()
        assert f"{filename}: is a Git LFS pointer" in out and "git lfs pull" in out, out
        assert "run `pytest --update-golden`" not in out
    assert path.read_text() == POINTER, "the pointer (the real golden's stand-in) is kept"
    assert main(["verify", str(recorded.golden)]) == 1


def test_a_pointer_in_place_of_the_manifest_says_git_lfs_pull(recorded, capsys):
    (recorded.golden_dir("test_train") / "manifest.json").write_text(POINTER)
    result = recorded.run()
    result.assert_outcomes(failed=1)
    assert "manifest.json: is a Git LFS pointer" in result.stdout.str()
    assert main(["verify", str(recorded.golden)]) == 1
    assert "git lfs pull" in capsys.readouterr().out
