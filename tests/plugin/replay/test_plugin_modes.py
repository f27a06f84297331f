"""Strict mode (`--golden-strict`, or a truthy CI variable): nothing recorded, gaps fail."""

from __future__ import annotations

import pytest

# Steps 0..steps-1; each step generates a rollout (logged) unless "check_only" is set.
STEPS = """
import torch


def test_train(golden, values, generated):
    for step in range(values["steps"]):
        if not values.get("check_only"):
            batch = golden.rollout(
                lambda step=step: generated(f"rollout{step}", {"x": torch.full((2,), step)}),
                step=step,
            )
            assert batch["x"].tolist() == [step, step]
        golden.check({name: 0.5 for name in values["metrics"]}, step=step)
"""

REMEDY = "run `pytest --update-golden` locally and commit the golden/ directory"


def strict_run(project, how: str, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    if how == "--golden-strict":
        return project.run("--golden-strict")
    monkeypatch.setenv("CI", how.removeprefix("CI="))
    return project.run()


@pytest.mark.parametrize("how", ["--golden-strict", "CI=true", "CI=1", "CI=yes"])
def test_missing_golden_fails_and_writes_nothing(project, monkeypatch, how):
    project.write(STEPS)
    project.set_values(steps=1, metrics=["pg_loss"])
    result = strict_run(project, how, monkeypatch)
    result.assert_outcomes(failed=1)
    assert project.calls() == [], "strict mode must not call the generator"
    assert not project.golden.exists()
    assert project.counts(result) == {"replayed": 0, "recorded": 0, "updated": 0, "failed": 1}
    result.stdout.fnmatch_lines(
        ["*rollout 'rollout' at step 0 is not in the golden golden/test_it/test_train*"]
    )
    out = result.stdout.str()
    assert REMEDY in out
    assert "FileNotFoundError" not in out


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_falsy_ci_records(project, monkeypatch, value):
    project.write(STEPS)
    project.set_values(steps=1, metrics=["pg_loss"])
    monkeypatch.setenv("CI", value)
    project.run().assert_outcomes(passed=1)
    assert (project.golden_dir("test_train") / "manifest.json").is_file()


def test_ci_environment_variable_in_a_fresh_process(project, monkeypatch):
    project.write(STEPS)
    project.set_values(steps=1, metrics=["pg_loss"])
    monkeypatch.setenv("CI", "true")
    result = project.run_subprocess()
    result.assert_outcomes(failed=1)
    assert project.calls() == []
    assert not project.golden.exists()
    assert REMEDY in result.stdout.str()


def test_missing_rollout_step_lists_the_recorded_steps(project):
    project.write(STEPS)
    project.set_values(steps=2, metrics=["pg_loss"])
    project.run().assert_outcomes(passed=1)
    project.calls()
    files = project.golden_files()

    project.run("--golden-strict").assert_outcomes(passed=1)  # a complete golden replays

    project.set_values(steps=3, metrics=["pg_loss"])
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert (
        "rollout 'rollout' at step 2 is not in the golden golden/test_it/test_train "
        "(recorded steps: [0, 1])" in out
    )
    assert REMEDY in out
    assert project.calls() == []
    assert project.golden_files() == files


def test_missing_metric_step_lists_the_recorded_steps(project):
    project.write(STEPS)
    project.set_values(steps=2, metrics=["pg_loss"], check_only=True)
    project.run().assert_outcomes(passed=1)
    files = project.golden_files()

    project.set_values(steps=3, metrics=["pg_loss"], check_only=True)
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["golden mismatch: *1 of 3 checks failed (golden golden/test_it/test_train)"]
    )
    out = result.stdout.str()
    assert "metric 'pg_loss' (step 2): step 2 was never recorded (recorded steps: [0, 1])" in out
    assert REMEDY in out
    assert project.golden_files() == files


def test_new_metric_fails_in_strict_mode_and_is_recorded_otherwise(project):
    project.write(STEPS)
    project.set_values(steps=1, metrics=["pg_loss"])
    project.run().assert_outcomes(passed=1)
    files = project.golden_files()

    project.set_values(steps=1, metrics=["pg_loss", "kl"])
    strict = project.run("--golden-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["metric 'kl' (step 0): *never recorded*"])
    assert REMEDY in strict.stdout.str()
    assert "metric 'pg_loss'" not in strict.stdout.str()
    assert project.golden_files() == files

    project.run().assert_outcomes(passed=1)
    assert set(project.metrics("test_train")["0"]) == {"pg_loss", "kl"}


def test_recorded_metric_no_longer_checked_fails_in_every_mode(project):
    project.write(STEPS)
    project.set_values(steps=1, metrics=["pg_loss", "kl"])
    project.run().assert_outcomes(passed=1)

    project.set_values(steps=1, metrics=["pg_loss"])
    for args in ((), ("--golden-strict",)):
        result = project.run(*args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["metric 'kl' (step 0): recorded but not checked*"])
        assert "--update-golden" in result.stdout.str()

    project.run("--update-golden").assert_outcomes(passed=1)
    assert set(project.metrics("test_train")["0"]) == {"pg_loss"}, "update drops the old metric"
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_update_and_strict_exclude_each_other(project):
    project.write(STEPS)
    result = project.run("--update-golden", "--golden-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--update-golden and --golden-strict exclude each other*"])
