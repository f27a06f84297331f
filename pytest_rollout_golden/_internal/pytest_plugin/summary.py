"""The terminal summary and the JSON report of a pytest session: what was recorded,
updated, calibrated, loosened, pruned and left unused.

Torch-free; reads the session through :class:`SessionView`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ...store.location import ENVELOPE, TOLERANCES
from ..golden.messages import PRECISION_KINDS, lane_note, lane_suffix, not_compared
from ..report.gates import HEADING as GATES_HEADING, long_run_gates
from ..results import Comparison, Outcome, Status, Verdict, json_number
from ..wording import display, is_nan, number, plural, step_ranges, table, where


class SessionView(Protocol):
    """What the summary and the report read of a session (:class:`.session.SessionState`)."""

    outcomes: list[Outcome]
    plots: list[str]
    calibrated: list[dict[str, Any]]
    calibration_passed: dict[str, int]

    def counts(self) -> dict[str, int]: ...


CI_UPDATE = (
    "goldens were re-recorded under CI (the CI environment variable is set): "
    "--update-golden overrides CI's never-record rule; commit golden/ only if you meant it"
)


_LIMIT = 20  # lines per summary section before "... and N more"


def _section(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    shown = items[:_LIMIT]
    more = [f"    ... and {len(items) - _LIMIT} more"] if len(items) > _LIMIT else []
    return [title, *("    " + i for i in shown), *more]


# ---------------------------------------------------------------------- the terminal summary


def _moved(c: Comparison) -> str:
    label = f"{c.name} ({where(c)})"
    if c.verdict == Verdict.NEW:
        return f"{label}: new"
    if c.kind in PRECISION_KINDS:
        return f"{label}: {c.detail}"
    if is_nan(c.actual):  # the difference of NaN to NaN reads 0
        return f"{label}: {number(c.expected, 8)} -> nan (NaN: replay fails unless equal_nan)"
    if c.abs_diff == 0:
        return f"{label}: unchanged"
    change = f"abs {number(c.abs_diff, 8)}, rel {number(c.rel_diff, 8)}"
    if c.kind == "metric" and not isinstance(c.expected, dict):
        return f"{label}: {number(c.expected, 8)} -> {number(c.actual, 8)} ({change})"
    return f"{label}: changed (greatest {change})"


def calibrated_table(entry: dict[str, Any], directory: str) -> list[str]:
    """The summary's table of one golden's calibrated tolerances (``--golden-calibrate``)."""
    if not entry["rows"]:
        return [f"not calibrated: {directory} ({entry['skipped']})"]
    lines = [f"calibrated tolerances written to {directory}/{TOLERANCES}:"]
    if not entry.get("written", True):
        removed = f" (the earlier {TOLERANCES} removed)" if entry.get("removed") else ""
        lines = [
            f"calibrated {directory}: every value keeps its default; nothing written{removed}:"
        ]
    lanes = {row.get("lane", "same layout") for row in entry["rows"]} != {"same layout"}
    cells = [("metric", "rel spread", "abs spread", "at step", "rtol", "atol")]
    if lanes:
        cells = [("lane", *cells[0])]
    for row in entry["rows"]:
        kept = "rtol" not in row
        why = row.get("why")  # spread 0, = measured, over the cap, not compared
        labels = {None: "default kept", "not compared": why, "over the cap": f"refused: {why}"}
        kept_as = labels.get(why, f"default: {why}")
        rel = number(row["rel_spread"], 3)
        if row.get("at_rounding_level"):  # its spread is taken as absolute
            rel = "- (rounding level)"
        cells.append(
            (
                *((row.get("lane", "same layout"),) if lanes else ()),
                row["metric"],
                rel,
                number(row["abs_spread"], 3),
                number(row["at_step"]),
                kept_as if kept else number(row["rtol"], 3),
                "-" if kept else number(row["atol"], 3),
            )
        )
    lines += table(cells, "    ")
    for row in entry["rows"]:
        if row.get("refused"):
            lines.append(
                f"    refused: {row.get('lane', 'same layout')} {row['metric']}: {row['refused']}"
            )
    lines += [f"    {line}" for line in calibrated_variants(entry.get("variants", ()))]
    for lane in entry.get("kept", ()):
        lines.append(f"    kept from the earlier {TOLERANCES}: the {lane} lane (not measured now)")
    lines += envelope_lines(entry.get("envelope"), directory)
    if entry["skipped"]:
        lines.append(f"    left out: {entry['skipped']}")
    return lines


def calibration_written(
    entries: Iterable[Mapping[str, Any]], rel: Callable[[Any], str]
) -> list[str]:
    """``--golden-calibrate``: the files it wrote and removed, lane by lane (the summary's
    first lines; ``rel``: a path as the summary shows it)."""
    wrote: dict[str, list[str]] = {}
    removed: dict[str, list[str]] = {}
    for entry in entries:
        lane = f" (lane {entry['lane']})" if entry.get("lane") else ""
        directory = rel(entry["directory"])
        if entry.get("written"):
            wrote.setdefault(lane, []).append(f"{directory}/{TOLERANCES}")
        elif entry.get("removed"):
            removed.setdefault(lane, []).append(f"{directory}/{TOLERANCES}")
        found = entry.get("envelope") or {}
        if found.get("lanes") or found.get("drifting"):
            wrote.setdefault(lane, []).append(f"{directory}/{ENVELOPE}")
    lines = []
    for lane, paths in sorted(wrote.items()):
        lines += _section(f"calibration wrote{lane}:", paths)
    for lane, paths in sorted(removed.items()):
        lines += _section(f"calibration removed{lane} (every value keeps its default):", paths)
    return lines


def calibration_passed(passed: Mapping[str, int]) -> list[str]:
    """``--golden-calibrate``: why the run exits 0 although tests failed (``passed``: test id
    -> its calibration runs that failed, on values only what calibration wrote now holds)."""
    if not passed:
        return []
    tests = ", ".join(
        f"{test} failed against the golden in {plural(n, 'calibration run')}"
        for test, n in passed.items()
    )
    return [
        f"calibration exits 0: {tests} only on values the files written now calibrate (the "
        "failures above are what was measured)"
    ]


def loosened_where(noted: Mapping[str, Any]) -> str:
    """A loosened tolerance: as it is, or an envelope's widest and at how many steps."""
    steps = noted.get("steps")
    if not steps:
        return str(noted["tolerance"])
    return f"up to {noted['tolerance']} at {plural(len(steps), 'step')} ({step_ranges(steps)})"


def _few_distinct(what: Mapping[str, Any]) -> str:
    """Where a lane's bands rest on so few distinct runs at some step that its margin grows
    (``what["margin"]``, docs/guide/long-runs.md): how few, and that margin."""
    if what.get("margin") is None:
        return ""
    return (
        f" ({what['distinct']} distinct at the fewest step: margin x{what['margin']:g}; more "
        "distinct runs, more variants or perturbations, make it tighter)"
    )


def _identical(what: Mapping[str, Any]) -> str:
    """The metrics of a lane whose runs repeated the golden bit for bit: what their band is."""
    if not what.get("identical"):
        return ""
    return (
        f" ({', '.join(what['identical'])}: the runs repeated the golden bit for bit: a band "
        "at the rounding level, with the bias gate)"
    )


def envelope_lines(found: Mapping[str, Any] | None, directory: str) -> list[str]:
    """``--golden-calibrate``: what the golden's envelope.json holds now, lane by lane, and
    the bands refused."""
    if not found:
        return []
    lines = []
    if found["lanes"] or found.get("drifting"):
        lines.append(f"    per-step envelope written to {directory}/{ENVELOPE}:")
    for lane, what in found["lanes"].items():
        kept = " (kept: not measured now)" if lane in found["kept"] else ""
        lines.append(
            f"        {lane}: {', '.join(what['metrics'])} over {plural(what['steps'], 'step')}"
            f", from {plural(what['runs'], 'run')}{kept}{_few_distinct(what)}"
            f"{_identical(what)}"
        )
    if found.get("drifting"):
        lines.append(
            f"        not comparable across variants: {', '.join(found['drifting'])} (the "
            "calibrated variants drift from the recorded golden by more than the value itself)"
        )
    for name, why in sorted(found["refused"].items()):
        lines.append(f"    envelope refused: {name}: {why}")
    return lines


def calibrated_variants(variants: Iterable[Mapping[str, Any]]) -> list[str]:
    """``--golden-calibrate``: a line per variant left out of the variant lane for some value
    (how far it moved, against what) or failed against the golden during calibration."""
    lines = []
    for v in variants:
        parts = certificate_parts(v.get("certificate"))
        excluded = sorted(v["excluded"].items(), key=lambda item: -item[1]["times"])
        if excluded:
            moved = "; ".join(
                f"{name} by {_distance(why['distance'], why['absolute'])}, "
                f"{_times(why['times'])} {why['against']}"
                for name, why in excluded
            )
            parts.append(f"moved {moved}: excluded from the variant lane (not same math?)")
        failed = []
        left_out = (v.get("certificate") or {}).get("verdict") == "not the same math"
        for name in v["failed"]:
            distance = v["distances"].get(name)
            if name in v["excluded"] or distance is None or left_out:
                failed.append(name)
            else:
                moved = _distance(distance["distance"], distance["measure"] == "absolute")
                failed.append(f"{name} (moved by {moved}: kept in the variant lane)")
        if failed:
            parts.append(f"failed against the golden during calibration on {', '.join(failed)}")
        lines.append(f"{v['test']}: {'; '.join(parts)}")
    return lines


def certificate_parts(found: Mapping[str, Any] | None) -> list[str]:
    """What the summary says of a variant's float64 certificate (none: nothing)."""
    if not found:
        return []
    verdict = found.get("verdict")
    if verdict == "certified":
        largest = found["largest"]
        within = "identical in float64" if not largest else f"within {largest:.2g} x the bound"
        return [
            f"certified same math in float64 ({within}): kept in the variant lane on every value"
        ]
    if verdict == "not the same math":
        size = found.get("differs_by")
        by = "" if size is None else f" by {size:.1e}"
        return [
            f"not the same math: {found['value']} differs{by} in float64 at step "
            f"{found['step']}: left out of the variant lane on every value"
        ]
    if found.get("why") and "no float64 certification ran" not in found["why"]:
        return [f"not certified ({found['why']}): judged by the outlier rule"]
    return []


def _distance(value: float, absolute: bool) -> str:
    return f"{value:.1e}" + (" (absolute)" if absolute else "")


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio < 1e4 else f"{ratio:.0e}x"


def summary_lines(
    state: SessionView,
    *,
    unused: Iterable[Path],
    pruned: Iterable[Path],
    unused_tolerances: Iterable[str],
    report_path: str | None,
    relative_to: Path,
    plots_removed: Sequence[Path] = (),
) -> list[str]:
    """Lines for the ``rollout golden`` section of pytest's terminal summary
    (``plots_removed``: an earlier run's ``--golden-plot`` pictures, removed by this one)."""

    def rel(p: Any) -> str:
        return display(p, relative_to)

    counts = state.counts()
    unused, pruned = list(unused), list(pruned)
    discarded = any(o.discarded for o in state.outcomes)
    quiet = not any(counts.values()) and not state.calibrated
    if quiet and not unused and not pruned and not discarded and not plots_removed:
        return []
    lines = ["golden: " + ", ".join(f"{n} {status}" for status, n in counts.items())]
    lines += calibration_written(state.calibrated, rel)
    lines += calibration_passed(state.calibration_passed)
    for o in state.outcomes:
        if o.status is Status.UPDATED:
            moved = [
                _moved(c) for c in o.comparisons if c.verdict in (Verdict.NEW, Verdict.UPDATED)
            ]
            lines += _section(f"updated {o.test} -> {rel(o.directory)}{lane_suffix(o)}:", moved)
        elif o.status is Status.RECORDED:
            lines += _section(
                f"recorded {o.test} -> {rel(o.directory)}{lane_suffix(o)}:", o.recorded
            )
        if o.discarded:
            lines.append(f"not recorded (the test failed): new values of {o.test}")
        lines += _section(f"rollout inputs of {o.test}:", o.rollouts)
    envs = [
        f"{o.test}: {'; '.join(o.environment_changes)}"
        for o in state.outcomes
        if o.environment_changes
    ]
    lines += _section(
        "replayed under another environment than recorded (exact lane not applied):", envs
    )
    lines += _section(
        "compared against another lane (golden_lane_fallback):",
        [f"{o.test}: {note}" for o in state.outcomes if (note := lane_note(o.lane))],
    )
    lines += _section("not compared (excluded on purpose):", not_compared(state.outcomes))
    lines += _section(
        "failed against a golden another test recorded:",
        [
            f"{o.test}: recorded by {o.recorded_by}"
            for o in state.outcomes
            if o.status is Status.FAILED and o.recorded_by
        ],
    )
    loosened = [
        f"{o.test}: {name}: {loosened_where(t)} from "
        f"{rel(Path(o.directory) / t.get('file', TOLERANCES))} (without it: {t['without']})"
        for o in state.outcomes
        for name, t in o.loosened.items()
    ]
    lines += _section("tolerances looser than the defaults, from calibrated files:", loosened)
    if not state.calibrated:  # calibration's runs replay the files it is replacing
        lines += _section(GATES_HEADING, long_run_gates(state.outcomes))
    lines += _section(
        "unused golden directories (delete with --golden-prune on a full run):",
        [rel(p) for p in unused if p not in pruned],
    )
    lines += _section("pruned unused golden directories:", [rel(p) for p in pruned])
    lines += _section("tolerances that matched no metric:", list(unused_tolerances))
    if plots_removed:
        lines += _section(
            f"golden plots of an earlier run removed from "
            f"{display(plots_removed[0].parent)} (--golden-plot):",
            [display(p) for p in plots_removed],
        )
    lines += _section("golden plots written (--golden-plot):", list(state.plots))
    for entry in state.calibrated:
        lines += calibrated_table(entry, rel(entry["directory"]))
    if report_path:
        lines.append(f"golden report written to {report_path}")
    return lines


def link_outside_root(directory: Path, link: Path, root: Path) -> str:
    """A golden directory reached through ``link``, a symbolic link out of the golden root."""
    return (
        f"{directory}: {link} is a symbolic link to {os.path.realpath(link)}, outside "
        f"the golden root {root}; goldens are read and written only inside it. "
        "Replace the link by a directory, or point it inside the golden root."
    )


def unused_kept_note(count: int) -> str:
    """Why ``--golden-prune`` keeps ``count`` of the unused goldens."""
    return (
        f"{count} of them belong to test files that still exist (or are "
        "shared): a removed test, or a case collected only on other machines (e.g. cuda); "
        "--golden-prune keeps those, --golden-prune-tests deletes them on a whole run"
    )


def rootdir_note(root: Path, other: Path, rootdir: Path, *, recorded: bool = True) -> str:
    """Goldens were recorded (or found missing) under ``root`` while ``other`` looks like
    the project's golden/."""
    what = f"recorded under {root}" if recorded else f"no golden under {root} for a failed test"
    return (
        f"{what}, but {other} exists too: with no pytest config "
        f"file, rootdir is {rootdir} (where pytest was started); put one "
        "(pytest.ini, or [tool.pytest.ini_options] in pyproject.toml) at the project "
        "root so that every run finds the same golden/"
    )


# ---------------------------------------------------------------------- the JSON report


def report_document(
    state: SessionView, *, mode: str, unused: list[Path], pruned: list[Path]
) -> dict[str, Any]:
    """The ``--golden-report`` document: every comparison with its verdict."""
    outcomes = [o.to_json() for o in state.outcomes]
    comparisons = []
    for outcome in outcomes:
        for c in outcome["comparisons"]:
            comparisons.append({"test": outcome["test"], "golden": outcome["directory"], **c})
    return {
        "format": "pytest-rollout-golden-report",
        "version": 1,
        "mode": mode,
        "summary": state.counts(),
        "tests": [
            {
                k: json_number(v) if not isinstance(v, list) else v
                for k, v in o.items()
                if k != "comparisons"
            }
            for o in outcomes
        ],
        "comparisons": comparisons,
        "unused": [str(p) for p in unused],
        "pruned": [str(p) for p in pruned],
        "plots": state.plots,
        "calibrated": state.calibrated,
    }
