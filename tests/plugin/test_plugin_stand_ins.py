"""Values recorded while another step's rollout stood in (``missing_step="repeat"``) are
marked as such in the golden, and a failure against them says so (issue 16, item 10)."""

from __future__ import annotations

import json

import pytest

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenFormatError

STEPS = """
import pytest
import torch


@pytest.mark.golden(**POLICY)
def test_train(golden, generated, values):
    for step in range(values.get("steps", 3)):
        batch = golden.rollout(
            lambda: generated(f"rollout{step}", {"x": torch.full((3,), float(step))}), step=step
        )
        golden.check({"pg_loss": float(batch["x"].sum())}, step=step)
"""


def write(project, policy: str | None) -> None:
    marker = {} if policy is None else {"missing_step": policy}
    project.write(STEPS.replace("**POLICY", f"**{marker!r}"))


def manifest(project) -> dict:
    return json.loads((project.golden_dir("test_train") / "manifest.json").read_text())


def test_stand_in_values_are_marked_and_a_failure_against_them_says_so(project):
    write(project, None)
    project.run().assert_outcomes(passed=1)
    assert "stand_ins" not in manifest(project), "no stand-in, no new field"

    write(project, "repeat")
    project.set_values(steps=5)
    project.run().assert_outcomes(passed=1)  # steps 3-4 recorded on step 2's batch
    assert manifest(project)["stand_ins"] == {"3": {"rollout": 2}, "4": {"rollout": 2}}
    assert project.metrics("test_train")["3"] == {"pg_loss": 6.0}
    project.run("--golden-strict").assert_outcomes(passed=1)  # stood in again: the same

    write(project, None)  # now steps 3-4 get rollouts of their own
    project.calls()
    result = project.run()
    result.assert_outcomes(failed=1)
    assert project.mismatch_row(result, "pg_loss")["expected"] == "6.0"
    result.stdout.fnmatch_lines(
        [
            "*step 3: its recorded values were computed with rollout 'rollout' step 2 "
            "standing in for step 3 (missing_step='repeat'); this run used step 3's own "
            "rollout 'rollout'",
            "*step 4: its recorded values were computed with rollout 'rollout' step 2 *",
        ]
    )

    result = project.run("--update-golden")  # re-recorded on their own rollouts
    result.assert_outcomes(passed=1)
    assert "stand_ins" not in manifest(project)
    assert project.metrics("test_train")["3"] == {"pg_loss": 9.0}
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_update_under_repeat_marks_the_stood_in_steps_only(project):
    write(project, None)
    project.run().assert_outcomes(passed=1)
    project.set_values(steps=4)
    result = project.run("--update-golden", "--golden-missing-step=repeat")
    result.assert_outcomes(passed=1)
    assert manifest(project)["stand_ins"] == {"3": {"rollout": 2}}


def test_a_malformed_stand_in_mark_is_a_format_error(tmp_path):
    directory = tmp_path / "golden"
    tx = store.Transaction(directory)
    tx.write_json("metrics.json", {"steps": {}}, kind="metrics")
    tx.commit({"test": "t", "stand_ins": {"3": {"rollout": "two"}}})
    with pytest.raises(GoldenFormatError, match="stand_ins"):
        store.read_manifest(directory)
