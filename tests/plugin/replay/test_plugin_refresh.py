"""Re-recording with provenance (``--update-golden``, ``--golden-reason``) and the refresh of
failing goldens only (``--update-golden-failing``), which refuses placeholder values."""

from __future__ import annotations

import json

TWO = """
def test_a(golden, values):
    a = values.get("a", [1.0, 2.0, 3.0])
    for step, loss in enumerate(a):
        golden.check({"loss": loss, "lr": 1e-6}, step=step)


def test_b(golden, values):
    b = values.get("b", [0.5, 0.25])
    for step, loss in enumerate(b):
        golden.check({"loss": loss}, step=step)
"""


def manifest(project, test: str) -> dict:
    return json.loads((project.golden_dir(test) / "manifest.json").read_text())


def test_an_update_records_why_who_where_and_how_far_the_old_values_were(project):
    project.write(TWO)
    project.run().assert_outcomes(passed=2)
    assert "provenance" not in manifest(project, "test_a")  # a first recording has none
    project.set_values(a=[1.0, 2.0, 3.003])  # 3e-3 off: 10 times the 3e-4 allowed
    project.run("--update-golden", "--golden-reason", "vllm 0.9 -> 0.10").assert_outcomes(passed=2)
    provenance = manifest(project, "test_a")["provenance"]
    assert provenance["reason"] == "vllm 0.9 -> 0.10"
    assert provenance["by"] and provenance["environment"]["host"]
    assert provenance["commit"] is None  # not a git checkout
    assert provenance["distance"]["lr"] == 0.0
    # allowed: rtol 1e-4 of the recorded magnitude 3.0 plus atol 1e-8
    assert abs(provenance["distance"]["loss"] - 0.003 / (3e-4 + 1e-8)) < 1e-6


def test_without_a_reason_the_commit_is_the_reason(project):
    project.write(TWO)
    head = project.commit()
    project.run().assert_outcomes(passed=2)
    project.set_values(b=[0.5, 0.3])
    project.run("--update-golden").assert_outcomes(passed=2)
    provenance = manifest(project, "test_b")["provenance"]
    assert (provenance["reason"], provenance["commit"]) == (f"commit {head}", head)


def test_only_failing_goldens_are_re_recorded_the_others_stay_byte_identical(project):
    project.write(TWO)
    project.run().assert_outcomes(passed=2)
    before = project.golden_files()
    project.set_values(a=[1.0, 2.0, 3.003])
    result = project.run("--update-golden-failing")
    result.assert_outcomes(passed=2)
    assert project.counts(result) == {"replayed": 1, "recorded": 0, "updated": 1, "failed": 0}
    after = project.golden_files()
    b_files = [k for k in before if k.startswith("test_it/test_b/")]
    assert b_files and all(before[k] == after[k] for k in b_files)
    assert after["test_it/test_a/metrics.json"] != before["test_it/test_a/metrics.json"]
    assert manifest(project, "test_a")["provenance"]["distance"]["loss"] > 1
    project.run("--golden-strict").assert_outcomes(passed=2)


def test_placeholder_values_are_refused_naming_file_metric_and_why(project):
    project.write(TWO)
    project.run().assert_outcomes(passed=2)
    before = project.golden_files()
    project.set_values(a=[0.0, 0.0, 0.0], b=[7.0, 7.0])
    result = project.run("--update-golden-failing")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*golden/test_it/test_a/metrics.json: not re-recorded, the old golden is kept: "
            "new values that look like placeholders",
            "*metric 'loss': all zeros (3 steps)",
            "*If these are the real values, run again with --golden-allow-placeholder.",
            "*golden/test_it/test_b/metrics.json: not re-recorded*",
            "*metric 'loss': the same value 7.0 at all 2 steps",
        ]
    )
    assert project.golden_files() == before
    project.set_values(a=[1.0, float("nan"), 3.0])
    result = project.run("--update-golden-failing", "test_it.py::test_a")
    result.stdout.fnmatch_lines(["*metric 'loss': NaN at step 1"])
    assert project.golden_files() == before

    project.set_values(a=[0.0, 0.0, 0.0])
    allowed = project.run("--update-golden-failing", "--golden-allow-placeholder")
    allowed.assert_outcomes(passed=2)
    assert project.metrics("test_a")["2"]["loss"] == 0.0


def test_a_plain_update_keeps_writing_constant_values(project):
    """Only the refresh of failing goldens judges placeholders: --update-golden re-records
    what the test computes, a constant metric (a learning rate) included."""
    project.write(TWO)
    project.run().assert_outcomes(passed=2)
    project.set_values(b=[7.0, 7.0])
    project.run("--update-golden").assert_outcomes(passed=2)
    assert project.metrics("test_b")["1"]["loss"] == 7.0


def test_an_addition_keeps_the_provenance_of_the_last_refresh(project):
    project.write(TWO)
    project.run().assert_outcomes(passed=2)
    project.set_values(b=[0.5, 0.3])
    project.run("--update-golden", "--golden-reason", "why").assert_outcomes(passed=2)
    project.set_values(b=[0.5, 0.3, 0.125])  # a new step: recorded beside the others
    project.run().assert_outcomes(passed=2)
    assert "2" in project.metrics("test_b")
    assert manifest(project, "test_b")["provenance"]["reason"] == "why"
    # re-recording the same values again keeps the bytes, provenance included
    files = project.golden_files()
    project.run("--update-golden", "--golden-reason", "another").assert_outcomes(passed=2)
    assert project.golden_files() == files
