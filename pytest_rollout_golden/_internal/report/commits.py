"""What ``rollout-golden compare`` and ``bisect`` print."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .presentation import diff_summary, golden_diff_lines, number, plural, table

if TYPE_CHECKING:
    from ..commits.bisect import BisectResult
    from ..commits.compare import CompareResult
    from ..commits.git import Commit
    from ..commits.runs import CommitRun

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
