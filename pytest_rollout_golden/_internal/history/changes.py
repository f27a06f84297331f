"""``rollout-golden history DIR changes``: the change points of every series of the history
(a test's metric on one lane, its distance per run: the greatest over its steps, in units of
tolerance), each with the first run after the shift, the commit range and the
``rollout-golden bisect`` command to run over it (:mod:`.changepoints` finds them)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..wording import number, plural
from .changepoints import HORIZON, ChangePoint, NoCommitBetween, commit_range, detect
from .commands import distance, every_series, named_test, runs_of, short


@dataclasses.dataclass(frozen=True)
class SeriesChanges:
    """One series across runs and its change points: ``runs`` the run numbers it has a
    distance in (oldest first), ``commits`` their commits (``""``: unknown), ``series`` the
    distances; a change point's ``index`` counts in these lists."""

    test: str
    metric: str
    lane: str | None
    runs: list[int]
    commits: list[str]
    series: list[float]
    changes: list[ChangePoint]


def changes_in(
    test: str,
    metric: str,
    runs: Sequence[int],
    commits: Sequence[str],
    series: Sequence[float],
    *,
    lane: str | None = None,
    false_alarm_rate: float = 0.01,
) -> SeriesChanges:
    """The change points of one series given as run numbers, commits and distances (runs
    without a finite distance left out by the caller)."""
    changes = detect(series, false_alarm_rate=false_alarm_rate)
    return SeriesChanges(
        test=test,
        metric=metric,
        lane=lane,
        runs=list(runs),
        commits=list(commits),
        series=list(series),
        changes=changes,
    )


def history_changes(
    folder: Path,
    *,
    test: str | None = None,
    metric: str | None = None,
    false_alarm_rate: float = 0.01,
) -> list[SeriesChanges]:
    """Every series of history ``folder`` (of test ``test`` and metric ``metric`` where
    given) with its change points, in the order of test, metric and lane. A run where a
    series has no finite distance (not run, a NaN) is left out of that series."""
    runs = runs_of(folder)
    wanted = None if test is None else named_test(runs, test)
    collected: dict[tuple[str, str, str], tuple[list[int], list[str], list[float]]] = {}
    for run in runs:
        for entry, series in zip(run["tests"], every_series(folder, run), strict=True):
            if wanted is not None and entry["test"] != wanted:
                continue
            for name, values in series.items():
                value = distance(values)
                if (metric is not None and name != metric) or not math.isfinite(value):
                    continue
                key = (entry["test"], name, entry.get("lane") or "")
                numbers, commits, distances = collected.setdefault(key, ([], [], []))
                numbers.append(run["run"])
                commits.append(short(run.get("commit")).strip("-"))
                distances.append(value)
    if metric is not None and not collected:
        raise _no_metric(folder, metric, wanted)
    return [
        changes_in(t, m, *columns, lane=lane or None, false_alarm_rate=false_alarm_rate)
        for (t, m, lane), columns in sorted(collected.items())
    ]


def _no_metric(folder: Path, metric: str, test: str | None) -> Exception:
    from ...errors import GoldenError

    where = f"test {test}" if test else "any test"
    return GoldenError(
        f"{folder}: no finite distance of metric {metric!r} in {where}; "
        "`rollout-golden history DIR show TEST` lists a test's metrics"
    )


def change_lines(found: Sequence[SeriesChanges], false_alarm_rate: float) -> list[str]:
    """What ``changes`` prints: per series with change points, each one's runs, distances,
    commits and the bisect command; then the tally."""
    lines = []
    for item in found:
        for change in item.changes:
            lines += _change(item, change)
    moved = sum(bool(item.changes) for item in found)
    count = sum(len(item.changes) for item in found)
    lines.append(
        f"{plural(count, 'change point')} in {moved} of {plural(len(found), 'series', 'series')}"
        f" (a series without a change raises one in {HORIZON} runs with probability at most "
        f"{false_alarm_rate:g})"
    )
    return lines


def _change(item: SeriesChanges, change: ChangePoint) -> list[str]:
    """One change point's lines."""
    lane = f" @{item.lane}" if item.lane else ""
    first, low, high = (item.runs[i] for i in (change.index, change.earliest, change.latest))
    where = f"run {first}" + (f" (one of runs {low}-{high})" if low != high else "")
    newest = "the newest run" if change.window == 1 else f"the newest {change.window} runs"
    how = (
        "a deterministic series moved"
        if change.exact
        else f"|t| {change.statistic:.1f} > {change.threshold:.1f} over {newest}"
    )
    lines = [
        f"{item.test}  {item.metric}{lane}: distance {number(change.before, 3)} -> "
        f"{number(change.after, 3)} of the tolerance",
        f"  first run after the shift: {where}; found at run {item.runs[change.alarm]} ({how})",
    ]
    if not all(item.commits[change.earliest - 1 : change.latest + 1]):
        return [*lines, "  commits: not recorded (the runs were not in a git checkout)"]
    try:
        good, bad = commit_range(change, item.commits)
    except NoCommitBetween as exc:
        return [*lines, f"  {exc}"]
    return [
        *lines,
        f"  commits: {good} (last good) .. {bad} (first bad)",
        f"  rollout-golden bisect --good {good} --bad {bad} -- {shlex.quote(item.test)}",
    ]


def changes_command(
    folder: Path,
    *,
    test: str | None,
    metric: str | None,
    false_alarm_rate: float,
    plot: Path | None,
) -> int:
    """Print the change points of history ``folder`` (``plot``: draw the first series
    with one, or the first series); 1 when there is any, else 0."""
    found = history_changes(folder, test=test, metric=metric, false_alarm_rate=false_alarm_rate)
    print("\n".join(change_lines(found, false_alarm_rate)))
    if plot is not None and found:
        item = next((i for i in found if i.changes), found[0])
        _draw(item, plot)
        print(f"wrote {plot}")
    return 1 if any(item.changes for item in found) else 0


def _draw(item: SeriesChanges, plot: Path) -> Any:
    from .changes_plot import plot_changes

    lane = f" @{item.lane}" if item.lane else ""
    return plot_changes(
        item.series,
        item.changes,
        plot,
        title=f"{item.test}  {item.metric}{lane}",
        commits=item.commits if all(item.commits) else None,
        runs=item.runs,
    )


def add_parser(verbs: Any) -> None:
    """``rollout-golden history DIR changes``'s options."""
    p_changes = verbs.add_parser(
        "changes",
        help="the change points of each test's metrics across runs, and what to bisect",
        description="Find the runs after which a metric's distance to its golden moved: the "
        "first run after the shift, the commits between, the rollout-golden bisect command. "
        "Exit status 1 when there is any change point.",
    )
    p_changes.add_argument("--test", metavar="TEST", help="only this test (or a part naming one)")
    p_changes.add_argument("--metric", metavar="M", help="only this metric")
    p_changes.add_argument(
        "--false-alarm-rate",
        type=_rate,
        default=0.01,
        metavar="A",
        help=f"the probability that {HORIZON} runs of a series without a change raise one "
        "(default 0.01)",
    )
    p_changes.add_argument(
        "--plot", type=Path, metavar="PNG", help="draw the first series with a change point"
    )


def _rate(text: str) -> float:
    import argparse

    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0 < rate < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a probability between 0 and 1, e.g. 0.01")
    return rate
