"""``rollout-golden history DIR list | show TEST | compare RUN RUN``: the run history read back.

``list`` reads only each run's ``run.json``; ``show`` and ``compare`` read the values of the
runs they print. ``compare`` is ``rollout-golden diff``'s comparison of two runs' values,
through the same comparison and tolerance resolver (:func:`..report.diff.diff_metric_tables`),
printed by the command line as ``diff``'s report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from ..wording import plural, table
from .store import read_run, read_values, run_numbers

PASSED = ("replayed", "recorded", "updated")


def runs_of(folder: Path) -> list[dict[str, Any]]:
    """Every run's ``run.json``, oldest first; GoldenError when ``folder`` holds no run."""
    numbers = run_numbers(folder)
    if not numbers:
        raise GoldenError(
            f"{folder}: no run in this history; run pytest with --golden-history {folder}"
        )
    return [read_run(folder, n) for n in numbers]


def pick_run(folder: Path, ref: str) -> dict[str, Any]:
    """The run ``ref`` names: its number, or ``-N`` the N-th newest."""
    numbers = run_numbers(folder)
    try:
        index = int(ref)
    except ValueError:
        index = 0
    if index < 0 and -index <= len(numbers):
        return read_run(folder, numbers[index])
    if index in numbers:
        return read_run(folder, index)
    held = f"runs {numbers[0]}-{numbers[-1]}" if numbers else "no run"
    raise GoldenError(f"{folder}: no run {ref!r}; it holds {held} (-1: the newest)")


def short(commit: Any) -> str:
    """The first 10 characters of a commit hash, or "-" when there is none."""
    return str(commit)[:10] if commit else "-"


def list_runs(folder: Path) -> int:
    """Print one line per run: number, time, commit, lane, goldens passed and failed."""
    runs = runs_of(folder)
    rows: list[Sequence[Any]] = [("run", "time", "commit", "lane", "passed", "failed")]
    for run in runs:
        counts = run.get("counts", {})
        passed = sum(counts.get(s, 0) for s in PASSED)
        failed = counts.get("failed", 0)
        rows.append((run["run"], run["time"], short(run.get("commit")), run.get("lane") or "-",
                     passed, failed))  # fmt: skip
    print(f"{folder}: {plural(len(runs), 'run')}")
    print("\n".join(table(rows)))
    return 0


def series_of(folder: Path, run: Mapping[str, Any], test: str) -> dict[str, dict[str, Any]]:
    """Test ``test``'s series in ``run``: ``{name: {"kind", "failed", "steps", "actual",
    "expected", "excess"}}`` (``{}``: the run did not compare it)."""
    if not any(t["test"] == test for t in run["tests"]):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for entry, series in zip(run["tests"], every_series(folder, run), strict=True):
        if entry["test"] == test:
            found.update(series)
    return found


def every_series(folder: Path, run: Mapping[str, Any]) -> list[dict[str, dict[str, Any]]]:
    """Each test's series in ``run``, as :func:`series_of` gives them, in the order of
    ``run["tests"]``: the run's values read once."""
    from .record import ROWS

    arrays = read_values(folder, run)
    steps, values = arrays["steps"].tolist(), arrays["values"].tolist()
    every, start = [], 0
    for entry in run["tests"]:
        found = {}
        for series in entry["series"]:
            end = start + series["count"]
            columns = {row: values[i][start:end] for i, row in enumerate(ROWS)}
            found[series["name"]] = {"kind": series["kind"], "failed": series["failed"],
                                     "steps": steps[start:end], **columns}  # fmt: skip
            start = end
        every.append(found)
    return every


def named_test(runs: Sequence[Mapping[str, Any]], wanted: str) -> str:
    """The test id ``wanted`` names: itself, or the one test id containing it."""
    ids = sorted({t["test"] for run in runs for t in run["tests"]})
    if wanted in ids:
        return wanted
    matches = [i for i in ids if wanted in i]
    if len(matches) == 1:
        return matches[0]
    some = ", ".join(matches[:5] or ids[:5])
    what = "matches several tests" if matches else "matches no test"
    raise GoldenError(f"{wanted!r} {what} of this history; give one of: {some}")


def distance(series: Mapping[str, Any]) -> float:
    """A series' greatest distance over its steps, in units of tolerance (NaN: none)."""
    finite = [x for x in series["excess"] if not math.isnan(x)]
    return max(finite) if finite else math.nan


def show_test(
    folder: Path, test: str, *, metric: str | None = None, plot: Path | None = None
) -> int:
    """Print test ``test``'s series across runs: per run, each metric's greatest distance
    in units of tolerance (above 1: failed); ``plot``: draw them, one panel per metric."""
    runs = runs_of(folder)
    test = named_test(runs, test)
    by_run = {run["run"]: (run, series_of(folder, run, test)) for run in runs}
    names = sorted({n for _, s in by_run.values() for n in s})
    if metric is not None:
        if metric not in names:
            raise GoldenError(
                f"{test}: no metric {metric!r} in this history; it has {', '.join(names)}"
            )
        names = [metric]
    print(f"{test}: distance in units of tolerance (above 1 fails), {plural(len(by_run), 'run')}")
    rows: list[Sequence[Any]] = [("run", "commit", "status", *names)]
    curves: dict[str, dict[int, float]] = {n: {} for n in names}
    for number_, (run, series) in by_run.items():
        status = next((t["status"] for t in run["tests"] if t["test"] == test), "not run")
        cells = []
        for name in names:
            value = distance(series[name]) if name in series else math.nan
            cells.append("-" if math.isnan(value) else f"{value:.3g}")
            if not math.isnan(value):
                curves[name][number_] = value
        rows.append((number_, short(run.get("commit")), status, *cells))
    print("\n".join(table(rows)))
    if plot is not None:
        from ..report.plot import plot_metrics

        plot_metrics(curves, plot, title=f"{test}: distance in units of tolerance, by run",
                     x_label="run")  # fmt: skip
        print(f"wrote {plot}")
    return 0


def metric_table(series: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """A run's metric series as a ``metrics.json`` steps table ``{step: {name: value}}``."""
    steps: dict[str, dict[str, float]] = {}
    for name, s in series.items():
        if s["kind"] != "metric":
            continue
        for step, value in zip(s["steps"], s["actual"], strict=True):
            steps.setdefault(str(step), {})[name] = value
    return steps


def compare_runs(
    folder: Path, a: str, b: str, tolerances: Any
) -> tuple[list[Any], tuple[str, str]]:
    """``diff``'s comparison of run ``b``'s values against run ``a``'s, per test: the goldens'
    diffs and the names of the two sides."""
    from ..report.diff import Pair, diff_metric_tables, one_sided

    run_a, run_b = pick_run(folder, a), pick_run(folder, b)
    sides = (f"run {run_a['run']} ({short(run_a.get('commit'))}, {run_a['time']})",
             f"run {run_b['run']} ({short(run_b.get('commit'))}, {run_b['time']})")  # fmt: skip
    tests = sorted({t["test"] for run in (run_a, run_b) for t in run["tests"]})
    diffs = []
    for test in tests:
        left, right = series_of(folder, run_a, test), series_of(folder, run_b, test)
        if not left or not right:
            pair = Pair(test, sides[0] if left else None, sides[1] if right else None)
            diffs.append(one_sided(pair))
            continue
        tables = metric_table(left), metric_table(right)
        diffs.append(diff_metric_tables(test, sides, *tables, tolerances))
    return diffs, sides
