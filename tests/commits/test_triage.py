"""``rollout-golden compare A B --python-a OLD --python-b NEW``: which tests a dependency
upgrade breaks, by replaying each side in its own environment on the committed goldens.

The environments are cheap stand-ins for two virtual environments: a script acting as
``python`` that runs this interpreter with one more import folder, holding ``tinylib`` (and
its ``.dist-info``, so that ``importlib.metadata`` names its version). ``tinylib`` 1.1
scales the loss by 1 + 1e-3, ten times the default relative tolerance of a loss (1e-4): the
gate fails on it at every step. ``tinylib`` 2.0 drops the function the code calls.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from history import git, run_pytest, tree_digest
from tinyrepo import TinyRepo

from pytest_rollout_golden._internal.commits.runs import CommitRun
from pytest_rollout_golden._internal.commits.triage import outcomes
from pytest_rollout_golden.cli import main

LIB = {
    "1.0": "def scale(x):\n    return x\n",
    "1.1": "def scale(x):\n    return x * 1.001\n\n\ndef new_api():\n    return True\n",
    "2.0": "def new_api():\n    return True\n",  # scale() is gone
}
CALC = """
import tinylib


def loss(step):
    return tinylib.scale(0.5 + 0.125 * step)


def grad_norm(step):
    return 1.0 + 0.25 * step
"""
TESTS = """
import calc
import tinylib


def test_loss(golden):
    for step in range(3):
        golden.check({"pg_loss": calc.loss(step)}, step=step)


def test_grad_norm(golden):
    for step in range(3):
        golden.check({"grad_norm": calc.grad_norm(step)}, step=step)
"""
LATER_TESTS = """

def test_new_api():
    assert hasattr(tinylib, "new_api"), "tinylib has no new_api"


def test_always_broken():
    assert 1 == 2, "broken whatever the environment"
"""


def environment(folder: Path, version: str) -> str:
    """A ``python`` whose import path holds ``tinylib`` ``version``; returns its path."""
    site = folder / "site"
    (site / "tinylib").mkdir(parents=True)
    (site / "tinylib" / "__init__.py").write_text(LIB[version])
    info = site / f"tinylib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tinylib\nVersion: {version}\n")
    python = folder / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    """The project, its goldens recorded in the old environment and committed, then two
    more tests; and the environments: ``old``, ``same`` (another copy of the old one),
    ``new`` (1.1) and ``broken`` (2.0)."""
    base = tmp_path_factory.mktemp("triage")
    envs = {
        name: environment(base / name, version)
        for name, version in (("old", "1.0"), ("same", "1.0"), ("new", "1.1"), ("broken", "2.0"))
    }
    repo = TinyRepo(base / "project")
    repo.commit("calc on tinylib", {"calc.py": CALC, "test_calc.py": TESTS})
    recorded = run_pytest(
        repo.path, PYTHONPATH=os.pathsep.join([*sys.path[1:], str(base / "old" / "site")])
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    git(repo.path, "add", "golden")
    git(repo.path, "commit", "-q", "-m", "record goldens")
    repo.commit("two more tests", {"test_calc.py": TESTS + LATER_TESTS})
    return repo, envs


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
    assert "environment A -> B: 1 package differ: tinylib 1.0 -> 1.1; torch " in out
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
