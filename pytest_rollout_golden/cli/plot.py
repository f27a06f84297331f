"""``rollout-golden plot``: the metric curves of a golden (against another, or of every golden
of a root) to PNG files, the first divergence and the envelope marked.

matplotlib is imported by the drawing functions themselves, on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from .._internal.golden.golden_files import load_golden, read_envelope
from .._internal.golden.lanes import lane_values, split_lane

# The drawing functions are called through their modules: the docs' figure harness
# (tests/project/doc_figures.py) records what is drawn by replacing them there.
from .._internal.report import plot as drawing
from .._internal.report.diff import diff_goldens, pair_paths
from .._internal.report.diff_text import lane_inputs_changed
from .._internal.tolerance.envelope import band_source
from .._internal.tolerance.stack import Stack
from ..errors import GoldenError
from ..store.location import MANIFEST, METRICS


def add_parser(sub: Any) -> None:
    """``rollout-golden plot``'s arguments."""
    p_plot = sub.add_parser(
        "plot", help="draw metric curves of golden A (against B) to a PNG (goldens or roots)"
    )
    p_plot.add_argument("a", type=Path)
    p_plot.add_argument("b", type=Path, nargs="?")
    p_plot.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="PNG file to write; given golden roots, the directory to write one PNG per golden",
    )


def plot(a: Path, b: Path | None, out: Path, tolerances: Stack) -> int:
    """Draw the metric curves of golden ``a`` (against ``b``) into the PNG ``out``.

    Paths resolve as for ``diff``
    (:func:`~pytest_rollout_golden._internal.report.diff.pair_paths`), ``GOLDEN@LANE``
    included. Given golden roots, ``out`` is a directory: one PNG per golden (pair), at the
    golden's path relative to its root (``OUT/REL.png``); a golden on one side only, or
    without the lane asked for, is named, not drawn.
    """
    a, lane_a = split_lane(a)
    b, lane_b = split_lane(b) if b is not None else (None, None)
    lanes = (lane_a, lane_b)
    pairs = pair_paths(a, b)
    if a.is_file():
        raise GoldenError(f"{a}: a batch file holds no metric curves; plot takes goldens or roots")
    if (a / MANIFEST).is_file():
        return _plot_pair(_plot_sides(pairs[0].a or a, pairs[0].b, lanes), out, tolerances)
    if out.suffix.lower() == ".png":
        raise GoldenError(
            f"{out}: given golden roots, -o names a directory (one PNG per golden in it)"
        )
    for pair in pairs:
        if pair.a is None or (b is not None and pair.b is None):
            side, path = ("A", pair.a) if pair.a is not None else ("B", pair.b)
            print(f"not drawn: {pair.label}: golden only in {side} ({path})")
            continue
        try:
            sides = _plot_sides(pair.a, pair.b, lanes)
        except GoldenError as exc:
            if lanes == (None, None):
                raise
            print(f"not drawn: {pair.label}: {exc}")
            continue
        _plot_pair(sides, out / f"{pair.label}.png", tolerances)
    return 0


class _Sides(NamedTuple):
    """What one picture of ``plot`` draws: the directories of the values, its title, the
    legend's names, and whether only values are compared (lanes: the inputs are shared)."""

    a: Path
    b: Path | None
    title: str
    labels: tuple[str, str]
    values_only: bool


def _plot_sides(a: Path, b: Path | None, lanes: tuple[str | None, str | None]) -> _Sides:
    """Where the values of golden ``a`` (and ``b``) are, in lanes ``lanes`` if any. Raises
    :class:`GoldenError` for a lane a golden lacks, or one computed on other inputs."""
    if lanes == (None, None):
        title = f"{a}" if b is None else f"{a} vs {b}"
        labels = (a.name, b.name) if b is not None and a.name != b.name else ("A", "B")
        return _Sides(a, b, title, labels, False)
    sides = [lane_values(a, lanes[0]), *([] if b is None else [lane_values(b, lanes[1])])]
    for side in sides:
        if side.stale:
            changed = lane_inputs_changed(str(side.lane), side.stale)
            raise GoldenError(f"{side.directory}: {changed}")
    named = [f"{golden}@{side.lane}" for golden, side in zip((a, b), sides, strict=False)]
    names = [str(side.lane) for side in sides]
    labels = (names[0], names[1]) if len(set(names)) == 2 else ("A", "B")
    b_values = sides[1].directory if b is not None else None
    return _Sides(sides[0].directory, b_values, " vs ".join(named), labels, True)


def _plot_pair(sides: _Sides, out: Path, tolerances: Stack) -> int:
    """One picture: golden ``a``'s curves (and its envelope), against ``b``'s when given."""
    a, b = sides.a, sides.b
    curves = [
        drawing.series(load_golden(path)[1].get(METRICS, {}).get("steps", {}))
        for path in (a, b)
        if path is not None
    ]
    envelope = read_envelope(a)
    bands = dict(envelope.bands) if envelope is not None else {}
    first, allowed = None, None
    if b is not None:
        result = diff_goldens(a, b, tolerances, label=a.name, values_only=sides.values_only)
        first = {n: s for n, s in result.first_divergence().items()}
        allowed: dict[str, dict[int, float]] = {}
        for row in result.rows:
            if row.kind == "metric" and row.compared and row.allowance is not None:
                allowed.setdefault(row.name, {})[row.step] = row.allowance  # type: ignore[index]
            if row.kind == "metric" and not band_source(row.source):  # a tolerance above the band
                bands.pop(row.name, None)
        ignored = {r.name for r in result.rows if r.kind == "metric" and not r.compared}
    else:
        resolver = tolerances.resolver()
        ignored = {n for n in curves[0] if resolver.resolve(n)[0].ignore}
    picture = drawing.plot_metrics(
        curves[0],
        out,
        b=curves[1] if b is not None else None,
        labels=sides.labels,
        title=sides.title,
        first_divergence=first,
        allowed=allowed,
        ignored=ignored,
        bands={n: band for n, band in bands.items() if n not in ignored},
    )
    print(f"wrote {out}")
    if picture.not_drawn_note:
        print(picture.not_drawn_note)
    return 0
