"""The picture of a bisect (``rollout-golden bisect --plot PNG``): one row per commit tried, in
the order tried, its marker at the commit's place in the history (good, bad or skipped), and
behind it a bar over the commits that could still be the first bad one before that try; the
answer and its first divergence in the title. Needs matplotlib, as :mod:`.plot` does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..report.plot import BAD, figure_classes, shortened
from ..wording import number

if TYPE_CHECKING:
    from ..commits.bisect import BisectResult

_GOOD, _SKIP, _OPEN = "#2ca02c", "#7f7f7f", "#e3e3e3"
_STYLE = {"good": ("o", _GOOD), "bad": ("o", BAD), "skip": ("X", _SKIP)}
_LABEL = 64  # characters of a row's label: "bad: subject (reason)"


def plot_bisect(result: BisectResult, out: Path) -> Path:
    """Draw ``result`` into the PNG ``out``: x is a commit's place after ``--good`` (0) up to
    ``--bad`` (the last), y the order tried. Returns ``out``."""
    Figure, FigureCanvasAgg = figure_classes()
    place = {c.sha: n for n, c in enumerate(result.commits, start=1)}
    last = len(result.commits)
    rows = len(result.tried)
    fig = Figure(figsize=(10, 1.9 + 0.42 * max(rows, 2)))
    FigureCanvasAgg(fig)
    height = fig.get_figheight()
    ax = fig.add_axes((0.07, 1.05 / height, 0.88, 1 - 2.0 / height))
    low, high = 0, last  # the first bad commit is after low, at high or before
    for row, run in enumerate(result.tried, start=1):
        ax.barh(row, high - low, left=low + 0.5, height=0.55, color=_OPEN, zorder=0,
                label="could still be the first bad commit" if row == 1 else None)  # fmt: skip
        x = place[run.commit.sha]
        if run.outcome == "good":
            low = max(low, x)
        elif run.outcome == "bad":
            high = min(high, x)
        _label(ax, x, row, run.outcome, run.commit.subject, run.reason, last)
    for outcome, (marker, color) in _STYLE.items():
        points = [(place[r.commit.sha], n) for n, r in enumerate(result.tried, 1)
                  if r.outcome == outcome]  # fmt: skip
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker, color=color, ms=9, ls="none", label=outcome, zorder=3)
    for commit in result.candidates:
        ax.axvline(place[commit.sha], color=BAD, ls=":", lw=1.2, zorder=1)
    _axes(ax, last, rows)
    fig.suptitle(_title(result), y=1 - 0.1 / height, va="top", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55 / (ax.get_position().height
              * height)), ncol=4, fontsize=8, frameon=False)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _label(ax: Any, x: int, row: int, outcome: str, subject: str, reason: str, last: int) -> None:
    """``outcome: subject (reason)`` beside the marker, on the side with more room."""
    text = f"{outcome}: {shortened(subject, _LABEL - 20)}"
    if outcome == "skip" and reason:  # the reason's start says most: cut at its end
        room = _LABEL - len(text) - 3
        text += f" ({reason})" if len(reason) <= room else f" ({reason[: max(0, room - 1)]}…)"
    right = x <= last / 2
    ax.annotate(text, (x, row), xytext=(9 if right else -9, 0),
                textcoords="offset points", ha="left" if right else "right", va="center",
                fontsize=8)  # fmt: skip


def _axes(a: Any, last: int, rows: int) -> None:
    """Steps of the history on x (both ends marked), tries top to bottom on y."""
    from matplotlib.ticker import MaxNLocator

    a.set_xlim(-0.8, last + 0.8)
    a.set_ylim(rows + 0.7, 0.3)
    a.set_yticks(range(1, rows + 1))
    a.set_ylabel("try")
    a.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(last + 1, 16)))
    a.set_xlabel(f"commit after --good, oldest first (0: --good, {last}: --bad)")
    for x, name, color in ((0, "--good", _GOOD), (last, "--bad", BAD)):
        a.axvline(x, color=color, ls="--", lw=1, zorder=1)
        a.text(x, 1.01, name, transform=a.get_xaxis_transform(), ha="center", va="bottom",
               fontsize=8, color=color)  # fmt: skip
    a.grid(alpha=0.3, axis="x")


def _title(result: BisectResult) -> str:
    """What was searched, the answer, and the first bad commit's first divergence."""
    last = len(result.commits)
    lines = [
        f"bisect: {len(result.tried)} of {last} commits tried after "
        f"--good {result.good.short} ({shortened(result.good.subject, 40)})"
    ]
    if result.first_bad is not None:
        lines.append(f"first bad commit: {result.first_bad.short} {result.first_bad.subject}")
    else:
        named = ", ".join(f"{c.short} {c.subject}" for c in result.candidates)
        lines.append(f"first bad commit: ambiguous, one of {shortened(named, 100)}")
    run = result.first_bad_run
    if run is not None and run.first is not None:
        d = run.first
        lines.append(
            f"first divergence: {d.metric} at step {d.step}: {number(d.excess, 3)}x beyond "
            f"{d.tolerance} "
            f"({shortened(d.test, 50)})"
        )
    return "\n".join(lines)
