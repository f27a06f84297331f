"""The text of ``rollout-golden diff``: the metric and tensor tables of two goldens and
the summary line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..results import GoldenDiff, Row
from ..wording import number, plural, table

_ROWS_SHOWN = 30  # rows beyond tolerance printed per golden and table; --json has them all


def diff_allowed(row: Row) -> str:
    """The "allowed" cell of a ``diff`` row."""
    if not row.compared:
        return f"not compared ({row.source})"
    if not row.allowed:
        return "-"
    return f"{row.allowed} ({row.source})" if row.source else row.allowed


def diff_allow_nan(name: str) -> str:
    """``diff``'s hint on NaN against NaN: the option that allows it there."""
    return (
        "NaN equals NaN only where the tolerance sets equal_nan "
        f"(e.g. --tolerance {name}:equal_nan=true); fix the NaN, or allow it"
    )


def diff_mask_note(selected: int, positions: int) -> str:
    """``diff``'s note on a tensor the plugin compared under a mask it did not store."""
    return (
        f"recorded under a mask of {selected} of {positions} positions; "
        f"diff compares all {positions} (padding included)"
    )


def _shape(row: Row, side: int) -> str:
    shape, dtype = row.shape[side], row.dtype[side]
    return "missing" if shape is None else f"{dtype}{shape}"


def golden_diff_lines(d: GoldenDiff) -> list[str]:
    """``rollout-golden diff``'s report of one golden's differences."""
    metrics = [r for r in d.rows if r.kind == "metric"]
    tensors = [r for r in d.rows if r.kind == "tensor"]
    if d.one_sided:
        return [f"{d.label}: DIFFERS: {d.problems[0]}"]
    verdict = f"DIFFERS ({d.differences} beyond tolerance)" if d.differences else "ok"
    compared = f"{plural(len(metrics), 'metric value')}, {plural(len(tensors), 'tensor')} compared"
    lines = [f"{d.label}: {verdict}; {compared}"]
    first = d.first_divergence()
    if metrics:
        lines += _diff_metric_table(metrics, first)
        lines += _diff_metrics_beyond([r for r in metrics if not r.ok])
    failing = [r for r in tensors if not r.ok]
    if failing:
        lines += _diff_tensors_beyond(failing, first)
    if tensors and len(failing) < len(tensors):
        within = len(tensors) - len(failing)
        lines.append(f"  {within} of {plural(len(tensors), 'tensor')} within tolerance")
    ignored = sorted({r.name for r in d.rows if not r.compared})
    if ignored:
        lines.append(f"  not compared (excluded on purpose): {', '.join(ignored)}")
    lines += [f"  {problem}" for problem in d.problems]
    return lines


def _diff_metric_table(metrics: list[Row], first: Mapping[str, int | None]) -> list[str]:
    """One row per metric of a ``diff``: its first divergence, steps beyond tolerance and
    greatest differences."""
    cells = [
        ("metric", "first divergence", "steps beyond", "max abs diff", "max rel diff", "allowed")
    ]
    for name in dict.fromkeys(r.name for r in metrics):
        rows = [r for r in metrics if r.name == name]
        bad = sum(not r.ok for r in rows)
        compared = [r for r in rows if r.compared and r.detail[:4] != "only"]
        cells.append(
            (
                name,
                "-" if first[name] is None else f"step {first[name]}",
                f"{bad}/{len(rows)}",
                number(max((r.abs_max for r in compared), default=None), 3),
                number(max((r.rel_max for r in compared), default=None), 3),
                diff_allowed(rows[0]),
            )
        )
    return table(cells)


def _diff_metrics_beyond(failing: list[Row]) -> list[str]:
    """The metric values of a ``diff`` beyond tolerance, one row each (the first
    :data:`_ROWS_SHOWN`)."""
    if not failing:
        return []
    cells = [("metric", "step", "A", "B", "abs diff", "rel diff", "")]
    for r in failing[:_ROWS_SHOWN]:
        cells.append(
            (
                r.name,
                r.step,
                number(r.expected),
                number(r.actual),
                number(r.abs_max, 3),
                number(r.rel_max, 3),
                r.detail.replace("\n", "; "),
            )
        )
    lines = ["  metric values beyond tolerance:", *table(cells, "    ")]
    if len(failing) > _ROWS_SHOWN:
        lines.append(f"    ... and {len(failing) - _ROWS_SHOWN} more (--json lists all)")
    return lines


def _diff_tensors_beyond(failing: list[Row], first: Mapping[str, int | None]) -> list[str]:
    """The tensors of a ``diff`` beyond tolerance: a row each, then what their details say
    (the first :data:`_ROWS_SHOWN`)."""
    cells = [
        (
            "tensor",
            "step",
            "rank",
            "micro",
            "A",
            "B",
            "mismatched",
            "max abs",
            "mean abs",
            "max rel",
            "mean rel",
            "first divergence",
            "allowed",
        )
    ]
    for r in failing[:_ROWS_SHOWN]:
        cells.append(
            (
                r.name,
                number(r.step),
                number(r.rank),
                number(r.micro),
                _shape(r, 0),
                _shape(r, 1),
                f"{r.mismatched}/{r.numel}" if r.numel else "-",
                number(r.abs_max, 3),
                number(r.abs_mean, 3),
                number(r.rel_max, 3),
                number(r.rel_mean, 3),
                "-" if first[r.name] is None else f"step {first[r.name]}",
                diff_allowed(r),
            )
        )
    lines = ["  tensors beyond tolerance:", *table(cells, "    ")]
    if len(failing) > _ROWS_SHOWN:
        lines.append(f"    ... and {len(failing) - _ROWS_SHOWN} more (--json lists all)")
    for r in failing[:_ROWS_SHOWN]:
        block = [r.note] if r.note else []
        if r.detail and "\n" in r.detail:
            block += r.detail.splitlines()
        if block:
            lines.append(f"    {r.name} (step {number(r.step)}):")
            lines += ["      " + line for line in block]
    return lines


def diff_summary(counts: Mapping[str, int]) -> str:
    """The last line of ``rollout-golden diff``."""
    return (
        f"{plural(counts['goldens'], 'golden')} compared: "
        f"{counts['differ']} differ beyond tolerance, {counts['within_tolerance']} within "
        f"tolerance, {counts['one_sided']} on one side only"
    )


def lane_inputs_changed(lane: str, stale: Sequence[str]) -> str:
    """A lane whose values were computed on inputs the golden no longer holds, as
    ``rollout-golden`` reports it (replay refuses it with :func:`lane_on_other_inputs`)."""
    return (
        f"the values of lane {lane!r} were computed on other inputs than the golden holds "
        f"({', '.join(stale)} changed since); re-record this lane on its hardware: "
        f"`pytest --update-golden --golden-lane {lane}`, then commit the golden/ directory"
    )
