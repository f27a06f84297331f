"""Tolerances through pytest: precedence, NaN and infinities, unused tolerances, exact lane."""

from __future__ import annotations

import json
import math
import re

import pytest

# One metric, checked with tolerances taken from values.json: "marker" feeds
# @pytest.mark.golden(tolerances=), "check" golden.check(tolerances=) as Tolerance objects.
ONE_METRIC = """
import json
import pathlib

import pytest
import torch

from pytest_rollout_golden import Tolerance

V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())


def as_value(v):
    v = float(v)  # "nan", "inf" and "-inf" arrive as strings
    return torch.tensor(v, dtype=getattr(torch, V["dtype"])) if V.get("dtype") else v


@pytest.mark.golden(exact=V.get("exact", False), tolerances=V.get("marker", {}))
def test_metric(golden):
    check = {k: Tolerance(**t) for k, t in V.get("check", {}).items()} or None
    golden.check({V.get("name", "grad_norm"): as_value(V["value"])}, tolerances=check)
"""


def record_then_replay(project, recorded, replayed, *args, **values):
    """Record ``recorded``, replay ``replayed`` (both under ``values``); the replay's result."""
    project.write(ONE_METRIC)
    project.set_values(value=recorded, **values)
    project.run(*args).assert_outcomes(passed=1)
    project.set_values(value=replayed, **values)
    return project.run(*args)


INI = "[pytest]\ngolden_tolerances =\n    grad_norm:rtol=1e-2,atol=0\n    other:rtol=0.5\n"


# grad_norm drifts from 1.0 to 1.001 (relative 1e-3). Each case adds one layer
# above the previous one, and each added layer flips the verdict.
@pytest.mark.parametrize(
    ("layers", "passes", "deciding_rtol"),
    [
        ("built-in", False, 1e-4),
        ("ini", True, None),
        ("ini cli", False, 1e-4),
        ("ini cli marker", True, None),
        ("ini cli marker check", False, 1e-4),
    ],
)
def test_precedence_check_over_marker_over_cli_over_ini_over_builtin(
    project, layers, passes, deciding_rtol
):
    if "ini" in layers:
        project.pytester.makeini(INI)
    args = ("--golden-tolerance", "grad_norm:rtol=1e-4,atol=0") if "cli" in layers else ()
    values = {}
    if "marker" in layers:
        values["marker"] = {"grad_norm": {"rtol": 1e-2, "atol": 0.0}}
    if "check" in layers:
        values["check"] = {"grad_norm": {"rtol": 1e-4, "atol": 0.0}}
    result = record_then_replay(project, 1.0, 1.001, *args, **values)
    if passes:
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(failed=1)
    row = project.mismatch_row(result, "grad_norm")
    rtol = float(re.search(r"rtol=([-+.\deE]+)", row["allowed"]).group(1))
    assert rtol == deciding_rtol


def test_a_marker_giving_only_rtol_keeps_the_builtin_atol_and_says_where_each_came_from(project):
    """A lone rtol used to mean atol=0: pg_loss 0 -> 5e-9 failed. Now atol is the built-in 1e-8."""
    marker = {"pg_loss": {"rtol": 1e-3}}
    record_then_replay(project, 0.0, 5e-9, name="pg_loss", marker=marker).assert_outcomes(passed=1)
    project.set_values(value=1.01, name="pg_loss", marker=marker)
    result = project.run()
    result.assert_outcomes(failed=1)
    assert project.mismatch_row(result, "pg_loss")["allowed"] == (
        "rtol=0.001, atol=1e-08, scale=recorded 0 "
        "(rtol from @pytest.mark.golden(tolerances=); atol and scale from built-in default)"
    )


# A metric is a Python float whatever precision computed it: a name no family claims gets the
# training-value default (rtol 1e-4 of its recorded magnitude) unless its dtype is coarser.
@pytest.mark.parametrize(
    ("dtype", "replayed", "passes"),
    [
        (None, 1 + 4e-5, True),  # a Python float: not held to float64's 1e-7
        (None, 1 + 1e-3, False),
        ("float32", 1 + 2**-20, True),
        ("float32", 1 + 1e-3, False),
        ("bfloat16", 1 + 2**-7, True),  # bfloat16: torch.testing's rtol=1.6e-2 is looser
        ("int64", 2.0, False),  # integers compare exactly
    ],
)
def test_unknown_metric_gets_the_training_default_or_its_dtypes_if_looser(
    project, dtype, replayed, passes
):
    result = record_then_replay(project, 1.0, replayed, name="my_metric", dtype=dtype)
    result.assert_outcomes(**({"passed": 1} if passes else {"failed": 1}))


def test_builtin_defaults_catch_a_relative_change_of_1e_3(project):
    project.write(
        """
        def test_rl(golden, values):
            golden.check({k: v * (1 + values["drift"]) for k, v in values["metrics"].items()})
        """
    )
    metrics = {"pg_loss": 0.73, "kl": 0.0123, "grad_norm": 4.2, "actor/pg_loss": 0.73}
    project.set_values(metrics=metrics, drift=0.0)
    project.run().assert_outcomes(passed=1)
    project.set_values(metrics=metrics, drift=3e-5)  # same-math float32 noise passes
    project.run().assert_outcomes(passed=1)
    project.set_values(metrics=metrics, drift=1e-3)
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["golden mismatch: *4 of 4 checks failed*"])


def test_a_cancelling_mean_is_measured_against_its_magnitude_over_the_recorded_steps(project):
    """A GRPO loss is a mean of +-1 terms that cancel to ~0.01: at a step where it lies near 0,
    reordering noise of 1e-6 absolute reads as 1e-3 relative to that step's value. Measured
    against the loss's largest recorded magnitude it passes; a drift of 1e-3 at every step
    still fails, at the steps where the loss is large."""
    project.write(
        """
        def test_rl(golden, values):
            for step, loss in enumerate(values["losses"]):
                noisy = loss * (1 + values["rel"]) + values["abs"]
                golden.check({"pg_loss": noisy}, step=step)
        """
    )
    losses = [0.0413, -0.0009, 0.0216]
    project.set_values(losses=losses, rel=0.0, abs=0.0)
    project.run().assert_outcomes(passed=1)
    project.set_values(losses=losses, rel=0.0, abs=1e-6)  # 1.1e-3 relative at step 1
    project.run().assert_outcomes(passed=1)
    project.set_values(losses=losses, rel=1e-3, abs=0.0)
    result = project.run()
    result.assert_outcomes(failed=1)
    row = project.mismatch_row(result, "pg_loss")
    assert row["step"] == "0"
    assert row["allowed"] == "rtol=0.0001, atol=1e-08, scale=recorded 0.0413 (built-in default)"


@pytest.mark.parametrize(
    ("recorded", "replayed", "tolerance", "passes"),
    [
        ("nan", "nan", {"rtol": 1e-3}, False),
        ("nan", "nan", {"rtol": 1e-3, "equal_nan": True}, True),
        ("nan", 1.0, {"rtol": 1e-3, "equal_nan": True}, False),
        (1.0, "nan", {"rtol": 1e-3, "equal_nan": True}, False),
        ("inf", "inf", {"rtol": 1e-3}, True),
        ("inf", "-inf", {"rtol": 1e-3}, False),
        ("inf", 1e308, {"rtol": 1e-3}, False),
        (1e308, "inf", {"rtol": 1e-3}, False),
    ],
)
def test_nan_and_infinities(project, recorded, replayed, tolerance, passes):
    result = record_then_replay(
        project, recorded, replayed, name="x", marker={"x": {"atol": 0.0, **tolerance}}
    )
    if passes:
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(failed=1)
    row = project.mismatch_row(result, "x")
    shown = float(row["expected"]), float(row["actual"])
    assert repr(shown) == repr((float(recorded), float(replayed)))  # repr: nan equals nan


def test_nan_is_written_explicitly_in_metrics_json(project):
    project.write(ONE_METRIC)
    for value in ("nan", "inf", "-inf"):
        project.set_values(value=value, name="x")
        project.run("--update-golden").assert_outcomes(passed=1)
        text = (project.golden_dir("test_metric") / "metrics.json").read_text()
        assert json.loads(text)["steps"]["0"]["x"] == value
        assert "NaN" not in text and "Infinity" not in text


# ----------------------------------------------------------------- unused tolerances


def test_tolerance_for_a_metric_that_never_appears_warns(project):
    args = ("--golden-tolerance", "gradnorm:rtol=1", "--golden-tolerance", "grad_norm:rtol=1")
    result = record_then_replay(
        project,
        1.0,
        1.0,
        *args,
        marker={"pg_los": {"rtol": 1}, "grad_norm": {"rtol": 1}},
        check={"klx": {"rtol": 1}, "grad_norm": {"rtol": 1}},
    )
    result.assert_outcomes(passed=1, warnings=2)
    out = result.stdout.str()
    assert re.search(r"GoldenToleranceWarning: .*golden\.check\(tolerances=\).*'klx'", out)
    assert re.search(r"GoldenToleranceWarning: .*mark\.golden\(tolerances=\).*'pg_los'", out)
    result.stdout.fnmatch_lines(
        [
            "tolerances that matched no metric:",
            "    --golden-tolerance 'gradnorm' (did you mean 'grad_norm'?)",
        ]
    )
    warned = out.split("warnings summary")[1].split("rollout golden")[0]
    assert "'grad_norm'" not in warned, "a tolerance that matched must not warn"


def test_shadowed_and_exact_lane_tolerances_of_checked_metrics_do_not_warn(project):
    """The metric exists: a higher layer or the exact lane decided, but the name did match."""
    project.pytester.makeini("[pytest]\ngolden_tolerances = grad_norm:rtol=1e-2\n")
    args = ("--golden-tolerance", "grad_norm:rtol=1e-3", "--golden-exact")
    result = record_then_replay(
        project, 1.0, 1.0, *args, marker={"grad_norm": {"rtol": 1}}, check={"grad_norm": {}}
    )
    result.assert_outcomes(passed=1, warnings=0)
    assert "matched no metric" not in result.stdout.str()


def test_bad_tolerance_spec_is_a_usage_error(project):
    project.write(ONE_METRIC)
    result = project.run("--golden-tolerance", "grad_norm=1e-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--golden-tolerance*METRIC:rtol=R,atol=A*"])


# ----------------------------------------------------------------- exact lane

ULP = math.nextafter(0.1, 1.0)


@pytest.mark.parametrize(
    ("how", "passes"), [("off", True), ("marker", False), ("--golden-exact", False)]
)
def test_exact_lane_fails_a_one_ulp_change(project, how, passes):
    args = ("--golden-exact",) if how == "--golden-exact" else ()
    result = record_then_replay(project, 0.1, ULP, *args, name="my_metric", exact=how == "marker")
    if passes:
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(failed=1)
    row = project.mismatch_row(result, "my_metric")
    assert row["allowed"] == "bit-exact"
    assert float(row["expected"]) == 0.1 and float(row["actual"]) == ULP
    assert row["expected"] != row["actual"], "the table must show the two values apart"


def test_exact_lane_tells_signed_zeros_apart(project):
    result = record_then_replay(project, 0.0, -0.0, name="my_metric")
    result.assert_outcomes(passed=1)
    result = record_then_replay(project, 0.0, -0.0, name="my_metric", exact=True)
    result.assert_outcomes(failed=1)


def test_exact_lane_is_not_applied_under_another_environment(project):
    record_then_replay(project, 0.1, 0.1, name="my_metric", exact=True).assert_outcomes(passed=1)
    manifest_path = project.golden_dir("test_metric") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["fingerprint"]["torch"] = "0.0.1"
    manifest_path.write_text(json.dumps(manifest))

    project.set_values(value=ULP, name="my_metric", exact=True)
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "replayed under another environment than recorded (exact lane not applied):",
            "    test_it.py::test_metric: torch: 0.0.1 -> *",
        ]
    )
    # The tolerance lanes still apply there: a real drift fails.
    project.set_values(value=0.2, name="my_metric", exact=True)
    project.run().assert_outcomes(failed=1)


def test_bad_marker_tolerance_names_the_marker_and_metric(project):
    project.write(
        """
        import pytest


        @pytest.mark.golden(tolerances={"kl": 1e-3})
        def test_metric(golden):
            golden.check({"kl": 0.5})
        """
    )
    result = project.run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.golden(tolerances=) 'kl': expected a Tolerance or a dict, got float*"]
    )


def test_an_unknown_marker_option_errors_its_test(project):
    project.write(
        """
        import pytest


        @pytest.mark.golden(tolerance={"kl": {"rtol": 1}})
        def test_metric(golden):
            golden.check({"kl": 0.5})
        """
    )
    result = project.run()
    result.assert_outcomes(errors=1)
    assert "@pytest.mark.golden: unknown option tolerance=" in result.stdout.str()
