"""``golden_precision`` / ``precision=``: bf16 training declared where metrics are checked."""

from __future__ import annotations

import pytest

TRAIN = """
import pytest


@pytest.mark.golden(**MARKER)
def test_step(golden, values):
    golden.check({"loss": 0.3 * values["loss"], "grad_norm": 2.0 * values["grad"]})
"""


@pytest.mark.parametrize("declared", ["marker", "ini"])
def test_bf16_accepts_grad_norm_noise_and_still_fails_a_loss_drift(project, declared):
    marker = '{"precision": "bf16"}' if declared == "marker" else "{}"
    project.write(TRAIN.replace("**MARKER", f"**{marker}"))
    if declared == "ini":
        project.pytester.makeini("[pytest]\ngolden_precision = bf16\n")
    project.set_values(loss=1.0, grad=1.0)
    project.run().assert_outcomes(passed=1)

    project.set_values(loss=1.0, grad=1.0009)  # 9e-4: bf16 accumulation noise (TRL, measured)
    project.run("--golden-strict").assert_outcomes(passed=1)
    project.set_values(loss=1.001, grad=1.0009)  # a 1e-3 error of the loss, float32-accumulated
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*loss*"])
    project.set_values(loss=1.0, grad=1.003)  # beyond 2e-3
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    source = "marker precision = bf16" if declared == "marker" else "ini golden_precision = bf16"
    failed.stdout.fnmatch_lines([f"*grad_norm*rtol=0.002*({source})*"])


def test_without_a_declared_precision_bf16_noise_fails(project):
    project.write(TRAIN.replace("**MARKER", "**{}"))
    project.set_values(loss=1.0, grad=1.0)
    project.run().assert_outcomes(passed=1)
    project.set_values(loss=1.0, grad=1.0009)
    project.run("--golden-strict").assert_outcomes(failed=1)


def test_an_unknown_precision_stops_the_run(project):
    project.write(TRAIN.replace("**MARKER", "**{}"))
    project.pytester.makeini("[pytest]\ngolden_precision = fp4\n")
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini golden_precision: unknown precision 'fp4'*"])
