"""Metrics excluded on purpose ("not compared") and the failure headline."""

from __future__ import annotations

import pytest

# A layout lane: pg_clipfrac legitimately changes with the layout, pg_loss must not.
LANE = """
import json
import pathlib

import pytest

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.golden(ignore=V.get("ignore", ()))
def test_lane(golden):
    for step in range(3):
        golden.check(
            {
                "pg_loss": 0.5 + step + (V.get("loss_drift", 0.0) if step >= 1 else 0.0),
                "kl": 0.01 * (step + 1) + (V.get("kl_drift", 0.0) if step >= 2 else 0.0),
                "pg_clipfrac": 0.1 + V.get("clip_drift", 0.0),
            },
            step=step,
        )
    if not V.get("drop_clipfrac_tensor"):
        golden.check_tensors("layout", {"clip": [0.1 + V.get("clip_drift", 0.0)]}, step=0)
"""


def lane(project, *args, **values):
    project.write(LANE)
    project.set_values()
    project.run(*args).assert_outcomes(passed=1)
    project.set_values(**values)
    return project.run(*args)


@pytest.mark.parametrize(
    "how",
    [
        ("marker", ()),
        ("cli", ("--golden-ignore", "pg_clipfrac", "--golden-ignore", "layout/*")),
        ("ini", ()),
        ("spec", ("--golden-tolerance=pg_clipfrac:ignore", "--golden-tolerance=layout/*:ignore")),
    ],
    ids=lambda h: h[0],
)
def test_an_ignored_metric_is_not_compared_and_listed(project, how):
    where, args = how
    values = {"clip_drift": 0.25}
    if where == "marker":
        values["ignore"] = ["pg_clipfrac", "layout/clip"]
    if where == "ini":
        project.pytester.makeini("[pytest]\ngolden_ignore =\n    pg_clipfrac\n    layout/*\n")
    result = lane(project, *args, **values)
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "not compared (excluded on purpose):" in out
    line = next(x for x in result.outlines if x.strip().startswith("test_it.py::test_lane:"))
    assert "pg_clipfrac (steps 0-2;" in line and "layout/clip (step 0;" in line


def test_without_the_exclusion_the_same_drift_fails(project):
    lane(project, clip_drift=0.25).assert_outcomes(failed=1)


def test_ignoring_one_metric_keeps_the_others_gated(project):
    result = lane(project, "--golden-ignore", "pg_clipfrac", clip_drift=0.25, loss_drift=1e-3)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # layout/clip (not ignored) drifted at step 0, pg_loss from step 1 on.
    result.stdout.fnmatch_lines(["golden mismatch: first divergence at step 0: layout/clip *; *"])
    assert "not compared (excluded on purpose): pg_clipfrac" in out
    assert "pg_loss  1" in out and "pg_loss  2" in out
    assert "pg_clipfrac (steps 0-2; --golden-ignore)" in out


def test_headline_names_only_the_metrics_of_the_first_divergent_step(project):
    result = lane(project, loss_drift=1e-3, kl_drift=1e-3)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["golden mismatch: first divergence at step 1: pg_loss *; 3 of *"])
    lines = result.outlines
    assert "kl" not in next(x for x in lines if x.startswith("golden mismatch:"))

    result = lane(project, loss_drift=0.0, kl_drift=1e-3)
    result.stdout.fnmatch_lines(["golden mismatch: first divergence at step 2: kl *; 1 of *"])


def test_an_ignored_metric_may_be_absent(project):
    result = lane(project, "--golden-ignore", "layout", drop_clipfrac_tensor=True)
    result.assert_outcomes(passed=1)


def test_a_name_both_tolerated_and_ignored_is_a_usage_error(project):
    project.write(
        "import pytest\n"
        "@pytest.mark.golden(tolerances={'kl': {'rtol': 1}}, ignore=['kl'])\n"
        "def test_x(golden):\n    golden.check({'kl': 1.0})\n"
    )
    result = project.run()
    assert "'kl' has a tolerance in @pytest.mark.golden(tolerances=) and is ignored" in (
        result.stdout.str() + result.stderr.str()
    )


# Training values whose names mention throughput, memory or seconds, and what verl, OpenRLHF,
# TRL and transformers log about the machine (timing, throughput, memory).
NAMES = """
import json, pathlib

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
TRAINING = ["reward/throughput", "env/episode_seconds", "actor/memory_loss", "tokens_per_step"]
MACHINE = ["timing_s/gen", "timing_per_token_ms/gen", "perf/throughput", "timing/generation",
           "perf/max_memory_allocated_gb", "train_runtime", "train_samples_per_second",
           "step_time"]


def test_train(golden):
    for step in range(2):
        values = {name: 2.0 * V.get(name, 1.0) for name in [*TRAINING, *MACHINE]}
        golden.check({"pg_loss": 0.5, **values}, step=step)
"""
TRAINING = ["reward/throughput", "env/episode_seconds", "actor/memory_loss", "tokens_per_step"]
MACHINE = [
    "timing_s/gen",
    "timing_per_token_ms/gen",
    "perf/throughput",
    "timing/generation",
    "perf/max_memory_allocated_gb",
    "train_runtime",
    "train_samples_per_second",
    "step_time",
]


@pytest.mark.parametrize("args", [(), ("--golden-exact",)], ids=["default", "exact"])
@pytest.mark.parametrize("name", TRAINING)
def test_a_training_value_named_like_a_machine_measure_is_compared(
    project, name, args, monkeypatch
):
    project.write(NAMES)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.set_values(**{name: 3.0})
    monkeypatch.setenv("CI", "true")
    result = project.run(*args)
    result.assert_outcomes(failed=1)
    assert project.mismatch_row(result, name)["actual"] == "6.0"


def test_machine_measures_are_not_compared_and_each_is_named(project, monkeypatch):
    project.write(NAMES)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.set_values(**dict.fromkeys(MACHINE, 3.0))
    monkeypatch.setenv("CI", "true")
    result = project.run("--golden-exact")
    result.assert_outcomes(passed=1)
    line = next(x for x in result.outlines if x.strip().startswith("test_it.py::test_train:"))
    for name in MACHINE:
        assert f"{name} " in line or f"{name}," in line, (name, line)
