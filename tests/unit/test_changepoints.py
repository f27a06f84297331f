"""Change points in a distance series across CI runs (``_internal/history/changepoints.py``):
the issue's simulated year, the false-alarm and detection rates at a small scale (the
benchmark measures them at a larger one), deterministic series, and the commit range."""

from __future__ import annotations

import math
import random

import pytest
from nightly import SD, nightly

from pytest_rollout_golden._internal.history.changepoints import (
    NoCommitBetween,
    _t_critical,
    _t_tail,
    commit_range,
    detect,
)

WITHIN = 5  # runs: the detection delay (the shift's own run and four more)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_simulated_year_finds_both_shifts_and_names_their_commits(seed):
    """The done-when: 365 nightly runs, shifts of 3% of the tolerance (3 sd) at nights 120
    and 250: each found within 5 runs, its commit range names the planted commit, at most
    one false alarm over the clean stretches."""
    year = nightly(seed=seed)
    for night, planted in year.planted.items():
        seen = detect(year.series[: night + WITHIN])  # the history on the fifth night
        found = [c for c in seen if c.earliest <= night <= c.latest]
        assert found, (night, seen)
        assert found[0].alarm < night + WITHIN
        good, bad = commit_range(found[0], year.commits[: night + WITHIN])
        assert year.named(good, bad, planted), (good, bad, planted)
    changes = detect(year.series)
    true = [c for c in changes if any(c.earliest <= n <= c.latest for n in year.planted)]
    assert len(true) == len(year.planted)
    assert len(changes) - len(true) <= 1
    for change in true:  # a few nights' commits to bisect (1 to 5 in 95 of 100 years)
        assert change.latest - change.earliest < 5, change


def test_the_alarms_of_a_prefix_are_those_the_whole_history_raises_by_then():
    """Read run by run: an alarm raised on night n is still raised when more nights come."""
    year = nightly(seed=3)
    alarms = [c.alarm for c in detect(year.series)]
    for end in (100, 122, 124, 200, 252, 300):
        assert [c.alarm for c in detect(year.series[:end])] == [a for a in alarms if a < end]


def clean(seed: int, runs: int = 100) -> list[float]:
    rng = random.Random(seed)
    return [0.2 + rng.gauss(0.0, SD) for _ in range(runs)]


def test_false_alarms_over_100_clean_runs_stay_within_the_bound():
    """1000 series of 100 clean runs. The union bound over the looks 100 runs hold (431 of
    them, 10 reference runs first) is 0.86%: 8.6 series expected at most; 15 is 2.2 binomial
    sd beyond it. Normal critical values in place of Student's (the sd estimated taken as
    known) alarm in about 3%, 30 series. The benchmark measures 0.7% over 6000."""
    alarmed = sum(bool(detect(clean(seed))) for seed in range(1000))
    assert alarmed <= 15


def test_the_t_tail_is_students():
    """What each look's level rests on: two-sided tails of Student's t (tables' values)."""
    assert _t_tail(2.228138852, 10) == pytest.approx(0.05, rel=1e-8)
    assert _t_tail(1.0, 1) == pytest.approx(0.5, rel=1e-12)
    assert _t_critical(0.001, 30) == pytest.approx(3.646, abs=5e-4)
    # many degrees of freedom: the normal's tail (t's excess is about x**4 / (4 df))
    assert _t_tail(4.5, 10**6) == pytest.approx(math.erfc(4.5 / math.sqrt(2)), rel=2e-4)


def test_a_shift_of_three_percent_of_the_tolerance_is_found_within_five_runs():
    """100 clean runs, then 5 shifted by 0.03 (3 sd): found in at least 95% of 200 series,
    its range holding run 100 (the benchmark measures 97-98% over 2000)."""
    found = 0
    for seed in range(200):
        series = clean(seed) + [0.23 + x - 0.2 for x in clean(10_000 + seed, WITHIN)]
        found += any(c.earliest <= 100 <= c.latest for c in detect(series))
    assert found >= 190


def test_scale_and_offset_change_nothing():
    """The t statistic is location-scale invariant: the sd need not be known."""
    series = nightly(seed=4).series
    scaled = [1e3 * (x - 0.2) + 7.0 for x in series]
    assert [c.index for c in detect(scaled)] == [c.index for c in detect(series)]


def test_a_deterministic_series_changes_at_any_other_value():
    """A deterministic lane repeats its distance exactly: any other value is a change at
    once (statistic the difference); repeats of the new value are not."""
    series = [0.25] * 30 + [0.25 + 1e-9] * 30 + [0.25] * 5
    changes = detect(series)
    assert [(c.index, c.earliest, c.latest, c.exact) for c in changes] == [
        (30, 30, 30, True),
        (60, 60, 60, True),
    ]
    assert changes[0].before == 0.25 and changes[0].after == 0.25 + 1e-9
    assert changes[0].statistic == pytest.approx(1e-9) and changes[0].threshold == 0.0


def test_a_deterministic_series_that_turns_noisy_changes_once():
    """The first run that does not repeat is the change; the noisy runs after it are not."""
    series = [0.25] * 30 + clean(5, 60)
    assert [c.index for c in detect(series)] == [30]


def test_the_commit_range_reaches_from_before_earliest_to_latest():
    year = nightly(runs=160, shifts={120: 0.05}, seed=6)
    (change,) = detect(year.series)
    good, bad = commit_range(change, year.commits)
    assert (good, bad) == (year.commits[change.earliest - 1], year.commits[change.latest])
    assert year.named(good, bad, year.planted[120])


def test_the_same_commit_on_both_sides_is_no_range_to_bisect():
    """A shift between two runs of one commit came with the environment."""
    year = nightly(runs=160, shifts={120: 0.05}, seed=6)
    (change,) = detect(year.series)
    same = ["c"] * len(year.commits)
    with pytest.raises(NoCommitBetween, match="both tested commit c: the shift came with"):
        commit_range(change, same)
    with pytest.raises(ValueError, match="one commit per run"):
        commit_range(change, year.commits[: change.latest])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_distance_is_named(bad):
    with pytest.raises(ValueError, match=r"run 3's distance is (nan|inf)"):
        detect([0.1, 0.2, 0.3, bad])


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="false_alarm_rate must be in"):
        detect([0.1] * 5, false_alarm_rate=0)
