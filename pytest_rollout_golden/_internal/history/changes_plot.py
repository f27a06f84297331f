"""The picture of a metric's distance history across CI runs and its change points: each run's
distance in units of tolerance, the mean of each stretch between change points, and for each
change the runs its first bad run may be (shaded), the most likely one (a dashed line), the
run whose look raised the alarm (a triangle) and the commits to bisect between. Needs
matplotlib, as :mod:`.plot` does."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..report.plot import BAD, figure_classes, shortened
from ..wording import number

if TYPE_CHECKING:
    from .changepoints import ChangePoint

_RUNS, _MEAN, _RANGE = "#1f77b4", "#444444", "#f4c7c3"


def plot_changes(
    series: Sequence[float],
    changes: Sequence[ChangePoint],
    out: Path,
    *,
    title: str,
    commits: Sequence[str] | None = None,
    runs: Sequence[int] | None = None,
) -> Path:
    """Draw ``series`` (one distance per run, oldest first) and its ``changes`` into the PNG
    ``out``; ``commits`` (one per run) names each change's commit range, ``runs`` each run's
    number (default: its place from 0). Returns ``out``."""
    Figure, FigureCanvasAgg = figure_classes()
    fig = Figure(figsize=(10, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.08, 0.13, 0.9, 0.68))
    x = list(range(len(series)) if runs is None else runs)
    ax.plot(x, series, ".", color=_RUNS, ms=4, label="a run's distance")
    bounds = [0, *(c.index for c in changes), len(series)]
    for n, (low, high) in enumerate(itertools.pairwise(bounds)):
        mean = math.fsum(series[low:high]) / max(high - low, 1)
        ax.hlines(mean, x[low] - 0.5, x[high - 1] + 0.5, color=_MEAN, lw=1.5,
                  label="mean between change points" if n == 0 else None)  # fmt: skip
    for n, change in enumerate(changes):
        _change(ax, series, x, change, commits, first=n == 0)
    ax.set_xlim(x[0] - 1, x[-1] + 1)
    ax.set_xlabel("CI run, oldest first")
    ax.set_ylabel("distance / tolerance")
    ax.grid(alpha=0.3)
    count = f"{len(changes)} change point{'s' if len(changes) != 1 else ''}"
    fig.suptitle(f"{shortened(title, 100)}: {len(series)} runs, {count}", y=0.97, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 1.2), ncol=4, fontsize=8, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _change(
    ax: Any,
    series: Sequence[float],
    x: Sequence[int],
    change: ChangePoint,
    commits: Sequence[str] | None,
    *,
    first: bool,
) -> None:
    """One change point: its range shaded, its most likely run, its alarm, its label."""
    ax.axvspan(x[change.earliest] - 0.5, x[change.latest] + 0.5, color=_RANGE, zorder=0,
               label="where the first bad run may be" if first else None)  # fmt: skip
    ax.axvline(x[change.index] - 0.5, color=BAD, ls="--", lw=1,
               label="most likely first bad run" if first else None)  # fmt: skip
    ax.plot(x[change.alarm], series[change.alarm], "v", color=BAD, ms=8, zorder=3,
            label="alarm" if first else None)  # fmt: skip
    right = change.index > len(series) / 2
    ax.annotate(
        change_label(change, commits, x),
        (x[change.index] - 0.5, 1.0),
        xycoords=ax.get_xaxis_transform(),
        xytext=(-6 if right else 6, -6),
        textcoords="offset points",
        ha="right" if right else "left",
        va="top",
        fontsize=8,
        bbox={"facecolor": "white", "alpha": 0.85, "lw": 0},
    )


def change_label(change: ChangePoint, commits: Sequence[str] | None, x: Sequence[int]) -> str:
    """``first bad run 120 (118-121)``, the means, the commits and what raised the alarm
    (runs by their numbers ``x``)."""
    from .changepoints import NoCommitBetween, commit_range

    where = f"first bad run {x[change.index]}"
    if change.earliest != change.latest:
        where += f" ({x[change.earliest]}-{x[change.latest]})"
    lines = [where, f"mean {number(change.before, 3)} -> {number(change.after, 3)}"]
    if commits is not None:
        try:
            good, bad = commit_range(change, commits)
            lines.append(f"bisect --good {good} --bad {bad}")
        except NoCommitBetween:
            lines.append("one commit on both sides: the environment moved")
    if change.exact:
        lines.append(f"found at run {x[change.alarm]}: a deterministic series moved")
    else:
        lines.append(
            f"found at run {x[change.alarm]}: |t| {change.statistic:.1f} > {change.threshold:.1f}"
        )
    return "\n".join(lines)
