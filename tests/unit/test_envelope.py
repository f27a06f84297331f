"""Per-step envelopes (``envelope.py``): bands built from runs, their allowances, and the
validator every reader applies."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_rollout_golden._internal.tolerance import envelope
from pytest_rollout_golden._internal.tolerance.envelope import Band
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


def test_no_band_where_every_run_agrees_or_the_run_is_short_or_not_compared():
    assert build([run([0.0] * 12)])[0] == {}
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
        envelope.read(document(**entry), Path("g/envelope.json"), magnitude=lambda n: 1.0)
    text = str(info.value)
    assert text.startswith("g/envelope.json: ") and problem in text
    assert "pytest --golden-calibrate N" in text and "--update-golden" in text


def test_reading_refuses_another_format_and_an_unrecorded_metric():
    with pytest.raises(GoldenFormatError, match="not an envelope file"):
        envelope.read({"format": "x"}, Path("e.json"), magnitude=lambda n: 1.0)
    with pytest.raises(GoldenFormatError, match="'loss' was never recorded"):
        envelope.read(document(), Path("e.json"), magnitude=lambda n: None)


def test_a_variant_uses_the_band_across_variants_and_the_reference_its_own():
    own = document()
    assert envelope.read(own, Path("e"), magnitude=lambda n: 1.0) is not None
    assert envelope.read(own, Path("e"), magnitude=lambda n: 1.0, layout_variant=True) is None
    wide = {"steps": [0, 1], "below": [0.0, 0.1], "above": [0.1, 0.0], "dtype": "float32"}
    both = {**own, "layout_metrics": {"loss": wide}}
    found = envelope.read(both, Path("e"), magnitude=lambda n: 1.0, layout_variant=True)
    assert found is not None and found.source == envelope.VARIANT_SOURCE
    assert math.isclose(found.layer(1).match("loss").atol, 0.2 + 4 * 2**-23, rel_tol=1e-9)
    mine = envelope.read(both, Path("e"), magnitude=lambda n: 1.0)
    assert math.isclose(mine.layer(1).match("loss").atol, 2e-3 + 4 * 2**-23, rel_tol=1e-9)


def test_a_bad_entry_in_either_lane_is_refused():
    bad = {"steps": [0], "below": [1.5], "above": [0.0]}
    with pytest.raises(GoldenFormatError, match=r"width 1\.5 is beyond"):
        envelope.read(
            {**document(), "layout_metrics": {"loss": bad}}, Path("e"), magnitude=lambda n: 1.0
        )


def test_values_variants_drift_away_from_are_not_comparable_across_variants_only():
    drifting = {"loss": {"widest": 2.3, "trends": {"growth": 3.1}}}
    content = {**document(), "layout_metrics": {}, envelope.DRIFTING: drifting}
    mine = envelope.read(content, Path("e"), magnitude=lambda n: 1.0)
    assert mine.drifting_layer() is None  # the reference's own lane compares it
    theirs = envelope.read(content, Path("e"), magnitude=lambda n: 1.0, layout_variant=True)
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
    content = {**document(), envelope.DRIFTING: {"loss": entry}}
    with pytest.raises(GoldenFormatError, match=problem):
        envelope.read(content, Path("e"), magnitude=lambda n: 1.0)
