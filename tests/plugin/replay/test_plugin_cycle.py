"""The record -> replay -> drift -> update -> replay life cycle of one golden, through pytest."""

from __future__ import annotations

import re

import pytest

TRAIN = """
import torch


def make_batch():
    return {"tokens": torch.arange(6).reshape(2, 3), "prompts": ["a", "b"]}


def test_train(golden, values, generated):
    for step in range(values.get("steps", 1)):
        generate = lambda step=step: generated(f"rollout{step}", make_batch())  # noqa: E731
        batch = golden.rollout(generate, step=step)
        assert batch["prompts"] == ["a", "b"]
        scale = float(batch["tokens"].sum()) / 15.0  # 1.0: metrics depend on the replayed batch
        golden.check({k: v * scale for k, v in values["metrics"].items()}, step=step)
"""

METRICS = {"pg_loss": 0.5, "kl": 0.01, "grad_norm": 2.0}


def test_record_replay_drift_update_replay(project):
    project.write(TRAIN)
    project.set_values(metrics=METRICS)

    recorded = project.run()
    recorded.assert_outcomes(passed=1)
    assert project.calls() == ["rollout0"]
    assert project.counts(recorded) == {"replayed": 0, "recorded": 1, "updated": 0, "failed": 0}
    directory = project.golden_dir("test_train")
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json",
        "metrics.json",
        "rollout-rollout-step000000.safetensors",
    ]
    assert project.metrics("test_train") == {"0": METRICS}
    files = project.golden_files()

    replayed = project.run()
    replayed.assert_outcomes(passed=1)
    assert project.calls() == [], "replay must not call the generator"
    assert project.counts(replayed) == {"replayed": 1, "recorded": 0, "updated": 0, "failed": 0}
    assert project.golden_files() == files

    # pg_loss drifts by 1e-3 and kl by 3e-2 (relative): both beyond the built-in defaults.
    # grad_norm moves by 1e-7, rounding noise that must pass.
    drifted = {"pg_loss": 0.5005, "kl": 0.0103, "grad_norm": 2.0000002}
    project.set_values(metrics=drifted)
    failed = project.run()
    failed.assert_outcomes(failed=1)
    assert project.calls() == []
    assert project.golden_files() == files, "a failing replay must not touch the golden"
    failed.stdout.fnmatch_lines(["golden mismatch: *2 of 3 checks failed (golden *test_train)"])
    out = failed.stdout.str()
    assert "grad_norm" not in out.split("golden mismatch")[1].split("If the new")[0]
    assert "--update-golden" in out
    assert project.counts(failed)["failed"] == 1
    for metric, rtol, atol in (("pg_loss", 1e-4, 1e-8), ("kl", 1e-4, 5e-7)):
        row = project.mismatch_row(failed, metric)
        expected, actual = METRICS[metric], drifted[metric]
        assert row["step"] == "0"
        assert float(row["expected"]) == expected
        assert float(row["actual"]) == actual
        assert float(row["abs diff"]) == pytest.approx(actual - expected, rel=0.05)
        assert float(row["rel diff"]) == pytest.approx((actual - expected) / expected, rel=0.05)
        allowed = dict(re.findall(r"(rtol|atol)=([-+.\deE]+)", row["allowed"]))
        assert (float(allowed["rtol"]), float(allowed["atol"])) == (rtol, atol)

    updated = project.run("--update-golden")
    updated.assert_outcomes(passed=1)
    assert project.calls() == [], "--update-golden keeps the recorded rollout (an input)"
    assert project.counts(updated) == {"replayed": 0, "recorded": 0, "updated": 1, "failed": 0}
    updated.stdout.fnmatch_lines(
        [
            "updated test_it.py::test_train -> golden*test_it*test_train:",
            "*pg_loss (step 0): 0.5 -> 0.5005 (abs 0.0005*, rel 0.001*)",
            "*kl (step 0): 0.01 -> 0.0103 (abs 0.0003*, rel 0.03*)",
        ]
    )
    assert project.metrics("test_train") == {"0": drifted}

    again = project.run()
    again.assert_outcomes(passed=1)
    assert project.calls() == []
    assert project.counts(again)["replayed"] == 1

    # Re-recording identical values rewrites identical bytes: no noise in a PR diff.
    files = project.golden_files()
    project.run("--update-golden").assert_outcomes(passed=1)
    assert project.golden_files() == files


def test_new_step_is_recorded_and_a_dropped_step_fails(project):
    project.write(TRAIN)
    project.set_values(metrics=METRICS, steps=1)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout0"]
    first_rollout = project.golden_dir("test_train") / "rollout-rollout-step000000.safetensors"
    step0 = first_rollout.read_bytes()

    project.set_values(metrics=METRICS, steps=3)
    grown = project.run()
    grown.assert_outcomes(passed=1)
    assert project.calls() == ["rollout1", "rollout2"], "only the new steps are generated"
    assert project.counts(grown)["recorded"] == 1
    assert set(project.metrics("test_train")) == {"0", "1", "2"}
    assert first_rollout.read_bytes() == step0

    project.run().assert_outcomes(passed=1)
    assert project.calls() == []

    # Steps 1 and 2 are recorded, but the test no longer reaches them.
    project.set_values(metrics=METRICS, steps=1)
    shrunk = project.run()
    shrunk.assert_outcomes(failed=1)
    shrunk.stdout.fnmatch_lines(
        [
            "metric 'pg_loss' (step 1): recorded but not checked in this run*",
            "metric 'kl' (step 2): recorded but not checked in this run*",
        ]
    )


def test_new_metric_is_recorded_and_old_ones_kept(project):
    project.write(TRAIN)
    project.set_values(metrics={"pg_loss": 0.5})
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout0"]

    project.set_values(metrics={"pg_loss": 0.5, "entropy": 1.25})
    result = project.run()
    result.assert_outcomes(passed=1)
    assert project.counts(result)["recorded"] == 1
    assert project.metrics("test_train") == {"0": {"pg_loss": 0.5, "entropy": 1.25}}
    assert project.calls() == [], "the rollout is replayed while the new metric is recorded"


def test_failing_test_records_nothing(project):
    project.write(
        """
        def test_train(golden):
            golden.check({"pg_loss": 0.5})
            raise RuntimeError("the training step crashed")
        """
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    assert project.golden_files() == {}
    result.stdout.fnmatch_lines(["not recorded (the test failed): new values of *test_train"])
