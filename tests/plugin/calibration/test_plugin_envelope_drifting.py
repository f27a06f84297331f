"""An envelope's ``layout_drifting`` section takes a metric out of every variant's
comparison: a file that claims it where calibration never could (a run too short for an
envelope, no across-variants lane, a band across variants for the same metric) is refused
on replay and by ``rollout-golden verify``, naming the file, the metric and the rule; a
claim calibration could have made still shows in ``verify``."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.tolerance import calibration as calibrate, envelope
from pytest_rollout_golden.cli import main

# mb8 records the golden, mb4 replays it as a same-math variant; "scale" is a bug in mb4 only
# (a micro-batch path that multiplies the loss): the reference still passes.
VARIANTS = """
import json, pathlib
import pytest
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.parametrize("v", same_math(["mb8", "mb4"]))
def test_x(golden, v):
    scale = V.get("scale", 1.0) if v == "mb4" else 1.0
    for step in range(V["steps"]):
        golden.check({"loss": (2.0 + 0.1 * step) * scale, "lr": 1e-3}, step=step)
"""


def forge(project, **sections) -> None:
    """Write ``sections`` as the reference's envelope.json, signed as calibration signs it."""
    how = {"runs": 3, "perturbations": ["threads"], "tests": ["test_it.py::test_x[mb8]"]}
    content = {**envelope.document({}, how), **sections}
    calibrate.write(project.golden_dir("test_x[mb8]"), None, envelope=content)


DRIFTING_LOSS = {envelope.DRIFTING: {"loss": {"widest": 5.0, "trends": {}}}}


@pytest.mark.parametrize(
    ("steps", "sections", "rule"),
    [
        (
            1,
            {"layout_metrics": {}, **DRIFTING_LOSS},
            f"recorded at 1 step, and calibration writes an envelope only for metrics of "
            f"{envelope.MIN_STEPS} steps or more",
        ),
        (12, DRIFTING_LOSS, "without the across-variants lane ('layout_metrics')"),
    ],
    ids=["one-step-test", "no-across-variants-lane"],
)
def test_a_drifting_claim_calibration_never_makes_is_refused_and_verify_fails(
    project, capsys, steps, sections, rule
):
    project.write(VARIANTS)
    project.set_values(steps=steps)
    project.run().assert_outcomes(passed=2)
    forge(project, **sections)
    project.set_values(steps=steps, scale=10.0)  # a bug in the variant: must never pass
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=2)  # the reference too: its golden's file is refused
    out = result.stdout.str()
    assert "envelope.json: metric 'loss' not comparable across variants: " in out, out
    assert rule in out and "--golden-calibrate N" in out, out
    capsys.readouterr()
    assert main(["verify", str(project.golden)]) == 1
    verified = capsys.readouterr().out
    assert "FAIL" in verified and rule in verified, verified


def test_a_drifting_claim_beside_a_band_of_the_same_metric_is_refused(project):
    project.write(VARIANTS)
    project.set_values(steps=12)
    project.run().assert_outcomes(passed=2)
    band = {"steps": list(range(12)), "below": [1e-3] * 12, "above": [1e-3] * 12}
    forge(project, layout_metrics={"loss": {**band, "dtype": "float64"}}, **DRIFTING_LOSS)
    project.set_values(steps=12, scale=10.0)
    result = project.run("--golden-strict")
    result.assert_outcomes(failed=2)
    assert "it also has a band across variants" in result.stdout.str()


def test_verify_names_a_metric_a_variant_does_not_compare(project, capsys):
    """A claim calibration could have made is accepted, and listed wherever it applies:
    the variant's replay and ``verify`` both name it."""
    project.write(VARIANTS)
    project.set_values(steps=12)
    project.run().assert_outcomes(passed=2)
    forge(project, layout_metrics={}, **DRIFTING_LOSS)
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=2)
    assert "not comparable across variants" in result.stdout.str()
    capsys.readouterr()
    assert main(["verify", str(project.golden)]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if "test_x[mb8]" in x]
    assert rows == [
        f"ok   {project.golden_dir('test_x[mb8]')} (2 files; not comparable across variants "
        "(envelope.json): loss (5x))"
    ], rows
