"""Trend bounds over a run (``tolerance/trends.py``): the statistics on exact series, their
windows and undefined cases, the spec grammar, and how the layers combine."""

from __future__ import annotations

import math
import random

import pytest

from pytest_rollout_golden._internal.tolerance.mismatch_bounds import Bound
from pytest_rollout_golden._internal.tolerance.trends import (
    DEFAULT_SOURCE,
    MIN_STEPS,
    TrendBounds,
    evaluate,
    growth,
    layer,
    parse_line,
    parse_spec,
    session_trends,
    slope,
    window,
)

GAP = "mismatch/abs_logprob_diff_mean"


def numbers(values, name=GAP, steps=None):
    """``{step: {name: (value, dtype)}}``, as ``metric_codec.numbers`` gives a run's metrics."""
    steps = range(len(values)) if steps is None else steps
    return {str(s): {name: (v, "float64")} for s, v in zip(steps, values, strict=True)}


def vime(n=30, first=0.011, last=0.036):
    """vime #64: slime + SGLang's train-rollout |logprob diff|, 0.011 -> 0.036 in 30 steps."""
    return [first + (last - first) * i / (n - 1) for i in range(n)]


def verdicts(found):
    return {(c.metric, c.statistic): c.verdict for c in found}


# --------------------------------------------------------------------------- statistics


def test_the_vime_trace_grows_3x_and_fails_the_default_bound():
    trace = vime()
    trend = growth(list(enumerate(trace)))
    first, last = sum(trace[:3]) / 3, sum(trace[-3:]) / 3
    assert trend.value == pytest.approx(last / first, rel=1e-12)
    assert trend.value > 2.9
    assert trend.windows == (((0, 1, 2), pytest.approx(first)), ((27, 28, 29), pytest.approx(last)))
    (check,) = evaluate(numbers(trace), TrendBounds())
    assert (check.metric, check.statistic, check.verdict) == (GAP, "growth", "fail")
    assert check.bound == Bound(2.0, DEFAULT_SOURCE)
    assert "vime #64" in DEFAULT_SOURCE and "verl #7519" in DEFAULT_SOURCE


def test_a_flat_trace_with_ten_percent_noise_passes_over_200_seeds():
    grown = []
    for seed in range(200):
        rng = random.Random(seed)
        trace = [0.011 * (1 + 0.1 * rng.gauss(0, 1)) for _ in range(30)]
        (check,) = evaluate(numbers(trace), TrendBounds())
        assert check.verdict == "pass", (seed, check.trend.value)
        grown.append(check.trend.value)
    assert max(grown) > 1.1 and min(grown) < 0.9  # the noise shows, and stays within 2x
    assert max(grown) < 1.5


@pytest.mark.parametrize(("n", "w"), [(3, 2), (10, 2), (20, 2), (21, 3), (30, 3), (100, 10)])
def test_the_window_is_a_tenth_of_the_run_and_at_least_two_steps(n, w):
    assert window(n) == w


def test_steps_are_sorted_by_number_and_the_windows_are_the_first_and_last_steps():
    # string order would put step 10 before step 2
    values = {s: 1.0 for s in range(12)} | {10: 4.0, 11: 4.0}
    run = numbers(list(values.values()), steps=list(values))
    run = dict(sorted(run.items()))  # "0", "1", "10", "11", "2", ...
    (check,) = evaluate(run, session_trends({GAP: "growth<=2"}, (), ()))
    assert check.steps == tuple(range(12))
    assert check.trend.windows[0][0] == (0, 1) and check.trend.windows[1] == ((10, 11), 4.0)
    assert check.trend.value == 4.0 and check.verdict == "fail"


def test_slope_is_the_least_squares_slope_per_step_in_the_metrics_units():
    steps = list(range(0, 20, 2))
    trend = slope([(s, 0.5 + 0.01 * s) for s in steps])
    assert trend.value == pytest.approx(0.01, rel=1e-12)
    noisy = slope([(0, 1.0), (1, 3.0), (2, 2.0), (3, 4.0)])  # least squares: 0.8
    assert noisy.value == pytest.approx(0.8, rel=1e-12)
    assert slope([(0, 1.0), (1, 2.0)]).value is None
    assert "2 steps, slope needs at least 3" in slope([(0, 1.0), (1, 2.0)]).why


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([0.1, 0.2, 0.3], "3 steps, growth needs at least 4 (two windows of 2 steps)"),
        ([0.0, 0.0, 0.1, 0.2], "the first window's mean (steps 0-1) is 0, not above 0"),
        ([-0.1, -0.2, 0.1, 0.2], "the first window's mean (steps 0-1) is -0.15, not above 0"),
        ([1e-9, 1e-9, 0.01, 0.02], "rounding level"),
        ([1e-13, 1e-13, 1e-13, 1e-13], "rounding level"),
    ],
)
def test_growth_is_undefined_where_it_means_nothing_and_says_why(values, why):
    trend = growth(list(enumerate(values)))
    assert trend.value is None and why in trend.why
    (check,) = evaluate(numbers(values, "kl"), session_trends({"kl": "growth<=2"}, (), ()))
    assert check.verdict == "undefined"


def test_the_rounding_level_is_relative_to_the_series_and_absolute_below_1e_12():
    assert growth(list(enumerate([5e-10, 5e-10, 1e-3, 1e-3]))).value is None  # < 1e-6 x 1e-3
    assert growth(list(enumerate([2e-9, 2e-9, 1e-3, 1e-3]))).value == pytest.approx(5e5)
    assert growth(list(enumerate([2e-12, 2e-12, 4e-12, 4e-12]))).value == pytest.approx(2)
    assert growth(list(enumerate([5e-13, 5e-13, 5e-13, 5e-13]))).value is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_inf_value_makes_every_statistic_nan_naming_the_step(bad):
    values = [0.011] * 12
    values[7] = bad
    for statistic in (growth, slope):
        trend = statistic(list(enumerate(values)))
        assert math.isnan(trend.value) and "at step 7" in trend.why
    bounds = session_trends({"kl": ["growth<=2", "slope<=1"]}, (), ())
    assert set(verdicts(evaluate(numbers(values, "kl"), bounds)).values()) == {"fail"}


# --------------------------------------------------------------------------- grammar


def test_specs_parse_and_name_their_mistakes():
    assert parse_spec("growth<=2", "x") == ("growth", 2.0)
    assert parse_spec(" slope <= 1e-3 ", "x") == ("slope", 1e-3)
    assert parse_spec("growth<=inf", "x") == ("growth", math.inf)
    assert parse_line("mismatch/k3_kl:growth<=3", "cli") == ("mismatch/k3_kl", "growth", 3.0)
    assert parse_line("a:b:slope<=0", "cli") == ("a:b", "slope", 0.0)
    with pytest.raises(ValueError, match=r"^--golden-trend: 'growht' .*did you mean 'growth'"):
        parse_line("kl:growht<=2", "--golden-trend")
    with pytest.raises(ValueError, match=r"is not of the form METRIC:STAT<=VALUE"):
        parse_line("kl growth<=2", "ini golden_trends")
    with pytest.raises(ValueError, match=r"is not of the form STAT<=VALUE"):
        parse_spec("growth=2", "@pytest.mark.golden(trends=) 'kl'")
    with pytest.raises(ValueError, match=r"'growth<=nan'.*cannot be NaN"):
        parse_line("kl:growth<=nan", "--golden-trend")
    with pytest.raises(ValueError, match=r"cannot be -inf"):
        parse_spec("slope<=-inf", "x")
    with pytest.raises(ValueError, match=r"'growth<=small'.*not a number"):
        parse_spec("growth<=small", "x")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"kl": 2.0}, "'kl': takes 'growth<=2', 'slope<=0.001' or a list of them, got 2.0"),
        ({"kl": [True]}, "'kl': takes 'growth<=2', 'slope<=0.001' or a list of them, got [True]"),
        ({3: "growth<=2"}, "metric names must be non-empty strings, got 3"),
        ({"": "growth<=2"}, "metric names must be non-empty strings, got ''"),
        ({"kl": "ratio<=2"}, "'ratio' is not a trend statistic; the statistics are growth, slope"),
        (["kl:growth<=2"], "must be a dict {metric: 'growth<=2' or a list of specs}"),
    ],
)
def test_a_marker_mistake_names_the_source_and_the_fix(entries, message):
    with pytest.raises(ValueError, match=r"^@pytest.mark.golden\(trends=\)") as exc:
        session_trends(entries, (), ())
    assert message in str(exc.value)


def test_ini_lines_skip_blanks_and_comments():
    entries = layer(["", "# a comment", "kl:growth<=3  # after 3 steps", "kl:slope<=1"], "ini")
    assert entries == {"growth": {"kl": Bound(3.0, "ini")}, "slope": {"kl": Bound(1.0, "ini")}}


# --------------------------------------------------------------------------- layers


def test_layers_stack_marker_over_cli_over_ini_over_defaults_per_metric_and_statistic():
    bounds = session_trends(
        {GAP: "growth<=4", "kl": ["slope<=0.5"]},
        ["kl:slope<=0.2", "kl:growth<=3", "mismatch/*:growth<=inf"],
        ["kl:growth<=1.5", "kl:slope<=0.1", "pg_loss:slope<=0"],
    )
    assert bounds.bound(GAP, "growth") == Bound(4.0, "@pytest.mark.golden(trends=)")
    assert bounds.bound("kl", "slope") == Bound(0.5, "@pytest.mark.golden(trends=)")
    assert bounds.bound("kl", "growth") == Bound(3.0, "--golden-trend")
    assert bounds.bound("pg_loss", "slope") == Bound(0.0, "ini golden_trends")
    assert bounds.bound("pg_loss", "growth") is None
    # the flag's glob wins over the defaults, the marker's exact name over the flag's glob
    assert bounds.bound("mismatch/k3_kl", "growth") == Bound(math.inf, "--golden-trend")
    assert bounds.bound("mismatch/k3_kl", "growth").off
    assert TrendBounds().bound("mismatch/k3_kl", "growth") == Bound(2.0, DEFAULT_SOURCE)
    # within a layer an exact name wins over a glob; a last path component matches too
    inner = session_trends({"mismatch/*": "growth<=5", "mismatch/k3_kl": "growth<=6"}, (), ())
    assert inner.bound("mismatch/k3_kl", "growth").value == 6.0
    assert inner.bound("mismatch/gen_kl_error", "growth").value == 5.0
    assert session_trends({"kl": "growth<=7"}, (), ()).bound("actor/kl", "growth").value == 7.0


def test_the_defaults_need_ten_steps_and_a_declared_trend_says_why_it_was_not_compared():
    short = vime(MIN_STEPS - 1)
    assert evaluate(numbers(short), TrendBounds()) == []
    assert verdicts(evaluate(numbers(vime(MIN_STEPS)), TrendBounds())) == {(GAP, "growth"): "fail"}
    declared = session_trends(None, [f"{GAP}:growth<=2"], ())
    assert verdicts(evaluate(numbers(short), declared)) == {(GAP, "growth"): "fail"}
    (check,) = evaluate(numbers(vime(3)), declared)
    assert check.verdict == "undefined"
    assert check.trend.why == "3 steps, growth needs at least 4 (two windows of 2 steps)"


def test_the_default_growth_gates_the_metrics_check_mismatch_records():
    gated = {"abs_logprob_diff_mean", "abs_logprob_diff_seq_mean", "gen_kl_error"}
    gated |= {"policy_kl_error", "k3_kl"}
    for name in gated:
        assert TrendBounds().bound(f"mismatch/{name}", "growth") == Bound(2.0, DEFAULT_SOURCE)
    assert TrendBounds().bound("mismatch/abs_logprob_diff_max", "growth") is None
    assert TrendBounds().bound("pg_loss", "growth") is None
    assert TrendBounds().bound(GAP, "slope") is None


def test_inf_switches_a_bound_off_and_the_check_says_so():
    bounds = session_trends({GAP: "growth<=inf"}, (), ())
    (check,) = evaluate(numbers(vime()), bounds)
    assert check.verdict == "off" and check.bound.source == "@pytest.mark.golden(trends=)"


def test_a_test_declared_name_no_metric_matches_is_listed_not_silently_dropped():
    bounds = session_trends({"kll": "growth<=2", "kl": "growth<=2"}, ["other:slope<=1"], ())
    found = evaluate(numbers([0.1] * 12, "kl"), bounds)
    assert verdicts(found) == {("kl", "growth"): "pass", ("kll", "growth"): "undefined"}
    unmatched = next(c for c in found if c.metric == "kll")
    assert unmatched.trend.why == "no metric this test checked is named 'kll'"
    assert unmatched.steps == ()


def test_replaying_computes_the_recorded_statistic_too():
    recorded = numbers([0.011] * 30)
    (check,) = evaluate(numbers(vime()), TrendBounds(), recorded)
    assert check.verdict == "fail"
    assert check.recorded is not None and check.recorded.value == pytest.approx(1.0)
    (fresh,) = evaluate(numbers(vime()), TrendBounds())
    assert fresh.recorded is None


def test_the_call_layer_stands_above_the_plugin_layers():
    plugin = session_trends(None, ["kl:growth<=3"], ())
    call = plugin.above(layer({"kl": "growth<=9"}, "Golden(trends=)"))
    assert call.bound("kl", "growth") == Bound(9.0, "Golden(trends=)")
    assert call.bound(GAP, "growth") == Bound(2.0, DEFAULT_SOURCE)
