"""The picture of a bisect (``rollout-golden bisect --plot PNG``): each commit tried, in the
order tried, at its place in the history, with what was still in question before it."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.commits.bisect import BisectResult
from pytest_rollout_golden._internal.commits.git import Commit
from pytest_rollout_golden._internal.commits.runs import CommitRun, Divergence

pytest.importorskip("matplotlib")

COMMITS = tuple(Commit(f"{n:02d}" * 20, f"Note {n}") for n in range(1, 11))  # 10 after good
GOOD = Commit("0" * 40, "Start")


def run(position: int, outcome: str, **fields) -> CommitRun:
    return CommitRun(COMMITS[position - 1], outcome, 0, 0.1, **fields)


def result(tried: list[CommitRun], first_bad: int | None, candidates: list[int]) -> BisectResult:
    return BisectResult(
        good=GOOD,
        bad=COMMITS[-1],
        commits=COMMITS,
        first_bad=None if first_bad is None else COMMITS[first_bad - 1],
        candidates=tuple(COMMITS[p - 1] for p in candidates),
        last_good=COMMITS[candidates[0] - 2],
        tried=tuple(tried),
        goldens="golden at 0000000000 (Start)",
        jobs=1,
        seconds=1.0,
    )


DIVERGENCE = Divergence(
    test="test_calc.py::test_training", golden="golden/test_calc/test_training",
    metric="pg_loss", step=1, expected=0.25, actual=0.2503, abs_diff=3e-4,
    tolerance="rtol=0.0001, atol=1e-08, scale=recorded", excess=1.2,
)  # fmt: skip


@pytest.fixture
def figures(monkeypatch):
    from matplotlib.figure import Figure

    kept = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        kept.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return kept


def markers(ax) -> dict[str, list[tuple[float, float]]]:
    """The points of each labelled outcome: ``good``, ``bad``, ``skip``."""
    return {
        line.get_label(): [tuple(p) for p in line.get_xydata()]
        for line in ax.get_lines()
        if line.get_label() in ("good", "bad", "skip")
    }


def test_each_try_sits_at_its_commit_with_what_was_still_in_question(tmp_path, figures):
    from pytest_rollout_golden._internal.commits.timeline import plot_bisect

    tried = [
        run(5, "skip", reason="collection error"),
        run(6, "bad"),
        run(3, "good"),
        run(4, "bad", first=DIVERGENCE),
    ]
    out = tmp_path / "bisect.png"
    assert plot_bisect(result(tried, 4, [4]), out) == out
    assert out.read_bytes().startswith(b"\x89PNG")
    (figure,) = figures
    ax = figure.axes[0]
    assert markers(ax) == {
        "skip": [(5.0, 1.0)],
        "bad": [(6.0, 2.0), (4.0, 4.0)],
        "good": [(3.0, 3.0)],
    }
    # before each try, the commits that could still be the first bad one: (good end, bad end]
    # (a bar from the last known good commit to the first known bad one, half a step out)
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert spans == [(0.5, 10.5), (0.5, 10.5), (0.5, 6.5), (3.5, 6.5)]
    title = figure._suptitle.get_text()  # get_suptitle(): matplotlib 3.8
    assert "first bad commit: 0404040404 Note 4" in title
    assert "pg_loss at step 1: 1.2x beyond rtol=0.0001" in title
    assert "4 of 10 commits tried" in title
    labels = [t.get_text() for t in ax.texts]
    assert "skip: Note 5 (collection error)" in labels
    assert ax.get_xlim()[0] < 0 and ax.get_xlim()[1] > 10  # both ends drawn


def test_an_ambiguous_answer_names_its_candidates(tmp_path, figures):
    from pytest_rollout_golden._internal.commits.timeline import plot_bisect

    tried = [run(5, "skip", reason="collection error"), run(6, "bad"), run(4, "good")]
    plot_bisect(result(tried, None, [5, 6]), tmp_path / "b.png")
    title = figures[0]._suptitle.get_text()
    assert "first bad commit: ambiguous, one of 0505050505 Note 5, 0606060606 Note 6" in title
