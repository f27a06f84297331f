"""``--golden-sensitivity``: record -> replay with the option -> each gated metric listed with
its minimum detectable effect; a planted gate that cannot fail is flagged, and
``--golden-sensitivity-require`` fails the session on it, then passes once it is fixed."""

from __future__ import annotations

import re

import pytest

SOURCE = """
import json
import pathlib

import pytest

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


@pytest.mark.golden(
    tolerances={"pg_loss": {"rtol": 1e-3, "atol": 0.0}, "grad_norm": {"rtol": 1e-4, "atol": 1e-6}},
    trends=V.get("trends"),
)
def test_train(golden):
    for step in range(V.get("steps", 3)):
        metrics = {"pg_loss": 0.5 + step, "grad_norm": 0.01 * (step + 1), "kl": 0.02 * (step + 1)}
        golden.check(metrics, step=step, tolerances=V.get("call"))
"""

# The allowance over the value, (atol + rtol * max(|v|, scale)) / |v|, at the first and the
# last step (0 and 2); the larger is the gate's effect.
EXPECTED = {
    "pg_loss": 1e-3,  # rtol alone: rtol
    "grad_norm": max((1e-6 + 1e-4 * 0.01) / 0.01, (1e-6 + 1e-4 * 0.03) / 0.03),  # 2e-4, step 0
    # kl's built-in family: rtol 1e-4 of its largest recorded magnitude (0.06), atol 5e-7
    "kl": max((5e-7 + 1e-4 * 0.06) / 0.02, (5e-7 + 1e-4 * 0.06) / 0.06),
}


def effects(out: str) -> dict[str, float]:
    """The effect each gate line of the summary prints (two digits)."""
    found = re.findall(r"^  (\S+)\s+(\d\.\de-\d\d)  steps? ", out, re.MULTILINE)
    return {name: float(effect) for name, effect in found}


def recorded(project, **values):
    project.write(SOURCE)
    project.set_values(**values)
    project.run().assert_outcomes(passed=1)
    return project


def test_every_gated_metric_is_listed_with_its_detectable_effect(project):
    recorded(project)
    result = project.run("--golden-sensitivity")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    out = result.stdout.str()
    assert "golden sensitivity" in out and "test_it.py::test_train (golden/" in out
    found = effects(out)
    assert found.keys() == EXPECTED.keys()
    for name, effect in EXPECTED.items():  # printed to two digits
        assert found[name] == pytest.approx(effect, rel=0.05), name
    assert "NEVER FAILS" not in out


def test_a_recording_run_probes_what_it_recorded(project):
    project.write(SOURCE)
    project.set_values()
    result = project.run("--golden-sensitivity")
    result.assert_outcomes(passed=1)
    found = effects(result.stdout.str())
    assert found["pg_loss"] == pytest.approx(1e-3, rel=0.05)


def test_the_tolerance_of_the_call_is_the_one_probed(project):
    """check(tolerances=) reaches only the comparison of that call: probed as replay applied it."""
    recorded(project)
    project.set_values(call={"pg_loss": {"rtol": 1e-2, "atol": 0.0}})
    result = project.run("--golden-sensitivity")
    assert effects(result.stdout.str())["pg_loss"] == pytest.approx(1e-2, rel=0.05)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--golden-ignore", "kl"), "  kl * NEVER FAILS: not compared (--golden-ignore)"),
        (
            ("--golden-tolerance", "kl:rtol=0,atol=100"),
            "  kl * NEVER FAILS: no change up to 10x the value fails at step 0 "
            "(rtol=0, atol=100, *",
        ),
    ],
    ids=["ignored", "huge-atol"],
)
def test_a_planted_gate_that_cannot_fail_is_flagged_and_fails_the_floor(project, args, flag):
    recorded(project)
    result = project.run("--golden-sensitivity", *args)
    result.assert_outcomes(passed=1)
    assert result.ret == 0  # listed, not judged, without a floor
    result.stdout.fnmatch_lines([flag])
    result = project.run("--golden-sensitivity-require", "1e-3", *args)
    result.assert_outcomes(passed=1)  # the tests passed; the session fails
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "FAILED --golden-sensitivity-require 0.001: 1 gate(s) cannot detect a relative "
            "change of 0.001",
            "  test_it.py::test_train: kl never fails: *",
        ]
    )
    fixed = project.run("--golden-sensitivity-require", "1e-3")  # the plant removed
    assert fixed.ret == 0
    fixed.stdout.fnmatch_lines(
        ["every gate detects a relative change of 0.001 (--golden-sensitivity-require)"]
    )


def test_a_gate_too_loose_for_the_ini_floor_fails_naming_its_effect(project):
    recorded(project)
    project.pytester.makeini("[pytest]\ngolden_sensitivity_require = 1e-4\n")
    result = project.run()
    assert result.ret == 1
    out = result.stdout.str()
    assert "FAILED ini golden_sensitivity_require 0.0001: 3 gate(s)" in out
    assert "  test_it.py::test_train: pg_loss detects 1.0e-03" in out


def test_a_trend_bound_above_what_the_metric_reaches_is_flagged(project):
    recorded(project, steps=12, trends={"kl": "growth<=1000"})
    out = project.run("--golden-sensitivity").stdout.str()
    assert "kl growth  NEVER FAILS: the bound <= 1000 is above what a change of up to 10x" in out
    recorded(project, steps=12, trends={"kl": "growth<=8"})
    out = project.run("--golden-sensitivity").stdout.str()
    # growth 0.2 / 0.03 (means of the last and first 2 of 12 steps): the last window must
    # grow by 8 / (0.23 / 0.03) - 1 before the bound fails
    line = next(x for x in out.splitlines() if x.startswith("  kl growth"))
    assert float(line.split()[2]) == pytest.approx(8 / (0.23 / 0.03) - 1, rel=0.05)


@pytest.mark.parametrize("value", ["0", "abc", "11", "nan"])
def test_a_floor_that_is_no_relative_change_is_a_usage_error(project, value):
    project.write(SOURCE)
    result = project.run(f"--golden-sensitivity-require={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--golden-sensitivity-require must be a relative change in (0, 10], *{value!r}*"]
    )


def test_xdist_workers_hand_their_gates_to_the_controller(project):
    recorded(project)
    result = project.run_subprocess(
        "-n", "2", "--golden-sensitivity-require=1e-3", "--golden-ignore=kl"
    )
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "  grad_norm *2.0e-04  steps 0 (2.0e-04), 2 (1.3e-04): *",
            "  kl * NEVER FAILS: not compared (--golden-ignore)",
            "  test_it.py::test_train: kl never fails: not compared (--golden-ignore)",
        ]
    )


def test_show_prints_the_gates_under_the_project_ini(project):
    """``rollout-golden show`` probes the golden with the project's ini layers: an ini
    exclusion is flagged there too (the marker's tolerances are pytest's alone)."""
    import subprocess
    import sys

    recorded(project)
    project.pytester.makeini("[pytest]\ngolden_ignore =\n    kl\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_rollout_golden", "show", "golden/test_it/test_train"],
        cwd=project.path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("sensitivity ("))
    gates = lines[start + 1 :]
    assert gates[1].split()[:2] == ["kl", "NEVER"]
    assert gates[1].endswith("not compared (ini golden_ignore)")
    # the built-in default, not the marker's rtol 1e-3: rtol 1e-4 of the largest recorded
    # value (2.5) over the value at step 0 (0.5)
    assert gates[2].split()[:2] == ["pg_loss", "5.0e-04"]


TENSORS = """
import json
import pathlib

import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


def test_forward(golden):
    log_probs = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -8.0, -0.25]], dtype=torch.float64)
    mask = torch.tensor(V.get("mask", [[1, 1, 0], [1, 0, 0]]))
    for step in range(3):
        golden.check_tensors("fwd", {"log_probs": log_probs * (step + 1)}, step=step, mask=mask)
"""


def test_tensors_are_probed_where_their_mask_selects(project):
    """log_probs' built-in family: rtol 1e-4 of the largest compared magnitude, atol 1e-6.
    The mask leaves -4.0 and -8.0 out, so the scale is 2 at step 0 (6 at step 2); scaled
    together, the selected element whose allowance is the smallest share of it fails first,
    -2.0 at step 0 (-6.0 at step 2)."""
    project.write(TENSORS)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    out = project.run("--golden-sensitivity").stdout.str()
    step0, step2 = (1e-6 + 1e-4 * 2.0) / 2.0, (1e-6 + 1e-4 * 6.0) / 6.0
    assert effects(out)["fwd/log_probs"] == pytest.approx(max(step0, step2), rel=0.05)


def test_a_mask_that_selects_nothing_is_flagged(project):
    project.write(TENSORS)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.set_values(mask=[[0, 0, 0], [0, 0, 0]])
    result = project.run("--golden-sensitivity-require=1e-3")
    result.assert_outcomes(failed=1)  # nothing compared is no pass
    result.stdout.fnmatch_lines(
        [
            "  fwd/log_probs  NEVER FAILS: its mask at step 0 selects none of its 6 positions: "
            "no change of a value reaches the comparison *",
            "FAILED --golden-sensitivity-require 0.001: 1 gate(s) *",
        ]
    )


def test_an_envelope_band_is_the_tolerance_probed_at_its_step(project):
    """A long run calibrated with noise far above its value: at the last step the band replay
    applies (envelope.json) lets the value move by more than itself, which the gate reports;
    at step 0 the runs agreed and the band is at rounding level."""
    from test_plugin_envelope import LONG

    project.write(LONG)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    project.run("--golden-calibrate", "3")
    result = project.run("--golden-sensitivity-require=1e-3")
    out = result.stdout.str()
    line = next(x for x in out.splitlines() if x.startswith("  loss "))
    at = re.search(r"steps 0 \((\S+)\), 19 \((\S+)\): at 0 .*; at 19 (.*)", line)
    assert at is not None, line
    assert float(at[1]) < 1e-3 < float(at[2])  # the runs spread apart as the steps go on
    assert "atol from envelope (envelope.json)" in at[3]
    assert result.ret == 1 and "test_it.py::test_long: loss detects" in out, out


MISMATCH = """
import json
import pathlib

import torch

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


def test_gap(golden):
    train = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.8, -0.6]], dtype=torch.float64)
    for step in range(2):
        engine = train + 0.0005 * (step + 1)
        golden.check_mismatch(train, engine, torch.ones_like(train), step=step, bounds=V["bounds"])
"""


def test_an_absolute_mismatch_bound_reports_the_growth_it_fails_on(project):
    """abs_logprob_diff_mean is 5e-4 at step 0 and 1e-3 at step 1: under a bound of 2e-3 it
    must double at step 0 to fail, grow by 100% at step 1; a bound of 1 is 1000x the gap."""
    project.write(MISMATCH)
    project.set_values(bounds={"abs_logprob_diff_mean": 2e-3})
    project.run().assert_outcomes(passed=1)
    out = project.run("--golden-sensitivity").stdout.str()
    line = next(x for x in out.splitlines() if x.startswith("  mismatch/abs_logprob_diff_mean<="))
    assert line.split()[1] == "3.0e+00"  # 2e-3 / 5e-4 - 1, at step 0 (1.0e+00 at step 1)
    project.set_values(bounds={"abs_logprob_diff_mean": 1.0})
    result = project.run("--golden-sensitivity-require=1e-3")
    result.stdout.fnmatch_lines(
        ["  mismatch/abs_logprob_diff_mean<=1 * NEVER FAILS: no change up to 10x the value *"]
    )
    # a ceiling for gross failures is listed, not held to the floor; the gate of a metric
    # whose tolerance swamps its value is: gen_kl_error ~1e-7 under atol 2e-5
    below = result.stdout.str().partition("FAILED --golden-sensitivity-require")[2]
    assert "test_gap: mismatch/gen_kl_error never fails" in below
    assert "<=" not in below
    assert result.ret == 1
