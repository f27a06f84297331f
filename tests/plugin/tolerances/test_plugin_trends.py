"""Trend bounds through pytest: a metric that grows over a run fails, recording or replaying,
naming the statistic, the bound and its source; a flat one records and replays; the layers
(marker, --golden-trend, ini golden_trends) and the defaults' ten steps; the report."""

from __future__ import annotations

import json
import random

import pytest

from pytest_rollout_golden import Golden
from pytest_rollout_golden.errors import GoldenMismatch

GAP = "mismatch/abs_logprob_diff_mean"
DEFAULT = "default: a healthy run's train-inference gap stays flat (vime #64"

SOURCE = """
import pytest

MARKER = {}


@pytest.mark.golden(trends=MARKER or None)
def test_run(golden, values):
    for step, value in enumerate(values["trace"]):
        golden.check({values.get("name", "mismatch/abs_logprob_diff_mean"): value}, step=step)
"""


def vime(n=30):
    """vime #64: slime + SGLang's train-rollout |logprob diff|, 0.011 -> 0.036 in 30 steps."""
    return [0.011 + 0.025 * i / (n - 1) for i in range(n)]


def flat(n=30, seed=0):
    """The same gap, flat, with the per-step noise of a real run (10%)."""
    rng = random.Random(seed)
    return [0.011 * (1 + 0.1 * rng.gauss(0, 1)) for _ in range(n)]


def write(project, marker=None, **values):
    source = SOURCE if marker is None else SOURCE.replace("MARKER = {}", f"MARKER = {marker!r}")
    project.write(source)
    project.set_values(**values)


def trend_rows(path):
    document = json.loads(path.read_text())
    return [c for c in document["comparisons"] if c["kind"] == "trend"]


def test_a_growing_gap_fails_while_recording_naming_the_bound_and_its_source(project):
    write(project, trace=vime())
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"golden mismatch: trend beyond its bound: {GAP} growth 2.962 > 2; 1 of 31 checks" in out
    result.stdout.fnmatch_lines(
        [
            f"trend beyond its bound over steps 0-29: {GAP} growth = 2.962, bound growth <= 2 "
            f"({DEFAULT}*",
            "    mean 0.01186 over steps 0-2 -> 0.03514 over steps 27-29",
            "A trend bound holds whatever the golden says (--update-golden does not lift it)*",
        ]
    )
    assert "If the new values are right" not in out
    assert not (project.golden / "test_it").exists()  # nothing recorded
    project.run("--update-golden").assert_outcomes(failed=1)
    assert not (project.golden / "test_it").exists()


def test_check_mismatch_with_a_growing_gap_fails_on_its_recorded_metrics(project):
    """check_mismatch records the gap the defaults bound: a batch whose engine drifts 3.3x
    over 30 steps, each step within every absolute bound."""
    project.write(
        "import torch\n\n"
        "def test_run(golden, values):\n"
        "    train = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.8, -0.6]])\n"
        "    mask = torch.ones_like(train)\n"
        "    for step, shift in enumerate(values['trace']):\n"
        "        golden.check_mismatch(train, train + shift, mask, step=step)\n"
    )
    project.set_values(trace=[0.001 + 0.0023 * i / 29 for i in range(30)])
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    for name in ("abs_logprob_diff_mean", "abs_logprob_diff_seq_mean", "gen_kl_error"):
        assert f"bound over steps 0-29: mismatch/{name} growth = " in out
    assert "mismatch beyond its bound" not in out  # no absolute bound was exceeded
    project.set_values(trace=[0.001] * 30)
    project.run().assert_outcomes(passed=1)


def test_a_flat_gap_records_and_replays_and_replaying_a_grown_one_shows_the_recorded(project):
    write(project, trace=flat())
    project.run("--golden-report=r.json").assert_outcomes(passed=1)
    (row,) = trend_rows(project.path / "r.json")
    assert (row["metric"], row["verdict"], row["step"]) == (f"{GAP} growth", "pass", 29)
    assert 0.5 < row["actual"] < 2 and row["expected"] is None
    assert row["tolerance_source"].startswith(DEFAULT)
    project.run("--golden-strict").assert_outcomes(passed=1)
    project.set_values(trace=vime())
    result = project.run("--golden-tolerance", "mismatch/*:ignore", "--golden-report=r.json")
    result.assert_outcomes(failed=1)  # the values are not compared: the trend still is
    result.stdout.fnmatch_lines(["    mean 0.01186 over steps 0-2 -> *; recorded: growth 1.0*"])
    (row,) = trend_rows(project.path / "r.json")
    assert row["verdict"] == "fail" and 0.9 < row["expected"] < 1.1


def test_the_marker_overrides_the_default_and_its_source_shows(project):
    write(project, {GAP: "growth<=2.5"}, trace=vime())
    result = project.run()
    result.assert_outcomes(failed=1)
    assert "growth = 2.962, bound growth <= 2.5 (@pytest.mark.golden(trends=))" in (
        result.stdout.str()
    )
    write(project, {GAP: "growth<=4"}, trace=vime())
    project.run("--golden-report=r.json").assert_outcomes(passed=1)
    (row,) = trend_rows(project.path / "r.json")
    assert row["verdict"] == "pass" and row["tolerance_source"] == "@pytest.mark.golden(trends=)"
    assert row["actual"] == pytest.approx(2.9622, abs=1e-4)


def test_the_flag_switches_the_default_off_and_the_summary_lists_it(project):
    write(project, trace=vime())
    result = project.run("--golden-trend", f"{GAP}:growth<=inf")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "not compared (excluded on purpose):",
            f"    test_it.py::test_run: {GAP} growth<=inf (step 29; --golden-trend: bound "
            "switched off)",
        ]
    )


def test_a_run_under_ten_steps_is_untouched_by_the_defaults(project):
    write(project, trace=vime(9))
    result = project.run("--golden-report=r.json")
    result.assert_outcomes(passed=1)
    assert "growth" not in result.stdout.str()
    assert trend_rows(project.path / "r.json") == []


def test_a_declared_trend_on_a_short_run_says_why_it_was_not_compared(project):
    write(project, {"kl": ["growth<=2", "slope<=1"]}, trace=[0.1, 0.3], name="kl")
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "    test_it.py::test_run: kl growth (step 1; 2 steps, growth needs at least 4 (two "
            "windows of 2 steps)), kl slope (step 1; 2 steps, slope needs at least 3)*",
        ]
    )


def test_an_ini_line_bounds_any_metric_and_names_itself(project):
    project.pytester.makeini("[pytest]\ngolden_trends =\n    kl:slope<=0.01  # per step\n")
    write(project, trace=[0.1 + 0.02 * i for i in range(12)], name="kl")
    result = project.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["trend beyond its bound over steps 0-11: kl slope = 0.02, bound slope <= 0.01 "
         "(ini golden_trends)"]
    )  # fmt: skip


def test_a_nan_makes_the_trend_fail_naming_the_step(project):
    trace = flat(12)
    trace[5] = float("nan")
    write(project, {"kl": "growth<=2"}, trace=trace, name="kl")
    result = project.run("-W", "ignore::pytest_rollout_golden.GoldenNaNWarning")
    result.assert_outcomes(failed=1)
    assert (
        "kl growth = nan (nan at step 5: a NaN or inf value makes every trend NaN), bound"
        in result.stdout.str()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--golden-trend", "kl:growht<=2"), "*--golden-trend: 'growht' is not a trend statistic "
         "(did you mean 'growth'?)*"),
        (("--golden-trend", "kl<=2"), "*--golden-trend: 'kl<=2' is not of the form "
         "METRIC:STAT<=VALUE*"),
        (("--golden-trend", "kl:slope<=nan"), "*--golden-trend 'slope<=nan': a bound cannot be "
         "NaN*"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_a_usage_error_naming_it(project, args, message):
    write(project, trace=flat())
    result = project.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_bad_ini_line_is_a_usage_error_naming_it(project):
    project.pytester.makeini("[pytest]\ngolden_trends =\n    kl:growth=2\n")
    write(project, trace=flat())
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini golden_trends: 'kl:growth=2' is not of the form*"])


def test_a_marker_mistake_errors_the_test_with_the_fix(project):
    write(project, {"kl": "growth=2"}, trace=flat())
    result = project.run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.golden: @pytest.mark.golden(trends=) 'kl': 'growth=2' is not of the "
         "form STAT<=VALUE*"]
    )  # fmt: skip


def test_a_marker_name_no_metric_matches_is_listed(project):
    write(project, {"kll": "growth<=2"}, trace=[0.1] * 12, name="kl")
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["    test_it.py::test_run: kll growth (step 0; no metric this test checked is named "
         "'kll')"]
    )  # fmt: skip


def test_a_script_gives_its_own_trends_to_the_golden(tmp_path):
    failure = r"kl growth = 4, bound growth <= 3 \(Golden\(trends=\)\)"
    golden = Golden(tmp_path / "g", trends={"kl": "growth<=3"})
    with pytest.raises(GoldenMismatch, match=failure), golden:
        for step in range(12):
            golden.check({"kl": 1.0 if step < 6 else 4.0}, step=step)
    assert not (tmp_path / "g").exists()
    with pytest.raises(ValueError, match=r"^Golden\(trends=\) 'kl': 'growth' is not of the form"):
        Golden(tmp_path / "g", trends={"kl": "growth"})
