"""Pictures of metric curves over steps: one golden, or expected (A) against actual (B).

One panel per scalar metric, at most :data:`MAX_PANELS` of them; the others are named in a
note at the foot of the figure and in the returned :class:`Picture`. With two curves each
panel has a strip below it with the difference per step over the one its tolerance allows
there (``atol + rtol * max(|A|, scale)``, an envelope's band included), so the tolerance is
the dashed line at 1, and the first step beyond tolerance is marked. A metric with a per-step
envelope (``envelope.json``) shows the band its calibration runs spanned around curve A,
shaded, and the region the envelope allows, outlined.
Infinite and NaN values are drawn on the edge of their panel (``inf`` at the top, ``-inf`` at
the bottom, ``nan`` at the top with a cross) and labelled. Needs matplotlib
(``pip install 'pytest-rollout-golden[plot]'``); nothing else in the package imports it.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import GoldenError
from ..wording import display

if TYPE_CHECKING:
    from ..tolerance.envelope import Band

Series = Mapping[str, Mapping[int, float]]  # metric -> step -> value

MISSING_MATPLOTLIB = (
    "plotting needs matplotlib, which is not installed; "
    "install it with: pip install 'pytest-rollout-golden[plot]'"
)
_A_COLOR, _B_COLOR = "#1f77b4", "#ff7f0e"
BAD = "#d62728"  # beyond tolerance; a bad commit in a bisect's picture (timeline.py)
_IGNORED = "#bbbbbb"  # the difference bars of a metric the tolerances exclude
_RUNS, _ALLOWED = "#9ecae1", "#3182bd"  # an envelope: the runs' band, the allowed region
NOT_COMPARED = "(not compared: ignored)"
STRIP_LABEL = "|B-A| / allowed"  # the difference strip's measure where a tolerance gates

MAX_PANELS = 12
"""The most metric panels one picture draws (4 rows of 3). Drawing time and memory grow with
the number of panels, so a golden with hundreds of metrics would take minutes and hundreds of
megabytes; past this many, the metrics that diverged first (then those farthest beyond
tolerance) are drawn, then the rest by name, and the ones left out are listed."""

_NAMED = 5  # names in a title line before "and N more"
_NOTE_LINES = 4  # lines of the "not drawn" note at the foot of the figure
_MARKED = 8  # labelled non-finite points per curve and panel (all are drawn)
_BARS = 100  # past this many steps: thin lines instead of bars, curves without step markers
_EQUALS = 60  # "=" marks in a difference strip, at most this many steps
_TOP, _BOTTOM = 0.95, 0.05  # where non-finite values sit, in fractions of the panel's height
_PANEL_WIDTH = 5.0  # inches


@dataclasses.dataclass(frozen=True)
class Picture:
    """A written PNG: where, the metrics drawn (in panel order) and those left out.

    ``str()`` and ``os.fspath()`` give the path."""

    path: Path
    drawn: tuple[str, ...]
    not_drawn: tuple[str, ...] = ()
    not_drawn_note: str = ""  # "N of M metrics not drawn (...): a, b, ..." ("": all drawn)

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)


def series(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """The scalar metrics of a ``metrics.json`` ``steps`` table, as curves."""
    from ..golden import metric_codec

    out: dict[str, dict[int, float]] = {}
    for step, names in steps.items():
        for name, node in names.items():
            value = metric_codec.scalar(node)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(name, {})[int(step)] = float(value)
    return out


def figure_classes() -> tuple[Any, Any]:
    """matplotlib's ``Figure`` and its Agg canvas; :class:`GoldenError` saying how to install
    matplotlib when it is not."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise GoldenError(MISSING_MATPLOTLIB) from None
    return Figure, FigureCanvasAgg


def _some(names: Sequence[str], limit: int = _NAMED, chars: int = 10**6) -> str:
    """``a, b, c`` or ``a, b, c and 7 more``: at most ``limit`` names, in about ``chars``."""
    shown: list[str] = []
    for name in names[:limit]:
        if shown and len(", ".join([*shown, name])) + 12 > chars:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def shortened(name: str, chars: int = 56) -> str:
    """``name``, its middle elided when longer than ``chars``."""
    if len(name) <= chars:
        return name
    half = (chars - 1) // 2
    return f"{name[:half]}…{name[-half:]}"


def _excess(a: Mapping[int, float], b: Mapping[int, float], allowed: Mapping[int, float]) -> float:
    """The greatest difference over the one ``allowed`` at its step (non-finite differences,
    and any where nothing is allowed: infinite)."""
    worst = 0.0
    for step in set(a) & set(b):
        x, y = a[step], b[step]
        if x == y:
            continue
        limit = allowed.get(step, 0.0)
        diff = abs(y - x)
        ratio = diff / limit if limit > 0 and math.isfinite(diff) else math.inf
        worst = max(worst, ratio)
    return worst


def _order(
    names: list[str],
    first: Mapping[str, int | None],
    excess: Mapping[str, float],
) -> list[str]:
    """Diverged metrics first (earliest, then farthest beyond tolerance), then the rest by name."""

    def farthest(name: str) -> float:
        value = excess.get(name)
        return math.inf if value is None or math.isnan(value) else value

    diverged = sorted(
        (n for n in names if first.get(n) is not None),
        key=lambda n: (first[n], -farthest(n), n),
    )
    return diverged + [n for n in names if first.get(n) is None]


def plot_metrics(
    a: Series,
    out: Path,
    *,
    b: Series | None = None,
    labels: tuple[str, str] = ("A", "B"),
    title: str = "",
    first_divergence: Mapping[str, int | None] | None = None,
    allowed: Mapping[str, Mapping[int, float]] | None = None,
    excess: Mapping[str, float] | None = None,
    max_panels: int = MAX_PANELS,
    ignored: Collection[str] = (),
    bands: Mapping[str, Band] | None = None,
    x_label: str = "step",
) -> Picture:
    """Draw one panel per metric of ``a`` (and ``b``), at most ``max_panels``, into a PNG.

    ``first_divergence`` marks, per metric, the first step beyond tolerance;
    ``allowed`` gives per metric the difference its tolerance allows at each step
    (:func:`allowance`), which the difference strip measures against; ``excess``
    (greatest difference over the allowed one, per metric; computed from ``allowed`` where
    not given) ranks the diverged metrics when not all fit; ``ignored`` names the metrics
    the tolerances exclude, whose panels say "not compared (ignored)"; ``bands``: per metric,
    A's envelope, drawn around curve A and standing for ``allowed`` at each of its steps. The
    metrics that diverged
    earliest come first, then the others by name; those past ``max_panels``
    (:data:`MAX_PANELS`) are not drawn but named in a note at the foot of the picture and
    in the returned :class:`Picture`. The grid is fixed (no constrained layout), so the
    cost does not grow with the number of metrics. ``x_label`` names the horizontal axis
    (steps, or the runs of a history).
    """
    Figure, FigureCanvasAgg = figure_classes()
    names = sorted(set(a) | set(b or {}))
    if not names:
        raise GoldenError(f"nothing to plot for {title or out}: no scalar metrics")
    first_divergence = first_divergence or {}
    allowed = allowed or {}
    bands = bands or {}
    excess = _excess_by_metric(a, b, allowed, excess or {})
    ordered = _order(names, first_divergence, excess)
    shown, hidden = ordered[: max(1, max_panels)], ordered[max(1, max_panels) :]

    ncols = min(3, len(shown))
    strip = b is not None  # a difference strip below each panel
    heading, diverged = _heading(
        title or str(out), labels if b is not None else None, first_divergence, ordered, ncols
    )
    note, note_text = [], ""
    if hidden:
        prefix, items = _not_drawn_note(hidden, len(names), first_divergence, max_panels)
        note_text = f"{prefix} {', '.join(items)}"
        note = _wrap(prefix, items, chars=int(_PANEL_WIDTH * ncols * 12.5), lines=_NOTE_LINES)
    title_lines = max(
        _panel_title(n, first_divergence.get(n), n in ignored).count("\n") + 1
        for n in shown[:ncols]
    )
    top = 0.2 + 0.22 * (heading.count("\n") + 1) + 0.2 * title_lines  # inches, for the titles
    bottom = 0.55 + (0.2 + 0.16 * len(note) if note else 0.0)  # tick labels, "step", the note
    fig, outer, height = _grid(Figure, FigureCanvasAgg, len(shown), ncols, strip, top, bottom)
    for index, name in enumerate(shown):
        ax, ax_diff = _axes(fig, outer[index // ncols, index % ncols], strip)
        _panel(ax, ax_diff, name, a.get(name, {}), None if b is None else b.get(name, {}),
               labels, first_divergence.get(name), allowed.get(name),
               ignored=name in ignored, band=bands.get(name), x_label=x_label)  # fmt: skip
    if b is not None:
        fig.axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(
        heading,
        y=1 - 0.12 / height,
        va="top",
        fontsize=11,
        color=BAD if diverged else "black",
    )
    if note:
        fig.text(0.01, 0.12 / height, "\n".join(note), fontsize=8, va="bottom", ha="left",
                 color="#444444", family="monospace")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return Picture(out, tuple(shown), tuple(hidden), note_text)


def _grid(
    Figure: Any,
    FigureCanvasAgg: Any,
    panels: int,
    ncols: int,
    strip: bool,
    top: float,
    bottom: float,
) -> tuple[Any, Any, float]:
    """The figure, its grid of ``panels`` cells in ``ncols`` columns, and its height (inches),
    with ``top`` and ``bottom`` inches for the titles and the foot. The grid is fixed (no
    constrained layout), so the cost does not grow with the number of metrics."""
    nrows = math.ceil(panels / ncols)
    panel_h = 3.6 if strip else 2.8
    width = _PANEL_WIDTH * ncols
    height = panel_h * nrows + top + bottom
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    outer = fig.add_gridspec(
        nrows,
        ncols,
        left=0.75 / width,
        right=1 - 0.25 / width,
        top=1 - top / height,
        bottom=bottom / height,
        wspace=0.3,
        hspace=0.45 if strip else 0.55,
    )
    return fig, outer, height


def _axes(fig: Any, cell: Any, strip: bool) -> tuple[Any, Any]:
    """The axes of one panel in grid ``cell``: its curves, and below them (``strip``) the
    difference strip, else ``None``."""
    if not strip:
        return fig.add_subplot(cell), None
    inner = cell.subgridspec(2, 1, height_ratios=(3, 1), hspace=0.08)
    return fig.add_subplot(inner[0]), fig.add_subplot(inner[1])


def _excess_by_metric(
    a: Series,
    b: Series | None,
    allowed: Mapping[str, Mapping[int, float]],
    excess: Mapping[str, float],
) -> dict[str, float]:
    """``excess``, completed from ``allowed`` for the metrics both curves have."""
    out = dict(excess)
    if b is not None:
        for name in allowed:
            if name not in out and name in a and name in b:
                out[name] = _excess(a[name], b[name], allowed[name])
    return out


def _heading(
    heading: str,
    labels: tuple[str, str] | None,
    first_divergence: Mapping[str, int | None],
    ordered: list[str],
    ncols: int,
) -> tuple[str, bool]:
    """The picture's title, with (``labels`` given: two curves) a line saying which curve is
    which and where they first diverge, wrapped to the figure's width; and whether any
    metric diverged."""
    diverged = []
    if labels is not None:
        diverged = sorted((s, n) for n, s in first_divergence.items() if s is not None)
        line = f"{labels[0]} (solid) vs {labels[1]} (dashed): "
        if diverged:
            line += f"first divergence at step {diverged[0][0]}: "
            step = diverged[0][0]
            earliest = [n for n in ordered if first_divergence.get(n) == step]
            earliest += [n for s, n in diverged if s == step and n not in earliest]  # tensors
            line += _some(earliest, chars=max(40, ncols * 50 - len(line)))
        else:
            line += "all metrics within tolerance"
        heading += "\n" + line
    chars = int(_PANEL_WIDTH * ncols * 11)  # of the title's font in the figure's width
    return "\n".join(textwrap.fill(part, chars) for part in heading.split("\n")), bool(diverged)


def _not_drawn_note(
    hidden: list[str], total: int, first: Mapping[str, int | None], max_panels: int
) -> tuple[str, list[str]]:
    """``K of M metrics not drawn (at most N panels), D beyond tolerance (first step in
    brackets):`` and the names, those beyond tolerance first."""
    beyond = sum(first.get(n) is not None for n in hidden)
    prefix = f"{len(hidden)} of {total} metrics not drawn (at most {max_panels} panels)"
    if beyond:
        prefix += f", {beyond} of them beyond tolerance (first step in brackets)"
    return (
        prefix + ":",
        [f"{n} [{first[n]}]" if first.get(n) is not None else n for n in hidden],
    )


def _wrap(prefix: str, items: list[str], *, chars: int, lines: int) -> list[str]:
    """``prefix`` and ``items`` in at most ``lines`` lines of ``chars``; the last says how many
    items did not fit."""
    rows = [prefix]
    for n, item in enumerate(items):
        piece = item + ("," if n + 1 < len(items) else "")
        if len(rows[-1]) + 1 + len(piece) <= chars:
            rows[-1] += " " + piece
        elif len(rows) < lines:
            rows.append(piece)
        else:
            rest = len(items) - n
            while True:
                tail = f" ... and {rest} more"
                if len(rows[-1]) + len(tail) <= chars or " " not in rows[-1]:
                    break
                rows[-1] = rows[-1].rpartition(" ")[0]
                rest += 1
            rows[-1] = rows[-1].rstrip(",") + tail
            break
    return rows


def _split(curve: Mapping[int, float]) -> tuple[list[int], list[float], dict[int, float]]:
    """Steps and values to draw as a line (non-finite values as gaps), and the non-finite ones."""
    steps = sorted(curve)
    values = [curve[s] if math.isfinite(curve[s]) else math.nan for s in steps]
    return steps, values, {s: curve[s] for s in steps if not math.isfinite(curve[s])}


def _edge(value: float) -> tuple[float, str, str]:
    """Where a non-finite value sits (axes fraction), its marker and its label."""
    if math.isnan(value):
        return _TOP, "X", "nan"
    return (_TOP, "^", "inf") if value > 0 else (_BOTTOM, "v", "-inf")


def _mark_non_finite(ax: Any, points: Mapping[int, float], color: str, lane: int) -> None:
    """Draw non-finite ``points`` on the top or bottom edge of ``ax`` and label them (curve A's
    labels right of the mark, B's left)."""
    if not points:
        return
    edge = ax.get_xaxis_transform()  # x in steps, y in fractions of the axes
    groups: dict[tuple[float, str], list[int]] = {}
    for step, value in points.items():
        y, marker, _ = _edge(value)
        groups.setdefault((y, marker), []).append(step)
    from matplotlib.patches import Rectangle

    for y in {y for y, _ in groups}:  # a shaded strip along the edge: off the value scale
        band = Rectangle((0, y - 0.05), 1, 0.1, transform=ax.transAxes, color="#ececec", lw=0)
        ax.add_patch(band).set_zorder(0)
    for (y, marker), steps in groups.items():
        ax.plot(steps, [y] * len(steps), marker, color=color, ms=8, mec="black", mew=0.6,
                transform=edge, clip_on=False, zorder=5, ls="none")  # fmt: skip
    for step in sorted(points)[:_MARKED]:
        y, _, label = _edge(points[step])
        ax.annotate(label, (step, y), xycoords=edge, xytext=(-8 if lane else 8, 0),
                    textcoords="offset points", ha="right" if lane else "left", va="center",
                    fontsize=8, fontweight="bold", color=color)  # fmt: skip


def _panel_title(name: str, first: int | None, ignored: bool = False) -> str:
    """The metric's name (middle elided when long) and where it diverges (or that it is not
    compared), in one or two lines."""
    title = shortened(name)
    if first is None and not ignored:
        return title
    suffix = NOT_COMPARED if ignored else f"(diverges at step {first})"
    return title + ("\n" if len(title) + len(suffix) > 50 else "  ") + suffix


def _panel(
    ax: Any,
    ax_diff: Any,
    name: str,
    a: Mapping[int, float],
    b: Mapping[int, float] | None,
    labels: tuple[str, str],
    first: int | None,
    allowed: Mapping[int, float] | None,
    *,
    ignored: bool = False,
    band: Band | None = None,
    x_label: str = "step",
) -> None:
    """One metric's panel: its curves in ``ax`` (and ``band`` around curve A); with ``b`` and
    ``ax_diff``, the relative difference per step below them, and the first step beyond
    tolerance circled."""
    steps = _curves(ax, ax_diff, name, a, b, labels, first, ignored)
    if band is not None:
        _draw_band(ax, a, band)
    if ax_diff is None or b is None:
        ax.set_xlabel(x_label)
        _integer_steps(ax, steps)
        return
    ax.tick_params(labelbottom=False)
    _difference_strip(ax_diff, a, b, steps, first, None if ignored else allowed, ignored)
    _integer_steps(ax, steps)
    if first is not None and first in b:
        if math.isfinite(b[first]):
            ax.plot([first], [b[first]], "o", mfc="none", mec=BAD, ms=12, mew=1.5)
        else:
            y = _edge(b[first])[0]
            ax.plot([first], [y], "o", mfc="none", mec=BAD, ms=14, mew=1.5, clip_on=False,
                    transform=ax.get_xaxis_transform())  # fmt: skip


def _draw_band(ax: Any, a: Mapping[int, float], band: Band) -> None:
    """Shade in ``ax`` the band the calibration runs spanned around curve ``a``, outline the
    region the envelope allows, and add both to the panel's legend."""
    from matplotlib.colors import to_rgb

    allowances = band.allowances()
    margins = band.margins()[1:] or band.margins()
    rows = [
        (s, a[s], below, above, allowances[s])
        for s, below, above in zip(band.steps, band.below, band.above, strict=True)
        if s in a and math.isfinite(a[s])
    ]
    if not rows:
        return
    steps, centre, below, above, allowed = (list(column) for column in zip(*rows, strict=True))
    low = [c - w for c, w in zip(centre, allowed, strict=True)]
    high = [c + w for c, w in zip(centre, allowed, strict=True)]
    ax.fill_between(steps, low, high, facecolor=(*to_rgb(_ALLOWED), 0.1),
                    edgecolor=_ALLOWED, linestyle="--", lw=0.8, zorder=0,
                    label=f"band x{max(margins):g}")  # fmt: skip
    ax.fill_between(steps, [c - w for c, w in zip(centre, below, strict=True)],
                    [c + w for c, w in zip(centre, above, strict=True)], facecolor=_RUNS,
                    alpha=0.6, lw=0, zorder=1,
                    label=f"calibration runs ({band.runs})")  # fmt: skip
    ax.legend(fontsize=7, loc="best")


def _curves(
    ax: Any,
    ax_diff: Any,
    name: str,
    a: Mapping[int, float],
    b: Mapping[int, float] | None,
    labels: tuple[str, str],
    first: int | None,
    ignored: bool,
) -> list[int]:
    """Draw curve A (solid) and B (dashed), the panel's title and the first divergence (a
    dotted line in ``ax`` and ``ax_diff``); return every step either curve has."""
    steps_a, values_a, odd_a = _split(a)
    dots = len(a) <= _BARS and (b is None or len(b) <= _BARS)  # a marker per step
    ax.plot(steps_a, values_a, "-o" if dots else "-", color=_A_COLOR, label=labels[0], ms=4)
    _mark_non_finite(ax, odd_a, _A_COLOR, 0)
    odd_b: dict[int, float] = {}
    if b is not None:
        steps_b, values_b, odd_b = _split(b)
        ax.plot(steps_b, values_b, "--x" if dots else "--", color=_B_COLOR, label=labels[1], ms=6)
        _mark_non_finite(ax, odd_b, _B_COLOR, 1)
    ax.margins(y=0.2 if odd_a or odd_b else 0.05)  # room for edge marks
    title = _panel_title(name, first, ignored)
    if first is not None:
        for axis in (ax, ax_diff):
            if axis is not None:
                axis.axvline(first, color=BAD, lw=1.2, ls=":")
    color = BAD if first is not None else "#7f7f7f" if ignored else "black"
    ax.set_title(title, fontsize=10, color=color, loc="left")
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="y", useOffset=False)
    steps = sorted(set(a) | set(b or {}))
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    return steps


def _difference_strip(
    ax_diff: Any,
    a: Mapping[int, float],
    b: Mapping[int, float],
    steps: list[int],
    first: int | None,
    allowed: Mapping[int, float] | None,
    ignored: bool,
) -> None:
    """The strip below a panel, per step on a log scale (bars, or stems past :data:`_BARS`
    steps): ``|B-A|`` over the difference ``allowed`` at that step, so that the tolerance is
    the dashed line at 1 and a bar above it is beyond; where a step has no allowance (an
    exact or ignored value), ``|B-A|/|A|`` and no line. Non-finite differences marked, ``=``
    on equal steps."""
    shared = [s for s in steps if s in a and s in b]
    limits = allowed or {}
    gated = bool(limits) and all(limits.get(s, 0.0) > 0 for s in shared)
    same, rel, odd = _relative_differences(a, b, shared, limits if gated else None)
    nonzero = {s: r for s, r in rel.items() if r > 0}
    if nonzero:
        # on the tolerance's scale a bar says itself whether it is beyond; else from `first` on
        late = {s for s in nonzero if first is not None and s >= first}
        beyond = {s for s, r in nonzero.items() if r > 1.0} if gated else late
        _difference_bars(ax_diff, nonzero, [*nonzero.values(), *([1.0] * gated)], beyond, ignored)
    else:
        ax_diff.set_yticks([])
        if not odd:
            ax_diff.text(0.5, 0.5, "identical at every step", transform=ax_diff.transAxes,
                         ha="center", va="center", fontsize=8, color="#2ca02c")  # fmt: skip
    if odd:
        edge = ax_diff.get_xaxis_transform()
        ax_diff.plot(list(odd), [0.85] * len(odd), "^", color=BAD, ms=7, transform=edge,
                     zorder=5, ls="none")  # fmt: skip
        for s in sorted(odd)[:_MARKED]:
            ax_diff.annotate(odd[s], (s, 0.85), xycoords=edge, xytext=(6, -8),
                             textcoords="offset points", ha="left", va="center", fontsize=7,
                             fontweight="bold", color=BAD)  # fmt: skip
    if len(shared) <= _EQUALS and (nonzero or odd):
        for s in shared:
            if s in same or rel.get(s) == 0:
                ax_diff.text(s, 0.05, "=", transform=ax_diff.get_xaxis_transform(),
                             ha="center", fontsize=8, color="#2ca02c")  # fmt: skip
    label = STRIP_LABEL if gated else "|B-A|/|A|"
    if gated and nonzero:
        ax_diff.axhline(1.0, color="black", lw=0.8, ls="--")
        label += "\n-- tolerance"
    if ignored and (nonzero or odd):
        ax_diff.text(0.5, 0.5, "not compared (ignored): differences not gated",
                     transform=ax_diff.transAxes, ha="center", va="center", fontsize=8,
                     color="#555555",
                     bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})  # fmt: skip
    ax_diff.set_ylabel(label, fontsize=8)
    ax_diff.set_xlabel("step")
    ax_diff.grid(alpha=0.3, axis="y")
    ax_diff.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    _integer_steps(ax_diff, steps)


def _relative_differences(
    a: Mapping[int, float],
    b: Mapping[int, float],
    shared: list[int],
    allowed: Mapping[int, float] | None = None,
) -> tuple[set[int], dict[int, float], dict[int, str]]:
    """Of the ``shared`` steps: those where A and B are equal; ``|B-A|`` over the difference
    ``allowed`` at the step, or without it over ``|A|`` (``|B-A|`` where A is 0), of the
    others; and ``"nan"`` or ``"inf"`` where that is not a finite number."""
    same = {s for s in shared if a[s] == b[s]}  # equal infinities too; never NaN
    rel: dict[int, float] = {}
    odd: dict[int, str] = {}
    for s in shared:
        if s in same:
            continue
        diff = abs(b[s] - a[s])
        if math.isnan(a[s]) or math.isnan(b[s]):
            odd[s] = "nan"
        elif not math.isfinite(diff):
            odd[s] = "inf"
        elif allowed is not None:
            rel[s] = diff / allowed[s]
        else:
            rel[s] = diff / abs(a[s]) if a[s] else diff
    return same, rel, odd


def _difference_bars(
    ax_diff: Any, nonzero: dict[int, float], values: list[float], beyond: set[int], ignored: bool
) -> None:
    """The non-zero differences on a log scale spanning ``values`` (they and the allowed
    one); red at the steps ``beyond`` tolerance."""
    grey = _IGNORED if ignored else "#7f7f7f"
    colors = [BAD if s in beyond else grey for s in nonzero]
    ax_diff.set_yscale("log")
    if len(nonzero) <= _BARS:
        ax_diff.bar(list(nonzero), list(nonzero.values()), color=colors, width=0.5)
    else:  # one line per color, its stems separated by NaN: cheap for many steps
        low = min(values) / 10
        for color in set(colors):
            xs, ys = [], []
            for (step, r), c in zip(nonzero.items(), colors, strict=True):
                if c == color:
                    xs += [step, step, math.nan]
                    ys += [low, r, math.nan]
            ax_diff.plot(xs, ys, color=color, lw=1)
    ax_diff.set_ylim(min(values) / 10, max(values) * 10)


def _integer_steps(ax: Any, steps: list[int]) -> None:
    from matplotlib.ticker import MaxNLocator

    if len(steps) <= 10:  # every step a tick (MaxNLocator gives -0.5, 0.5 around one step)
        ax.set_xticks(steps)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=10))


def plot_failure(outcome: Mapping[str, Any], directory: Path, test_id: str) -> Picture | None:
    """The picture of a failed golden test (``--golden-plot DIR``) in ``directory``, named
    for ``test_id``; ``None`` when it compared no metric."""
    from ...store.location import safe_name

    if not any(c["kind"] == "metric" for c in outcome["comparisons"]):
        return None
    return plot_outcome(outcome, directory / f"{safe_name(test_id)}.png")


_PLOTS_FORMAT = "pytest-rollout-golden-plots"


def remove_earlier_plots(directory: Path) -> list[Path]:
    """Remove the pictures an earlier ``--golden-plot`` run wrote into ``directory``: those
    its manifest lists, plain ``.png`` names in ``directory`` itself, nothing else (a user's
    files stay). Returns the removed ones."""
    from ...store import read_json
    from ...store.location import PLOTS_MANIFEST

    try:
        manifest = read_json(directory / PLOTS_MANIFEST)
    except (OSError, GoldenError):  # none yet, or not ours to read: remove nothing
        return []
    if not isinstance(manifest, dict) or manifest.get("format") != _PLOTS_FORMAT:
        return []
    removed = []
    for name in manifest.get("plots") or ():
        path = directory / str(name)
        if Path(str(name)).name != name or path.suffix != ".png" or not path.is_file():
            continue  # a path out of directory, or not a picture: never the plugin's
        path.unlink()
        removed.append(path)
    return removed


def write_plots_manifest(directory: Path, pictures: Sequence[str]) -> None:
    """List this run's pictures in ``directory`` for the next run to remove (see
    :func:`remove_earlier_plots`)."""
    from ...store import atomic_write, encode_json
    from ...store.location import PLOTS_MANIFEST

    if not pictures and not directory.is_dir():
        return
    names = sorted({Path(p).name for p in pictures})
    atomic_write(
        directory / PLOTS_MANIFEST, [encode_json({"format": _PLOTS_FORMAT, "plots": names})]
    )


def _number(value: Any) -> float | None:
    """A comparison's value as a float (``"inf"``, ``"-inf"``, ``"nan"`` too), else ``None``."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def allowance(comparison: Mapping[str, Any]) -> float | None:
    """The difference a metric's comparison (as the report has it) allowed at its step:
    ``atol + rtol * max(|expected|, scale)``; ``None`` where none is (exact, ignored, or no
    finite expected value)."""
    from ..tolerance.spec import Tolerance

    tol = comparison.get("tolerance") or {}
    expected = _number(comparison.get("expected"))
    if tol.get("exact") or tol.get("ignore") or "rtol" not in tol or expected is None:
        return None
    found = Tolerance(rtol=tol["rtol"], atol=tol["atol"], scale=tol.get("scale"))
    limit = found.allowance(expected, comparison.get("scale"))
    return limit if math.isfinite(limit) else None


def plot_outcome(outcome: Mapping[str, Any], out: Path) -> Picture:
    """The picture of one golden test's comparisons: recorded (expected) against this run."""
    expected: dict[str, dict[int, float]] = {}
    actual: dict[str, dict[int, float]] = {}
    first: dict[str, int | None] = {}
    allowed: dict[str, dict[int, float]] = {}
    excess: dict[str, float] = {}
    for c in outcome["comparisons"]:
        if c["kind"] != "metric":
            continue
        name, step = c["metric"], c["step"]
        for target, value in ((expected, c.get("expected")), (actual, c.get("actual"))):
            number = _number(value)
            if number is not None:
                target.setdefault(name, {})[step] = number
        first.setdefault(name, None)
        if c["verdict"] == "fail":
            first[name] = step if first[name] is None else min(first[name], step)
            beyond = _number(c.get("excess"))
            if beyond is not None:
                beyond = math.inf if math.isnan(beyond) else beyond
                excess[name] = max(excess.get(name, 0.0), beyond)
        limit = allowance(c)
        if limit is not None:
            allowed.setdefault(name, {})[step] = limit
    ignored = {
        c["metric"]
        for c in outcome["comparisons"]
        if c["kind"] == "metric" and c["verdict"] == "not compared"
    }
    failed_tensors = sorted(
        {
            c["metric"]
            for c in outcome["comparisons"]
            if c["kind"] == "tensor" and c["verdict"] == "fail"
        }
    )
    title = f"{outcome['test']}  (golden {display(outcome['directory'])})"
    bands = _replayed_bands(outcome)
    if failed_tensors:
        title += f"\ntensors beyond tolerance (not drawn): {_some(failed_tensors, chars=100)}"
    return plot_metrics(
        expected,
        out,
        b=actual,
        labels=("recorded (golden)", "this run"),
        title=title,
        first_divergence=first,
        allowed=allowed,
        excess=excess,
        ignored=ignored,
        bands=bands,
    )


def _replayed_bands(outcome: Mapping[str, Any]) -> dict[str, Band]:
    """The envelope's bands of the metrics whose tolerance came from it in this replay (a
    tolerance given above it, such as ``--golden-tolerance``, draws none)."""
    from ..golden.golden_files import read_envelope
    from ..tolerance.envelope import VARIANT_SOURCE, band_source

    sources = {
        c["metric"]: lane
        for c in outcome["comparisons"]
        if c["kind"] == "metric" and (lane := band_source(c.get("tolerance_source") or ""))
    }
    if not sources:
        return {}
    variant = VARIANT_SOURCE in sources.values()
    try:
        envelope = read_envelope(Path(outcome["directory"]), layout_variant=variant)
    except GoldenError:  # the failure itself says why; the picture is drawn without it
        return {}
    bands = {} if envelope is None else envelope.bands
    return {name: band for name, band in bands.items() if name in sources}
