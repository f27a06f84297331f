"""A ``key=``/``shared=`` golden names the test that recorded it when another test fails
against it (issue 16, item 10): under xdist the first to record need not be the first
parametrization."""

from __future__ import annotations

import json

import pytest

SHARED = """
import pytest


@pytest.mark.golden(key="shared")
@pytest.mark.parametrize("variant", ["a", "b"])
def test_shared(golden, variant):
    golden.check({"loss": {"a": 1.0, "b": 2.0}[variant]})
"""


def test_a_failure_against_a_key_golden_names_the_test_that_recorded_it(project):
    project.write(SHARED)
    project.run("-k", "b").assert_outcomes(passed=1, deselected=1)  # [b] records it first
    golden = project.golden / "test_it" / "shared"
    assert json.loads((golden / "manifest.json").read_text())["test"] == (
        "test_it.py::test_shared[b]"
    )
    result = project.run("--golden-report=r.json")
    result.assert_outcomes(passed=1, failed=1)
    tests = json.loads((project.path / "r.json").read_text())["tests"]
    by_test = {t["test"]: t.get("recorded_by") for t in tests}
    assert by_test["test_it.py::test_shared[a]"] == "test_it.py::test_shared[b]"
    out = result.stdout.str()
    assert (
        "test_it.py::test_shared[a] replayed the golden recorded by test_it.py::test_shared[b]\n"
    ) in out
    assert (
        "failed against a golden another test recorded:\n"
        "    test_it.py::test_shared[a]: recorded by test_it.py::test_shared[b]\n"
    ) in out


def test_xdist_names_the_recorder_whichever_worker_recorded(project):
    pytest.importorskip("xdist")
    project.write(SHARED)
    result = project.run_subprocess("-n", "2")
    result.assert_outcomes(passed=1, failed=1)
    recorder = json.loads((project.golden / "test_it" / "shared" / "manifest.json").read_text())
    other = {"test_it.py::test_shared[a]", "test_it.py::test_shared[b]"} - {recorder["test"]}
    assert f"{other.pop()} replayed the golden recorded by {recorder['test']}\n" in (
        result.stdout.str()
    )
