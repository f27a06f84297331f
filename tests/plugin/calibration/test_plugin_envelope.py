"""Per-step envelopes of long runs, through pytest: ``--golden-calibrate`` writes the band
the runs spanned at each step, replay holds each step to its band (tight where the runs
agreed, wide where they drifted apart), a hand-edited band is refused, and the band
survives ``--update-golden``."""

from __future__ import annotations

import json
import math

import pytest

from pytest_rollout_golden._internal.tolerance import calibration as calibrate, envelope
from pytest_rollout_golden.cli import main

# A 20-step run whose noise grows with the step, as a bf16 trajectory drifts: its size
# depends on the thread count, which calibration's "threads" perturbation changes.
LONG = """
import json, math, pathlib
import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
STEPS = V.get("steps", 20)


def test_long(golden):
    threads = torch.get_num_threads()
    for step in range(STEPS):
        noise = 1e-4 * step * math.sin(1.7 * threads + step) * V.get("noise", 1.0)
        loss = 1.0 + 0.01 * step + noise
        loss *= V.get("scale", 1.0)
        loss += V.get("shift_at", {}).get(str(step), 0.0)
        golden.check({"loss": loss, "lr": 1e-3}, step=step)
"""


@pytest.fixture
def calibrated(project):
    project.write(LONG)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    result = project.run("--golden-calibrate", "3")
    assert "per-step envelope written to" in result.stdout.str(), result.stdout.str()
    return project


def band(project) -> dict:
    return json.loads((project.golden_dir("test_long") / "envelope.json").read_text())


def test_calibration_writes_the_band_of_each_step_into_the_manifest(calibrated):
    content = band(calibrated)
    loss = content["metrics"]["loss"]
    assert loss["steps"] == list(range(20))
    # step 0 has no noise (the runs agree), later steps do, and the widths grow
    assert loss["below"][0] == loss["above"][0] == 0.0
    assert max(loss["below"][15:] + loss["above"][15:]) > 5 * max(loss["above"][1:4])
    lr = content["metrics"]["lr"]  # every run agreed: a band 0 wide, the rounding level
    assert lr["below"] == lr["above"] == [0.0] * 20 and lr["bias"]["bound"] > 0
    manifest = json.loads((calibrated.golden_dir("test_long") / "manifest.json").read_text())
    assert manifest["files"]["envelope.json"]["kind"] == "envelope"
    assert content["how"]["runs"] == 3 and "layout_metrics" not in content


def test_unchanged_code_replays_within_the_band(calibrated):
    result = calibrated.run()
    result.assert_outcomes(passed=1)
    # the band is looser than the defaults at its wide steps, and the summary says so
    assert "envelope.json (without it:" in result.stdout.str()


def test_a_bias_inside_the_widest_band_but_outside_the_early_steps_fails_at_the_first_step(
    calibrated,
):
    calibrated.set_values(scale=1.0008)  # 8e-4: passes the calibrated rtol of the widest step
    result = calibrated.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "first divergence at step 0: loss" in out
    row = calibrated.mismatch_row(result, "loss")
    assert row["step"] == "0" and "envelope (envelope.json)" in row["allowed"], row


def test_the_same_drift_at_a_wide_step_passes(calibrated):
    widths = band(calibrated)["metrics"]["loss"]
    wide = max(range(20), key=lambda s: max(widths["below"][s], widths["above"][s]))
    calibrated.set_values(shift_at={str(wide): 5e-4})
    calibrated.run().assert_outcomes(passed=1)


def test_without_the_envelope_the_calibrated_tolerance_passes_the_bias(calibrated):
    """The per-step tolerance alone (the widest step's spread x 2) misses the 5e-4 bias."""
    directory = calibrated.golden_dir("test_long")
    document = json.loads((directory / "tolerances.json").read_text())
    calibrate.write(directory, document, envelope=None)
    assert not (directory / "envelope.json").exists()
    calibrated.set_values(scale=1.0005)
    calibrated.run().assert_outcomes(passed=1)


def test_update_golden_keeps_the_envelope(calibrated):
    before = band(calibrated)
    calibrated.set_values(scale=1.01)
    calibrated.run("--update-golden").assert_outcomes(passed=1)
    assert band(calibrated)["metrics"] == before["metrics"]
    calibrated.run().assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"below": [1e300] * 20}, "metric 'loss' at step 0: width 1e+300 is beyond"),
        ({"above": ["nan"] * 20}, "metric 'loss' at step 0: a width must be a number"),
        ({"above": [-1.0] * 20}, "metric 'loss' at step 0: width -1 is beyond"),
        ({"steps": list(range(19, -1, -1))}, "steps must be increasing"),
        ({"steps": [0]}, "differ in length"),
    ],
)
def test_an_edited_band_fails_every_run_naming_file_metric_and_step(
    calibrated, edit, problem, capsys
):
    directory = calibrated.golden_dir("test_long")
    content = band(calibrated)
    content["metrics"]["loss"].update(edit)
    calibrate.write(directory, None, envelope=content)  # signed as calibration signs it
    calibrated.set_values(scale=3.0)  # must never pass on such a file
    result = calibrated.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "envelope.json" in out and problem in out and "--golden-calibrate N" in out, out
    capsys.readouterr()
    assert main(["verify", str(calibrated.golden)]) == 1
    assert problem in capsys.readouterr().out


def test_a_band_of_a_metric_never_recorded_is_refused(calibrated):
    directory = calibrated.golden_dir("test_long")
    content = band(calibrated)
    content["metrics"]["entropy"] = content["metrics"]["loss"]
    calibrate.write(directory, None, envelope=content)
    result = calibrated.run()
    result.assert_outcomes(failed=1)
    assert "metric 'entropy' was never recorded in this golden" in result.stdout.str()


def test_bit_identical_calibration_runs_get_a_band_at_the_rounding_level_and_the_bias_gate(
    project,
):
    """Runs that repeat the golden bit for bit still get a band (its rounding level, over the
    defaults) and the bias gate: a constant bias half the default rtol passes every step's
    tolerance, but its mean deviation over the steps is ~10x the bias bound."""
    project.write(LONG)
    project.set_values(noise=0.0)
    project.run().assert_outcomes(passed=1)
    result = project.run("--golden-calibrate", "3")
    out = result.stdout.str()
    assert (
        "same layout: loss, lr over 20 steps, from 3 runs (loss, lr: the runs repeated the "
        "golden bit for bit: a band at the rounding level, with the bias gate)"
    ) in out, out
    loss = band(project)["metrics"]["loss"]
    assert loss["below"] == loss["above"] == [0.0] * 20 and loss["distinct"] == [0] * 20
    assert loss["bias"]["bound"] == envelope.BIAS_FLOOR and loss["runs"] == 3
    project.run().assert_outcomes(passed=1)  # unchanged code: deviation 0
    project.set_values(noise=0.0, scale=1.00005)  # 5e-5: half the loss default rtol 1e-4
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "bias beyond its bound: loss bias 0.4601 > 0.05" in result.stdout.str()


def test_a_short_run_gets_no_envelope(project):
    project.write(LONG)
    project.set_values(steps=envelope.MIN_STEPS - 1)
    project.run().assert_outcomes(passed=1)
    result = project.run("--golden-calibrate", "3")
    assert "per-step envelope" not in result.stdout.str()
    assert not (project.golden_dir("test_long") / "envelope.json").exists()
    assert (project.golden_dir("test_long") / "tolerances.json").exists()


def test_a_recalibration_of_a_run_grown_short_removes_the_stale_envelope(calibrated):
    calibrated.set_values(steps=envelope.MIN_STEPS - 1)
    calibrated.run("--update-golden").assert_outcomes(passed=1)
    calibrated.run("--golden-calibrate", "3")
    assert not (calibrated.golden_dir("test_long") / "envelope.json").exists()


def test_a_tolerance_given_in_the_marker_overrides_the_band(calibrated):
    source = LONG.replace(
        "def test_long(golden):",
        '@pytest.mark.golden(tolerances={"loss": {"rtol": 1e-2, "atol": 0}})\n'
        "def test_long(golden):",
    ).replace("import torch", "import pytest, torch")
    calibrated.write(source)
    calibrated.set_values(scale=1.0005)
    result = calibrated.run()
    result.assert_outcomes(passed=1)


# Same-math variants of a 12-step run: each drifts from the reference by its own noise that
# grows with the step; "x1.001" is a bug among them (every value 1e-3 off). The noise is gone in
# float64 (golden.certifying), the bug is not.
VARIANTS = """
import json, math, pathlib
import pytest
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
DRIFT = {"mb8": 0.0, "mb4": 1.0, "mb2": -1.5, "mb1": 0.7, "mb16": -7.0, "x1.001": 0.0}


@pytest.mark.parametrize("v", same_math(V["variants"]))
def test_x(golden, v):
    if V.get("no_float64") and golden.certifying:
        raise RuntimeError("no float64 kernel")
    bug = 1.001 if v == "x1.001" else V.get("scale", 1.0)
    for step in range(12):
        noise = 1 + 5e-6 * step * DRIFT[v] * math.cos(step) * (not golden.certifying)
        golden.check({"loss": (2.0 + 0.1 * step) * noise * bug}, step=step)
"""


@pytest.mark.parametrize("oracle", [True, False], ids=["float64-oracle", "no-float64-kernel"])
def test_the_band_across_variants_leaves_out_a_bug_among_them_and_gates_every_variant(
    project, oracle
):
    """The bug is left out of the band: by the float64 oracle (not the same math), or where
    the test cannot run in float64, by the outlier rule."""
    project.write(VARIANTS)
    project.set_values(variants=["mb8", "mb4", "mb2", "mb1", "x1.001"], no_float64=not oracle)
    project.run().assert_outcomes(passed=4, failed=1)  # mb8 records; the bug fails
    result = project.run("--golden-calibrate", "3")
    out = result.stdout.str()
    if oracle:  # 5 oracle runs + 5 x 3; the bug fails in float64 and against the golden
        result.assert_outcomes(passed=16, failed=4)
        assert (
            "test_it.py::test_x[x1.001]: not the same math: loss differs by 1.0e-03 in float64 "
            "at step 0: left out of the variant lane on every value"
        ) in out
    else:  # the 5 oracle runs are skipped, saying why
        result.assert_outcomes(passed=12, failed=3, skipped=5)
        assert "test_it.py::test_x[x1.001]: not certified (its float64 run could not run: " in out
        assert "excluded from the variant lane (not same math?)" in out
    assert "across variants: loss over 12 steps, from 12 runs" in out, out
    # mb8 drifts not at all (the golden's own values), mb4, mb2 and mb1 each their own way
    assert "from 12 runs (3 distinct at the fewest step: margin x4.47; more distinct" in out
    content = json.loads((project.golden_dir("test_x[mb8]") / "envelope.json").read_text())
    loss = content["layout_metrics"]["loss"]
    assert loss["runs"] == 12  # x1.001 left out
    own = content["metrics"]["loss"]  # the reference's own runs agree: 0 wide, its rounding
    assert own["below"] == own["above"] == [0.0] * 12 and own["bias"]["bound"] > 0
    assert max(loss["below"] + loss["above"]) < 1e-3  # the bug's 2e-3 did not widen it
    result = project.run()
    result.assert_outcomes(passed=4, failed=1)
    row = project.mismatch_row(result, "loss")
    assert "envelope across variants (envelope.json)" in row["allowed"], row
    # a variant that moves by a bias inside the widest step but outside the early ones fails
    project.set_values(variants=["mb8", "mb4"], scale=1.0002, no_float64=not oracle)
    result = project.run()
    result.assert_outcomes(failed=2)
    assert "first divergence at step 0: loss" in result.stdout.str()


def test_a_variant_added_after_calibration_fails_with_a_note_naming_the_calibrated_tests(
    project,
):
    project.write(VARIANTS)
    project.set_values(variants=["mb8", "mb4", "mb2", "mb1"])
    project.run().assert_outcomes(passed=4)
    project.run("--golden-calibrate", "3").assert_outcomes(passed=16)  # 4 oracle runs + 4 x 3
    project.set_values(variants=["mb8", "mb4", "mb2", "mb1", "mb16"])  # mb16 drifts its own way
    result = project.run()
    result.assert_outcomes(passed=4, failed=1)
    notes = [line for line in result.outlines if "was not among the tests calibrated" in line]
    assert notes == [
        "note: test_it.py::test_x[mb16] was not among the tests calibrated in tolerances.json "
        "and envelope.json (test_it.py::test_x[mb1], test_it.py::test_x[mb2], "
        "test_it.py::test_x[mb4], test_it.py::test_x[mb8]): the spread across variants was "
        "measured without it, and a variant calibration never ran can stray further (in bf16 "
        "each variant's trajectory drifts its own way). If it computes the same math, "
        "calibrate it with the others: `pytest --golden-calibrate N` over every variant, this "
        "one included."
    ], result.stdout.str()
    # its calibration runs still fail against the lane measured without it, and measure it
    result = project.run("--golden-calibrate", "3")
    assert "across variants: loss over 12 steps, from 15 runs" in result.stdout.str()
    project.run().assert_outcomes(passed=5)


def test_a_band_only_the_reference_made_does_not_gate_variants(project):
    project.write(VARIANTS)
    project.set_values(variants=["mb8", "mb4"])
    project.run().assert_outcomes(passed=2)
    project.run("--golden-calibrate", "3", "-k", "mb8")
    # the reference alone replays bit for bit under every thread count: a band of its own at
    # the rounding level, none across variants
    content = json.loads((project.golden_dir("test_x[mb8]") / "envelope.json").read_text())
    assert set(content["metrics"]) == {"loss"} and "layout_metrics" not in content
    project.run().assert_outcomes(passed=2)


# Variants of a long run whose train-inference gap drifts away from the recorded rollouts
# (to 2.5x the recorded gap by the last step): no band can hold it. In float64 no variant drifts
# (golden.certifying): each computes the reference's gap.
DRIFTING = """
import json, pathlib
import pytest
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
DRIFT = {"mb8": 0.0, "mb4": 1.0, "mb2": 1.5}


@pytest.mark.parametrize("v", same_math(V["variants"]))
def test_x(golden, v):
    for step in range(12):
        drift = 0.0 if golden.certifying else DRIFT[v]
        gap = 0.011 * (1 + drift * step / 11) * V.get("gap_scale", 1.0)
        golden.check({"loss": 2.0 + 0.1 * step, "mismatch/abs_logprob_diff_mean": gap}, step=step)
"""


def test_a_value_the_variants_drift_away_from_is_not_comparable_across_variants(project):
    project.write(DRIFTING)
    project.set_values(variants=["mb8", "mb4", "mb2"])
    project.run().assert_outcomes(passed=1, failed=2)  # the defaults cannot hold the drift
    result = project.run("--golden-calibrate", "3")
    out = result.stdout.str()
    assert "not comparable across variants: mismatch/abs_logprob_diff_mean" in out, out
    content = json.loads((project.golden_dir("test_x[mb8]") / "envelope.json").read_text())
    assert content["layout_drifting"]["mismatch/abs_logprob_diff_mean"]["widest"] > 1
    result = project.run()
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "mismatch/abs_logprob_diff_mean" in out and "not comparable across variants" in out
    # the reference's own replay still compares it: a drift of its own fails
    project.set_values(variants=["mb8"], gap_scale=1.5)
    project.run().assert_outcomes(failed=1)


# A gap every variant grows by its own drift (as a bf16 variant's train-inference gap grows
# against the golden's rollouts), under a declared trend bound of 1.2; in float64 the drift is
# gone (golden.certifying): each grows as the reference, mb1. "bug" grows further, in float64 too.
TRENDING = """
import json, pathlib
import pytest
from pytest_rollout_golden import same_math

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())
GROWTH = {"mb1": 1.0, "mb2": 1.5, "mb4": 1.6, "mb8": 2.1}
BUG = {"bug": 2.5}


@pytest.mark.golden(trends={"gap": "growth<=1.2"})
@pytest.mark.parametrize("v", same_math(V["variants"]))
def test_x(golden, v):
    growth = BUG.get(v) or (GROWTH["mb1"] if golden.certifying else GROWTH[v])
    for step in range(20):
        golden.check({"gap": 0.01 * (1 + (growth - 1) * step / 19)}, step=step)
"""


def test_a_trend_bound_the_calibrated_variants_come_near_is_raised_on_replay(project):
    project.write(TRENDING)
    project.set_values(variants=["mb1", "mb2", "mb4"])
    result = project.run()
    result.assert_outcomes(passed=1, failed=2)  # before calibration the variants' drift fails
    assert "gap growth" in result.stdout.str()
    project.run("--golden-calibrate", "3")
    content = json.loads((project.golden_dir("test_x[mb1]") / "envelope.json").read_text())
    reached = content["layout_metrics"]["gap"]["trends"]["growth"]
    assert 1.5 < reached < 1.6  # mb4's, over the first and last 2 steps' means
    raised = f"{math.ceil(envelope.TREND_MARGIN * reached * 100) / 100:g}"  # 3 digits, up
    # a same-math variant calibration never ran, drifting a little further, passes
    project.set_values(variants=["mb1", "mb2", "mb4", "mb8"])
    result = project.run()
    result.assert_outcomes(passed=4)
    # the raised bound shows where the run passes, beside the other loosened gates
    looser = result.stdout.str().split("tolerances looser than the defaults")[1]
    assert f"test_x[mb8]: gap growth: <= {raised} from " in looser, looser
    assert "envelope.json (without it: <= 1.2)" in looser, looser
    # a growth beyond the raised bound fails, the bound's source saying why it was raised
    project.set_values(variants=["mb1", "bug"])
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert f"raised from 1.2 to {raised} on replay: 1.4 x the growth correct code's" in out, out


def gates_of(result) -> list[str]:
    """The summary's lines of the gates that apply to each long-run test."""
    lines = result.outlines
    start = lines.index("gates of long runs (10 steps or more):")
    found = []
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        found.append(line.strip())
    return found


def test_the_summary_says_which_gates_hold_each_long_run(project):
    project.write(LONG)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    result = project.run()
    assert gates_of(result) == [
        "test_it.py::test_long (20 steps): no band: loss, lr (no envelope.json: "
        "`pytest --golden-calibrate N` measures one); no bias gate; no trend bound; "
        "float64 certificate: none (not a calibrated variant)"
    ]
    project.run("--golden-calibrate", "3")
    result = project.run()
    result.assert_outcomes(passed=1)
    (line,) = gates_of(result)
    assert line.startswith(
        "test_it.py::test_long (20 steps): per-step band: loss, lr (envelope (envelope.json)); "
        "bias gate: loss <= 0."
    ), line
    assert ", lr <= 0.05; no trend bound; float64 certificate: none" in line, line


def test_the_gates_of_a_variant_name_its_lane_and_its_certificate(project):
    project.write(VARIANTS)
    project.set_values(variants=["mb8", "mb4", "mb2"])
    project.run().assert_outcomes(passed=3)
    project.run("--golden-calibrate", "3")
    result = project.run()
    result.assert_outcomes(passed=3)
    found = {line.split(" ")[0]: line for line in gates_of(result)}
    mb4 = found["test_it.py::test_x[mb4]"]
    assert "per-step band: loss (envelope across variants (envelope.json))" in mb4, mb4
    assert (
        "float64 certificate: certified (same math in float64; `pytest --golden-certify` in CI "
        "gates it in float64)"
    ) in mb4, mb4
    own = found["test_it.py::test_x[mb8]"]
    assert "per-step band: loss (envelope (envelope.json))" in own, own
    assert "float64 certificate: none (not a calibrated variant)" in own, own
    # a band given way by a tolerance above the envelope says so
    marker = '@pytest.mark.golden(tolerances={"loss": {"rtol": 1e-2, "atol": 0}})\n'
    source = VARIANTS.replace("@pytest.mark.parametrize", marker + "@pytest.mark.parametrize")
    project.write(source)
    (line, *_) = [x for x in gates_of(project.run()) if "test_x[mb8]" in x]
    assert "no band: loss (a tolerance given above the envelope decides)" in line, line
