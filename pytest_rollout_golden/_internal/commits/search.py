"""The search of ``rollout-golden bisect``, as a pure state machine (no git, no processes).

The commits between the good and the bad end are indexed ``0 .. n-1``, oldest first; the
last one is the bad end itself, trusted bad, and the good end (index ``-1``, not in the list)
is trusted good. A round asks for up to ``jobs`` commits to try (:meth:`Search.next_batch`),
the caller records each one's outcome (:meth:`Search.record`) and asks again until
:attr:`Search.done`.

A commit that cannot be judged (``"skip"``) is left out, as ``git bisect skip`` does: the
search goes on with the untried commits around it. The answer classes are the gaps between
untried commits, so a round places its commits to split the untried commits of the open
interval evenly: with ``jobs=1`` at most ``ceil(log2(n))`` judged commits plus one try per
skipped commit, with ``jobs=k`` at most ``ceil(log_{k+1}(n))`` rounds when nothing is
skipped. When skipped commits border the boundary, the first bad commit is any of them or
the first bad one after them: the result is that ambiguous set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

Outcome = Literal["good", "bad", "skip"]
OUTCOMES: tuple[Outcome, ...] = ("good", "bad", "skip")


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Where the search ended: ``first_bad`` (an index) when one commit is the answer, else
    ``None`` and ``candidates`` holds every index the first bad commit may be (oldest first;
    the last one is bad, the others were skipped)."""

    first_bad: int | None
    candidates: tuple[int, ...]
    last_good: int

    @property
    def ambiguous(self) -> bool:
        """Whether skipped commits keep the answer from being one commit."""
        return self.first_bad is None


class Search:
    """The bisection over ``len(commits)`` commits, ``jobs`` of them tried per round."""

    def __init__(self, commits: Sequence[object], jobs: int = 1) -> None:
        if not commits:
            raise ValueError("nothing to bisect: no commit between the good and the bad end")
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        self._n = len(commits)
        self._jobs = jobs
        self._outcomes: dict[int, Outcome] = {self._n - 1: "bad"}

    @property
    def outcomes(self) -> dict[int, Outcome]:
        """Every recorded outcome by index (the trusted bad end included)."""
        return dict(self._outcomes)

    def _bounds(self) -> tuple[int, int]:
        """``(lo, hi)``: the last good commit before the first bad one, and that bad one."""
        hi = min(i for i, outcome in self._outcomes.items() if outcome == "bad")
        goods = [i for i, outcome in self._outcomes.items() if outcome == "good" and i < hi]
        return max(goods, default=-1), hi

    def _untried(self) -> list[int]:
        """The commits strictly between the bounds that have no outcome yet."""
        lo, hi = self._bounds()
        return [i for i in range(lo + 1, hi) if i not in self._outcomes]

    @property
    def done(self) -> bool:
        """Whether no commit is left to try between the last good and the first bad one."""
        return not self._untried()

    def next_batch(self) -> list[int]:
        """Up to ``jobs`` untried indices that split the open interval's untried commits
        into equal parts (empty when done)."""
        untried = self._untried()
        parts = min(self._jobs, len(untried)) + 1
        classes = len(untried) + 1  # the answer lies after one untried commit, or before all
        batch, cumulative = [], 0
        for part in range(parts - 1):
            cumulative += classes // parts + (part < classes % parts)
            batch.append(untried[cumulative - 1])
        return batch

    def record(self, index: int, outcome: Outcome) -> None:
        """The outcome of trying commit ``index``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        if not 0 <= index < self._n:
            raise ValueError(f"index {index} is outside the {self._n} commits")
        self._outcomes[index] = outcome

    @property
    def result(self) -> SearchResult:
        """The first bad commit, or the ambiguous set; only once :attr:`done`."""
        if not self.done:
            raise RuntimeError("the search is not done: commits are left to try")
        lo, hi = self._bounds()
        candidates = tuple(range(lo + 1, hi + 1))
        return SearchResult(hi if len(candidates) == 1 else None, candidates, lo)
