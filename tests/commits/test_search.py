"""The bisect search on its own: every first-bad position of histories of 1 to 40 commits,
with and without skipped commits, one to four commits tried per round."""

from __future__ import annotations

import math
import random

import pytest

from pytest_rollout_golden._internal.commits.search import Search, SearchResult

SIZES = range(1, 41)


def _oracle(first_bad: int, skipped: frozenset[int]):
    def outcome(index: int) -> str:
        if index in skipped:
            return "skip"
        return "bad" if index >= first_bad else "good"

    return outcome


def _run(n: int, first_bad: int, skipped: frozenset[int], jobs: int):
    """``(result, replays, rounds, tried)`` of a whole search against the oracle."""
    search, outcome = Search(range(n), jobs), _oracle(first_bad, skipped)
    replays = rounds = 0
    tried: list[int] = []
    while not search.done:
        batch = search.next_batch()
        assert batch, "a search that is not done must ask for a commit"
        assert len(batch) <= jobs and len(set(batch)) == len(batch)
        assert not set(batch) & set(tried), "a commit tried twice"
        assert n - 1 not in batch, "the bad end is trusted, never replayed"
        for index in batch:
            search.record(index, outcome(index))
        tried += batch
        replays += len(batch)
        rounds += 1
    assert search.next_batch() == []
    return search.result, replays, rounds, tried


def _expected(n: int, first_bad: int, skipped: frozenset[int]) -> SearchResult:
    """What any correct search must answer: the judged commits around the true first bad one
    and every skipped commit between them."""
    lo = max((i for i in range(first_bad) if i not in skipped), default=-1)
    hi = min(i for i in range(first_bad, n) if i not in skipped or i == n - 1)
    candidates = tuple(range(lo + 1, hi + 1))
    return SearchResult(hi if len(candidates) == 1 else None, candidates, lo)


def _skip_sets(n: int) -> list[frozenset[int]]:
    """Single skips at every position, runs of three skips, and seeded random sets."""
    inner = range(n - 1)  # the bad end is trusted and never replayed
    sets = [frozenset({i}) for i in inner]
    sets += [frozenset(range(i, min(i + 3, n - 1))) for i in inner[::3]]
    rng = random.Random(n)
    sets += [frozenset(i for i in inner if rng.random() < p) for p in (0.1, 0.3, 0.6, 1.0)]
    return sets


@pytest.mark.parametrize("jobs", [1, 2, 3, 4])
def test_every_first_bad_position_without_skips(jobs: int) -> None:
    for n in SIZES:
        for first_bad in range(n):
            result, replays, rounds, _ = _run(n, first_bad, frozenset(), jobs)
            assert result == SearchResult(first_bad, (first_bad,), first_bad - 1), (n, first_bad)
            assert not result.ambiguous
            # k commits per round split the answers into k + 1 parts
            assert rounds <= math.ceil(math.log(n, jobs + 1) - 1e-9), (n, first_bad, jobs)
            if jobs == 1:
                assert replays <= math.ceil(math.log2(n)), (n, first_bad)


@pytest.mark.parametrize("jobs", [1, 2, 3, 4])
def test_every_first_bad_position_with_skips(jobs: int) -> None:
    for n in SIZES:
        for skipped in _skip_sets(n):
            for first_bad in range(n):
                result, replays, _, tried = _run(n, first_bad, skipped, jobs)
                assert result == _expected(n, first_bad, skipped), (n, first_bad, sorted(skipped))
                if jobs == 1:
                    skips = len(set(tried) & skipped)
                    assert replays <= math.ceil(math.log2(n)) + skips, (n, first_bad, skipped)


def test_ambiguous_when_skipped_commits_border_the_boundary() -> None:
    # 0 good, 1 and 2 skipped, 3 bad: the first bad commit is 1, 2 or 3
    result, *_ = _run(8, 2, frozenset({1, 2}), jobs=1)
    assert result.ambiguous and result.first_bad is None
    assert result.candidates == (1, 2, 3) and result.last_good == 0


def test_a_skipped_midpoint_moves_to_its_nearest_untried_neighbour() -> None:
    search = Search(range(32))
    assert search.next_batch() == [15]
    search.record(15, "skip")
    assert search.next_batch() in ([14], [16])


def test_jobs_spread_the_batch_evenly() -> None:
    assert Search(range(32), jobs=3).next_batch() == [7, 15, 23]
    assert Search(range(3), jobs=4).next_batch() == [0, 1]


def test_a_single_commit_is_the_answer_without_a_replay() -> None:
    search = Search(["bad end"])
    assert search.done and search.next_batch() == []
    assert search.result == SearchResult(0, (0,), -1)


def test_a_good_commit_after_the_first_bad_one_does_not_move_the_answer() -> None:
    search = Search(range(8), jobs=3)
    for index, outcome in zip(search.next_batch(), ["good", "bad", "good"], strict=True):
        search.record(index, outcome)
    while not search.done:
        for index in search.next_batch():
            search.record(index, "bad")
    assert search.result.first_bad is not None
    assert search.result.first_bad <= 3


@pytest.mark.parametrize(
    ("args", "message"),
    [((range(0), 1), "nothing to bisect"), ((range(4), 0), "jobs must be at least 1")],
)
def test_bad_arguments_say_what_is_wrong(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        Search(*args)


def test_record_refuses_an_unknown_outcome_or_index() -> None:
    search = Search(range(4))
    with pytest.raises(ValueError, match="one of good, bad, skip"):
        search.record(0, "maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the 4 commits"):
        search.record(4, "good")


def test_result_before_done_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not done"):
        _ = Search(range(4)).result
