"""``rollout-golden compare A B``: what two commits compute on the same recorded inputs.

Both commits run the selected tests with ``--update-golden`` on their own copy of the same
goldens: each re-computes every value from the recorded rollouts. The two golden roots this
leaves are then diffed as ``rollout-golden diff`` does (same comparison, same tolerances),
over the goldens both runs re-recorded.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...errors import GoldenError
from ..report.diff import Pair, diff_pair, summary
from ..results import GoldenDiff
from ..tolerance.stack import Stack
from .git import resolve
from .runs import CommitRun, RunSpec, run_commit
from .trees import Tree, Trees

_SHOWN_LOG = 20  # lines of a failed run's output in the error


@dataclasses.dataclass
class CompareResult:
    """The two runs (``a``, ``b``), where their goldens came from, and the diff of B's
    re-recorded goldens against A's."""

    a: CommitRun
    b: CommitRun
    source: str
    diffs: list[GoldenDiff]

    @property
    def counts(self) -> dict[str, int]:
        return summary(self.diffs)

    @property
    def differs(self) -> bool:
        return bool(self.counts["differ"] or self.counts["one_sided"])

    def to_json(self) -> dict[str, Any]:
        def side(run: CommitRun) -> dict[str, Any]:
            return {
                "commit": run.commit.sha,
                "subject": run.commit.subject,
                "exit_code": run.exit_code,
                "seconds": round(run.seconds, 3),
            }

        return {
            "format": "pytest-rollout-golden-compare",
            "version": 1,
            "a": side(self.a),
            "b": side(self.b),
            "goldens_from": self.source,
            "ok": not self.differs,
            "summary": self.counts,
            "goldens": [d.to_json() for d in self.diffs],
        }


def compare(
    spec: RunSpec,
    ref_a: str,
    ref_b: str,
    tolerances: Stack,
    *,
    jobs: int = 1,
    base: Path | None = None,
) -> CompareResult:
    """Run ``spec`` at ``ref_a`` and ``ref_b`` (``--update-golden``, on copies of
    ``spec.goldens``) and diff B's goldens against A's. :class:`GoldenError` when a run
    fails (its output's last lines in the message); ``base``: where the run folder goes."""
    spec = dataclasses.replace(spec, update=True)
    commits = [resolve(spec.repo, ref_a), resolve(spec.repo, ref_b)]
    with Trees(spec.repo, base=base) as run:
        checkouts = [run.add(commit) for commit in commits]
        done = run_both([spec, spec], checkouts, jobs)
        for side, result in zip("AB", done, strict=True):
            _require_recorded(side, result)
        written = [
            _rerecorded(spec, tree, result) for tree, result in zip(checkouts, done, strict=True)
        ]
        pairs = [
            Pair(label, written[0].get(label), written[1].get(label))
            for label in sorted(written[0].keys() | written[1].keys())
        ]
        diffs = [diff_pair(pair, tolerances, (None, None)) for pair in pairs]
    return CompareResult(done[0], done[1], spec.goldens.describe(), diffs)


def run_both(specs: list[RunSpec], checkouts: list[Tree], jobs: int) -> list[CommitRun]:
    """Run ``specs[i]`` in ``checkouts[i]`` (A and B), at once with ``jobs`` above 1."""
    sides = list(zip(specs, checkouts, strict=True))
    if jobs < 2:
        return [run_commit(spec, tree.commit, tree) for spec, tree in sides]
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        return list(pool.map(lambda side: run_commit(side[0], side[1].commit, side[1]), sides))
    finally:
        # on Ctrl-C, return at once: leaving the run folder kills the runs the threads wait on
        pool.shutdown(wait=False, cancel_futures=True)


def _require_recorded(side: str, run: CommitRun) -> None:
    """A run that did not pass with ``--update-golden`` leaves nothing to compare."""
    if run.exit_code == 0 and run.report is not None:
        return
    tail = "\n".join(run.log_tail.splitlines()[-_SHOWN_LOG:])
    raise GoldenError(
        f"{side} = {run.commit.short} ({run.commit.subject}): the tests did not pass with "
        f"--update-golden ({run.reason or f'exit {run.exit_code}'}); nothing to compare. "
        f"Its output ends:\n{tail}"
    )


def _rerecorded(spec: RunSpec, tree: Tree, run: CommitRun) -> dict[str, Path]:
    """The goldens ``run`` re-recorded (or recorded), by their path under the golden root."""
    root = (tree.path / spec.golden_rel).resolve()
    found = {}
    for test in (run.report or {}).get("tests", []):
        if test.get("status") not in ("recorded", "updated"):
            continue
        directory = (tree.path / spec.cwd_rel / test["directory"]).resolve()
        if not directory.is_relative_to(root):
            raise GoldenError(
                f"{test['test']} recorded {directory}, outside the golden root {spec.golden_rel}; "
                "give --golden-root the project's golden folder (ini golden_dir)"
            )
        found[directory.relative_to(root).as_posix()] = directory
    return found
