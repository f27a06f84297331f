"""What ``rollout-golden compare`` (its diff, and its triage of two environments) and
``bisect`` print."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..report.diff_text import diff_summary, golden_diff_lines
from ..wording import number, plural, table

if TYPE_CHECKING:
    from .bisect import BisectResult
    from .compare_commits import CompareResult
    from .environments import Difference
    from .git import Commit
    from .runs import CommitRun, Divergence
    from .triage import TriageResult, TriageRow

# ---------------------------------------------------------------------- compare


def commit_line(side: str, run: CommitRun) -> str:
    """One side of a comparison: the commit, its subject, how its run went."""
    return (
        f"{side}: {run.commit.short} {run.commit.subject} "
        f"(pytest --update-golden: exit {run.exit_code}, {run.seconds:.1f} s)"
    )


def compare_lines(result: CompareResult) -> list[str]:
    """``rollout-golden compare``'s report: the two commits, where the inputs came from, the
    diff of every golden both re-recorded, and the totals."""
    lines = [
        commit_line("A", result.a),
        commit_line("B", result.b),
        f"goldens (the recorded inputs of both): {result.source}",
    ]
    for d in result.diffs:
        lines += ["", *golden_diff_lines(d)]
    if not result.diffs:
        lines += ["", "no golden re-recorded: the selected tests use none"]
    return [*lines, "", diff_summary(result.counts)]


# ---------------------------------------------------------------------- compare, triage


def triage_lines(result: TriageResult) -> list[str]:
    """``compare --python-a/--python-b``'s report: each side's commit and interpreter, what
    differs between the environments, the goldens, then a table per class of tests (the
    regressions first; those passing on both sides are only counted) and the totals."""
    from .triage import CLASSES, PASSED

    lines = []
    for side, run, python, env in zip(
        "AB", (result.a, result.b), result.python, result.installed, strict=True
    ):
        lines.append(
            f"{side}: {run.commit.short} {run.commit.subject}; {python} (Python {env.python}; "
            f"pytest: exit {run.exit_code}, {run.seconds:.1f} s)"
        )
    lines.append(f"environment A -> B: {environment_change(result.environment)}")
    lines.append(f"goldens (replayed by both, --golden-strict): {result.source}")
    for category in CLASSES[:-1]:
        found = [r for r in result.rows if r.category == category]
        if found:
            lines += ["", f"{category}: {plural(len(found), 'test')}", *triage_table(found)]
    counts = result.counts
    totals = ", ".join(f"{counts[c]} {c}" for c in CLASSES[:-1])
    return [
        *lines,
        "",
        f"{plural(len(result.rows), 'test')}: {totals}, {counts[PASSED]} pass in both",
    ]


def environment_change(d: Difference) -> str:
    """What changed from A's environment to B's: each package whose version differs (one
    side's only: ``none``), and the watched ones (torch) unchanged."""
    parts = [f"{name} {a} -> {b}" for name, (a, b) in d.changed.items()]
    parts += [f"{name} {v} -> none" for name, v in d.only_a.items()]
    parts += [f"{name} none -> {v}" for name, v in d.only_b.items()]
    for name, (a, b) in d.watched.items():
        if a == b:
            parts.append(f"{name} {a or 'not installed'} on both sides")
    changed = len(d.changed) + len(d.only_a) + len(d.only_b)
    verb = "differs" if changed == 1 else "differ"
    head = "no package differs" if d.same else f"{plural(changed, 'package')} {verb}"
    return f"{head}: {'; '.join(parts)}" if parts else head


def triage_table(found: list[TriageRow]) -> list[str]:
    """Tests of one class: their outcome in A and B, and for a failure in B its first
    divergence (step, metric, distance in units of its tolerance, values) or its message."""
    rows: list[list[Any]] = [["test", "A", "B", "step", "metric", "distance", "detail"]]
    for r in found:
        d = r.first
        if d is None:
            rows.append([r.test, r.a, r.b, "-", "-", "-", r.message])
            continue
        distance = f"{number(d.excess, 3)}x tolerance"
        rows.append([r.test, r.a, r.b, d.step, d.metric, distance, _values(d)])
    return table(rows)


def _values(d: Divergence) -> str:
    """A divergence's values, tolerance and golden."""
    return (
        f"expected {number(d.expected)}, actual {number(d.actual)} (abs diff "
        f"{number(d.abs_diff, 2)}), allowed {d.tolerance}; golden {d.golden}"
    )


# ---------------------------------------------------------------------- bisect


def _commit(commit: Commit) -> str:
    return f"{commit.short} {commit.subject}"


def bisect_plan(good: Commit, bad: Commit, count: int, goldens: str) -> str:
    """The first progress line: what is searched, on which goldens."""
    return (
        f"bisect: {plural(count, 'commit')} after good {good.short} ({good.subject}) up to bad "
        f"{bad.short} ({bad.subject}); goldens: {goldens}"
    )


def bisect_progress(tried: int, run: CommitRun) -> str:
    """One progress line per commit tried."""
    how = "(cached)" if run.cached else f"in {run.seconds:.1f} s"
    reason = f" ({run.reason})" if run.reason and run.outcome == "skip" else ""
    return f"bisect: [{tried}] {run.commit.short} {run.outcome} {how}: {run.commit.subject}{reason}"


def divergence(run: CommitRun) -> str:
    """The first divergence of a bad run: test, golden, metric, step, values and how far
    beyond its tolerance; the run's reason when it has none."""
    d = run.first
    if d is None:
        return run.reason or f"exit status {run.exit_code}, no divergence reported"
    return (
        f"{d.metric} at step {d.step}: expected {number(d.expected)}, actual "
        f"{number(d.actual)} (abs diff {number(d.abs_diff, 2)}), {number(d.excess, 3)}x beyond "
        f"{d.tolerance}; {d.test}, golden {d.golden}"
    )


def bisect_lines(result: BisectResult) -> list[str]:
    """The answer, the tally and the table of the commits tried."""
    run = result.first_bad_run
    if result.first_bad is not None:
        lines = [f"first bad commit: {_commit(result.first_bad)}"]
    else:
        lines = ["first bad commit: ambiguous, skipped commits border it; it is one of:"]
        lines += [f"  {_commit(c)}" for c in result.candidates]
    if run is not None:
        lines.append(f"  first divergence: {divergence(run)}")
    lines.append(f"last good commit: {_commit(result.last_good)}")
    cached = len(result.tried) - result.replays
    lines.append(
        f"{plural(len(result.tried), 'commit')} tried ({result.replays} replayed, {cached} "
        f"cached) of {len(result.commits)} in {result.seconds:.1f} s, "
        f"{plural(result.jobs, 'job')}; goldens: {result.goldens}"
    )
    return [*lines, "", *tried_table(result)]


def tried_table(result: BisectResult) -> list[str]:
    """The commits tried, oldest first: the order each was tried in, commit, outcome, exit
    status, seconds, whether cached, subject, and why a commit was skipped."""
    position = {c.sha: i for i, c in enumerate((result.good, *result.commits))}
    order = {id(run): i for i, run in enumerate(result.tried, 1)}
    rows: list[list[Any]] = [
        ["#", "commit", "outcome", "exit", "seconds", "cached", "subject", "reason"]
    ]
    for run in sorted(result.tried, key=lambda r: position.get(r.commit.sha, -1)):
        rows.append(
            [
                order[id(run)],
                run.commit.short,
                run.outcome,
                "-" if run.exit_code is None else run.exit_code,
                f"{run.seconds:.1f}",
                "yes" if run.cached else "",
                run.commit.subject,
                run.reason if run.outcome == "skip" else "",
            ]
        )
    return table(rows)
