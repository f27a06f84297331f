"""Under GitHub Actions a failed golden's metrics become workflow annotations on the test."""

from __future__ import annotations

import pytest

TRAIN = """
import pytest
import torch


@pytest.mark.parametrize("share", ["50%"])
def test_step(golden, values, share):
    golden.check({"pg_loss": values["loss"], "kl": values["kl"]}, step=0)
    golden.check({"pg_loss": values["loss"] * 2, "kl": values["kl"]}, step=1)
    golden.check_tensors("forward", {"log_probs": torch.full((2,), values["loss"])}, step=1)
"""


def annotations(result) -> list[str]:
    return [line for line in result.stdout.lines if line.startswith("::")]


def test_each_failed_metric_is_an_error_annotation_on_the_test(project, monkeypatch):
    path = project.write(TRAIN)
    # the test's first line, its decorator's, as pytest locates the test
    line = path.read_text().splitlines().index('@pytest.mark.parametrize("share", ["50%"])') + 1
    project.set_values(loss=0.5, kl=0.01)
    project.run().assert_outcomes(passed=1)
    project.set_values(loss=0.6, kl=0.01)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    assert annotations(project.run("--golden-strict")) == []  # not on GitHub: none

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    where = f"::error file=test_it.py,line={line},title=golden mismatch::"
    test = "test_it.py::test_step[50%25]"  # '%' escaped, as GitHub reads a command's message
    assert annotations(failed) == [
        f"{where}{test}: pg_loss step 0: expected 0.5, actual 0.6, 1e+03x beyond tolerance, "
        "allowed rtol=0.0001, atol=1e-08, scale=recorded 1 (built-in default); "
        "beyond at steps 0-1",
        f"{where}{test}: tensor forward/log_probs step 1: Mismatched elements: 2 / 2 (100.0%25)",
    ]


def test_annotation_properties_and_messages_are_escaped_as_github_reads_them():
    from pytest_rollout_golden._internal.pytest_plugin.annotations import github_command

    line = github_command("error", "100% off\r\nnext", file="a,b:c%.py", line=3, title="t")
    assert line == "::error file=a%2Cb%3Ac%25.py,line=3,title=t::100%25 off%0D%0Anext"


@pytest.mark.parametrize("variable", ["false", ""])
def test_no_annotation_unless_github_actions_is_true(project, monkeypatch, variable):
    project.write(TRAIN)
    project.set_values(loss=0.5, kl=0.01)
    project.run().assert_outcomes(passed=1)
    project.set_values(loss=0.6, kl=0.01)
    monkeypatch.setenv("GITHUB_ACTIONS", variable)
    assert annotations(project.run("--golden-strict")) == []


def test_an_annotation_names_the_file_relative_to_the_checkout(project, monkeypatch):
    """pytest's rootdir may lie below the repository's root: GitHub wants the path from there."""
    project.write(TRAIN)
    project.set_values(loss=0.5, kl=0.01)
    project.run().assert_outcomes(passed=1)
    project.set_values(loss=0.6, kl=0.01)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(project.path.parent))
    found = annotations(project.run("--golden-strict"))
    assert found and all(
        a.startswith(f"::error file={project.path.name}/test_it.py,line=") for a in found
    )
