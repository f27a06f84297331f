"""A golden whose manifest.json was deleted is never recorded over silently: the run fails
naming the directory, what is there and the remedies; `verify` reports it."""

from __future__ import annotations

import pytest

from pytest_rollout_golden.cli import main

GATE = """
import torch


def test_train(golden, values):
    batch = golden.rollout(lambda: {"ids": torch.arange(6) + values.get("shift", 0)})
    golden.check({"pg_loss": float(batch["ids"].sum()) / 10})
"""


@pytest.fixture
def orphaned(project):
    project.write(GATE)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    directory = project.golden_dir("test_train")
    (directory / "manifest.json").unlink()
    return project, directory


@pytest.mark.parametrize("args", [(), ("--golden-strict",)])
def test_a_plain_or_strict_run_fails_naming_what_is_there_and_records_nothing(orphaned, args):
    project, _ = orphaned
    before = project.golden_files()
    project.set_values(shift=1)  # a different rollout must not be recorded over the old one
    result = project.run(*args)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "holds golden files (metrics.json, rollout-rollout-step000000.safetensors) " in out
    assert "but no manifest.json" in out
    assert "restore manifest.json from version control" in out and "--update-golden" in out
    assert project.golden_files() == before


def test_update_golden_re_records_it_deliberately(orphaned):
    project, directory = orphaned
    project.run("--update-golden").assert_outcomes(passed=1)
    assert (directory / "manifest.json").is_file()
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_verify_reports_it_as_damaged(orphaned, capsys):
    project, directory = orphaned
    assert main(["verify", str(project.golden)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {directory}: holds golden files" in out and "no manifest.json" in out
