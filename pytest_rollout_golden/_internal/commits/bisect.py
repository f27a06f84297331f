"""``rollout-golden bisect``: the first commit between a good and a bad end whose replay fails.

The commits between the ends (:func:`.git.between`) are searched by :class:`.search.Search`;
each round's commits run at once, each in its own temporary tree (:class:`.trees.Trees`), on
the same goldens (:mod:`.goldens`), and every result is cached (:mod:`.cache`), so a second
bisect over the same range replays nothing it already judged. The user's checkout is only
read.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import GoldenError
from . import goldens
from .cache import Cache, context, key, key_parts
from .git import Commit, between, resolve
from .runs import CommitRun, RunSpec, in_checkout, run_commit
from .search import Search
from .trees import Trees


@dataclasses.dataclass(frozen=True)
class BisectResult:
    """What a bisect found: the first bad commit (``None`` when skipped commits leave it
    ambiguous), every commit it may be (``candidates``), the last good commit, and every
    commit tried in the order tried."""

    good: Commit
    bad: Commit
    commits: tuple[Commit, ...]
    first_bad: Commit | None
    candidates: tuple[Commit, ...]
    last_good: Commit
    tried: tuple[CommitRun, ...]
    goldens: str
    jobs: int
    seconds: float
    cache_key: dict[str, Any] | None = None  # what every cache key held besides the commit

    @property
    def replays(self) -> int:
        """How many commits were replayed (cached results are not replays)."""
        return sum(not run.cached for run in self.tried)

    @property
    def first_bad_run(self) -> CommitRun | None:
        """The run of the first bad commit (of the last candidate when ambiguous)."""
        wanted = self.candidates[-1].sha
        return next((run for run in self.tried if run.commit.sha == wanted), None)

    def to_json(self) -> dict[str, Any]:
        """The result as JSON-ready data (``rollout-golden bisect --json``)."""
        first = self.first_bad_run
        return {
            "good": dataclasses.asdict(self.good),
            "bad": dataclasses.asdict(self.bad),
            "commits": len(self.commits),
            "first_bad": None if self.first_bad is None else dataclasses.asdict(self.first_bad),
            "ambiguous": self.first_bad is None,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
            "last_good": dataclasses.asdict(self.last_good),
            "first_bad_run": None if first is None else first.to_json(),
            "tried": [run.to_json() for run in self.tried],
            "replays": self.replays,
            "goldens": self.goldens,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "cache_key": self.cache_key,
        }


def _quiet(*args: object) -> None:
    """No progress report."""


@dataclasses.dataclass(frozen=True)
class BisectOptions:
    """How to bisect: the ends, commits tried at once, the cache (``None``: no cache),
    whether the ends are replayed too; ``on_plan(good, bad, count)`` is told what is searched,
    ``on_run(tried, run)`` each result as it comes."""

    good: str
    bad: str
    jobs: int = 1
    cache: Cache | None = None
    check_ends: bool = False
    on_plan: Callable[[Commit, Commit, int], None] = _quiet
    on_run: Callable[[int, CommitRun], None] = _quiet


def bisect(spec: RunSpec, options: BisectOptions) -> BisectResult:
    """Search the commits between ``options.good`` and ``options.bad`` for the first one
    whose replay of ``spec`` is bad."""
    started = time.monotonic()
    good, bad = resolve(spec.repo, options.good), resolve(spec.repo, options.bad)
    commits = between(spec.repo, good, bad)
    search = Search(commits, options.jobs)
    options.on_plan(good, bad, len(commits))
    with Trees(spec.repo) as trees, _Runner(spec, options, trees) as runner:
        if options.check_ends:
            for run, wanted in zip(runner.run([good, bad]), ("good", "bad"), strict=True):
                _expect(run, wanted)
        while not search.done:
            batch = search.next_batch()
            for index, run in zip(batch, runner.run([commits[i] for i in batch]), strict=True):
                search.record(index, run.outcome)
        found = search.result
        if found.first_bad is not None and not runner.tried(commits[found.first_bad]):
            # only the trusted bad end can be the answer untried: its divergence is the detail
            _expect(runner.run([commits[found.first_bad]])[0], "bad")
    return BisectResult(
        good=good,
        bad=bad,
        commits=tuple(commits),
        first_bad=None if found.first_bad is None else commits[found.first_bad],
        candidates=tuple(commits[i] for i in found.candidates),
        last_good=good if found.last_good < 0 else commits[found.last_good],
        tried=tuple(runner.runs),
        goldens=spec.goldens.describe(),
        jobs=options.jobs,
        seconds=time.monotonic() - started,
        cache_key=runner.key_parts,
    )


def _expect(run: CommitRun, wanted: str) -> None:
    """The end ``--good`` or ``--bad`` (``wanted``) must replay as it says."""
    if run.outcome != wanted:
        reason = f": {run.reason}" if run.reason else ""
        raise GoldenError(
            f"--{wanted} {run.commit.short} ({run.commit.subject}) replays {run.outcome}, "
            f"not {wanted}{reason}; give --{wanted} a commit that replays {wanted}"
        )


class _Runner:
    """Runs commits ``jobs`` at a time, each in a tree of its own, through the cache."""

    def __init__(self, spec: RunSpec, options: BisectOptions, trees: Trees) -> None:
        self._spec, self._options, self._trees = spec, options, trees
        self._digest = goldens.digest(spec.goldens)
        self.key_parts = None  # what every cache key holds besides the commit; None: no cache
        if options.cache is not None:
            self.key_parts = key_parts(spec, self._digest, context(spec))
        self._pool = ThreadPoolExecutor(max_workers=options.jobs)
        self.runs: list[CommitRun] = []

    def __enter__(self) -> _Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        # on Ctrl-C the trees' exit kills the running replays; their threads end with them
        self._pool.shutdown(wait=exc[0] is None, cancel_futures=True)

    def tried(self, commit: Commit) -> bool:
        """Whether ``commit`` has a result already."""
        return any(run.commit.sha == commit.sha for run in self.runs)

    def run(self, commits: list[Commit]) -> list[CommitRun]:
        """The results of ``commits``, replayed at once (cached ones not replayed)."""
        runs = []
        for run in self._pool.map(self._one, commits):  # in order, each as soon as it is done
            runs.append(run)
            self.runs.append(run)
            self._options.on_run(len(self.runs), run)
        return runs

    def _one(self, commit: Commit) -> CommitRun:
        cache = self._options.cache
        entry = key(self.key_parts, commit) if self.key_parts is not None else ""
        cached = cache.get(entry) if cache is not None else None
        if cached is not None:
            return cached
        tree = self._trees.add(commit)
        try:
            run = run_commit(self._spec, commit, tree)
        finally:
            self._trees.remove(tree)
        if run.first is not None:  # the tree is gone
            golden = in_checkout(run.first.golden, tree.path.resolve())
            run.first = dataclasses.replace(run.first, golden=golden)
        if cache is not None:
            cache.put(entry, run)
        return run
