"""What ``rollout-golden compare`` and ``bisect`` print."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .presentation import diff_summary, golden_diff_lines

if TYPE_CHECKING:
    from ..commits.compare import CompareResult
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
