"""Pictures of metric curves over steps: one golden, or expected (A) against actual (B).

One panel per scalar metric. With two curves each panel has a strip below it
with the relative difference per step against the allowed one, and the first
step beyond tolerance is marked. Needs matplotlib (``pip install
'pytest-rollout-golden[plot]'``); nothing else in the package imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import GoldenError
from .presentation import display

Series = Mapping[str, Mapping[int, float]]  # metric -> step -> value

MISSING_MATPLOTLIB = (
    "plotting needs matplotlib, which is not installed; "
    "install it with: pip install 'pytest-rollout-golden[plot]'"
)
_A_COLOR, _B_COLOR, _BAD = "#1f77b4", "#ff7f0e", "#d62728"


def series(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """The scalar metrics of a ``metrics.json`` ``steps`` table, as curves."""
    from . import metrics as metric_codec

    out: dict[str, dict[int, float]] = {}
    for step, names in steps.items():
        for name, node in names.items():
            value = metric_codec.scalar(node)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(name, {})[int(step)] = float(value)
    return out


def _figure_classes() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise GoldenError(MISSING_MATPLOTLIB) from None
    return Figure, FigureCanvasAgg


def plot_metrics(
    a: Series,
    out: Path,
    *,
    b: Series | None = None,
    labels: tuple[str, str] = ("A", "B"),
    title: str = "",
    first_divergence: Mapping[str, int | None] | None = None,
    allowed: Mapping[str, tuple[float, float]] | None = None,
) -> Path:
    """Draw one panel per metric of ``a`` (and ``b``) and write a PNG to ``out``.

    ``first_divergence`` marks, per metric, the first step beyond tolerance;
    ``allowed`` gives ``(rtol, atol)`` per metric for the difference strip.
    """
    Figure, FigureCanvasAgg = _figure_classes()
    names = sorted(set(a) | set(b or {}))
    if not names:
        raise GoldenError(f"nothing to plot for {title or out}: no scalar metrics")
    first_divergence = first_divergence or {}
    allowed = allowed or {}
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    strip = b is not None
    fig = Figure(figsize=(5.0 * ncols, (3.6 if strip else 2.8) * nrows + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    outer = fig.add_gridspec(nrows, ncols)
    for index, name in enumerate(names):
        cell = outer[index // ncols, index % ncols]
        if strip:
            inner = cell.subgridspec(2, 1, height_ratios=(3, 1), hspace=0.05)
            ax, ax_diff = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
        else:
            ax, ax_diff = fig.add_subplot(cell), None
        _panel(ax, ax_diff, name, a.get(name, {}), None if b is None else b.get(name, {}),
               labels, first_divergence.get(name), allowed.get(name))  # fmt: skip
    if b is not None:
        fig.axes[0].legend(fontsize=8, loc="best")
    heading = title or str(out)
    if b is not None:
        diverged = sorted((s, n) for n, s in first_divergence.items() if s is not None)
        verdict = (
            f"first divergence at step {diverged[0][0]}: "
            + ", ".join(n for s, n in diverged if s == diverged[0][0])
            if diverged
            else "all metrics within tolerance"
        )
        heading += f"\n{labels[0]} (solid) vs {labels[1]} (dashed): {verdict}"
    fig.suptitle(heading, fontsize=11, color=_BAD if b is not None and diverged else "black")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _panel(
    ax: Any,
    ax_diff: Any,
    name: str,
    a: Mapping[int, float],
    b: Mapping[int, float] | None,
    labels: tuple[str, str],
    first: int | None,
    allowed: tuple[float, float] | None,
) -> None:
    steps_a = sorted(a)
    ax.plot(steps_a, [a[s] for s in steps_a], "-o", color=_A_COLOR, label=labels[0], ms=4)
    if b is not None:
        steps_b = sorted(b)
        ax.plot(steps_b, [b[s] for s in steps_b], "--x", color=_B_COLOR, label=labels[1], ms=6)
    title = name
    if first is not None:
        title += f"  (diverges at step {first})"
        for axis in (ax, ax_diff):
            if axis is not None:
                axis.axvline(first, color=_BAD, lw=1.2, ls=":")
    ax.set_title(title, fontsize=10, color=_BAD if first is not None else "black", loc="left")
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="y", useOffset=False)
    steps = sorted(set(a) | set(b or {}))
    if ax_diff is None or b is None:
        ax.set_xlabel("step")
        _integer_steps(ax, steps)
        return
    ax.tick_params(labelbottom=False)
    shared = [s for s in steps if s in a and s in b]
    rel = {s: abs(b[s] - a[s]) / abs(a[s]) if a[s] else abs(b[s] - a[s]) for s in shared}
    nonzero = {s: r for s, r in rel.items() if r > 0}
    rtol = allowed[0] if allowed is not None and allowed[0] > 0 else None
    if nonzero:
        colors = [_BAD if first is not None and s >= first else "#7f7f7f" for s in nonzero]
        ax_diff.bar(list(nonzero), list(nonzero.values()), color=colors, width=0.5)
        ax_diff.set_yscale("log")
        values = [*nonzero.values(), *([rtol] if rtol else [])]
        ax_diff.set_ylim(min(values) / 10, max(values) * 10)
    else:
        ax_diff.set_yticks([])
        ax_diff.text(0.5, 0.5, "identical at every step", transform=ax_diff.transAxes,
                     ha="center", va="center", fontsize=8, color="#2ca02c")  # fmt: skip
    for s in shared:
        if rel[s] == 0 and nonzero:
            ax_diff.text(s, 0.05, "=", transform=ax_diff.get_xaxis_transform(), ha="center",
                         fontsize=8, color="#2ca02c")  # fmt: skip
    label = "|B-A|/|A|"
    if rtol is not None and nonzero:
        ax_diff.axhline(rtol, color="black", lw=0.8, ls="--")
        label += f"\n-- rtol {rtol:.0e}"
    ax_diff.set_ylabel(label, fontsize=7)
    ax_diff.set_xlabel("step")
    ax_diff.grid(alpha=0.3, axis="y")
    for axis in (ax, ax_diff):
        axis.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    _integer_steps(ax_diff, steps)
    _integer_steps(ax, steps)
    if first is not None and first in b:
        ax.plot([first], [b[first]], "o", mfc="none", mec=_BAD, ms=12, mew=1.5)


def _integer_steps(ax: Any, steps: list[int]) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(10, max(len(steps), 1))))


def plot_failure(outcome: Mapping[str, Any], directory: Path, test_id: str) -> Path | None:
    """The picture of a failed golden test (``--golden-plot DIR``) in ``directory``, named
    for ``test_id``; ``None`` when it compared no metric."""
    from .location import safe_name

    if not any(c["kind"] == "metric" for c in outcome["comparisons"]):
        return None
    return plot_outcome(outcome, directory / f"{safe_name(test_id)}.png")


def plot_outcome(outcome: Mapping[str, Any], out: Path) -> Path:
    """The picture of one golden test's comparisons: recorded (expected) against this run."""
    expected: dict[str, dict[int, float]] = {}
    actual: dict[str, dict[int, float]] = {}
    first: dict[str, int | None] = {}
    allowed: dict[str, tuple[float, float]] = {}
    for c in outcome["comparisons"]:
        if c["kind"] != "metric":
            continue
        name, step = c["metric"], c["step"]
        for target, value in ((expected, c.get("expected")), (actual, c.get("actual"))):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                target.setdefault(name, {})[step] = float(value)
        first.setdefault(name, None)
        if c["verdict"] == "fail":
            first[name] = step if first[name] is None else min(first[name], step)
        tol = c.get("tolerance") or {}
        if not tol.get("exact") and not tol.get("ignore") and "rtol" in tol:
            allowed[name] = (tol["rtol"], tol["atol"])
    failed_tensors = sorted(
        {
            c["metric"]
            for c in outcome["comparisons"]
            if c["kind"] == "tensor" and c["verdict"] == "fail"
        }
    )
    title = f"{outcome['test']}  (golden {display(outcome['directory'])})"
    if failed_tensors:
        title += f"\ntensors beyond tolerance (not drawn): {', '.join(failed_tensors)}"
    return plot_metrics(
        expected,
        out,
        b=actual,
        labels=("recorded (golden)", "this run"),
        title=title,
        first_divergence=first,
        allowed=allowed,
    )
