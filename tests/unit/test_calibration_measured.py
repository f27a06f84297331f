"""Which failures during --golden-calibrate were what it measured (measured_failures): a run's
mismatch on values that the lane applying to its test now holds, written."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.tolerance import calibration as calibrate

LOSS = {"rtol": 6e-4, "atol": 1e-8}
VARIANT, REFERENCE = "t.py::test_x[mb4]", "t.py::test_x[mb8]"


def content(verdict: str = calibrate.CERTIFIED, excluded: dict | None = None) -> dict:
    """A tolerances.json whose variant lane holds ``loss``, its own lane nothing."""
    certificate = {"verdict": verdict}
    record = {"excluded": excluded or {}, "failed": ["loss"], "certificate": certificate}
    return {"tolerances": {}, "layout_tolerances": {"loss": LOSS}, "variants": {VARIANT: record}}


def runs(failed=("loss",), unmeasured=()) -> dict:
    run = {"failed": list(failed), "unmeasured": list(unmeasured)}
    return {VARIANT: [run, run], REFERENCE: [{"failed": []}, {"failed": []}]}


def measured(doc: dict, usable: dict, bands: dict | None = None) -> list[str]:
    return calibrate.measured_failures(doc, usable, [VARIANT], bands)


def test_a_certified_variant_failing_on_a_value_its_lane_now_holds_is_measured():
    assert measured(content(), runs()) == [VARIANT]
    assert measured(content(calibrate.UNCERTIFIED), runs()) == [VARIANT]  # kept by the rule


@pytest.mark.parametrize(
    ("doc", "usable", "why"),
    [
        (content(calibrate.NOT_SAME_MATH), runs(), "the float64 oracle: not the same math"),
        (content(excluded={"loss": {}}), runs(), "an outlier, left out of loss's lane"),
        (content(), runs(failed=("loss", "grad_norm")), "grad_norm: no calibrated entry"),
        (content(), runs(unmeasured=("kl",)), "a value missing: no spread measures it"),
        ({**content(), "layout_tolerances": {}}, runs(), "nothing written for loss"),
    ],
)
def test_any_other_failure_is_not_measured(doc, usable, why):
    assert measured(doc, usable) == [], why


def test_a_test_of_its_own_golden_is_judged_by_the_same_layout_lane_or_its_band():
    usable = {REFERENCE: [{"failed": ["loss"]}, {"failed": []}]}
    own = {"tolerances": {}, "layout_tolerances": {"loss": LOSS}}
    assert calibrate.measured_failures(own, usable, [], None) == []  # the variant lane's only
    assert calibrate.measured_failures({**own, "tolerances": {"loss": LOSS}}, usable, [], None)
    bands = {"metrics": {"loss": {}}}  # envelope.json's same-layout bands
    assert calibrate.measured_failures(own, usable, [], bands) == [REFERENCE]
