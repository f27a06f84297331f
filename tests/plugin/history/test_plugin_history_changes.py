"""``rollout-golden history DIR changes``: change points over the runs ``--golden-history``
appended (through pytester), and over simulated nightly histories written to the store."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_rollout_golden.cli import main

sys.path.insert(0, str(Path(__file__).parents[2] / "unit"))
from nightly import nightly, write_history

TRAIN = """
def test_train(golden, values):
    shift = values.get("shift", 0.0)
    for step in range(3):
        golden.check({"loss": 1.0 + step + shift, "kl": 0.01 * step}, step=step)
"""


def changes(capsys, folder: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["history", str(folder), "changes", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_drift_within_tolerance_of_a_deterministic_test_is_a_change_point(project, capsys):
    """Replays repeat their distance exactly (0); a shift of 1e-5 passes the gate (0.033 of
    loss's tolerance, 3e-4 at its largest step) but moves the series: a change at run 4,
    kl untouched. The project is no git checkout: no commits to bisect."""
    project.write(TRAIN)
    for _ in range(3):  # run 1 records (no distance), runs 2 and 3 replay
        project.run("--golden-history", "hist").assert_outcomes(passed=1)
    project.set_values(shift=1e-5)
    for _ in range(2):
        project.run("--golden-history", "hist").assert_outcomes(passed=1)
    code, out = changes(capsys, project.path / "hist")
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0].startswith("test_it.py::test_train  loss: distance 0 -> 0.0333")
    assert lines[1] == (
        "  first run after the shift: run 4; found at run 4 (a deterministic series moved)"
    )
    assert lines[2] == "  commits: not recorded (the runs were not in a git checkout)"
    assert lines[3].startswith("1 change point in 1 of 2 series")
    code, out = changes(capsys, project.path / "hist", "--metric", "kl")
    assert code == 0 and out.startswith("0 change points in 0 of 1 series"), out


@pytest.fixture(scope="module")
def year(tmp_path_factory) -> Path:
    """The issue's simulated year (seed 0) as a history folder."""
    folder = tmp_path_factory.mktemp("year") / "hist"
    write_history(folder, nightly())
    return folder


def test_a_simulated_year_prints_both_shifts_and_the_bisects_to_run(year, capsys):
    """Shifts on nights 120 and 250 (runs 121 and 251), each planted in a night's middle
    commit (n120b, n250b): the bisect commands span them."""
    code, out = changes(capsys, year)
    assert code == 1
    history = nightly()
    bisects = [line.split() for line in out.splitlines() if "rollout-golden bisect" in line]
    assert len(bisects) == 2, out
    for words, planted in zip(bisects, history.planted.values(), strict=True):
        good, bad = words[words.index("--good") + 1], words[words.index("--bad") + 1]
        assert history.named(good, bad, planted), (good, bad, planted)
        assert words[-2:] == ["--", "test_grpo.py::test_step"]
    assert "2 change points in 1 of 1 series" in out


def test_changes_name_what_is_missing_and_refuse_a_bad_rate(year, capsys):
    code, out = changes(capsys, year, "--metric", "nope")
    assert code == 2
    assert "no finite distance of metric 'nope' in any test" in out
    code, out = changes(capsys, year, "--test", "test_nothing")
    assert code == 2 and "matches no test" in out
    with pytest.raises(SystemExit):
        changes(capsys, year, "--false-alarm-rate", "2")
    assert "a probability between 0 and 1" in capsys.readouterr().err


def test_a_lower_false_alarm_rate_raises_the_threshold(year, capsys):
    from pytest_rollout_golden._internal.history.changes import history_changes

    (strict,) = history_changes(year, false_alarm_rate=1e-4)
    (default,) = history_changes(year)
    assert strict.changes[0].threshold > default.changes[0].threshold
