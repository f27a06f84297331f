"""One run at one commit: the verdict rules, the isolation from the user's checkout, and the
cache of results."""

from __future__ import annotations

import json
import os

import pytest
from history import tree_digest
from tinyrepo import CALC, TinyRepo

from pytest_rollout_golden._internal.commits import cache, git, goldens, runs, trees
from pytest_rollout_golden._internal.commits.runs import BAD, GOOD, SKIP, judge

C = git.Commit("a" * 40, "subject")


def comparison(verdict: str, step: int, **kw) -> dict:
    return {
        "test": "t.py::t",
        "golden": "/g",
        "metric": "pg_loss",
        "step": step,
        "verdict": verdict,
        "expected": 0.5,
        "actual": 0.5005,
        "abs_diff": 5e-4,
        "tolerance": {"rtol": 1e-4, "atol": 1e-8},
        "excess": 9.9,
        **kw,
    }


def report(*comparisons: dict, status: str = "failed") -> dict:
    return {
        "format": "pytest-rollout-golden-report",
        "comparisons": list(comparisons),
        "tests": [{"test": "t.py::t", "directory": "/g", "status": status}],
    }


def test_a_failed_comparison_is_bad_and_its_lowest_step_the_first_divergence():
    run = judge(
        C, 1, report(comparison("pass", 0), comparison("fail", 2), comparison("fail", 1)), []
    )
    assert run.outcome == BAD and len(run.failures) == 2
    first = run.first
    assert (first.metric, first.step, first.expected, first.actual) == ("pg_loss", 1, 0.5, 0.5005)
    assert first.tolerance == "rtol=0.0001, atol=1e-08" and first.excess == 9.9


def test_a_failure_inside_an_expected_failure_does_not_count():
    run = judge(C, 0, report(comparison("fail", 0), status="xfailed"), [])
    assert run.outcome == GOOD


def test_exit_1_without_a_failed_comparison():
    passed = report(comparison("pass", 0), status="replayed")
    log = ["x", "E   AssertionError: other test", "E   more"]
    assert judge(C, 1, passed, log).outcome == GOOD
    assert judge(C, 1, passed, log, any_failure=True).outcome == BAD
    crashed = judge(C, 1, report(), log)  # no comparison ran
    assert (crashed.outcome, crashed.reason) == (
        SKIP,
        "no comparison ran: AssertionError: other test",
    )
    assert judge(C, 1, report(), log, any_failure=True).outcome == BAD


@pytest.mark.parametrize("code", [2, 3, 4, 5])
def test_exits_above_1_are_skipped_with_the_reason(code):
    run = judge(C, code, report(comparison("fail", 0)), ["E   SyntaxError: bad", "== 1 error =="])
    assert run.outcome == SKIP and run.reason.endswith("SyntaxError: bad")


def test_no_report_or_nothing_compared_is_skipped():
    assert judge(C, 0, None, ["1 passed"]).outcome == SKIP
    assert judge(C, 0, report(status="replayed"), []).reason == (
        "the tests passed but compared nothing"
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """good, goldens, bug, a commit that does not collect, one that crashes before any
    comparison, and the package moved to src/."""
    repo = TinyRepo(tmp_path_factory.mktemp("h") / "project")
    repo.record()
    repo.bug()
    repo.commit(
        "test does not collect",
        {"calc.py": CALC.format(scale=1.0), "test_calc.py": "def test_loss(:\n"},
    )
    crash = CALC.format(scale=1.0).replace(
        "    return", "    raise RuntimeError('boom')\n    return"
    )
    repo.commit("crash", {"test_calc.py": TINY_TEST, "calc.py": crash})
    repo.commit("src layout", {"src/calc.py": CALC.format(scale=1.0)}, remove=("calc.py",))
    return repo


TINY_TEST = """
import calc


def test_loss(golden):
    for step in range(3):
        golden.check({"pg_loss": calc.loss(step)}, step=step)
"""


def spec_of(repo, **kw) -> runs.RunSpec:
    source = goldens.GoldenSource.committed(repo.path, repo.shas[1], "golden")
    return runs.RunSpec(repo=repo.path, cwd_rel=".", golden_rel="golden", goldens=source, **kw)


def test_runs_at_commits_judge_them_and_never_touch_the_checkout(history, tmp_path, monkeypatch):
    # the checkout's own copy, uncommitted and importable: the tree's must shadow it
    (history.path / "src" / "calc.py").write_text(CALC.format(scale=3.0))
    outside = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(history.path / "src"), outside]))
    before = tree_digest(history.path)
    spec = spec_of(history)
    outcomes = {}
    with trees.Trees(history.path, base=tmp_path) as run:
        for index in (2, 3, 4, 5):
            commit = git.resolve(history.path, history.shas[index])
            outcomes[index] = runs.run_commit(spec, commit, run.add(commit))
    assert tree_digest(history.path) == before
    assert {i: r.outcome for i, r in outcomes.items()} == {
        2: BAD,
        3: SKIP,
        4: SKIP,
        5: GOOD,
    }, {i: (r.reason, r.log_tail) for i, r in outcomes.items()}
    first = outcomes[2].first
    assert (first.metric, first.step, first.expected) == ("pg_loss", 0, 0.5)
    assert first.actual == pytest.approx(0.5005) and first.excess > 1
    assert "SyntaxError" in outcomes[3].reason and "collection" in outcomes[3].reason
    assert outcomes[4].reason == "no comparison ran: RuntimeError: boom"


def test_the_cache_returns_a_stored_run_and_ignores_a_damaged_one(history, tmp_path):
    notes = []
    store = cache.Cache(tmp_path / "cache", note=notes.append)
    spec = spec_of(history)
    commit = git.resolve(history.path, history.shas[2])
    here = cache.context(spec)
    key = cache.key(cache.key_parts(spec, goldens.digest(spec.goldens), here), commit)
    assert store.get(key) is None
    run = judge(commit, 1, report(comparison("fail", 0)), [])
    store.put(key, run)
    again = store.get(key)
    assert again.cached and again.outcome == BAD and again.first == run.first
    other = cache.key_parts(spec_of(history, pytest_args=("-k", "x")), "d", here)
    assert cache.key(other, commit) != key
    store.path(key).write_text('{"format": "pytest-rollout-golden-commit-run", "key": "')
    assert store.get(key) is None
    assert notes and "ignored a damaged cache entry" in notes[0]
    wrong = {"format": cache.FORMAT, "key": key, "run": {**run.to_json(), "outcome": "maybe"}}
    store.path(key).write_text(json.dumps(wrong))
    assert store.get(key) is None and len(notes) == 2


def test_paths_into_the_checkout_are_made_relative_and_others_refused(tmp_path):
    from pytest_rollout_golden.errors import GoldenError

    in_tree, repo = runs.in_tree, tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    given = (
        f"{repo}/tests/test_x.py::test_a[x/y]", f"--golden-dir={repo}/golden", "--golden-dir",
        f"{repo}/golden", "../golden", "-k", "not slow and x/y", "-q", "tests/test_y.py",
        "-o", f"golden_dir={repo}/golden", f"{repo}/tests/test_x.py::test_a[a=b]",
    )  # fmt: skip
    assert in_tree(repo, "tests", given) == (
        "test_x.py::test_a[x/y]", "--golden-dir=../golden", "--golden-dir", "../golden",
        "../golden", "-k", "not slow and x/y", "-q", "tests/test_y.py",
        "-o", "golden_dir=../golden", "test_x.py::test_a[a=b]",
    )  # fmt: skip
    for outside in (
        f"--basetemp={tmp_path}/t", "../../elsewhere", "/etc/pytest.ini", "golden_dir=/elsewhere"
    ):  # fmt: skip
        with pytest.raises(GoldenError, match=r"outside the git checkout .*leave the argument out"):
            in_tree(repo, "tests", (outside,))


@pytest.mark.parametrize(
    ("name", "value"),
    [("PYTEST_ADDOPTS", "--golden-tolerance=pg_loss:rtol=0.1"), ("ROLLOUT_GOLDEN_LANE", "gpu"),
     ("CI", "true"), ("OMP_NUM_THREADS", "1")],
)  # fmt: skip
def test_the_cache_key_holds_the_environment_a_run_reads(history, monkeypatch, name, value):
    """A verdict is reused only in the same environment: the variables a run reads, the
    plugin's version and source, the installed packages."""
    spec = spec_of(history)
    commit = git.resolve(history.path, history.shas[2])
    monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    parts = cache.key_parts(spec, "d", cache.context(spec))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "whoever started the command")
    assert cache.key(cache.key_parts(spec, "d", cache.context(spec)), commit) == cache.key(
        parts, commit
    )
    monkeypatch.setenv(name, value)
    changed = cache.key_parts(spec, "d", cache.context(spec))
    assert changed["environment"][name] == value
    assert cache.key(changed, commit) != cache.key(parts, commit)
    assert parts["plugin"]["version"] and len(parts["plugin"]["source"]) == 64
    assert parts["packages"].endswith(" packages)")
    monkeypatch.setattr(cache, "_packages_digest", lambda python: "other (1 packages)")
    other = cache.key_parts(spec, "d", cache.context(spec))
    assert cache.key(other, commit) != cache.key(changed, commit)


STOPS_AT_STEP_1 = """
def loss(step):
    value = (0.5 + 0.125 * step) * (1.001 if step >= 1 else 1.0)
    if step >= 1:
        raise FloatingPointError(f"loss {value} at step {step}")
    return value
"""


def test_a_run_that_stops_early_is_skipped_not_good(tmp_path):
    """The commit moves the loss from step 1 and raises at step 1: step 0 passed, steps 1 and
    2 were never reached, so the run says nothing about them (skip; bad with any_failure)."""
    repo = TinyRepo(tmp_path / "project")
    repo.record()
    repo.commit("moves the loss from step 1 and raises there", {"calc.py": STOPS_AT_STEP_1})
    commit = git.resolve(repo.path, repo.shas[-1])
    verdicts = {}
    with trees.Trees(repo.path, base=tmp_path) as run:
        for any_failure in (False, True):
            spec = spec_of(repo, any_failure=any_failure)
            verdicts[any_failure] = runs.run_commit(spec, commit, run.add(commit))
    stopped = verdicts[False]
    assert stopped.outcome == SKIP, (stopped.reason, stopped.log_tail)
    assert stopped.reason == (
        "test_calc.py::test_loss stopped before comparing 2 recorded value(s) of golden "
        "golden/test_calc/test_loss (pg_loss at step 1, pg_loss at step 2): "
        "FloatingPointError: loss 0.6256249999999999 at step 1"
    )
    assert verdicts[True].outcome == BAD, verdicts[True].reason
    assert verdicts[True].reason.startswith("a test failed: FloatingPointError")


def test_a_golden_whose_test_raised_after_every_recorded_value_still_counts():
    finished = report(comparison("pass", 0), status=None)
    log = ["E   AssertionError: after the loop"]
    assert judge(C, 1, finished, log).outcome == GOOD
    stopped = report(comparison("pass", 0), status=None)
    stopped["tests"][0]["unreached"] = [{"metric": "pg_loss", "step": 1}]
    run = judge(C, 1, stopped, log)
    assert (run.outcome, run.reason) == (
        SKIP,
        "t.py::t stopped before comparing 1 recorded value(s) of golden /g (pg_loss at step 1): "
        "AssertionError: after the loop",
    )
    assert judge(C, 1, stopped, log, any_failure=True).outcome == BAD
