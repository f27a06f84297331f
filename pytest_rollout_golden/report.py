"""The end-of-session terminal summary."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .session import SessionState

_LIMIT = 20  # lines per section before "... and N more"


def _num(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:.8g}" if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return f"{value.get('dtype')}{value.get('shape')}"
    return str(value)


def _moved(c: dict[str, Any]) -> str:
    where = f"step {c['step']}" + "".join(
        f", {k} {c[k]}" for k in ("rank", "micro") if c.get(k) is not None
    )
    label = f"{c['metric']} ({where})"
    if c["verdict"] == "new":
        return f"{label}: new"
    abs_diff, rel_diff = c.get("abs_diff"), c.get("rel_diff")
    if c.get("actual") == "nan":  # to_json's NaN; the difference of NaN to NaN reads 0
        return f"{label}: {_num(c['expected'])} -> nan (NaN: replay fails unless equal_nan)"
    if abs_diff == 0:
        return f"{label}: unchanged"
    change = f"abs {_num(abs_diff)}, rel {_num(rel_diff)}"
    if c["kind"] == "metric" and not isinstance(c.get("expected"), dict):
        return f"{label}: {_num(c['expected'])} -> {_num(c['actual'])} ({change})"
    return f"{label}: changed (greatest {change})"


def calibrated_table(entry: dict[str, Any], directory: str) -> list[str]:
    """The summary's table of one golden's calibrated tolerances (``--golden-calibrate``)."""
    if not entry["rows"]:
        return [f"not calibrated: {directory} ({entry['skipped']})"]
    lines = [f"calibrated tolerances written to {directory}/tolerances.json:"]
    lanes = {row.get("lane", "same layout") for row in entry["rows"]} != {"same layout"}
    table = [("metric", "rel spread", "abs spread", "at step", "rtol", "atol")]
    if lanes:
        table = [("lane", *table[0])]
    for row in entry["rows"]:
        kept = "rtol" not in row
        table.append(
            (
                *((row.get("lane", "same layout"),) if lanes else ()),
                row["metric"],
                f"{row['rel_spread']:.3g}",
                f"{row['abs_spread']:.3g}",
                "-" if row["at_step"] is None else str(row["at_step"]),
                "default kept" if kept else f"{row['rtol']:.3g}",
                "-" if kept else f"{row['atol']:.3g}",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines += [
        ("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in table
    ]
    if entry["skipped"]:
        lines.append(f"    left out: {entry['skipped']}")
    return lines


def not_compared(outcomes: Iterable[dict[str, Any]]) -> list[str]:
    """One line per test: the metrics and tensors it excluded, their steps and who said so."""
    lines = []
    for outcome in outcomes:
        steps: dict[tuple[str, str], set[int]] = {}
        for c in outcome["comparisons"]:
            if c["verdict"] == "not compared":
                steps.setdefault((c["metric"], c["tolerance_source"]), set()).add(c["step"])
        if steps:
            items = [
                f"{name} ({_steps(sorted(s))}; {source})" for (name, source), s in steps.items()
            ]
            lines.append(f"{outcome['test']}: {', '.join(items)}")
    return lines


def _steps(values: list[int]) -> str:
    if len(values) == 1:
        return f"step {values[0]}"
    if values == list(range(values[0], values[-1] + 1)):
        return f"steps {values[0]}-{values[-1]}"
    return "steps " + ", ".join(map(str, values))


def _section(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    shown = items[:_LIMIT]
    more = [f"    ... and {len(items) - _LIMIT} more"] if len(items) > _LIMIT else []
    return [title, *("    " + i for i in shown), *more]


def summary_lines(
    state: SessionState,
    *,
    unused: Iterable[Path],
    pruned: Iterable[Path],
    unused_tolerances: Iterable[str],
    report_path: str | None,
    relative_to: Path,
) -> list[str]:
    """Lines for the ``rollout golden`` section of pytest's terminal summary."""

    def rel(p: Any) -> str:
        try:
            return str(Path(p).relative_to(relative_to))
        except ValueError:
            return str(p)

    counts = state.counts()
    unused, pruned = list(unused), list(pruned)
    discarded = any(o.get("discarded") for o in state.outcomes)
    quiet = not any(counts.values()) and not state.calibrated
    if quiet and not unused and not pruned and not discarded:
        return []
    lines = ["golden: " + ", ".join(f"{n} {status}" for status, n in counts.items())]
    for outcome in state.outcomes:
        if outcome["status"] == "updated":
            moved = [
                _moved(c) for c in outcome["comparisons"] if c["verdict"] in ("updated", "new")
            ]
            lines += _section(f"updated {outcome['test']} -> {rel(outcome['directory'])}:", moved)
        elif outcome["status"] == "recorded":
            lines += _section(
                f"recorded {outcome['test']} -> {rel(outcome['directory'])}:", outcome["recorded"]
            )
        if outcome.get("discarded"):
            lines.append(f"not recorded (the test failed): new values of {outcome['test']}")
        lines += _section(f"rollout inputs of {outcome['test']}:", outcome.get("rollouts") or [])
    envs = [
        f"{o['test']}: {'; '.join(o['environment_changes'])}"
        for o in state.outcomes
        if o.get("environment_changes")
    ]
    lines += _section(
        "replayed under another environment than recorded (exact lane not applied):", envs
    )
    lines += _section("not compared (excluded on purpose):", not_compared(state.outcomes))
    lines += _section(
        "unused golden directories (delete with --golden-prune on a full run):",
        [rel(p) for p in unused if p not in pruned],
    )
    lines += _section("pruned unused golden directories:", [rel(p) for p in pruned])
    lines += _section("tolerances that matched no metric:", list(unused_tolerances))
    lines += _section("golden plots written (--golden-plot):", list(state.plots))
    for entry in state.calibrated:
        lines += calibrated_table(entry, rel(entry["directory"]))
    if report_path:
        lines.append(f"golden report written to {report_path}")
    return lines
