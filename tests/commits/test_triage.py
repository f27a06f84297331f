"""``rollout-golden compare A B --python-a OLD --python-b NEW``: which tests a dependency
upgrade breaks, by replaying each side in its own environment on the committed goldens
(the environments: :mod:`upgrade`)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from history import tree_digest
from upgrade import build

from pytest_rollout_golden._internal.commits.runs import CommitRun
from pytest_rollout_golden._internal.commits.triage import outcomes
from pytest_rollout_golden.cli import main


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    """The project and its environments (:func:`upgrade.build`)."""
    return build(tmp_path_factory.mktemp("triage"))


def triage(repo, envs, a: str, b: str, *more: str) -> int:
    return main(["compare", "HEAD", "HEAD", "--python-a", envs[a], "--python-b", envs[b], *more])


def test_an_upgrade_that_moves_a_metric_names_its_first_step_and_metric(
    upgrade, monkeypatch, capsys, tmp_path
):
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = tree_digest(repo.path)
    assert triage(repo, envs, "old", "new", "--jobs", "2", "--", "-q") == 1
    out = capsys.readouterr().out
    head = repo.shas[-1][:10]
    assert f"A: {head} two more tests; {envs['old']} (Python " in out
    assert f"B: {head} two more tests; {envs['new']} (Python " in out
    assert "environment A -> B: 1 package differs: tinylib 1.0 -> 1.1; torch " in out
    sections = out.split("\n\n")
    regressed = next(s for s in sections if s.startswith("before passes, after fails"))
    assert regressed.splitlines()[0] == "before passes, after fails: 1 test"
    (row,) = [line.split() for line in regressed.splitlines()[2:]]
    assert row[:5] == ["test_calc.py::test_loss", "passed", "failed", "0", "pg_loss"]
    assert row[6] == "tolerance" and float(row[5].rstrip("x")) > 1
    assert "expected 0.5, actual 0.5005" in regressed
    assert "fails in both: 1 test" in out and "test_calc.py::test_always_broken" in out
    assert "broken whatever the environment" in out
    assert "fixed by the upgrade: 1 test" in out and "tinylib has no new_api" in out
    assert out.rstrip().endswith(
        "4 tests: 1 before passes, after fails, 1 fails in both, 1 fixed by the upgrade, "
        "1 pass in both"
    )
    assert tree_digest(repo.path) == before
    assert list((tmp_path / f"rollout-golden-commits-{os.getuid()}").iterdir()) == []


def test_the_json_holds_every_test_its_class_and_the_first_divergence(upgrade, monkeypatch, capsys):
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    assert triage(repo, envs, "old", "new", "--json") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["format"] == "pytest-rollout-golden-triage" and document["ok"] is False
    assert document["environment"]["changed"] == {"tinylib": ["1.0", "1.1"]}
    assert document["summary"] == {
        "before passes, after fails": 1,
        "fails in both": 1,
        "fixed by the upgrade": 1,
        "passes in both": 1,
    }
    tests = {t["test"].split("::")[1]: t for t in document["tests"]}
    assert tests["test_grad_norm"]["class"] == "passes in both"
    first = tests["test_loss"]["first"]
    assert (first["step"], first["metric"]) == (0, "pg_loss")
    assert first["golden"] == "test_calc/test_loss"
    assert first["abs_diff"] == pytest.approx(5e-4)
    assert first["excess"] > 1  # beyond its tolerance: what failed the gate


def test_the_same_environment_twice_regresses_nothing(upgrade, monkeypatch, capsys):
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    assert triage(repo, envs, "old", "same") == 0
    out = capsys.readouterr().out
    assert "environment A -> B: no package differs: torch " in out
    assert "before passes, after fails:" not in out
    assert "0 before passes, after fails, 2 fails in both, 0 fixed by the upgrade, 2 pass" in out


def test_a_failure_without_a_divergence_shows_its_message(upgrade, monkeypatch, capsys):
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    assert triage(repo, envs, "old", "broken", "--json") == 1
    tests = {t["test"].split("::")[1]: t for t in json.loads(capsys.readouterr().out)["tests"]}
    assert tests["test_loss"]["class"] == "before passes, after fails"
    assert tests["test_loss"]["first"] is None
    assert "has no attribute 'scale'" in tests["test_loss"]["message"]


def test_the_same_commit_in_the_same_python_is_refused(upgrade, monkeypatch, capsys):
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    assert triage(repo, envs, "old", "old") == 2
    err = capsys.readouterr().err
    assert f"A and B are the same commit ({repo.shas[-1][:10]}) in the same Python" in err
    assert "Give --python-b the upgraded environment's python" in err


def test_an_option_of_the_diff_is_refused_not_ignored(upgrade, monkeypatch, capsys):
    """A ``--tolerance`` the replay would not read must not seem to loosen the gate."""
    repo, envs = upgrade
    monkeypatch.chdir(repo.path)
    assert triage(repo, envs, "old", "new", "--tolerance", "pg_loss:rtol=0.1", "--exact") == 2
    err = capsys.readouterr().err
    assert "--tolerance, --exact: options of the diff of re-recorded values" in err


def test_a_python_that_is_no_interpreter_is_an_error_naming_the_option(
    upgrade, monkeypatch, capsys, tmp_path
):
    repo, _ = upgrade
    monkeypatch.chdir(repo.path)
    missing = str(tmp_path / "nosuch" / "python")
    assert main(["compare", "HEAD", "HEAD", "--python-b", missing]) == 2
    assert f"--python-b {missing}: could not ask it what it has installed" in (
        capsys.readouterr().err
    )


def _run(*lines: dict) -> CommitRun:
    return CommitRun(commit=None, outcome="good", exit_code=1, seconds=0.0, outcomes=list(lines))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ([("setup", "passed"), ("call", "passed"), ("teardown", "passed")], "passed"),
        ([("setup", "failed"), ("teardown", "passed")], "error"),
        ([("setup", "passed"), ("call", "passed"), ("teardown", "failed")], "error"),
        ([("setup", "passed"), ("call", "failed"), ("teardown", "passed")], "failed"),
        ([("setup", "skipped"), ("teardown", "passed")], "skipped"),
        ([("setup", "passed"), ("call", "skipped", True), ("teardown", "passed")], "xfail"),
        ([("setup", "passed"), ("call", "passed", True), ("teardown", "passed")], "xpass"),
        ([("collect", "failed")], "error"),
        ([("collect", "passed")], "collected"),
    ],
)
def test_a_tests_outcome_is_what_its_reports_make_it(reports, expected):
    lines = [
        {"node": "t.py::x", "when": r[0], "outcome": r[1], "xfail": r[2:] == (True,)}
        for r in reports
    ]
    assert outcomes(_run(*lines))["t.py::x"][0] == expected
