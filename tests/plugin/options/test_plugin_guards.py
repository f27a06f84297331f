"""Guards for easy mistakes (issue 10, item 4): each a clear error or warning naming the fix."""

from __future__ import annotations

import pytest


def test_rollout_of_a_batch_instead_of_a_generator_fails_on_record_and_replay(project):
    project.write(
        """
def test_it(golden, values):
    batch = {"x": [1, 2]}
    golden.rollout((lambda: batch) if values.get("callable") else batch)
"""
    )
    for values in ({}, {"callable": True}, {}):
        project.set_values(**values)
        result = project.run()
        if values:
            result.assert_outcomes(passed=1)  # recorded: the next run replays
            continue
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                "*TypeError: golden.rollout() needs the function that generates rollout "
                "'rollout', got a dict; pass the generator itself, e.g. "
                "`golden.rollout(lambda: engine.generate(prompts))`*"
            ]
        )


def test_rollout_twice_for_one_step_names_step_name_and_fix(project):
    project.write(
        """
def test_it(golden, generated):
    for step in range(3):
        batch = golden.rollout(lambda: generated("gen", {"s": [step]}))
        golden.check({"s": float(batch["s"][0])}, step=step)
"""
    )
    for _ in range(2):  # recording, then replay (once something was recorded)
        result = project.run()
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                "*ValueError: golden.rollout(name='rollout', step=0) was already called in this "
                "test: in a loop, pass the loop's step (`golden.rollout(generate, step=step)`), "
                "or give each batch of one step its own `name=`"
            ]
        )
    assert not project.golden.exists()  # the failed test recorded nothing


@pytest.mark.parametrize("metrics", ["0.5", "[('pg_loss', 0.5)]", "None"])
def test_check_of_a_non_mapping_is_a_type_error(project, metrics):
    project.write(f"def test_it(golden):\n    golden.check({metrics})\n")
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*TypeError: golden.check() needs a mapping of metric name -> value, got *; "
            'write `golden.check({"pg_loss": loss}, step=step)`'
        ]
    )


NAN = """
def test_it(golden, values):
    golden.check({"kl": float(values.get("kl", "nan")), "pg_loss": 0.25})
"""


def test_nan_metric_warns_when_recorded_and_its_failure_names_equal_nan(project):
    project.write(NAN)
    result = project.run()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*GoldenNaNWarning: test_it.py::test_it: metric 'kl' at step 0 is NaN and is "
            "recorded as NaN; replay fails on NaN unless its tolerance sets equal_nan (e.g. "
            "`tolerances={'kl': {'equal_nan': True}}`): fix the NaN, or allow it"
        ]
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "golden mismatch: first divergence at step 0: kl NaN beyond tolerance; 1 of 2 *",
            "  metric*",
            "  kl * nan * nan * 0 * 0 * NaN * rtol=0.0001, atol=*",
            "metric 'kl' (step 0): recorded NaN, got NaN (equal_nan is off): NaN equals NaN "
            "only where the tolerance sets equal_nan "
            "(e.g. --golden-tolerance NAME:equal_nan=true); fix the NaN, or allow it",
        ]
    )
    project.run("--golden-tolerance", "kl:equal_nan=true").assert_outcomes(passed=1)

    result = project.run("--update-golden")  # re-recording a NaN warns and says so
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        ["    kl (step 0): nan -> nan (NaN: replay fails unless equal_nan)"]
    )
    assert "unchanged" not in result.stdout.str().split("pg_loss (step 0)")[0]

    project.set_values(kl=0.5)  # a finite value replayed against the NaN: no warning
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "GoldenNaNWarning" not in result.stdout.str()


def test_missing_metric_next_to_an_unrecorded_one_suggests_the_typo(project):
    project.write(
        """
def test_it(golden, values):
    golden.check({values.get("name", "pg_loss"): 0.25, "kl": 0.5})
"""
    )
    project.run().assert_outcomes(passed=1)
    project.set_values(name="pg_los")
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "metric 'pg_loss' (step 0): recorded but not checked in this run; this run checked "
            "'pg_los' at this step, which was never recorded: a misspelt or renamed metric "
            "(did you mean 'pg_loss'?); if it was dropped on purpose*"
        ]
    )
    project.set_values(name="entropy")  # nothing alike: no suggestion
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["metric 'pg_loss' (step 0): recorded but not checked in this run; if it was dropped*"]
    )


def test_tolerance_for_an_unknown_metric_warns_on_the_recording_run_too(project):
    project.write(
        """
def test_it(golden):
    golden.check({"pg_loss": 0.25}, tolerances={"pg_los": {"rtol": 1e-3}})
"""
    )
    for _ in range(2):  # recording, then replay
        result = project.run()
        result.assert_outcomes(passed=1, warnings=1)
        result.stdout.fnmatch_lines(
            [
                "*test_it.py:2: GoldenToleranceWarning: test_it.py::test_it: "
                "golden.check(tolerances=) gives a tolerance for 'pg_los', but no metric or "
                "tensor of that name was checked"
            ]
        )


def test_update_golden_under_ci_records_and_says_so(project, monkeypatch):
    project.write(NAN.replace('"nan"', '"0.125"'))
    monkeypatch.setenv("CI", "true")
    result = project.run()  # CI never records on its own
    result.assert_outcomes(failed=1)
    assert not project.golden.exists()
    result = project.run("--update-golden")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "golden: 0 replayed, 1 recorded, 0 updated, 0 failed",
            "goldens were re-recorded under CI (the CI environment variable is set): "
            "--update-golden overrides CI's never-record rule; commit golden/ only if you meant it",
        ]
    )
    project.run().assert_outcomes(passed=1)  # replay under CI: no note
    monkeypatch.delenv("CI")
    result = project.run("--update-golden")
    result.assert_outcomes(passed=1)
    assert "under CI" not in result.stdout.str()


def test_recording_under_a_subdirectory_rootdir_points_at_the_config_file(project, monkeypatch):
    project.write(NAN.replace('"nan"', '"0.125"'))
    project.run().assert_outcomes(passed=1)
    tests = project.path / "tests"
    tests.mkdir()
    (project.path / "test_it.py").rename(tests / "test_it.py")
    (project.path / "conftest.py").rename(tests / "conftest.py")
    monkeypatch.chdir(tests)
    result = project.run()
    result.assert_outcomes(passed=1)
    assert (tests / "golden" / "test_it" / "test_it").is_dir()
    result.stdout.fnmatch_lines(
        [
            f"recorded under {tests / 'golden'}, but {project.golden} exists too: with no "
            f"pytest config file, rootdir is {tests} (where pytest was started); put one "
            "(pytest.ini, or [tool.pytest.ini_options] in pyproject.toml) at the project root "
            "so that every run finds the same golden/"
        ]
    )
    (project.path / "pytest.ini").write_text("[pytest]\n")
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["golden: 0 replayed, 1 recorded, 0 updated, 0 failed"]
    )  # now under the root's golden/tests/
    assert "exists too" not in result.stdout.str()
