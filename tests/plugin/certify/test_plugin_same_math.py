"""Same-math variants of the user's own code through the plugin: same_math() params replay the
reference's golden at the built-in defaults, a metric profile keeps per-micro-batch means out
of the comparison across variants (and says so), machine metrics are never compared, and
``--golden-calibrate`` writes a variant lane with tensors."""

from __future__ import annotations

import json

import pytest

# A trainer whose micro-batch size reorders float32 sums: pg_loss, grad_norm and the log-probs
# move by ``noise`` (relative) per variant; pg_clipfrac is a per-micro-batch mean (verl), so
# it moves with the micro-batch size by definition; timing_s/* measures the machine.
GATE = """
import pytest
import torch
from pytest_rollout_golden import same_math


@pytest.mark.parametrize("micro", same_math([8, 4, 2], ids=lambda v: f"mb{v}"))
def test_actor(golden, values, micro):
    # reordering noise: gone in float64, as a real reordering's (~1e-15) would be (the 1e-3
    # bug below never runs in float64: no calibration there)
    noise = 0.0 if golden.certifying else values.get(f"mb{micro}", 0.0)
    lp = torch.tensor([[-9.0, -0.5, -2.0], [-4.0, -0.01, -6.0]]) * (1 + noise)
    for step, loss in enumerate([0.0413, -0.0009, 0.0216]):
        golden.check(
            {
                "actor/pg_loss": loss + 1e-6 * noise / 3e-5,
                "actor/grad_norm": 2.5 * (1 + noise),
                "actor/pg_clipfrac": 0.1 + 0.01 * (8 // micro - 1) + values.get("clip", 0.0),
                "timing_s/update_actor": 1.0 + micro + noise,
            },
            step=step,
        )
        golden.check_tensors("old_log_prob", {"log_probs": lp + step}, step=step)
"""
PROFILE = "[pytest]\ngolden_metric_profile = verl\n"


@pytest.fixture
def gate(project):
    project.pytester.makeini(PROFILE)
    project.write(GATE)
    project.set_values()
    result = project.run()
    result.assert_outcomes(passed=3)  # mb8 records, mb4 and mb2 replay it
    assert project.counts(result) == {"replayed": 2, "recorded": 1, "updated": 0, "failed": 0}
    return project


def test_same_math_noise_passes_and_per_micro_batch_means_are_reported_not_compared(gate):
    gate.set_values(mb4=3e-5, mb2=-3e-5)
    result = gate.run()
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert (
        "test_it.py::test_actor[mb4], test_it.py::test_actor[mb2]: actor/pg_clipfrac (steps 0-2; "
        "not comparable across variants: averaged per micro-batch (golden_metric_profile = verl))"
    ) in out
    assert "timing_s/update_actor (steps 0-2; golden_metric_profile = verl: never compared)" in out


def test_a_bug_of_1e_3_fails_in_a_variant_naming_the_metric_that_shows_it(gate):
    gate.set_values(mb4=1e-3)
    result = gate.run()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "golden mismatch: first divergence at step 0: actor/grad_norm *",
            "test_it.py::test_actor[mb4] against the golden of the reference [mb8]",
        ]
    )
    row = gate.mismatch_row(result, "actor/grad_norm")
    assert row["beyond"] == "10x"


def test_the_reference_still_compares_a_per_micro_batch_mean(gate):
    gate.set_values(clip=1 / 512)  # one token of 512 flips its clip state in every run
    result = gate.run()
    result.assert_outcomes(passed=2, failed=1)
    failed = [x for x in result.outlines if x.startswith("FAILED")]
    assert len(failed) == 1 and "test_actor[mb8]" in failed[0]
    assert gate.mismatch_row(result, "actor/pg_clipfrac")["allowed"] == (
        "rtol=0, atol=1e-07 (golden_metric_profile = verl)"
    )


def test_calibration_over_declared_variants_writes_a_variant_lane_with_tensors(gate):
    gate.set_values(mb4=2e-6, mb2=-4e-6)
    result = gate.run("--golden-calibrate", "2")
    result.assert_outcomes(passed=9)  # 3 oracle runs + 3 x 2
    written = json.loads((gate.golden_dir("test_actor[mb8]") / "tolerances.json").read_text())
    assert written["how"]["layouts"] == ["mb2", "mb4", "mb8"]
    lane = written["layout_tolerances"]
    # the tensor's distance to the golden relative to its recorded magnitude, largest at step
    # 2: |-9 * 4e-6| against max|lp + 2| = 7, times the margin 2
    assert lane["old_log_prob/log_probs"]["scale"] == "recorded"
    assert lane["old_log_prob/log_probs"]["rtol"] == pytest.approx(2 * 9 * 4e-6 / 7, rel=1e-2)
    assert lane["actor/grad_norm"]["rtol"] == pytest.approx(2 * 6e-6 / (1 + 2e-6), rel=1e-2)
    # a cancelling mean: its spread (2e-7 at every step) over its largest magnitude, 0.0413
    assert lane["actor/pg_loss"] == {"rtol": pytest.approx(2 * 2e-7 / 0.0413, rel=1e-2),
                                     "atol": 1e-8, "scale": "recorded"}  # fmt: skip
    # what a variant does not compare gets no entry, however far it moved
    assert "actor/pg_clipfrac" not in lane and "timing_s/update_actor" not in lane
    assert written["layout_spreads"]["actor/pg_clipfrac"]["kept"] == "not compared"
    assert "old_log_prob/log_probs" not in written["tolerances"]  # the reference's own: exact
    summary = "\n".join(result.outlines)
    assert "across variants  old_log_prob/log_probs" in summary
    assert summary.count("certified same math in float64 (identical in float64)") == 2

    gate.set_values(mb4=5e-5, mb2=-4e-6)  # inside the defaults, beyond the measured lane
    result = gate.run()
    result.assert_outcomes(passed=2, failed=1)
    row = gate.mismatch_row(result, "actor/grad_norm")
    assert row["allowed"].endswith("(calibrated variant lane (tolerances.json))")


def test_an_unknown_profile_stops_the_run_naming_the_known_ones(project):
    project.pytester.makeini("[pytest]\ngolden_metric_profile = verl2\n")
    project.write("def test_x(golden):\n    golden.check({'loss': 1.0})\n")
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "golden_metric_profile: unknown profile 'verl2'; use one of megatron, openrlhf, " in (
        result.stderr.str()
    )


def test_a_variant_left_out_of_calibration_fails_saying_it_was_not_calibrated(gate):
    gate.set_values(mb4=2e-6, mb2=-4e-6)
    result = gate.run("--golden-calibrate", "2", "-k", "mb8 or mb4")
    result.assert_outcomes(passed=6, deselected=1)  # 2 oracle runs + 2 x 2

    gate.set_values(mb4=2e-6, mb2=5e-5)  # inside the defaults, beyond the lane mb4 measured
    result = gate.run()
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert gate.mismatch_row(result, "actor/grad_norm")["allowed"].endswith(
        "(calibrated variant lane (tolerances.json))"
    )
    assert (
        "note: test_it.py::test_actor[mb2] was not among the tests calibrated in "
        "tolerances.json (test_it.py::test_actor[mb4], test_it.py::test_actor[mb8]): "
    ) in out
    assert "`pytest --golden-calibrate N` over every variant, this one included" in out

    gate.set_values(mb4=5e-5, mb2=2e-6)  # a calibrated variant fails without the note
    result = gate.run()
    result.assert_outcomes(passed=2, failed=1)
    assert "was not among the tests calibrated" not in result.stdout.str()
    assert "test_actor[mb4]" in "".join(x for x in result.outlines if x.startswith("FAILED"))


def test_a_lane_without_the_base_lanes_calibration_says_so_and_how_to_calibrate_it(project):
    """Calibrated tolerances are per lane: a second lane's variant fails where the base lane's
    passes, and its message names the lane, the calibration it lacks and the command."""
    project.pytester.makeini(PROFILE)
    project.write(GATE)
    project.set_values(mb4=1e-4, mb2=-3e-4)  # same-math noise beyond the defaults
    project.run("--golden-lane", "machine-a", "-k", "mb8").assert_outcomes(passed=1)
    project.run("--golden-calibrate", "2", "--golden-lane", "machine-a")
    project.run("--golden-strict", "--golden-lane", "machine-a").assert_outcomes(passed=3)

    project.run("--golden-lane", "machine-b", "-k", "mb8").assert_outcomes(passed=1)
    failed = project.run("--golden-strict", "--golden-lane", "machine-b")
    failed.assert_outcomes(passed=1, failed=2)
    failed.stdout.fnmatch_lines(
        [
            "note: lane 'machine-b' has no calibrated tolerances (tolerances.json) while the "
            "base lane 'machine-a' has: calibrate this lane on its hardware: "
            '`pytest --golden-calibrate N --golden-lane machine-b -k "test_actor"`*',
        ]
    )
