"""Change points on simulated nightly histories: false alarms, detection, location.

Not a benchmark of speed: the rates of ``_internal/history/changepoints.py`` on the histories
of ``tests/unit/nightly.py`` (a correct commit's distance: 0.2 of the tolerance plus
independent normal noise of sd 0.01 of the tolerance, run-to-run environment noise; a shift
adds to every run from its night on). The method is location-scale invariant, so the rates
depend on the shift over the sd only: a shift of 3% of the tolerance is 3 sd here, and would
be 1.5 sd on a noisier lane of sd 0.02. Rows:

- false alarms: series of 100 clean runs with any alarm (target ≤ 1%), and the same with
  heavier tails (Student's t with 5 degrees of freedom, scaled to sd 0.01), which the
  method's bound does not cover;
- detection: 100 (or 30) clean runs, then 5 shifted: a change point whose range holds the
  shift's first run, raised by the fifth (target ≥ 95% for 3% of the tolerance after 100);
  how often the most likely run is the shift's, and the range's median width in runs;
- simulated years (``nightly()``: 365 runs, +0.03 at night 120, -0.03 at night 250): both
  found within 5 runs, the commit ranges naming the planted commits, false alarms per year.

``python benchmarks/bench_changepoints.py [--quick]`` prints the section alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import Section, Target, table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from nightly import BASE, SD, nightly  # noqa: E402  (the tests' histories, not a copy)

from pytest_rollout_golden._internal.history.changepoints import detect  # noqa: E402

WITHIN = 5  # runs: the detection delay (the shift's own run and four more)
HEAVY_DF = 5


def _normal(rng: random.Random) -> float:
    return rng.gauss(0.0, SD)


def _heavy(rng: random.Random) -> float:
    """Student's t with :data:`HEAVY_DF` degrees of freedom, scaled to sd :data:`SD`."""
    chi2 = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(HEAVY_DF))
    return SD * rng.gauss(0.0, 1.0) / (chi2 / HEAVY_DF) ** 0.5 * ((HEAVY_DF - 2) / HEAVY_DF) ** 0.5


def _false_alarms(count: int, noise: Callable[[random.Random], float]) -> float:
    """The share of ``count`` series of 100 clean runs with any change point."""
    alarmed = 0
    for seed in range(count):
        rng = random.Random(seed)
        alarmed += bool(detect([BASE + noise(rng) for _ in range(100)]))
    return alarmed / count


def _detection(count: int, clean: int, shift: float) -> tuple[float, float, float, float]:
    """Of ``count`` series of ``clean`` runs then 5 shifted by ``shift``: the share found
    (range holding run ``clean``), located exactly, the median width of the range, and the
    share with an alarm before the shift."""
    found = exact = early = 0
    widths = []
    for seed in range(count):
        rng = random.Random(seed)
        series = [BASE + _normal(rng) for _ in range(clean)]
        series += [BASE + shift + _normal(rng) for _ in range(WITHIN)]
        changes = detect(series)
        early += any(c.alarm < clean for c in changes)
        hit = [c for c in changes if c.earliest <= clean <= c.latest]
        if hit:
            found += 1
            exact += hit[0].index == clean
            widths.append(hit[0].latest - hit[0].earliest + 1)
    width = statistics.median(widths) if widths else float("nan")
    return found / count, exact / count, width, early / count


def _years(count: int) -> dict[str, float]:
    """Over ``count`` simulated years: the share of shifts found within 5 runs whose
    commit range names the planted commit, false alarms per year (mean, most), the share
    of years with at most one."""
    named = shifts = 0
    extra = []
    for seed in range(count):
        year = nightly(seed=seed)
        for night, planted in year.planted.items():
            shifts += 1
            end = night + WITHIN
            hit = [c for c in detect(year.series[:end]) if c.earliest <= night <= c.latest]
            if hit:
                good, bad = year.commits[hit[0].earliest - 1], year.commits[hit[0].latest]
                named += year.named(good, bad, planted)
        changes = detect(year.series)
        true = sum(any(c.earliest <= n <= c.latest for n in year.planted) for c in changes)
        extra.append(len(changes) - true)
    return {
        "named": named / shifts,
        "mean": statistics.fmean(extra),
        "most": max(extra),
        "at most one": sum(e <= 1 for e in extra) / count,
    }


def _interval(share: float, count: int) -> str:
    """The Wilson 95% interval of a share measured over ``count`` draws: with few series
    (``--quick``) the target's verdict is a coin toss near 1%."""
    z = 1.96
    centre = (share + z * z / (2 * count)) / (1 + z * z / count)
    half = z / (1 + z * z / count) * (share * (1 - share) / count + z * z / (4 * count**2)) ** 0.5
    return f"95% CI {max(centre - half, 0):.2%}–{centre + half:.2%}"


def run(quick: bool) -> Section:
    start = time.perf_counter()
    series, shifted, years = (300, 200, 10) if quick else (4000, 1000, 100)
    clean = _false_alarms(series, _normal)
    heavy = _false_alarms(series, _heavy)
    rows = [
        ["false alarms, 100 clean runs, normal noise", f"{clean:.2%}", "", "", ""],
        [f"false alarms, 100 clean runs, t{HEAVY_DF} noise", f"{heavy:.2%}", "", "", ""],
    ]
    main = None
    for clean_runs, shift in ((100, 0.03), (100, 0.02), (100, 0.05), (30, 0.03)):
        found, exact, width, early = _detection(shifted, clean_runs, shift)
        main = found if (clean_runs, shift) == (100, 0.03) else main
        rows.append(
            [
                f"shift {shift / SD:.0f} sd ({shift:.0%} of tol.) after {clean_runs} runs",
                f"{early:.2%}",
                f"{found:.1%}",
                f"{exact:.1%}",
                f"{width:g}",
            ]
        )
    body = table(
        ["series", "alarm before the shift", "found within 5 runs", "located exactly",
         "median range (runs)"],
        rows,
    )  # fmt: skip
    year = _years(years)
    body += (
        f"\n\nSimulated years ({years}, 365 nightly runs, ±3% of the tolerance at nights 120 "
        f"and 250): shifts found within 5 runs with the planted commit in the range handed to "
        f"bisect {year['named']:.1%}; false alarms per year {year['mean']:.2f} on average, "
        f"{year['most']:.0f} at most; years with at most one {year['at most one']:.0%}."
        f"\n\n{series} series for false alarms, {shifted} per shift; noise sd {SD} of the "
        f"tolerance; {time.perf_counter() - start:.0f} s."
    )
    assert main is not None
    targets = [
        Target(
            "false alarms over 100 clean runs ≤ 1%",
            f"{clean:.2%} of {series} series ({_interval(clean, series)})",
            None if quick else clean <= 0.01,  # --quick: too few series to tell 0.8% from 1%
        ),
        Target("3%-of-tolerance shift found within 5 runs ≥ 95%", f"{main:.1%}", main >= 0.95),
        Target(
            "a year: shifts found within 5 runs and named ≥ 95%, ≤ 1 false alarm",
            f"{year['named']:.1%} of shifts, {year['at most one']:.0%} of years ≤ 1",
            year["named"] >= 0.95 and year["at most one"] == 1,
        ),
    ]
    return Section("Change points on simulated nightly histories", body, targets)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer series (smoke)")
    section = run(parser.parse_args().quick)
    print(f"## {section.title}\n\n{section.body}\n")
    print(table(["target", "measured", "verdict"], [t.row() for t in section.targets]))
