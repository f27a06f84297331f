"""Per-step envelopes (``envelope.py``): bands built from runs, their allowances, and the
validator every reader applies."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from pytest_rollout_golden._internal.tolerance import envelope
from pytest_rollout_golden._internal.tolerance.envelope import Band
from pytest_rollout_golden._internal.tolerance.mismatch_bounds import Bound
from pytest_rollout_golden._internal.tolerance.spec import IGNORE, Tolerance
from pytest_rollout_golden.errors import GoldenFormatError


def numbers(values: list[float], name: str = "loss", dtype: str = "float32") -> dict:
    return {str(s): {name: (v, dtype)} for s, v in enumerate(values)}


GOLDEN = [1.0 + 0.1 * s for s in range(12)]


def run(offsets: list[float]) -> dict:
    return numbers([g + d for g, d in zip(GOLDEN, offsets, strict=True)])


DEFAULT = Tolerance(rtol=1e-4, atol=1e-8, scale="recorded")


def build(runs, **kw):
    kw.setdefault("base", lambda name, dtype: DEFAULT)
    kw.setdefault("magnitude", lambda name: max(GOLDEN))
    return envelope.bands(numbers(GOLDEN), [(r, ()) for r in runs], **kw)


def test_a_band_is_how_far_the_lowest_and_highest_run_lay_from_the_golden():
    a = run([0.0] * 6 + [1e-3] * 6)
    b = run([0.0] * 6 + [-2e-3] * 6)
    found, refused, _ = build([a, b])
    loss = found["loss"]
    assert refused == {} and loss["runs"] == 2
    assert loss["steps"] == list(range(12))
    # rounded up to 3 digits: 1.6 - 0.002 - 1.6 is 0.0020000000000000018 -> 0.00201
    assert loss["below"] == pytest.approx([0.0] * 6 + [2e-3] * 6, rel=1e-2)
    assert loss["above"] == pytest.approx([0.0] * 6 + [1e-3] * 6, rel=1e-2)
    assert all(w >= 2e-3 for w in loss["below"][6:])


def test_widths_are_rounded_up_to_three_digits_never_down():
    found, _, _ = build([run([1.23456e-4] * 12)])
    width = found["loss"]["above"][0]
    assert width >= 1.23456e-4 - 1e-18 and width <= 1.24e-4 + 1e-18
    assert len(repr(width)) <= 10


def test_runs_that_all_agree_get_a_band_0_wide_with_the_bias_gate():
    """Bit-identical runs: each step allows the rounding level (over the defaults, as every
    band), and a replay's mean deviation is held to the bias floor."""
    found, refused, _ = build([run([0.0] * 12), run([0.0] * 12)])
    loss = found["loss"]
    assert refused == {} and loss["below"] == loss["above"] == [0.0] * 12
    assert loss["distinct"] == [0] * 12 and loss["bias"]["bound"] == envelope.BIAS_FLOOR
    assert envelope.problem(loss, "loss", 2.0) == ""
    band = envelope._band(loss, 2.0)
    floor = envelope.DTYPE_FLOOR * envelope.EPS[loss["dtype"]] * 2.0
    assert list(band.allowances().values()) == pytest.approx([floor] * 12)


def test_no_band_where_the_run_is_short_or_not_compared():
    short = envelope.bands(
        numbers(GOLDEN[: envelope.MIN_STEPS - 1]),
        [(numbers([g + 1e-3 for g in GOLDEN[: envelope.MIN_STEPS - 1]]), ())],
        base=lambda n, d: DEFAULT,
        magnitude=lambda n: 2.0,
    )
    assert short == ({}, {}, {})
    assert build([run([1e-3] * 12)], base=lambda n, d: IGNORE)[0] == {}


def test_a_run_left_out_for_a_metric_does_not_widen_its_band():
    good, bug = run([1e-4] * 12), run([0.5] * 12)
    found, _, _ = envelope.bands(
        numbers(GOLDEN),
        [(good, ()), (bug, ("loss",))],
        base=lambda n, d: DEFAULT,
        magnitude=lambda n: 2.1,
    )
    assert max(found["loss"]["above"]) < 2e-4 and found["loss"]["runs"] == 1


def test_a_band_wider_than_the_cap_is_refused_with_why():
    found, refused, drifting = build([run([0.0] * 11 + [2.5])])
    assert found == {}
    # wider than the value itself: across variants, a value the runs drift away from
    assert drifting["loss"]["widest"] == pytest.approx(2.5 / max(GOLDEN), rel=1e-2)
    assert (
        "metric 'loss' at step 11: width 2.5 is beyond what envelope.json may hold"
        in (refused["loss"])
    )


def test_the_allowance_takes_the_widest_neighbour_and_the_dtype_floor():
    steps = tuple(range(10))
    above = tuple(1e-3 if s == 1 else 0.0 for s in steps)
    band = Band(steps, (0.0,) * 10, above, "float32", 2.0)
    floor = envelope.DTYPE_FLOOR * 2**-23 * 2.0
    allowed = band.allowances()
    reach = 1 + envelope.SMOOTH  # the last step whose window holds step 1
    for step in range(1, reach + 1):
        assert allowed[step] == pytest.approx(envelope.MARGIN * 1e-3 + floor)
    assert allowed[reach + 1] == pytest.approx(floor)


@pytest.mark.parametrize("first", [0, 1, 7])
def test_the_first_recorded_step_is_held_to_its_own_width(first):
    # Every run starts from the same weights: at the first step they differ by reduction
    # order alone, so the wider steps after it must not widen its allowance.
    steps = tuple(range(first, first + 10))
    above = (1e-9, 1e-3, 2e-3) + (3e-3,) * 7
    band = Band(steps, (0.0,) * 10, above, "float32", 2.0)
    floor = envelope.DTYPE_FLOOR * 2**-23 * 2.0
    allowed = band.allowances()
    assert allowed[first] == pytest.approx(envelope.MARGIN * 1e-9 + floor)
    assert allowed[first + 1] == pytest.approx(envelope.MARGIN * 3e-3 + floor)


def test_the_layer_of_a_step_matches_whole_names_only():
    env = envelope.Envelope({"actor/loss": Band((0,), (1e-3,), (1e-3,), "float32", 1.0)})
    layer = env.layer(0)
    assert layer is not None and layer.match("actor/loss").atol > 2e-3
    assert layer.match("loss") is None and layer.match("critic/actor/loss") is None
    assert env.layer(1) is None


def enough(name: str) -> int:
    """Every metric recorded at as many steps as an envelope needs."""
    return envelope.MIN_STEPS


def document(**entry) -> dict:
    base = {"steps": [0, 1], "below": [0.0, 1e-3], "above": [1e-3, 0.0], "dtype": "float32"}
    return envelope.document({"same layout": {"loss": {**base, **entry}}}, {})


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"below": [0.0, 1.5]}, "metric 'loss' at step 1: width 1.5 is beyond"),
        ({"below": [0.0, -1e-3]}, "metric 'loss' at step 1: width -0.001 is beyond"),
        ({"below": [0.0, True]}, "metric 'loss' at step 1: a width must be a number"),
        ({"steps": [1, 0]}, "steps must be increasing"),
        ({"steps": [0, 0]}, "steps must be increasing"),
        ({"steps": [0, -1]}, "steps must be integers >= 0"),
        ({"steps": [0]}, "differ in length"),
        ({"above": "wide"}, "must be lists"),
    ],
)
def test_reading_refuses_what_calibration_never_writes(entry, problem):
    with pytest.raises(GoldenFormatError) as info:
        envelope.read(
            document(**entry),
            Path("g/envelope.json"),
            magnitude=lambda n: 1.0,
            recorded_steps=enough,
        )
    text = str(info.value)
    assert text.startswith("g/envelope.json: ") and problem in text
    assert "pytest --golden-calibrate N" in text and "--update-golden" in text


def test_reading_refuses_another_format_and_an_unrecorded_metric():
    with pytest.raises(GoldenFormatError, match="not an envelope file"):
        envelope.read(
            {"format": "x"}, Path("e.json"), magnitude=lambda n: 1.0, recorded_steps=enough
        )
    with pytest.raises(GoldenFormatError, match="'loss' was never recorded"):
        envelope.read(document(), Path("e.json"), magnitude=lambda n: None, recorded_steps=enough)


def test_a_variant_uses_the_band_across_variants_and_the_reference_its_own():
    own = document()
    assert envelope.read(own, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough) is not None
    assert (
        envelope.read(
            own, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough, layout_variant=True
        )
        is None
    )
    wide = {"steps": [0, 1], "below": [0.0, 0.1], "above": [0.1, 0.0], "dtype": "float32"}
    both = {**own, "layout_metrics": {"loss": wide}}
    found = envelope.read(
        both, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough, layout_variant=True
    )
    assert found is not None and found.source == envelope.VARIANT_SOURCE
    assert math.isclose(found.layer(1).match("loss").atol, 0.2 + 4 * 2**-23, rel_tol=1e-9)
    mine = envelope.read(both, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough)
    assert math.isclose(mine.layer(1).match("loss").atol, 2e-3 + 4 * 2**-23, rel_tol=1e-9)


def test_a_lanes_envelope_names_its_own_file_and_is_still_known_for_a_band():
    wide = {"steps": [0, 1], "below": [0.0, 0.1], "above": [0.1, 0.0], "dtype": "float32"}
    both = {**document(), "layout_metrics": {"loss": wide}, "layout_drifting": {}}
    path = Path("g/@lanes/machine-b/envelope.json")
    own = envelope.read(both, path, magnitude=lambda n: 1.0, recorded_steps=enough)
    across = envelope.read(
        both, path, magnitude=lambda n: 1.0, recorded_steps=enough, layout_variant=True
    )
    assert own.source == "envelope (@lanes/machine-b/envelope.json)"
    assert across.source == "envelope across variants (@lanes/machine-b/envelope.json)"
    assert envelope.band_source(own.source) == envelope.SOURCE
    assert envelope.band_source(f"rtol from x; atol from {across.source}") == (
        envelope.VARIANT_SOURCE
    )
    assert envelope.band_source("calibrated (@lanes/machine-b/tolerances.json)") is None


def test_a_bad_entry_in_either_lane_is_refused():
    bad = {"steps": [0], "below": [1.5], "above": [0.0]}
    with pytest.raises(GoldenFormatError, match=r"width 1\.5 is beyond"):
        envelope.read(
            {**document(), "layout_metrics": {"loss": bad}},
            Path("e"),
            magnitude=lambda n: 1.0,
            recorded_steps=enough,
        )


def test_values_variants_drift_away_from_are_not_comparable_across_variants_only():
    drifting = {"loss": {"widest": 2.3, "trends": {"growth": 3.1}}}
    content = {**document(), "layout_metrics": {}, envelope.DRIFTING: drifting}
    mine = envelope.read(content, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough)
    assert mine.drifting_layer() is None  # the reference's own lane compares it
    theirs = envelope.read(
        content, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough, layout_variant=True
    )
    layer = theirs.drifting_layer()
    assert layer.match("loss").ignore and layer.source == envelope.DRIFTING_SOURCE
    assert theirs.reached("loss", "growth") == 3.1


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"widest": 0.5}, "is not beyond 1x the metric"),
        ({"widest": "wide"}, "is not beyond 1x the metric"),
        ({"widest": 2.0, "trends": {"growth": "x"}}, "is not what calibration writes"),
    ],
)
def test_an_edited_not_comparable_entry_is_refused(entry, problem):
    content = {**document(), "layout_metrics": {}, envelope.DRIFTING: {"loss": entry}}
    with pytest.raises(GoldenFormatError, match=problem):
        envelope.read(content, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough)


WIDE = {"steps": [0, 1], "below": [0.0, 0.1], "above": [0.1, 0.0], "dtype": "float32"}


@pytest.mark.parametrize(
    ("sections", "steps", "problem"),
    [
        (
            {"layout_metrics": {}},
            envelope.MIN_STEPS - 1,
            "metric 'loss' not comparable across variants: recorded at 9 steps, and calibration "
            "writes an envelope only for metrics of 10 steps or more",
        ),
        ({}, envelope.MIN_STEPS, "without the across-variants lane ('layout_metrics')"),
        (
            {"layout_metrics": {"loss": WIDE}},
            envelope.MIN_STEPS,
            "it also has a band across variants ('layout_metrics'), and calibration gives a "
            "metric one or the other",
        ),
    ],
    ids=["too-few-steps", "no-across-variants-lane", "also-a-band"],
)
def test_a_not_comparable_entry_calibration_could_not_have_measured_is_refused(
    sections, steps, problem
):
    # calibration lists a metric there only from the across-variants lane it measured, in
    # place of a band there, over MIN_STEPS recorded steps or more (bands(), _envelope())
    content = {**document(), **sections, envelope.DRIFTING: {"loss": {"widest": 5.0}}}
    with pytest.raises(GoldenFormatError) as info:
        envelope.read(
            content, Path("g/e.json"), magnitude=lambda n: 1.0, recorded_steps=lambda n: steps
        )
    text = str(info.value)
    assert text.startswith("g/e.json: ") and problem in text, text
    assert "so this file was edited; re-run `pytest --golden-calibrate N`" in text


@pytest.mark.parametrize(("widest", "ok"), [(0.416, True), (0.0, False), (-1.0, False)])
def test_a_value_the_golden_holds_at_zero_drifts_by_any_amount_above_zero(widest, ok):
    # its widest is in units in the last place (envelope._unit), not of the value: a move
    # of 1 in 77 in a bfloat16 fraction is 0.416 of them, and calibration lists it
    content = {**document(), "layout_metrics": {}, envelope.DRIFTING: {"zero": {"widest": widest}}}
    mags = {"loss": 1.0, "zero": 0.0}
    read = functools.partial(envelope.read, content, Path("e"), magnitude=mags.get)
    if ok:
        found = read(recorded_steps=enough, layout_variant=True)
        assert found.drifting_layer().match("zero").ignore
    else:
        with pytest.raises(GoldenFormatError, match=f"straying {widest!r} is not beyond 0:"):
            read(recorded_steps=enough)


# ----------------------------------------------------------- margins by distinct runs


def exceedance(m: float, k: int) -> float:
    """``P(|Z| > m max(|Z_1|, ..., |Z_k|))`` for iid standard normals, by the trapezoid rule
    over ``|Z|`` (its density beyond 12 is below 1e-31)."""
    n, top = 24_000, 12.0
    h = top / n
    total = 0.0
    for i in range(n + 1):
        z = i * h
        inside = math.erf(z / (m * math.sqrt(2))) ** k
        total += (
            math.sqrt(2 / math.pi) * math.exp(-z * z / 2) * inside * (0.5 if i in (0, n) else 1)
        )
    return total * h


def test_each_margin_gives_the_next_run_the_chance_eight_runs_give_it():
    target = exceedance(envelope.MARGIN, 8)
    assert target == pytest.approx(8.28e-3, rel=1e-3)
    for k, m in enumerate(envelope.MARGINS, start=1):
        assert exceedance(m, k) == pytest.approx(target, rel=1e-2), k
    assert list(envelope.MARGINS) == sorted(envelope.MARGINS, reverse=True)
    assert min(envelope.MARGINS) > envelope.MARGIN
    assert envelope.margin(len(envelope.MARGINS) + 1) == envelope.margin(50) == envelope.MARGIN


FLOOR = envelope.DTYPE_FLOOR * 2**-23 * 2.0  # float32, magnitude 2


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 30])
def test_a_band_of_fewer_distinct_runs_allows_more(k):
    steps = tuple(range(10))
    band = Band(
        steps, (0.0,) * 10, (1e-6,) + (1e-3,) * 9, "float32", 2.0, runs=k, distinct=(k,) * 10
    )
    allowed = band.allowances()
    assert allowed[0] == pytest.approx(envelope.margin(k) * 1e-6 + FLOOR)  # its own width
    assert allowed[5] == pytest.approx(envelope.margin(k) * 1e-3 + FLOOR)
    assert band.margins() == [envelope.margin(k)] * 10


def test_the_margin_takes_the_fewest_distinct_runs_in_the_window_and_skips_steps_of_none():
    distinct = (3, 2, 2, 2, 2, 2, 1, 0, 2, 2, 2, 2, 2, 2)
    band = Band(
        tuple(range(14)), (1e-3,) * 14, (1e-3,) * 14, "float32", 2.0, runs=3, distinct=distinct
    )
    margins = band.margins()
    reach = range(6 - envelope.SMOOTH, 6 + envelope.SMOOTH + 1)  # windows holding step 6
    for step, found in enumerate(margins):
        if step == 0:  # the first step: its own count
            assert found == envelope.MARGINS[2]
        elif step in reach:
            assert found == envelope.MARGINS[0]
        else:
            assert found == envelope.MARGINS[1]


def test_a_file_without_the_counts_keeps_the_margin_of_many_runs():
    band = Band(tuple(range(10)), (0.0,) * 10, (1e-3,) * 10, "float32", 2.0)
    assert band.margins() == [envelope.MARGIN] * 10


def test_a_small_samples_margin_stops_where_the_widest_band_a_file_may_hold_would():
    widths = (0.5,) * 10
    band = Band(tuple(range(10)), (0.0,) * 10, widths, "float32", 2.0, runs=1, distinct=(1,) * 10)
    # 76.9 x 0.5 capped at MARGIN x the widest band allowed (1 x the magnitude, 2.0)
    assert band.allowances()[5] == pytest.approx(envelope.MARGIN * 2.0 + FLOOR)


def test_the_distinct_count_is_of_values_other_than_the_golden():
    a = run([0.0] * 6 + [1e-3] * 6)
    same = run([0.0] * 6 + [1e-3] * 6)  # repeats a, as a bf16 run at other threads does
    b = run([0.0] * 9 + [-2e-3] * 3)
    found, _, _ = build([a, same, b])
    assert found["loss"]["distinct"] == [0] * 6 + [1] * 3 + [2] * 3
    assert found["loss"]["runs"] == 3


@pytest.mark.parametrize(
    ("distinct", "problem"),
    [
        ([1], "'distinct' must be a list as long as 'steps'"),
        ("2", "'distinct' must be a list as long as 'steps'"),
        ([1, -1], "at step 1: -1 distinct runs"),
        ([1, 1.5], "at step 1: 1.5 distinct runs"),
        ([1, True], "at step 1: True distinct runs"),
        ([1, 4], "at step 1: 4 distinct runs of 3"),
        ([0, 1], "at step 0: a band of width > 0 from 0 distinct runs"),
    ],
)
def test_reading_refuses_distinct_counts_calibration_never_writes(distinct, problem):
    content = document(distinct=distinct, runs=3)
    with pytest.raises(GoldenFormatError, match=problem):
        envelope.read(content, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough)


# ------------------------------------------------------------------ trends on replay


def trend_envelope(reached: float) -> envelope.Envelope:
    content = document(trends={"growth": reached})
    return envelope.read(content, Path("e"), magnitude=lambda n: 1.0, recorded_steps=enough)


def test_a_trend_bound_the_runs_come_near_is_raised_to_the_margin_over_theirs():
    assert trend_envelope(1.8).raised_trend_bound("loss", "growth", 2.0) == 2.52
    assert trend_envelope(1.2).raised_trend_bound("loss", "growth", 2.0) is None  # 1.68 < 2
    assert trend_envelope(1.8).raised_trend_bound("kl", "growth", 2.0) is None  # no band
    assert trend_envelope(9.0).raised_trend_bound("loss", "growth", math.inf) is None  # off


@pytest.mark.parametrize(("growth", "verdict"), [(2.4, "PASS"), (2.6, "FAIL")])
def test_a_replayed_trend_is_held_to_the_raised_bound(growth, verdict):
    from pytest_rollout_golden._internal.golden.checks import trend_comparison
    from pytest_rollout_golden._internal.tolerance import trends

    values = [1.0] * 5 + [growth] * 5 + [growth] * 2
    run_numbers = {str(s): {"loss": (v, "float32")} for s, v in enumerate(values)}
    bounds = trends.TrendBounds().above({"growth": {"loss": Bound(2.0, "--golden-trend")}})
    (check,) = [c for c in trends.evaluate(run_numbers, bounds) if c.statistic == "growth"]
    assert check.verdict == "fail"  # beyond the bound as declared
    found = trend_comparison(check, trend_envelope(1.8))
    assert found.verdict.name == verdict and found.bound == pytest.approx(2.52)
    assert found.tolerance_source.startswith(
        "--golden-trend; raised from 2 to 2.52 on replay: 1.4 x the growth correct code's "
        "calibration runs reach against the recorded rollouts (1.8, envelope (envelope.json))"
    )


def test_the_bias_bound_of_few_distinct_runs_takes_their_margin():
    steps = {s: 1.0 for s in range(12)}
    golden = numbers(GOLDEN)
    one = run([0.01] * 12)  # mean deviation +0.01 of the band
    many = [run([0.01 * (-1) ** i * (1 + i / 10)] * 12) for i in range(8)]
    alone = envelope.bias_bound("loss", golden, [run([0.02] * 12)], steps)
    assert alone["bound"] is None and "x 76.9 (for 1 distinct runs)" in alone["why"]
    assert envelope.bias_bound("loss", golden, [one], steps)["bound"] == 0.77  # 0.769 up
    found = envelope.bias_bound("loss", golden, [one, one, run([-0.005] * 12)], steps)
    assert found["bound"] == pytest.approx(envelope.MARGINS[1] * 0.01, rel=1e-2)  # 2 distinct
    largest = max(abs(0.01 * (1 + i / 10)) for i in range(8))
    found = envelope.bias_bound("loss", golden, many, steps)
    assert found["bound"] == pytest.approx(envelope.BIAS_MARGIN * largest, rel=1e-2)


def test_a_value_the_golden_leaves_at_zero_that_variants_move_is_drifting():
    # a fraction of tokens correct code leaves at 0 and a variant moves to 1 in 77
    zeros = numbers([0.0] * 12, "outside")
    moved = numbers([0.0] * 10 + [1 / 77, 0.0], "outside")
    found, refused, drifting = envelope.bands(
        zeros, [(moved, ())], base=lambda name, dtype: DEFAULT, magnitude=lambda name: 0.0
    )
    assert found == {} and "outside" in refused
    unit = envelope.DTYPE_FLOOR * 2**-23
    assert drifting["outside"]["widest"] == pytest.approx((1 / 77) / unit, rel=1e-2)
    content = {**document(), envelope.DRIFTING: drifting}
    mags = {"loss": 1.0, "outside": 0.0}
    both = {**content, "layout_metrics": {}}  # calibration writes both lanes it measured
    theirs = envelope.read(
        both, Path("e"), magnitude=mags.get, recorded_steps=enough, layout_variant=True
    )
    assert theirs.drifting_layer().match("outside").ignore


def test_the_summary_counts_long_runs_from_the_envelope_s_minimum():
    from pytest_rollout_golden._internal.report import gates

    assert gates.MIN_STEPS == envelope.MIN_STEPS
