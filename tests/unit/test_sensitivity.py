"""The minimum detectable effect of a gate (:mod:`.golden.sensitivity`) against the value
its tolerance gives analytically: ``(atol + rtol * max(|v|, scale)) / |v|``."""

from __future__ import annotations

import math

import pytest

from pytest_rollout_golden._internal.golden.sensitivity import (
    HIGH,
    LOW,
    NEVER,
    ZERO,
    Gate,
    below_floor,
    detectable_effect,
    golden_gates,
    smallest_failing,
)
from pytest_rollout_golden._internal.tolerance.spec import IGNORE, Tolerance
from pytest_rollout_golden._internal.tolerance.trends import call_trends

# The bisection stops within 3e-8 relative of the true effect (HALVINGS); compare_values
# computes v * (1 + r) - v in float64, a few ulps of v off v * r: 1e-6 covers both.
REL = 1e-6


@pytest.mark.parametrize(
    ("value", "tol", "expected"),
    [
        (2.5, Tolerance(rtol=1e-3, atol=0.0), 1e-3),  # pure rtol: rtol itself
        (-7.0, Tolerance(rtol=1e-3, atol=0.0), 1e-3),  # the sign does not matter
        (1e-3, Tolerance(rtol=1e-6, atol=1e-5), (1e-5 + 1e-9) / 1e-3),  # atol-dominated: atol/|v|
        (0.5, Tolerance(rtol=1e-3, atol=1e-5, scale=4.0), (1e-5 + 4e-3) / 0.5),  # scale
    ],
)
def test_effect_is_the_allowance_over_the_value(value, tol, expected):
    assert detectable_effect(value, tol) == pytest.approx(expected, rel=REL)


def test_recorded_scale_uses_the_metric_magnitude():
    tol = Tolerance(rtol=1e-4, atol=1e-8, scale="recorded")
    found = detectable_effect(0.01, tol, magnitude=0.2)
    assert found == pytest.approx((1e-8 + 1e-4 * 0.2) / 0.01, rel=REL)


def test_exact_and_integer_values_detect_the_smallest_change():
    assert detectable_effect(3.0, Tolerance(exact=True)) == LOW
    assert detectable_effect(11, Tolerance(rtol=0.0, atol=0.0)) == LOW


def test_a_tolerance_wider_than_ten_times_the_value_never_fails():
    assert detectable_effect(1.0, Tolerance(rtol=0.0, atol=11.0)) is None
    assert detectable_effect(1.0, Tolerance(rtol=0.0, atol=9.0)) == pytest.approx(9.0, rel=REL)


def test_zero_and_nan_values_have_no_relative_effect():
    assert math.isnan(detectable_effect(0.0, Tolerance(rtol=1e-3, atol=0.0)))
    assert math.isnan(detectable_effect(float("nan"), Tolerance(rtol=1e-3, atol=0.0)))


def test_a_tensor_metric_fails_where_its_smallest_allowance_is():
    import torch

    tol = Tolerance(rtol=1e-3, atol=1e-4)
    found = detectable_effect(torch.tensor([10.0, 0.01]), tol)
    # scaled together, the element whose allowance is the smallest share of it fails first:
    # 10 (1.01e-3 of it allowed), not 0.01 (1.1e-2)
    assert found == pytest.approx((1e-4 + 1e-2) / 10.0, rel=1e-3)


def test_bisection_finds_a_threshold_in_log_space():
    assert smallest_failing(lambda r: r >= 0.0123) == pytest.approx(0.0123, rel=1e-7)
    assert smallest_failing(lambda r: False) is None
    assert smallest_failing(lambda r: r > HIGH) is None


def _steps(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    n = len(next(iter(values.values())))
    return {str(s): {name: v[s] for name, v in values.items()} for s in range(n)}


def _tolerances(table):
    return lambda name, step, dtypes: (table[name], f"test {name}")


def test_gates_of_a_golden_flag_what_cannot_fail():
    steps = _steps({"loss": [2.0, 1.0, 4.0], "kl": [0.1, 0.2, 0.3], "clip": [0.0, 0.1, 0.0]})
    table = {
        "loss": Tolerance(rtol=1e-3, atol=0.0),
        "kl": IGNORE,
        "clip": Tolerance(rtol=1e-3, atol=0.0),
    }
    gates = {g.name: g for g in golden_gates(steps, _tolerances(table))}
    assert gates["loss"].effect == pytest.approx(1e-3, rel=REL)
    assert [p.step for p in gates["loss"].probes] == [0, 2]  # first and last recorded
    assert gates["kl"].status == NEVER and "not compared (test kl)" in gates["kl"].never
    assert gates["clip"].status == ZERO and "nothing allowed at 0" in gates["clip"].note
    # rtol=1e-3 fails every change above 1e-3: it meets a floor of 1e-3, not one just below
    assert below_floor(gates.values(), 1e-3) == [gates["kl"]]
    assert below_floor(gates.values(), 0.999e-3) == [gates["kl"], gates["loss"]]
    assert below_floor(gates.values(), 1e-4) == [gates["kl"], gates["loss"]]
    assert Gate.from_json(gates["clip"].to_json()) == gates["clip"]


def test_a_trend_bound_above_what_the_series_reaches_never_fails():
    steps = _steps({"gap": [0.01 + 0.0001 * s for s in range(12)]})
    table = {"gap": Tolerance(rtol=1e-3, atol=0.0)}
    tight = golden_gates(steps, _tolerances(table), trends=call_trends({"gap": "growth<=1.5"}))
    growth = next(g for g in tight if g.name == "gap growth")
    recorded = (0.01 + 0.0001 * 10.5) / (0.01 + 0.0001 * 0.5)  # mean of last 2 over first 2
    assert growth.effect == pytest.approx(1.5 / recorded - 1, rel=1e-6)
    loose = golden_gates(steps, _tolerances(table), trends=call_trends({"gap": "growth<=100"}))
    growth = next(g for g in loose if g.name == "gap growth")
    assert growth.status == NEVER and "above what a change of up to 10x" in growth.never
    assert below_floor(loose, 1e-3) == []  # a ceiling is flagged, not held to the floor
